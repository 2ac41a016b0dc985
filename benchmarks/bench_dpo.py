"""nxd-alignment benchmark: one DPO training step against TRL's ``DPOTrainer`` on the same tiny Llama.

One process (a one-rank gloo group). Both sides: the same weights (nxd's model exported to
transformers' ``LlamaForCausalLM``), the same preference pairs and tokenizer, sigmoid loss with
precomputed reference log-probs, AdamW; batches of ``--pairs`` pairs padded to ``--seq`` tokens
(TRL: ``pad_to_multiple_of=--seq``). Step = forward of chosen+rejected, DPO loss, backward,
optimizer step. nxd: ``DPOWorkflow.loss`` on nxd-data's ``preference`` batches; TRL:
``DPOTrainer.training_step`` (+ its optimizer step) on its own collated batches.
Timing: interleaved ABBA, median of --steps steps per side; one torch thread.
Usage: python benchmarks/bench_dpo.py [--steps 20] [--hidden 128] [--layers 2] [--pairs 4] [--seq 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

WORDS = ["king", "love", "night", "sword", "crown", "heart", "storm", "blood"]


def write_pairs(path: Path, n: int = 64) -> list[dict]:
    records = []
    for i in range(n):
        w, a, b = WORDS[i % 8], WORDS[(i + 3) % 8], WORDS[(i + 5) % 8]
        records.append({"prompt": f"The {w} of the {a} said: repeat {w} twice please.",
                        "chosen": f" {w} {w}, as you asked.", "rejected": f" {a} {b}, or maybe not."})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def nxd_side(args, tmp: Path, pairs_path: Path, tok_path: str):
    from nxd_alignment.workflows import DPOWorkflow
    from nxd_core_parallel import parallel_state as ps
    from nxd_data.preference_module import preference
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, save_hf_checkpoint

    ps.initialize_model_parallel(1)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=args.hidden, intermediate_size=args.hidden * 2,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 32, num_key_value_heads=2,
                         max_position_embeddings=args.seq)
    model = LlamaForCausalLM(config)
    save_hf_checkpoint(model, str(tmp / "hf"))
    data = preference({"train_dir": str(pairs_path), "tokenizer": tok_path, "max_prompt_length": args.seq // 2,
                       "shuffle": False}, seq_length=args.seq, micro_batch_size=args.pairs,
                      global_batch_size=args.pairs, dp_rank=0, dp_size=1, seed=0)
    workflow = DPOWorkflow({"beta": 0.1, "loss_type": "sigmoid", "precompute_ref_log_probs": True})
    workflow.prepare(model, data, device=torch.device("cpu"), dp_group=None, resumed_step=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    it = data.train_batches()

    def step() -> float:
        loss, _ = workflow.loss(model, next(it))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    return step


#: the shapes of TRL's batches (checked against nxd's [2 x pairs, seq])
step_shapes: list[set] = []


def trl_side(args, tmp: Path, records: list[dict], tok_path: str):
    from datasets import Dataset
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer

    tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(tok_path) / "tokenizer.json"))
    specials = json.loads((Path(tok_path) / "tokenizer_config.json").read_text()) \
        if (Path(tok_path) / "tokenizer_config.json").exists() else {}
    tok.bos_token = specials.get("bos_token") or tok.convert_ids_to_tokens(1)
    tok.eos_token = specials.get("eos_token") or tok.convert_ids_to_tokens(2)
    tok.pad_token = tok.eos_token
    model = LlamaForCausalLM.from_pretrained(str(tmp / "hf"), torch_dtype=torch.float32)
    config = DPOConfig(output_dir=str(tmp / "trl"), per_device_train_batch_size=args.pairs, max_length=args.seq,
                       pad_to_multiple_of=args.seq, beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=True,
                       learning_rate=1e-5, report_to="none", use_cpu=True, save_strategy="no", logging_steps=10**6,
                       dataloader_num_workers=0, remove_unused_columns=False, seed=0)
    trainer = DPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(records), processing_class=tok)
    trainer.create_optimizer_and_scheduler(num_training_steps=10**6)
    loader = trainer.get_train_dataloader()  # precomputes the reference log-probs
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we call training_step directly

    def batches():
        while True:
            yield from loader

    it = batches()
    shapes: set[tuple[int, ...]] = set()
    step_shapes.append(shapes)

    def step() -> float:
        batch = next(it)
        shapes.add(tuple(batch["input_ids"].shape))
        loss = trainer.training_step(trainer.model, batch)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    from nxd_data.quickstart import prepare_quickstart_data

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tok_path = prepare_quickstart_data(tmp / "corpus", vocab_size=512)["tokenizer"]
        records = write_pairs(tmp / "pairs.jsonl")
        ours = nxd_side(args, tmp, tmp / "pairs.jsonl", tok_path)
        theirs = trl_side(args, tmp, records, tok_path)
        first = ours(), theirs()  # warm-up (optimizer state); policy == reference: both log 2
        times: dict[str, list[float]] = {"nxd": [], "trl": []}
        for i in range(args.steps):
            order = (("nxd", ours), ("trl", theirs)) if i % 2 == 0 else (("trl", theirs), ("nxd", ours))
            for name, fn in order:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    nxd_ms, trl_ms = (statistics.median(times[k]) * 1e3 for k in ("nxd", "trl"))
    print(f"DPO step ({args.pairs} pairs x {args.seq} tokens, hidden {args.hidden}, {args.layers} layers, "
          f"{args.steps} steps ABBA, median): nxd {nxd_ms:.1f} ms, TRL DPOTrainer {trl_ms:.1f} ms, "
          f"ratio nxd/TRL {nxd_ms / trl_ms:.2f}; first-step losses nxd {first[0]:.6f}, TRL {first[1]:.6f}; TRL batch "
          f"shapes {sorted(step_shapes[0])}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
