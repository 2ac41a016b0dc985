"""``nxd eval`` and ``nxd generate`` on the checkpoint a user names, as a user runs them after a LoRA
run started from Hugging Face weights at DP=2: one process gives the run's own validation loss (the
checkpoint's weights: the HF folder of ``model.pretrained_checkpoint`` is not read, on the training
path either), samples and continuations print, and the run's config.yaml with its model source
removed is refused before launch, naming the keys that would size the model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from nxd.cli import main

PEFT = {"lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj", "gate_proj"]}
STEPS = 3


def _train_from_run_config(config_path: str) -> dict[int, float]:
    """What a rank of ``nxd train`` does: train from the run directory's config.yaml."""
    from nxd_training.config.resolved import load_resolved
    from nxd_training.loop import train

    return train(load_resolved(config_path)).valid_losses


@pytest.fixture(scope="module")
def lora_run(rank_pool, hf_llama: Path, tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.launcher import write_run_config

    tmp = tmp_path_factory.mktemp("lora-dp2")
    config = tiny(tmp / "runs", trainer={"max_steps": STEPS, "val_check_interval": STEPS},
                  distributed_strategy={"tensor_model_parallel_size": 1},
                  exp_manager={"explicit_log_dir": str(tmp / "run"),
                               "checkpoint_callback_params": {"every_n_train_steps": STEPS}},
                  model_alignment_strategy={"peft": PEFT}, generation={"prompts": ["The "], "max_new_tokens": 4},
                  model={"pretrained_checkpoint": str(hf_llama), "optim": {"lr": 5e-2}})
    for key in ("vocab_size", "hidden_size", "ffn_hidden_size", "num_layers", "num_attention_heads", "num_kv_heads",
                "max_position_embeddings"):
        del config["model"][key]  # the HF folder's config.json gives the model, as a user's config leaves it
    path = write_run_config(load_config(config), tmp / "run")
    valid = rank_pool(2).run(_train_from_run_config, str(path), timeout=600)
    assert valid[0] == valid[1] and sorted(valid[0]) == [STEPS]
    from nxd_ckpt.consolidate import resolve_tag

    return {"run": tmp / "run", "tag": resolve_tag(str(tmp / "run" / "checkpoints"), None), "valid": valid[0][STEPS],
            "hf": hf_llama, "tmp": tmp}


def _loss(out: str) -> float:
    return float(re.search(r"nxd eval: validation loss (\S+)", out).group(1))


def test_eval_and_generate_use_the_named_checkpoint_in_one_process(lora_run, capsys) -> None:
    run, tag = lora_run["run"], lora_run["tag"]
    assert main(["eval", str(run), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert (f"nxd eval: weights from checkpoint {run}/checkpoints/{tag} (step {STEPS}, written at TP 1 x PP 1 x DP 2, "
            "LoRA adapters included); model 'llama'; one process") in out, out
    assert abs(_loss(out) - lora_run["valid"]) <= 1e-5 * lora_run["valid"], (out, lora_run["valid"])
    samples = out.split("--- samples ---\n")[1].splitlines()
    assert len(samples) == 2 and samples[0].startswith("'The "), out  # generation.prompts, then validation text

    assert main(["generate", str(run / "checkpoints" / tag), "--prompt", "The ", "--prompt", "import",
                 "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    lines = out.split("--- samples ---\n")[1].splitlines()
    assert len(lines) == 2 and lines[0].startswith("'The ") and lines[1].startswith("'import"), out


def test_a_checkpoint_beats_the_pretrained_source_when_training(lora_run, tmp_path: Path) -> None:
    """The old recipe: the run's config.yaml with exp_manager.resume_from_checkpoint + weight_init_only at
    one device. The checkpoint's weights load (model.pretrained_checkpoint is not read), and without it
    the HF weights give another loss, so a silently unused checkpoint would show."""
    from nxd_training.config import load_config
    from nxd_training.loop import Trainer

    run, ckpt = lora_run["run"], f"{lora_run['run']}/checkpoints/{lora_run['tag']}"
    one = ["exp_manager.resume_if_exists=false", "trainer.devices=1", f"exp_manager.explicit_log_dir={tmp_path}"]
    losses = {}
    for name, extra in (("checkpoint", [f"exp_manager.resume_from_checkpoint={ckpt}", "model.weight_init_only=true"]),
                        ("hf", [])):
        trainer = Trainer(load_config(str(run / "config.yaml"), one + extra), tmp_path)
        try:
            trainer.resume()
            losses[name] = trainer.validate()
            if name == "checkpoint":
                assert trainer.initialised_from is None
                assert trainer.weights_from == (f"{ckpt} (model.weight_init_only: the optimizer, schedule and data "
                                                f"position start fresh; model.pretrained_checkpoint {lora_run['hf']} "
                                                "not read)")
            else:
                assert trainer.initialised_from == str(lora_run["hf"])
        finally:
            trainer.close()
    assert abs(losses["checkpoint"] - lora_run["valid"]) <= 1e-5 * lora_run["valid"], losses
    assert abs(losses["hf"] - lora_run["valid"]) > 1e-3, losses


def test_run_config_without_a_model_source_is_refused(lora_run, capsys) -> None:
    config = str(lora_run["run"] / "config.yaml")
    assert main(["train", config, "model.pretrained_checkpoint=null", "--validate"]) == 2
    err = capsys.readouterr().err
    assert ("nxd train: model: no model source is set, so the 'llama' plugin would build its default size: set "
            "model.pretrained_checkpoint (a Hugging Face folder), model.model_config (a config.json), model.preset (") \
        in err and "model.num_layers, model.hidden_size, model.ffn_hidden_size, model.num_attention_heads" in err, err
    # the same file as written (its source kept) validates, and says a rerun starts over instead of resuming
    assert main(["train", config, "--validate"]) == 0
    out = capsys.readouterr().out
    assert (f"nxd train: not resuming: exp_manager.resume_if_exists is false, so this run starts at step 0 although "
            f"{lora_run['tag']} (step {STEPS}) is complete here; to continue from it instead: nxd train {config} "
            "exp_manager.resume_if_exists=true") in out, out
