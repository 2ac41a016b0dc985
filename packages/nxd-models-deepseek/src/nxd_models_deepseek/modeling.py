"""DeepSeek-V3 on nxd-models-mixtral's MoE model: its block takes multi-head latent attention, its
feed-forward is Llama's dense MLP in the first ``first_k_dense_replace`` layers and, after them, an
nxd-moe layer with routed + shared experts, sigmoid group-limited routing and the expert bias.
The loss adds DeepSeek-V3's sequence-wise balance loss when ``seq_aux_loss_coef`` is set, and the
multi-token prediction loss with ``mtp_depth`` MTP modules (:mod:`nxd_models_deepseek.mtp`)."""

from __future__ import annotations

import torch
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, dim_size
from nxd_modeling.lm_loss import causal_lm_loss
from nxd_models_deepseek.attention import DeepseekV3Attention
from nxd_models_deepseek.config import DeepseekV3Config
from nxd_models_deepseek.mtp import mtp_hidden, mtp_module, shift_left
from nxd_models_deepseek.plan import DEEPSEEK_MTP_PLAN, DEEPSEEK_PLAN
from nxd_models_mixtral import MixtralForCausalLM
from nxd_models_mixtral.modeling import MixtralDecoderLayer, MixtralModel, MoECausalLMOutput


def context_parallel_unsupported(c: DeepseekV3Config) -> str | None:
    """The config field that context parallelism cannot run with, and why (``None``: it can)."""
    if c.seq_aux_loss_coef:
        return ("seq_aux_loss_coef > 0 is not implemented under context parallelism (the sequence-wise balance loss "
                "needs each sequence's expert counts and affinities summed over the CP ranks holding its chunks); "
                "set it to 0")
    if c.mtp_depth:
        return (f"mtp_depth={c.mtp_depth} is not implemented under context parallelism (each depth shifts the tokens "
                "one place, across the CP ranks' chunk boundaries); set mtp_depth=0")
    return None


class DeepseekV3DecoderLayer(MixtralDecoderLayer):
    def build_attention(self, config: DeepseekV3Config, layer_idx: int, device: torch.device | str | None) -> nn.Module:
        return DeepseekV3Attention(config, layer_idx, device)


class DeepseekV3Model(MixtralModel):
    decoder_layer_class = DeepseekV3DecoderLayer
    #: the final hidden state of the last forward, kept for the MTP modules when ``keep_hidden``
    keep_hidden = False
    last_hidden_state: torch.Tensor | None = None

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        hidden = super().forward(*args, **kwargs)
        if self.keep_hidden:
            self.last_hidden_state = hidden
        return hidden


class DeepseekV3ForCausalLM(MixtralForCausalLM):
    """``loss`` = cross-entropy (as transformers' ``DeepseekV3ForCausalLM``), plus in training
    ``seq_aux_loss_coef`` x the MoE layers' sequence-wise balance losses (``loss_terms``:
    ``lm_loss``, ``seq_aux_loss``)."""

    nxd_transformer_layer_classes = (DeepseekV3DecoderLayer,)
    model_class = DeepseekV3Model
    config_class = DeepseekV3Config
    nxd_parallel_plan = DEEPSEEK_PLAN
    #: MLA's heads are not padded (Mixtral's attention is)
    nxd_pads_attention_heads = False

    def __init__(self, config: DeepseekV3Config | dict, device: torch.device | str | None = None) -> None:
        super().__init__(config, device)
        c = self.config
        #: why this configuration cannot run under context parallelism (the context_parallel transform refuses with it)
        self.nxd_context_parallel_unsupported = context_parallel_unsupported(c)
        #: multi-token prediction modules, depth 1..D (checkpoint: model.layers.{num_hidden_layers + k})
        self.mtp = nn.ModuleList(mtp_module(DeepseekV3DecoderLayer, c, k, device) for k in range(c.mtp_depth))
        self.model.keep_hidden = bool(c.mtp_depth)
        if c.mtp_depth:
            self.nxd_parallel_plan = DEEPSEEK_MTP_PLAN

    def nxd_parallelized(self, context: ParallelContext | None) -> None:
        """What the plan's layout cannot run is refused (the losses that do not cross pipeline
        stages); the MTP projections' gradients are partial under sequence parallelism."""
        super().nxd_parallelized(context)
        c, pp = self.config, dim_size(context, "pp")
        if c.seq_aux_loss_coef and pp > 1:
            raise ConfigError("deepseek_v3: seq_aux_loss_coef > 0 is not implemented under pipeline parallelism "
                              "(the per-layer losses do not travel between stages); set it to 0 or use PP=1")
        if c.mtp_depth and pp > 1:
            raise ConfigError(f"deepseek_v3: mtp_depth={c.mtp_depth} is not implemented with pp_size {pp} (the MTP "
                              "modules need the embedding and output head, which sit on the first and last pipeline "
                              "stages); set mtp_depth=0 or use pp_size 1")
        for block in self.mtp:  # under SP eh_proj sees this rank's sequence slice: its gradient is summed over TP
            block.eh_proj.weight.sequence_parallel_enabled = self.sequence_parallel and dim_size(context, "tp") > 1

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, **kwargs: object) -> MoECausalLMOutput:
        out = super().forward(input_ids, labels=labels, position_ids=position_ids, attention_mask=attention_mask,
                              loss_mask=loss_mask, **kwargs)
        hidden, self.model.last_hidden_state = self.model.last_hidden_state, None
        if labels is None:
            return out
        terms, extra = {}, []
        if self.config.seq_aux_loss_coef and self.training:
            seq = sum(layer.mlp.last_seq_aux_loss for layer in self.model.layers
                      if getattr(layer.mlp, "last_seq_aux_loss", None) is not None)
            terms["seq_aux_loss"] = seq
            extra.append(self.config.seq_aux_loss_coef * seq)
        if self.mtp:
            mtp = self.mtp_loss(hidden, input_ids, labels, loss_mask, position_ids, attention_mask)
            terms["mtp_loss"] = mtp
            extra.append(self.config.mtp_loss_scaling_factor * mtp)
        if terms:
            out.loss_terms = {**(out.loss_terms or {"lm_loss": out.loss}), **terms}
            out.loss = out.loss + sum(extra)
        return out

    def mtp_loss(self, hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor,
                 loss_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                 attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The mean over the D depths of each depth's cross-entropy (:mod:`nxd_models_deepseek.mtp`)."""
        cos, sin, mask = self.model.layer_inputs(input_ids, hidden.dtype, position_ids, attention_mask)
        losses = []
        for block in self.mtp:
            input_ids, labels, loss_mask = shift_left(input_ids, 0), shift_left(labels, -100), shift_left(loss_mask, 0)
            hidden = mtp_hidden(block, hidden, self.model.embed_tokens(input_ids), cos, sin, mask)
            losses.append(causal_lm_loss(self.logits(hidden), labels, loss_mask, self.parallel_context))
        return torch.stack(losses).mean()
