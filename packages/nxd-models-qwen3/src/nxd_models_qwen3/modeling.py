"""Qwen3-MoE on Mixtral's model: the same embedding, RoPE, masks, router losses and pipeline
contract, with Qwen3's block (Llama attention with q/k head norms, then a MoE ``mlp`` or, in the
layers ``is_moe_layer`` leaves dense, Llama's SwiGLU MLP). Qwen3 dense needs no class of its own: it
is :class:`nxd_models_llama.LlamaForCausalLM` with ``qk_norm`` on."""

from __future__ import annotations

import torch
from torch import nn

from nxd.parallel import ParallelContext
from nxd_models_llama import LlamaMLP
from nxd_models_mixtral import MixtralForCausalLM
from nxd_models_mixtral.modeling import MixtralDecoderLayer, MixtralModel
from nxd_models_qwen3.config import Qwen3MoeConfig


class Qwen3MoeDecoderLayer(MixtralDecoderLayer):
    """Mixtral's block with Qwen3's feed-forward ``mlp``: a MoE layer of ``moe_intermediate_size``
    experts, or Llama's SwiGLU MLP in the layers ``config.is_moe_layer`` leaves dense."""

    def build_feed_forward(self, config: Qwen3MoeConfig, layer_idx: int, sequence_parallel: bool,
                           device: torch.device | str | None, context: ParallelContext | None) -> nn.Module:
        if config.is_moe_layer(layer_idx):
            return super().build_feed_forward(config, layer_idx, sequence_parallel, device, context)
        return LlamaMLP(config, sequence_parallel, device)


class Qwen3MoeModel(MixtralModel):
    decoder_layer_class = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(MixtralForCausalLM):
    """Qwen3-MoE: ``loss`` = cross-entropy + ``router_aux_loss_coef`` x HF's load-balancing loss over
    the MoE layers when ``output_router_logits`` (as transformers' ``Qwen3MoeForCausalLM``)."""

    nxd_transformer_layer_classes = (Qwen3MoeDecoderLayer,)
    model_class = Qwen3MoeModel
    config_class = Qwen3MoeConfig
