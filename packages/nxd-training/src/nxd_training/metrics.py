"""Throughput, MFU and memory figures for the metrics log."""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch

#: rough dense peak per device in TFLOP/s used when exp_manager.peak_tflops_per_device is unset
#: (bf16 tensor-core numbers for GPUs; CPU: an AVX2-FMA fp32 estimate per core in use).
_CPU_TFLOPS_PER_CORE = 0.05
_GPU_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


def peak_tflops(backend: str, configured: float | None) -> float | None:
    if configured is not None:
        return configured
    if backend == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        return next((v for k, v in _GPU_TFLOPS.items() if k in name), None)
    if backend == "cpu":
        return _CPU_TFLOPS_PER_CORE * max(1, torch.get_num_threads())
    return None


def flops_per_token(spec: Any, model_config: Any, seq_length: int | None = None) -> float | None:
    """Training FLOPs per token from the model spec, attention included when the spec takes the
    sequence length (``6 * matmul params + 12 * layers * hidden * seq``); a spec whose
    ``flops_per_token`` takes only the config gives the matmul part."""
    fn = getattr(spec, "flops_per_token", None)
    if fn is None:
        return None
    try:
        try:
            return float(fn(model_config, seq_length=seq_length))
        except TypeError:  # an older spec: flops_per_token(config) only
            return float(fn(model_config))
    except Exception:  # noqa: BLE001 - an estimate must never stop training
        return None


def mfu(tokens_per_s: float, fpt: float | None, peak: float | None, world_size: int) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak of all devices."""
    if not fpt or not peak:
        return None
    return tokens_per_s * fpt / (peak * 1e12 * world_size)


def peak_memory_mb(backend: str) -> float:
    """Peak memory: the CUDA caching allocator's high-water mark on CUDA, else the process's peak RSS."""
    if backend == "cuda" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


#: step metrics shown in the progress bar (all of them go to metrics.jsonl / TensorBoard): a
#: workflow's (DPO/ORPO reward accuracy, margin) and the model's named loss terms
#: (nxd_core_parallel.loss_terms: an MoE model's language-model and load-balancing losses)
PROGRESS_METRICS = {"rewards/accuracies": "acc", "rewards/margins": "margin", "lm_loss": "lm", "aux_loss": "aux"}


def progress_fields(values: dict[str, float]) -> dict[str, str]:
    """Short progress-bar fields for the step metrics named in ``PROGRESS_METRICS``."""
    return {short: f"{values[name]:.4f}" for name, short in PROGRESS_METRICS.items() if name in values}
