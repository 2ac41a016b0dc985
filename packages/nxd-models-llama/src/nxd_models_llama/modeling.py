"""The Llama decoder (batch-first ``[batch, seq, hidden]``), built from one-device modules
(:mod:`nxd_tensor_parallel.modules.plain`) and parallelised by its plan (:mod:`nxd_models_llama.plan`):
the model holds no code path of its own for tensor or sequence parallelism.

Module names follow Hugging Face's ``LlamaForCausalLM`` except where TP fuses projections:
``self_attn.qkv_proj`` (HF ``q_proj``/``k_proj``/``v_proj``) and ``mlp.gate_up_proj``
(HF ``gate_proj``/``up_proj``). :mod:`nxd_models_llama.hf_mapping` holds the exact mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext
from nxd.parallel import dim_rank as _rank
from nxd.parallel import dim_size as _size
from nxd_core_parallel.model_init import reset_parameters
from nxd_modeling.attention_mask import build_attention_mask, sliding_window_mask
from nxd_modeling.lm_loss import causal_lm_loss, fused_linear_causal_lm_loss
from nxd_modeling.rotary import RotaryEmbedding, apply_rotary
from nxd_models_llama.config import LlamaConfig
from nxd_models_llama.plan import LLAMA_PLAN
from nxd_tensor_parallel import fused_kernels
from nxd_tensor_parallel.layout_rules import head_layout
from nxd_tensor_parallel.modules import kv_heads, plain
from nxd_tensor_parallel.modules.plain import PlacedByPlan
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers.mappings import copy_to_tensor_model_parallel_region
from nxd_tensor_parallel.vocab_padding import mask_padded_vocab, vocab_rows

#: Batch-first layout: the sequence dimension that sequence parallelism splits.
SEQUENCE_DIM = 1


@dataclass
class CausalLMOutput:
    """``loss``: mean over supervised tokens (``None`` without labels); ``logits``:
    ``[batch, seq, vocab / tp]``, this rank's vocabulary slice (``None`` when the fused linear
    cross-entropy computed the loss: it never materialises them)."""

    loss: torch.Tensor | None
    logits: torch.Tensor | None


#: Llama's attention heads over TP (:func:`nxd_tensor_parallel.layout_rules.head_layout`): K/V heads TP
#: does not divide are replicated (NxD's ``kv_size_multiplier``), query heads TP does not divide are
#: padded inside their KV groups (or by zero groups) as NxD's ``pad_model`` does
HEAD_RULE = dict(pad=True, hint=" (HF GQA groups query heads evenly over the KV heads)")


def kv_size_multiplier_for(config: LlamaConfig, tp: int) -> int:
    """How many times K/V heads are replicated over TP (NxD's ``kv_size_multiplier``, on the padded
    heads when TP does not divide the query heads; :data:`HEAD_RULE`)."""
    return head_layout(config.num_attention_heads, config.num_key_value_heads, tp, **HEAD_RULE).kv_size_multiplier


class KVCache:
    """Keys and values of past positions, one entry per layer (``[batch, kv_heads, seq, head_dim]``)."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer_idx] is not None:
            k = torch.cat([self.keys[layer_idx], k], dim=2)
            v = torch.cat([self.values[layer_idx], v], dim=2)
        self.keys[layer_idx], self.values[layer_idx] = k, v
        return k, v



def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The one-device ``attention_core`` (the contract: :mod:`nxd_context_parallel.transform`)
    through SDPA; without a mask causal when ``s_q == s_k`` and unmasked for single-token decoding."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # each KV head serves `groups` consecutive query heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    if attention_mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
    q_len, k_len = q.shape[2], k.shape[2]
    if q_len > 1 and q_len != k_len:
        raise ValueError(f"attention over {q_len} new tokens and {k_len} keys needs an attention_mask")
    return F.scaled_dot_product_attention(q, k, v, is_causal=q_len > 1)


class LlamaCoreAttention(nn.Module):
    """softmax(QK^T / sqrt(d)) V through its ``attention_core`` (SDPA; the ``context_parallel``
    transform swaps in ring attention over the CP ranks); the part selective activation
    checkpointing recomputes."""

    #: local KV head of each local query head when it is not the plain grouping (odd KV-head
    #: counts replicated over TP, e.g. 3 KV heads at TP=2); set by LlamaAttention
    kv_index: tuple[int, ...] | None = None

    def __init__(self) -> None:
        super().__init__()
        #: ``(q, k, v, attention_mask) -> out`` (the contract: :mod:`nxd_context_parallel.transform`)
        self.attention_core = sdpa_attention

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``q`` ``[b, heads, s_q, d]``, ``k``/``v`` ``[b, kv_heads, s_k, d]``; without a mask,
        causal when ``s_q == s_k`` and unmasked for single-token decoding."""
        if self.kv_index is not None:  # one K/V head per query head, picked by HF's grouping
            index = torch.tensor(self.kv_index, device=k.device)
            k, v = k.index_select(1, index), v.index_select(1, index)
        return self.attention_core(q, k, v, attention_mask)


class HeadRMSNorm(PlacedByPlan, RMSNorm):
    """RMSNorm over each attention head's features (Qwen3's ``q_norm``/``k_norm``): one replicated
    weight for all heads. TP ranks hold different heads, so each sees part of the weight's gradient:
    the weight enters through ``copy_to_tensor_model_parallel_region``, whose backward sums it over
    the TP group of the context the plan placed it in."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.weight
        if _size(self.parallel_context, "tp") > 1:
            weight = copy_to_tensor_model_parallel_region(weight, process_group=self.parallel_context.tp.group)
        return weight * h.to(x.dtype)


class LlamaAttention(nn.Module):
    """GQA attention with RoPE. Built on one device (all heads); the plan shards ``qkv_proj`` by
    heads (K/V replicated over TP as :func:`kv_size_multiplier_for` says) and ``o_proj`` by its
    input, then :meth:`nxd_parallelized` sets this rank's head counts."""

    def __init__(self, config: LlamaConfig, layer_idx: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.kv_size_multiplier = 1
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.fused_rope = "rope" in config.fused_kernels
        init = partial(nn.init.normal_, mean=0.0, std=config.initializer_range)
        self.qkv_proj = plain.QKVLinear(
            config.hidden_size,
            [config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim],
            bias=config.attention_bias, init_method=init, kv_size_multiplier_for=partial(kv_size_multiplier_for, config),
            dtype=config.torch_dtype, device=device,
        )
        # Qwen3: RMSNorm of every query and key head before RoPE (config.qk_norm)
        head_norm = partial(HeadRMSNorm, config.head_dim, eps=config.rms_norm_eps, dtype=config.torch_dtype,
                            device=device)
        self.q_norm, self.k_norm = (head_norm(), head_norm()) if config.qk_norm else (None, None)
        self.core_attention = LlamaCoreAttention()
        self.o_proj = plain.Linear(config.num_attention_heads * config.head_dim, config.hidden_size,
                                   bias=config.attention_bias, init_method=init, dtype=config.torch_dtype,
                                   device=device)
        # the plan pads both by heads (plan ``padded``) when TP does not divide the query heads
        self.qkv_proj.attention_heads = self.o_proj.attention_heads = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        #: which local query heads are real (None: all); padded heads' output is zeroed
        self.real_heads: tuple[bool, ...] | None = None

    def nxd_parallelized(self, context: ParallelContext | None) -> None:
        """This rank's heads once the plan has sharded the projections over ``context``'s TP
        (padded ones included when TP does not divide the query heads)."""
        config, tp, rank = self.config, _size(context, "tp"), _rank(context, "tp")
        layout = head_layout(config.num_attention_heads, config.num_key_value_heads, tp, **HEAD_RULE)
        self.kv_size_multiplier = m = layout.kv_size_multiplier
        padding = layout.padding
        if padding is not None:  # NxD's pad_model
            self.num_heads, self.num_kv_heads = padding.padded_heads // tp, padding.kv_groups * m // tp
            self.core_attention.kv_index = padding.local_kv_index(tp, rank)
            self.real_heads = padding.query_mask(tp, rank)
            return
        self.num_heads = config.num_attention_heads // tp
        self.num_kv_heads = config.num_key_value_heads * m // tp
        self.core_attention.kv_index = kv_heads.local_kv_index(
            config.num_attention_heads, config.num_key_value_heads, tp, rank, m)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states)
        b, s = q.shape[0], q.shape[1]
        q = q.view(b, s, self.num_heads, self.head_dim)
        k = k.view(b, s, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.fused_rope:
            q, k = fused_kernels.rope(q, k, cos, sin)
        else:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_idx, k, v)
        out = self.core_attention(q, k, v, attention_mask)
        if self.real_heads is not None:  # padded query heads: no output, so no gradient (NxD's padding mask)
            out = out * torch.tensor(self.real_heads, dtype=out.dtype, device=out.device).view(1, -1, 1, 1)
        out = out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.o_proj(out)


class LlamaActivationMultiply(nn.Module):
    """``silu(gate) * up``: its own module so selective recompute can name it (NxD Training's
    ``ActivationMultiplyMLP``); holds no parameters. ``fused``: Liger-Kernel's SwiGLU kernel (CUDA)."""

    def __init__(self, fused: bool = False) -> None:
        super().__init__()
        self.fused = fused

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return fused_kernels.swiglu(gate, up)
        return F.silu(gate) * up


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused in one projection of two
    pieces ``[gate; up]``: the plan shards each piece, so every rank's shard is ``[gate_r; up_r]``."""

    def __init__(self, config: LlamaConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        init = partial(nn.init.normal_, mean=0.0, std=config.initializer_range)
        linear = partial(plain.Linear, bias=config.mlp_bias, init_method=init, dtype=config.torch_dtype, device=device)
        self.gate_up_proj = linear(config.hidden_size, 2 * config.intermediate_size, fused_pieces=2)
        self.act_mul = LlamaActivationMultiply(fused="swiglu" in config.fused_kernels)
        self.down_proj = linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_mul(gate, up))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h + attn(norm(h))`` then ``h + mlp(norm(h))`` (the plan runs the norms on
    sequence shards under sequence parallelism)."""

    def __init__(self, config: LlamaConfig, layer_idx: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        norm = partial(RMSNorm, config.hidden_size, eps=config.rms_norm_eps, dtype=config.torch_dtype, device=device,
                       fused="rms_norm" in config.fused_kernels)
        self.input_layernorm = norm()
        self.self_attn = LlamaAttention(config, layer_idx, device)
        self.post_attention_layernorm = norm()
        self.mlp = LlamaMLP(config, device)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin, attention_mask, kv_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """Token embedding (the vocabulary: the plan pads it for TP where needed), the decoder blocks,
    the final norm and RoPE. A model on this one (Mixtral) sets its block class."""

    #: the block class, built ``decoder_layer_class(config, layer_idx, device)``
    decoder_layer_class: type[nn.Module] = LlamaDecoderLayer

    def __init__(self, config: LlamaConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        init = partial(nn.init.normal_, mean=0.0, std=config.initializer_range)
        self.embed_tokens = plain.Embedding(config.vocab_size, config.hidden_size, init_method=init,
                                            dtype=config.torch_dtype, device=device)
        self.layers = nn.ModuleList(self.decoder_layer_class(config, i, device) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=config.torch_dtype, device=device,
                            fused="rms_norm" in config.fused_kernels)
        # every rope_type nxd builds (linear, llama3, yarn), as transformers (YaRN's attention factor on cos/sin)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling,
                                          config.max_position_embeddings)

    def layer_inputs(self, input_ids: torch.Tensor, dtype: torch.dtype, position_ids: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None, past: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(cos, sin, mask)`` every decoder layer takes (``dtype``: the hidden states'), from the
        batch alone: pipeline stages recompute them instead of receiving them. A config with a
        ``sliding_window`` (Mistral, Mixtral) limits the mask to it."""
        b, s = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(past, past + s, device=input_ids.device).unsqueeze(0).expand(b, s)
        cos, sin = self.rotary_emb(position_ids, dtype)
        mask = build_attention_mask(attention_mask, b, s, input_ids.device, past=past)
        window = getattr(self.config, "sliding_window", None)
        return cos, sin, sliding_window_mask(mask, b, s, past, window, input_ids.device)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        past = kv_cache.length if kv_cache is not None else 0
        # the embedding's output dtype is its weight's
        cos, sin, mask = self.layer_inputs(input_ids, self.embed_tokens.weight.dtype, position_ids, attention_mask, past)
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, mask, kv_cache)
        return self.norm(hidden)


class LlamaForCausalLM(PlacedByPlan, nn.Module):
    """Llama with a vocabulary-parallel LM head and vocabulary-parallel cross-entropy.

    Built plain (one-device modules, ``(config, device)``); the ``parallel_plan`` transform
    (``initialize_parallel_model``, ``nxd.build_parallel_model``) parallelises it by
    :attr:`nxd_parallel_plan` and gives it its context (the loss's TP and CP groups)."""

    #: the family's parallel plan (data; the spec registers the same object)
    nxd_parallel_plan = LLAMA_PLAN
    #: query heads TP does not divide are padded by the plan (NxD's pad_model; zero heads, masked output)
    nxd_pads_attention_heads = True

    #: Blocks wrapped by full activation checkpointing and used as pipeline cut points.
    nxd_transformer_layer_classes = (LlamaDecoderLayer,)
    #: Recomputed by selective activation checkpointing.
    nxd_core_attention_classes = (LlamaCoreAttention,)
    #: the decoder and config classes (a family on this model, Mixtral's, sets its own)
    model_class: type[LlamaModel] = LlamaModel
    config_class: type[LlamaConfig] = LlamaConfig

    def __init__(self, config: LlamaConfig | dict, device: torch.device | str | None = None) -> None:
        super().__init__()
        config = self.config_class.from_dict(config) if isinstance(config, dict) else config
        self.config = config
        self.model = self.model_class(config, device)
        init = partial(nn.init.normal_, mean=0.0, std=config.initializer_range)
        # the vocabulary: a size TP does not divide is padded by the plan (pad=True), its padded
        # classes' logits -inf (:meth:`logits`), so loss, softmax and exports see the real vocabulary
        self.lm_head = plain.Linear(config.hidden_size, config.vocab_size, bias=False, init_method=init,
                                    dtype=config.torch_dtype, device=device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def nxd_parallelized(self, context: ParallelContext | None) -> None:
        """Refuses what the plan's layout cannot run: the fused linear cross-entropy needs the whole
        vocabulary on one rank."""
        if "cross_entropy" in self.config.fused_kernels and _size(context, "tp") > 1:
            raise ConfigError("fused_kernels: 'cross_entropy' (Liger's fused linear cross-entropy) needs the whole "
                              f"vocabulary on one rank; tensor_parallel_size is {_size(context, 'tp')} "
                              "(its logits are vocabulary-parallel): remove 'cross_entropy' or use tensor_parallel_size=1")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and LM head over all TP ranks: the vocabulary while plain, padded
        once the plan has parallelised them (the layers mark it: checkpoints hold the real rows)."""
        return vocab_rows(self.model.embed_tokens, self.lm_head)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary slice of the LM head's logits; padding columns are -inf."""
        return mask_padded_vocab(self.lm_head(hidden), self.config.vocab_size, _rank(self.parallel_context, "tp"))

    #: ``param_init_fn`` for meta-device init (each layer re-runs its own initialisation)
    init_weights = staticmethod(reset_parameters)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                segment_ids: torch.Tensor | None = None) -> CausalLMOutput:
        """``attention_mask``: see :mod:`nxd_models_llama.attention_mask`; ``segment_ids``
        ``[batch, seq]`` (packed examples, 0 = padding) is used when no ``attention_mask`` is given."""
        if attention_mask is None and segment_ids is not None:
            attention_mask = segment_ids
        hidden = self.model(input_ids, position_ids, attention_mask, kv_cache)
        if labels is not None and "cross_entropy" in self.config.fused_kernels:
            return CausalLMOutput(loss=self._fused_loss(hidden, labels, loss_mask), logits=None)
        logits = self.logits(hidden)
        loss = None if labels is None else causal_lm_loss(logits, labels, loss_mask, self.parallel_context)
        return CausalLMOutput(loss=loss, logits=logits)

    def _fused_loss(self, hidden: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
        """:func:`causal_lm_loss` of ``lm_head(hidden)`` through the fused linear cross-entropy."""
        weight = self.lm_head.weight[: self.config.vocab_size]  # TP=1: no padding rows, but never count them
        return fused_linear_causal_lm_loss(hidden, weight, labels, loss_mask, self.parallel_context)

    # -- pipeline contract (docs/pipeline.md): duck-typed, no nxd-pipeline import. The stages run
    # the same modules as forward(); only the hidden state travels, RoPE and masks are recomputed.
    def nxd_pipeline_layout(self) -> dict[str, object]:
        """Dotted paths: modules of the first stage, the layer list, modules of the last stage
        (``rotary_emb`` has no parameters and stays on every stage)."""
        return {"embed": ["model.embed_tokens"], "layers": "model.layers", "head": ["model.norm", "lm_head"]}

    def nxd_pipeline_embed(self, input_ids: torch.Tensor, **batch: object) -> torch.Tensor:
        """First stage: token embeddings (sequence-sharded under sequence parallelism)."""
        return self.model.embed_tokens(input_ids)

    def nxd_pipeline_layer(self, layer: nn.Module, hidden: torch.Tensor, input_ids: torch.Tensor | None = None,
                           position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                           segment_ids: torch.Tensor | None = None, **batch: object) -> torch.Tensor:
        """One decoder layer, with positions, RoPE and the mask rebuilt from the micro-batch."""
        if input_ids is None:
            raise ValueError("the Llama pipeline stages need the micro-batch's input_ids (for positions and masks)")
        if attention_mask is None and segment_ids is not None:
            attention_mask = segment_ids
        cos, sin, mask = self.model.layer_inputs(input_ids, hidden.dtype, position_ids, attention_mask)
        return layer(hidden, cos, sin, mask)

    def nxd_pipeline_head(self, hidden: torch.Tensor, labels: torch.Tensor | None = None,
                          loss_mask: torch.Tensor | None = None, **batch: object) -> torch.Tensor:
        """Last stage: final norm, LM head and the micro-batch's mean loss (as forward's ``.loss``)."""
        if labels is None:
            raise ValueError("pipeline training needs 'labels' in the batch (the last stage returns the loss)")
        hidden = self.model.norm(hidden)
        if "cross_entropy" in self.config.fused_kernels:
            return self._fused_loss(hidden, labels, loss_mask)
        return causal_lm_loss(self.logits(hidden), labels, loss_mask, self.parallel_context)
