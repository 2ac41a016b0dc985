"""``trainer.profile`` writes a torch.profiler trace of the chosen steps, ``trainer.compile`` trains
the same losses as eager, and the logged MFU counts attention FLOPs (2 gloo ranks, DP=2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nxd_training.exp_manager import read_metrics


def _train(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    result = train(load_config(config), log_dir=log_dir)
    return {"losses": result.losses, "traces": result.profile_traces, "samples": result.samples}


def test_flops_per_token_counts_attention() -> None:
    from nxd_models_llama.spec import SPEC, config_from_dict
    from nxd_training import metrics

    cfg = config_from_dict({"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2})
    dense = metrics.flops_per_token(SPEC, cfg)
    assert metrics.flops_per_token(SPEC, cfg, 32) == dense + 12 * 2 * 32 * 32  # 12 * layers * hidden * seq


@pytest.mark.slow
def test_progress_bar_shows_loss_terms_and_workflow_metrics() -> None:
    from nxd_training import metrics

    fields = metrics.progress_fields({"lm_loss": 6.25, "aux_loss": 2.0017, "z_loss": 4.0, "rewards/accuracies": 0.5})
    assert fields == {"lm": "6.2500", "aux": "2.0017", "acc": "0.5000"}  # z_loss: metrics.jsonl/TensorBoard only


def test_profile_compile_and_mfu(rank_pool, make_config, tmp_path: Path) -> None:
    common = {"trainer": {"max_steps": 3}, "distributed_strategy": {"tensor_model_parallel_size": 1},
              "exp_manager": {"create_checkpoint_callback": False, "peak_tflops_per_device": 1.0}}
    pool = rank_pool(2)
    eager = pool.run(_train, make_config(**common), str(tmp_path / "eager"), timeout=900)[0]
    profiled = make_config(**{**common, "trainer": {"max_steps": 3, "compile": {"backend": "aot_eager"},
                                                    "profile": {"start_step": 2, "num_steps": 2}}})
    compiled = pool.run(_train, profiled, str(tmp_path / "compiled"), timeout=900)
    worst = max(abs(compiled[0]["losses"][s] - v) / abs(v) for s, v in eager["losses"].items())
    print(f"\ntrainer.compile: worst loss rel diff vs eager over 3 steps {worst:.2e}")
    assert worst < 1e-5
    traces = [Path(p) for r in compiled for p in r["traces"]]
    assert sorted(p.name for p in traces) == ["rank0-steps2-3.json", "rank1-steps2-3.json"]
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("aten::mm" in str(e.get("name")) or "aten::addmm" in str(e.get("name")) for e in events)
    from nxd_models_llama.spec import SPEC
    from nxd_training import metrics
    from nxd_training.config import load_config, model_config_of

    run = load_config(profiled).run
    fpt = metrics.flops_per_token(SPEC, model_config_of(run, SPEC), run.derived.seq_length)
    for record in read_metrics(tmp_path / "compiled"):
        # mfu = tokens/s * flops per token (attention included) / (1 TFLOP/s * 2 ranks)
        assert record["mfu"] == pytest.approx(record["tokens_per_s"] * fpt / 2e12, rel=1e-9)
