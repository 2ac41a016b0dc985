"""``NeuronZero1Optimizer``: ZeRO-1 (optimizer state and fp32 master weights sharded over DP)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from nxd.parallel import ParallelContext, resolve_context
from nxd_core_parallel.grads import allreduce_coalesced, allreduce_sequence_parallel_gradients, release_buffer
from nxd_zero1 import checkpoint as _ckpt
from nxd_zero1.groups import GroupComm, backend_name, group_rank, group_size, resolve_group
from nxd_zero1.layout import FlatLayout, flatten_into
from nxd_zero1.optim import run_closure
from nxd_zero1.rounding import stochastic_round_to_bf16
from nxd_zero1.xla_layout import is_xla_state, xla_state_dict

#: torch-xla/NxD constructor options that only tune XLA graph building; accepted and ignored.
XLA_ONLY_OPTIONS = frozenset({
    "pin_layout", "coalesce_cc", "bucket_cap_mb_all_gather", "bucket_cap_mb_reduce_scatter",
    "lazy_init", "higher_cc_precision", "optimizer_dtype",
})
REDUCE_IMPLS = ("auto", "reduce_scatter", "all_reduce")

# On gloo, reduce_scatter is emulated and measured ~2-3x slower than all_reduce of the same
# buffer (1M fp32 elements, 2 ranks: 18.8 ms vs 6.1 ms), so "auto" uses all_reduce + slice there.
_ALL_REDUCE_BACKENDS = ("gloo",)


def _collective(name: str) -> Callable[..., Any]:
    # torch >= 2.10 renamed the *_tensor collectives to *_single; prefer the new names.
    new = {"reduce_scatter": "reduce_scatter_single", "all_gather": "all_gather_single"}[name]
    return getattr(dist, new, None) or getattr(dist, f"{name}_tensor")


def _param_groups(params: Iterable[Any]) -> list[dict]:
    params = list(params)
    if not params:
        raise ValueError("NeuronZero1Optimizer got an empty parameter list")
    groups = [dict(g) for g in params] if isinstance(params[0], dict) else [{"params": params}]
    for i, g in enumerate(groups):
        if "params" not in g:
            raise ValueError(f"param group {i} has no 'params' key")
        ps = [g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"])
        g["params"] = [p for p in ps if p.requires_grad]  # frozen params get no update, as in torch
        dtypes = {p.dtype for p in g["params"]}
        if len(dtypes) > 1:
            raise ValueError(
                f"param group {i} mixes dtypes {sorted(map(str, dtypes))}; ZeRO-1 flattens a group into one "
                "buffer, so put parameters of different dtypes in separate param groups"
            )
    return groups


class NeuronZero1Optimizer(torch.optim.Optimizer):
    """ZeRO-1 wrapper around any ``torch.optim.Optimizer`` class (NxD's ``NeuronZero1Optimizer``).

    Each param group is flattened into one buffer padded to a multiple of the DP size; every DP
    rank keeps the fp32 master copy and the inner optimizer's state for its 1/DP slice only. A
    ``step()`` (1) all-reduces sequence-parallel norm grads over TP, (2) reduce-scatters the
    DP-averaged grads in fp32, (3) computes the TP/PP/DP-correct grad norm and clips, (4) runs the
    inner optimizer on the fp32 shard, (5) rounds the shard to the parameter dtype (stochastically
    when ``stochastic_rounding``) and all-gathers it back into the parameters.

    Precision: fp32 params need nothing else. For bf16 params, ``use_master_weights=True`` keeps
    the fp32 shard across steps; ``False`` re-reads the bf16 params each step (so updates smaller
    than bf16's spacing are lost unless ``stochastic_rounding``). ``use_fp32_grad_acc`` (bf16
    params only) accumulates grads into fp32 ``param.main_grad`` buffers via a post-accumulate hook.

    Gradients of fp32 params are views of a flat fp32 buffer (``zero_grad`` zeroes them in place
    rather than setting them to None). After ``step()`` they hold the DP-summed gradient (this
    rank's slice averaged and clipped); call ``zero_grad()`` before the next backward.

    A param group may name its own process groups (keys ``sharding_group``, ``gradient_divisor``,
    ``partition_group``; see :class:`nxd_zero1.groups.GroupComm`) for parameters that are not
    replicated over the whole DP group, e.g. parameters split over a sub-group of it: the group's
    state is then sharded over ``sharding_group``, its gradients summed there and divided by
    ``gradient_divisor``, and its norm contributions summed over ``partition_group`` too, so the
    clipping norm counts every element of the full model once.
    """

    nxd_zero1 = True

    def __init__(
        self,
        params: Iterable[Any],
        optimizer_class: type[torch.optim.Optimizer],
        *,
        sharding_groups: Any = None,
        grad_norm_groups: Any = None,
        pipeline_groups: Any = None,
        grad_clipping: bool = True,
        max_norm: float = 1.0,
        norm_type: float = 2.0,
        use_master_weights: bool = True,
        use_fp32_grad_acc: bool = False,
        save_master_weights: bool = False,
        stochastic_rounding: bool = False,
        sequence_parallel: bool = False,
        seed: int = 0,
        reduce_impl: str = "auto",
        use_grad_acc_hook: bool | None = None,
        context: ParallelContext | None = None,
        **defaults: Any,
    ) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass, got {optimizer_class!r}")
        if reduce_impl not in REDUCE_IMPLS:
            raise ValueError(f"reduce_impl must be one of {REDUCE_IMPLS}, got {reduce_impl!r}")
        if not (max_norm > 0):
            raise ValueError(f"max_norm must be positive, got {max_norm!r}")
        if not dist.is_initialized():
            raise RuntimeError("NeuronZero1Optimizer needs torch.distributed to be initialized (init_process_group)")
        for key in XLA_ONLY_OPTIONS & defaults.keys():
            defaults.pop(key)
        if use_grad_acc_hook is not None:  # NxD's name for fp32 grad accumulation
            use_fp32_grad_acc = use_grad_acc_hook

        # NxD's constructor has no context: groups left out come from the current one (the fallback)
        self.parallel_context = context = resolve_context(context)
        self.sharding_group = resolve_group(sharding_groups, "data", context)
        self.grad_norm_group = resolve_group(grad_norm_groups, "tensor", context)
        self.pipeline_group = resolve_group(pipeline_groups, "pipeline", context)
        self.dp_size, self.dp_rank = group_size(self.sharding_group), group_rank(self.sharding_group)
        self.grad_clipping, self.max_norm, self.norm_type = bool(grad_clipping), float(max_norm), float(norm_type)
        self.use_master_weights, self.save_master_weights = bool(use_master_weights), bool(save_master_weights)
        self.stochastic_rounding, self.sequence_parallel = bool(stochastic_rounding), bool(sequence_parallel)
        if reduce_impl == "auto":
            reduce_impl = "all_reduce" if backend_name(self.sharding_group) in _ALL_REDUCE_BACKENDS else "reduce_scatter"
        self.reduce_impl = reduce_impl
        self.grad_norm: torch.Tensor | None = None

        groups = _param_groups(params)
        self._comms = [GroupComm.pop_from(g, self.sharding_group) for g in groups]
        self._layouts = [FlatLayout.build(g["params"], c.size, c.rank) for g, c in zip(groups, self._comms)]
        self._flat_params = [g["params"] for g in groups]
        self._shards: list[torch.Tensor] = []
        # fp32 groups: the params become views of one flat buffer and the master shard is this
        # rank's slice of it, so no fp32 copy is kept and the all-gather writes params in place.
        self._flat_bufs: list[torch.Tensor | None] = []
        # Every group's params (any dtype) become views of one flat buffer of their dtype when they
        # share a device: the write-back is then one cast-copy into this rank's slice (plus the
        # all-gather), never a Python loop over parameters.
        self._param_bufs: list[torch.Tensor | None] = []
        for ps, layout in zip(self._flat_params, self._layouts):
            device = ps[0].device if ps else torch.device("cpu")
            same_device = bool(ps) and all(p.device == device for p in ps)
            if same_device and ps[0].dtype == torch.float32:
                flat = torch.zeros(layout.padded_numel, dtype=torch.float32, device=device)
                self._flat_bufs.append(flat)
                self._param_bufs.append(flat)
                self._bind_views(ps, layout, flat)
                self._shards.append(flat[layout.shard_start:layout.shard_end])
                continue
            param_buf = None
            if same_device:
                param_buf = torch.zeros(layout.padded_numel, dtype=ps[0].dtype, device=device)
                self._bind_views(ps, layout, param_buf)
            self._param_bufs.append(param_buf)
            shard = torch.zeros(layout.shard_size, dtype=torch.float32, device=device)
            self._read_shard(ps, layout, shard)
            self._shards.append(shard)
            self._flat_bufs.append(None)
        self._norm_weights = [self._segment_weights(ps, layout) for ps, layout in zip(self._flat_params, self._layouts)]

        inner_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [s]} for g, s in zip(groups, self._shards)]
        self.optim = optimizer_class(inner_groups, **_prefer_fused(optimizer_class, self._shards, defaults))
        outer = [{**{k: v for k, v in ig.items() if k != "params"}, "params": g["params"]}
                 for g, ig in zip(groups, self.optim.param_groups)]
        self._constructing = True
        super().__init__(outer, self.optim.defaults)
        self._constructing = False

        self.use_fp32_grad_acc = bool(use_fp32_grad_acc)
        self._hooks = []
        # Gradients live in one flat fp32 buffer per group when they can: fp32 params get
        # ``p.grad`` as views of it (autograd accumulates in place, as with DDP's
        # gradient_as_bucket_view), bf16 params with fp32 grad accumulation get ``p.main_grad``
        # views. The DP reduction then runs on the buffer with no flattening copy.
        self._grad_bufs: list[torch.Tensor | None] = []
        for ps, layout, shard in zip(self._flat_params, self._layouts, self._shards):
            fp32 = bool(ps) and ps[0].dtype == torch.float32
            if not ps or not (fp32 or self.use_fp32_grad_acc):
                self._grad_bufs.append(None)
                continue
            buf = torch.zeros(layout.padded_numel, dtype=torch.float32, device=shard.device)
            self._grad_bufs.append(buf)
            for p, off in zip(ps, layout.offsets):
                view = buf[off:off + p.numel()].view_as(p)
                if fp32:
                    if p.grad is not None:
                        view.copy_(p.grad)
                    p.grad = view
                else:
                    p.main_grad = view
                    self._hooks.append(p.register_post_accumulate_grad_hook(_accumulate_main_grad))
        device = self._shards[0].device if self._shards else torch.device("cpu")
        if device.type == "meta":  # built on the meta device (the plan's dry run): no generator there, none used
            device = torch.device("cpu")
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed) + 1_000_003 * dist.get_rank())

    # ------------------------------------------------------------------ helpers
    def add_param_group(self, param_group: dict) -> None:
        if not getattr(self, "_constructing", False):
            raise NotImplementedError("NeuronZero1Optimizer fixes its flat layout at construction; "
                                      "pass every param group to the constructor")
        super().add_param_group(param_group)

    @staticmethod
    def _bind_views(params: list[torch.Tensor], layout: FlatLayout, flat: torch.Tensor) -> None:
        for p, off in zip(params, layout.offsets):
            view = flat[off:off + p.numel()].view_as(p)
            view.copy_(p.detach())
            p.data = view

    def _ensure_views(self, gi: int) -> None:
        """Re-bind params whose storage was replaced (``p.data = ...``) since construction."""
        flat, layout, params = self._param_bufs[gi], self._layouts[gi], self._flat_params[gi]
        if flat is None:
            return
        base = flat.data_ptr()
        if any(p.data_ptr() != base + off * flat.element_size() for p, off in zip(params, layout.offsets)):
            self._bind_views(params, layout, flat)

    def _all_params(self) -> list[torch.Tensor]:
        return [p for ps in self._flat_params for p in ps]

    @staticmethod
    def _read_shard(params: list[torch.Tensor], layout: FlatLayout, out: torch.Tensor) -> None:
        """Copy this rank's slice of the flattened ``params`` into ``out`` (padding stays zero)."""
        for i, lo, hi in layout.local_segments():
            start = lo + layout.shard_start - layout.offsets[i]
            out[lo:hi].copy_(params[i].detach().reshape(-1)[start:start + hi - lo])

    def _refresh_shard(self, gi: int) -> None:
        """Re-read this rank's fp32 shard from the (non-fp32) parameters."""
        param_buf, layout, shard = self._param_bufs[gi], self._layouts[gi], self._shards[gi]
        if param_buf is None:
            self._read_shard(self._flat_params[gi], layout, shard)
            return
        self._ensure_views(gi)
        shard.copy_(param_buf[layout.shard_start:layout.shard_end])

    def _param_weight(self, p: torch.Tensor) -> float | torch.Tensor:
        """1 where this rank counts ``p``'s gradient toward the norm, 0 where another TP rank does
        (nxd-core-parallel's rule, so every element of the full model counts exactly once):
        TP-replicated params on TP rank 0; ``kv_size_multiplier``-replicated K/V on the first rank
        of each block of ``multiplier`` neighbouring ranks sharing a KV piece; for a fused QKV
        param, its Q piece everywhere. Per element (a flat tensor) only for fused params."""
        tp_rank = group_rank(self.grad_norm_group)
        if not getattr(p, "tensor_model_parallel", False):
            return 1.0 if tp_rank == 0 else 0.0
        multiplier = int(getattr(p, "kv_size_multiplier", 1))
        unique = multiplier <= 1 or tp_rank % multiplier == 0
        splits = getattr(p, "fused_splits", None)
        if splits is None:
            return 1.0 if unique else 0.0
        if p.is_meta:  # built on the meta device (the plan's dry run): no gradient will ever be counted
            return 1.0
        weight = torch.ones(p.shape, device=p.device)
        for i, piece in enumerate(torch.split(weight, list(splits), dim=p.partition_dim)):
            piece.fill_(1.0 if i == 0 or unique else 0.0)
        return weight.reshape(-1)

    def _segment_weights(self, params: list[torch.Tensor], layout: FlatLayout) -> list[tuple[int, int, float]]:
        """Shard-local ``(lo, hi, weight)`` ranges whose gradients count toward the norm."""
        runs: list[tuple[int, int, float]] = []
        for i, lo, hi in layout.local_segments():
            w = self._param_weight(params[i])
            if isinstance(w, float):
                pieces = [(lo, hi, w)]
            else:
                start = lo + layout.shard_start - layout.offsets[i]
                pieces = _runs(w[start:start + hi - lo], lo)
            for a, b, wt in pieces:
                if runs and runs[-1][1] == a and runs[-1][2] == wt:
                    runs[-1] = (runs[-1][0], b, wt)
                else:
                    runs.append((a, b, wt))
        return [r for r in runs if r[2] != 0.0]

    def _grads(self, params: list[torch.Tensor]) -> list[torch.Tensor | None]:
        return [getattr(p, "main_grad", None) if hasattr(p, "main_grad") else p.grad for p in params]

    def _allreduce_context_parallel(self) -> None:
        """Context-parallel ranks hold the same parameters but different tokens of the same samples:
        average their gradients first; sharding and the norm then follow the DP path unchanged."""
        cp = self.parallel_context.cp if self.parallel_context is not None else None
        if cp is None or cp.size == 1:
            return
        # groups with their own sharding group reduce over it (it spans the CP ranks where needed)
        params = [p for ps, c in zip(self._flat_params, self._comms) if c.default for p in ps]
        bufs = [g for g in self._grads(params) if g is not None]
        if not bufs:
            return
        allreduce_coalesced(bufs, cp.group, average=True)

    def _allreduce_sequence_parallel(self) -> None:
        sp = [p for p in self._all_params() if getattr(p, "sequence_parallel_enabled", False)]
        if not sp or group_size(self.grad_norm_group) == 1:
            return
        if not any(hasattr(p, "main_grad") for p in sp):
            allreduce_sequence_parallel_gradients(sp, context=self.parallel_context)
            return
        allreduce_coalesced([p.main_grad for p in sp], self.grad_norm_group)

    def _sync_grad_views(self, gi: int, zero: bool = False) -> None:
        """Make fp32 params' ``.grad`` views of the group's grad buffer again where user code
        replaced them (``p.grad = None`` or a new tensor), keeping any values they hold."""
        buf, layout, params = self._grad_bufs[gi], self._layouts[gi], self._flat_params[gi]
        if buf is None or params[0].dtype != torch.float32:
            return
        base, size = buf.data_ptr(), buf.element_size()
        for p, off in zip(params, layout.offsets):
            if p.grad is not None and p.grad.data_ptr() == base + off * size:
                continue
            view = buf[off:off + p.numel()].view_as(p)
            if p.grad is None or zero:
                view.zero_()
            else:
                view.copy_(p.grad)
            p.grad = view

    def _reduce_grad_shard(self, gi: int) -> torch.Tensor:
        """This rank's slice of the DP-averaged gradient of group ``gi``, in fp32."""
        layout, params, comm = self._layouts[gi], self._flat_params[gi], self._comms[gi]
        flat = self._grad_bufs[gi]
        if flat is not None:
            self._sync_grad_views(gi)
        else:
            flat = torch.empty(layout.padded_numel, dtype=torch.float32, device=self._shards[gi].device)
            flatten_into(flat, self._grads(params), layout)
        if comm.size == 1:
            return flat if comm.divisor == 1 else flat.div_(comm.divisor)
        # Sum, then average only this rank's 1/DP slice: one pass over the shard instead of over
        # the whole buffer (bit-identical to pre-dividing when DP is a power of two).
        if self.reduce_impl == "reduce_scatter":
            out = torch.empty(layout.shard_size, dtype=torch.float32, device=flat.device)
            _collective("reduce_scatter")(out, flat, group=comm.group)
            if self._grad_bufs[gi] is None:
                release_buffer(flat)
        else:
            dist.all_reduce(flat, group=comm.group)
            out = flat[layout.shard_start:layout.shard_end]
        return out.div_(comm.divisor)

    def _total_norm(self, grad_shards: list[torch.Tensor]) -> torch.Tensor:
        device = grad_shards[0].device if grad_shards else torch.device("cpu")
        inf = math.isinf(self.norm_type)
        # one partial per distinct (sharding group, partition group): each is summed over the ranks
        # holding other pieces of the same parameters, then the partials add up over TP and PP
        partials: dict[tuple[int, int], tuple[torch.Tensor, GroupComm]] = {}
        for shard, weights, comm in zip(grad_shards, self._norm_weights, self._comms):
            key = (id(comm.group), id(comm.partition_group))
            part = partials[key][0] if key in partials else torch.zeros((), dtype=torch.float32, device=device)
            for lo, hi, _ in weights:
                seg = shard[lo:hi]
                if inf:
                    part = torch.maximum(part, seg.abs().max())
                else:
                    part = part + torch.linalg.vector_norm(seg, self.norm_type) ** self.norm_type
            partials[key] = (part, comm)
        op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
        total = torch.zeros((), dtype=torch.float32, device=device)
        for part, comm in partials.values():
            for group in (comm.group, comm.partition_group):
                if group_size(group) > 1:
                    dist.all_reduce(part, op=op, group=group)
            total = torch.maximum(total, part) if inf else total + part
        for group in (self.grad_norm_group, self.pipeline_group):
            if group_size(group) > 1:
                dist.all_reduce(total, op=op, group=group)
        return total if inf else total ** (1.0 / self.norm_type)

    def _to_param_dtype(self, shard: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if dtype == torch.float32:
            return shard
        if self.stochastic_rounding and dtype == torch.bfloat16:
            return stochastic_round_to_bf16(shard, self.generator)
        return shard.to(dtype)

    def _write_back(self, gi: int) -> None:
        params, layout, comm = self._flat_params[gi], self._layouts[gi], self._comms[gi]
        if not params:
            return
        dtype = params[0].dtype
        param_buf = self._param_bufs[gi]
        if param_buf is not None:  # params are views of one flat buffer: fill this rank's slice, gather in place
            local = param_buf[layout.shard_start:layout.shard_end]
            if self._flat_bufs[gi] is None:  # fp32 params' slice is the shard itself; others take one cast-copy
                shard = self._shards[gi]
                sr = self.stochastic_rounding and dtype == torch.bfloat16
                local.copy_(stochastic_round_to_bf16(shard, self.generator) if sr else shard)
            if comm.size > 1:
                _collective("all_gather")(param_buf, local, group=comm.group)
            return
        local = self._to_param_dtype(self._shards[gi], dtype)
        if comm.size == 1:
            full = local
        else:
            full = torch.empty(layout.padded_numel, dtype=dtype, device=local.device)
            _collective("all_gather")(full, local.contiguous(), group=comm.group)
        for p, off in zip(params, layout.offsets):
            p.detach().copy_(full[off:off + p.numel()].view_as(p))
        if comm.size > 1:
            release_buffer(full)

    def _keeps_master(self, gi: int) -> bool:
        """Whether the fp32 shard persists across steps (it is the fp32 params' storage, or bf16
        master weights). Otherwise it is refreshed from the params each step."""
        ps = self._flat_params[gi]
        if self._flat_bufs[gi] is not None:
            return True  # the shard is the params' own storage
        return bool(ps) and self.use_master_weights and ps[0].dtype != torch.float32

    # ------------------------------------------------------------------ optimizer API
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        if self.sequence_parallel:
            self._allreduce_sequence_parallel()
        self._allreduce_context_parallel()
        grad_shards = [self._reduce_grad_shard(gi) for gi in range(len(self._layouts))]
        if self.grad_clipping:
            self.grad_norm = self._total_norm(grad_shards)
            if grad_shards:
                torch._foreach_mul_(grad_shards, _clip_coefficient(self.max_norm, self.grad_norm))
        for gi, (shard, grad) in enumerate(zip(self._shards, grad_shards)):
            self._ensure_views(gi)
            if not self._keeps_master(gi):
                self._refresh_shard(gi)
            shard.grad = grad
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        self.optim.step()
        for gi, shard in enumerate(self._shards):
            shard.grad = None
            self._write_back(gi)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients. Grads held in the flat buffer (fp32 ``p.grad``, ``p.main_grad``)
        are zeroed in place whatever ``set_to_none`` says, so they stay views of it."""
        for gi, (buf, params) in enumerate(zip(self._grad_bufs, self._flat_params)):
            if buf is not None:
                buf.zero_()
                self._sync_grad_views(gi, zero=True)
            if buf is not None and params[0].dtype == torch.float32:
                continue
            for p in params:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_().zero_()

    # ------------------------------------------------------------------ checkpoint API
    def state_dict(self) -> dict:
        """This DP rank's shard: inner optimizer state slices plus global flat offsets."""
        return _ckpt.build_state_dict(self)

    def xla_state_dict(self, whole: bool = False) -> dict:
        """This DP rank's shard in NxD's own (torch-xla ``ZeroRedundancyOptimizer``) layout;
        collective over the DP group. ``whole=True``: the state whole over DP (a DP=1 shard)."""
        return xla_state_dict(self, whole)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a shard saved by the same DP rank at the same DP size (NxD's own layout: at DP=1 only,
        its shards each hold rows of every parameter; load_state_dict_from_shards takes them all)."""
        if is_xla_state(state_dict):
            if self.dp_size > 1:
                raise ValueError("this is one DP rank's shard in NxD's torch-xla ZeRO-1 layout, whose shards each "
                                 "hold rows of every parameter; pass every DP rank's shard to "
                                 "load_state_dict_from_shards (or load_sharded_state_dict / nxd.load_checkpoint)")
            _ckpt.load_from_shards(self, [state_dict])
            return
        _ckpt.check_same_layout(self, state_dict)
        _ckpt.load_from_shards(self, [state_dict], allow_partial=True)

    def load_state_dict_from_shards(self, shards: list[dict]) -> None:
        """Load from the complete list of shards saved at any DP size (resharding as needed)."""
        _ckpt.load_from_shards(self, shards)

    def save_sharded_state_dict(self, output_dir: str, num_workers_per_step: int = 8, save_serially: bool = True,
                                *, layout: str = "zero1") -> None:
        """Every DP rank writes its shard to ``output_dir`` (NxD's API and file names; one rank at a
        time when ``save_serially``). ``layout="torch_xla"`` writes NxD's own ZeRO-1 state
        (:mod:`nxd_zero1.xla_layout`, which NxD's ``load_sharded_state_dict`` reads); the default
        writes nxd-zero1's self-describing shards. Both load here at any DP size."""
        _ckpt.save_sharded(self, output_dir, save_serially, layout)

    def load_sharded_state_dict(self, output_dir: str, num_workers_per_step: int = 8) -> None:
        """Load the shards in ``output_dir`` saved at any DP size."""
        _ckpt.load_sharded(self, output_dir)

    @property
    def optimizer(self) -> NeuronZero1Optimizer:
        """NxD scripts reach the ZeRO-1 optimizer through its wrapper (``nxd_optimizer.optimizer``);
        nxd hands out the ZeRO-1 optimizer itself, so this is itself."""
        return self

    def init_zero(self) -> None:
        """NxD's name for :meth:`reload_master_weights_from_params` (called after loading weights)."""
        self.reload_master_weights_from_params()

    def reload_master_weights_from_params(self) -> None:
        """Reset the fp32 master shards from the current parameters (after loading model
        weights without optimizer state)."""
        for gi in range(len(self._shards)):
            if self._flat_bufs[gi] is not None:
                self._ensure_views(gi)
            else:
                self._refresh_shard(gi)


def _clip_coefficient(max_norm: float, total_norm: torch.Tensor) -> torch.Tensor:
    """``min(max_norm / (norm + 1e-6), 1)`` on the norm's device, never read back to the host (a read
    would stall the step until the device finished the backward). Computed in fp64 as Python did
    it before, then rounded to fp32 as a scalar multiplier is: the same bits; a factor of exactly 1
    leaves the gradients bitwise unchanged."""
    wide = torch.float32 if total_norm.device.type == "mps" else torch.float64  # MPS has no fp64
    coef = max_norm / (total_norm.detach().to(wide) + 1e-6)
    return torch.clamp(coef, max=1.0).to(torch.float32)


def _prefer_fused(optimizer_class: type[torch.optim.Optimizer], shards: list[torch.Tensor],
                  defaults: dict[str, Any]) -> dict[str, Any]:
    """On CUDA, torch's fused implementation when the class has one and the caller chose none:
    the shard is one flat fp32 tensor, where ``foreach`` degenerates to ~10 full passes over it
    and ``fused`` makes one."""
    if "fused" in defaults or "foreach" in defaults or not shards or shards[0].device.type != "cuda":
        return defaults
    if "fused" not in inspect.signature(optimizer_class.__init__).parameters:
        return defaults
    return {**defaults, "fused": True}


def _runs(values: torch.Tensor, base: int) -> list[tuple[int, int, float]]:
    """Run-length encode a 1-D tensor as ``(base + start, base + end, value)``."""
    if values.numel() == 0:
        return []
    cuts = [0, *((values[1:] != values[:-1]).nonzero().flatten() + 1).tolist(), values.numel()]
    return [(base + a, base + b, float(values[a])) for a, b in zip(cuts[:-1], cuts[1:])]


def _accumulate_main_grad(p: torch.Tensor) -> None:
    p.main_grad.add_(p.grad)
    p.grad = None
