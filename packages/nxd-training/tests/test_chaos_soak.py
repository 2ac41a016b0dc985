"""The chaos soak (benchmarks/chaos_soak.py) with N=2 random interruptions (random rank, the
launcher, or the whole job, killed at a random moment) on a tiny model: losses and final weights
equal an uninterrupted run bitwise, and no complete checkpoint is lost.

Long soaks (docs/checkpoints.md records their results): NXD_CHAOS_N / NXD_CHAOS_SEED set N and the
seed; NXD_CHAOS_WORK keeps the soak's folder (its soak.json is the progress so far, and the same
command resumes a stopped soak); NXD_CHAOS_FSDP=1 also runs the soak with distributed_strategy.fsdp
(five launches again: not in the default run)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml

HARNESS = Path(__file__).resolve().parents[3] / "benchmarks" / "chaos_soak.py"
N = int(os.environ.get("NXD_CHAOS_N", "2"))
STRATEGIES = {"tp2": {"tensor_model_parallel_size": 2},
              "fsdp": {"tensor_model_parallel_size": 1, "fsdp": {"reshard_after_forward": True}}}
# steps per interruption: an FSDP soak's kills land ~14 logged steps apart (the steps run during the kill
# window and the kill itself), so 8 x (N + 1) steps ran out at 18 of 30 kills
STEPS_PER_KILL = {"tp2": 8, "fsdp": 16}


@pytest.mark.slow
# N=2: four launches of nxd train (the kill-and-resume tests cover each kind by itself); a long soak
# has no limit (the marker would win over --timeout=0)
@pytest.mark.timeout(1200 if N <= 3 else 0)
@pytest.mark.skipif(not HARNESS.exists(), reason="needs the repository's benchmarks/ folder")
@pytest.mark.parametrize("strategy", [
    "tp2",
    pytest.param("fsdp", marks=pytest.mark.skipif(os.environ.get("NXD_CHAOS_FSDP") != "1",
                                                  reason="the FSDP soak runs with NXD_CHAOS_FSDP=1 (docs/checkpoints.md)")),
])
def test_chaos_soak(make_config, tmp_path: Path, strategy: str) -> None:
    spec = importlib.util.spec_from_file_location("chaos_soak", HARNESS)
    soak = importlib.util.module_from_spec(spec)
    sys.modules["chaos_soak"] = soak
    spec.loader.exec_module(soak)
    n, seed = N, int(os.environ.get("NXD_CHAOS_SEED", "20261125"))
    work = Path(os.environ["NXD_CHAOS_WORK"]) / strategy if os.environ.get("NXD_CHAOS_WORK") else tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    path = work / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": STEPS_PER_KILL[strategy] * (n + 1)}, distributed_strategy=STRATEGIES[strategy],
        exp_manager={"checkpoint_callback_params": {"every_n_train_steps": 2, "save_top_k": 2}})))
    result = soak.run_soak(path, work, n, seed)
    print(f"\nchaos soak ({strategy}): seed {seed}, {len(result.interruptions)} interruptions, kinds {dict(result.kinds)}, "
          f"phases {dict(result.phases)}, {result.steps} steps, {result.seconds:.0f} s; {result.interruptions}")
    assert len(result.interruptions) == n
