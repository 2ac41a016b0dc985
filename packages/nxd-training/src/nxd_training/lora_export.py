"""LoRA outputs of a ``model_alignment_strategy.peft`` run, in NxD's save modes.

NxD writes the adapter next to each checkpoint (``<checkpoint dir>/<tag>/lora_adapter/``, plus
``base_model/`` with ``save_lora_base``, or only a merged ``base_model/`` with ``merge_lora``);
nxd-lora's ``save_lora_checkpoint`` implements those modes in PEFT's file format. The full training
state (base + adapters, sharded) is still saved by ``nxd.save_checkpoint`` for exact resume.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from nxd_training.config.schema import ModelAlignmentConfig

#: where a run without checkpoints writes its final adapter: ``<log dir>/<FINAL_TAG>/``
FINAL_TAG = "lora"


def lora_enabled(align: ModelAlignmentConfig | None) -> bool:
    """Whether ``model_alignment_strategy.peft`` asks for LoRA adapters."""
    return align is not None and align.peft is not None


def export_lora(model: nn.Module, out_dir: str | Path, tag: str) -> Path:
    """Write ``out_dir/tag/`` per the model's LoraConfig (collective: call on every rank)."""
    from nxd_lora.checkpoint import save_lora_checkpoint

    return save_lora_checkpoint(model, Path(out_dir), tag)


def base_module(model: nn.Module) -> nn.Module:
    """The model under the LoRA wrapper: what a checkpoint of the (non-LoRA) base model loads into."""
    from nxd_lora.checkpoint import unwrap_lora

    return unwrap_lora(model).module


def trainable_counts(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter elements on this rank."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def describe(counts: tuple[int, int]) -> str:
    trainable, total = counts
    return f"trainable params {trainable:,} of {total:,} on this rank ({100 * trainable / max(total, 1):.2f}%)"
