"""Tiny Mixtral training throughput: nxd-models-mixtral vs transformers' MixtralForCausalLM at TP=1.

One process (one CPU thread, or one GPU with ``--device cuda``), the same weights (nxd imports
transformers' checkpoint), forward + backward of the loss (cross-entropy + router aux loss),
ABAB-alternated, median tokens/s.
Usage: python benchmarks/bench_mixtral.py [--hidden 128] [--layers 2] [--seq 128] [--batch 4] [--repeats 9]
       [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from nxd.transforms import parallelize_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.set_num_threads(1)
    from transformers import MixtralConfig as HFConfig
    from transformers import MixtralForCausalLM as HFMixtral

    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, load_hf_checkpoint

    cfg = dict(vocab_size=512, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
               num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=args.seq, num_local_experts=8, num_experts_per_tok=2,
               output_router_logits=True, router_aux_loss_coef=0.02)
    torch.manual_seed(0)
    hf = HFMixtral(HFConfig(**cfg)).float()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = parallelize_model(MixtralForCausalLM(MixtralConfig.from_dict(cfg)))
        load_hf_checkpoint(ours, d)
    hf, ours = hf.to(device), ours.to(device)
    ids = torch.randint(0, 512, (args.batch, args.seq), device=device)
    labels = torch.randint(0, 512, (args.batch, args.seq), device=device)

    def step_ours() -> None:
        ours(ids, labels=labels).loss.backward()

    def step_hf() -> None:
        out = hf(ids, output_router_logits=True)
        loss = F.cross_entropy(out.logits.reshape(-1, 512), labels.reshape(-1)) + 0.02 * out.aux_loss
        loss.backward()

    times: dict[str, list[float]] = {"nxd": [], "transformers": []}
    for fn in (step_ours, step_hf):
        fn()
    for _ in range(args.repeats):
        for name, fn in (("nxd", step_ours), ("transformers", step_hf)):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    tokens = args.batch * args.seq
    rate = {k: tokens / statistics.median(v) for k, v in times.items()}
    print(f"tiny Mixtral (hidden {args.hidden}, {args.layers} layers, 8 experts top-2) on {device}, {tokens} "
          "tokens/step, fwd+bwd:")
    print(f"  nxd {rate['nxd']:.0f} tokens/s   transformers {rate['transformers']:.0f} tokens/s   "
          f"ratio nxd/transformers = {rate['nxd'] / rate['transformers']:.2f}")


if __name__ == "__main__":
    main()
