"""``nxd train hub:deepseek-v3-tiny`` (EP=2, DP=2; the expert bias moves after every step) on 2
gloo ranks through nxd-training's train path, shrunk to a few steps on a small prepared corpus: it
learns (the last losses are below the first); it validates with context parallelism."""

from __future__ import annotations

from typing import Any

import pytest

from nxd.errors import ConfigError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=512)


def _overrides(corpus: dict[str, str], tmp_path: Any) -> list[str]:
    return [f"data.data_prefix={corpus['data_prefix']}", f"data.tokenizer={corpus['tokenizer']}", "data.prepare=null",
            "data.seq_length=32", "data.micro_batch_size=4", "data.global_batch_size=8", "trainer.max_steps=10",
            "trainer.val_check_interval=0", "trainer.limit_val_batches=0", "trainer.enable_progress_bar=false",
            f"exp_manager.exp_dir={tmp_path / 'runs'}", "exp_manager.create_checkpoint_callback=false",
            "exp_manager.create_tensorboard_logger=false", "generation=null", "model.optim.sched.warmup_steps=2"]


def _train(overrides: list[str], log_dir: str) -> dict[int, float]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    return dict(train(load_config("hub:deepseek-v3-tiny", overrides), log_dir=log_dir).losses)


def test_hub_deepseek_v3_tiny_learns(rank_pool, corpus, tmp_path):
    results = rank_pool(2).run(_train, _overrides(corpus, tmp_path), str(tmp_path / "log"), timeout=900)
    losses: Any = results[0]
    steps = sorted(losses)
    first, last = sum(losses[s] for s in steps[:3]) / 3, sum(losses[s] for s in steps[-3:]) / 3
    print(f"\ndeepseek-v3-tiny: loss {first:.3f} -> {last:.3f} over {len(steps)} steps")
    assert last < first - 0.2, losses


def test_hub_deepseek_v3_tiny_takes_context_parallelism(corpus, tmp_path):
    """MLA runs under CP (tests/test_context_parallel.py): the config validates with CP=2 x EP=2; a
    sequence that does not cut into 2 x CP chunks is refused by name."""
    from nxd_training.config import load_config

    overrides = _overrides(corpus, tmp_path) + ["distributed_strategy.context_parallel_size=2"]
    assert load_config("hub:deepseek-v3-tiny", overrides).distributed_strategy.context_parallel_size == 2
    with pytest.raises(ConfigError, match="seq_length=30 must be divisible by 2 x context_parallel_size"):
        load_config("hub:deepseek-v3-tiny", overrides + ["data.seq_length=30"])


def test_nxd_plan_of_the_hub_config():
    """``nxd plan hub:deepseek-v3-tiny``: the planned parameters are the model's (MLA's narrower values
    shape the meta attention's output); activations are measured with the most routed rows per
    rank (nxd_moe.max_routed_rows), and the plan says so."""
    import torch

    import nxd
    from nxd_plan.planner import make_run_plan

    plan = make_run_plan("hub:deepseek-v3-tiny", ["data.prepare=null"])
    spec = nxd.get_model("deepseek_v3")
    with torch.device("meta"):
        model = spec.build(spec.config_from_dict({"preset": "deepseek-v3-tiny"}))
    assert plan.parameters_total == sum(p.numel() for p in model.parameters())
    assert plan.layout.world_size == 2 and len(plan.ranks) == 2
    assert plan.activation_profile.measured
    assert any("max_routed_rows" in note for note in plan.activation_profile.notes)
