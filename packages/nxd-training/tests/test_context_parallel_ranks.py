"""``distributed_strategy.context_parallel_size: 2`` through ``nxd train``'s loop on 2 real gloo ranks
(TP=1, ZeRO-1, as NxDT's hf_llama3_70B_CP_config): losses equal the one-process CP=1 run, and a
checkpoint written at CP=2 resumes at CP=1 exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nxd_training.exp_manager import read_metrics


def _train(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    result = train(load_config(config), log_dir=log_dir)
    return {"losses": result.losses, "start": result.start_step, "final": result.final_step,
            "resumed": result.resumed_from}


def _config(make_config, cp: int, max_steps: int = 6) -> dict[str, Any]:
    em = {"resume_if_exists": True, "checkpoint_callback_params": {"every_n_train_steps": 3}}
    return make_config(trainer={"devices": cp, "max_steps": max_steps},
                       distributed_strategy={"tensor_model_parallel_size": 1, "context_parallel_size": cp,
                                             "zero1": True},
                       exp_manager=em)


@pytest.mark.slow
def test_cp2_losses_equal_cp1_and_resume_at_cp1(rank_pool, make_config, tmp_path: Path) -> None:
    one = rank_pool(1)
    ref = one.run(_train, _config(make_config, 1), str(tmp_path / "cp1"))[0]
    # CP=2 for 3 steps (checkpoint at step 3), then CP=1 picks the checkpoint up for steps 4-6
    part = rank_pool(2).run(_train, _config(make_config, 2, max_steps=3),
                            str(tmp_path / "split"))
    rest = rank_pool(1).run(_train, _config(make_config, 1), str(tmp_path / "split"))[0]
    assert part[0]["losses"] == part[1]["losses"]  # every CP rank reports the global loss
    losses = {**part[0]["losses"], **rest["losses"]}
    assert rest["start"] == 3 and rest["resumed"] is not None and sorted(losses) == list(range(1, 7))
    rel = max(abs(losses[s] - ref["losses"][s]) / abs(ref["losses"][s]) for s in range(1, 7))
    print(f"\nnxd train CP=2 (steps 1-3) then CP=1 from its checkpoint (4-6) vs CP=1: max relative loss diff {rel:.2e}")
    assert rel < 1e-5, (losses, ref["losses"])
    assert ref["losses"][6] < ref["losses"][1] - 0.3
    norms = [m["grad_norm"] for m in read_metrics(tmp_path / "split")][:3]
    ref_norms = [m["grad_norm"] for m in read_metrics(tmp_path / "cp1")][:3]
    assert max(abs(a - b) / b for a, b in zip(norms, ref_norms)) < 1e-5, (norms, ref_norms)
