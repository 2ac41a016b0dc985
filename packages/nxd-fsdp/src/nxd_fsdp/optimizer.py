"""``FSDPOptimizer``: clipping across shards and sharded, reshardable optimizer state.

Gradients arrive reduce-scattered (FSDP's backward did the data-parallel mean), so ``step`` only
sums sequence-parallel gradients over TP, clips with the norm of the whole model (each element
counted once: shards summed over the shard group, TP and PP, with nxd-core-parallel's rules for
TP-replicated and KV-replicated parameters), and runs the inner optimizer on the DTensor shards."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from nxd import ParallelContext
from nxd_core_parallel.grads import (
    allreduce_sequence_parallel_gradients,
    counted_in_norm,
    fused_pieces_counted,
    is_expert_parallel,
)
from nxd_core_parallel.wrapped_optimizer import WrappedOptimizer
from nxd_fsdp.mesh import expert_mesh, shard_coordinates, shard_group

#: format marker of a state_dict() shard
STATE_FORMAT = "nxd-fsdp-optimizer/1"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_rows(param: torch.Tensor, mesh: DeviceMesh) -> tuple[int, int]:
    """``(first row, row count)`` of this rank's shard of ``param`` along dim 0 (``torch.chunk``'s
    split, which fully_shard uses)."""
    rows = param.shape[0]
    rank, count = shard_coordinates(mesh)
    per = math.ceil(rows / count) if rows else 0
    start = min(rank * per, rows)
    return start, min(per, rows - start)


def _norm_pieces(param: torch.Tensor, grad: torch.Tensor, mesh: DeviceMesh) -> list[torch.Tensor]:
    """The pieces of this rank's gradient shard that count toward the global norm."""
    if getattr(param, "fused_splits", None) is None:
        return [grad] if counted_in_norm(param) else []
    counted = fused_pieces_counted(param)
    dim = param.partition_dim
    if dim != 0:
        pieces = torch.split(grad, list(param.fused_splits), dim=dim)
        return [piece for piece, c in zip(pieces, counted) if c]
    # pieces along dim 0, the dim FSDP shards: keep the rows of counted pieces inside this shard
    start, rows = _shard_rows(param, mesh)
    out, edge = [], 0
    for size, c in zip(param.fused_splits, counted):
        lo, hi = max(edge, start), min(edge + size, start + rows)
        if c and hi > lo:
            out.append(grad[lo - start:hi - start])
        edge += size
    return out


class FSDPOptimizer(WrappedOptimizer):
    """Wraps ``optimizer`` (built over the sharded parameters). ``grad_norm``: the last pre-clip norm."""

    #: nxd-ckpt writes one optimizer file per DP rank and, at another DP size, calls
    #: load_state_dict_from_shards (the protocol ZeRO-1 introduced)
    nxd_zero1 = True

    def __init__(self, optimizer: torch.optim.Optimizer, nxd_config: dict, context: ParallelContext,
                 mesh: DeviceMesh) -> None:
        super().__init__(optimizer, nxd_config)
        self.context = context
        self.mesh = mesh
        self._plan: list | None = None

    def sync_gradients(self) -> None:
        # FSDP's backward averaged over DP; SP-tagged (TP-replicated) parameters saw only this TP
        # rank's sequence slice: sum over TP.
        if self.nxd_config.sequence_parallel:
            allreduce_sequence_parallel_gradients(self._params(), context=self.context)

    def _mesh_of(self, param: torch.Tensor) -> DeviceMesh:
        # our own mesh objects, never ``param.device_mesh`` (see nxd_core_parallel.dtensor.full_rows)
        return expert_mesh(self.context) if is_expert_parallel(param) else self.mesh

    def _norm_plan(self) -> list[tuple[torch.Tensor, tuple[int, bool], DeviceMesh, bool | None]]:
        """Per parameter, once: its partial's key (mesh, expert-parallel), its mesh, and whether its
        whole gradient counts toward the norm (None: fused pieces, chosen per piece)."""
        if self._plan is None:
            self._plan = []
            for p in self._params():
                mesh = self._mesh_of(p)
                counted = None if getattr(p, "fused_splits", None) is not None else counted_in_norm(p)
                self._plan.append((p, (id(mesh), is_expert_parallel(p)), mesh, counted))
        return self._plan

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale every gradient shard so the whole model's gradient norm is at most ``max_norm``;
        return the norm before clipping (``torch.nn.utils.clip_grad_norm_``'s convention)."""
        plan = self._norm_plan()
        grads = [_local(p.grad) for p, *_ in plan if p.grad is not None]
        device = grads[0].device if grads else self.context.device
        # squared sums per (mesh, expert-parallel): shards add up over their own mesh's shard group,
        # and expert weights (different experts per EP rank) then over the EP group
        # (every parameter makes its key, with a gradient or not: each rank runs the same collectives)
        pieces: dict[tuple[int, bool], tuple[DeviceMesh, list[torch.Tensor]]] = {}
        for p, key, mesh, counted in plan:
            entry = pieces.setdefault(key, (mesh, []))
            if p.grad is None or counted is False:
                continue
            grad = _local(p.grad)
            entry[1].extend([grad] if counted else _norm_pieces(p, grad, mesh))
        total = torch.zeros((), dtype=torch.float32, device=device)
        for (_, expert), (mesh, tensors) in sorted(pieces.items(), key=lambda kv: kv[0][1]):
            norms = torch._foreach_norm(tensors, 2.0, dtype=torch.float32) if tensors else []
            partial = torch.stack(norms).pow(2).sum() if norms else torch.zeros((), dtype=torch.float32, device=device)
            if shard_coordinates(mesh)[1] > 1:
                dist.all_reduce(partial, group=shard_group(mesh))
            if expert and self.context.ep.size > 1:
                dist.all_reduce(partial, group=self.context.ep.group)
            total += partial
        for group, size in ((self.context.tp.group, self.context.tp.size), (self.context.pp.group, self.context.pp.size)):
            if size > 1:
                dist.all_reduce(total, group=group)
        total = total.sqrt()
        coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
        by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for g in grads:
            by_kind.setdefault((g.device, g.dtype), []).append(g)
        for (dev, dtype), group_grads in by_kind.items():
            torch._foreach_mul_(group_grads, coef.to(dev, dtype))
        return total

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """This rank's shard: the inner optimizer's state with each DTensor as its local piece,
        plus where the piece sits (shard rank and count along dim 0) and each parameter's shape."""
        inner = self.optimizer.state_dict()
        rank, count = shard_coordinates(self.mesh)
        state, sharded = {}, {}
        for index, entries in inner["state"].items():
            state[index] = {k: _local(v) for k, v in entries.items()}
            sharded[index] = sorted(k for k, v in entries.items() if isinstance(v, DTensor))
        return {"format": STATE_FORMAT, "dp_rank": self.context.dp.rank, "dp_size": self.context.dp.size,
                "shard_rank": rank, "shard_count": count, "shapes": [list(p.shape) for p in self._params()],
                "sharded_keys": sharded, "state": state, "param_groups": inner["param_groups"]}

    def _check(self, shard: Any) -> None:
        if not isinstance(shard, dict) or shard.get("format") != STATE_FORMAT:
            raise ValueError("not an nxd-fsdp optimizer shard (saved by another optimizer, e.g. ZeRO-1 or the "
                             "default one?); load the weights only (optimizer=None) to switch strategies")
        shapes = [list(p.shape) for p in self._params()]
        if shard["shapes"] != shapes:
            raise ValueError("the optimizer shard was saved for parameters of other shapes "
                             "(another model, or another tensor-parallel degree)")

    def _load(self, state: dict, sharded: dict, param_groups: list) -> None:
        params = self._params()
        out: dict = {}
        for index, entries in state.items():
            p = params[int(index)]
            out[index] = {k: (DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
                              if k in sharded.get(index, ()) else v) for k, v in entries.items()}
        self.optimizer.load_state_dict({"state": out, "param_groups": param_groups})

    def load_state_dict(self, state_dict: dict) -> None:
        """Load this rank's own shard (same DP layout)."""
        self._check(state_dict)
        rank, count = shard_coordinates(self.mesh)
        if (state_dict["shard_rank"], state_dict["shard_count"]) != (rank, count):
            raise ValueError(f"optimizer shard {state_dict['shard_rank']} of {state_dict['shard_count']} cannot load "
                             f"as shard {rank} of {count}; use load_state_dict_from_shards with every shard")
        self._load(state_dict["state"], state_dict["sharded_keys"], state_dict["param_groups"])

    def load_state_dict_from_shards(self, shards: list[dict]) -> None:
        """Every DP rank's shard of one save, at any DP size or HSDP layout: each sharded state
        tensor is reassembled along dim 0 and cut again for this rank (nothing is sent)."""
        for shard in shards:
            self._check(shard)
        if any(is_expert_parallel(p) for p in self._params()):
            raise ValueError("FSDP optimizer state with expert parallelism loads only at the data- and expert-parallel "
                             "sizes it was saved at (its expert shards are cut over the expert-data-parallel ranks); "
                             "load the weights only (optimizer=None) to change them")
        by_rank = {s["shard_rank"]: s for s in shards}
        count = shards[0]["shard_count"]
        if sorted(by_rank) != list(range(count)):
            raise ValueError(f"optimizer shards {sorted(by_rank)} of {count}: some are missing")
        ordered = [by_rank[r] for r in range(count)]
        params = self._params()
        state: dict = {}
        for index, entries in ordered[0]["state"].items():
            p = params[int(index)]
            keys = set(ordered[0]["sharded_keys"].get(index, ()))
            state[index] = {}
            for k, v in entries.items():
                if k in keys:
                    full = torch.cat([s["state"][index][k] for s in ordered], dim=0)
                    state[index][k] = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
                else:
                    state[index][k] = v
        self.optimizer.load_state_dict({"state": state, "param_groups": ordered[0]["param_groups"]})

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._plan = None
