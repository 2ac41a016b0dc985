"""``neuronx_distributed.utils.batch_utils``: NxD's context-parallel batch split."""

from typing import Any

import torch

from neuronx_distributed.parallel_layers import parallel_state
from nxd_context_parallel import split_batch_for_context_parallel

LABEL_PAD_TOKEN_ID = -100


def shift_labels(batch: dict[str, Any]) -> dict[str, Any]:
    """NxD: labels move one position left (``labels[t]`` becomes the target of input ``t``), -100 at the end."""
    shifted = dict(batch)
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor):
        pad = torch.full((labels.shape[0], 1), LABEL_PAD_TOKEN_ID, dtype=labels.dtype, device=labels.device)
        shifted["labels"] = torch.cat((labels[:, 1:], pad), dim=1)
    return shifted


def get_batch_on_this_context_parallel_rank(batch: dict[str, Any]) -> dict[str, Any]:
    """NxD's split: at CP > 1, shift the labels, then keep this CP rank's contiguous slice of the
    sequence (dim 1) of every per-token tensor. At CP = 1 the batch is returned as is."""
    cp_size = parallel_state.get_context_model_parallel_size()
    if cp_size == 1:
        return batch
    split = split_batch_for_context_parallel(shift_labels(batch), parallel_state.get_context_model_parallel_rank(),
                                             cp_size, load_balance=False, seq_dim=1)
    if "position_ids" not in batch:
        split.pop("position_ids", None)  # NxD's models derive positions from the CP rank themselves
    return split
