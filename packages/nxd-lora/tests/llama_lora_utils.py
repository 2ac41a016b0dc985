"""Shared pieces of the Llama LoRA tests: tiny HF models and PEFT adapters (the oracle)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

VOCAB, BATCH, SEQ, RANK, ALPHA = 64, 2, 8, 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
#: gqa: 2 KV heads (one per TP=2 rank); mqa: 1 KV head, replicated on both ranks (kv_size_multiplier 2)
CONFIGS = {"gqa": dict(_BASE), "mqa": dict(_BASE, num_key_value_heads=1)}


def quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


def save_base(name: str, out: Path, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**CONFIGS[name])).float().save_pretrained(str(out))
    return out


def load_hf(base_dir: Path | str):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)


def make_peft_adapter(base_dir: Path, out: Path, seed: int = 5, targets: list[str] = TARGETS,
                      dropout: float = 0.0) -> Path:
    """A PEFT adapter made by PEFT itself, with non-zero B so it changes the outputs."""
    from nxd_testing.lora_reference import make_peft_adapter as make

    return make(base_dir, out, targets, rank=RANK, alpha=ALPHA, seed=seed, dropout=dropout)


def batch(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
            "labels": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


def peft_reference(base_dir: Path, adapter_dir: Path, data: dict[str, torch.Tensor]) -> dict:
    """Logits, aligned-label loss and adapter grads (PEFT file keys) of PEFT on transformers."""
    from nxd_testing.lora_reference import peft_reference as reference

    return reference(base_dir, adapter_dir, data)


def hf_logits(model_dir: Path, data: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return load_hf(model_dir)(input_ids=data["input_ids"]).logits


def rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
