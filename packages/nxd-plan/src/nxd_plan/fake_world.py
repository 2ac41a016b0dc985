"""One rank of a world that does not exist: torch's fake process-group backend (every collective
returns at once) and the meta device (shapes without storage), so the real parallel code builds
any rank's shard of any model on this machine."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import nxd


class MetaBackend:
    """The registered backend of a ``fake`` process group: tensors on the meta device."""

    name = "meta"
    process_group_backend = "fake"

    def is_available(self) -> bool:
        return True

    def device(self) -> torch.device:
        return torch.device("meta")

    def synchronize(self) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int) -> Iterator[None]:
    """This process plays ``rank`` of ``world_size`` until the block ends (then the world is gone)."""
    if dist.is_initialized():
        raise RuntimeError("nxd plan: a process group is already running in this process; the dry run needs its own")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with torch.device("meta"):
            yield
    finally:
        with contextlib.suppress(Exception):
            nxd.parallel.destroy_parallel_context()
        dist.destroy_process_group()


def build_rank_model(config: Any, run: Any) -> tuple[torch.nn.Module, nxd.ParallelContext, dict]:
    """Inside :func:`fake_rank`: this rank's model exactly as ``nxd train`` builds it (the same
    nxd config, model config and ``initialize_parallel_model`` transforms: TP/SP layers, activation
    checkpointing, the pipeline cut, the data-parallel strategy), with every tensor on the meta
    device. FSDP2's ``fully_shard`` needs a mesh of a real device type: the transforms that need one
    (:func:`_mesh_transforms`) run after the build on the same meta parameters with a CPU mesh over
    the fake group, so the shards are FSDP's own DTensors."""
    from nxd_core_parallel.context import start_parallel_context
    from nxd_training import build
    from nxd_training.config.resolved import model_config_of, model_spec_of

    nxd_cfg, spec = run, model_spec_of(run)  # as nxd train: the one RunConfig the resolution recorded, then its groups
    context = start_parallel_context(**nxd_cfg.sizes(),
                                     timeout=timedelta(seconds=config.distributed_strategy.collective_timeout))
    model_config = model_config_of(run, spec)
    build_fn = build.model_builder(config, spec, context)
    later = _mesh_transforms(context, nxd_cfg)
    # built first with no data-parallel strategy (a name none registers), then that strategy runs
    build_cfg = (dataclasses.replace(nxd_cfg, data_parallel_strategy=UNSHARDED, fsdp_config=None) if later
                 else nxd_cfg)
    model = nxd.initialize_parallel_model(build_cfg, build_fn, False, model_config, build_cfg)
    cpu_context = dataclasses.replace(context, device=torch.device("cpu"))
    for transform in later:
        model = transform.apply(model, cpu_context, nxd_cfg) or model
    return model, context, nxd_cfg


#: data-parallel strategies that build a DeviceMesh of the context's device type (FSDP2)
MESH_STRATEGIES = ("fsdp",)
UNSHARDED = "nxd-plan: applied after the build"


def _mesh_transforms(context: nxd.ParallelContext, nxd_cfg: Any) -> list[Any]:
    from nxd.transforms import applicable_transforms

    return [t for t in applicable_transforms(context, nxd_cfg) if t.name in MESH_STRATEGIES]
