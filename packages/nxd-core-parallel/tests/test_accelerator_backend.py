"""The generic accelerator backend: device type from torch.accelerator, process-group backend from
torch.distributed's default for that device type; a named backend (cuda) wins over the generic one."""

from __future__ import annotations

import torch
import torch.distributed as dist

import nxd
from nxd_core_parallel.backends import AcceleratorBackend


def test_each_device_type_uses_torch_distributed_default_backend():
    for device_type, pg in dist.Backend.default_device_backend_map.items():
        if device_type != "cpu":
            assert AcceleratorBackend(device_type).process_group_backend == pg
    assert nxd.get_backend("cuda").process_group_backend == "nccl"


def test_generic_backend_follows_the_current_accelerator():
    generic = nxd.get_backend("accelerator")
    current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    assert generic.is_available() == (current is not None)
    assert generic.device_type == (current.type if current is not None else None)
    if current is None:  # CPU-only: nothing to drive, and never picked for gloo
        assert generic.process_group_backend is None
    assert nxd.parallel.backend_for_process_group("gloo").name == "cpu"
    assert nxd.parallel.backend_for_process_group("nccl").name == "cuda"
    assert nxd.parallel.backend_for_process_group("xccl").name in ("accelerator", "cpu")
