"""NxD's own router base and DeepSeek-V3 group-limited router (``modules.moe.routing``), in
NxD's torch: ``RouterBase`` for routers subclassed from NxD's, ``GroupLimitedRouter`` for NxD's
DeepSeek-V3 models. nxd-compat's ``RouterTopK`` / ``RouterSinkhorn`` are nxd-moe's routers instead."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from nxd_core_parallel import parallel_state
from nxd_tensor_parallel.parallel_layers.mappings import gather_from_sequence_parallel_region

_CPU = torch.device("cpu")  # NxD's default device


class RouterBase(torch.nn.Module, ABC):
    """NxD's router base: a ``linear_router`` ``[E, H]`` (optional bias), router logits gathered
    over sequence parallelism in training, activation in fp64; subclasses define ``forward``
    returning ``(router_logits, expert_affinities, expert_index)``."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, act_fn: str, sequence_parallel_enabled: bool,
                 sequence_dimension: int | None, dtype: torch.dtype, device: torch.device, bias: bool = False,
                 tensor_model_parallel_group: ProcessGroup | None = None, jitter_eps: float = 0.0,
                 store_transposed_weights: bool = False, apply_act_fn_over_topk: bool = False) -> None:
        super().__init__()
        self.num_experts = num_experts
        if not (0 < top_k <= num_experts):
            raise ValueError(f"Invalid top_k={top_k} for num_experts={num_experts}")
        self.top_k, self.hidden_size = top_k, hidden_size
        if act_fn not in {"sigmoid", "softmax"}:
            raise ValueError("act_fn must be either 'sigmoid' or 'softmax'")
        self.act_fn = act_fn
        self.sequence_parallel_enabled = sequence_parallel_enabled
        self.sequence_dimension = 0 if sequence_parallel_enabled and sequence_dimension is None else sequence_dimension
        self.dtype, self.device, self.bias, self.jitter_eps = dtype, device, bias, jitter_eps
        self.store_transposed_weights, self.apply_act_fn_over_topk = store_transposed_weights, apply_act_fn_over_topk
        self._tensor_model_parallel_group = tensor_model_parallel_group
        self.linear_router = torch.nn.Linear(hidden_size, num_experts, dtype=dtype, device=device, bias=bias)
        if store_transposed_weights:
            self.weight_T = torch.nn.Parameter(self.linear_router.weight.detach().T.clone())
        self.linear_router.weight.sequence_parallel_enabled = sequence_parallel_enabled

    @property
    def tensor_parallel_group(self) -> ProcessGroup:
        """NxD's group for the SP gather: the world under expert parallelism, else the TP group
        (looked up when first needed, so a router builds before model parallelism is initialised)."""
        if parallel_state.get_expert_model_parallel_size() > 1:
            return torch.distributed.group.WORLD
        return self._tensor_model_parallel_group or parallel_state.get_tensor_model_parallel_group()

    def _if_training_gather_for_sp(self) -> bool:
        return self.sequence_parallel_enabled and self.training

    def get_router_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits ``(T, E)`` of the full sequence (gathered over SP in training)."""
        hidden_states = hidden_states.to(dtype=self.linear_router.weight.dtype)
        if self.jitter_eps != 0.0 and self.training:
            hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(
                1.0 - self.jitter_eps, 1.0 + self.jitter_eps)
        router_logits = self.linear_router(hidden_states)
        if self._if_training_gather_for_sp():
            router_logits = gather_from_sequence_parallel_region(
                router_logits, sequence_dimension=self.sequence_dimension, to_model_parallel=False,
                process_group=self.tensor_parallel_group)
        return router_logits.view(-1, self.num_experts)

    def apply_activation_fn(self, weights: torch.Tensor) -> torch.Tensor:
        # fp64 as NxD: the activation is never auto-downcast to bf16
        if self.act_fn == "sigmoid":
            return torch.sigmoid(weights.to(dtype=torch.float64))
        return F.softmax(weights, dim=1, dtype=torch.float64)

    @abstractmethod
    def forward(self, hidden_states: torch.Tensor) -> Any:
        """``(router_logits (T, E), expert_affinities (T, E), expert_index (T, top_k))``."""

    def preshard_hook(self, model_state_dict: dict[str, Any], prefix: str) -> None:
        if self.store_transposed_weights:
            original_key = prefix.removesuffix("router.weight") + "router.linear_router.weight"
            transposed_key = prefix.removesuffix("router.weight") + "router.weight_T"
            model_state_dict[transposed_key] = model_state_dict[original_key].detach().transpose(0, 1).clone()


class GroupLimitedRouter(RouterBase):
    """NxD's DeepSeek-V3 ``noaux_tc`` routing: sigmoid scores plus ``e_score_correction_bias``
    (NxD never creates it: assign a ``[num_experts]`` tensor, as NxD's models do), the top
    ``topk_group`` groups by their best-two sum, experts outside them filled with 0.0 (NxD's
    choice; DeepSeek's reference uses -inf: they differ only when fewer than ``top_k`` experts of
    the chosen groups have a positive corrected score), then top-k. Returns the full ``(T, E)`` scores as affinities."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, n_group: int, topk_group: int,
                 sequence_parallel_enabled: bool = False, sequence_dimension: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device = _CPU,
                 tensor_model_parallel_group: ProcessGroup | None = None, jitter_eps: float = 0.0) -> None:
        super().__init__(num_experts=num_experts, top_k=top_k, hidden_size=hidden_size, act_fn="sigmoid",
                         sequence_parallel_enabled=sequence_parallel_enabled, sequence_dimension=sequence_dimension,
                         dtype=dtype, device=device, tensor_model_parallel_group=tensor_model_parallel_group,
                         jitter_eps=jitter_eps)
        self.n_group, self.topk_group = n_group, topk_group

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = self.get_router_logits(hidden_states)
        expert_affinities = self.apply_activation_fn(router_logits).to(dtype=hidden_states.dtype)
        topk_idx, expert_weights = self.noaux_tc_top_k(expert_affinities)
        return router_logits, expert_weights, topk_idx.detach().to(dtype=torch.long)

    def noaux_tc_top_k(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bias = getattr(self, "e_score_correction_bias", None)
        if bias is None:
            raise AttributeError("GroupLimitedRouter.e_score_correction_bias is not set: NxD's router never creates "
                                 "it; assign a [num_experts] tensor (e.g. the checkpoint's e_score_correction_bias)")
        batch_size = scores.shape[0]
        scores_for_choice = scores + bias.unsqueeze(0)
        group_scores = self._calculate_group_scores(scores_for_choice, batch_size)
        group_idx = torch.topk(group_scores, k=self.topk_group)[1]
        group_mask = self._create_group_mask(group_scores, group_idx)
        score_mask = self._expand_group_mask(group_mask, batch_size)
        masked_scores = scores_for_choice.masked_fill(~score_mask.bool(), 0.0)
        _, topk_idx = torch.topk(masked_scores, k=self.top_k)
        return topk_idx, scores

    def _calculate_group_scores(self, scores: torch.Tensor, batch_size: int) -> torch.Tensor:
        return torch.topk(scores.view(batch_size, self.n_group, -1), k=2)[0].sum(dim=-1)

    def _create_group_mask(self, group_scores: torch.Tensor, group_idx: torch.Tensor) -> torch.Tensor:
        return torch.scatter(input=torch.zeros_like(group_scores), dim=1, index=group_idx,
                             src=torch.ones_like(group_scores))

    def _expand_group_mask(self, group_mask: torch.Tensor, batch_size: int) -> torch.Tensor:
        return group_mask.unsqueeze(-1).expand(batch_size, self.n_group, self.num_experts // self.n_group).reshape(
            batch_size, -1)
