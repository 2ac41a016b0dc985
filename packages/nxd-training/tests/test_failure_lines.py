"""nxd train's last line, from the records ranks leave. A job that ended in a collective timeout names the rank that never came, the
collective the others waited in and where the hung rank was when stopped; when every rank waited,
in different collectives, it says so. The records are what the ranks leave (``rank_status``);
tests/test_launch_faults.py checks the same line through `nxd train` with a hung rank."""

from __future__ import annotations

import json
from pathlib import Path

from nxd_training.config import load_config
from nxd_training.failure import first_failure
from nxd_training.rank_status import STATUS_DIR

# torchrun's summary after rank 0 failed and it stopped rank 1 with SIGTERM
TORCHRUN = """
[0]:
  time      : 2026-11-26_04:00:01
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 11)
[1]:
  time      : 2026-11-26_04:00:02
  host      : vm
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 12)
"""


def _record(run: Path, rank: int, collective: dict | None, **extra) -> None:
    (run / STATUS_DIR).mkdir(exist_ok=True)
    record = {"rank": rank, "node": 0, "group": 0, "local_rank": rank, "host": "vm", "how": "exception",
              "what": "CollectiveTimeout: rank 0 ...", "code": None, "time": 1.0 + rank, "step": 5, "done": 4,
              "max_steps": 12, "collective": collective, **extra}
    (run / STATUS_DIR / f"rank_{rank}.json").write_text(json.dumps(record))


def test_the_rank_that_never_came_is_named_with_the_collective_and_its_stack(make_config, tmp_path: Path) -> None:
    config = load_config(make_config(distributed_strategy={"tensor_model_parallel_size": 1,
                                                           "collective_timeout": 10}))
    site = {"op": "all_reduce", "ranks": [0, 1], "caller": "nxd_core_parallel/grads.py:88 in allreduce_coalesced"}
    _record(tmp_path, 0, site)
    (tmp_path / STATUS_DIR / "rank_1.stack").write_text(
        'Stack (most recent call first):\n  File "/x/hooks/sitecustomize.py", line 4 in <lambda>\n'
        '  File "/x/src/nxd_training/loop.py", line 300 in train_step\n  File "/x/worker.py", line 9 in main\n')
    assert first_failure(config, tmp_path, TORCHRUN) == (
        "nxd train: rank 1 stopped taking part first (hung: it reported no error): rank 0 waited "
        "distributed_strategy.collective_timeout=10s for it in all_reduce over ranks [0, 1] (called from "
        "nxd_core_parallel/grads.py:88 in allreduce_coalesced) at step 5 of 12; when stopped, rank 1 was in "
        "hooks/sitecustomize.py:4 in <lambda>, called from nxd_training/loop.py:300 in train_step")


def test_ranks_waiting_in_different_collectives_are_each_named(make_config, tmp_path: Path) -> None:
    config = load_config(make_config(distributed_strategy={"collective_timeout": 10}))
    _record(tmp_path, 0, {"op": "all_reduce", "ranks": [0, 1], "caller": "a.py:1 in f"})
    _record(tmp_path, 1, {"op": "barrier", "ranks": [0, 1], "caller": "b.py:2 in g"})
    line = first_failure(config, tmp_path, TORCHRUN.replace("-15 (pid: 12)", "1 (pid: 12)"))
    assert line == (
        "nxd train: ranks 0, 1 each waited distributed_strategy.collective_timeout=10s at step 5 of 12, in different "
        "collectives: rank 0 in all_reduce over ranks [0, 1] (called from a.py:1 in f); rank 1 in barrier over "
        "ranks [0, 1] (called from b.py:2 in g) (the ranks called collectives in different orders; no rank failed)")


def test_a_rank_that_failed_is_still_the_cause_when_another_timed_out(make_config, tmp_path: Path) -> None:
    config = load_config(make_config(distributed_strategy={"collective_timeout": 10}))
    _record(tmp_path, 0, {"op": "all_reduce", "ranks": [0, 1], "caller": None})
    line = first_failure(config, tmp_path, TORCHRUN.replace("-15 (pid: 12)", "-9 (pid: 12)"))
    assert line == "nxd train: rank 1 failed first: it was killed by SIGKILL (exit code -9)"


def test_a_rank_that_failed_while_resuming_is_not_placed_at_a_step(make_config, tmp_path: Path) -> None:
    """Rank 1 raised before its first step (a corrupt checkpoint at resume): the previous launch's
    log ends at step 12, but the line must not say "at step 13"."""
    config = load_config(make_config(trainer={"max_steps": 13}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 12, "loss": 1.0}) + "\n")
    _record(tmp_path, 1, None, what="CorruptCheckpointError: x/metadata.json: content checksum mismatch", step=0,
            max_steps=None)
    line = first_failure(config, tmp_path, TORCHRUN)
    assert line == ("nxd train: rank 1 failed first: it raised CorruptCheckpointError: x/metadata.json: content "
                    "checksum mismatch before its first step (starting up or resuming)")
