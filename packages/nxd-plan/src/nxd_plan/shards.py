"""What the real parallel code gives one rank: its parameters' names, shapes and dtypes, and its
pipeline stages, read off the model built on the meta device in a fake world (no storage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from nxd_plan.fake_world import fake_rank
from nxd_plan.rank_check import build_rank
from nxd_tensor_parallel.parallel_layers.utils import STORED_BYTES_PER_ELEMENT


@dataclass
class Shard:
    """One rank's model: ``params`` maps each parameter name to (shape, dtype name, trainable)."""

    rank: int
    coords: dict[str, int]
    params: dict[str, tuple[tuple[int, ...], str, bool]]
    #: the pipeline stages this rank runs and each stage's layer indices (empty without PP)
    stages: dict[int, list[int]] = field(default_factory=dict)
    #: the process groups this rank belongs to, per dimension (global ranks)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: the registered model transforms that built this rank, in order (nxd.transforms)
    transforms: list[str] = field(default_factory=list)
    #: parameter name -> (elements of the whole tensor across TP, expert parameter sharded over EP)
    sharding: dict[str, tuple[int, bool]] = field(default_factory=dict)
    #: FSDP (``fully_shard``'s DTensors): this rank's (index, size) on the mesh's shard dimension,
    #: and each parameter's local shape as FSDP built it (``params`` holds the unsharded shapes)
    fsdp: tuple[int, int] | None = None
    local: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: parameters stored in fewer bytes than their dtype's (QLoRA's NF4 base): name -> bytes per element
    quantized: dict[str, float] = field(default_factory=dict)

    def _bytes_per_element(self, name: str) -> float:
        return self.quantized.get(name) or _itemsize(self.params[name][1])

    def stored(self, index: int | None = None) -> dict[str, tuple[int, ...]]:
        """Each parameter's shape as stored on a rank: FSDP's row shard at shard ``index`` (this
        rank's when ``None``) by :func:`fsdp_rows`; the whole shape without FSDP."""
        if self.fsdp is None:
            return {name: shape for name, (shape, _, _) in self.params.items()}
        index = self.fsdp[0] if index is None else index
        return {name: (fsdp_rows(shape[0], self.fsdp[1], index), *shape[1:]) if shape else shape
                for name, (shape, _, _) in self.params.items()}

    def stored_numel(self, index: int | None = None, trainable: bool = False) -> int:
        return sum(_numel(shape) for name, shape in self.stored(index).items()
                   if not trainable or self.params[name][2])

    def stored_bytes(self, index: int | None = None) -> int:
        return int(sum(_numel(shape) * self._bytes_per_element(name) for name, shape in self.stored(index).items()))

    def quantized_numel_bytes(self) -> tuple[int, int]:
        """(elements, bytes) of this rank's quantised parameters, unsharded by DP."""
        numel = sum(_numel(self.params[name][0]) for name in self.quantized)
        return numel, int(sum(_numel(self.params[name][0]) * per for name, per in self.quantized.items()))

    def unsharded_numel(self, first_ep: bool) -> int:
        """This rank's parameters as whole tensors across TP; non-expert ones only on expert rank 0
        (EP ranks replicate them)."""
        return sum(full for full, expert in self.sharding.values() if expert or first_ep)

    @property
    def numel(self) -> int:
        return sum(_numel(shape) for shape, _, _ in self.params.values())

    @property
    def local_numel(self) -> int:
        """Elements this rank's model actually stores (FSDP's local shards as built)."""
        return sum(_numel(shape) for shape in self.local.values())

    @property
    def trainable_numel(self) -> int:
        return sum(_numel(shape) for shape, _, trainable in self.params.values() if trainable)

    @property
    def param_bytes(self) -> int:
        return int(sum(_numel(shape) * self._bytes_per_element(name) for name, (shape, _, _) in self.params.items()))

    def signature(self) -> tuple:
        """What must agree between ranks of one coordinate class."""
        return tuple(sorted(self.params.items()))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype.split(".")[-1]).itemsize


def fsdp_rows(rows: int, shards: int, index: int) -> int:
    """Rows of a ``rows``-row parameter on FSDP2 shard ``index`` of ``shards`` (``fully_shard``'s
    ``Shard(0)``: ``torch.chunk``, so the last shards are shorter or empty when it does not divide)."""
    chunk = -(-rows // shards)
    return max(0, min(chunk, rows - index * chunk))


def _fsdp_coordinates(model: torch.nn.Module) -> tuple[int, int] | None:
    """(index, size) on the shard (last) dimension of the mesh of FSDP's DTensor parameters."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from nxd_core_parallel.dtensor import SHARD_GROUP

    for p in model.parameters():
        if isinstance(p, DTensor):
            # the group nxd-fsdp recorded, not p.device_mesh: DTensor caches meshes by equality, so after
            # an earlier rank's fake world (--validate builds several in one process) the mesh may be an
            # equal one whose groups are gone ("Could not resolve the process group ...": HSDP refused)
            group = getattr(p, SHARD_GROUP, None)
            if group is not None:
                return dist.get_rank(group), dist.get_world_size(group)
            mesh = p.device_mesh
            return mesh.get_local_rank(mesh.ndim - 1), mesh.size(mesh.ndim - 1)
    return None


def pipeline_stages(model: torch.nn.Module) -> dict[int, list[int]]:
    """The pipeline model's local stages -> layer indices (``NxDPPModel.stage_bounds``), else {}."""
    for module in model.modules():
        bounds = getattr(module, "stage_bounds", None)
        local = getattr(module, "local_stages", None)
        if bounds is not None and local is not None:
            return {int(s): list(bounds[s]) for s in local}
    return {}


def whole_numel(p: torch.Tensor, tp: int) -> int:
    """Elements of the whole tensor whose TP shard ``p`` is, from the sharding attributes every
    parallel layer sets (docs/parallel.md): ``partition_dim``, ``kv_size_multiplier`` (GQA K/V
    pieces shared by that many TP ranks) and ``fused_splits`` (on fused QKV the multiplier applies
    to the K and V pieces only)."""
    if not getattr(p, "tensor_model_parallel", False) or tp == 1:
        return p.numel()
    m = int(getattr(p, "kv_size_multiplier", 1) or 1)
    splits = getattr(p, "fused_splits", None)
    dim = int(getattr(p, "partition_dim", 0))
    row = p.numel() // max(1, p.shape[dim])
    if splits and m > 1 and len(splits) == 3:
        q, k, v = splits
        return row * (q * tp + (k + v) * (tp // m))
    return p.numel() * (tp // m)


def shard_of(model: torch.nn.Module, context: Any, rank: int) -> Shard:
    """``params`` holds each parameter's shape before data-parallel sharding (a DTensor's global
    shape: this TP rank's piece), ``local`` what this rank stores of it."""
    params = {name: (tuple(p.shape), str(p.dtype), bool(p.requires_grad)) for name, p in model.named_parameters()}
    groups = {name: tuple(context.dim(name).ranks) for name in ("tp", "dp", "pp", "cp", "ep", "edp", "dp_cp")}
    sharding = {name: (whole_numel(p, context.tp.size), bool(getattr(p, "expert_model_parallel", False)))
                for name, p in model.named_parameters()}
    local = {name: tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)
             for name, p in model.named_parameters()}
    quantized = {name: float(getattr(p, STORED_BYTES_PER_ELEMENT)) for name, p in model.named_parameters()
                 if getattr(p, STORED_BYTES_PER_ELEMENT, None)}
    return Shard(rank, context.coordinates(), params, pipeline_stages(model), groups, sharding=sharding,
                 fsdp=_fsdp_coordinates(model), local=local, quantized=quantized)


def build_shard(config: Any, run: Any, rank: int) -> Shard:
    """Rank ``rank``'s shard as ``nxd train`` would build it (fake world of ``run.derived.world_size``):
    its model, then the rest of its build path (:func:`nxd_plan.rank_check.build_rank`); any
    failure is a :class:`nxd_plan.rank_check.RankBuildError` naming the rank."""
    from nxd.transforms import applicable_transforms

    with fake_rank(rank, run.derived.world_size):
        model, context, nxd_cfg = build_rank(config, run, rank)
        shard = shard_of(model, context, rank)
        shard.transforms = [t.name for t in applicable_transforms(context, nxd_cfg)]
        return shard
