"""The ``gpt`` :class:`nxd.specs.ModelSpec`."""

from __future__ import annotations

from nxd.specs import config_reader, family_spec
from nxd_models_gpt.config import GPTConfig
from nxd_models_gpt.generate import generate
from nxd_models_gpt.hf_io import load_hf_checkpoint, save_hf_checkpoint
from nxd_models_gpt.modeling import GPTCoreAttention, GPTForCausalLM, GPTTransformerLayer
from nxd_models_gpt.presets import PRESETS, preset

#: nxd module names of the attention projections (the fused QKV and the output projection).
DEFAULT_LORA_TARGETS = ("linear_qkv", "linear_proj")

#: NxD Training model keys this model implements (NxDT names; the YAML trainer refuses them for
#: models that do not list them and passes them to ``config_from_dict`` under these names).
NXDT_FEATURES = frozenset(f"model.{key}" for key in (
    "normalization", "activation", "position_embedding_type", "rotary_percentage", "transformer_block_type",
    "has_bias", "use_scaled_init_method", "apply_query_key_layer_scaling", "make_vocab_size_divisible_by",
    "hidden_dropout", "attention_dropout", "ffn_dropout"))

#: NxDT ``activations_checkpoint_recompute`` names -> the classes they select in this model.
RECOMPUTE_MODULES = {"CoreAttention": (GPTCoreAttention,), "ParallelTransformerLayer": (GPTTransformerLayer,)}

#: Megatron/NeMo/NxDT or Hugging Face (GPT-2, GPT-NeoX) keys -> :class:`GPTConfig`;
#: ``{"preset": name, ...}`` starts from a preset and overrides it
config_from_dict = config_reader(GPTConfig.from_dict, preset)


def flops_per_token(config: GPTConfig | dict, seq_length: int | None = None) -> float:
    """``6 * matmul parameters`` (+ ``12 * layers * heads * head_dim * seq_length`` attention)."""
    c = config_from_dict(config) if isinstance(config, dict) else config
    h, hd = c.hidden_size, c.kv_channels
    q, kv = c.num_attention_heads * hd, c.num_query_groups * hd
    ffn_in = 2 * c.ffn_hidden_size if c.activation == "swiglu" else c.ffn_hidden_size
    per_layer = h * (q + 2 * kv) + q * h + h * ffn_in + c.ffn_hidden_size * h
    flops = 6.0 * (c.num_layers * per_layer + h * c.vocab_size)
    if seq_length:
        flops += 12.0 * c.num_layers * q * seq_length
    return flops


SPEC = family_spec(
    "gpt", GPTForCausalLM, config_from_dict,
    implements=NXDT_FEATURES,
    recompute_modules=RECOMPUTE_MODULES,
    hf_model_types=("gpt2", "gpt_neox"),
    lora_target_modules=DEFAULT_LORA_TARGETS,
    load_hf=load_hf_checkpoint,
    save_hf=save_hf_checkpoint,
    generate=generate,
    flops_per_token=flops_per_token,
    presets=PRESETS,
    extras={"config_class": GPTConfig, "sequence_dimension": 1, "hf_layouts": ("gpt2", "gpt_neox")},
)
#: the plain model (``(config, device)``); the transform list (``nxd.build_parallel_model``) parallelises it
build = SPEC.build
