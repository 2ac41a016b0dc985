"""One training step (forward + backward + AdamW) of nxd's DeepSeek-V3 (spec ``deepseek_v3``: MLA, a
dense first layer, routed + shared experts with sigmoid group-limited routing) at TP=1 next to
transformers' DeepseekV3ForCausalLM (see step_vs_transformers.py). Ratio = nxd time / transformers
time (goal <= 1.0). Both losses are cross-entropy only (no sequence-wise aux loss); the expert bias
stays fixed (no balancer attached to either optimizer).

Run: .venv/bin/python benchmarks/bench_deepseek.py [--steps 6] [--seq 128] [--batch 4]
"""

from __future__ import annotations

from step_vs_transformers import compare, spec_builder
from transformers import DeepseekV3Config as HFConfig
from transformers import DeepseekV3ForCausalLM as HFDeepseek

CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, moe_intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=8, n_routed_experts=8, n_shared_experts=1,
              num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5, first_k_dense_replace=1,
              q_lora_rank=128, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
              max_position_embeddings=1024, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)


if __name__ == "__main__":
    compare(__doc__.splitlines()[0], f"DeepSeek-V3 {CONFIG['num_hidden_layers']}L h{CONFIG['hidden_size']}",
            CONFIG["vocab_size"], lambda: HFDeepseek(HFConfig(**CONFIG, attn_implementation="sdpa")).float(),
            spec_builder("deepseek_v3"), ("transformers DeepseekV3ForCausalLM", "nxd deepseek_v3 (TP=1)"))
