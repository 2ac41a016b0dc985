"""torch_xla.distributed.xla_multiprocessing (nxd-compat stand-in).

torch-xla forks one process per device; under nxd ranks come from torchrun. Without torchrun,
``spawn`` runs ``fn(0, *args)`` as a single rank (world size 1) in this process."""

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int | None = None, join: bool = True,
          daemon: bool = False, start_method: str = "spawn") -> None:
    if nprocs not in (None, 1):
        raise ValueError(f"xmp.spawn(nprocs={nprocs}): start several ranks with torchrun "
                         "(torchrun --nproc-per-node N -m nxd_compat.run script.py ...)")
    if not dist.is_initialized():
        for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        dist.init_process_group("xla")
    fn(0, *args)
