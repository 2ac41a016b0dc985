"""Llama model configuration: Hugging Face ``config.json`` keys in, validated dataclass out."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from nxd.errors import ConfigError
from nxd_modeling.rotary import ROPE_TYPES, rope_type_of, validate_rope_scaling
from nxd_tensor_parallel.fused_kernels import validate_fused_kernels

__all__ = ["ROPE_TYPES", "LlamaConfig", "config_from_dict"]

#: nxd / Megatron-style spellings accepted next to Hugging Face's names.
_ALIASES = {
    "num_layers": "num_hidden_layers",
    "num_kv_heads": "num_key_value_heads",
    "ffn_hidden_size": "intermediate_size",
    "layernorm_epsilon": "rms_norm_eps",
    "share_embeddings_and_output_weights": "tie_word_embeddings",
    "max_sequence_length": "max_position_embeddings",
    "position_freq_base": "rope_theta",
}

#: Hugging Face keys that carry no information for the model (accepted and dropped).
_IGNORED = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "pretraining_tp", "attention_dropout", "hidden_dropout", "bos_token_id",
    "eos_token_id", "pad_token_id", "_name_or_path", "output_attentions", "output_hidden_states",
    "return_dict", "tokenizer_class", "auto_map", "quantization_config", "id2label", "label2id",
    "attn_implementation", "kv_size_multiplier",
}


@dataclass
class LlamaConfig:
    """Shape and numerics of one Llama model (field names are Hugging Face's)."""

    #: the family whose config this is, as messages name it (each family's config class sets its own)
    FAMILY = "llama"

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    #: ``None`` (plain RoPE) or a dict with ``rope_type`` in :data:`ROPE_TYPES` and its parameters
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    #: parameter dtype name ("float32", "bfloat16", "float16")
    dtype: str = "float32"
    #: ops run by fused GPU kernels (nxd_tensor_parallel.fused_kernels.FUSED_KERNEL_OPS); not part of
    #: the model's function, so never written to config.json
    fused_kernels: tuple[str, ...] = ()
    #: RMSNorm of each query and key head before RoPE (Qwen3's ``q_norm``/``k_norm``; no HF Llama key)
    qk_norm: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}), or head_dim must be given"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.validate()

    def validate(self) -> None:
        family = self.FAMILY
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{family} config: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{family} config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"{family} config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.hidden_act != "silu":
            raise ConfigError(f"{family} config: hidden_act must be 'silu' (SwiGLU), got {self.hidden_act!r}")
        self.fused_kernels = validate_fused_kernels(self.fused_kernels, f"{family} config: fused_kernels")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"{family} config: dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        validate_rope_scaling(self.rope_scaling, family)

    @property
    def rope_type(self) -> str:
        return rope_type_of(self.rope_scaling)

    def padded_vocab_size(self, tp: int) -> int:
        """The vocabulary the TP-sharded embedding and LM head hold: padded at its end to a multiple
        of ``tp`` (``pad=True``); the padding never shows in logits, loss or exports."""
        from nxd_tensor_parallel.parallel_layers import get_padding_length

        return self.vocab_size + get_padding_length(self.vocab_size, tp)

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        """Accept a Hugging Face ``config.json`` (transformers 4.x ``rope_scaling``/``rope_theta`` or
        5.x ``rope_parameters``), nxd/Megatron aliases, or a dict written by :meth:`to_dict`."""
        if isinstance(data, LlamaConfig):
            return data
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.FAMILY} config must be a dict, got {type(data).__name__}")
        data = dict(data)
        for alias, name in _ALIASES.items():
            if alias in data:
                value = data.pop(alias)
                if name in data and data[name] != value:
                    raise ConfigError(f"{cls.FAMILY} config: {alias}={value!r} conflicts with {name}={data[name]!r}")
                data[name] = value
        rope_params = data.pop("rope_parameters", None)
        if rope_params:
            rope_params = dict(rope_params)
            if "rope_theta" in rope_params:
                data.setdefault("rope_theta", rope_params.pop("rope_theta"))
            if rope_params.get("rope_type", "default") != "default":
                data.setdefault("rope_scaling", rope_params)
        if isinstance(data.get("rope_scaling"), dict) and rope_type_of(data["rope_scaling"]) == "default":
            data["rope_scaling"] = None
        if "torch_dtype" in data and "dtype" not in data:
            data["dtype"] = data["torch_dtype"]
        if data.get("dtype") is None or data.get("dtype") not in ("float32", "bfloat16", "float16"):
            data.pop("dtype", None)  # HF checkpoints record their storage dtype; we train in fp32 unless asked
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and k not in _IGNORED}
        # null means absent (Mistral v0.2+ config.json writes sliding_window: null)
        unknown_structural = [k for k in extra if k in ("num_experts", "sliding_window", "moe") and extra[k] is not None]
        if unknown_structural:
            raise ConfigError(f"{cls.FAMILY} config: keys {unknown_structural} describe a model the {cls.FAMILY!r} "
                              "model does not build")
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        return out

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` that transformers 4.x and 5.x ``LlamaForCausalLM`` both read. The keys
        the source config held that no field reads (``extra``) are carried through as they came, so
        an import/export round trip keeps the file's fields; every family's export starts here."""
        out = {
            **self.extra,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": self.hidden_act,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": self.dtype,
        }
        return out


def config_from_dict(data: dict[str, Any]) -> LlamaConfig:
    """The ModelSpec entry: a preset name is not accepted here (see :data:`PRESETS`)."""
    return LlamaConfig.from_dict(data)
