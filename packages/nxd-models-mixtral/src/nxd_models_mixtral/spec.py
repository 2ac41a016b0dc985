"""The ``mixtral`` :class:`nxd.specs.ModelSpec`."""

from __future__ import annotations

from nxd.specs import config_reader, family_spec
from nxd_models_llama import LlamaCoreAttention, generate
from nxd_models_mixtral.config import MixtralConfig
from nxd_models_mixtral.hf_io import load_hf_checkpoint, save_hf_checkpoint
from nxd_models_mixtral.modeling import MixtralDecoderLayer, MixtralForCausalLM
from nxd_models_mixtral.presets import PRESETS, preset
from nxd_tensor_parallel.modules.rms_norm import RMSNorm

#: NxD Training config keys that change the model and that this plugin builds (the ``moe`` section,
#: HF's sliding window, expert parallelism, and the Megatron options of NxDT's megatron_mixtral
#: configs); nxd-training passes the model keys to config_from_dict.
IMPLEMENTS = frozenset({"model.moe", "model.sliding_window", "distributed_strategy.expert_model_parallel_size",
                        "model.use_scaled_init_method", "model.make_vocab_size_divisible_by"})

#: NxD Training's recompute names (its HF Mixtral module classes) -> ours
RECOMPUTE_MODULES = {
    "CoreAttention": (LlamaCoreAttention,),
    "MixtralRMSNorm": (RMSNorm,),
    "MixtralDecoderLayer": (MixtralDecoderLayer,),
}


#: Hugging Face ``config.json`` keys (plus a ``moe`` section of NxDT keys) -> :class:`MixtralConfig`;
#: ``{"preset": name, ...}`` starts from a preset
config_from_dict = config_reader(MixtralConfig.from_dict, preset)


def flops_per_token(config: MixtralConfig | dict, seq_length: int | None = None) -> float:
    """Training FLOPs per token: ``6 x`` the matmul parameters a token touches (attention, then in a
    MoE layer the router and ``top_k`` experts, in a dense one the MLP; the LM head), plus attention
    scores when ``seq_length`` is given. Families on this model (Qwen3-MoE) share it."""
    c = config_from_dict(config) if isinstance(config, dict) else config
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    moe = h * c.num_local_experts + c.num_experts_per_tok * 3 * h * c.expert_intermediate_size
    params = h * c.vocab_size + sum(h * (q + 2 * kv) + q * h + (moe if c.is_moe_layer(i) else 3 * h * c.intermediate_size)
                                    for i in range(c.num_hidden_layers))
    return 6.0 * params + (12.0 * c.num_hidden_layers * q * seq_length if seq_length else 0.0)


SPEC = family_spec(
    "mixtral", MixtralForCausalLM, config_from_dict,
    recompute_modules=RECOMPUTE_MODULES,
    hf_model_types=("mixtral",),
    implements=IMPLEMENTS,
    lora_target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
    load_hf=load_hf_checkpoint,
    save_hf=save_hf_checkpoint,
    flops_per_token=flops_per_token,
    generate=generate,  # MixtralConfig extends LlamaConfig: Llama's KV-cached generate runs Mixtral
    presets=PRESETS,
    extras={"config_class": MixtralConfig, "sequence_dimension": 1},
)
#: the plain model (``(config, device)``); the transform list (``nxd.build_parallel_model``) parallelises it
build = SPEC.build
