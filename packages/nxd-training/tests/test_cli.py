"""`nxd train` in-process (one device) and its error path; `nxd train --validate`."""

from __future__ import annotations

from pathlib import Path

import yaml

import nxd
from nxd.cli import main
from nxd.run_config import RunConfig
from nxd_training import launcher
from nxd_training.cli import layout
from nxd_training.config import plan as plan_module
from nxd_training.config.nxdt.translate import run_config
from nxd_training.exp_manager import read_metrics

EVENTS: list[str] = []


class _SeenConfigs:
    """A plugin that records every NxD config the ``nxd_validate_config`` hook is shown."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    @nxd.hookimpl
    def nxd_validate_config(self, nxd_config) -> None:
        self.seen.append(nxd_config)
        EVENTS.append("validate")


def test_single_device_run_in_process(make_config, tmp_path: Path, capsys, monkeypatch) -> None:
    config = make_config(trainer={"devices": 1, "max_steps": 3},
                         distributed_strategy={"tensor_model_parallel_size": 1},
                         generation={"prompts": ["The "], "max_new_tokens": 4})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    seen = _SeenConfigs()
    nxd.register_plugin(seen, name="seen-configs")
    translated, ranks = [], []  # every translation into a RunConfig; what the rank trained with

    def translate(*args):
        EVENTS.append("translate")
        return translated.append(run_config(*args)) or translated[-1]

    def rank_reads(path):
        EVENTS.append("rank")
        return ranks.append(read_back(path)) or ranks[-1]
    EVENTS.clear()
    read_back = launcher.load_resolved
    monkeypatch.setattr(plan_module, "run_config", translate)
    monkeypatch.setattr(launcher, "load_resolved", rank_reads)
    try:
        assert main(["train", str(path), "exp_manager.name=cli"]) == 0
    finally:
        nxd.plugins.state().pm.unregister(name="seen-configs")
    out = capsys.readouterr().out
    assert "world size 1 = TP 1 x PP 1 x DP 1" in out and "--- samples ---" in out
    # one chain: the YAML is translated into a RunConfig once, the plugins validate it once, before
    # launch; the rank reads it back from the written config.yaml (never translating nor validating
    # again) and trains with an equal one
    # (nxd-plan, when installed, also translates the smaller replica it measures, before launch)
    assert isinstance(translated[0], RunConfig) and seen.seen[0] == translated[0]
    assert EVENTS[0] == "translate" and EVENTS[-1] == "rank" and EVENTS.count("rank") == 1, EVENTS
    assert len(ranks) == 1 and ranks[0].run == translated[0] and ranks[0].run is not translated[0]
    assert translated[0].optimizer.max_grad_norm == 1.0  # trainer.gradient_clip_val, one name downstream
    assert f"= {layout(translated[0], 1)}," in out
    run = Path(config["exp_manager"]["exp_dir"]) / "cli" / "version_0"
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert yaml.safe_load((run / "config.yaml").read_text())["exp_manager"]["name"] == "cli"
    # a second run without resume gets the next version
    assert main(["train", str(path), "exp_manager.name=cli", "trainer.max_steps=1", "--validate"]) == 0
    # --validate prints the recipe this config runs: each slot's transforms, those skipped with why
    recipe = capsys.readouterr().out.split("nxd train: recipe", 1)[1].splitlines()[1:]
    steps = {line.split()[2]: line.split(None, 4) for line in recipe if line.startswith("    ")}
    assert steps["parallel_plan"][:2] == ["runs", "parallel_plan"] and steps["ddp"][0] == "runs"
    assert steps["pipeline"][0] == "--" and steps["pipeline"][4].endswith("skipped: needs pipeline_parallel_size > 1")


def test_bad_config_exits_2_with_message(make_config, tmp_path: Path, capsys) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config()))
    assert main(["train", str(path), "trainer.max_stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "trainer.max_stepz: unknown key (did you mean 'max_steps'?)" in err
    assert "Traceback" not in err


def test_samples_come_from_the_model_spec(make_config) -> None:
    import dataclasses

    import nxd
    from nxd_training.config import load_config
    from nxd_training.samples import generate_samples

    config = load_config(make_config(generation={"prompts": ["The "], "max_new_tokens": 4}))
    # a model family without generate gets no samples (and no model call at all)
    assert generate_samples(config.generation, config.data, config.seed, model=None, spec=dataclasses.replace(nxd.get_model("llama"), generate=None)) == []
    calls = []

    def generate(model, ids, max_new_tokens, **kwargs):
        calls.append((model, ids.shape[0], max_new_tokens))
        return ids
    texts = generate_samples(config.generation, config.data, config.seed, model="m", spec=dataclasses.replace(nxd.get_model("llama"), generate=generate))
    assert texts == ["The "] and calls == [("m", 1, 4)]


def test_multi_node_config_validates_without_a_cluster(make_config, tmp_path, monkeypatch, capsys) -> None:
    """Validation needs no cluster (NxDT's 4-node configs validate on a laptop); launching a
    multi-node run without a rendezvous (config or scheduler environment) is refused before starting."""
    for var in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "MASTER_ADDR", "PET_MASTER_ADDR", "PET_NNODES"):
        monkeypatch.delenv(var, raising=False)
    config = make_config(trainer={"num_nodes": 2, "devices": 1}, distributed_strategy={"tensor_model_parallel_size": 1},
                         data={"global_batch_size": 4})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), "--validate"]) == 0
    assert main(["train", str(path)]) == 2
    assert "trainer.num_nodes=2: set launcher.rdzv_endpoint" in capsys.readouterr().err
