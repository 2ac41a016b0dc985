"""SFT through the YAML (``model_alignment_strategy.sft`` + nxd-data's ``sft`` module, chosen by
default) on 2 gloo ranks: packed DP=2 losses equal a single-process run on the same data; padded
(``sft.packing: false``) TP=2 learns the completions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

WORDS = ["king", "love", "night", "sword", "crown", "heart", "storm", "blood"]


@pytest.fixture(scope="module")
def sft_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Prompt/completion records whose completion follows from the prompt (learnable quickly)."""
    path = tmp_path_factory.mktemp("sft") / "train.jsonl"
    with path.open("w") as f:
        for i in range(96):
            w = WORDS[i % len(WORDS)]
            f.write(json.dumps({"prompt": f"Say {w} twice:", "completion": f" {w} {w}"}) + "\n")
    return str(path)


def _sections(sft_file: str, packing: bool, **extra: Any) -> dict[str, Any]:
    data = {"module": None, "data_prefix": None, "splits_string": None, "train_dir": sft_file}
    out = {"model_alignment_strategy": {"sft": {"packing": packing}}, "data": data,
           "exp_manager": {"create_checkpoint_callback": False}, "trainer": {"max_steps": 8},
           "model": {"optim": {"lr": 2e-2}}}
    for key, value in extra.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def _train(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import Trainer

    # None marks the tiny config's pretraining keys to drop (data.module then defaults to sft)
    clean = {**config, "data": {k: v for k, v in config["data"].items() if v is not None}}
    trainer = Trainer(load_config(clean), Path(log_dir))
    try:
        module, info = trainer.run.derived.data_module, dict(getattr(trainer.data, "info", {}))
        result = trainer.fit()
    finally:
        trainer.close()
    return {"losses": result.losses, "module": module, "packing": info.get("packing")}


@pytest.fixture(scope="module")
def reference(tiny, sft_file: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sft1")
    config = tiny(out, **_sections(sft_file, True, trainer={"devices": 1},
                                   distributed_strategy={"tensor_model_parallel_size": 1}))
    return _train(config, str(out / "run"))


@pytest.mark.slow
def test_sft_packed_dp2_matches_single_process(rank_pool, make_config, sft_file: str, tmp_path: Path,
                                               reference: dict[str, Any]) -> None:
    config = make_config(**_sections(sft_file, True, distributed_strategy={"tensor_model_parallel_size": 1}))
    results = rank_pool(2).run(_train, config, str(tmp_path / "dp2"))
    got, ref = results[0]["losses"], reference["losses"]
    assert results[0]["module"] == reference["module"] == "sft"  # picked from model_alignment_strategy.sft
    assert results[0]["packing"] is True
    assert sorted(got) == sorted(ref) == list(range(1, 9))
    rel = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    print(f"SFT packed DP=2 vs one process: max rel loss diff {rel:.2e}; loss {ref[1]:.3f} -> {ref[8]:.3f}")
    assert rel < 1e-5, (got, ref)
    assert ref[8] < ref[1] - 1.0


@pytest.mark.slow
def test_sft_padded_tp2_learns(rank_pool, make_config, sft_file: str, tmp_path: Path) -> None:
    config = make_config(**_sections(sft_file, False))
    results = rank_pool(2).run(_train, config, str(tmp_path / "tp2"))
    losses = results[0]["losses"]
    assert results[0]["packing"] is False  # sft.packing reached the data module
    print(f"SFT padded TP=2: loss {losses[1]:.3f} -> {losses[8]:.3f}")
    assert losses[8] < losses[1] - 1.0, losses
    assert results[1]["losses"] == losses
