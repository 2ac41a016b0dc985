"""Qwen3-MoE on Mixtral's model: the same embedding, RoPE, masks, router losses and pipeline
contract, with Qwen3's block (Llama attention with q/k head norms, then a MoE ``mlp`` or, in the
layers ``is_moe_layer`` leaves dense, Llama's SwiGLU MLP). Qwen3 dense needs no class of its own: it
is :class:`nxd_models_llama.LlamaForCausalLM` with ``qk_norm`` on."""

from __future__ import annotations

from nxd_models_mixtral import MixtralForCausalLM
from nxd_models_mixtral.modeling import MixtralDecoderLayer, MixtralModel
from nxd_models_qwen3.config import Qwen3MoeConfig
from nxd_models_qwen3.plan import QWEN3_MOE_PLAN


class Qwen3MoeDecoderLayer(MixtralDecoderLayer):
    """Mixtral's block as Qwen3-MoE configures it (its own class: NxDT recompute names and activation
    checkpointing select it): ``mlp`` = a MoE layer of ``moe_intermediate_size`` experts, or Llama's
    SwiGLU MLP in the layers ``config.is_moe_layer`` leaves dense."""


class Qwen3MoeModel(MixtralModel):
    decoder_layer_class = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(MixtralForCausalLM):
    """Qwen3-MoE: ``loss`` = cross-entropy + ``router_aux_loss_coef`` x HF's load-balancing loss over
    the MoE layers when ``output_router_logits`` (as transformers' ``Qwen3MoeForCausalLM``)."""

    nxd_transformer_layer_classes = (Qwen3MoeDecoderLayer,)
    model_class = Qwen3MoeModel
    config_class = Qwen3MoeConfig
    nxd_parallel_plan = QWEN3_MOE_PLAN
