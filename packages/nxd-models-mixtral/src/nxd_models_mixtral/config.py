"""Mixtral configuration: Hugging Face ``MixtralConfig`` keys (plus NxDT's ``moe`` section) in."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nxd.errors import ConfigError
from nxd_models_llama import LlamaConfig
from nxd_models_llama.hf_mapping import Piece, hf_shapes, plan_for
from nxd_moe import MoEConfig

#: NxDT ``model.moe`` keys that restate a Hugging Face field (the HF name wins when both are given).
_MOE_TO_HF = {"num_experts": "num_local_experts", "top_k": "num_experts_per_tok",
              "router_aux_loss_coef": "router_aux_loss_coef", "output_router_logits": "output_router_logits"}


@dataclass
class MixtralConfig(LlamaConfig):
    """A Llama-style decoder whose MLPs are sparse MoE blocks (field names are Hugging Face's).

    ``moe`` holds nxd-moe's routing settings beyond HF's (``capacity_factor``, ``dropless``,
    ``routing_algorithm``, ...; NxDT's ``model.moe`` keys). HF's Mixtral is dropless top-k with
    renormalised affinities, which is the default here."""

    FAMILY = "mixtral"

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: int | None = None
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False
    router_jitter_noise: float = 0.0
    moe: dict[str, Any] = field(default_factory=dict)
    #: Megatron's ``scaled_init_method_normal`` (NxDT ``model.use_scaled_init_method``): output
    #: projections (attention ``o_proj``, experts' ``down_proj``) start with std
    #: ``initializer_range / sqrt(2 * num_hidden_layers)``
    use_scaled_init_method: bool = False
    #: Megatron's vocabulary padding (NxDT ``model.make_vocab_size_divisible_by``): embedding and LM
    #: head rows padded to a multiple of this x TP, hidden from logits, loss and HF export.
    #: ``None``: no padding (the vocabulary must then divide by TP)
    make_vocab_size_divisible_by: int | None = None

    #: the MoE block's module name (nxd and HF) and HF's per-expert (gate, up, down) tensor names;
    #: families built on this model (nxd-models-qwen3) name theirs as their checkpoints do
    MOE_MODULE = "block_sparse_moe"
    HF_EXPERT_NAMES = ("w1", "w3", "w2")

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` has a MoE block (every Mixtral layer does)."""
        return True

    @property
    def expert_intermediate_size(self) -> int:
        return self.intermediate_size

    @property
    def shared_expert_intermediate_size(self) -> int:
        """The shared experts' intermediate sizes together (0: none; DeepSeek-V3 has them)."""
        return 0

    def hf_pieces(self, name: str, tp: int, rank: int, multiplier: int) -> list[Piece]:
        """Where a non-expert parameter's shard comes from in the HF checkpoint: Llama's layout (a
        family with another attention, such as DeepSeek's MLA, gives its own)."""
        return plan_for(name, self, tp, rank, multiplier)

    def hf_base_shapes(self, dense_mlp: bool) -> dict[str, tuple[int, ...]]:
        """The HF tensors besides the MoE blocks (with every layer's dense MLP when ``dense_mlp``)."""
        return hf_shapes(self, dense_mlp=dense_mlp)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    def validate(self) -> None:
        super().validate()
        if self.router_jitter_noise:
            raise ConfigError(f"{self.FAMILY} config: router_jitter_noise={self.router_jitter_noise} is not implemented "
                              "(only 0.0, the Mixtral default)")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ConfigError(f"{self.FAMILY} config: sliding_window must be a positive integer or null, "
                              f"got {self.sliding_window!r}")
        if self.attention_bias or self.mlp_bias:
            raise ConfigError(f"{self.FAMILY} config: attention_bias/mlp_bias are not part of Mixtral")
        m = self.make_vocab_size_divisible_by
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ConfigError(f"{self.FAMILY} config: make_vocab_size_divisible_by must be a positive integer or null, got {m!r}")
        if not isinstance(self.use_scaled_init_method, bool):
            raise ConfigError(f"{self.FAMILY} config: use_scaled_init_method must be true or false, "
                              f"got {self.use_scaled_init_method!r}")
        self.moe_config()  # validates the moe section

    def padded_vocab_size(self, tp: int) -> int:
        """Rows of the embedding and LM head at TP degree ``tp`` (the vocabulary when not padded)."""
        if self.make_vocab_size_divisible_by is None:
            return self.vocab_size
        from nxd_tensor_parallel.vocab_padding import padded_vocab_size

        return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tp)

    @property
    def output_init_std(self) -> float:
        """Init std of the output projections (scaled when ``use_scaled_init_method``)."""
        if not self.use_scaled_init_method:
            return self.initializer_range
        return self.initializer_range / math.sqrt(2.0 * self.num_hidden_layers)

    def moe_config(self) -> MoEConfig:
        """nxd-moe settings: HF's expert count/top-k/aux-loss fields plus the ``moe`` section."""
        moe = dict(self.moe or {})
        for key, hf_name in _MOE_TO_HF.items():
            if key in moe and moe[key] != getattr(self, hf_name):
                raise ConfigError(f"{self.FAMILY} config: moe.{key}={moe[key]!r} conflicts with {hf_name}="
                                  f"{getattr(self, hf_name)!r}")
            moe[key] = getattr(self, hf_name)
        moe.setdefault("dropless", moe.get("capacity_factor") is None)
        if moe.get("frequency", 1) != 1:
            raise ConfigError(f"{self.FAMILY} config: moe.frequency={moe['frequency']} is not supported: every Mixtral "
                              "layer is a MoE layer (frequency 1)")
        return MoEConfig.from_dict(moe)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MixtralConfig:
        if isinstance(data, MixtralConfig):
            return data
        if isinstance(data, dict):
            data = dict(data)
            moe = dict(data.get("moe") or {})
            for key, hf_name in _MOE_TO_HF.items():
                # NxDT's model.moe values override the HF config.json it points at (as NxDT's Mixtral does)
                if key in moe:
                    data[hf_name] = moe[key]
            data["moe"] = moe
        return super().from_dict(data)  # type: ignore[return-value]

    def to_hf_dict(self) -> dict[str, Any]:
        out = super().to_hf_dict()
        for key in ("attention_bias", "mlp_bias"):  # validated false; HF's Mixtral has neither
            out.pop(key, None)
        out.update({
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "sliding_window": self.sliding_window,
            "num_local_experts": self.num_local_experts, "num_experts_per_tok": self.num_experts_per_tok,
            "router_aux_loss_coef": self.router_aux_loss_coef, "output_router_logits": self.output_router_logits,
            "router_jitter_noise": self.router_jitter_noise,
        })
        return out
