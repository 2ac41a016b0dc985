"""``neuronx_distributed.modules.moe.model``: NxD's ``MoE(router, expert_mlps, ...)`` on nxd-moe's
``MoELayer`` (dispatch, capacity, TP/SP/EP collectives). ``forward(hidden_states)`` returns
``(output,)`` plus ``router_logits`` ``[T, E]`` with ``return_router_logits`` (rows batch-major:
the load-balancing loss does not depend on their order) and ``expert_index`` ``[T, top_k]`` (the
same rows) with ``return_expert_index``, as NxD's.

As NxD's: ``rmsnorm`` (any module) normalises the hidden states first; ``shared_experts``
(:class:`SharedExperts`) sees every token and its partial output joins the routed experts' before
the layer's one TP reduction (reduce-scatter under sequence parallelism)."""

from typing import Any

import torch

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.model", "nxd-moe")

import nxd_moe  # noqa: E402
from neuronx_distributed.modules.moe import token_shuffling  # noqa: E402
from neuronx_distributed.modules.moe.expert_mlps import ExpertMLPs  # noqa: E402
from neuronx_distributed.modules.moe.shared_experts import SharedExperts  # noqa: E402
from nxd_compat.surface import NotProvidedError  # noqa: E402
from nxd_moe.routing import expert_affinities  # noqa: E402

__all__ = ["MoE"]


class MoE(torch.nn.Module):
    def __init__(self, router: nxd_moe.RouterTopK, expert_mlps: ExpertMLPs, shared_experts: SharedExperts | None = None,
                 rmsnorm: torch.nn.Module | None = None, sequence_parallel_enabled: bool = False, sequence_dimension: int | None = None,
                 return_router_logits: bool = False, return_expert_index: bool = False,
                 token_shuffle_group_size: int = 1, token_shuffle_seed: Any = None,
                 tensor_model_parallel_group: Any = None, init_tkg_module: bool = False, tkg_config: Any = None) -> None:
        super().__init__()
        if init_tkg_module:
            raise NotProvidedError("neuronx_distributed.modules.moe.MoE(init_tkg_module=True) is not provided by "
                                   "nxd-compat: it builds NxD's fused token-generation kernel module (inference)")
        if not isinstance(expert_mlps, ExpertMLPs):
            raise TypeError("MoE(expert_mlps=...) takes neuronx_distributed.modules.moe.ExpertMLPs")
        if shared_experts is not None and not isinstance(shared_experts, SharedExperts):
            raise TypeError("MoE(shared_experts=...) takes neuronx_distributed.modules.moe.shared_experts.SharedExperts")
        self.router, self.expert_mlps = router, expert_mlps
        self.shared_experts, self.rmsnorm = shared_experts, rmsnorm
        self.return_expert_index = return_expert_index
        self.sequence_parallel_enabled = sequence_parallel_enabled
        self.sequence_dimension = sequence_dimension if sequence_dimension is not None else (
            0 if sequence_parallel_enabled else 1)
        self.return_router_logits = return_router_logits
        self.token_shuffle_group_size, self.token_shuffle_seed = token_shuffle_group_size, token_shuffle_seed
        self.shuffle_permutation = None  # kept when a seed is given (NxD keeps it for debugging)
        if token_shuffle_group_size > 1:
            token_shuffling.initialize_token_shuffle_group(token_shuffle_group_size)
        algorithm = "sinkhorn" if isinstance(router, nxd_moe.RouterSinkhorn) else "top_k"
        config = nxd_moe.MoEConfig(num_experts=router.num_experts, top_k=router.top_k,
                                   capacity_factor=expert_mlps.capacity_factor, dropless=expert_mlps.capacity_factor is None,
                                   routing_algorithm=algorithm,
                                   router_activation=router.activation,
                                   normalize_top_k_affinities=expert_mlps.normalize_top_k_affinities)
        # nxd-moe's layer runs the routing and dispatch; it is built empty (meta) and given this
        # module's router and experts, which stay registered here under NxD's attribute names
        layer = nxd_moe.MoELayer(config, expert_mlps.hidden_size, expert_mlps.intermediate_size,
                                 sequence_parallel=sequence_parallel_enabled, device="meta")
        layer.router, layer.experts = router, expert_mlps.experts
        if shared_experts is not None:
            # nxd-moe's layer adds shared_experts(tokens, counts) to the routed output before its TP
            # reduction; its tokens are already in the TP region, so NxD's weights apply locally
            layer.shared_experts = _LocalSharedExperts(shared_experts)
        if sequence_parallel_enabled and torch.distributed.is_initialized():
            from nxd_core_parallel import parallel_state

            if parallel_state.get_tensor_model_parallel_size() > 1:
                router.weight.sequence_parallel_enabled = True  # partial over TP: summed by the optimizer
        object.__setattr__(self, "_layer", layer)  # not a submodule: its parameters are the two above

    def forward(self, hidden_states: torch.Tensor, padding_mask: Any = None, is_speculative_decoding: bool = False,
                residual: Any = None) -> tuple[torch.Tensor, ...]:
        if padding_mask is not None or residual is not None:
            raise NotProvidedError("MoE.forward(padding_mask / residual) is not provided by nxd-compat")
        if self.rmsnorm is not None:
            hidden_states = self.rmsnorm(hidden_states)
        self._layer.train(self.training)
        self._layer.experts = self.expert_mlps.experts  # views of the parameters as they are now
        if self.token_shuffle_group_size > 1:
            token_shuffling.initialize_token_shuffle_group(self.token_shuffle_group_size)  # this MoE's group
            hidden_states, permutation = token_shuffling.token_shuffle(hidden_states, seed=self.token_shuffle_seed)
            if self.token_shuffle_seed is not None:
                self.shuffle_permutation = permutation
        seq_first = self.sequence_dimension == 0
        x = hidden_states.transpose(0, 1) if seq_first else hidden_states
        out, router_logits = self._layer(x)
        out = out.transpose(0, 1) if seq_first else out
        if self.token_shuffle_group_size > 1:
            out = token_shuffling.token_unshuffle(out, permutation)
        outputs = (out, router_logits) if self.return_router_logits else (out,)
        if self.return_expert_index:
            with torch.no_grad():  # the experts the layer chose: the router's choice from these logits
                logits = router_logits.detach()
                outputs += (self.router.choose(expert_affinities(logits, self.router.activation), logits),)
        return outputs


class _LocalSharedExperts(torch.nn.Module):
    """``SharedExperts`` called as nxd-moe's layer calls its shared experts."""

    def __init__(self, shared_experts: SharedExperts) -> None:
        super().__init__()
        object.__setattr__(self, "shared", shared_experts)  # registered once, under MoE.shared_experts

    def forward(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return self.shared.local_output(tokens)
