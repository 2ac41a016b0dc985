"""Pipeline parallelism through the YAML (``distributed_strategy.pipeline_model_parallel_size``) on 2
gloo ranks: per-step losses (and validation losses, through ``run_eval``) equal a single-process
PP=1 run on the same data with the same initial weights, for 1F1B, interleaved virtual stages and
manual ``model.pipeline_cuts``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

STEPS = 4
# 4 layers so 2 stages x 2 virtual chunks each hold one; micro-batch 1 x 4 micro-batches per step
COMMON: dict[str, Any] = {
    "trainer": {"max_steps": STEPS, "val_check_interval": STEPS, "limit_val_batches": 4},
    "exp_manager": {"create_checkpoint_callback": False},
    "data": {"micro_batch_size": 1, "global_batch_size": 4},
    "model": {"num_layers": 4},
}


def _sections(**extra: dict[str, Any]) -> dict[str, Any]:
    """COMMON with ``extra`` merged in, one level deep per section."""
    out = {k: dict(v) for k, v in COMMON.items()}
    for key, value in extra.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def _train(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    import re

    from nxd_training.config import load_config
    from nxd_training.loop import Trainer

    trainer = Trainer(load_config(config), Path(log_dir))
    try:
        names = [n for n, _ in trainer.model.named_parameters()]
        result = trainer.fit()
    finally:
        trainer.close()
    layers = sorted({int(m.group(1)) for n in names if (m := re.search(r"layers\.(\d+)\.", n))})
    return {"losses": result.losses, "valid": result.valid_losses, "layers": layers,
            "embed": any("embed_tokens" in n for n in names), "head": any("lm_head" in n for n in names)}


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One device, no pipeline: run in this process (nxd train's single-device path)."""
    out = tmp_path_factory.mktemp("pp1")
    config = tiny(out, **_sections(trainer={"devices": 1}, distributed_strategy={"tensor_model_parallel_size": 1}))
    return _train(config, str(out / "run"))


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "stage_layers"), [
    ({"pipeline_model_parallel_size": 2}, [[0, 1], [2, 3]]),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}, [[0, 2], [1, 3]]),
    ({"pipeline_model_parallel_size": 2, "pipeline_schedule": "gpipe", "cuts": ["model.layers.0"]}, [[0], [1, 2, 3]]),
], ids=["1f1b", "interleaved-vpp2", "gpipe-cuts"])
def test_pp2_matches_single_process(rank_pool, make_config, tmp_path: Path, reference: dict[str, Any],
                                    layout: dict[str, Any], stage_layers: list[list[int]]) -> None:
    layout = dict(layout)
    cuts = layout.pop("cuts", None)
    config = make_config(**_sections(model={"pipeline_cuts": cuts} if cuts else {},
                                     distributed_strategy={"tensor_model_parallel_size": 1, **layout}))
    results = rank_pool(2).run(_train, config, str(tmp_path / "pp2"))
    # the model really is split: each rank holds its stages' layers, the embedding and head at the ends
    assert [r["layers"] for r in results] == stage_layers
    assert [(r["embed"], r["head"]) for r in results] == [(True, False), (False, True)]
    ref, got = reference["losses"], results[0]["losses"]
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    assert results[1]["losses"] == got  # every stage reports the last stage's loss
    rel = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    vrel = abs(results[0]["valid"][STEPS] - reference["valid"][STEPS]) / reference["valid"][STEPS]
    print(f"PP=2 {layout} cuts={cuts}: max rel loss diff vs PP=1 {rel:.2e}, validation {vrel:.2e}")
    assert rel < 1e-5, (got, ref)
    assert vrel < 1e-5, (results[0]["valid"], reference["valid"])
    assert ref[STEPS] < ref[1] - 0.1  # the runs being compared learn
