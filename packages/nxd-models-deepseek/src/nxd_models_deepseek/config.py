"""DeepSeek-V3 configuration: Hugging Face ``DeepseekV3Config`` keys in.

A Mixtral-shaped MoE decoder (nxd-models-mixtral) with multi-head latent attention, dense first
layers (``first_k_dense_replace``), routed + shared experts of ``moe_intermediate_size``, sigmoid
scores with group-limited top-k, ``routed_scaling_factor`` and aux-loss-free balancing (nxd-moe).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nxd.errors import ConfigError
from nxd_modeling.hf_pipeline import Piece
from nxd_models_llama.hf_mapping import hf_shapes, plan_for
from nxd_models_mixtral import MixtralConfig
from nxd_moe import MoEConfig

#: keys of DeepSeek's own config.json (trust_remote_code) and the only values nxd builds
_REMOTE_CODE_KEYS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


@dataclass
class DeepseekV3Config(MixtralConfig):
    """Field names are Hugging Face's (HF's ``n_routed_experts`` is ``num_local_experts`` here;
    ``head_dim`` is the RoPE part of a head, ``qk_rope_head_dim``, as HF sets it)."""

    FAMILY = "deepseek_v3"
    MOE_MODULE = "mlp"
    HF_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")

    rms_norm_eps: float = 1e-6
    # -- experts: fine-grained routed ones of this size, plus n_shared_experts every token passes;
    # the first layers keep a dense MLP of intermediate_size
    moe_intermediate_size: int = 2048
    n_shared_experts: int = 1
    first_k_dense_replace: int = 3

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_k_dense_replace

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size

    @property
    def shared_expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size * self.n_shared_experts

    # -- routing: sigmoid scores; the best topk_group of n_group expert groups; the chosen scores
    # renormalised (norm_topk_prob), then scaled
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True

    def moe_config(self) -> MoEConfig:
        """Sigmoid scores, group-limited top-k, renormalised and scaled weights, expert bias."""
        return dataclasses.replace(
            super().moe_config(), router_activation="sigmoid", n_group=self.n_group, topk_group=self.topk_group,
            routed_scaling_factor=self.routed_scaling_factor, normalize_top_k_affinities=self.norm_topk_prob,
            expert_bias=True, bias_update_rate=self.bias_update_rate, seq_aux_loss_coef=self.seq_aux_loss_coef)

    # -- multi-head latent attention: low-rank q (None: a full q_proj) and kv; per head the keys
    # are [qk_nope_head_dim | qk_rope_head_dim (RoPE; one rotary key shared by all heads)]
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    #: DeepSeek's checkpoints rotate interleaved pairs
    rope_interleave: bool = True
    #: DeepSeek-V3's sequence-wise balance loss weight alpha (0: off, as transformers computes)
    seq_aux_loss_coef: float = 0.0
    #: the expert-bias update speed gamma (the paper: 0.001)
    bias_update_rate: float = 0.001
    #: multi-token prediction modules the checkpoint holds (``model.layers.{num_hidden_layers + k}.*``;
    #: transformers' main model ignores them, and writes 1 whether or not it saved them)
    num_nextn_predict_layers: int = 0
    #: multi-token prediction (DeepSeek-V3 paper, section 2.2): the depth D of MTP modules nxd builds
    #: and trains (0: none); each predicts one more token ahead from the previous depth's hidden
    #: state and the next token's embedding, sharing the embedding and output head
    mtp_depth: int = 0
    #: the MTP loss weight lambda: loss = main + lambda x mean over the D depths (the paper: 0.3, then 0.1)
    mtp_loss_scaling_factor: float = 0.1

    def validate(self) -> None:
        self.head_dim = self.qk_rope_head_dim  # RoPE acts on this part of each head only
        super().validate()
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"deepseek_v3 config: {name} must be a positive integer, got {value!r}")
        if isinstance(self.mtp_depth, bool) or not isinstance(self.mtp_depth, int) or self.mtp_depth < 0:
            raise ConfigError(f"deepseek_v3 config: mtp_depth must be a non-negative integer, got {self.mtp_depth!r}")
        if self.mtp_loss_scaling_factor < 0:
            raise ConfigError("deepseek_v3 config: mtp_loss_scaling_factor must be >= 0, got "
                              f"{self.mtp_loss_scaling_factor!r}")
        if self.num_key_value_heads != self.num_attention_heads:
            raise ConfigError("deepseek_v3 config: multi-head latent attention gives every head its own keys "
                              f"(num_key_value_heads must equal num_attention_heads={self.num_attention_heads})")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeepseekV3Config:
        if isinstance(data, dict):
            data = dict(data)
            for key, value in _REMOTE_CODE_KEYS.items():
                if data.pop(key, value) != value:
                    raise ConfigError(f"deepseek_v3 config: only {key}={value!r} is implemented")
            if "n_routed_experts" in data:
                data.setdefault("num_local_experts", data.pop("n_routed_experts"))
            data.pop("qk_head_dim", None)  # derived
            data.pop("head_dim", None)  # = qk_rope_head_dim
            data.setdefault("num_key_value_heads", data.get("num_attention_heads"))
        return super().from_dict(data)  # type: ignore[return-value]

    def to_hf_dict(self) -> dict[str, Any]:
        out = super().to_hf_dict()
        out.pop("sliding_window", None)
        out.pop("router_jitter_noise", None)
        out.pop("num_local_experts")
        out.update({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **_REMOTE_CODE_KEYS,
                    "n_routed_experts": self.num_local_experts, "qk_head_dim": self.qk_head_dim,
                    **{f.name: getattr(self, f.name) for f in dataclasses.fields(DeepseekV3Config)
                       if f.name in _HF_FIELDS}})
        if self.mtp_depth:  # an export holds the MTP modules nxd trained
            out["num_nextn_predict_layers"] = self.mtp_depth
        return out

    # -- HF checkpoint layout of the attention (nxd-models-mixtral's hf_io asks the config)
    def hf_pieces(self, name: str, tp: int, rank: int, multiplier: int) -> list[Piece]:
        """MLA's projections: the low-rank down projections and their norms replicated, ``q_b_proj``
        (or ``q_proj``) and ``kv_b_proj`` rows and ``o_proj`` columns of this rank's heads (each head's
        rows contiguous in HF's order); everything else as Llama."""
        parts = name.split(".")
        if len(parts) < 5 or parts[3] != "self_attn":
            return plan_for(name, self, tp, rank, multiplier)
        heads = self.num_attention_heads // tp
        per_head = {"q_b_proj": self.qk_head_dim, "q_proj": self.qk_head_dim,
                    "kv_b_proj": self.qk_nope_head_dim + self.v_head_dim, "o_proj": self.v_head_dim}
        module, kind = parts[4], parts[-1]
        if module in per_head and not (module == "o_proj" and kind == "bias"):
            size = heads * per_head[module]
            return [Piece(name, 1 if module == "o_proj" else 0, tuple(range(rank * size, (rank + 1) * size)))]
        return [Piece(name, None)]

    def hf_base_shapes(self, dense_mlp: bool) -> dict[str, tuple[int, ...]]:
        h, n, bias = self.hidden_size, self.num_attention_heads, self.attention_bias
        shapes = {k: v for k, v in hf_shapes(self, dense_mlp=dense_mlp).items() if ".self_attn." not in k}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}.self_attn."
            if self.q_lora_rank:
                shapes.update({p + "q_a_proj.weight": (self.q_lora_rank, h), p + "q_a_layernorm.weight": (self.q_lora_rank,),
                               p + "q_b_proj.weight": (n * self.qk_head_dim, self.q_lora_rank)})
                if bias:
                    shapes[p + "q_a_proj.bias"] = (self.q_lora_rank,)
            else:
                shapes[p + "q_proj.weight"] = (n * self.qk_head_dim, h)
            shapes.update({p + "kv_a_proj_with_mqa.weight": (self.kv_lora_rank + self.qk_rope_head_dim, h),
                           p + "kv_a_layernorm.weight": (self.kv_lora_rank,),
                           p + "kv_b_proj.weight": (n * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
                           p + "o_proj.weight": (h, n * self.v_head_dim)})
            if bias:
                shapes.update({p + "kv_a_proj_with_mqa.bias": (self.kv_lora_rank + self.qk_rope_head_dim,),
                               p + "o_proj.bias": (h,)})
        return shapes


#: DeepSeek's own fields written to config.json
_HF_FIELDS = {"moe_intermediate_size", "n_shared_experts", "n_group", "topk_group", "routed_scaling_factor",
              "norm_topk_prob", "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
              "qk_nope_head_dim", "v_head_dim", "rope_interleave", "num_nextn_predict_layers", "head_dim"}
