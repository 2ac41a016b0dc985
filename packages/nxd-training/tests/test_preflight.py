"""Problems `nxd train` finds before it starts a rank (each used to surface inside the ranks, late,
or as a traceback): every one is exit code 2 with a message naming the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from nxd.cli import main


def _validate(tmp_path: Path, config: dict, *overrides: str) -> tuple[int, str]:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["train", str(path), "--validate", *overrides]), ""


CASES = {
    "log dir is a file": ([], "is a file, not a directory"),
    "cuda without a GPU": (["trainer.accelerator=cuda"], "trainer.accelerator=cuda but no CUDA device is visible"),
    "bad max_time": (["trainer.max_time=soon"], "trainer.max_time must be seconds or DD:HH:MM:SS"),
    "missing resume_from_checkpoint": (["exp_manager.resume_from_checkpoint=/nonexistent/ckpt/step3"],
                                       "exp_manager.resume_from_checkpoint: /nonexistent/ckpt/step3 does not exist"),
    "unknown checkpoint format": (["exp_manager.checkpoint_format=pickle"], "exp_manager.checkpoint_format=pickle needs"),
    "absurd size": (["model.num_layers=4000", "model.hidden_size=65536", "model.ffn_hidden_size=65536"],
                    "parameters need ~"),
    # Liger-Kernel missing (CI) or present on a CPU run: refused either way, naming the key
    "fused kernels on cpu": (["model.fused_kernels=[rms_norm,cross_entropy]"], "fused_kernels"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_launch(case, make_config, tmp_path: Path, capsys) -> None:
    if case == "cuda without a GPU" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    overrides, message = CASES[case]
    exp_dir = tmp_path / "runs"
    if case == "log dir is a file":
        exp_dir.write_text("not a directory")
    config = make_config(exp_manager={"exp_dir": str(exp_dir)})
    code, _ = _validate(tmp_path, config, *overrides)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_generation_tokenizer_checked_before_training(make_config, tmp_path: Path, capsys) -> None:
    config = make_config(generation={"prompts": ["Once"]})
    config["data"]["tokenizer"] = str(tmp_path / "no_tokenizer")
    code, _ = _validate(tmp_path, config)
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_plugins_validate_hooks_run_under_validate(make_config, tmp_path: Path, capsys) -> None:
    import nxd
    from nxd.errors import ConfigError

    class Picky:
        @nxd.hookimpl
        def nxd_validate_config(self, nxd_config):
            if nxd_config.tensor_parallel_size == 2:
                raise ConfigError("acme: tensor_parallel_size=2 is not supported by the acme plugin")

    nxd.register_plugin(Picky(), name="acme-picky", distribution="acme")
    try:
        code, _ = _validate(tmp_path, make_config())
        assert code == 2 and "acme: tensor_parallel_size=2 is not supported" in capsys.readouterr().err
    finally:
        nxd.plugins.state().pm.unregister(name="acme-picky")
