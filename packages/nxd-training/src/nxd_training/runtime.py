"""Per-rank runtime setup from the trainer section: backend selection, time limit, process group, seeding."""

from __future__ import annotations

import os
import random
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import nxd
from nxd import ConfigError
from nxd.parallel import DEFAULT_TIMEOUT
from nxd_training.config.schema import TrainerConfig


def select_backend(trainer: TrainerConfig) -> str:
    """``trainer.accelerator`` -> the nxd backend name. The process group starts with that
    backend's ``process_group_backend``, and the parallel context picks the backend from it."""
    choice = trainer.accelerator
    if choice == "xla":
        try:
            import torch_xla  # noqa: F401
        except ImportError:
            raise ConfigError("trainer.accelerator=xla needs torch-xla (pip install torch-xla matching your torch); "
                              "use trainer.accelerator=cpu or auto") from None
    if choice == "auto":  # cuda by name; any other torch.accelerator device (XPU, MPS, out-of-tree) generically
        choice = "cuda" if torch.cuda.is_available() else "accelerator" if torch.accelerator.is_available() else "cpu"
    if choice == "accelerator" and not torch.accelerator.is_available():
        raise ConfigError("trainer.accelerator=accelerator but torch.accelerator finds no device; use "
                          "trainer.accelerator=cpu or auto")
    if choice == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"trainer.accelerator=cuda but no CUDA device is visible (torch {torch.__version__} is "
                          f"{build}); use trainer.accelerator=cpu or auto")
    return choice


def parse_max_time(value: str | float | None) -> float | None:
    """Seconds from ``trainer.max_time``: a number, or NeMo's ``DD:HH:MM:SS``."""
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    parts = value.split(":")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"trainer.max_time must be seconds or DD:HH:MM:SS, got {value!r}")
    d, h, m, s = (int(p) for p in parts)
    return float(((d * 24 + h) * 60 + m) * 60 + s)


def ensure_process_group(world_size: int, backend: str, timeout: timedelta = DEFAULT_TIMEOUT) -> bool:
    """Initialise the default process group unless the caller did; returns True when we did.
    torchrun provides RANK/WORLD_SIZE/MASTER_*; a one-rank run needs no rendezvous at all.

    ``timeout`` bounds every collective on the default group (a group the caller made keeps its own).
    Joining the rendezvous is not a collective: it keeps the 30-minute default, since nodes of a
    cluster job may start minutes apart."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise ConfigError(
                f"the process group has {dist.get_world_size()} ranks but the config asks for {world_size} "
                "(trainer.devices x trainer.num_nodes)"
            )
        return False
    pg_backend = nxd.get_backend(backend).process_group_backend
    if world_size == 1 and "RANK" not in os.environ:
        dist.init_process_group(pg_backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return True
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world != world_size:
        raise ConfigError(f"launched with WORLD_SIZE={env_world} but the config asks for {world_size} ranks")
    # torchrun's agent store outlives a restart: keys of the previous attempt (gloo's peer addresses)
    # would be read by the next one and point at dead ranks. A per-attempt prefix keeps them apart.
    store, rank, world = next(dist.rendezvous("env://", timeout=DEFAULT_TIMEOUT))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(pg_backend, store=dist.PrefixStore(f"nxd/attempt_{attempt}", store), rank=rank,
                            world_size=world, timeout=timeout)
    return True


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
