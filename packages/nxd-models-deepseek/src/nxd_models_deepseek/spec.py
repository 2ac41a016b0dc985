"""The ``deepseek_v3`` :class:`nxd.specs.ModelSpec`: Mixtral's spec (MoE model, HF import/export
by the config's names and attention layout, ``generate``) for DeepSeek-V3's configs."""

from __future__ import annotations

from nxd.specs import config_reader, family_spec
from nxd_models_deepseek.config import DeepseekV3Config
from nxd_models_deepseek.hf_io import load_hf_checkpoint, save_hf_checkpoint
from nxd_models_deepseek.modeling import DeepseekV3DecoderLayer, DeepseekV3ForCausalLM
from nxd_models_deepseek.presets import PRESETS, preset
from nxd_models_llama import LlamaCoreAttention
from nxd_models_mixtral.spec import SPEC as MIXTRAL_SPEC
from nxd_tensor_parallel.modules.rms_norm import RMSNorm

config_from_dict = config_reader(DeepseekV3Config.from_dict, preset)


def flops_per_token(config: DeepseekV3Config | dict, seq_length: int | None = None) -> float:
    """``6 x`` the matmul parameters a token touches (MLA projections, router, ``top_k`` routed and
    the shared experts in MoE layers, the dense MLP in the first layers, LM head), plus the attention
    products (``qk_head_dim`` scores, ``v_head_dim`` values) when ``seq_length`` is given."""
    c = config_from_dict(config) if isinstance(config, dict) else config
    h, n = c.hidden_size, c.num_attention_heads
    q = h * n * c.qk_head_dim if not c.q_lora_rank else c.q_lora_rank * (h + n * c.qk_head_dim)
    attn = q + h * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank * n * (c.qk_nope_head_dim + c.v_head_dim) \
        + n * c.v_head_dim * h
    moe = h * c.num_local_experts + 3 * h * c.moe_intermediate_size * (c.num_experts_per_tok + c.n_shared_experts)
    params = h * c.vocab_size + sum(attn + (moe if c.is_moe_layer(i) else 3 * h * c.intermediate_size)
                                    for i in range(c.num_hidden_layers))
    params += c.mtp_depth * (2 * h * h + attn + moe + h * c.vocab_size)  # per MTP depth: eh_proj, block, head
    layers = c.num_hidden_layers + c.mtp_depth
    scores = 6.0 * layers * n * (c.qk_head_dim + c.v_head_dim) * seq_length if seq_length else 0.0
    return 6.0 * params + scores


#: HF/PEFT module names LoRA may target -> (nxd module suffix, fused piece): MLA's projections are
#: not fused, so each is its own module
HF_MODULE_TO_NXD = {name: (f"self_attn.{name}", None) for name in
                    ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")}


def hf_param_plan(model: DeepseekV3ForCausalLM, name: str, tp: int, rank: int) -> list[tuple[str, int | None, tuple[int, ...]]]:
    """nxd-lora's plan: the HF rows/columns of parameter ``name`` on TP ``rank`` (names are HF's)."""
    return [(p.hf_key, p.dim, tuple(p.index)) for p in model.config.hf_pieces(name, tp, rank, 1)]


SPEC = family_spec(
    "deepseek_v3", DeepseekV3ForCausalLM, config_from_dict, base=MIXTRAL_SPEC, hf_model_types=("deepseek_v3",),
    recompute_modules={"CoreAttention": (LlamaCoreAttention,), "DeepseekV3RMSNorm": (RMSNorm,),
                       "DeepseekV3DecoderLayer": (DeepseekV3DecoderLayer,)},
    implements=MIXTRAL_SPEC.implements - {"model.sliding_window"},
    lora_target_modules=("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"),
    flops_per_token=flops_per_token, presets=PRESETS,
    load_hf=load_hf_checkpoint, save_hf=save_hf_checkpoint,
    extras={"hf_module_to_nxd": HF_MODULE_TO_NXD, "hf_param_plan": hf_param_plan, "config_class": DeepseekV3Config},
)
#: the plain model (``(config, device)``); the transform list (``nxd.build_parallel_model``) parallelises it
build = SPEC.build
