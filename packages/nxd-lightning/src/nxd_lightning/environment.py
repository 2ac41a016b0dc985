"""A Lightning cluster environment for ranks that are already running in a process group
(started by torchrun, a test's rank pool, or any launcher that called ``init_process_group``)."""

from __future__ import annotations

import os

import torch.distributed as dist
from lightning.fabric.plugins.environments import ClusterEnvironment


class ProcessGroupEnvironment(ClusterEnvironment):
    """Ranks come from the initialised default process group; Lightning launches nothing."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return dist.is_available() and dist.is_initialized()

    def world_size(self) -> int:
        return dist.get_world_size()

    def set_world_size(self, size: int) -> None:
        pass  # fixed by the process group

    def global_rank(self) -> int:
        return dist.get_rank()

    def set_global_rank(self, rank: int) -> None:
        pass  # fixed by the process group

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", dist.get_rank()))

    def node_rank(self) -> int:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        return dist.get_rank() // max(local_world, 1)
