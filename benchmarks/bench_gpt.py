"""One training step (forward + backward + AdamW) of the nxd GPT at TP=1 next to transformers'
GPT2LMHeadModel (see step_vs_transformers.py). Ratio = nxd time / transformers time (goal <= 1.0).

Run: .venv/bin/python benchmarks/bench_gpt.py [--steps 6] [--seq 128] [--batch 4]
"""

from __future__ import annotations

from step_vs_transformers import compare
from transformers import GPT2Config as HFConfig
from transformers import GPT2LMHeadModel as HFGPT2

from nxd.transforms import parallelize_model
from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_hf_checkpoint

# dropout off on both sides: the step is then deterministic and the losses comparable
CONFIG = dict(vocab_size=4096, n_embd=256, n_layer=4, n_head=8, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)


def build_nxd(hf: HFGPT2, hf_dir: str) -> GPTForCausalLM:
    ours = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(hf.config.to_dict())))
    load_hf_checkpoint(ours, hf_dir)
    return ours


if __name__ == "__main__":
    compare(__doc__.splitlines()[0], f"GPT-2 {CONFIG['n_layer']}L h{CONFIG['n_embd']}", CONFIG["vocab_size"],
            lambda: HFGPT2(HFConfig(**CONFIG, attn_implementation="sdpa")).float(), build_nxd,
            ("transformers GPT2LMHeadModel", "nxd GPTForCausalLM (TP=1)"))
