"""Activation memory of one micro-batch, measured on the real model instead of a formula: the
rank's model of one replica (PP=1, the config's TP/CP/SP/recompute) runs forward and backward on
the meta device in a fake world, and two counters watch it:

- every tensor autograd saves for backward (``saved_tensors_hooks``), attributed to the
  transformer layer running at the time (or to the embedding before the first / the head after
  the last), so a pipeline stage's share is the sum of its layers';
- the bytes of every live tensor an op produced (a ``TorchDispatchMode`` keeping a count per
  storage, released when the last tensor on it dies): the high-water mark over forward and
  backward, gradients pre-allocated as in steady state, is the step's transient peak.

Attention on the meta device would take SDPA's math path (keeping the sequence x sequence
probabilities); CPU, CUDA and Trainium run a fused flash kernel that keeps only the output and
the log-sum-exp, so the measurement routes meta SDPA to the fused kernel's meta implementation.

Activation checkpointing is the real one (``torch.utils.checkpoint`` keeps the block's inputs and
recomputes the rest during backward), so recompute settings change what is counted.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from nxd_plan.fake_world import build_rank_model, fake_rank


@dataclass
class ActivationProfile:
    #: bytes saved for backward by each transformer layer (index -> bytes), one micro-batch
    layers: dict[int, int] = field(default_factory=dict)
    #: saved before the first layer (embedding) and after the last (norm, head, loss)
    embed: int = 0
    head: int = 0
    #: high-water mark of live op outputs over one forward + backward (gradients pre-allocated)
    peak: int = 0
    #: why the measurement could not be made (empty: it was)
    notes: list[str] = field(default_factory=list)
    measured: bool = True
    #: the collectives the forward + backward issued: (dimension, op) -> [count, buffer bytes, group size]
    collectives: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def layer_bytes(self, index: int) -> int:
        """Layer ``index``'s bytes; layers past the measured ones are like the last measured one
        (the replica is measured with a few layers: a family's layers are alike)."""
        if index in self.layers:
            return self.layers[index]
        return self.layers[max(self.layers)] if self.layers else 0

    @property
    def saved(self) -> int:
        return self.embed + self.head + sum(self.layers.values())

    @property
    def transient(self) -> int:
        """What the step's peak holds beyond the saved activations (recomputation, gradients of
        activations, the loss's softmax)."""
        return max(0, self.peak - self.saved)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _LiveBytes(TorchDispatchMode):
    """Bytes of live tensors produced by ops while active (storages counted once)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, int] = {}
        self.size: dict[int, int] = {}
        self.live = 0
        self.peak = 0
        self.on_collective: Any = None
        #: storages that existed before (parameters, their gradients, buffers): an op returning one
        #: of them (a view of a weight, an in-place gradient accumulation) allocates nothing
        self.external: set[int] = set()

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= self.size.pop(key)

    def _track(self, t: torch.Tensor) -> None:
        key = _key(t)
        if key in self.external:
            return
        if key not in self.refs:
            self.refs[key] = 0
            self.size[key] = t.untyped_storage().nbytes()
            self.live += self.size[key]
            self.peak = max(self.peak, self.live)
        self.refs[key] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and self.on_collective is not None:
            self.on_collective(func, args)
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """``F.scaled_dot_product_attention`` on meta tensors as the fused flash kernel devices run."""
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not query.is_meta:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            repeat = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
        out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        # the meta kernel shapes the output like the query; values may be narrower (DeepSeek's MLA)
        return out[..., :value.shape[-1]].contiguous() if value.shape[-1] != query.shape[-1] else out

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def replica_overrides(layout: Any) -> list[str]:
    """Overrides turning the config into one model replica without pipeline stages (same TP, CP,
    EP, SP, precision, recompute): the model every stage's layers come from."""
    devices = layout.tp * layout.cp * layout.ep
    return ["distributed_strategy.pipeline_model_parallel_size=1", "distributed_strategy.virtual_pipeline_model_parallel_size=1",
            "model.pipeline_cuts=null", f"trainer.devices={devices}", "trainer.num_nodes=1",
            f"data.global_batch_size={layout.micro_batch_size * layout.ep}"]


def layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def measure_activations(config: Any, run: Any, layout: Any, grads_exist: bool = True) -> ActivationProfile:
    """See :func:`_measure`. A model whose forward needs data-dependent shapes (an MoE router's
    ``nonzero``/``bincount``) has no meta value for them: its activations are reported unmeasured
    (``measured=False``, a note naming the operator), never guessed."""
    try:
        return _measure(config, run, layout, grads_exist)
    except NotImplementedError as exc:
        text = str(exc)
        first = next((w.rstrip(":") for w in text.split() if w.startswith("aten::")),
                     "torch.nonzero" if "nonzero" in text else text.split(".")[0])
        return unmeasured(f"the forward needs a data-dependent operator ({first}) that has no meta kernel (MoE routing)")
    except RuntimeError as exc:
        if "meta tensors" not in str(exc):
            raise
        # a value read back from a tensor (a bounds check like GPT's position ids): meta has no values
        return unmeasured(f"the forward needs a tensor's value ({exc.__traceback__ and _innermost(exc)})")


def unmeasured(why: str) -> ActivationProfile:
    return ActivationProfile(measured=False, notes=[
        f"activations NOT measured: {why}; peaks below exclude activations and are lower bounds"])


def _innermost(exc: BaseException) -> str:
    """Where the model read the value: the last frame outside torch and nxd-plan."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename
              and "nxd_plan" not in f.filename]
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} {frames[-1].line}" if frames else str(exc)


def _measure(config: Any, run: Any, layout: Any, grads_exist: bool = True) -> ActivationProfile:
    """One micro-batch's activations on rank 0 of one replica of ``config`` (see module doc).
    ``grads_exist``: gradients are allocated before the backward (they persist across steps or
    micro-batches); otherwise the backward allocates them and the high-water mark includes them."""
    profile = ActivationProfile()
    with fake_rank(0, run.derived.world_size):
        model, context, _ = build_rank_model(config, run)
        # modules whose meta forward rests on an assumption say which (MoE: the routed rows)
        profile.notes += sorted({m.nxd_plan_note() for m in model.modules() if callable(getattr(m, "nxd_plan_note", None))})
        from nxd_training.config.resolved import model_spec_of

        layer_classes = tuple(model_spec_of(run).transformer_layer_classes)
        where: list[Any] = ["embed"]
        for name, module in model.named_modules():
            index = layer_index(name + ".x")
            if isinstance(module, layer_classes) and index is not None:
                module.register_forward_pre_hook(lambda m, a, i=index: where.__setitem__(0, i))
                module.register_forward_hook(lambda m, a, o: where.__setitem__(0, "head"))
        params = {_key(p) for p in model.parameters()}
        seen: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = _key(t)
            if key in params or key in seen:
                return t
            seen.add(key)
            nbytes = t.untyped_storage().nbytes()
            if isinstance(where[0], int):
                profile.layers[where[0]] = profile.layers.get(where[0], 0) + nbytes
            elif where[0] == "embed":
                profile.embed += nbytes
            else:
                profile.head += nbytes
            return t

        for p in model.parameters():
            if p.requires_grad and grads_exist:
                p.grad = torch.zeros_like(p)  # steady state: gradients exist before the step's backward
        seq = layout.seq_length // layout.cp
        ids = torch.zeros(layout.micro_batch_size, seq, dtype=torch.long)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if layout.precision == "autocast" else _null()
        meter = _LiveBytes()
        meter.external = {_key(t) for t in [*model.parameters(), *model.buffers()]}
        meter.external |= {_key(p.grad) for p in model.parameters() if p.grad is not None}
        meter.on_collective = _CollectiveLog(context, profile.collectives)
        with meter, autocast, fused_attention():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(ids, labels=ids)
            loss = out.loss if hasattr(out, "loss") else out
            loss.backward()
            del out, loss
        profile.peak = meter.peak
    return profile


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


#: c10d op -> (traffic name, index of the argument whose tensors are the full buffer)
_COLLECTIVE_BUFFER = {"allreduce_": ("all_reduce", 0), "allgather_": ("all_gather", 0),
                      "_allgather_base_": ("all_gather", 0), "allgather_into_tensor_coalesced_": ("all_gather", 0),
                      "reduce_scatter_": ("reduce_scatter", 1), "_reduce_scatter_base_": ("reduce_scatter", 1),
                      "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1), "broadcast_": ("broadcast", 0),
                      "send": ("send", 0), "recv_": ("recv", 0), "alltoall_": ("all_to_all", 1),
                      "alltoall_base_": ("all_to_all", 1)}


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class _CollectiveLog:
    """Names each c10d op's group by the parallel dimension whose ranks it has."""

    def __init__(self, context: Any, into: dict) -> None:
        import torch.distributed as dist

        self.dist, self.into = dist, into
        self.dims: dict[tuple[int, ...], str] = {}
        for name in ("dp_cp", "edp", "ep", "pp", "dp", "cp", "tp"):  # the last one wins a tie (tp before cp)
            dim = context.dim(name)
            if dim.size > 1:
                self.dims[tuple(dim.ranks)] = name
        for dim in getattr(context, "kv_shared", {}).values():  # GQA: TP ranks sharing a K/V piece
            self.dims.setdefault(tuple(dim.ranks), "tp")

    def __call__(self, func: Any, args: tuple) -> None:
        op = func.__name__.split(".")[0]
        kind, arg = _COLLECTIVE_BUFFER.get(op, (op, 0))
        group = next((a for a in args if type(a).__name__ == "ScriptObject"), None)
        ranks: tuple[int, ...] = ()
        if group is not None:
            try:
                ranks = tuple(self.dist.get_process_group_ranks(self.dist.ProcessGroup.unbox(group)))
            except (RuntimeError, ValueError, AttributeError):
                ranks = ()
        dim = self.dims.get(ranks, f"group of {len(ranks)}")
        entry = self.into.setdefault((dim, kind), [0, 0, len(ranks)])
        entry[0] += 1
        entry[1] += _tensor_bytes(args[arg]) if len(args) > arg else 0
