"""Experiment manager: the run directory, metric sinks (JSONL + TensorBoard) and checkpoint policy.

Layout (NeMo/NxDT): ``exp_dir/name/version/`` holding ``config.yaml``, ``metrics.jsonl``,
TensorBoard event files and ``checkpoints/<tag>/``. ``explicit_log_dir`` replaces the whole path.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

from nxd_training.config.schema import CheckpointCallbackParams, ExpManagerConfig, TrainingConfig

DEFAULT_EXP_DIR = "nxd_experiments"
_VERSION = re.compile(r"^version_(\d+)$")


def _versions(base: Path) -> list[int]:
    if not base.is_dir():
        return []
    return sorted(int(m.group(1)) for p in base.iterdir() if p.is_dir() and (m := _VERSION.match(p.name)))


def resolve_log_dir(config: TrainingConfig) -> Path:
    """Where this run writes. With ``resume_if_exists`` and no explicit version, the newest
    existing ``version_N`` is reused so an interrupted run continues in place."""
    em = config.exp_manager
    if em.explicit_log_dir:
        return Path(em.explicit_log_dir)
    base = Path(em.exp_dir or DEFAULT_EXP_DIR) / (em.name or config.name)
    if em.version is not None:
        return base / str(em.version)
    if em.use_datetime_version:
        return base / time.strftime("%Y-%m-%d_%H-%M-%S")
    versions = _versions(base)
    if em.resume_if_exists and versions:
        return base / f"version_{versions[-1]}"
    if config.trainer.num_nodes > 1 and config.launcher.rdzv_id:
        # every node resolves the directory on its own: a counter could differ between them
        return base / f"version_{config.launcher.rdzv_id}"
    return base / f"version_{versions[-1] + 1 if versions else 0}"


def is_url(path: str | Path) -> bool:
    return "://" in str(path)


def checkpoint_dir(em: ExpManagerConfig, log_dir: Path) -> str:
    """Where checkpoints go: ``dirpath`` as given (a URL such as ``s3://bucket/run`` stays a URL;
    ``Path()`` would turn it into the local folder ``s3:/bucket/run``), else ``log_dir/checkpoints``."""
    dirpath = em.checkpoint_callback_params.dirpath
    return str(dirpath) if dirpath else str(log_dir / "checkpoints")


def split_checkpoint_path(path: str) -> tuple[str, str]:
    """``(checkpoint dir, tag)`` of a path or URL to one checkpoint (``resume_from_checkpoint``).
    A local folder of checkpoints (a run's ``checkpoints/``, the output of ``nxd ckpt convert --to
    nxd``) rather than one checkpoint means its newest complete checkpoint."""
    local = Path(path) if "://" not in str(path) else None
    if local is not None and local.is_dir() and not (local / "done").exists():
        from nxd_ckpt.layout import newest_complete_tag
        from nxd_ckpt.storage import open_storage

        tag = newest_complete_tag(open_storage(str(local)))
        if tag is not None:
            return str(local), tag
    parent, _, tag = str(path).rstrip("/").rpartition("/")
    return parent, tag


def checkpoint_tag(params: CheckpointCallbackParams, name: str, step: int, consumed_samples: int, epoch: int) -> str:
    """The tag of a checkpoint: ``prefix`` + ``filename`` formatted with the run ``name`` and progress."""
    tag = params.filename.format(name=name, step=step, consumed_samples=consumed_samples, epoch=epoch)
    return (params.prefix or "") + tag


def should_save(em: ExpManagerConfig, step: int, last_save_time: float, now: float) -> bool:
    params = em.checkpoint_callback_params
    if not em.create_checkpoint_callback:
        return False
    if params.every_n_train_steps and step % params.every_n_train_steps == 0:
        return True
    return bool(params.train_time_interval and now - last_save_time >= params.train_time_interval)


def kept_checkpoints(params: CheckpointCallbackParams) -> int | None:
    """``save_top_k`` (monitor=step, mode=max: the newest K) -> nxd-ckpt's ``num_kept_ckpts``."""
    k = params.save_top_k
    return None if k < 0 else max(k, 1)


class MetricsLogger:
    """Rank 0's metric sinks: one JSON object per line in ``metrics.jsonl`` and TensorBoard scalars.

    Opened by :meth:`start` once the run knows the step it continues from."""

    def __init__(self, em: ExpManagerConfig, log_dir: Path, enabled: bool) -> None:
        self.enabled = enabled
        self.em = em
        self.log_dir = log_dir
        self.path = log_dir / em.metrics_file
        self._writer: Any = None
        self._file: Any = None

    def start(self, resumed_step: int) -> None:
        """Open the sinks for steps after ``resumed_step`` (0: a fresh start). Records of later steps,
        which an earlier run logged after its last checkpoint, are dropped from ``metrics.jsonl`` and
        purged from TensorBoard (``purge_step``), so after a resume no step appears twice."""
        if not self.enabled:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        truncate_records_after(self.path, resumed_step)
        self._file = self.path.open("a", buffering=1)
        em = self.em
        if em.create_tensorboard_logger:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir),
                                         **{**em.summary_writer_kwargs, "purge_step": resumed_step + 1})

    def log(self, step: int, metrics: dict[str, float | int], prefix: str = "train") -> None:
        if self._file is None:  # not rank 0, or closed (a late report after a failed run)
            return
        record = {"step": step, "split": prefix, "time": time.time(), **metrics}
        self._file.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
        if self._file is not None:
            self._file.close()
            self._file = None


def truncate_records_after(path: Path, step: int) -> int:
    """Drop the records of steps after ``step`` from a metrics file; returns how many were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:  # a line torn by a killed run: no record
            dropped += 1
            continue
        later = isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step
        if later:
            dropped += 1
        else:
            kept.append(line if line.endswith("\n") else line + "\n")
    if dropped:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)
    return dropped


def read_metrics(run_dir: str | Path, split: str = "train", filename: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """The records of one run (the last record of a step wins: a save's ``checkpoint`` record is logged
    again with its snapshot wait)."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / filename
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("split") == split:
                by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]
