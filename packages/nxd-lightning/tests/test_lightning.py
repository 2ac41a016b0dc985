"""The Lightning path: NxD's developer-guide example (manual optimisation) and automatic
optimisation, TP=2 on 2 gloo ranks, against the YAML trainer on the same config (same weights,
data, optimizer, schedule, clipping); and ModelCheckpoint + ``ckpt_path`` resume. The example at
DP=2 (TP=1) with ZeRO-1 against itself without ZeRO-1, and its resume from per-DP-rank shards."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from nxd_testing.reference import max_rel

STEPS = 4


def yaml_config(corpus: dict[str, str], exp_dir: Path) -> dict[str, Any]:
    return {
        "name": "lt", "seed": 7,
        "trainer": {"devices": 2, "max_steps": STEPS, "accelerator": "cpu", "enable_progress_bar": False,
                    "val_check_interval": 0, "gradient_clip_val": 1.0},
        "exp_manager": {"exp_dir": str(exp_dir), "create_checkpoint_callback": False,
                        "create_tensorboard_logger": False},
        "distributed_strategy": {"tensor_model_parallel_size": 2},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 4, "seq_length": 32, "splits_string": "950,50,0"},
        "model": {"architecture": "llama", "vocab_size": 512, "hidden_size": 32, "ffn_hidden_size": 64,
                  "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64,
                  "optim": {"name": "adamw", "lr": 1e-2, "weight_decay": 0.01,
                            "sched": {"name": "LinearAnnealingWithWarmUp", "warmup_steps": 2, "max_steps": 8}}},
        "precision": {"type": "fp32"},
    }


def example_flags(config: dict[str, Any], model_dict: dict[str, Any], tmp: Path, **extra: Any) -> dict[str, Any]:
    """The example script's flags for the same run as ``config``."""
    data, optim = config["data"], config["model"]["optim"]
    flags = dict(
        data_dir=data["data_prefix"], tokenizer=data["tokenizer"], tensor_parallel_size=2, use_zero1_optimizer=False,
        devices=2, batch_size=data["micro_batch_size"], grad_accum_usteps=2, seq_length=data["seq_length"],
        lr=optim["lr"], warmup_steps=optim["sched"]["warmup_steps"], max_steps=optim["sched"]["max_steps"],
        steps_this_run=STEPS, seed=config["seed"], log_dir=str(tmp / "tb"), save_checkpoint=False,
        checkpoint_dir=str(tmp / "ckpt"), checkpoint_freq=2, num_kept_checkpoint=2, resume_ckpt_path=None,
        model_config=model_dict, splits_string=data["splits_string"],
    )
    flags.update(extra)
    return flags


# ----------------------------------------------------------------------------- rank bodies
def _yaml_losses(config: dict[str, Any], log_dir: str) -> dict[int, float]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    return train(load_config(config), log_dir=log_dir).losses


def _recorder() -> Any:
    from lightning.pytorch.callbacks import Callback

    class LossRecorder(Callback):
        """Per optimizer step: the data-parallel mean loss the module reports."""

        def __init__(self) -> None:
            self.losses: dict[int, float] = {}

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if pl_module.should_print:
                self.losses[trainer.global_step] = float(pl_module.loss)

    return LossRecorder()


def _example_losses(flags: dict[str, Any]) -> dict[str, Any]:
    from nxd_lightning.examples import llama_tp_pretrain as example

    recorder = _recorder()
    splits = flags.pop("splits_string")
    original = example.create_llama_pretraining_dataset

    def dataset(*args: Any, **kwargs: Any) -> Any:
        return original(*args, splits_string=splits, **kwargs)

    example.create_llama_pretraining_dataset = dataset
    try:
        trainer = example.train_llama(argparse.Namespace(**flags), callbacks_extra=[recorder])
    finally:
        example.create_llama_pretraining_dataset = original
    return {"losses": recorder.losses, "global_step": trainer.global_step}


def _automatic_losses(config: dict[str, Any], model_dict: dict[str, Any], tmp: str) -> dict[int, float]:
    import torch
    from lightning.pytorch import Trainer, seed_everything

    import nxd
    from nxd_lightning import (
        NeuronDataLoader,
        NeuronLightningDataModule,
        NeuronLTModule,
        NxDPrecisionPlugin,
        NxDStrategy,
    )
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM
    from nxd_training.schedules import linear, make_scheduler

    data, optim = config["data"], config["model"]["optim"]
    seed_everything(config["seed"])
    nxd_config = nxd.neuronx_distributed_config(tensor_parallel_size=2)

    def loader(data_dir: str, batch_size: int, dp_size: int, dp_rank: int) -> Any:
        section = {k: data[k] for k in ("data_prefix", "tokenizer", "splits_string", "seq_length",
                                        "micro_batch_size", "global_batch_size")}
        module = nxd.get_data_module("indexed")(
            section, seq_length=data["seq_length"], micro_batch_size=batch_size,
            global_batch_size=data["global_batch_size"], dp_rank=dp_rank, dp_size=dp_size, seed=config["seed"])
        return NeuronDataLoader(module, keys=("input_ids", "labels", "loss_mask", "position_ids"))

    def scheduler(opt: Any) -> Any:
        return make_scheduler(opt, linear(optim["lr"], optim["sched"]["max_steps"],
                                          warmup_steps=optim["sched"]["warmup_steps"]), optim["lr"])

    module = NeuronLTModule(nxd_config=nxd_config, opt_cls=torch.optim.AdamW, scheduler_cls=scheduler,
                            model_fn=LlamaForCausalLM, model_args=(LlamaConfig.from_dict(model_dict),),
                            opt_kwargs={"lr": optim["lr"]}, grad_accum_steps=2, manual_opt=False)
    recorder = _recorder()
    trainer = Trainer(strategy=NxDStrategy(nxd_config=nxd_config), plugins=[NxDPrecisionPlugin()],
                      max_steps=STEPS, accelerator="cpu", devices=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder])
    trainer.fit(module, datamodule=NeuronLightningDataModule(loader, data["data_prefix"], data["micro_batch_size"]))
    return recorder.losses


# ----------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def parity_setup(corpus: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from nxd_training.config import load_config

    tmp = tmp_path_factory.mktemp("lightning")
    config = yaml_config(corpus, tmp / "runs")
    model_dict = dict(load_config(config).run.derived.model)
    return {"config": config, "model_dict": model_dict, "tmp": tmp}


@pytest.fixture(scope="module")
def yaml_losses(rank_pool, parity_setup: dict[str, Any]) -> dict[int, float]:
    losses = rank_pool(2).run(_yaml_losses, parity_setup["config"], str(parity_setup["tmp"] / "yaml"))
    assert losses[0] == losses[1]
    return losses[0]


@pytest.mark.slow
def test_guide_example_matches_yaml_trainer(rank_pool, parity_setup, yaml_losses, tmp_path: Path) -> None:
    flags = example_flags(parity_setup["config"], parity_setup["model_dict"], tmp_path)
    results = rank_pool(2).run(_example_losses, flags)
    assert results[0]["global_step"] == STEPS
    assert results[0]["losses"] == results[1]["losses"]  # TP ranks agree
    rel = max_rel(results[0]["losses"], yaml_losses)
    print(f"manual-optimisation example vs YAML trainer: max relative loss difference {rel:.3e}")
    assert rel <= 1e-5, (results[0]["losses"], yaml_losses)
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*")), "no TensorBoard event file"


@pytest.mark.slow
def test_automatic_optimisation_matches_yaml_trainer(rank_pool, parity_setup, yaml_losses, tmp_path: Path) -> None:
    results = rank_pool(2).run(_automatic_losses, parity_setup["config"], parity_setup["model_dict"], str(tmp_path))
    rel = max_rel(results[0], yaml_losses)
    print(f"automatic optimisation vs YAML trainer: max relative loss difference {rel:.3e}")
    assert rel <= 1e-5, (results[0], yaml_losses)


@pytest.mark.slow
def test_model_checkpoint_and_ckpt_path_resume(rank_pool, parity_setup, yaml_losses, tmp_path: Path) -> None:
    pool = rank_pool(2)
    first = example_flags(parity_setup["config"], parity_setup["model_dict"], tmp_path, steps_this_run=2,
                          save_checkpoint=True)
    part = pool.run(_example_losses, first)[0]
    ckpt_dir = Path(first["checkpoint_dir"])
    tags = sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir())
    assert tags == ["epoch=0-step=2.ckpt"], tags
    tag_dir = ckpt_dir / tags[0]
    assert (tag_dir / "done").is_file() and list((tag_dir / "model").iterdir()), "not an nxd checkpoint"
    rest = pool.run(_example_losses, example_flags(parity_setup["config"], parity_setup["model_dict"], tmp_path,
                                                   resume_ckpt_path=str(tag_dir)))[0]
    assert sorted(part["losses"]) == [1, 2] and sorted(rest["losses"]) == [3, 4]
    resumed = {**part["losses"], **rest["losses"]}
    diffs = [abs(resumed[s] - yaml_losses[s]) / yaml_losses[s] for s in range(1, STEPS + 1)]
    print(f"resumed run vs uninterrupted: max relative difference {max(diffs):.3e}")
    assert max(diffs) <= 1e-5, (resumed, yaml_losses)


# ----------------------------------------------------------------------------- ZeRO-1 at DP=2
def _dp2_flags(corpus: dict[str, str], tmp: Path, **extra: Any) -> dict[str, Any]:
    from nxd_training.config import load_config

    config = yaml_config(corpus, tmp / "runs")
    model_dict = dict(load_config(config).run.derived.model)
    return example_flags(config, model_dict, tmp, tensor_parallel_size=1, **extra)


@pytest.mark.slow
def test_zero1_matches_plain_and_resumes_identically(rank_pool, corpus, tmp_path: Path) -> None:
    pool = rank_pool(2)
    plain = pool.run(_example_losses, _dp2_flags(corpus, tmp_path / "plain", use_zero1_optimizer=False))
    zero1 = pool.run(_example_losses, _dp2_flags(corpus, tmp_path / "zero1", use_zero1_optimizer=True))
    for results in (plain, zero1):
        assert results[0]["global_step"] == STEPS
        assert results[0]["losses"] == results[1]["losses"]  # every rank reports the DP mean
    rel = max_rel(zero1[0]["losses"], plain[0]["losses"])
    print(f"ZeRO-1 vs plain optimizer at DP=2: max relative loss difference {rel:.3e}")
    assert rel <= 1e-5, (zero1[0]["losses"], plain[0]["losses"])

    tmp = tmp_path / "resume"
    first = _dp2_flags(corpus, tmp, use_zero1_optimizer=True, steps_this_run=2, save_checkpoint=True)
    part = pool.run(_example_losses, first)[0]
    ckpt_dir = Path(first["checkpoint_dir"])
    tags = sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir())
    assert tags == ["epoch=0-step=2.ckpt"], tags
    tag_dir = ckpt_dir / tags[0]
    assert (tag_dir / "done").is_file()
    optim_files = sorted(p.relative_to(tag_dir).as_posix() for p in (tag_dir / "optim").rglob("*") if p.is_file())
    print(f"ZeRO-1 optimizer files: {optim_files}")
    assert any("dp_rank_00" in f for f in optim_files) and any("dp_rank_01" in f for f in optim_files), optim_files
    rest = pool.run(_example_losses, _dp2_flags(corpus, tmp, use_zero1_optimizer=True, resume_ckpt_path=str(tag_dir)))
    assert rest[0]["losses"] == rest[1]["losses"]
    assert sorted(part["losses"]) == [1, 2] and sorted(rest[0]["losses"]) == [3, 4]
    resumed = {**part["losses"], **rest[0]["losses"]}
    rel_resume = max_rel(resumed, zero1[0]["losses"])
    print(f"ZeRO-1 resumed vs uninterrupted: max relative loss difference {rel_resume:.3e}")
    assert rel_resume <= 1e-5, (resumed, zero1[0]["losses"])
