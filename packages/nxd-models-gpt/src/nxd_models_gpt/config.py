"""GPT model configuration in Megatron-LM / NeMo / NxDT terms (``normalization``, ``activation``,
``position_embedding_type``, ...), from those keys or from a Hugging Face GPT-2 / GPT-NeoX
``config.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from nxd.errors import ConfigError

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
ACTIVATIONS = ("gelu", "swiglu")
POSITION_EMBEDDINGS = ("learned_absolute", "rope")
BLOCK_TYPES = ("pre_ln", "post_ln")

#: Megatron / NeMo / NxDT spellings accepted next to the field names.
_ALIASES = {
    "num_kv_heads": "num_query_groups",
    "num_key_value_heads": "num_query_groups",
    "rms_norm_eps": "layernorm_epsilon",
    "head_dim": "kv_channels",
    "rotary_base": "rotary_base",
    "position_freq_base": "rotary_base",
    "rotary_emb_base": "rotary_base",
    "rope_theta": "rotary_base",
    "layer_norm_epsilon": "layernorm_epsilon",
    "norm_epsilon": "layernorm_epsilon",
    "add_bias_linear": "has_bias",
    "bias": "has_bias",
    "tie_word_embeddings": "share_embeddings_and_output_weights",
    "untie_embeddings_and_output_weights": None,  # handled in from_dict (inverted)
    "max_sequence_length": "max_position_embeddings",
    "rotary_percent": "rotary_percentage",
    "num_hidden_layers": "num_layers",
    "intermediate_size": "ffn_hidden_size",
    "initializer_range": "init_method_std",
}

#: Keys that configure training, kernels or data, not the model's math (accepted and dropped).
_IGNORED = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "use_cache", "bos_token_id",
    "eos_token_id", "pad_token_id", "_name_or_path", "output_attentions", "output_hidden_states", "return_dict",
    "tokenizer_class", "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
    "encoder_seq_length", "seq_length", "do_layer_norm_weight_decay", "persist_layer_norm",
    "use_cpu_initialization", "fusions", "activations_checkpoint_granularity", "activations_checkpoint_recompute",
    "activations_checkpoint_method", "activations_checkpoint_num_layers", "optim", "bias_activation_fusion",
    "bias_dropout_add_fusion", "masked_softmax_fusion", "gradient_accumulation_fusion", "fp32_residual_connection",
    "attention_softmax_in_fp32", "params_dtype", "padded_vocab_size", "micro_batch_size", "global_batch_size",
    "is_decoder", "classifier_dropout", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "add_cross_attention", "tie_word_embeddings_",
    "scale_attn_weights", "kv_size_multiplier", "attn_implementation", "use_flash_attention",
}

#: Keys describing architectures this plugin does not build: refused, with what would build them.
_REFUSED = {
    "num_moe_experts": "a mixture-of-experts model (pip install nxd-moe)",
    "num_experts": "a mixture-of-experts model (pip install nxd-moe)",
    "moe": "a mixture-of-experts model (pip install nxd-moe)",
    "sliding_window": "sliding-window attention (not implemented by nxd-models-gpt)",
    "window_size": "sliding-window attention (not implemented by nxd-models-gpt)",
}


@dataclass
class GPTConfig:
    """Shape and numerics of one Megatron GPT model (field names are Megatron-LM's)."""

    vocab_size: int = 50257
    #: Megatron pads the vocabulary to a multiple of ``make_vocab_size_divisible_by * TP``; the padded
    #: rows never receive probability (their logits are masked) and HF export drops them.
    make_vocab_size_divisible_by: int = 128
    hidden_size: int = 768
    ffn_hidden_size: int | None = None
    num_layers: int = 12
    num_attention_heads: int = 12
    #: GQA groups (Megatron ``num_query_groups``); ``None``: one per head (MHA)
    num_query_groups: int | None = None
    kv_channels: int | None = None
    max_position_embeddings: int = 1024
    normalization: str = "LayerNorm"
    layernorm_epsilon: float = 1e-5
    activation: str = "gelu"
    #: tanh-approximated GeLU (Megatron ``--openai-gelu``; HF ``gelu_new``)
    openai_gelu: bool = False
    position_embedding_type: str = "learned_absolute"
    rotary_percentage: float = 1.0
    rotary_base: float = 10000.0
    has_bias: bool = True
    share_embeddings_and_output_weights: bool = True
    #: Megatron scales QK^T by 1/layer and the softmax input back by layer (fp16 overflow guard):
    #: the same function; here the softmax runs in fp32, so it changes no number.
    apply_query_key_layer_scaling: bool = False
    use_scaled_init_method: bool = True
    init_method_std: float = 0.02
    transformer_block_type: str = "pre_ln"
    #: GPT-NeoX/GPT-J style ``x + attn(ln1(x)) + mlp(ln2(x))`` (pre-LN only)
    parallel_residual: bool = False
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    ffn_dropout: float = 0.0
    dtype: str = "float32"
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.kv_channels is None:
            if isinstance(self.num_attention_heads, int) and self.num_attention_heads > 0 \
                    and self.hidden_size % self.num_attention_heads:
                raise ConfigError(f"gpt config: hidden_size ({self.hidden_size}) must be divisible by "
                                  f"num_attention_heads ({self.num_attention_heads}), or kv_channels must be given")
            self.kv_channels = self.hidden_size // max(1, self.num_attention_heads)
        self.normalization = _canonical("normalization", self.normalization, NORMALIZATIONS)
        self.activation = _canonical("activation", self.activation, ACTIVATIONS)
        self.position_embedding_type = _canonical("position_embedding_type", self.position_embedding_type,
                                                  POSITION_EMBEDDINGS)
        self.transformer_block_type = _canonical("transformer_block_type", self.transformer_block_type, BLOCK_TYPES)
        self.validate()

    def validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "ffn_hidden_size", "num_layers", "num_attention_heads",
                     "num_query_groups", "kv_channels", "max_position_embeddings", "make_vocab_size_divisible_by"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"gpt config: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_query_groups:
            raise ConfigError(f"gpt config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                              f"num_query_groups ({self.num_query_groups})")
        if not 0.0 < float(self.rotary_percentage) <= 1.0:
            raise ConfigError(f"gpt config: rotary_percentage must be in (0, 1], got {self.rotary_percentage!r}")
        if self.position_embedding_type == "rope" and self.rotary_dim % 2:
            raise ConfigError(f"gpt config: kv_channels x rotary_percentage = {self.rotary_dim} must be even for RoPE")
        if self.parallel_residual and self.transformer_block_type != "pre_ln":
            raise ConfigError("gpt config: parallel_residual needs transformer_block_type 'pre_ln'")
        for name in ("hidden_dropout", "attention_dropout", "ffn_dropout"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ConfigError(f"gpt config: {name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"gpt config: dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

    @property
    def rotary_dim(self) -> int:
        return int(self.kv_channels * float(self.rotary_percentage))

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    def padded_vocab_size(self, tp: int) -> int:
        """Megatron's padding: the vocabulary rounded up to a multiple of ``make_vocab_size_divisible_by * tp``."""
        from nxd_tensor_parallel.vocab_padding import padded_vocab_size

        return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, tp)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | GPTConfig) -> GPTConfig:
        """Megatron/NeMo/NxDT model keys, a Hugging Face GPT-2 or GPT-NeoX ``config.json``, or
        :meth:`to_dict` output."""
        if isinstance(data, GPTConfig):
            return data
        if not isinstance(data, dict):
            raise ConfigError(f"gpt config must be a dict, got {type(data).__name__}")
        data = dict(data)
        model_type = data.get("model_type")
        if model_type == "gpt2":
            data = _from_gpt2(data)
        elif model_type == "gpt_neox":
            data = _from_neox(data)
        elif model_type is not None and model_type not in ("gpt", "megatron_gpt"):
            raise ConfigError(f"gpt config: model_type {model_type!r} is not a GPT-2 / GPT-NeoX / Megatron GPT config")
        if "untie_embeddings_and_output_weights" in data:
            data.setdefault("share_embeddings_and_output_weights", not data.pop("untie_embeddings_and_output_weights"))
        for alias, name in _ALIASES.items():
            if name is None or alias == name or alias not in data:
                continue
            value = data.pop(alias)
            if name in data and data[name] != value:
                raise ConfigError(f"gpt config: {alias}={value!r} conflicts with {name}={data[name]!r}")
            data[name] = value
        if "max_position_embeddings" not in data:
            for key in ("encoder_seq_length", "seq_length"):
                if data.get(key):
                    data["max_position_embeddings"] = data[key]
                    break
        for key, what in _REFUSED.items():
            if data.get(key):
                raise ConfigError(f"gpt config: {key}={data[key]!r} describes {what}, which the gpt model does not build")
        if data.get("dtype") not in ("float32", "bfloat16", "float16"):
            data.pop("dtype", None)
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and k not in _IGNORED}
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("extra")
        return out


def _canonical(name: str, value: Any, valid: tuple[str, ...]) -> str:
    """Case- and separator-insensitive match (NxDT writes ``layernorm``, Megatron ``LayerNorm``)."""
    key = str(value).lower().replace("-", "_")
    for option in valid:
        if option.lower() == key:
            return option
    hint = {"normformer": "normformer blocks are not implemented",
            "gpt_j": "use parallel_residual: true with pre_ln (GPT-NeoX layout) for a parallel attention/MLP block",
            "squared_relu": "only gelu and swiglu are implemented",
            "geglu": "only gelu and swiglu are implemented"}.get(key, "")
    raise ConfigError(f"gpt config: {name}={value!r} is not supported; valid: {list(valid)}" + (f" ({hint})" if hint else ""))


def _hf_activation(act: str) -> dict[str, Any]:
    if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return {"activation": "gelu", "openai_gelu": True}
    if act == "gelu":
        return {"activation": "gelu", "openai_gelu": False}
    raise ConfigError(f"gpt config: Hugging Face activation {act!r} is not supported (gelu, gelu_new, "
                      "gelu_pytorch_tanh)")


def _from_gpt2(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("scale_attn_by_inverse_layer_idx") or d.get("reorder_and_upcast_attn"):
        raise ConfigError("gpt config: GPT-2 scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
    if d.get("scale_attn_weights") is False:
        raise ConfigError("gpt config: GPT-2 scale_attn_weights=false is not supported")
    hidden = d["n_embd"]
    return {
        "model_type": "gpt", "vocab_size": d["vocab_size"], "hidden_size": hidden,
        "ffn_hidden_size": d.get("n_inner") or 4 * hidden, "num_layers": d["n_layer"],
        "num_attention_heads": d["n_head"], "max_position_embeddings": d["n_positions"],
        "layernorm_epsilon": d.get("layer_norm_epsilon", 1e-5), "normalization": "LayerNorm",
        "position_embedding_type": "learned_absolute", "has_bias": True,
        "share_embeddings_and_output_weights": d.get("tie_word_embeddings", True),
        "init_method_std": d.get("initializer_range", 0.02),
        "hidden_dropout": d.get("resid_pdrop", 0.1), "attention_dropout": d.get("attn_pdrop", 0.1),
        **_hf_activation(d.get("activation_function", "gelu_new")),
        "dtype": d.get("dtype") or d.get("torch_dtype"),
        "hf_layout": "gpt2",
    }


def _from_neox(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("attention_bias") is False:
        raise ConfigError("gpt config: GPT-NeoX attention_bias=false (biases on the MLP only) is not supported: "
                          "Megatron's has_bias covers every linear layer")
    rope = d.get("rope_parameters") or {}
    if (rope.get("rope_type") or "default") != "default" or d.get("rope_scaling"):
        raise ConfigError("gpt config: GPT-NeoX rope scaling is not supported (plain RoPE only)")
    pct = rope.get("partial_rotary_factor", d.get("rotary_pct", 1.0))
    base = rope.get("rope_theta", d.get("rotary_emb_base", 10000.0))
    return {
        "model_type": "gpt", "vocab_size": d["vocab_size"], "hidden_size": d["hidden_size"],
        "ffn_hidden_size": d["intermediate_size"], "num_layers": d["num_hidden_layers"],
        "num_attention_heads": d["num_attention_heads"], "max_position_embeddings": d["max_position_embeddings"],
        "layernorm_epsilon": d.get("layer_norm_eps", 1e-5), "normalization": "LayerNorm",
        "position_embedding_type": "rope", "rotary_percentage": pct, "rotary_base": base,
        "has_bias": True,
        "share_embeddings_and_output_weights": d.get("tie_word_embeddings", False),
        "parallel_residual": d.get("use_parallel_residual", True),
        "init_method_std": d.get("initializer_range", 0.02),
        "hidden_dropout": d.get("hidden_dropout", 0.0), "attention_dropout": d.get("attention_dropout", 0.0),
        **_hf_activation(d.get("hidden_act", "gelu")),
        "dtype": d.get("dtype") or d.get("torch_dtype"),
        "hf_layout": "gpt_neox",
    }
