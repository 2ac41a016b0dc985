"""One-GPU end-to-end runs (``@pytest.mark.gpu``: skipped without CUDA; ``nox -s gpu`` runs them on
a CUDA machine, CI never needs them): the quickstart-sized model with samples at the end (the
prompt must follow the model onto the GPU), TP=1 bf16 with checkpoint save + resume, ZeRO-1, LoRA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (nox -s gpu on a GPU machine)")]


def _run(config: dict[str, Any], log_dir: Path) -> Any:
    """One training in a fresh process, as ``nxd train`` runs it. The compiled quickstart followed
    by ZeRO-1 or LoRA training in the same interpreter crashed it in 7 of 14 runs on an H100 with
    torch 2.11+cu130 (docs/training.md, "Known issue"); every test alone passed and exited cleanly."""
    import multiprocessing

    from nxd_training.config import load_config
    from nxd_training.loop import train

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(train, (load_config(config),), {"log_dir": str(log_dir)})


def _gpu(make_config, **sections: Any) -> dict[str, Any]:
    base = {"trainer": {"devices": 1, "accelerator": "cuda", "max_steps": 8},
            "distributed_strategy": {"tensor_model_parallel_size": 1}}
    config = make_config(**base)
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def test_quickstart_shape_with_samples(make_config, tmp_path: Path) -> None:
    config = _gpu(make_config, generation={"prompts": ["The "], "max_new_tokens": 8},
                  trainer={"devices": 1, "accelerator": "cuda", "max_steps": 8, "compile": True})
    result = _run(config, tmp_path)
    assert len(result.samples) == 1 and result.losses[8] < result.losses[1]


def test_bf16_save_and_resume(make_config, tmp_path: Path) -> None:
    ckpt = {"resume_if_exists": True, "checkpoint_callback_params": {"every_n_train_steps": 4}}
    full = _run(_gpu(make_config, precision={"type": "bf16SR"}, exp_manager=ckpt), tmp_path / "full")
    first = _gpu(make_config, precision={"type": "bf16SR"}, exp_manager=ckpt,
                 trainer={"devices": 1, "accelerator": "cuda", "max_steps": 4})
    _run(first, tmp_path / "split")
    second = _run(_gpu(make_config, precision={"type": "bf16SR"}, exp_manager=ckpt), tmp_path / "split")
    assert second.start_step == 4
    assert all(abs(second.losses[s] - full.losses[s]) <= 1e-2 * abs(full.losses[s]) for s in range(5, 9))


def test_zero1_mixed_precision(make_config, tmp_path: Path) -> None:
    config = _gpu(make_config, precision={"type": "mixed_precision"}, distributed_strategy={"zero1": True})
    result = _run(config, tmp_path)
    assert result.losses[8] < result.losses[1]


def test_lora(make_config, tmp_path: Path) -> None:
    peft = {"peft": {"lora_rank": 4, "lora_alpha": 8, "target_modules": ["qkv_proj"]}}
    result = _run(_gpu(make_config, model_alignment_strategy=peft), tmp_path)
    trainable, total = result.trainable_params
    assert 0 < trainable < total and result.losses[8] < result.losses[1]
