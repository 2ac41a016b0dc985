"""Per-rank runtime setup: process group, backend selection and seeding."""

from __future__ import annotations

import os
import random

import numpy as np
import torch
import torch.distributed as dist

import nxd
from nxd import ConfigError
from nxd.parallel import DEFAULT_TIMEOUT
from nxd_training.config.schema import TrainingConfig


def select_backend(config: TrainingConfig) -> str:
    """``trainer.accelerator`` -> the nxd backend name. The process group starts with that
    backend's ``process_group_backend``, and the parallel context picks the backend from it."""
    choice = config.trainer.accelerator
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"trainer.accelerator=cuda but no CUDA device is visible (torch {torch.__version__} is "
                          f"{build}); use trainer.accelerator=cpu or auto")
    return choice


def ensure_process_group(world_size: int, backend: str) -> bool:
    """Initialise the default process group unless the caller did; returns True when we did.
    torchrun provides RANK/WORLD_SIZE/MASTER_*; a one-rank run needs no rendezvous at all."""
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise ConfigError(
                f"the process group has {dist.get_world_size()} ranks but the config asks for {world_size} "
                "(trainer.devices x trainer.num_nodes)"
            )
        return False
    pg_backend = nxd.get_backend(backend).process_group_backend
    if world_size == 1 and "RANK" not in os.environ:
        dist.init_process_group(pg_backend, store=dist.HashStore(), rank=0, world_size=1)
        return True
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world != world_size:
        raise ConfigError(f"launched with WORLD_SIZE={env_world} but the config asks for {world_size} ranks")
    # torchrun's agent store outlives a restart: keys of the previous attempt (gloo's peer addresses)
    # would be read by the next one and point at dead ranks. A per-attempt prefix keeps them apart.
    store, rank, world = next(dist.rendezvous("env://", timeout=DEFAULT_TIMEOUT))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(pg_backend, store=dist.PrefixStore(f"nxd/attempt_{attempt}", store), rank=rank,
                            world_size=world, timeout=DEFAULT_TIMEOUT)
    return True


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
