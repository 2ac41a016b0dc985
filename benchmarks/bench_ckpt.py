"""nxd-ckpt benchmark: save throughput and how long async save blocks the training loop.

Runs side by side in one process (a one-rank gloo group):
  * save throughput of ``nxd.save_checkpoint`` against a raw sequential write (+fsync) of the same
    number of bytes to the same disk, ``torch.save`` and ``torch.distributed.checkpoint.save``;
  * the time a training loop is blocked by saving: sync vs async (ours) and DCP's ``async_save``.
Every throughput is the median of ``--repeats`` rounds in which the writers take turns, printed with
the spread (min-max), and each writer's ratio to the raw write is taken within a round (so load
changes on a shared machine cancel out); the load average is printed with the numbers; the header states the regime (size vs free memory: a size far below free
memory is written through the page cache, and fsync then measures the device's flush; sizes near
or above it are disk-bound).
  * the cost of nxd's DCP checksums (``nxd_fsdp.save_dcp`` / ``load_dcp``: CRC-32 while writing and syncing,
    each file hashed as the load reads it): the same DCP save and load with and without them.
Usage: python benchmarks/bench_ckpt.py [--mb 64 1024] [--repeats 5] [--dir /scratch/on/the/disk] [--dcp-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import nxd

DEVICE = "cpu"  # --device cuda: the state lives on the GPU (saves copy it to the host first)


def make_state(total_mb: int) -> dict[str, torch.Tensor]:
    n = 16
    per = total_mb * 2**20 // 4 // n
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(per, generator=g).to(DEVICE) for i in range(n)}


def sync_device() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class StateModule(torch.nn.Module):
    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for k, v in state.items():
            self.register_parameter(k.replace(".", "_"), torch.nn.Parameter(v))


def raw_write(path: str, state: dict[str, torch.Tensor]) -> None:
    """The disk's baseline: the same bytes, already in host memory, written sequentially."""
    with open(path, "wb") as f:
        for t in state.values():
            f.write(memoryview(t.numpy()))  # no copy: the baseline is the disk, not Python
        f.flush()
        os.fsync(f.fileno())


def torch_save(path: str, state: dict[str, torch.Tensor]) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def timed_once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughput(root: str, mb: int, repeats: int) -> list[tuple[str, list[float], list[float]]]:
    """(writer, MiB/s per round, ratio to the raw write of the same round) for every writer.

    The writers take turns within each round (the order rotating from round to round), so a change
    of load on a shared machine hits all of them alike, and each ratio compares writes made seconds
    apart. Files are removed between writes (outside the timing), so the disk never fills up.
    """
    state = make_state(mb)
    model = StateModule(state)
    host = {k: v.cpu() for k, v in state.items()}  # the raw write's bytes (no device copy in the baseline)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())

    def in_dir(name: str, write) -> tuple[str, object]:
        def run() -> float:
            target = os.path.join(root, name)
            try:
                return timed_once(lambda: write(target))
            finally:
                shutil.rmtree(target, ignore_errors=True)
                if os.path.exists(target + ".bin"):
                    os.remove(target + ".bin")
        return run

    writers = [
        ("raw sequential write + fsync", in_dir("raw", lambda d: raw_write(d + ".bin", host))),
        ("torch.save + fsync (peer)", in_dir("ts", lambda d: torch_save(d + ".bin", state))),
        ("torch DCP save (peer)", in_dir("dcp", lambda d: dcp.save({"model": state}, checkpoint_id=d))),
        ("nxd.save_checkpoint (torch fmt)", in_dir("nxd", lambda d: nxd.save_checkpoint(
            d, "t", model=model, save_rng=False))),
        ("nxd.save_checkpoint (safetensors)", in_dir("nxds", lambda d: nxd.save_checkpoint(
            d, "t", model=model, format="safetensors", save_rng=False))),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in writers}
    for _, run in writers:  # warm-up, not timed: plugin discovery, DCP's planner, first allocations
        run()
    for r in range(repeats):
        order = writers[r % len(writers):] + writers[:r % len(writers)]
        for name, run in order:
            times[name].append(run())
    raw = times[writers[0][0]]
    return [(name, [nbytes / t / 2**20 for t in ts], [r / t for r, t in zip(raw, ts)]) for name, ts in times.items()]


def dcp_checksum_cost(root: str, mb: int, repeats: int) -> list[tuple[str, list[float], list[float]]]:
    """(operation, time without nxd's checksums ÷ time with, per round; the same of the process's CPU
    time, helper threads included: what the checks cost where no core is free) for a DCP save and load of
    the same state: plain DCP (``FileSystemWriter``/``Reader``) against the writer and checks that
    ``nxd_fsdp.save_dcp`` / ``load_dcp`` add (hash while writing and syncing + manifest; hash each file as
    it is read, ``.metadata`` through the safe unpickler). Rounds alternate which goes first."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    from nxd_core_parallel.dcp_integrity import DigestingWriter, SafeReader, record_manifest, verify_dcp

    state = {"model": make_state(mb)}
    target = {"model": {k: torch.empty_like(v) for k, v in state["model"].items()}}
    folder = os.path.join(root, "dcp_loaded")

    def save_plain() -> float:
        return timed_once(lambda: dcp.save(state, storage_writer=FileSystemWriter(os.path.join(root, "dcp_plain"))))

    def save_checked() -> float:
        def run() -> None:
            writer = DigestingWriter(os.path.join(root, "dcp_checked"))
            dcp.save(state, storage_writer=writer)
            record_manifest(os.path.join(root, "dcp_checked"), writer, "nxd_fsdp.save_dcp")
        return timed_once(run)

    def load_plain() -> float:
        return timed_once(lambda: dcp.load(target, storage_reader=FileSystemReader(folder)))

    def load_checked() -> float:
        return timed_once(lambda: dcp.load(target, storage_reader=SafeReader(folder, verify_dcp(folder))))

    writer = DigestingWriter(folder)
    dcp.save(state, storage_writer=writer)
    record_manifest(folder, writer, "nxd_fsdp.save_dcp")
    pairs = {"DCP save": (save_plain, save_checked), "DCP load": (load_plain, load_checked)}
    for plain, checked in pairs.values():  # warm-up
        plain(), checked()
    ratios: dict[str, list[float]] = {name: [] for name in pairs}
    cpu_ratios: dict[str, list[float]] = {name: [] for name in pairs}

    def cpu_and_wall(fn) -> tuple[float, float]:
        c0 = time.process_time()
        wall = fn()
        return time.process_time() - c0, wall

    for r in range(repeats):
        for name, (plain, checked) in pairs.items():
            first, second = (plain, checked) if r % 2 == 0 else (checked, plain)
            t1, t2 = cpu_and_wall(first), cpu_and_wall(second)
            t_plain, t_checked = (t1, t2) if r % 2 == 0 else (t2, t1)
            ratios[name].append(t_plain[1] / t_checked[1])  # throughput ratio: with checksums ÷ without
            cpu_ratios[name].append(t_plain[0] / t_checked[0])
            for d in ("dcp_plain", "dcp_checked"):
                shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    return [(name, ratios[name], cpu_ratios[name]) for name in pairs]


def load_average() -> str:
    try:
        return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def regime(root: str, mb: int) -> str:
    """Page cache or disk-bound, from the size against the memory the kernel can cache with."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) for line in f}
        avail = info.get("MemAvailable", 0) // 1024
    except OSError:
        return f"{mb} MiB (free memory unknown)"
    where = "page cache (size << free memory; fsync flushes it)" if mb * 4 < avail else "disk-bound (size near free memory)"
    stat = os.statvfs(root)
    from nxd_ckpt.checksum import crc32

    return (f"{where}; {mb} MiB on {DEVICE} vs {avail} MiB available; {os.cpu_count()} CPUs; torch {torch.__version__}; "
            f"CRC-32 from {crc32.__module__}; "
            f"fs block {stat.f_bsize}")


def training_loop(steps: int, save_every: int, save, optimizer: torch.optim.Optimizer) -> tuple[float, list[float]]:
    """(loop wall time, the time spent inside each save call)."""
    torch.manual_seed(0)
    a = torch.randn(*((4096, 4096) if DEVICE == "cuda" else (384, 384)), device=DEVICE)
    blocked = []
    sync_device()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        for _ in range(12):  # ~a forward and backward of compute
            a = torch.tanh(a @ a) * 0.5
        optimizer.step()  # no gradients, so no update: where a real step would change the state
        sync_device()  # a loop reading its loss each step
        if save is not None and step % save_every == 0:
            s0 = time.perf_counter()
            save(step)
            blocked.append(time.perf_counter() - s0)
    return time.perf_counter() - t0, blocked


def blocking(root: str, mb: int, steps: int, save_every: int) -> list[tuple[str, float, list[float]]]:
    model = StateModule(make_state(mb))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    opt_state = {"model": model.state_dict()}
    waits: list[float] = []

    def nxd_sync(step: int) -> None:
        nxd.save_checkpoint(os.path.join(root, "loop_sync"), f"s{step}", model=model, num_kept_ckpts=1, save_rng=False)

    def nxd_async(step: int) -> None:
        nxd.save_checkpoint(os.path.join(root, "loop_async"), f"s{step}", model=model, num_kept_ckpts=1,
                            async_save=True, save_rng=False)

    def nxd_overlapped(step: int) -> None:
        nxd.save_checkpoint(os.path.join(root, "loop_overlap"), f"s{step}", model=model, num_kept_ckpts=1,
                            async_save=True, save_rng=False, overlap_snapshot=True, on_snapshot_wait=waits.append)

    pending: list = []

    def dcp_async(step: int) -> None:
        if pending:
            pending.pop().result()
        pending.append(dcp.async_save(opt_state, checkpoint_id=os.path.join(root, f"loop_dcp{step}")))

    base, _ = training_loop(steps, save_every, None, optimizer)
    rows = [("no save (baseline)", base, [])]
    for name, fn, finish in (("sync save (nxd)", nxd_sync, None), ("async save (nxd)", nxd_async, nxd.finalize_checkpoint),
                             ("async, overlapped (nxd)", nxd_overlapped, nxd.finalize_checkpoint),
                             ("DCP async_save (peer)", dcp_async, lambda: pending and pending.pop().result())):
        waits.clear()
        t, calls = training_loop(steps, save_every, fn, optimizer)
        if finish:
            finish()  # the last overlapped snapshot's wait, if no step came after it
        # the loop's stall per save: the call, plus what the next step waited for an overlapped copy
        blocked = [c + w for c, w in zip(calls, waits + [0.0] * (len(calls) - len(waits)))]
        rows.append((name, t, blocked))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--save-every", type=int, default=16)
    parser.add_argument("--dir", default=None, help="scratch directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the saved state lives")
    parser.add_argument("--dcp-only", action="store_true", help="only the DCP checksum cost")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(dir=args.dir)
    store = dist.FileStore(os.path.join(root, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for mb in args.mb:
            before = load_average()
            rows = dcp_checksum_cost(root, mb, args.repeats)
            print(f"\nDCP with nxd's checksums, {mb} MiB: throughput with ÷ without, median of {args.repeats} "
                  f"rounds (min-max), wall and CPU time; {before} before, {load_average()} after")
            for name, ratios, cpu in rows:
                print(f"{name:38s} {statistics.median(ratios):6.2f} {min(ratios):5.2f}-{max(ratios):<5.2f}   CPU time "
                      f"{statistics.median(cpu):5.2f} {min(cpu):5.2f}-{max(cpu):<5.2f}")
        if args.dcp_only:
            return
        for mb in args.mb:
            before = load_average()
            rows = throughput(root, mb, args.repeats)
            print(f"\nSave throughput, {mb} MiB of fp32 tensors, median of {args.repeats} interleaved rounds "
                  f"(min-max); {before} before, {load_average()} after; regime: {regime(root, mb)}")
            print(f"{'writer':38s} {'MiB/s':>9s} {'min-max':>15s} {'vs raw (same round)':>20s} {'min-max':>11s}")
            for name, mbps, ratios in rows:
                print(f"{name:38s} {statistics.median(mbps):9.1f} {min(mbps):7.0f}-{max(mbps):<7.0f} "
                      f"{statistics.median(ratios):20.2f} {min(ratios):5.2f}-{max(ratios):<5.2f}")
        args.mb = args.mb[0]
        loop = blocking(root, args.mb, args.steps, args.save_every)
        sync = loop[1][2]
        sync_later = statistics.median(sync[1:]) if len(sync) > 1 else sync[0]
        print(f"\nTraining loop blocked by saving ({args.steps} steps, a save every {args.save_every}, {args.mb} MiB; "
              f"{load_average()})")
        print("'first': the first save call; 'later': median of the others (async: snapshot buffers reused)")
        print("'loop +ms/save': the loop's wall time over the no-save loop, per save (what a copy the step "
              "had to wait for costs, wherever it waited)")
        print(f"{'mode':26s} {'loop s':>7s} {'blocked s':>9s} {'vs sync':>7s} {'first ms':>8s} {'later ms':>8s} "
              f"{'later vs sync':>13s} {'loop +ms/save':>13s}")
        base = loop[0][1]
        for name, t, blocked in loop:
            if not blocked:
                print(f"{name:26s} {t:7.2f}")
                continue
            later = statistics.median(blocked[1:]) if len(blocked) > 1 else blocked[0]
            print(f"{name:26s} {t:7.2f} {sum(blocked):9.2f} {sum(blocked) / sum(sync):7.3f} {blocked[0] * 1e3:8.1f} "
                  f"{later * 1e3:8.1f} {later / sync_later:13.3f} {(t - base) / len(blocked) * 1e3:13.1f}")
    finally:
        dist.destroy_process_group()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
