"""SwiGLU expert MLPs: built whole, split over experts (EP) and the intermediate dimension (TP) by the
expert-parallel plan (:mod:`nxd_moe.expert_plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from nxd.errors import ConfigError
from nxd_core_parallel.dtensor import full_rows, shard_like
from nxd_tensor_parallel.parallel_layers.layers import shard_of


@dataclass(frozen=True)
class ExpertShard:
    """Which part of a layer's experts one rank holds: the experts of EP rank ``ep_rank`` of
    ``ep_size`` (``[r*E/ep, (r+1)*E/ep)``), each expert's intermediate slice of TP rank ``tp_rank``
    of ``tp_size``. ``ep_group``/``edp_group``: the expert-parallel and expert-data-parallel groups
    (``None``: not expert parallel, e.g. shared experts). The default is the plain build: everything."""

    ep_size: int = 1
    ep_rank: int = 0
    ep_group: Any = None
    edp_group: Any = None
    tp_size: int = 1
    tp_rank: int = 0


#: the plain build's shard: every expert, whole
WHOLE = ExpertShard()


class ExpertMLPs(nn.Module):
    """SwiGLU experts. Built plain (every expert, whole intermediate dimension); the expert-parallel
    plan (:func:`nxd_moe.expert_plan.split_experts`, the ``expert_parallel`` transform) makes the
    module of one rank's :class:`ExpertShard`: ``num_experts / ep`` experts, each with the TP rank's
    slice of the intermediate dimension, as NxD's column-parallel gate/up and row-parallel down
    projections.

    * ``gate_up_proj`` ``[E_local, 2*I/tp, H]``: rows ``[gate rows of this TP rank; up rows]``
      (``partition_dim=1``, ``fused_splits=(I/tp, I/tp)``)
    * ``down_proj`` ``[E_local, H, I/tp]`` (``partition_dim=2``)

    Split over EP, both carry ``expert_model_parallel=True`` (dimension 0 is the expert dimension):
    gradient sync reduces them over the expert-data-parallel group, clipping counts each expert
    once, checkpoints gather them over EP. ``expert_parallel=False`` (shared experts): never split
    over EP, only over TP.

    :meth:`forward` takes tokens already grouped by local expert; it returns this TP rank's partial
    output (summing over TP is the caller's job, after the affinity weighting).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, init_std: float = 0.02,
                 output_init_std: float | None = None, grouped_gemm: str = "auto", expert_parallel: bool = True,
                 shard: ExpertShard = WHOLE) -> None:
        super().__init__()
        if num_experts % shard.ep_size:
            raise ConfigError(f"num_experts ({num_experts}) must be divisible by expert_model_parallel_size "
                              f"({shard.ep_size})")
        if intermediate_size % shard.tp_size:
            raise ConfigError(f"intermediate_size ({intermediate_size}) must be divisible by tensor_parallel_size "
                              f"({shard.tp_size})")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.expert_parallel, self.shard = expert_parallel, shard
        self.num_local_experts = num_experts // shard.ep_size
        self.local_intermediate = intermediate_size // shard.tp_size
        self.init_std = init_std
        #: ``auto``: :func:`torch._grouped_mm` where :func:`grouped_mm_runs` says it is fast; ``grouped``:
        #: always (torch's reference kernels elsewhere, e.g. to test it on CPU); ``loop``: never
        self.grouped_gemm = grouped_gemm
        #: ``down_proj``'s init std (Megatron's scaled init of output layers); ``None``: ``init_std``
        self.output_init_std = output_init_std
        self.allocate(dtype, device)
        self.reset_parameters()

    @property
    def ep_size(self) -> int:
        return self.shard.ep_size

    @property
    def ep_rank(self) -> int:
        return self.shard.ep_rank

    @property
    def tp_size(self) -> int:
        return self.shard.tp_size

    def allocate(self, dtype: torch.dtype, device: torch.device | str | None) -> None:
        """(Re)create the parameters, uninitialised, with their parallel attributes."""
        e, i, h, shard = self.num_local_experts, self.local_intermediate, self.hidden_size, self.shard
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h, dtype=dtype, device=device))
        self.down_proj = nn.Parameter(torch.empty(e, h, i, dtype=dtype, device=device))
        for param, dim in ((self.gate_up_proj, 1), (self.down_proj, 2)):
            param.expert_model_parallel = shard.ep_size > 1
            if shard.ep_group is not None:  # the groups nxd-core-parallel's grad sync, clipping and ZeRO-1 use
                # (set at EP=1 too, so a ZeRO-1 optimizer has the same param groups at every EP degree)
                param.expert_model_parallel_group = shard.ep_group
                param.expert_data_parallel_group = shard.edp_group
            param.tensor_model_parallel = shard.tp_size > 1
            param.partition_dim = dim
            param.partition_stride = 1
        if shard.tp_size > 1:
            self.gate_up_proj.fused_splits = (i, i)

    # -- checkpoints hold every expert: state_dict() gathers the EP shards (collective over the EP
    # group, so every rank must call it, as nxd-ckpt's save and load do), and loading keeps this
    # rank's experts. A checkpoint saved at one EP degree therefore loads at any other.
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in ("gate_up_proj", "down_proj"):
            if self.ep_size > 1:
                destination[prefix + name] = gather_experts(getattr(self, name), self.ep_size, self.shard.ep_group)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object, **kwargs: object) -> None:
        for name in ("gate_up_proj", "down_proj"):
            if self.ep_size > 1 and prefix + name in state_dict:
                state_dict[prefix + name] = local_experts(state_dict[prefix + name], getattr(self, name),
                                                          self.first_local_expert, self.num_experts)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def first_local_expert(self) -> int:
        return self.ep_rank * self.num_local_experts

    def local_part(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's part (its experts, its TP slice) of ``whole``, parameter ``name``'s value for
        every expert, whole (``[E, 2I, H]`` / ``[E, H, I]``; a single expert without dimension 0)."""
        if whole.dim() == 3:
            whole = whole[self.first_local_expert:self.first_local_expert + self.num_local_experts]
        dim, stride = (-2, 2) if name == "gate_up_proj" else (-1, 1)  # gate_up: [gate | up] pieces
        return shard_of(whole, whole.dim() + dim, stride, self.shard.tp_rank, self.tp_size)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every rank draws all ``num_experts`` whole experts in expert order and keeps its part, so
        the init is the same at every EP and TP degree (the RNG advances alike on all ranks) and the
        experts of different EP ranks are not copies of each other."""
        first, count = self.first_local_expert, self.num_local_experts
        for name, std in (("gate_up_proj", self.init_std), ("down_proj", self.output_init_std)):
            param = getattr(self, name)
            if param.is_meta:
                continue
            std = self.init_std if std is None else std
            whole = (2 * self.intermediate_size, self.hidden_size) if name == "gate_up_proj" else \
                (self.hidden_size, self.intermediate_size)
            scratch = torch.empty(whole, dtype=param.dtype, device=param.device)
            for e in range(self.num_experts):
                mine = first <= e < first + count
                if mine and self.tp_size == 1:
                    nn.init.normal_(param[e - first], 0.0, std)  # the whole expert is this rank's
                    continue
                nn.init.normal_(scratch, 0.0, std)
                if mine:
                    param[e - first].copy_(self.local_part(name, scratch))

    def forward(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``tokens`` ``[N, H]`` grouped by local expert (``counts[e]`` rows for local expert ``e``)
        -> ``[N, H]`` partial over TP. One grouped GEMM per projection where
        :func:`grouped_mm_runs`, else one pair of matmuls per local expert."""
        grouped = self.grouped_gemm == "grouped" or (self.grouped_gemm == "auto" and grouped_mm_runs(tokens, self.gate_up_proj))
        if grouped and tokens.shape[0]:
            offsets = torch.tensor(counts, device=tokens.device).cumsum(0).to(torch.int32)
            gate_up = torch._grouped_mm(tokens, self.gate_up_proj.transpose(-2, -1), offs=offsets)
            gate, up = gate_up.split(self.local_intermediate, dim=-1)
            return torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offsets)
        outputs = []
        for e, chunk in enumerate(tokens.split(counts, dim=0)):
            if chunk.shape[0] == 0:
                continue
            gate, up = F.linear(chunk, self.gate_up_proj[e]).split(self.local_intermediate, dim=-1)
            outputs.append(F.linear(F.silu(gate) * up, self.down_proj[e]))
        if not outputs:
            # no token reached this rank's experts: keep them in the graph (zero gradients), so every
            # rank's backward produces the same set of gradients for the collectives that follow
            return tokens.new_zeros(0, self.hidden_size) + 0 * (self.gate_up_proj.sum() + self.down_proj.sum())
        return torch.cat(outputs, dim=0)


def gather_experts(param: torch.Tensor, ep_size: int, ep_group: object) -> torch.Tensor:
    """Every expert of an expert-parallel ``param`` (dimension 0: this rank's experts), gathered
    over the EP group in EP-rank order (collective). Under FSDP (nxd-fsdp) ``param`` is this rank's
    rows of its experts: those are gathered over its expert-data-parallel group first."""
    local = full_rows(param.detach(), getattr(param, "expert_data_parallel_group", None)).contiguous()
    shards = [torch.empty_like(local) for _ in range(ep_size)]
    dist.all_gather(shards, local, group=ep_group)
    return torch.cat(shards, dim=0)


def local_experts(value: torch.Tensor, param: torch.Tensor, first: int, num_experts: int) -> torch.Tensor:
    """``value`` cut to this rank's experts (``param``'s ``len(param)`` experts from ``first``) when
    it holds all ``num_experts`` (a checkpoint saved at another EP degree), shaped as ``param`` is
    (a DTensor under FSDP); a value that holds only this rank's experts is returned as is."""
    if value.shape[0] != num_experts:
        return value
    return shard_like(value[first:first + param.shape[0]], param)


def grouped_mm_runs(tokens: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`torch._grouped_mm` takes these operands: CUDA compute capability 9.0+ (its
    kernels are Hopper's), bf16, every matrix dimension a multiple of 8 (16-byte rows)."""
    if not (hasattr(torch, "_grouped_mm") and tokens.is_cuda and tokens.dtype == weight.dtype == torch.bfloat16):
        return False
    if torch.cuda.get_device_capability(tokens.device) < (9, 0):
        return False
    return all(d % 8 == 0 for d in (*weight.shape[1:], tokens.shape[1]))
