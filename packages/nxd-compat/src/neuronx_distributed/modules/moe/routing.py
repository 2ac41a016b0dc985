"""``neuronx_distributed.modules.moe.routing``: NxD's routers with NxD's constructor arguments, on
nxd-moe's (one replicated weight ``[num_experts, hidden]``, held as NxD holds it:
``linear_router.weight``; ``forward`` returns ``(router_logits, expert_affinities, expert_index)``
as NxD's). ``RouterBase`` and ``GroupLimitedRouter`` are NxD's own code (``_nxd_routers``); the
two nxd-moe routers are not ``RouterBase`` subclasses."""

from typing import Any

import torch

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.routing", "nxd-moe")

import nxd_moe  # noqa: E402
from neuronx_distributed.modules.moe._nxd_routers import GroupLimitedRouter, RouterBase  # noqa: E402
from nxd_compat.surface import NotProvidedError  # noqa: E402

__all__ = ["GroupLimitedRouter", "RouterBase", "RouterSinkhorn", "RouterTopK"]


def _refuse(router: str, **options: Any) -> None:
    for name, value in options.items():
        if value:
            raise NotProvidedError(f"neuronx_distributed.modules.moe.{router}({name}={value!r}) is not provided by "
                                   "nxd-compat (nxd-moe's router is one bias-free linear layer, replicated over TP)")


class _NxDRouter:
    """NxD's router options nxd-moe's routers do not take: the sequence layout (kept for ``MoE``)
    and ``jitter_eps`` (training multiplies the hidden states by uniform noise in [1-eps, 1+eps])."""

    sequence_parallel_enabled: bool = False
    sequence_dimension: int | None = None
    jitter_eps: float = 0.0

    def _hold_weight_as_nxd(self) -> None:
        """Move nxd-moe's ``weight`` parameter into ``linear_router`` (NxD's ``torch.nn.Linear``,
        bias-free), so the router's state-dict name is NxD's; ``weight`` reads it from there."""
        weight = self._parameters.pop("weight")
        self.linear_router = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        self.linear_router.weight = weight

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.linear_router.weight

    def logits_and_probs(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.training and self.jitter_eps:
            noise = torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_eps, 1.0 + self.jitter_eps)
            hidden_states = hidden_states * noise
        return super().logits_and_probs(hidden_states)  # type: ignore[misc]


class RouterTopK(_NxDRouter, nxd_moe.RouterTopK):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, sequence_parallel_enabled: bool = False,
                 sequence_dimension: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None, bias: bool = False,
                 tensor_model_parallel_group: Any = None, act_fn: str = "softmax",
                 apply_act_fn_over_topk: bool = False, jitter_eps: float = 0.0,
                 store_transposed_weights: bool = False) -> None:
        _refuse("RouterTopK", bias=bias, apply_act_fn_over_topk=apply_act_fn_over_topk,
                store_transposed_weights=store_transposed_weights)
        super().__init__(num_experts, top_k, hidden_size, dtype=dtype, device=device, activation=act_fn)
        self._hold_weight_as_nxd()
        self.sequence_parallel_enabled, self.sequence_dimension = sequence_parallel_enabled, sequence_dimension
        self.jitter_eps = float(jitter_eps)


class RouterSinkhorn(_NxDRouter, nxd_moe.RouterSinkhorn):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, act_fn: str = "sigmoid",
                 sequence_parallel_enabled: bool = False, sequence_dimension: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | None = None,
                 sinkhorn_iterations: int | None = None, sinkhorn_tol: float | None = None) -> None:
        super().__init__(num_experts, top_k, hidden_size, sinkhorn_iterations=sinkhorn_iterations or 30,
                         sinkhorn_tol=sinkhorn_tol, dtype=dtype, device=device, activation=act_fn)
        self._hold_weight_as_nxd()
        self.sequence_parallel_enabled, self.sequence_dimension = sequence_parallel_enabled, sequence_dimension

