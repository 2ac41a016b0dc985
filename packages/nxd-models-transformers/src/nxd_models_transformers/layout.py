"""What parallel layout a transformers model can run in, decided from its config alone.

One function answers both before launch (nxd-training's plan calls it through
``spec.extras["check_layout"]``) and on each rank (the build calls it again), so a layout is never
validated and then refused on a rank."""

from __future__ import annotations

from typing import Any

from nxd.errors import ConfigError
from nxd_tensor_parallel.tensor_plan import HF_STYLES as NXD_STYLES_OF_HF


def hf_tp_plan(config: Any, hf_class: type) -> dict[str, str]:
    """transformers' TP plan of the model ``config`` builds with ``hf_class``: the base model's
    ``base_model_tp_plan`` (under its prefix) and the class's own ``_tp_plan`` (the LM head)."""
    prefix = getattr(hf_class, "base_model_prefix", "model") or "model"
    plan = {f"{prefix}.{k}": v for k, v in (getattr(config, "base_model_tp_plan", None) or {}).items()}
    if plan:  # the head alone (every class lists it) does not make a plan
        plan.update(getattr(hf_class, "_tp_plan", None) or {})
    return plan


def check_layout(config: Any, hf_class: type, *, tp: int = 1, pp: int = 1, cp: int = 1,
                 sequence_parallel: bool = False) -> None:
    """Refuse, naming the key and the reason, a layout the transformers path cannot honour."""
    name = f"{hf_class.__name__} (model_type {config.model_type!r})"
    if pp > 1:
        raise ConfigError(f"distributed_strategy.pipeline_model_parallel_size={pp}: {name} is transformers' own class, "
                          "whose forward runs every layer in one call; nxd's pipeline cuts models implementing its "
                          "pipeline contract (nxd_pipeline_layout: nxd's families). Use tensor/data parallelism")
    if cp > 1:
        raise ConfigError(f"distributed_strategy.context_parallel_size={cp}: {name} computes attention inside "
                          "transformers' attention modules, which hold no attention_core for ring attention to "
                          "replace; use context_parallel_size=1")
    if tp == 1:
        return
    if sequence_parallel:
        raise ConfigError(f"distributed_strategy.sequence_parallel: {name}'s norms and residuals run on whole "
                          "sequences (transformers' TP plan shards no sequence); set sequence_parallel: false")
    plan = hf_tp_plan(config, hf_class)
    if not plan:
        raise ConfigError(f"distributed_strategy.tensor_model_parallel_size={tp}: {name} has no tensor-parallel plan "
                          "(its config's base_model_tp_plan is empty), so nxd does not know which projections to "
                          "shard; use tensor_model_parallel_size: 1 with FSDP/ZeRO-1/DDP")
    unknown = {pattern: style for pattern, style in plan.items() if style not in NXD_STYLES_OF_HF}
    if unknown:
        listed = ", ".join(f"{p}: {s!r}" for p, s in sorted(unknown.items()))
        raise ConfigError(f"distributed_strategy.tensor_model_parallel_size={tp}: {name}'s TP plan has styles nxd does "
                          f"not implement ({listed}; nxd: {', '.join(NXD_STYLES_OF_HF)}); use "
                          "tensor_model_parallel_size: 1 with FSDP/ZeRO-1/DDP")
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    for field, value in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if isinstance(value, int) and value % tp:
            why = (" (K/V heads are not replicated for transformers' classes: their attention derives its "
                   "head counts from the projection widths)" if field == "num_key_value_heads" else "")
            raise ConfigError(f"distributed_strategy.tensor_model_parallel_size={tp} must divide {name}'s {field}="
                              f"{value}: attention is sharded by whole heads{why}")
