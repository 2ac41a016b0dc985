"""Starting a run from Hugging Face weights with one key, ``model.pretrained_checkpoint``, through
``nxd train`` as a user does: checked before launch, "initialised from HF weights", and the
weights round-trip exactly through ``nxd ckpt convert --from nxd --to hf RUN_DIR``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from nxd.cli import main


def _config(make_config, tmp_path: Path) -> Path:
    path = tmp_path / "cfg.yaml"
    # lr so small that AdamW's first step changes no fp32 weight: the checkpoint holds the HF weights
    path.write_text(yaml.safe_dump(make_config(
        trainer={"devices": 1, "max_steps": 1}, distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(tmp_path / "run")},
        model={"optim": {"lr": 1e-30, "weight_decay": 0.0}})))
    return path


def test_mismatches_are_refused_before_launch(hf_llama: Path, make_config, tmp_path: Path, capsys) -> None:
    cfg = str(_config(make_config, tmp_path))
    assert main(["train", cfg, f"model.pretrained_checkpoint={hf_llama}", "model.hidden_size=64", "--validate"]) == 2
    err = capsys.readouterr().err
    assert f"model.pretrained_checkpoint: model.hidden_size=64 disagrees with {hf_llama}/config.json (hidden_size=32)" \
        in err and "Traceback" not in err
    assert main(["train", cfg, f"exp_manager.resume_from_checkpoint={hf_llama}", "--validate"]) == 2
    err = capsys.readouterr().err
    assert f"is a Hugging Face model folder, not an nxd checkpoint; to start a run from its weights use " \
           f"model.pretrained_checkpoint={hf_llama}" in err
    assert main(["train", cfg, f"model.pretrained_checkpoint={tmp_path}", "--validate"]) == 2
    assert f"model.pretrained_checkpoint: file '{tmp_path}/config.json' does not exist (give a Hugging Face model " \
           "folder" in capsys.readouterr().err


@pytest.mark.launch
def test_run_starts_from_hf_weights_and_goes_back_exactly(hf_llama: Path, make_config, tmp_path: Path, capsys) -> None:
    assert main(["train", str(_config(make_config, tmp_path)), f"model.pretrained_checkpoint={hf_llama}"]) == 0
    out = capsys.readouterr().out
    assert f"nxd train: initialised from HF weights {hf_llama}" in out and "resumed from" not in out
    run = tmp_path / "run"
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run), "--output", str(tmp_path / "back")]) == 0
    original, back = load_file(hf_llama / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(back) == sorted(original)
    assert [k for k in original if not torch.equal(original[k], back[k])] == []


@pytest.mark.launch
def test_mistral_folder_with_a_short_window_trains_and_goes_back(make_config, tmp_path: Path, capsys) -> None:
    """A Mistral folder (model_type mistral) whose sliding window is shorter than the training
    sequence: ``--validate`` and the ranks read it the same way (the ``mistral`` model, window on),
    the run starts from its weights, and the export is a Mistral folder with the same window and tensors."""
    import json

    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(4)
    src = tmp_path / "tiny-mistral"
    MistralForCausalLM(MistralConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     sliding_window=4)).save_pretrained(src)
    cfg = str(_config(make_config, tmp_path))
    source = [f"model.pretrained_checkpoint={src}", "model.architecture=null"]  # chosen by model_type
    assert main(["train", cfg, *source, "--validate"]) == 0
    assert main(["train", cfg, *source]) == 0
    assert f"nxd train: initialised from HF weights {src}" in capsys.readouterr().out
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(tmp_path / "run"), "--output",
                 str(tmp_path / "back")]) == 0
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (back["model_type"], back["sliding_window"]) == ("mistral", 4)
    original, exported = load_file(src / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(exported) == sorted(original)
    assert [k for k in original if not torch.equal(original[k], exported[k])] == []
