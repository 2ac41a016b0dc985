"""NxD's LoRA save modes and ``load_lora_from_ckpt``, on PEFT-format adapter files.

Layout of ``<path>/<tag>/``:

* ``lora_adapter/``: ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT loads this folder);
* ``base_model/``: the base model in Hugging Face format (``save_lora_base=True``), with the
  adapter merged into it when ``merge_lora=True`` (then no ``lora_adapter/`` is written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext
from nxd_lora.config import LoraConfig
from nxd_lora.model import LoRAModel
from nxd_lora.naming import model_spec_for, tp_size_rank
from nxd_lora.peft_format import CONFIG_NAME, load_adapter, read_peft_config, save_adapter

ADAPTER_DIR = "lora_adapter"
BASE_DIR = "base_model"


def unwrap_lora(model: Any) -> LoRAModel:
    """The :class:`LoRAModel` inside ``model`` (an ``NxDModel`` or the LoRA model itself)."""
    seen = model
    for _ in range(8):
        if isinstance(seen, LoRAModel):
            return seen
        local = getattr(seen, "local_module", None)
        if callable(local) and local() is not seen:
            seen = local()
            continue
        inner = getattr(seen, "_modules", {}).get("module")
        if inner is None:
            break
        seen = inner
    raise TypeError(f"expected a model with LoRA adapters (LoRAModel or NxDModel wrapping one), got {type(model).__name__}")


def save_base_model(module: nn.Module, out_dir: str | Path, context: ParallelContext | None) -> None:
    """The base model (built for ``context``) in Hugging Face format: through the model spec's
    exporter when it has one, else (plain single-process models) its ``state_dict`` as
    ``model.safetensors``."""
    spec = model_spec_for(module)
    if spec is not None and spec.save_hf is not None:
        spec.save_hf(module, str(out_dir))
        return
    tp, _ = tp_size_rank(context)
    if tp > 1:
        raise NotImplementedError(f"saving the base of a TP-sharded {type(module).__name__} needs a model spec with "
                                  "save_hf (register the model with nxd_register_models)")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save_lora_checkpoint(model: Any, path: str | Path, tag: str = "") -> Path:
    """Save per the model's ``LoraConfig`` (collective over all ranks; global rank 0 writes):

    * ``save_lora_base=False``: the adapter only;
    * ``save_lora_base=True, merge_lora=False``: the base and the adapter, separately;
    * ``save_lora_base=True, merge_lora=True``: the base with the adapter merged in.

    ``save_lora_config_adapter=True`` also embeds the full nxd ``LoraConfig`` in the adapter
    file's metadata (``adapter_config.json`` is always written: PEFT needs it)."""
    lora = unwrap_lora(model)
    cfg = lora.lora_config
    out = Path(path) / tag if tag else Path(path)
    if cfg.save_lora_base and cfg.merge_lora:
        was_merged = all(a.merged for a in lora.lora_layers.values())
        lora.merge_lora()
        try:
            save_base_model(lora.module, out / BASE_DIR, lora.parallel_context)
        finally:
            if not was_merged:
                lora.unmerge_lora()
        return out
    save_adapter(lora, out / ADAPTER_DIR, embed_config=cfg.save_lora_config_adapter)
    if cfg.save_lora_base:
        if any(a.merged for a in lora.lora_layers.values()):
            raise RuntimeError("the adapters are merged into the base; unmerge_lora() before saving them separately")
        save_base_model(lora.module, out / BASE_DIR, lora.parallel_context)
    return out


def find_adapter_dir(save_dir: str | Path, tag: str | None = None) -> Path:
    """The folder holding ``adapter_config.json``: ``<dir>/<tag>/lora_adapter``, ``<dir>/<tag>``,
    ``<dir>/lora_adapter`` or ``<dir>`` itself (a PEFT folder), first match wins."""
    root = Path(save_dir)
    candidates = [root / tag / ADAPTER_DIR, root / tag] if tag else []
    candidates += [root / ADAPTER_DIR, root]
    for cand in candidates:
        if (cand / CONFIG_NAME).is_file():
            return cand
    raise FileNotFoundError(
        f"LoraConfig.lora_save_dir={str(save_dir)!r}, lora_load_tag={tag!r}: no {CONFIG_NAME} in any of "
        f"{[str(c) for c in candidates]}"
    )


def saved_config(lora_config: LoraConfig) -> tuple[LoraConfig, Path]:
    """For ``load_lora_from_ckpt=True``: the adapter folder, and ``lora_config`` with the adapter's
    shape settings (rank, alpha, targets, rsLoRA, bias) taken from its ``adapter_config.json``."""
    adapter_dir = find_adapter_dir(lora_config.lora_save_dir, lora_config.lora_load_tag)
    saved = read_peft_config(adapter_dir)
    keep = {k: getattr(lora_config, k) for k in ("lora_dropout", "save_lora_base", "merge_lora",
                                                  "save_lora_config_adapter", "lora_save_dir", "lora_load_tag",
                                                  "lora_verbose", "merge_sharded_lora",
                                                  "quantize_base")}  # a PEFT adapter does not say how the base is stored
    return LoraConfig.from_dict({**saved.to_dict(), **keep, "load_lora_from_ckpt": True}), adapter_dir


def lora_model_from_config(module: nn.Module, lora_config: LoraConfig,
                           context: ParallelContext | None = None) -> LoRAModel:
    """``LoRAModel(module, lora_config, context)`` (loads the saved adapter with ``load_lora_from_ckpt=True``)."""
    return LoRAModel(module, lora_config, context=context)


def from_pretrained(module: nn.Module, adapter_dir: str | Path, is_trainable: bool = True,
                    **overrides: Any) -> LoRAModel:
    """Wrap ``module`` with the adapter in ``adapter_dir`` (nxd's or one PEFT wrote)."""
    cfg = read_peft_config(adapter_dir, **overrides)
    lora = LoRAModel(module, cfg)
    load_adapter(lora, adapter_dir)
    if not is_trainable:
        for p in lora.parameters():
            p.requires_grad_(False)
    return lora


def check_lora_config(value: Any) -> LoraConfig | None:
    """``nxd_config["lora_config"]`` as a LoraConfig (a dict of its fields is accepted), or ``None``
    when LoRA is off."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = LoraConfig.from_dict(value)
    if not isinstance(value, LoraConfig):
        raise ConfigError(f"lora_config must be an nxd_lora.LoraConfig (or a dict of its fields), got "
                          f"{type(value).__name__}")
    return value if value.enable_lora else None


__all__ = ["check_lora_config", "find_adapter_dir", "from_pretrained", "lora_model_from_config",
           "save_base_model", "save_lora_checkpoint", "unwrap_lora"]
