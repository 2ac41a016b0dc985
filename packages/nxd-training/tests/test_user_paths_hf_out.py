"""Taking a trained run back to Hugging Face, as a user does: ``nxd train`` then
``nxd ckpt convert --from nxd --to hf RUN_DIR`` with no other arguments (llama, gpt, LoRA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from nxd.cli import main

pytestmark = pytest.mark.launch  # every test here trains through a launch

PROMPT = [[1, 5, 9, 23, 77, 4, 301, 2]]


def _train(config: dict, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), f"exp_manager.name={name}"]) == 0
    return Path(config["exp_manager"]["exp_dir"]) / name / "version_0"


def _nxd_logits(run: Path, with_lora: bool = False) -> torch.Tensor:
    """The trained model's logits, rebuilt from the run's newest checkpoint (the oracle)."""
    import nxd
    from nxd_ckpt.consolidate import full_model_state, resolve_tag
    from nxd_ckpt.convert import read_user_content, single_rank
    from nxd_ckpt.run_dir import MODEL_RECORD_KEY

    ckpt = str(run / "checkpoints")
    tag = resolve_tag(ckpt, None)
    record = read_user_content(ckpt, tag)[MODEL_RECORD_KEY]
    spec = nxd.get_model(record["name"])
    with single_rank():
        model = nxd.build_parallel_model(spec, record["config"])
        if with_lora:
            model = nxd.get_component("adapter", "lora")(model, {**record["lora"], "lora_verbose": False})
        model.load_state_dict(full_model_state(ckpt, tag))
        model.eval()
        with torch.no_grad():
            logits = model(torch.tensor(PROMPT)).logits
    return logits[..., : record["config"]["vocab_size"]].float()


def _hf_logits(hf_dir: Path, adapter: Path | None = None) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(PROMPT)).logits.float()


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    # fp32 on both sides, same weights, different kernels: a few ulps of the logits' scale
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4 * float(ours.abs().max()))


def _convert(run: Path, *extra: str) -> int:
    return main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run), *extra])


@pytest.mark.parametrize("architecture", ["llama", "gpt"])
def test_run_dir_converts_to_hf_with_no_arguments(architecture, make_config, tmp_path: Path, capsys) -> None:
    from transformers import AutoTokenizer

    config = make_config(trainer={"devices": 1, "max_steps": 2},
                         distributed_strategy={"tensor_model_parallel_size": 1},
                         exp_manager={"checkpoint_callback_params": {"every_n_train_steps": 2}},
                         model={"architecture": architecture, "num_kv_heads": 4},  # GPT-2 is MHA
                         generation={"prompts": ["The "], "max_new_tokens": 3})
    run = _train(config, tmp_path, architecture)
    assert "--- samples ---" in capsys.readouterr().out  # every family with generate prints samples
    assert main(["ckpt", "list", str(run)]) == 0  # the run directory, not <run>/checkpoints
    tags = capsys.readouterr().out.split()
    assert tags[-1] == "complete"
    assert _convert(run) == 0
    out = run / "hf" / tags[0]
    assert f"-> hf {out}" in capsys.readouterr().out
    _close(_nxd_logits(run), _hf_logits(out))
    tok = AutoTokenizer.from_pretrained(out)  # the run's tokenizer files sit next to the weights
    assert tok("The cat").input_ids


def test_lora_run_to_hf_merged_or_as_peft_adapter(make_config, tmp_path: Path, capsys) -> None:
    peft = {"lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["qkv_proj", "o_proj"]}
    config = make_config(trainer={"devices": 1, "max_steps": 2},
                         distributed_strategy={"tensor_model_parallel_size": 1},
                         exp_manager={"checkpoint_callback_params": {"every_n_train_steps": 2}},
                         model_alignment_strategy={"peft": peft})
    run = _train(config, tmp_path, "lora")
    out = capsys.readouterr().out
    assert out.count("trainable params") == 1, out
    assert _convert(run) == 1
    err = capsys.readouterr().err
    assert "is a LoRA run" in err and "--lora merge" in err and "Traceback" not in err
    ours = _nxd_logits(run, with_lora=True)
    assert _convert(run, "--lora", "merge", "--output", str(tmp_path / "merged")) == 0
    _close(ours, _hf_logits(tmp_path / "merged"))
    assert _convert(run, "--lora", "adapter", "--output", str(tmp_path / "peft")) == 0
    _close(ours, _hf_logits(tmp_path / "peft", adapter=tmp_path / "peft" / "lora_adapter"))


def test_yaml_config_is_refused_with_the_way_that_works(make_config, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("name: x\nmodel: {architecture: llama}\n")
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", "--input", str(run / "checkpoints"),
                 "--output", str(tmp_path / "o"), "--config", str(run / "config.yaml")]) == 1
    err = capsys.readouterr().err
    assert "not a JSON model config" in err and "RUN_DIR" in err and "Traceback" not in err
