"""Mixtral on nxd's parallel layers: Llama's attention (GQA, RoPE) with an nxd-moe sparse MoE block
in place of the MLP, plus Hugging Face's sliding-window mask and router auxiliary loss.

Module names follow Hugging Face's checkpoint names (``block_sparse_moe``) except where TP/EP fuse
or stack weights (:mod:`nxd_models_mixtral.hf_io` holds the mapping).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from nxd_modeling.lm_loss import causal_lm_loss, sequence_mean
from nxd_models_llama import KVCache, LlamaAttention, LlamaCoreAttention, LlamaMLP
from nxd_models_llama.modeling import LlamaForCausalLM, LlamaModel
from nxd_models_mixtral.config import MixtralConfig
from nxd_models_mixtral.plan import MIXTRAL_PLAN
from nxd_moe import (
    MoELayer,
    losses_from_router_statistics,
    pack_router_statistics,
    router_statistics,
    router_statistics_size,
    unpack_router_statistics,
)
from nxd_tensor_parallel.modules.rms_norm import RMSNorm

SEQUENCE_DIM = 1


@dataclass
class MoECausalLMOutput:
    """``loss`` = cross-entropy + ``router_aux_loss_coef`` x load-balancing loss (as HF computes it
    with ``output_router_logits``) + z-loss when configured; ``aux_loss``: the load-balancing loss;
    ``router_logits``: one ``[batch*seq, num_experts]`` tensor per layer; ``loss_terms``: the parts
    of ``loss`` by name for the metrics log (nxd_core_parallel.loss_terms): ``lm_loss`` (the
    cross-entropy), ``aux_loss`` and, with a z-loss coefficient, ``z_loss``, each before its
    coefficient (empty without ``output_router_logits``: ``loss`` is then the cross-entropy)."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    aux_loss: torch.Tensor | None = None
    router_logits: tuple[torch.Tensor, ...] = ()
    loss_terms: dict[str, torch.Tensor] = field(default_factory=dict)


class MixtralDecoderLayer(nn.Module):
    """Pre-norm block: ``h + attn(norm(h))`` then ``h + ff(norm(h))``, the feed-forward ``ff`` named
    ``config.MOE_MODULE`` (Mixtral: the sparse MoE block ``block_sparse_moe``). A MoE block keeps its
    router logits in ``last_router_logits`` for the model's auxiliary loss (``None`` after a dense
    feed-forward). A family on this model overrides :meth:`build_feed_forward`."""

    def __init__(self, config: MixtralConfig, layer_idx: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        norm = partial(RMSNorm, config.hidden_size, eps=config.rms_norm_eps, dtype=config.torch_dtype, device=device)
        self.input_layernorm = norm()
        self.self_attn = self.build_attention(config, layer_idx, device)
        self.post_attention_layernorm = norm()
        if config.use_scaled_init_method:  # Megatron's scaled init of the attention output projection
            self.self_attn.o_proj.init_method = partial(nn.init.normal_, mean=0.0, std=config.output_init_std)
            self.self_attn.o_proj.reset_parameters()
        self.feed_forward_name = config.MOE_MODULE
        self.add_module(config.MOE_MODULE, self.build_feed_forward(config, layer_idx, device))
        self.last_router_logits: torch.Tensor | None = None

    def build_attention(self, config: MixtralConfig, layer_idx: int, device: torch.device | str | None) -> nn.Module:
        """Llama's attention (GQA, RoPE; q/k head norms when ``config.qk_norm``)."""
        return LlamaAttention(config, layer_idx, device)

    def build_feed_forward(self, config: MixtralConfig, layer_idx: int, device: torch.device | str | None) -> nn.Module:
        """This layer's feed-forward: a :class:`MoELayer` (returns ``(out, router_logits)``; with the
        config's shared experts, if any), or Llama's dense SwiGLU MLP in the layers
        ``config.is_moe_layer`` leaves dense (Qwen3-MoE's ``mlp_only_layers``, DeepSeek's first layers)."""
        if not config.is_moe_layer(layer_idx):
            return LlamaMLP(config, device)
        return MoELayer(config.moe_config(), config.hidden_size, config.expert_intermediate_size,
                        sequence_dimension=SEQUENCE_DIM, dtype=config.torch_dtype, device=device,
                        init_std=config.initializer_range, output_init_std=config.output_init_std,
                        shared_intermediate_size=config.shared_expert_intermediate_size)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin, attention_mask, kv_cache)
        ff = getattr(self, self.feed_forward_name)
        out = ff(self.post_attention_layernorm(h))
        if isinstance(ff, MoELayer):
            out, self.last_router_logits = out
        return h + out


class MixtralModel(LlamaModel):
    """Llama's model (embedding, decoder loop, norm, RoPE, masks with the config's sliding window)
    with Mixtral's blocks."""

    #: the block class (a family on this model sets its own; its ``last_router_logits`` is ``None``
    #: in a layer without experts)
    decoder_layer_class: type[nn.Module] = MixtralDecoderLayer


class MixtralForCausalLM(LlamaForCausalLM):
    """Mixtral with a vocabulary-parallel LM head, vocabulary-parallel cross-entropy and the router
    auxiliary loss: Llama's causal LM (build, weight tying, init, logits, pipeline layout) with
    Mixtral's model. Megatron's vocabulary padding (``make_vocab_size_divisible_by`` x TP) is the
    plan's: the embedding and LM head declare the multiple (``pad_alignment_size_per_rank``)."""

    nxd_transformer_layer_classes: tuple[type[nn.Module], ...] = (MixtralDecoderLayer,)
    nxd_core_attention_classes: tuple[type[nn.Module], ...] = (LlamaCoreAttention,)
    model_class: type[MixtralModel] = MixtralModel
    config_class: type[MixtralConfig] = MixtralConfig
    #: the family's parallel plan (data; the spec registers the same object): the model is built
    #: plain and the ``parallel_plan`` transform applies it
    nxd_parallel_plan = MIXTRAL_PLAN

    def __init__(self, config: MixtralConfig | dict, device: torch.device | str | None = None) -> None:
        super().__init__(config, device)
        if self.config.make_vocab_size_divisible_by is not None:
            for layer in (self.model.embed_tokens, self.lm_head):
                layer.pad_alignment_size_per_rank = self.config.make_vocab_size_divisible_by
        self.moe_config = self.config.moe_config()

    def layer_router_statistics(self, router_logits: torch.Tensor,
                                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """One layer's :func:`nxd_moe.router_statistics` (they add up over layers)."""
        cfg = self.moe_config
        # a [batch, seq] padding/segment mask restricts the loss to real tokens, as HF's does
        mask = (attention_mask != 0).long() if attention_mask is not None and attention_mask.dim() == 2 else None
        return router_statistics(router_logits, cfg.num_experts, cfg.top_k, mask, cfg.router_activation)

    def router_losses(self, stats: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``({"aux_loss": load-balancing loss[, "z_loss": z-loss]}, their weighted sum added to the
        LM loss)`` from the router statistics summed over every layer (the z-loss only when its
        coefficient is set)."""
        aux, z = losses_from_router_statistics(stats, self.config.num_moe_layers, self.moe_config.num_experts)
        terms, total = {"aux_loss": aux}, self.config.router_aux_loss_coef * aux
        if self.moe_config.router_z_loss_coef:
            terms["z_loss"] = z
            total = total + self.moe_config.router_z_loss_coef * z
        return terms, total

    def lm_loss(self, hidden: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor | None,
                stats: torch.Tensor) -> MoECausalLMOutput:
        """The output (logits, loss, aux, loss terms) from the final hidden state and the summed
        router statistics: the cross-entropy plus, with ``output_router_logits``, the router losses
        (as HF)."""
        logits = self.logits(hidden)
        loss = causal_lm_loss(logits, labels, loss_mask, self.parallel_context)
        if not self.config.output_router_logits:
            return MoECausalLMOutput(loss=loss, logits=logits)
        # the statistics are means over this rank's tokens; the losses want every token of the
        # sequences (their product is not a sum over the ranks holding parts of them)
        stats = sequence_mean(stats, labels.numel(), self.parallel_context)
        terms, extra = self.router_losses(stats)
        return MoECausalLMOutput(loss=loss + extra, logits=logits, aux_loss=terms["aux_loss"],
                                 loss_terms={"lm_loss": loss, **terms})

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                segment_ids: torch.Tensor | None = None) -> MoECausalLMOutput:
        if attention_mask is None and segment_ids is not None:
            attention_mask = segment_ids
        hidden = self.model(input_ids, position_ids, attention_mask, kv_cache)
        router_logits = tuple(layer.last_router_logits for layer in self.model.layers)
        if labels is None:
            return MoECausalLMOutput(loss=None, logits=self.logits(hidden), router_logits=router_logits)
        stats = torch.zeros(self._num_router_statistics, device=hidden.device)
        for layer_logits in router_logits:
            if layer_logits is not None:  # a dense layer routes nothing
                stats = stats + self.layer_router_statistics(layer_logits, attention_mask)
        output = self.lm_loss(hidden, labels, loss_mask, stats)
        output.router_logits = router_logits
        return output

    @property
    def _num_router_statistics(self) -> int:
        return router_statistics_size(self.moe_config.num_experts)

    # -- pipeline contract (docs/pipeline.md, docs/moe.md): the same modules as forward(). Between
    # stages travels the hidden state flattened with the running sum of the layers' router
    # statistics, so the last stage computes the router losses of all layers exactly.
    def nxd_pipeline_embed(self, input_ids: torch.Tensor, **batch: object) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        return pack_router_statistics(hidden, torch.zeros(self._num_router_statistics, device=hidden.device))

    def _unpack(self, packed: torch.Tensor, input_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if input_ids is None:
            raise ValueError("the Mixtral pipeline stages need the micro-batch's input_ids (for shapes, positions "
                             "and masks)")
        return unpack_router_statistics(packed, self._num_router_statistics, input_ids.shape[0],
                                        self.config.hidden_size)

    def nxd_pipeline_layer(self, layer: nn.Module, packed: torch.Tensor, input_ids: torch.Tensor | None = None,
                           position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                           segment_ids: torch.Tensor | None = None, **batch: object) -> torch.Tensor:
        """One decoder layer (positions, RoPE and mask rebuilt from the micro-batch), its router
        statistics added to the running sum."""
        hidden, stats = self._unpack(packed, input_ids)
        if attention_mask is None and segment_ids is not None:
            attention_mask = segment_ids
        cos, sin, mask = self.model.layer_inputs(input_ids, hidden.dtype, position_ids, attention_mask)
        hidden = layer(hidden, cos, sin, mask)
        if layer.last_router_logits is not None:
            stats = stats + self.layer_router_statistics(layer.last_router_logits, attention_mask)
        return pack_router_statistics(hidden, stats)

    def nxd_pipeline_head(self, packed: torch.Tensor, input_ids: torch.Tensor | None = None,
                          labels: torch.Tensor | None = None, loss_mask: torch.Tensor | None = None,
                          **batch: object) -> MoECausalLMOutput:
        """Last stage: final norm, LM head; forward's output (its ``.loss`` and ``.loss_terms``)."""
        if labels is None:
            raise ValueError("pipeline training needs 'labels' in the batch (the last stage returns the loss)")
        hidden, stats = self._unpack(packed, input_ids)
        return self.lm_loss(self.model.norm(hidden), labels, loss_mask, stats)
