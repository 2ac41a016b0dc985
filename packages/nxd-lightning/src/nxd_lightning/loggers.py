"""A progress bar and a TensorBoard logger that report from the rank holding the loss.

With pipeline parallelism only the last stage computes the loss, so NxD logs from the first
rank of the last pipeline stage (TP rank 0, DP rank 0), not from global rank 0. ``log_rank0=True``
logs from global rank 0 instead.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers.logger import Logger


def is_logging_rank(log_rank0: bool = False) -> bool:
    """Whether this rank reports metrics: global rank 0, or the loss-holding rank of the last stage."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    if log_rank0:
        return dist.get_rank() == 0
    from nxd_core_parallel import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return dist.get_rank() == 0
    return (ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
            and ps.get_data_parallel_rank() == 0)


class NeuronTQDMProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar, shown on the rank that holds the loss."""

    def __init__(self, *args: Any, log_rank0: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_rank0 = log_rank0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if is_logging_rank(self.log_rank0):
            self.enable()
        else:
            self.disable()


class NeuronTensorBoardLogger(Logger):
    """TensorBoard event files written by the loss-holding rank (see :func:`is_logging_rank`).

    ``print_step`` (as in NxD's examples): when set to a negative number, metrics are held back;
    when set to a step, metrics are written at that step (the optimizer step, not the micro-batch).
    """

    def __init__(self, save_dir: str, name: str = "lightning_logs", version: int | str | None = None,
                 log_rank0: bool = False, **writer_kwargs: Any) -> None:
        super().__init__()
        self._save_dir = os.fspath(save_dir)
        self._name = name
        self._version = version if version is not None else 0
        self.log_rank0 = log_rank0
        self.print_step: int | None = None
        self._writer_kwargs = writer_kwargs
        self._writer: Any = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int | str:
        return self._version

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self._save_dir, self._name, version)

    @property
    def experiment(self) -> Any:
        if self._writer is None and is_logging_rank(self.log_rank0):
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = SummaryWriter(log_dir=self.log_dir, **self._writer_kwargs)
        return self._writer

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.print_step is not None:
            if self.print_step < 0:
                return
            step = self.print_step
        writer = self.experiment
        if writer is None:
            return
        for key, value in metrics.items():
            if key == "epoch":
                continue
            writer.add_scalar(key, float(value.item() if hasattr(value, "item") else value), step)

    def log_hyperparams(self, params: dict[str, Any] | argparse.Namespace, *args: Any, **kwargs: Any) -> None:
        writer = self.experiment
        if writer is None:
            return
        values = vars(params) if isinstance(params, argparse.Namespace) else dict(params)
        writer.add_text("hparams", "\n".join(f"{k}: {v}" for k, v in sorted(values.items())))

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
