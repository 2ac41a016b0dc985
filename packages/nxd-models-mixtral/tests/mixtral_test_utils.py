"""Shared pieces of the Mixtral tests: a tiny HF Mixtral as the oracle, HF-named grads, comparisons.

The oracle is transformers' ``MixtralForCausalLM`` (randomly initialised, saved to a temporary
directory). Labels are aligned (label[t] follows input[t]); the reference loss is cross-entropy on
HF's logits plus ``router_aux_loss_coef`` x HF's own ``aux_loss`` (``output_router_logits=True``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# nxd-testing's shared oracle helpers, re-exported to this package's tests
from nxd_testing.reference import assert_parity as compare  # noqa: E402, F401
from nxd_testing.reference import forward_backward_result, quiet_transformers, rel_err  # noqa: E402, F401

VOCAB, BATCH, SEQ = 128, 2, 16
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1,
              num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02, output_router_logits=True,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)


def save_hf(out: Path, seed: int = 0, **overrides) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    model = MixtralForCausalLM(MixtralConfig(**{**CONFIG, **overrides})).float()
    with torch.no_grad():  # HF initialises experts with a tiny std: make every piece count
        for name, p in model.named_parameters():
            if "experts" in name or name.endswith("gate.weight"):
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(out))
    return out


def batch(seed: int = 1, batch_size: int = BATCH) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, VOCAB, (batch_size, SEQ), generator=g),
            "labels": torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)}


def hf_named_grads(model) -> dict[str, torch.Tensor]:
    """transformers 5 keeps experts stacked in memory; name its grads as the checkpoint does."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().clone()
        if ".mlp.gate.weight" in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = g
        elif ".mlp.experts.gate_up_proj" in name:
            prefix = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.")
            inter = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.w1.weight"], out[f"{prefix}{e}.w3.weight"] = g[e, :inter], g[e, inter:]
        elif ".mlp.experts.down_proj" in name:
            prefix = name.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.")
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.w2.weight"] = g[e]
        else:
            out[name] = g
    return out


def hf_reference(hf_dir: Path, data: dict[str, torch.Tensor]) -> dict:
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    out = model(data["input_ids"], output_router_logits=True)
    ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), data["labels"].reshape(-1))
    loss = ce + model.config.router_aux_loss_coef * out.aux_loss
    loss.backward()
    return {"logits": out.logits.detach(), "loss": loss.detach(), "aux_loss": out.aux_loss.detach(),
            "grads": hf_named_grads(model)}


def nxd_forward_backward(hf_dir: str, data: dict[str, torch.Tensor], sequence_parallel: bool = False) -> dict:
    """Import into nxd at the current TP/EP degrees, forward + backward; full logits (gathered over
    TP) and HF-named full grads (gathered over TP and EP, on global rank 0)."""
    from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
    from nxd_models_llama import gather_vocab_logits
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, collect_hf_state_dict, load_hf_checkpoint

    config = MixtralConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = MixtralForCausalLM(config, sequence_parallel=sequence_parallel)
    load_hf_checkpoint(model, hf_dir)
    return forward_backward_result(model, data, gather_logits=gather_vocab_logits, export_grads=collect_hf_state_dict,
                                   sync_grads=allreduce_sequence_parallel_gradients if sequence_parallel else None)


def lm_loss(model, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """``loss_of`` for ``nxd_testing.reference.train_data_parallel``: the model's own LM loss."""
    return model(rows["input_ids"], labels=rows["labels"]).loss
