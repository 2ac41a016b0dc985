"""Context parallelism applied to a plain model in one place: the ``context_parallel`` transform.

A model family builds plain attention and names its attention modules in its
:class:`nxd.specs.ParallelPlan`'s ``context_parallel`` patterns. Each such module holds its core in
an ``attention_core`` attribute (torchtitan's swappable ``sdpa``) and calls it as
``attention_core(q, k, v, attention_mask)``: ``q`` ``[batch, heads, s_q, d]``, ``k``/``v``
``[batch, kv_heads, s_k, d | d_v]`` (``heads`` a multiple of ``kv_heads``; each KV head serves
consecutive query heads), ``attention_mask`` ``None`` (causal) or the bool mask of
:func:`nxd_modeling.attention_mask.build_attention_mask`; it returns
``[batch, heads, s_q, d_v]``. On one device that is SDPA (``nxd_models_llama.modeling.sdpa_attention``). Under ``context_parallel_size > 1``
the transform (registered by :mod:`nxd_core_parallel.transforms`, after the tensor and expert plans):

* swaps each named module's ``attention_core`` for :class:`RingAttentionCore` over ``context.cp``;
* runs the model's ``forward`` on this CP rank's chunks of each sequence: ``position_ids`` left out
  are the chunks' global positions, and an ``attention_mask``/``segment_ids`` is accepted only when
  it is one segment without padding on every CP rank (then dropped: ring attention is causal).

The batch is split by ``get_batch_on_this_context_parallel_rank`` (the trainer does it) and the loss
is the mean over every CP rank's tokens (:func:`nxd_modeling.lm_loss.token_mean`). A model
whose plan names no attention for it, that has a sliding window, or that says why its configuration
cannot run under CP (``nxd_context_parallel_unsupported``: DeepSeek's MTP and sequence-wise loss) is
refused. A model with no nxd plan at all (NxD-style user code) is left as it is: under NxD such a
model runs context parallelism in its own attention.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, dim_size
from nxd_context_parallel.layout import local_positions
from nxd_context_parallel.ring_attention import ring_attention

#: a model's reason its configuration cannot run under CP (a config field and why), refused with it
UNSUPPORTED = "nxd_context_parallel_unsupported"
#: set on a model once its forward takes CP chunks (the transform may run twice: build, then initialize)
_APPLIED = "_nxd_context_parallel"

CAUSAL_ONLY = ("context parallelism runs causal attention only: no attention mask, segment ids or KV cache "
               "(use context_parallel_size=1 for packed/padded batches or decoding)")


class RingAttentionCore:
    """An ``attention_core`` under context parallelism: ring attention over the CP ``group``
    (causal; ``q``/``k``/``v`` hold this rank's chunks of the sequence)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if attention_mask is not None or q.shape[2] != k.shape[2]:
            raise ValueError(CAUSAL_ONLY)
        return ring_attention(q, k, v, self.group, causal=True)

    def __repr__(self) -> str:
        return f"RingAttentionCore(cp={dist.get_world_size(self.group)})"


def require_plain_causal(attention_mask: torch.Tensor, cp_group: Any) -> None:
    """Accept a ``[batch, seq]`` mask only when it is one segment without padding on every CP rank
    (decided together, so every rank accepts or refuses)."""
    if attention_mask.dim() == 2:
        bounds = torch.stack([attention_mask.min(), -attention_mask.max()]).to(torch.float64)
        dist.all_reduce(bounds, op=dist.ReduceOp.MIN, group=cp_group)
        if bounds[0] == -bounds[1] and bounds[0] != 0:
            return
    raise ValueError("context parallelism runs causal attention only: this batch's attention_mask / segment_ids has "
                     "padding, several packed segments or an explicit mask (use context_parallel_size=1 for "
                     "packed/padded batches)")


def _chunk_inputs_hook(forward: Any, context: ParallelContext) -> Any:
    """A forward pre-hook giving ``forward``'s ``position_ids`` (when left out) the positions of this
    CP rank's chunks and dropping a plain causal mask (refusing any other)."""
    signature = inspect.signature(forward)
    mask_keys = [key for key in ("attention_mask", "segment_ids") if key in signature.parameters]

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = signature.bind(*args, **kwargs)
        inputs = bound.arguments
        mask = next((inputs[key] for key in mask_keys if inputs.get(key) is not None), None)
        if mask is not None:
            require_plain_causal(mask, context.cp.group)
            for key in mask_keys:
                inputs[key] = None
        if inputs.get("position_ids") is None:
            ids = inputs["input_ids"]
            b, s = ids.shape
            inputs["position_ids"] = local_positions(s, context.cp.rank, context.cp.size,
                                                     device=ids.device).unsqueeze(0).expand(b, s)
        return bound.args, bound.kwargs

    return hook


def apply_context_parallel(model: nn.Module, context: ParallelContext | None, config: Any) -> nn.Module:
    """The ``context_parallel`` transform: ring attention in every module the model's plan names
    ``context_parallel``, and a forward that takes this CP rank's chunks."""
    from nxd_tensor_parallel.tensor_plan import plan_of

    cp, model_name = dim_size(context, "cp"), type(model).__name__
    plan = plan_of(model)
    if plan is None:
        # NxD's contract: a model without an nxd plan (NxD-style user code, e.g. NxD's own
        # examples) runs context parallelism in its own attention, reading the CP group itself
        return model
    named = plan.modules(model, "context_parallel")
    if not named:
        raise ConfigError(f"context_parallel_size={cp}: {model_name} declares no attention for context parallelism "
                          "(its nxd_parallel_plan names no context_parallel modules: the attention modules whose "
                          "attention_core ring attention replaces); use context_parallel_size=1 or a model that "
                          "declares them (llama, qwen3, qwen3_moe, deepseek_v3)")
    unsupported = getattr(model, UNSUPPORTED, None)
    if unsupported:
        raise ConfigError(f"context_parallel_size={cp}: {model_name}: {unsupported}, or use context_parallel_size=1")
    window = getattr(getattr(model, "config", None), "sliding_window", None)
    if window is not None:
        raise ConfigError(f"context_parallel_size={cp}: {model_name} has sliding_window={window}; ring attention "
                          "runs plain causal attention over the whole sequence: use context_parallel_size=1")
    for name, module in named:
        if not callable(getattr(module, "attention_core", None)):
            raise ConfigError(f"parallel plan: {name} ({type(module).__name__}) is named context_parallel but has no "
                              "attention_core to replace (nxd_context_parallel.transform: the contract)")
        module.attention_core = RingAttentionCore(context.cp.group)
    if not getattr(model, _APPLIED, False):
        signature = inspect.signature(model.forward).parameters
        if "input_ids" not in signature or "position_ids" not in signature:
            raise ConfigError(f"context_parallel_size={cp}: {model_name}.forward must take input_ids and position_ids "
                              "(each CP rank's tokens have their own positions)")
        model.register_forward_pre_hook(_chunk_inputs_hook(model.forward, context), with_kwargs=True)
        setattr(model, _APPLIED, True)
    return model

