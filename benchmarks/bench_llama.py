"""One training step (forward + backward + AdamW) of the nxd Llama at TP=1 next to transformers'
LlamaForCausalLM (see step_vs_transformers.py). Ratio = nxd time / transformers time (goal <= 1.0).

Run: .venv/bin/python benchmarks/bench_llama.py [--steps 6] [--seq 128] [--batch 4]
"""

from __future__ import annotations

from step_vs_transformers import compare
from transformers import LlamaConfig as HFConfig
from transformers import LlamaForCausalLM as HFLlama

from nxd.transforms import parallelize_model
from nxd_models_llama import LlamaConfig, LlamaForCausalLM, load_hf_checkpoint

CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=500000.0)


def build_nxd(hf: HFLlama, hf_dir: str) -> LlamaForCausalLM:
    ours = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(CONFIG)))
    load_hf_checkpoint(ours, hf_dir)
    return ours


if __name__ == "__main__":
    compare(__doc__.splitlines()[0], f"Llama {CONFIG['num_hidden_layers']}L h{CONFIG['hidden_size']}",
            CONFIG["vocab_size"], lambda: HFLlama(HFConfig(**CONFIG, attn_implementation="sdpa")).float(), build_nxd,
            ("transformers LlamaForCausalLM", "nxd LlamaForCausalLM (TP=1)"))
