"""nxd-tensor-parallel's model transforms (:mod:`nxd.transforms`): the tensor-parallel plan of a
plain model and NxD's attention-head padding (``pad_model``)."""

from __future__ import annotations

import torch

from nxd import ParallelContext
from nxd.run_config import RunConfig
from nxd.transforms import ALWAYS, ModelTransform, When
from nxd_tensor_parallel.tensor_plan import apply_parallel_plan


def _pad(model: torch.nn.Module, context: ParallelContext | None, config: RunConfig) -> torch.nn.Module:
    # structural: after the TP layers exist, before adapters, checkpointing and the pipeline cut
    from nxd_tensor_parallel.parallel_layers.pad import pad_model_from_config

    return pad_model_from_config(model, context)


TRANSFORMS = (
    # at any TP: a model carrying a plan (nxd's families built plain) gets its layers at TP=1 too
    ModelTransform("parallel_plan", "parallel_plan", apply_parallel_plan, ALWAYS,
                   description="a model's nxd_parallel_plan (a family's, or a plain model's): nn.Linear/nn.Embedding/QKVLinear "
                               "-> TP/SP layers with their shards"),
    ModelTransform("pad_model", "pad_model", _pad, When("pad_model"),
                   description="NxD's pad_model: attention heads padded with zero heads to a multiple of the TP size"),
)
