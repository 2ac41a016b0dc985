"""One training step (forward + backward + AdamW) of nxd's Qwen3 (spec ``qwen3``, q/k head norms) at
TP=1 next to transformers' Qwen3ForCausalLM (see step_vs_transformers.py). Ratio = nxd time /
transformers time (goal <= 1.0).

Run: .venv/bin/python benchmarks/bench_qwen3.py [--steps 6] [--seq 128] [--batch 4]
"""

from __future__ import annotations

from step_vs_transformers import compare, spec_builder
from transformers import Qwen3Config as HFConfig
from transformers import Qwen3ForCausalLM as HFQwen3

CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6,
              tie_word_embeddings=False)


if __name__ == "__main__":
    compare(__doc__.splitlines()[0], f"Qwen3 {CONFIG['num_hidden_layers']}L h{CONFIG['hidden_size']}",
            CONFIG["vocab_size"], lambda: HFQwen3(HFConfig(**CONFIG, attn_implementation="sdpa")).float(), spec_builder("qwen3"),
            ("transformers Qwen3ForCausalLM", "nxd qwen3 (TP=1)"))
