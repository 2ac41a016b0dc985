"""PEFT as the oracle of LoRA parity tests: an adapter PEFT itself writes for a transformers
checkpoint, PEFT's logits / loss / adapter gradients on it, and nxd-lora's adapter gradients under
PEFT's keys. peft, transformers and nxd-lora are imported inside the functions (test extras)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def make_peft_adapter(hf_dir: Path | str, out: Path | str, targets: list[str], *, rank: int = 4, alpha: float = 8.0,
                      seed: int = 5, dropout: float = 0.0) -> Path:
    """An adapter written by PEFT for the checkpoint in ``hf_dir``, every A and B drawn non-zero
    (``N(0, 0.2^2)``) so it changes the outputs."""
    import peft
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                                       lora_dropout=dropout))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    model.save_pretrained(str(out))
    return Path(out)


def peft_reference(hf_dir: Path | str, adapter_dir: Path | str, data: dict[str, torch.Tensor],
                   eval_mode: bool = False) -> dict[str, Any]:
    """PEFT on transformers: ``logits``, the aligned-label cross-entropy ``loss`` and the adapter
    ``grads`` under PEFT's file keys (``eval_mode``: dropout off)."""
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
    if eval_mode:
        model.eval()
    logits = model(input_ids=data["input_ids"]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), data["labels"].reshape(-1))
    loss.backward()
    grads = {n.replace(".default", ""): p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads}


def adapter_grads(lora: Any) -> dict[str, torch.Tensor]:
    """nxd-lora's adapter gradients under PEFT's keys, gathered over TP (swapped into the
    parameters, exported, swapped back). Collective over TP."""
    from nxd_lora import collect_adapter_state_dict

    params = list(lora.lora_layers.parameters())
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.copy_(p.grad)
    grads = collect_adapter_state_dict(lora)
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    return grads
