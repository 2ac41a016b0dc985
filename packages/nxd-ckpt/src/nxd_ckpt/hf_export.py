"""The parts of ``--to hf`` beyond the weights: a LoRA run's adapters, and the tokenizer files.

LoRA goes through the registered ``lora`` adapter (``nxd_register_adapters``) and the
``nxd_checkpoint_extras`` hook, so nxd-ckpt needs no LoRA code of its own: the model is rebuilt
with its adapters, the checkpoint's ``module.*`` / ``lora_layers.*`` tensors load into it, and then
either the adapters are merged into the base (``merge``: one Hugging Face model), or the base is
written as is and the adapters beside it in PEFT's format (``adapter``: ``<out>/lora_adapter/``).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from nxd_ckpt.errors import CheckpointError

LORA_MODES = ("merge", "adapter")
#: file names a Hugging Face tokenizer folder may hold (AutoTokenizer reads them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json", "chat_template.jinja")


def _is_lora_state(state: dict) -> bool:
    return any(k.startswith("lora_layers.") for k in state)


def lora_mode(full: Any, requested: str | None, source: str) -> str | None:
    """``None`` for a plain model; for a LoRA run's checkpoint the mode the user asked for."""
    if full.lora is None and not _is_lora_state(full.state):
        if requested:
            raise CheckpointError(f"--lora {requested}: {source} holds no LoRA adapters")
        return None
    if requested not in LORA_MODES:
        raise CheckpointError(
            f"{source} is a LoRA run (base weights + adapters): pass --lora merge (one Hugging Face model with the "
            "adapters merged into its weights) or --lora adapter (the base model, plus the adapters in PEFT's "
            "format in <output>/lora_adapter/)")
    if full.lora is None:
        raise CheckpointError(f"{source} holds LoRA adapters but does not record their LoraConfig (rank, alpha, "
                              "targets); use the PEFT adapter saved next to it (<tag>/lora_adapter/)")
    return requested


def write_lora_hf(spec: Any, base: Any, full: Any, mode: str, output: str) -> None:
    """Rebuild ``base`` with its adapters, load the LoRA state, write ``output`` per ``mode``."""
    import nxd
    from nxd.trainer import checkpoint_extras

    settings = {**full.lora, "save_lora_base": False, "merge_lora": False, "load_lora_from_ckpt": False}
    try:
        adapter = nxd.get_component("adapter", "lora", need="converting a LoRA checkpoint")
    except nxd.ComponentNotFound as exc:
        raise CheckpointError(f"{exc} (pip install nxd-lora)") from None
    quantized = settings.get("quantize_base")
    if quantized and mode == "merge":
        raise CheckpointError(f"--lora merge: this run's base was quantised (peft.quantize_base={quantized!r}, QLoRA) "
                              "and its checkpoints do not hold it; use --lora adapter and apply the PEFT adapter to "
                              "the run's model.pretrained_checkpoint (PEFT's merge_and_unload merges it there)")
    model = adapter(base, settings)
    model.load_state_dict(full.state, strict=True)
    if quantized:  # the frozen NF4 base is the run's model.pretrained_checkpoint, not in the checkpoint
        checkpoint_extras(model, os.path.abspath(output), "", "saved")
        print(f"QLoRA ({quantized} base): wrote the adapter only ({output}/lora_adapter); its base is the run's "
              "model.pretrained_checkpoint")
        return
    if mode == "merge":
        model.merge_lora()
        spec.save_hf(model.module, output)
        return
    spec.save_hf(model.module, output)
    checkpoint_extras(model, os.path.abspath(output), "", "saved")


def copy_tokenizer(tokenizer: str | None, output: str) -> list[str]:
    """Copy the run's tokenizer files next to the exported weights; returns the names copied."""
    if not tokenizer:
        return []
    if not os.path.exists(tokenizer):
        print(f"note: the run's tokenizer {tokenizer} is not a local path; tokenizer files not copied")
        return []
    if os.path.isfile(tokenizer):
        pairs = [(tokenizer, os.path.basename(tokenizer))]
    else:
        pairs = [(os.path.join(tokenizer, n), n) for n in TOKENIZER_FILES if os.path.isfile(os.path.join(tokenizer, n))]
    for src, name in pairs:
        shutil.copyfile(src, os.path.join(output, name))
    return [name for _, name in pairs]
