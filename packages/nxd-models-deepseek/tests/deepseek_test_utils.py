"""Shared pieces of the DeepSeek-V3 tests: a tiny transformers ``DeepseekV3ForCausalLM`` as the
oracle (random weights, a non-zero expert bias, saved to a temporary directory)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from nxd_testing import reference as oracle  # noqa: E402

VOCAB, BATCH, SEQ = 128, 2, 16
#: 3 layers (the first dense), 8 routed experts in 4 groups (2 kept), top-3, 2 shared experts
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=2,
              num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5, first_k_dense_replace=1,
              q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10,
              max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
#: the gathered exports hold the routers' bias buffers too; they have no gradient
BUFFERS = ("e_score_correction_bias",)
SPEC = ("deepseek_v3", "nxd_models_mixtral:collect_hf_state_dict")


def save_hf(out: Path, seed: int = 0, **overrides) -> Path:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**CONFIG, **overrides})).float()
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith(BUFFERS):  # a bias that changes which experts are chosen
                buf.normal_(0.0, 0.3)
    return oracle.save_hf_oracle(model, out, spread_norms=True)


def batch(seed: int = 1, batch_size: int = BATCH) -> dict[str, torch.Tensor]:
    return oracle.random_lm_batch(seed, batch_size, SEQ, VOCAB)


def nxd_forward_backward(hf_dir: str, data: dict[str, torch.Tensor], sequence_parallel: bool = False) -> dict:
    from nxd_models_llama import gather_vocab_logits
    from nxd_models_mixtral import collect_hf_state_dict

    def export(model):
        return {k: v for k, v in collect_hf_state_dict(model).items() if not k.endswith(BUFFERS)}

    _, model = oracle.build_from_hf(SPEC[0], hf_dir, sequence_parallel)
    return oracle.forward_backward_result(model, data, gather_logits=gather_vocab_logits, export_grads=export)


def build_tiny_under_cp(**overrides) -> None:
    """Build the tiny preset (with ``overrides``) under context parallelism 2 (a rank body)."""
    import nxd

    config = nxd.neuronx_distributed_config(context_parallel_size=2)
    nxd.build_parallel_model(nxd.get_model("deepseek_v3"), {"preset": "deepseek-v3-tiny", **overrides}, config)
