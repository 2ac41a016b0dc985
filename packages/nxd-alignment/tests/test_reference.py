"""The three ways to get DPO's reference agree (one process, through the YAML trainer): precomputed
log-probs, an on-the-fly frozen copy, and for LoRA the same model with its adapters switched off."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

DPO = str(Path(__file__).parent / "configs" / "hf_llama3_8B_DPO_config.yaml")

STEPS = ["trainer.max_steps=4", "model.optim.sched.max_steps=4", "distributed_strategy.sequence_parallel=false",
         "distributed_strategy.zero1=false", "exp_manager.create_checkpoint_callback=false"]


def _dpo(args_for, out: Path, *extra: str) -> dict[int, float]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    args = args_for(DPO, out, devices=1, tp=1, extra=[*STEPS, *extra])
    return train(load_config(DPO, args), log_dir=str(out / "run")).losses


def _rel(a: dict[int, float], b: dict[int, float]) -> float:
    return max(abs(a[s] - b[s]) / b[s] for s in b)


@pytest.mark.slow
def test_on_the_fly_reference_equals_precomputed(args_for, tmp_path: Path) -> None:
    pre = _dpo(args_for, tmp_path / "pre")
    fly = _dpo(args_for, tmp_path / "fly", "model_alignment_strategy.dpo.precompute_ref_log_probs=false")
    print(f"DPO frozen-copy reference vs precomputed: max rel loss diff {_rel(fly, pre):.1e}")
    assert pre[1] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference at step 1
    assert _rel(fly, pre) <= 1e-5


@pytest.mark.slow
def test_lora_reference_is_the_base_with_adapters_off(args_for, tmp_path: Path) -> None:
    peft: list[Any] = ["model_alignment_strategy.peft.lora_rank=4", "model_alignment_strategy.peft.lora_alpha=8",
                       "model.optim.lr=0.01"]
    fly = _dpo(args_for, tmp_path / "fly", *peft, "model_alignment_strategy.dpo.precompute_ref_log_probs=false")
    pre = _dpo(args_for, tmp_path / "pre", *peft)
    print(f"DPO LoRA adapters-off reference vs precomputed: max rel loss diff {_rel(fly, pre):.1e}; losses {fly}")
    assert fly[1] == pytest.approx(math.log(2), abs=1e-6)  # fresh adapters (B = 0): policy == base
    assert _rel(fly, pre) <= 1e-5
    assert fly[4] != fly[1]  # the adapters train


@pytest.mark.slow
def test_validation_uses_precomputed_reference_and_logs_rewards(args_for, pairs_file: str, tmp_path: Path) -> None:
    """``data.val_dir`` gets its own precomputed reference table; validation logs the loss and the
    reward metrics under split ``valid`` in metrics.jsonl (TensorBoard: ``valid/rewards/...``)."""
    import json

    from nxd_training.config import load_config
    from nxd_training.loop import train

    out = tmp_path / "val"
    args = args_for(DPO, out, devices=1, tp=1, extra=[*STEPS, f"data.val_dir={pairs_file}",
                                                       "trainer.val_check_interval=2", "trainer.limit_val_batches=2"])
    result = train(load_config(DPO, args), log_dir=str(out / "run"))
    assert sorted(result.valid_losses) == [2, 4]
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"]
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in valid] == [2, 4]
    for r in valid + train_records:
        assert {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"} <= set(r)
    print(f"DPO validation: losses {result.valid_losses}, accuracies {[r['rewards/accuracies'] for r in valid]}")
