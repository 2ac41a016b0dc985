"""DeepSeek-V3 on nxd-models-mixtral's MoE model: its block takes multi-head latent attention, its
feed-forward is Llama's dense MLP in the first ``first_k_dense_replace`` layers and, after them, an
nxd-moe layer with routed + shared experts, sigmoid group-limited routing and the expert bias.
The loss adds DeepSeek-V3's sequence-wise balance loss when ``seq_aux_loss_coef`` is set."""

from __future__ import annotations

import torch
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, dim_size
from nxd_models_deepseek.attention import DeepseekV3Attention
from nxd_models_deepseek.config import DeepseekV3Config
from nxd_models_deepseek.plan import DEEPSEEK_PLAN
from nxd_models_mixtral import MixtralForCausalLM
from nxd_models_mixtral.modeling import MixtralDecoderLayer, MixtralModel, MoECausalLMOutput


class DeepseekV3DecoderLayer(MixtralDecoderLayer):
    def build_attention(self, config: DeepseekV3Config, layer_idx: int, sequence_parallel: bool,
                        device: torch.device | str | None, context: ParallelContext | None = None) -> nn.Module:
        return DeepseekV3Attention(config, layer_idx, sequence_parallel, device, context)


class DeepseekV3Model(MixtralModel):
    decoder_layer_class = DeepseekV3DecoderLayer


class DeepseekV3ForCausalLM(MixtralForCausalLM):
    """``loss`` = cross-entropy (as transformers' ``DeepseekV3ForCausalLM``), plus in training
    ``seq_aux_loss_coef`` x the MoE layers' sequence-wise balance losses (``loss_terms``:
    ``lm_loss``, ``seq_aux_loss``)."""

    nxd_transformer_layer_classes = (DeepseekV3DecoderLayer,)
    model_class = DeepseekV3Model
    config_class = DeepseekV3Config
    nxd_parallel_plan = DEEPSEEK_PLAN

    def __init__(self, config: DeepseekV3Config | dict, *args: object, **kwargs: object) -> None:
        super().__init__(config, *args, **kwargs)
        if self.config.seq_aux_loss_coef and dim_size(self.parallel_context, "pp") > 1:
            raise ConfigError("deepseek_v3: seq_aux_loss_coef > 0 is not implemented under pipeline parallelism "
                              "(the per-layer losses do not travel between stages); set it to 0 or use PP=1")
        if self.config.seq_aux_loss_coef and dim_size(self.parallel_context, "cp") > 1:
            raise ConfigError("deepseek_v3: seq_aux_loss_coef > 0 is not implemented under context parallelism "
                              "(the sequence-wise balance loss needs each sequence's expert counts and affinities "
                              "summed over the CP ranks holding its chunks); set it to 0 or use "
                              "context_parallel_size=1")

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                **kwargs: object) -> MoECausalLMOutput:
        out = super().forward(input_ids, labels=labels, **kwargs)
        if labels is None or not (self.config.seq_aux_loss_coef and self.training):
            return out
        seq = sum(layer.mlp.last_seq_aux_loss for layer in self.model.layers
                  if getattr(layer.mlp, "last_seq_aux_loss", None) is not None)
        out.loss_terms = {**(out.loss_terms or {"lm_loss": out.loss}), "seq_aux_loss": seq}
        out.loss = out.loss + self.config.seq_aux_loss_coef * seq
        return out
