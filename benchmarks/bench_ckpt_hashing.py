"""Where the checkpoint CRC-32 costs the least wall time: the ways nxd-ckpt could hash a file's
bytes, each timed as write + fsync of the same 16 buffers, against the write + fsync alone.

  write_only         the baseline: no hashing
  after_each_write   write a buffer, then hash it (one after the other)
  with_each_write    a helper thread writes a buffer while the caller hashes it
  trailing_writes    a helper thread hashes each buffer while the caller goes on writing
  during_fsync       write everything, then hash on a helper thread while the file is synced
                     (what nxd-ckpt's HashingWriter does with the tensors being saved)

The variants take turns within each round (the order rotating), medians with min-max of the
per-round ratio to write_only. Usage: python benchmarks/bench_ckpt_hashing.py [--mb 64 1024]
[--repeats 15] [--dir /scratch/on/the/disk]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from nxd_ckpt.checksum import crc32

POOL = ThreadPoolExecutor(max_workers=1)


def write_only(f, bufs) -> None:
    for b in bufs:
        f.write(b)


def after_each_write(f, bufs) -> None:
    crc = 0
    for b in bufs:
        f.write(b)
        crc = crc32(b, crc)


def with_each_write(f, bufs) -> None:
    crc = 0
    for b in bufs:
        pending = POOL.submit(f.write, b)
        crc = crc32(b, crc)
        pending.result()


def trailing_writes(f, bufs) -> Future:
    state = [0]

    def update(b) -> None:
        state[0] = crc32(b, state[0])

    last = None
    for b in bufs:
        last = POOL.submit(update, b)
        f.write(b)
    return last


def during_fsync(f, bufs) -> Future:
    write_only(f, bufs)

    def hash_all() -> int:
        crc = 0
        for b in bufs:
            crc = crc32(b, crc)
        return crc

    return POOL.submit(hash_all)


VARIANTS = [write_only, after_each_write, with_each_write, trailing_writes, during_fsync]


def measure(root: str, mb: int, repeats: int) -> dict[str, list[float]]:
    bufs = [memoryview(np.random.default_rng(i).bytes(mb * 2**20 // 16)) for i in range(16)]
    path = os.path.join(root, "f.bin")
    times: dict[str, list[float]] = {v.__name__: [] for v in VARIANTS}
    for r in range(repeats + 1):  # round 0 warms up
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                pending = variant(f, bufs)
                f.flush()
                os.fsync(f.fileno())
            if pending is not None:
                pending.result()
            elapsed = time.perf_counter() - t0
            os.remove(path)
            if r:
                times[variant.__name__].append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        for mb in args.mb:
            times = measure(root, mb, args.repeats)
            base = times["write_only"]
            print(f"\n{mb} MiB in 16 writes, {args.repeats} rounds, CRC-32 from {crc32.__module__}, "
                  f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
            print(f"{'variant':18s} {'ms':>8s} {'write_only / variant':>21s} {'min-max':>11s}")
            for name, ts in times.items():
                ratios = [b / t for b, t in zip(base, ts)]
                print(f"{name:18s} {statistics.median(ts) * 1e3:8.1f} {statistics.median(ratios):21.2f} "
                      f"{min(ratios):5.2f}-{max(ratios):<5.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
