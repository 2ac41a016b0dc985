"""Bytes per rank: parameters and gradients from the rank's real shard, optimizer state from the
optimizer wrapper's sharding rule (ZeRO-1: fp32 state and master shard over DP; FSDP: everything
over DP), activations from the measured micro-batch profile and the schedule's in-flight count."""

from __future__ import annotations

import math
from typing import Any

from nxd_plan.layout import OPTIMIZER_STATES, Layout


def _states(layout: Layout) -> int:
    if layout.optimizer == "sgd":
        return 1 if layout.momentum > 0 else 0
    return OPTIMIZER_STATES.get(layout.optimizer, 2)


def grad_bytes(layout: Layout, trainable: int) -> int:
    """ZeRO-1 keeps fp32 gradients in one flat buffer per group (fp32 params, or bf16 params with
    fp32 accumulation); otherwise a gradient has its parameter's dtype. ``trainable``: the elements
    the rank stores (under FSDP its shard: gradients are reduce-scattered to it)."""
    per = 4 if layout.zero1 and (layout.param_bytes_per_element == 4 or layout.fp32_grad_acc) else \
        layout.param_bytes_per_element
    return trainable * per


def optimizer_bytes(layout: Layout, trainable: int) -> int:
    """ZeRO-1 (nxd-zero1): each DP rank holds the inner optimizer's fp32 state for its 1/DP slice,
    plus an fp32 copy of that slice when parameters are bf16 (fp32 parameters are updated in place
    through a view). FSDP: fp32 state of the 1/DP parameter shard. Replicated: torch's optimizer
    state in the parameter dtype (``adamw_fp32OptState``: fp32)."""
    states = _states(layout)
    if layout.zero1 or layout.fsdp:
        shard = -(-trainable // layout.dp) if layout.zero1 else trainable  # FSDP: already the rank's shard
        master = shard * 4 if layout.param_bytes_per_element != 4 else 0
        return states * shard * 4 + master
    per = 4 if layout.optimizer == "adamw_fp32optstate" else layout.param_bytes_per_element
    return states * trainable * per


def grads_persist(layout: Layout) -> bool:
    """Whether gradients exist before a micro-batch's backward: ZeRO-1's flat gradient buffers
    always; otherwise when micro-batches accumulate into them (several per step, or a pipeline).
    Else ``zero_grad(set_to_none=True)`` frees them each step and the backward allocates them as
    it frees activations (FSDP: its sharded gradients, reduce-scattered block by block)."""
    return layout.zero1 or layout.num_microbatches > 1 or layout.pp > 1


def dp_buffer_bytes(layout: Layout, grads: int) -> int:
    """Data-parallel buffers that live through training: replicated DP without a pipeline
    all-reduces gradients during backward from flat buckets as large as the gradients
    (nxd_core_parallel.dp_overlap)."""
    if layout.zero1 or layout.fsdp or layout.pp > 1 or layout.dp * layout.cp == 1:
        return 0
    return grads


def fsdp_unsharded_bytes(layout: Layout, shard: Any) -> int:
    """FSDP2's working set beyond the shards at the step's peak (the start of backward, when every
    activation is alive): the parameters outside the transformer blocks (the root unit, gathered
    from forward to backward) and two blocks gathered (the one running and the one prefetched;
    a block's unsharded gradients replace its freed activations)."""
    if not layout.fsdp:
        return 0
    from nxd_plan.activations import layer_index

    blocks: dict[int, int] = {}
    root = 0
    for name, (shape, _, _) in shard.params.items():
        nbytes = math.prod(shape) * layout.param_bytes_per_element
        index = layer_index(name)
        if index is None:
            root += nbytes
        else:
            blocks[index] = blocks.get(index, 0) + nbytes
    block = max(blocks.values(), default=0)
    return root + 2 * block


def in_flight(layout: Layout, pp_rank: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at once (Megatron's counts): GPipe
    all of them; 1F1B / zero-bubble ``PP - rank``; interleaved ``PP - rank`` plus ``(v - 1) x PP``
    more model chunks, each 1/v of the rank's layers."""
    m, pp, v = layout.num_microbatches, layout.pp, layout.vpp
    if pp == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    if v > 1:
        chunks = min(m * v, (pp - pp_rank - 1) * 2 + (v - 1) * pp + 1)
        return chunks / v
    return float(min(m, pp - pp_rank))


def activation_bytes(layout: Layout, profile: Any, stages: dict[int, list[int]], num_layers: int) -> int:
    """One micro-batch's saved bytes of this rank's layers (embedding on the first stage, head on the
    last) times the micro-batches in flight."""
    layers = sorted({i for idx in stages.values() for i in idx}) if stages else list(range(num_layers))
    per_mb = sum(profile.layer_bytes(i) for i in layers)
    if not stages or 0 in stages:
        per_mb += profile.embed
    if not stages or (layout.pp * layout.vpp - 1) in stages:
        per_mb += profile.head
    pp_rank = min(stages) % layout.pp if stages else 0
    return int(per_mb * in_flight(layout, pp_rank))
