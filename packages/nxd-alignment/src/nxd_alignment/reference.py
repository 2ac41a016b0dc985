"""The frozen reference policy of DPO: precomputed log-probs, adapters switched off, or a copy."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nxd_alignment.logps import forward_logits, pair_logps, per_token_logps


def adapter_switches(model: torch.nn.Module) -> list[Any]:
    """Modules that can switch their adapters off (nxd-lora's ``LoRAModel.set_adapters_enabled``)."""
    return [m for m in model.modules() if callable(getattr(m, "set_adapters_enabled", None))]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The base model's outputs (LoRA off): DPO's reference for a LoRA run, with no second copy."""
    switches = adapter_switches(model)
    for m in switches:
        m.set_adapters_enabled(False)
    try:
        yield
    finally:
        for m in switches:
            m.set_adapters_enabled(True)


@torch.no_grad()
def batch_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) summed response log-probs of a preference batch, without gradients."""
    logps = pair_logps(per_token_logps(forward_logits(model, batch), batch["labels"], batch["loss_mask"]),
                       batch["loss_mask"])
    return logps.chosen, logps.rejected


class FrozenCopy:
    """An on-the-fly reference: a deep copy of the policy taken before the first step."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = copy.deepcopy(model)
        for p in self.model.parameters():
            p.requires_grad_(False)

    def logps(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_logps(self.model, batch)


class DisabledAdapters:
    """An on-the-fly reference for LoRA: the same model with its adapters switched off."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def logps(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        with adapters_disabled(self.model):
            return batch_logps(self.model, batch)


@torch.no_grad()
def precompute(model: torch.nn.Module, data: Any, split: str, *, device: torch.device, dp_group: Any) -> np.ndarray:
    """``[examples, 2]`` reference log-probs of every example of ``split``: each DP rank computes its
    share (``data.reference_batches``), the shares are all-gathered, every rank holds the table."""
    source = data.sources[split]
    table = np.zeros((len(source), 2), dtype=np.float64)
    seen = np.zeros(len(source), dtype=bool)
    was_training = model.training
    model.eval()
    world = dist.get_world_size(dp_group) if dist.is_initialized() else 1
    try:
        with adapters_disabled(model):
            for batch in data.reference_batches(split):
                index = batch["example_index"]
                batch = {k: v.to(device) for k, v in batch.items()}
                chosen, rejected = batch_logps(model, batch)
                rows = torch.stack([index.to(device).double(), chosen.double(), rejected.double()], dim=1)
                parts = [torch.empty_like(rows) for _ in range(world)]
                if world > 1:
                    dist.all_gather(parts, rows, group=dp_group)
                else:
                    parts = [rows]
                for part in parts:
                    part = part.cpu().numpy()
                    idx = part[:, 0].astype(np.int64)
                    table[idx] = part[:, 1:]
                    seen[idx] = True
    finally:
        model.train(was_training)
    if not seen.all():
        raise RuntimeError(f"reference log-probs missing for {int((~seen).sum())} {split} examples")
    return table
