"""torch_xla.runtime (nxd-compat stand-in): ranks and sizes from torch.distributed."""

import os

import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def global_ordinal() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def local_ordinal() -> int:
    return int(os.environ.get("LOCAL_RANK", global_ordinal()))


def local_process_count() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size()))


def global_device_count() -> int:
    return world_size()


def addressable_device_count() -> int:
    return 1


def global_runtime_device_count() -> int:
    return world_size()


def device_type() -> str:
    from nxd_compat.xla_emulation import backend_name

    return backend_name().upper()


def use_spmd(*args: object, **kwargs: object) -> None:
    raise NotImplementedError("torch-xla SPMD is not emulated by nxd-compat; nxd runs one process per device")


def is_spmd() -> bool:
    return False
