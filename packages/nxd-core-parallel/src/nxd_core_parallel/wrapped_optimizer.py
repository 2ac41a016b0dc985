"""``WrappedOptimizer``: what nxd's data-parallel optimizer wrappers share (``NxDOptimizer`` here,
``FSDPOptimizer`` in nxd-fsdp).

The inner optimizer owns the parameter groups, the state and the defaults; the wrapper runs what a
parallel step adds around the inner step: the gradient collectives (``sync_gradients``) and
clipping by the whole model's norm (``clip_grad_norm``), as ``optimizer_config`` asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from nxd.resolved import NxdConfig


def _inner(name: str) -> property:
    """The inner optimizer's attribute ``name``, read and written through the wrapper."""
    return property(lambda self: getattr(self.optimizer, name),
                    lambda self, value: setattr(self.optimizer, name, value))


class WrappedOptimizer(torch.optim.Optimizer):
    """``step()``: :meth:`sync_gradients`, then :meth:`clip_grad_norm` when
    ``optimizer_config.grad_clipping`` is on (the norm before clipping is kept in ``grad_norm``),
    then the inner optimizer's step. Subclasses implement those two methods."""

    def __init__(self, optimizer: torch.optim.Optimizer, nxd_config: Mapping[str, Any] | None) -> None:
        # Optimizer.__init__ is not called on purpose: the inner optimizer owns groups and state.
        self.optimizer = optimizer
        self.nxd_config = NxdConfig.of(nxd_config)
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
        opt = self.nxd_config.optimizer
        if opt.grad_clipping:
            self.grad_norm = self.clip_grad_norm(opt.max_grad_norm)
        return self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"
