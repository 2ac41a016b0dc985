"""Gradient synchronisation and clipping under tensor, sequence, pipeline and data parallelism.

Every function takes the parallel context it works for (``context=``); left out, it is the current
one (``nxd.parallel.resolve_context``) so NxD-style callers keep working."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from nxd.parallel import ParallelContext, dim_rank, resolve_context
from nxd_core_parallel import dtensor

#: Bytes per all-reduce bucket (NxD uses 512 MB on device; smaller buckets suit CPU caches).
BUCKET_CAP_BYTES = 64 * 1024 * 1024


def _as_list(parameters: Any) -> list[torch.Tensor]:
    if isinstance(parameters, torch.Tensor):
        return [parameters]
    params = list(parameters)
    # Accept optimizer-style param groups too.
    if params and isinstance(params[0], dict):
        return [p for group in params for p in group["params"]]
    return params


def _buckets(tensors: list[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    buckets: list[list[torch.Tensor]] = []
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    sizes: dict[tuple, int] = {}
    for t in tensors:
        key = (t.dtype, t.device)
        nbytes = t.numel() * t.element_size()
        if key in by_kind and sizes[key] + nbytes > cap_bytes:
            buckets.append(by_kind.pop(key))
            sizes[key] = 0
        by_kind.setdefault(key, []).append(t)
        sizes[key] = sizes.get(key, 0) + nbytes
    buckets.extend(by_kind.values())
    return buckets


def release_buffer(buffer: torch.Tensor) -> None:
    """Free a temporary collective buffer now, on this thread. A finished gloo collective's work
    object can still hold the tensor for a moment on gloo's worker thread, so dropping the last
    Python reference may free it late and on that thread: a transient second copy of the buffer,
    and a free that ``torch.profiler``'s memory events (hence ``profile_memory``) never see."""
    if buffer.device.type == "xla":  # lazy tensors have no storage to release
        return
    buffer.untyped_storage().resize_(0)


def allreduce_coalesced(tensors: list[torch.Tensor], group: Any, average: bool = False,
                        cap_bytes: int = BUCKET_CAP_BYTES) -> None:
    """All-reduce ``tensors`` in place over ``group`` (summed, or averaged), packed per dtype and
    device into flat buckets of at most ``cap_bytes``: one collective per bucket."""
    size = dist.get_world_size(group)
    if size == 1 or not tensors:
        return
    for bucket in _buckets(tensors, cap_bytes):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.all_reduce(flat, group=group)
        if average:
            flat.div_(size)
        offset = 0
        for t in bucket:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n
        release_buffer(flat)


def bucket_allreduce_gradients(grads: Iterable[torch.Tensor], group: Any = None,
                               bucket_cap_bytes: int = BUCKET_CAP_BYTES, *,
                               context: ParallelContext | None = None) -> None:
    """Average ``grads`` in place over the data-parallel group (data x context parallel under CP;
    or ``group``), packed into flat buckets so each bucket is one collective. Buckets go in reverse
    order, like NxD."""
    if group is None:
        ctx = resolve_context(context)
        if ctx is None:
            return
        group = gradient_reduction_group(ctx)
    allreduce_coalesced(list(grads)[::-1], group, average=True, cap_bytes=bucket_cap_bytes)


def allreduce_context_parallel_gradients(parameters: Any, bucket_cap_bytes: int = BUCKET_CAP_BYTES, *,
                                         context: ParallelContext | None = None) -> None:
    """Average every gradient over the context-parallel group (NxD's name). CP ranks hold the same
    parameters but different tokens; the CP loss (``context_parallel_token_mean``) scales each
    rank's gradient by the CP size, so the average is the exact gradient of the global mean loss."""
    ctx = resolve_context(context)
    if ctx is None or ctx.cp.size == 1:
        return
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    allreduce_coalesced(grads[::-1], ctx.cp.group, average=True, cap_bytes=bucket_cap_bytes)


def gradient_reduction_group(context: ParallelContext | None = None) -> Any:
    """The group replicated parameters' gradients are averaged over: data x context parallel
    (one collective for both; the DP group alone when CP is 1)."""
    ctx = resolve_context(context)
    if ctx is None:
        raise RuntimeError("gradient_reduction_group needs a parallel context: initialise model parallelism first")
    return ctx.dp_cp.group if ctx.cp.size > 1 else ctx.dp.group


def allreduce_sequence_parallel_gradients(parameters: Any, *, context: ParallelContext | None = None) -> None:
    """Sum over TP the gradients of parameters tagged ``sequence_parallel_enabled`` (norm weights
    and row-parallel biases under SP see only their rank's sequence slice)."""
    ctx = resolve_context(context)
    if ctx is None or ctx.tp.size == 1:
        return
    # an FSDP-sharded gradient is a DTensor: sum its local shard (summing shards of the DP-reduced
    # gradient is the same as summing before the reduction, both linear)
    grads = [dtensor.local(p.grad) for p in _as_list(parameters)
             if getattr(p, "sequence_parallel_enabled", False) and p.grad is not None]
    allreduce_coalesced(grads, ctx.tp.group, average=False, cap_bytes=BUCKET_CAP_BYTES)


def is_expert_parallel(param: torch.Tensor) -> bool:
    """Whether ``param`` is split over an expert-parallel group (``expert_model_parallel=True``, set
    by nxd-moe's experts): each EP rank holds different experts, so its gradient is reduced over the
    expert-data-parallel group (``param.expert_data_parallel_group``), not the data-parallel group."""
    return bool(getattr(param, "expert_model_parallel", False))


def allreduce_expert_parallel_gradients(parameters: Any, *, context: ParallelContext | None = None) -> None:
    """Gradients of expert-parallel parameters: sum over their expert-data-parallel group and divide
    by the data-parallel size. Each expert already received (through the all-to-all backward) the
    gradient from every EP rank's tokens, so this is the mean over all DP ranks' losses, exactly what
    the DP average gives a replicated parameter."""
    ctx = resolve_context(context)
    if ctx is None:
        return
    by_group: dict[int, tuple[Any, list[torch.Tensor]]] = {}
    for p in _as_list(parameters):
        if is_expert_parallel(p) and p.grad is not None:
            group = p.expert_data_parallel_group
            by_group.setdefault(id(group), (group, []))[1].append(p.grad)
    if not by_group:
        return  # no expert-parallel gradient (a dense model)
    dp = expert_gradient_divisor(ctx)
    for group, grads in by_group.values():
        allreduce_coalesced(grads, group, average=False, cap_bytes=BUCKET_CAP_BYTES)
        for g in grads:
            g.div_(dp)


def expert_gradient_divisor(context: ParallelContext | None = None) -> int:
    """What the expert-data-parallel sum of an expert gradient is divided by: the DP size (times CP:
    under context parallelism each rank's loss gradient is CP times its share, as
    context_parallel_token_mean makes it)."""
    ctx = resolve_context(context)
    return 1 if ctx is None else ctx.dp.size * ctx.cp.size


def reduction_param_groups(parameters: Any, *, context: ParallelContext | None = None) -> list[dict]:
    """``parameters`` (tensors or param-group dicts) as param groups whose parameters all reduce
    their gradients over the same process group, for optimizers that shard state per group (nxd-zero1).

    Expert parameters (those carrying an ``expert_data_parallel_group``, at any EP degree, so the
    groups are the same at every degree and checkpoints reshard across EP) move to a group of their
    own (after the group they came from, with its options) carrying ``sharding_group`` (their
    expert-data-parallel group: the ranks holding the same experts), ``gradient_divisor``
    (:func:`expert_gradient_divisor`) and ``partition_group`` (their expert-parallel group: the
    ranks holding the other experts, split along dimension 0). Other parameters keep their group;
    groups left empty are dropped."""
    params = list(parameters) if not isinstance(parameters, torch.Tensor) else [parameters]
    groups = [dict(g) for g in params] if params and isinstance(params[0], dict) else [{"params": params}]
    out: list[dict] = []
    for group in groups:
        members = [group["params"]] if isinstance(group["params"], torch.Tensor) else list(group["params"])
        dense = [p for p in members if getattr(p, "expert_data_parallel_group", None) is None]
        if dense or len(dense) == len(members):
            out.append({**group, "params": dense})
        by_group: dict[int, list[torch.Tensor]] = {}
        for p in members:
            if getattr(p, "expert_data_parallel_group", None) is not None:
                by_group.setdefault(id(p.expert_data_parallel_group), []).append(p)
        for experts in by_group.values():
            out.append({**group, "params": experts, "sharding_group": experts[0].expert_data_parallel_group,
                        "gradient_divisor": expert_gradient_divisor(context),
                        "partition_group": experts[0].expert_model_parallel_group})
    return out



def counted_in_norm(param: torch.Tensor, *, context: ParallelContext | None = None) -> bool:
    """Whether this rank owns ``param``'s gradient for the norm: replicated parameters count on
    TP rank 0 only; GQA KV weights replicated ``m`` times count on the first rank of each block
    of ``m`` neighbouring ranks that share a KV piece."""
    if getattr(param, "pipeline_shared_duplicate", False):
        return False  # a tied weight's copy on a later pipeline stage (nxd-pipeline): the first stage counts it
    tp_rank = dim_rank(resolve_context(context), "tp")
    if not getattr(param, "tensor_model_parallel", False):
        return tp_rank == 0
    multiplier = getattr(param, "kv_size_multiplier", 1)
    if multiplier > 1 and getattr(param, "fused_splits", None) is None:
        return tp_rank % multiplier == 0
    return True


def fused_pieces_counted(param: torch.Tensor, *, context: ParallelContext | None = None) -> list[bool]:
    """A fused GQA QKV parameter (``fused_splits`` along ``partition_dim``): whether each piece
    counts on this rank for the norm. The Q piece always counts, replicated K/V pieces only on
    unique ranks."""
    multiplier = getattr(param, "kv_size_multiplier", 1)
    unique = dim_rank(resolve_context(context), "tp") % multiplier == 0
    return [i == 0 or multiplier == 1 or unique for i in range(len(param.fused_splits))]


def get_grad_norm(parameters: Any, norm_type: float = 2, *, context: ParallelContext | None = None) -> torch.Tensor:
    """The global gradient norm of the (unsharded) model: TP shards are combined, replicated
    parameters count once, pipeline stages are combined; DP replicas hold the same (already
    reduced) gradients and are not summed again."""
    params = [p for p in _as_list(parameters) if p.grad is not None]
    norm_type = float(norm_type)
    device = params[0].grad.device if params else torch.device("cpu")
    ctx = resolve_context(context)
    initialized = ctx is not None
    pieces: list[tuple[torch.Tensor, bool]] = []
    expert_pieces: dict[int, tuple[Any, list[tuple[torch.Tensor, bool]]]] = {}
    for p in params:
        grad = p.grad.detach()
        if initialized and is_expert_parallel(p):
            # different experts on each EP rank: their norms add up over the EP group
            group = p.expert_model_parallel_group
            expert_pieces.setdefault(id(group), (group, []))[1].append((grad, counted_in_norm(p, context=ctx)))
        elif initialized and getattr(p, "fused_splits", None) is not None:
            pieces.extend(zip(torch.split(grad, list(p.fused_splits), dim=p.partition_dim),
                              fused_pieces_counted(p, context=ctx)))
        else:
            pieces.append((grad, counted_in_norm(p, context=ctx) if initialized else True))
    if norm_type == math.inf:
        local = torch.zeros((), dtype=torch.float32, device=device)
        for grad, _ in pieces:
            local = torch.maximum(local, grad.abs().max().float())
        op = dist.ReduceOp.MAX
    else:
        local = torch.zeros((), dtype=torch.float32, device=device)
        for grad, counted in pieces:
            if counted:
                local = local + grad.float().norm(norm_type) ** norm_type
        op = dist.ReduceOp.SUM
    for group, group_pieces in expert_pieces.values():
        part = torch.zeros((), dtype=torch.float32, device=device)
        for grad, counted in group_pieces:
            if norm_type == math.inf:
                part = torch.maximum(part, grad.abs().max().float())
            elif counted:
                part = part + grad.float().norm(norm_type) ** norm_type
        dist.all_reduce(part, op=op, group=group)
        local = torch.maximum(local, part) if norm_type == math.inf else local + part
    if ctx is not None:
        for dim in (ctx.tp, ctx.pp):
            if dim.size > 1:
                dist.all_reduce(local, op=op, group=dim.group)
    return local if norm_type == math.inf else local ** (1.0 / norm_type)


def clip_grad_norm(parameters: Any, max_norm: float, norm_type: float = 2, *,
                   context: ParallelContext | None = None) -> torch.Tensor:
    """Scale gradients in place so the global norm is at most ``max_norm``; return the norm
    before clipping (same convention as ``torch.nn.utils.clip_grad_norm_``)."""
    params = [p for p in _as_list(parameters) if p.grad is not None]
    total = get_grad_norm(params, norm_type, context=context)
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for p in params:
        p.grad.detach().mul_(coef.to(p.grad.device, p.grad.dtype))
    return total
