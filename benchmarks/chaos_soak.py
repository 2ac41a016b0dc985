"""Chaos soak: train with `nxd train`, kill it at random moments, resume, and prove nothing was lost.

One uninterrupted run is the reference. The soaked run is killed ``n`` times, each time at a random
moment after it made progress (mid-step, mid synchronous save, mid asynchronous save, during
retention: checkpoints every 2 steps make every phase likely), by a random kind of kill:

- ``rank``: SIGKILL to one random rank (torchrun then stops the others);
- ``launcher``: SIGKILL to `nxd train` (torchrun and the ranks die with it: parent-death signals);
- ``job``: SIGKILL to the whole process group at once (a node lost).

After each kill: every complete checkpoint verifies against its checksums (`nxd ckpt verify`), and
the newest complete step never goes back (no complete checkpoint is ever lost; retention deletes one
only after a newer one committed). Each restart resumes (`exp_manager.resume_if_exists`), alternating
synchronous and asynchronous saves. At the end the per-step losses and the final checkpoint's
weights must equal the reference bitwise (CPU).

    python benchmarks/chaos_soak.py CONFIG.yaml --n 30 --seed 1234 [--work DIR]

Progress is written after every interruption to ``DIR/soak.json`` (a partial result that stands on
its own); the same command with the same ``--work`` resumes a soak whose harness was stopped.

CONFIG must checkpoint every few steps with a small ``save_top_k``; the test
(packages/nxd-training/tests/test_chaos_soak.py) runs N=3 on a tiny model. Results: docs/checkpoints.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CODE = "import sys; from nxd.cli import main; sys.exit(main())"


@dataclass
class SoakResult:
    interruptions: list[dict] = field(default_factory=list)
    kinds: Counter = field(default_factory=Counter)
    phases: Counter = field(default_factory=Counter)
    steps: int = 0
    seconds: float = 0.0


def _launch(config: Path, log_dir: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", CODE, "train", str(config),
                             f"exp_manager.explicit_log_dir={log_dir}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)  # its own process group: the 'job' kill takes it whole


def _losses(log_dir: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    path = log_dir / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by the kill; the resumed run rewrites from its checkpoint
        if "loss" in record:
            out[int(record["step"])] = record["loss"]
    return out


def _complete(ckpt_dir: Path) -> list[str]:
    from nxd_ckpt.layout import complete_tags
    from nxd_ckpt.storage import open_storage

    return complete_tags(open_storage(str(ckpt_dir))) if ckpt_dir.is_dir() else []


def _step_of(ckpt_dir: Path, tag: str) -> int:
    from nxd_ckpt.convert import read_user_content

    return int(read_user_content(str(ckpt_dir), tag)["step"])


def _phase(ckpt_dir: Path) -> str:
    """What the kill interrupted, by what it left: a save or retention in flight leaves a tag
    without 'done' (or a .saving- temporary); otherwise it hit a training step."""
    if not ckpt_dir.is_dir():
        return "step"
    for d in ckpt_dir.iterdir():
        if d.is_dir() and (d.name.startswith(".saving-") or not (d / "done").exists()):
            return "save/retention"
    return "step"


def _verify_all(ckpt_dir: Path) -> None:
    from nxd_ckpt.verify import verify_checkpoint

    for tag in _complete(ckpt_dir):
        verify_checkpoint(str(ckpt_dir), tag)  # raises naming the first bad file


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill(job: subprocess.Popen, kind: str, rng: random.Random) -> None:
    ranks = [p for p in _descendants(job.pid) if "nxd_training.worker" in " ".join(p.cmdline())
             and "torch.distributed.run" not in " ".join(p.cmdline())]
    if kind == "rank" and ranks:
        rng.choice(ranks).send_signal(signal.SIGKILL)
    elif kind == "launcher":
        job.send_signal(signal.SIGKILL)
    else:
        os.killpg(job.pid, signal.SIGKILL)


def _wait_gone(job: subprocess.Popen, procs: list, timeout: float = 120) -> None:
    import psutil

    try:
        job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise AssertionError("the job did not end after the kill") from None
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not alive, f"processes outlived the kill: {[p.pid for p in alive]}"


def final_weights(ckpt_dir: Path) -> dict:
    """The newest complete checkpoint's model shards, by file, as loaded tensors."""
    import torch

    tag = _complete(ckpt_dir)[-1]
    return {p.name: torch.load(p, weights_only=False) for p in sorted((ckpt_dir / tag / "model").iterdir())}


def same_tensors(a: object, b: object) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b))
    return a == b


STATE = "soak.json"  # the soak's progress: a partial result, and what a restarted harness resumes from


def _load_state(work: Path, n: int, seed: int) -> dict:
    path = work / STATE
    if path.exists():
        state = json.loads(path.read_text())
        if (state["n"], state["seed"]) != (n, seed):
            raise SystemExit(f"{path} is a soak with n={state['n']} seed={state['seed']}: use another --work")
        return state
    return {"n": n, "seed": seed, "reference": None, "interruptions": [], "newest_step": -1, "rng": None,
            "job": None, "seconds": 0.0, "harness_restarts": 0, "finished": False}


def _save_state(work: Path, state: dict) -> None:
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, work / STATE)


def _stop_orphan(state: dict, work: Path) -> bool:
    """A job the previous harness left running (it was stopped itself): kill its process group.
    True when there was one."""
    import psutil

    pid = state.get("job")
    if not pid:
        return False
    try:
        alive = str(work) in " ".join(psutil.Process(pid).cmdline())  # ours: it writes under work/
    except psutil.NoSuchProcess:
        alive = False
    if alive:
        procs = _descendants(pid)
        os.killpg(pid, signal.SIGKILL)
        psutil.wait_procs([psutil.Process(pid), *procs], timeout=120)
    return alive


def _check_after_kill(ckpt: Path, state: dict, what: str) -> int:
    """Every complete checkpoint verifies and the newest complete step did not go back."""
    _verify_all(ckpt)
    tags = _complete(ckpt)
    step = _step_of(ckpt, tags[-1]) if tags else -1
    assert step >= state["newest_step"], f"{what}: newest complete step went {state['newest_step']} -> {step}"
    state["newest_step"] = step
    return step


def run_soak(config: Path, work: Path, n: int, seed: int, max_window: float = 0.3) -> SoakResult:
    """Reference run, then ``n`` random interruptions of the soaked run and its completion;
    asserts bitwise-equal losses and final weights and that no complete checkpoint was lost.

    Resumable: progress is kept in ``work/soak.json`` after each interruption (with the random
    generator's state), so a harness that was itself stopped continues where it was when run again
    with the same ``work``, ``n`` and ``seed`` (a job it left running is killed first and checked
    like an interruption, counted apart as a harness restart)."""
    work.mkdir(parents=True, exist_ok=True)
    state = _load_state(work, n, seed)
    rng = random.Random(seed)
    if state["rng"] is not None:
        version, internal, gauss = state["rng"]
        rng.setstate((version, tuple(internal), gauss))
    start = time.monotonic() - state["seconds"]
    ref_dir, soak_dir = work / "reference", work / "soak"
    ckpt = soak_dir / "checkpoints"
    if _stop_orphan(state, work):
        state["harness_restarts"] += 1
        if state["reference"] is not None:
            _check_after_kill(ckpt, state, "harness restart")
        print("chaos soak: resumed after a harness restart: the job it left was killed (and checked)", flush=True)
    if state["reference"] is None:
        shutil.rmtree(ref_dir, ignore_errors=True)  # an unfinished reference starts over
        ref = _launch(config, ref_dir)
        state["job"] = ref.pid
        _save_state(work, state)
        out, _ = ref.communicate(timeout=1800)
        assert ref.returncode == 0, out[-4000:]
        state["reference"] = max(_losses(ref_dir))
    result = SoakResult(steps=state["reference"])
    state["job"] = None
    _save_state(work, state)
    for i in range(len(state["interruptions"]), n):
        job = _launch(config, soak_dir, "exp_manager.resume_if_exists=true",
                      f"exp_manager.async_checkpointing={'true' if i % 2 else 'false'}")
        state["job"] = job.pid
        _save_state(work, state)
        # a random step of what is left, spread over the interruptions still to come, then a random
        # fraction of a step or save: the kill lands mid-step, mid-save or during retention
        seen = max(_losses(soak_dir), default=0)
        target = seen + rng.randint(1, max(1, (result.steps - seen - 2) // (n - i)))
        while max(_losses(soak_dir), default=0) < target:
            if job.poll() is not None:
                break
            time.sleep(0.01)
        if job.poll() is not None:  # it finished before we could interrupt it
            out, _ = job.communicate()
            assert job.returncode == 0, out[-4000:]
            break
        time.sleep(rng.uniform(0, max_window))
        kind = rng.choice(["rank", "launcher", "job"])
        procs = _descendants(job.pid)
        at = max(_losses(soak_dir), default=0)
        _kill(job, kind, rng)
        _wait_gone(job, procs)
        phase = _phase(ckpt)
        step = _check_after_kill(ckpt, state, f"interruption {i + 1} ({kind})")
        state["interruptions"].append({"kind": kind, "phase": phase, "logged_step": at, "newest_complete": step,
                                       "seconds": round(time.monotonic() - start)})
        state["rng"], state["job"] = list(rng.getstate()), None
        state["seconds"] = time.monotonic() - start
        _save_state(work, state)
        print(f"chaos soak: interruption {i + 1}/{n}: {state['interruptions'][-1]}", flush=True)
    job = _launch(config, soak_dir, "exp_manager.resume_if_exists=true")
    state["job"] = job.pid
    _save_state(work, state)
    out, _ = job.communicate(timeout=1800)
    assert job.returncode == 0, out[-4000:]
    soaked, reference = _losses(soak_dir), _losses(ref_dir)
    assert soaked == reference, f"losses differ: {[(s, soaked.get(s), v) for s, v in reference.items() if soaked.get(s) != v][:5]}"
    assert same_tensors(final_weights(ckpt), final_weights(ref_dir / "checkpoints")), "final weights differ"
    _verify_all(ckpt)
    state.update(job=None, finished=True, seconds=time.monotonic() - start)
    _save_state(work, state)
    result.interruptions = state["interruptions"]
    result.kinds = Counter(r["kind"] for r in result.interruptions)
    result.phases = Counter(r["phase"] for r in result.interruptions)
    result.seconds = state["seconds"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="nxd-chaos-"))
    print(f"chaos soak: progress in {work / STATE} (run again with --work {work} to resume)", flush=True)
    res = run_soak(args.config, work, args.n, args.seed)
    print(f"chaos soak: seed {args.seed}, {len(res.interruptions)} interruptions (kinds {dict(res.kinds)}, "
          f"phases {dict(res.phases)}), {res.steps} steps: losses and final weights bitwise equal to the "
          f"uninterrupted run, no complete checkpoint lost ({res.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
