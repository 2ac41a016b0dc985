"""Qwen3-MoE on Mixtral's model: the same embedding, RoPE, masks, router losses and pipeline
contract, with Qwen3's block (Llama attention with q/k head norms, then a MoE ``mlp`` or, in the
layers ``is_moe_layer`` leaves dense, Llama's SwiGLU MLP). Qwen3 dense needs no class of its own: it
is :class:`nxd_models_llama.LlamaForCausalLM` with ``qk_norm`` on."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from nxd.parallel import ParallelContext
from nxd_core_parallel.modules.rms_norm import RMSNorm
from nxd_models_llama import KVCache, LlamaAttention, LlamaMLP
from nxd_models_mixtral import MixtralForCausalLM
from nxd_models_mixtral.modeling import SEQUENCE_DIM, MixtralModel
from nxd_models_qwen3.config import Qwen3MoeConfig
from nxd_moe import MoELayer


class Qwen3MoeDecoderLayer(nn.Module):
    """Pre-norm block ``h + attn(norm(h))`` then ``h + mlp(norm(h))``; ``last_router_logits`` is
    ``None`` in a dense layer."""

    def __init__(self, config: Qwen3MoeConfig, layer_idx: int, sequence_parallel: bool = False,
                 device: torch.device | str | None = None, context: ParallelContext | None = None) -> None:
        super().__init__()
        norm = partial(RMSNorm, config.hidden_size, eps=config.rms_norm_eps,
                       sequence_parallel_enabled=sequence_parallel, dtype=config.torch_dtype, device=device)
        self.input_layernorm = norm()
        self.self_attn = LlamaAttention(config, layer_idx, sequence_parallel, device)
        self.post_attention_layernorm = norm()
        self.is_moe = config.is_moe_layer(layer_idx)
        if self.is_moe:
            self.mlp = MoELayer(config.moe_config(), config.hidden_size, config.moe_intermediate_size,
                                sequence_parallel=sequence_parallel, sequence_dimension=SEQUENCE_DIM,
                                dtype=config.torch_dtype, device=device, init_std=config.initializer_range,
                                context=context)
        else:
            self.mlp = LlamaMLP(config, sequence_parallel, device)
        self.last_router_logits: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin, attention_mask, kv_cache)
        if not self.is_moe:
            return h + self.mlp(self.post_attention_layernorm(h))
        out, self.last_router_logits = self.mlp(self.post_attention_layernorm(h))
        return h + out


class Qwen3MoeModel(MixtralModel):
    decoder_layer_class = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(MixtralForCausalLM):
    """Qwen3-MoE: ``loss`` = cross-entropy + ``router_aux_loss_coef`` x HF's load-balancing loss over
    the MoE layers when ``output_router_logits`` (as transformers' ``Qwen3MoeForCausalLM``)."""

    nxd_transformer_layer_classes = (Qwen3MoeDecoderLayer,)
    model_class = Qwen3MoeModel
    config_class = Qwen3MoeConfig
