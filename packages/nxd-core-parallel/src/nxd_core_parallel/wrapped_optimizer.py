"""nxd's data-parallel optimizer wrappers: ``WrappedOptimizer``, what they share (``NxDOptimizer``
here, ``FSDPOptimizer`` in nxd-fsdp), and ``NxDOptimizer``, the ``ddp`` strategy's (NxD's name,
also exported by :mod:`nxd_core_parallel.trainer` beside ``NxDModel``).

The inner optimizer owns the parameter groups, the state and the defaults; the wrapper runs what a
parallel step adds around the inner step: the gradient collectives (``sync_gradients``) and
clipping by the whole model's norm (``clip_grad_norm``), as ``optimizer_config`` asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nxd.parallel import ParallelContext, resolve_context
from nxd.run_config import RunConfig
from nxd_core_parallel import dp_overlap
from nxd_core_parallel.expert_state import gather_expert_state, slice_expert_state
from nxd_core_parallel.grads import (
    allreduce_expert_parallel_gradients,
    allreduce_sequence_parallel_gradients,
    bucket_allreduce_gradients,
    clip_grad_norm,
    gradient_reduction_group,
    is_expert_parallel,
)


def _inner(name: str) -> property:
    """The inner optimizer's attribute ``name``, read and written through the wrapper."""
    return property(lambda self: getattr(self.optimizer, name),
                    lambda self, value: setattr(self.optimizer, name, value))


class WrappedOptimizer(torch.optim.Optimizer):
    """``step()``: :meth:`sync_gradients`, then :meth:`clip_grad_norm` to the run's
    ``optimizer.max_grad_norm`` unless it is ``None`` (the norm before clipping is kept in ``grad_norm``),
    then the inner optimizer's step. Subclasses implement those two methods."""

    def __init__(self, optimizer: torch.optim.Optimizer, nxd_config: Mapping[str, Any] | None) -> None:
        # Optimizer.__init__ is not called on purpose: the inner optimizer owns groups and state.
        self.optimizer = optimizer
        self.nxd_config = RunConfig.of(nxd_config)
        #: the clipping norm, read once (``None``: no clipping)
        self.max_grad_norm = self.nxd_config.optimizer.max_grad_norm
        self.grad_norm: torch.Tensor | None = None
        self._optimizer_step_pre_hooks: dict = {}
        self._optimizer_step_post_hooks: dict = {}

    param_groups = _inner("param_groups")
    state = _inner("state")
    defaults = _inner("defaults")

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def sync_gradients(self) -> None:
        """The gradient collectives the step runs before clipping."""
        raise NotImplementedError

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so the whole model's norm is at most ``max_norm``; return the norm before."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if closure is not None:
            raise ValueError(f"{type(self).__name__}.step does not take a closure: "
                             "run the forward/backward before step()")
        self.sync_gradients()
        if self.max_grad_norm is not None:
            self.grad_norm = self.clip_grad_norm(self.max_grad_norm)
        return self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"


def _overlap_possible(nxd_config: RunConfig, context: ParallelContext | None) -> bool:
    if context is None or context.dp.size * context.cp.size == 1:
        return False
    # Pipeline schedules run one backward per micro-batch; lazy XLA tensors have no eager hooks.
    if nxd_config.pipeline_parallel_size > 1 or context.pp.size > 1:
        return False
    return getattr(context.backend, "name", None) != "xla"


class NxDOptimizer(WrappedOptimizer):
    """``step()``: sequence-parallel norm-gradient all-reduce over TP, data-parallel gradient
    average, clipping per ``optimizer_config``, then the inner optimizer's step.
    ``grad_norm`` holds the last norm (``None`` when clipping is off).

    With ``overlap_grad_sync`` (default: on when DP > 1, no pipeline, not XLA) the DP all-reduce
    runs during backward, bucket by bucket (:mod:`nxd_core_parallel.dp_overlap`); ``step`` then
    only averages what backward did not (unused parameters, SP-tagged ones, grads under
    ``NxDModel.no_sync``). ``overlap_grad_sync=False`` does it all in ``step`` after backward.
    ``context``: the parallel context whose groups it syncs over (the current one when left out)."""

    def __init__(self, optimizer: torch.optim.Optimizer, nxd_config: Mapping[str, Any] | None,
                 overlap_grad_sync: bool | None = None,
                 bucket_cap_bytes: int = dp_overlap.OVERLAP_BUCKET_CAP_BYTES, *,
                 context: ParallelContext | None = None) -> None:
        super().__init__(optimizer, nxd_config)
        nxd_config = self.nxd_config
        self.context = context = resolve_context(context)
        self._reducer: dp_overlap.OverlappedGradReducer | None = None
        possible = _overlap_possible(nxd_config, context)
        if overlap_grad_sync and not possible:
            raise ValueError("overlap_grad_sync=True needs initialized model parallelism with data_parallel_size > 1, "
                             "no pipeline parallelism and a non-XLA backend")
        if overlap_grad_sync is None:
            overlap_grad_sync = possible
        if overlap_grad_sync:
            sp = nxd_config.sequence_parallel
            # SP-tagged grads keep the after-backward order (TP sum, then DP average) in step().
            # SP-tagged and expert-parallel grads are reduced in step() (expert ones over their own group)
            params = [p for p in self._params() if not (sp and getattr(p, "sequence_parallel_enabled", False))
                      and not is_expert_parallel(p)]
            self._reducer = dp_overlap.OverlappedGradReducer(
                params, gradient_reduction_group(context), bucket_cap_bytes=bucket_cap_bytes,
                first_bucket_cap_bytes=min(dp_overlap.FIRST_BUCKET_CAP_BYTES, bucket_cap_bytes))

    @property
    def overlap_grad_sync(self) -> bool:
        """Whether the DP all-reduce overlaps backward."""
        return self._reducer is not None

    def disable_overlap_grad_sync(self) -> None:
        """Remove the backward hooks; ``step`` then does the whole DP average after backward."""
        if self._reducer is not None:
            self._reducer.remove()
            self._reducer = None

    def sync_gradients(self) -> None:
        """The collectives ``step`` does before clipping (exposed for tests and custom loops).
        With overlap, gradients backward already averaged are not averaged again."""
        params = self._params()
        if self.nxd_config.sequence_parallel:
            allreduce_sequence_parallel_gradients(params, context=self.context)
        allreduce_expert_parallel_gradients(params, context=self.context)
        params = [p for p in params if not is_expert_parallel(p)]
        if self.context is not None and self.context.dp.size * self.context.cp.size > 1:
            if self._reducer is None:
                bucket_allreduce_gradients([p.grad for p in params if p.grad is not None], context=self.context)
            else:
                pending = self._reducer.unreduced(params)
                bucket_allreduce_gradients([p.grad for p in pending], context=self.context)
                self._reducer.mark_reduced(pending)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm(self._params(), max_norm, context=self.context)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        if self._reducer is not None:
            self._reducer.reset()

    def state_dict(self) -> dict:
        """The inner optimizer's state dict, with expert-parallel parameters' state gathered over
        their EP group (then every rank must call it, as nxd-ckpt's save does), so it holds every
        expert and loads at any EP degree."""
        return gather_expert_state(self.optimizer.state_dict(), self._params())

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(slice_expert_state(state_dict, self._params()))

