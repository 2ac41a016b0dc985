"""``nxd train --validate`` builds one rank of every role with the ranks' own code on the meta device
in a fake world (model and transforms, the Hugging Face load from the files' headers, optimizer and
data-parallel wrapping, scheduler), so what only a rank's build finds is refused before launch,
naming the YAML key, instead of "config is valid" followed by a failure on every rank."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from nxd.cli import main
from nxd_plan.accuracy import measurable_config


def _write(config: dict) -> str:
    config["trainer"].pop("profile", None)
    path = Path(tempfile.mkdtemp()) / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _refused(capsys, path: str, *overrides: str) -> str:
    assert main(["train", path, *overrides, "--validate"]) == 2
    captured = capsys.readouterr()
    assert "config is valid" not in captured.out and "Traceback" not in captured.err
    return captured.err


def _hf_folder(config_path: str, out: Path, shrink: str | None = None) -> Path:
    """A Hugging Face folder of the config's model (config.json + zero weights); ``shrink``: that
    tensor one column short (config.json still agrees: only the tensor header shows it)."""
    from nxd_models_llama.hf_mapping import hf_shapes
    from nxd_plan.planner import load
    from nxd_training.config.resolved import model_config_of, model_spec_of

    _, run = load(config_path)
    model_config = model_config_of(run, model_spec_of(run))
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(model_config.to_hf_dict()))
    shapes = {k: (*v[:-1], v[-1] - (k == shrink)) for k, v in hf_shapes(model_config).items()}
    save_file({k: torch.zeros(v) for k, v in shapes.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_validate_refuses_what_only_a_rank_build_finds(corpus, tmp_path: Path, capsys) -> None:
    # TP=3: the heads divide, the fused gate/up (2 x 512) does not: found by the parallel plan on a rank
    tp3 = _write(measurable_config(corpus, str(tmp_path), world=3, distributed_strategy={"tensor_model_parallel_size": 3},
                                   data={"global_batch_size": 2},
                                   model={"vocab_size": 768, "hidden_size": 192, "num_attention_heads": 6,
                                          "num_kv_heads": 3, "ffn_hidden_size": 512}))
    err = _refused(capsys, tp3)
    assert "the ranks' own build refuses this config before launch: rank 0 (tp 0" in err, err
    assert "fails in its model build" in err and "gate_up_proj" in err and "not divisible" in err
    assert "[distributed_strategy.tensor_model_parallel_size=3]" in err

    # EP=3 over 4 experts: the config layer passes it, the expert-parallel transform on a rank does not
    moe = {"architecture": "mixtral", "ffn_hidden_size": 256, "hidden_size": 64, "num_attention_heads": 4,
           "num_kv_heads": 2, "moe": {"num_experts": 4, "top_k": 2, "dropless": True}}
    ep3 = _write(measurable_config(corpus, str(tmp_path), world=3, model=moe, data={"global_batch_size": 6},
                                   distributed_strategy={"expert_model_parallel_size": 3}))
    err = _refused(capsys, ep3)
    assert "must be divisible by expert_model_parallel_size (3)" in err, err
    assert "distributed_strategy.expert_model_parallel_size=3" in err

    # a Hugging Face folder whose config.json agrees but one tensor does not: found from the header alone
    small = {"hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "num_kv_heads": 2}
    tp2 = _write(measurable_config(corpus, str(tmp_path), distributed_strategy={"tensor_model_parallel_size": 2},
                                   model=small))
    bad = _hf_folder(tp2, tmp_path / "hf-bad", shrink="model.layers.1.mlp.down_proj.weight")
    err = _refused(capsys, tp2, f"model.pretrained_checkpoint={bad}")
    assert f"fails in its load of model.pretrained_checkpoint={bad} (names and shapes from the files' headers)" in err
    assert "model.layers.1.mlp.down_proj.weight has shape [64, 127], expected [64, 128]" in err, err

    # the same folder whole: valid, and quick (CPU seconds of this process: the builds are on the meta device)
    good = _hf_folder(tp2, tmp_path / "hf-good")
    start = time.process_time()
    assert main(["train", tp2, f"model.pretrained_checkpoint={good}", "--validate"]) == 0
    seconds = time.process_time() - start
    out = capsys.readouterr().out
    assert "nxd train: plan: TP 2 x PP 1 x CP 1 x DP 1" in out and "not planned" not in out
    assert out.rstrip().endswith("config is valid")
    assert seconds < 20, f"--validate took {seconds:.1f} CPU seconds"
