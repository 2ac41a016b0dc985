"""MoE settings: NxDT's ``model.moe`` keys in, a validated dataclass out."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from nxd.errors import ConfigError

#: Routing algorithms (NxDT ``model.moe.routing_algorithm``).
ROUTING_ALGORITHMS = ("top_k", "sinkhorn")
#: How router logits become expert affinities (NxDT ``model.moe.router_activation``; NxD's ``act_fn``).
ROUTER_ACTIVATIONS = ("softmax", "sigmoid")


@dataclass
class MoEConfig:
    """One MoE layer's routing and expert settings (NxDT's ``model.moe`` names)."""

    num_experts: int = 8
    top_k: int = 2
    #: ``None`` or ``dropless=True``: no token is dropped. Otherwise each expert takes at most
    #: ``ceil(tokens * top_k * capacity_factor / num_experts)`` tokens of this rank's batch.
    capacity_factor: float | None = None
    dropless: bool = False
    routing_algorithm: str = "top_k"
    #: ``softmax`` over experts (Mixtral), or an independent ``sigmoid`` per expert (NxD's ``act_fn``)
    router_activation: str = "softmax"
    #: every ``frequency``-th layer is MoE (NxDT ``moe.frequency``; 1 = all layers)
    frequency: int = 1
    #: dropout on the expert output (NxDT ``moe.dropout``); only 0.0 is implemented
    dropout: float = 0.0
    #: renormalise the chosen experts' affinities to sum to 1 (Mixtral does)
    normalize_top_k_affinities: bool = True
    output_router_logits: bool = True
    router_aux_loss_coef: float = 0.02
    router_z_loss_coef: float = 0.0
    sinkhorn_iterations: int = 30
    #: stop the Sinkhorn iterations early once the mean change of the column scaling is below this
    #: (Megatron's error measure); ``None``: always ``sinkhorn_iterations``
    sinkhorn_tol: float | None = None
    #: group-limited top-k (DeepSeek-V3): experts form ``n_group`` equal groups, each token first keeps
    #: the ``topk_group`` groups whose two best scores sum highest, then picks ``top_k`` experts in them
    n_group: int = 1
    topk_group: int = 1
    #: multiplies the chosen affinities after the optional renormalisation (DeepSeek-V3: 2.5)
    routed_scaling_factor: float = 1.0
    #: aux-loss-free balancing (DeepSeek-V3 paper, section 2.1.2): a per-expert bias added to the
    #: affinities for the choice only, moved by ``bias_update_rate`` against each expert's load after
    #: every optimizer step (:mod:`nxd_moe.balancer`)
    expert_bias: bool = False
    bias_update_rate: float = 0.001
    #: DeepSeek-V3's complementary sequence-wise balance loss weight (alpha); 0 = off
    seq_aux_loss_coef: float = 0.0
    #: expert matmuls: ``auto`` = ``torch._grouped_mm`` on CUDA where it runs fast, the per-expert
    #: loop elsewhere; ``grouped`` always the grouped GEMM; ``loop`` always the loop
    grouped_gemm: str = "auto"

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "frequency", "sinkhorn_iterations", "n_group", "topk_group"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "sinkhorn_iterations" else 1):
                raise ConfigError(f"moe.{name} must be a positive integer, got {value!r}")
        if self.dropout != 0.0:
            raise ConfigError(f"moe.dropout={self.dropout!r} is not implemented by nxd-moe (only 0.0); "
                              "NxDT's Mixtral configs use 0.0")
        if self.top_k > self.num_experts:
            raise ConfigError(f"moe.top_k ({self.top_k}) must be <= moe.num_experts ({self.num_experts})")
        if self.routing_algorithm not in ROUTING_ALGORITHMS:
            raise ConfigError(f"moe.routing_algorithm must be one of {list(ROUTING_ALGORITHMS)}, "
                              f"got {self.routing_algorithm!r}")
        if self.router_activation not in ROUTER_ACTIVATIONS:
            raise ConfigError(f"moe.router_activation must be one of {list(ROUTER_ACTIVATIONS)}, "
                              f"got {self.router_activation!r}")
        if self.sinkhorn_tol in ("None", "none", "null"):  # NxDT's YAML writes `sinkhorn_tol: None` (a string)
            self.sinkhorn_tol = None
        if self.sinkhorn_tol is not None and (isinstance(self.sinkhorn_tol, bool)
                                              or not isinstance(self.sinkhorn_tol, (int, float)) or self.sinkhorn_tol < 0):
            raise ConfigError(f"moe.sinkhorn_tol must be a non-negative number or null, got {self.sinkhorn_tol!r}")
        if self.routing_algorithm == "sinkhorn" and self.top_k != 1:
            raise ConfigError(f"moe.routing_algorithm 'sinkhorn' routes top-1 only (as NxD); got top_k={self.top_k}")
        if self.capacity_factor is not None and not self.dropless:
            if isinstance(self.capacity_factor, bool) or not isinstance(self.capacity_factor, (int, float)) \
                    or self.capacity_factor <= 0:
                raise ConfigError(f"moe.capacity_factor must be a positive number or null, got {self.capacity_factor!r}")
            self.capacity_factor = float(self.capacity_factor)
        if not self.dropless and self.capacity_factor is None:
            raise ConfigError("moe.dropless=false needs moe.capacity_factor (how many tokens each expert may take)")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise ConfigError(f"moe.n_group ({self.n_group}) must divide moe.num_experts ({self.num_experts}) and be "
                              f">= moe.topk_group ({self.topk_group})")
        if self.n_group > 1 and self.top_k > self.topk_group * (self.num_experts // self.n_group):
            raise ConfigError(f"moe.top_k ({self.top_k}) exceeds the experts of moe.topk_group={self.topk_group} groups")
        if self.grouped_gemm not in ("auto", "grouped", "loop"):
            raise ConfigError(f"moe.grouped_gemm must be 'auto', 'grouped' or 'loop', got {self.grouped_gemm!r}")
        if self.expert_bias and self.routing_algorithm != "top_k":
            raise ConfigError("moe.expert_bias (aux-loss-free balancing) needs moe.routing_algorithm 'top_k'")
        if self.top_k == 1 and self.normalize_top_k_affinities:
            self.normalize_top_k_affinities = False  # one affinity renormalised would always be 1

    @property
    def effective_capacity_factor(self) -> float | None:
        """``None`` when no token can be dropped (dropless, or a factor so large every token fits)."""
        if self.dropless or self.capacity_factor is None or self.capacity_factor >= self.num_experts / self.top_k:
            return None
        return self.capacity_factor

    @classmethod
    def from_dict(cls, data: dict[str, Any] | MoEConfig) -> MoEConfig:
        """NxDT ``model.moe`` keys (unknown keys are an error naming them)."""
        if isinstance(data, MoEConfig):
            return data
        if not isinstance(data, dict):
            raise ConfigError(f"moe config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"moe: unknown keys {unknown}; valid: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
