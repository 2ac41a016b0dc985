"""nxd-data throughput: dataset preparation and the training loader, next to torch-native peers.

Peers: preparation = the `tokenizers` library's batch encoder writing one flat token array (the
floor any preparer pays; no index, no atomic rename, no EOS handling); loading = a map-style
``torch.utils.data.Dataset`` over the same memmap with ``DataLoader`` + ``RandomSampler``.
"Need" is what a quickstart training step consumes: 8 x 256 tokens every ~0.3 s.

Run: .venv/bin/python benchmarks/bench_data.py [--steps 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from nxd_data.factories import indexed
from nxd_data.prepare import prepare_dataset
from nxd_data.quickstart import prepare_quickstart_data
from nxd_data.tokenizers import load_tokenizer

MBS, SEQ, STEP_S = 8, 256, 0.3


class PeerWindows(torch.utils.data.Dataset):
    """Fixed windows of one flat memmap token array (what a hand-written loader does)."""

    def __init__(self, tokens: np.ndarray, seq: int) -> None:
        self.tokens, self.seq = tokens, seq

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        w = torch.from_numpy(self.tokens[i * self.seq : i * self.seq + self.seq + 1].astype(np.int64))
        return {"input_ids": w[:-1], "labels": w[1:]}


def bench_prepare(corpus: Path, tok_dir: str, work: Path) -> list[tuple[str, float]]:
    docs = [json.loads(line)["text"] for line in corpus.open(encoding="utf-8")]
    tok = load_tokenizer(tok_dir)
    start = time.perf_counter()
    ids = tok.encode_batch(docs)
    flat = np.concatenate([np.asarray(i + [tok.eos_id], dtype=np.uint16) for i in ids])
    flat.tofile(work / "peer.bin")
    peer = len(flat) / (time.perf_counter() - start)
    rows = [("peer: tokenizers.encode_batch + tofile", peer)]
    for workers in (1, 2):
        start = time.perf_counter()
        meta = prepare_dataset([corpus], tok_dir, work / f"ours{workers}", workers=workers, progress=False)
        rows.append((f"nxd data prepare, {workers} worker(s)", meta["num_tokens"] / (time.perf_counter() - start)))
    return rows


def bench_loader(prefix: str, steps: int) -> list[tuple[str, float]]:
    dm = indexed({"data_prefix": prefix, "index_mapping_dir": tempfile.mkdtemp()}, seq_length=SEQ,
                 micro_batch_size=MBS, global_batch_size=MBS, dp_rank=0, dp_size=1, seed=1)
    it = dm.train_batches()
    next(it)  # index build is a one-off, not per step
    start = time.perf_counter()
    for _ in range(steps):
        next(it)
    ours = steps * MBS * SEQ / (time.perf_counter() - start)
    tokens = np.memmap(prefix + ".bin", dtype=np.uint16, mode="r")
    peer_ds = PeerWindows(tokens, SEQ)
    loader = torch.utils.data.DataLoader(
        peer_ds, batch_size=MBS, sampler=torch.utils.data.RandomSampler(peer_ds, generator=torch.Generator().manual_seed(1), num_samples=10**9),
    )
    pit = iter(loader)
    next(pit)
    start = time.perf_counter()
    for _ in range(steps):
        next(pit)
    peer = steps * MBS * SEQ / (time.perf_counter() - start)
    return [("peer: torch DataLoader over memmap windows", peer), ("nxd indexed data module", ours)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "nxd_bench_data"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    start = time.perf_counter()
    paths = prepare_quickstart_data(out)
    print(f"quickstart data ready in {time.perf_counter() - start:.1f} s -> {out}")
    work = Path(tempfile.mkdtemp())
    prep = bench_prepare(out / "corpus.jsonl", paths["tokenizer"], work)
    load = bench_loader(paths["data_prefix"], args.steps)
    need = MBS * SEQ / STEP_S
    print(f"\n{'stage':46s} {'tokens/s':>12s} {'vs peer':>8s} {'vs need':>8s}")
    for title, rows in (("preparation", prep), ("loading", load)):
        peer = rows[0][1]
        print(f"-- {title}")
        for name, rate in rows:
            print(f"{name:46s} {rate:12,.0f} {rate / peer:8.2f} {rate / need:8.1f}")
    print(f"\nneed = {MBS} x {SEQ} tokens per {STEP_S} s step = {need:,.0f} tokens/s (quickstart model)")


if __name__ == "__main__":
    main()
