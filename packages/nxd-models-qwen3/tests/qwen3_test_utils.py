"""Shared pieces of the Qwen3 tests: tiny transformers Qwen3 / Qwen3-MoE models as oracles (random
weights saved to a temporary directory), HF-named grads, and the nxd side of the comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from nxd_testing import reference as oracle  # noqa: E402

VOCAB, BATCH, SEQ = 128, 2, 16
DENSE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
             initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None)
MOE = dict(DENSE, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
           norm_topk_prob=True, mlp_only_layers=[1], router_aux_loss_coef=0.02, output_router_logits=True)


def save_hf(out: Path, moe: bool = False, seed: int = 0, **overrides) -> Path:
    """A randomly initialised transformers Qwen3 (or Qwen3-MoE) saved to ``out``; every weight drawn
    with a std that makes it count (norm weights too, so the q/k norms are not identities)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cls, cfg = (Qwen3MoeForCausalLM, Qwen3MoeConfig) if moe else (Qwen3ForCausalLM, Qwen3Config)
    return oracle.save_hf_oracle(cls(cfg(**{**(MOE if moe else DENSE), **overrides})).float(), out, spread_norms=True)


def batch(seed: int = 1, batch_size: int = BATCH) -> dict[str, torch.Tensor]:
    return oracle.random_lm_batch(seed, batch_size, SEQ, VOCAB)


def hf_reference(hf_dir: Path, data: dict[str, torch.Tensor], shards: int = 1) -> dict:
    """One process: mean over ``shards`` DP shards of CE (+ coef x HF aux loss for MoE), backward once."""
    return oracle.hf_lm_reference(hf_dir, data, shards)


def build_from_hf(hf_dir: str, sequence_parallel: bool = False):
    model_type = json.loads((Path(hf_dir) / "config.json").read_text())["model_type"]
    return oracle.build_from_hf("qwen3_moe" if model_type == "qwen3_moe" else "qwen3", hf_dir, sequence_parallel)


def nxd_forward_backward(hf_dir: str, data: dict[str, torch.Tensor], sequence_parallel: bool = False) -> dict:
    """Import at the current TP/EP degrees, forward + backward; full logits and HF-named full grads."""
    from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
    from nxd_models_llama import collect_hf_state_dict as collect_dense
    from nxd_models_llama import gather_vocab_logits
    from nxd_models_mixtral import collect_hf_state_dict as collect_moe

    spec, model = build_from_hf(hf_dir, sequence_parallel)
    export = collect_moe if spec.name == "qwen3_moe" else collect_dense
    return oracle.forward_backward_result(model, data, gather_logits=gather_vocab_logits, export_grads=export,
                                   sync_grads=allreduce_sequence_parallel_gradients if sequence_parallel else None)
