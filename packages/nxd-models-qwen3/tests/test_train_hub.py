"""``nxd train hub:qwen3-tiny`` (TP=2 + SP) and ``hub:qwen3-moe-tiny`` (EP=2) on 2 gloo ranks, shrunk
to a few steps on a small prepared corpus: both learn (the last losses are below the first)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=512)


def _train(hub: str, overrides: list[str], log_dir: str) -> dict[int, float]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    return dict(train(load_config(f"hub:{hub}", overrides), log_dir=log_dir).losses)


@pytest.mark.parametrize("hub", ["qwen3-tiny", "qwen3-moe-tiny"])
def test_hub_tiny_config_learns(rank_pool, corpus, tmp_path, hub):
    overrides = [f"data.data_prefix={corpus['data_prefix']}", f"data.tokenizer={corpus['tokenizer']}",
                 "data.prepare=null", "data.seq_length=32", "data.micro_batch_size=4", "data.global_batch_size=8",
                 "trainer.max_steps=10", "trainer.val_check_interval=0", "trainer.limit_val_batches=0",
                 "trainer.enable_progress_bar=false", f"exp_manager.exp_dir={tmp_path / 'runs'}",
                 "exp_manager.create_checkpoint_callback=false", "exp_manager.create_tensorboard_logger=false",
                 "generation=null", "model.optim.sched.warmup_steps=2"]
    results = rank_pool(2).run(_train, hub, overrides, str(tmp_path / "log"), timeout=900)
    losses: Any = results[0]
    steps = sorted(losses)
    first, last = sum(losses[s] for s in steps[:3]) / 3, sum(losses[s] for s in steps[-3:]) / 3
    print(f"\n{hub}: loss {first:.3f} -> {last:.3f} over {len(steps)} steps")
    assert last < first - 0.2, losses
