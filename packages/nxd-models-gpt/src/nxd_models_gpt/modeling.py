"""The Megatron GPT decoder (batch-first ``[batch, seq, hidden]``), built from one-device modules
and parallelised by its plan (:mod:`nxd_models_gpt.plan`).

Module names follow Megatron-core's GPTModel (local layer spec): ``embedding.word_embeddings``,
``embedding.position_embeddings``, ``decoder.layers.N.{input_layernorm, self_attention.linear_qkv,
self_attention.linear_proj, pre_mlp_layernorm, mlp.linear_fc1, mlp.linear_fc2}``,
``decoder.final_layernorm``, ``output_layer``. ``linear_qkv`` holds Megatron's interleaved layout:
per query group ``[its query heads; its key head; its value head]``, groups contiguous, so a TP rank's
rows are a plain contiguous slice (rank r holds groups ``[r*G/tp, (r+1)*G/tp)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from nxd.parallel import ParallelContext, dim_group, dim_rank, dim_size
from nxd_core_parallel.model_init import reset_parameters
from nxd_modeling.attention_mask import build_attention_mask
from nxd_modeling.lm_loss import causal_lm_loss
from nxd_modeling.rotary import RotaryEmbedding, apply_rotary
from nxd_models_gpt.config import GPTConfig
from nxd_models_gpt.plan import GPT_PLAN
from nxd_tensor_parallel.modules import plain
from nxd_tensor_parallel.modules.kv_heads import kv_local_index
from nxd_tensor_parallel.modules.plain import PlacedByPlan
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers import (
    LayerNorm,
    get_rng_tracker,
    scatter_to_sequence_parallel_region,
    set_tensor_model_parallel_attributes,
)
from nxd_tensor_parallel.vocab_padding import mask_padded_vocab, vocab_rows

#: Batch-first activations: sequence parallelism splits dimension 1.
SEQUENCE_DIM = 1


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None
    #: this TP rank's slice of the (padded) vocabulary; padded entries are -inf
    logits: torch.Tensor


def _tp(context: ParallelContext | None) -> int:
    return dim_size(context, "tp")


def _dropout(x: torch.Tensor, p: float, training: bool, rank_local: bool) -> torch.Tensor:
    """Dropout; ``rank_local`` activations (TP-sharded heads, sequence shards) draw from the
    tracker's per-TP-rank state when one is seeded, as Megatron does."""
    if not training or p == 0.0:
        return x
    tracker = get_rng_tracker()
    if rank_local and tracker.states:
        with tracker.fork():
            return F.dropout(x, p, True)
    return F.dropout(x, p, True)


def _norm(config: GPTConfig, device: torch.device | str | None) -> nn.Module:
    """The config's norm (the plan runs it on sequence shards under sequence parallelism)."""
    norm = RMSNorm if config.normalization == "RMSNorm" else LayerNorm
    return norm(config.hidden_size, eps=config.layernorm_epsilon, dtype=config.torch_dtype, device=device)


def init_methods(config: GPTConfig) -> tuple[partial, partial]:
    """``(init, output_init)``: N(0, init_method_std), and for the layers that write into the
    residual stream (``linear_proj``, ``linear_fc2``) std / sqrt(2 * num_layers) when
    ``use_scaled_init_method`` (Megatron's ``scaled_init_method_normal``)."""
    std = config.init_method_std
    out_std = std / math.sqrt(2.0 * config.num_layers) if config.use_scaled_init_method else std
    return partial(nn.init.normal_, mean=0.0, std=std), partial(nn.init.normal_, mean=0.0, std=out_std)


class GPTCoreAttention(nn.Module):
    """softmax(QK^T / sqrt(d)) V with causal or given mask; what selective checkpointing recomputes."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        if p:
            with get_rng_tracker().fork() if get_rng_tracker().states else _null():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class GPTSelfAttention(nn.Module):
    """Megatron attention over ``linear_qkv``'s interleaved groups. Sharded by whole query groups
    when TP divides them; otherwise the plan replicates K/V heads over TP (NxD's
    ``kv_size_multiplier``): each rank holds ``[its q heads; its KV piece's k; v]`` and every local
    query head attends to its group's KV head (``kv_index``)."""

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.num_query_groups = config.num_query_groups
        self.num_heads = config.num_attention_heads
        self.head_dim = config.kv_channels
        self.heads_per_group = config.num_attention_heads // config.num_query_groups
        self.local_groups = config.num_query_groups  # this rank's, once the plan shards the groups
        #: K/V replicated over TP (kv_size_multiplier > 1): (local q heads, local kv heads, kv head of each q head)
        self.replicated_kv: tuple[int, int, tuple[int, ...]] | None = None
        init, out_init = init_methods(config)
        linear = partial(plain.Linear, bias=config.has_bias, dtype=config.torch_dtype, device=device)
        self.linear_qkv = plain.GroupedQKVLinear(config.hidden_size, config.num_attention_heads,
                                                 config.num_query_groups, self.head_dim, bias=config.has_bias,
                                                 init_method=init, dtype=config.torch_dtype, device=device)
        self.core_attention = GPTCoreAttention(config.attention_dropout)
        self.linear_proj = linear(config.num_attention_heads * self.head_dim, config.hidden_size, init_method=out_init)
        # padded with linear_qkv (zero query groups) when TP does not divide the query heads
        self.linear_proj.pad_heads = (self.num_heads, self.heads_per_group * self.head_dim)

    def nxd_parallelized(self, context: ParallelContext | None) -> None:
        """This rank's query groups (or replicated KV heads) once the plan has sharded ``linear_qkv``."""
        tp = _tp(context)
        m = getattr(self.linear_qkv, "kv_size_multiplier", 1)
        if m == 1:  # whole groups per rank, zero groups included when the plan padded them (pad_model)
            self.local_groups = self.linear_qkv.weight.shape[0] // ((self.heads_per_group + 2) * self.head_dim)
            return
        lq, lk = self.num_heads // tp, self.num_query_groups * m // tp
        index = kv_local_index(self.num_heads, self.num_query_groups, tp, dim_rank(context, "tp"), m)
        self.replicated_kv = (lq, lk, tuple(index))

    def _split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[b, s, rows]`` -> q ``[b, heads, s, d]``, k/v ``[b, kv_heads, s, d]`` (this rank's)."""
        b, s, hd = qkv.shape[0], qkv.shape[1], self.head_dim
        if self.replicated_kv is not None:
            lq, lk, _ = self.replicated_kv
            q, k, v = qkv.split([lq * hd, lk * hd, lk * hd], dim=-1)
            return (q.view(b, s, lq, hd).transpose(1, 2), k.view(b, s, lk, hd).transpose(1, 2),
                    v.view(b, s, lk, hd).transpose(1, 2))
        qpg = self.heads_per_group
        qkv = qkv.view(b, s, self.local_groups, qpg + 2, hd)
        q = qkv[:, :, :, :qpg].reshape(b, s, self.local_groups * qpg, hd).transpose(1, 2)
        return q, qkv[:, :, :, qpg].transpose(1, 2), qkv[:, :, :, qpg + 1].transpose(1, 2)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self._split_qkv(self.linear_qkv(x))
        b, s = x.shape[0], q.shape[2]
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if self.replicated_kv is not None:  # each local query head's KV head, by Megatron's grouping
            index = torch.tensor(self.replicated_kv[2], device=k.device)
            k, v = k.index_select(1, index), v.index_select(1, index)
        elif self.heads_per_group > 1:
            k, v = k.repeat_interleave(self.heads_per_group, dim=1), v.repeat_interleave(self.heads_per_group, dim=1)
        out = self.core_attention(q, k, v, mask)
        return self.linear_proj(out.transpose(1, 2).reshape(b, s, -1))


class GPTMLP(nn.Module):
    """``fc2(act(fc1(x)))``; for swiglu ``fc1`` holds ``[gate; up]`` (each TP rank ``[gate_r; up_r]``)."""

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.gated = config.activation == "swiglu"
        self.openai_gelu = config.openai_gelu
        self.ffn_dropout = config.ffn_dropout
        init, out_init = init_methods(config)
        linear = partial(plain.Linear, bias=config.has_bias, dtype=config.torch_dtype, device=device)
        width = 2 * config.ffn_hidden_size if self.gated else config.ffn_hidden_size
        # gated: [gate; up] as two pieces, each sharded by the plan (every rank's shard [gate_r; up_r])
        self.linear_fc1 = linear(config.hidden_size, width, init_method=init, fused_pieces=2 if self.gated else 1)
        self.linear_fc2 = linear(config.ffn_hidden_size, config.hidden_size, init_method=out_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_fc1(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh" if self.openai_gelu else "none")
        h = _dropout(h, self.ffn_dropout, self.training, rank_local=True)
        return self.linear_fc2(h)


class GPTTransformerLayer(PlacedByPlan, nn.Module):
    """One block: pre-LN ``x + attn(ln(x))``, ``x + mlp(ln(x))``; parallel residual
    ``x + attn(ln1(x)) + mlp(ln2(x))``; or post-LN (NeMo) ``h = ln1(x + attn(x))``, ``ln2(h + mlp(h))``.
    Under sequence parallelism (the plan's) its dropout draws per TP rank."""

    def __init__(self, config: GPTConfig, layer_number: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.layer_number = layer_number
        self.post_ln = config.transformer_block_type == "post_ln"
        self.parallel_residual = config.parallel_residual
        self.hidden_dropout = config.hidden_dropout
        self.self_attention = GPTSelfAttention(config, device)
        self.mlp = GPTMLP(config, device)
        if self.post_ln:
            self.post_attention_layernorm, self.post_mlp_layernorm = _norm(config, device), _norm(config, device)
        else:
            self.input_layernorm, self.pre_mlp_layernorm = _norm(config, device), _norm(config, device)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return _dropout(x, self.hidden_dropout, self.training, rank_local=self.sequence_parallel)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        if self.post_ln:
            h = self.post_attention_layernorm(x + self._drop(self.self_attention(x, rope, mask)))
            return self.post_mlp_layernorm(h + self._drop(self.mlp(h)))
        attn = self._drop(self.self_attention(self.input_layernorm(x), rope, mask))
        if self.parallel_residual:
            return x + attn + self._drop(self.mlp(self.pre_mlp_layernorm(x)))
        h = x + attn
        return h + self._drop(self.mlp(self.pre_mlp_layernorm(h)))


class GPTEmbedding(PlacedByPlan, nn.Module):
    """Vocabulary-parallel word embeddings (+ replicated learned positions), dropout, and the
    scatter to sequence shards under sequence parallelism (Megatron's order; the plan's context and SP)."""

    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        init, _ = init_methods(config)
        self.dropout = config.hidden_dropout
        # the vocabulary; the plan pads it Megatron's way (a multiple of make_vocab_size_divisible_by x TP)
        self.word_embeddings = plain.Embedding(config.vocab_size, config.hidden_size, init_method=init,
                                               dtype=config.torch_dtype, device=device)
        self.word_embeddings.pad_alignment_size_per_rank = config.make_vocab_size_divisible_by
        self.position_embeddings = None
        if config.position_embedding_type == "learned_absolute":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                    dtype=config.torch_dtype, device=device)
            set_tensor_model_parallel_attributes(self.position_embeddings.weight, False, -1, 1)
            self._init = init
            self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.position_embeddings is not None and not self.position_embeddings.weight.is_meta:
            with torch.no_grad():
                self._init(self.position_embeddings.weight)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        h = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            if int(position_ids.max()) >= self.position_embeddings.num_embeddings:
                raise ValueError(f"position {int(position_ids.max())} exceeds max_position_embeddings "
                                 f"({self.position_embeddings.num_embeddings})")
            h = h + self.position_embeddings(position_ids)
        if self.sequence_parallel:
            h = scatter_to_sequence_parallel_region(h, SEQUENCE_DIM,
                                                    process_group=dim_group(self.parallel_context, "tp"))
        return _dropout(h, self.dropout, self.training, rank_local=self.sequence_parallel)


class GPTDecoder(nn.Module):
    def __init__(self, config: GPTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(GPTTransformerLayer(config, i + 1, device) for i in range(config.num_layers))
        # NeMo's post-LN stack ends with the last block's norm (no final layernorm)
        self.final_layernorm = None if config.transformer_block_type == "post_ln" else _norm(config, device)


class GPTForCausalLM(PlacedByPlan, nn.Module):
    """Megatron GPT with a vocabulary-parallel output layer and vocabulary-parallel cross-entropy.
    Built plain (one-device modules, ``(config, device)``); the ``parallel_plan`` transform
    parallelises it by :attr:`nxd_parallel_plan`, Megatron's vocabulary padding included, and gives
    it its context."""

    #: the family's parallel plan (data; the spec registers the same object)
    nxd_parallel_plan = GPT_PLAN
    #: query heads TP does not divide are padded with zero query groups by the plan (NxD's pad_model)
    nxd_pads_attention_heads = True

    #: Blocks wrapped by full activation checkpointing and used as pipeline cut points.
    nxd_transformer_layer_classes = (GPTTransformerLayer,)
    #: Recomputed by selective activation checkpointing.
    nxd_core_attention_classes = (GPTCoreAttention,)

    def __init__(self, config: GPTConfig | dict, device: torch.device | str | None = None) -> None:
        super().__init__()
        config = GPTConfig.from_dict(config) if isinstance(config, dict) else config
        self.config = config
        self.embedding = GPTEmbedding(config, device)
        self.decoder = GPTDecoder(config, device)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rotary_base) \
            if config.position_embedding_type == "rope" else None
        init, _ = init_methods(config)
        self.output_layer = plain.Linear(config.hidden_size, config.vocab_size, bias=False, init_method=init,
                                         dtype=config.torch_dtype, device=device)
        self.output_layer.pad_alignment_size_per_rank = config.make_vocab_size_divisible_by
        if config.share_embeddings_and_output_weights:
            self.output_layer.weight = self.embedding.word_embeddings.weight

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the vocabulary layers over all TP ranks: the vocabulary while plain, Megatron's
        padding once the plan has parallelised them (the layers mark it: checkpoints hold the real rows)."""
        return vocab_rows(self.embedding and self.embedding.word_embeddings, self.output_layer)

    #: ``param_init_fn`` for meta-device init (each layer re-runs its own initialisation)
    init_weights = staticmethod(reset_parameters)

    # -- pieces shared by forward() and the pipeline stages
    def layer_inputs(self, input_ids: torch.Tensor, dtype: torch.dtype, position_ids: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None
                     ) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, torch.Tensor | None]:
        """``(rope cos/sin or None, mask)`` every layer takes, recomputed from the batch alone."""
        b, s = input_ids.shape
        rope = None
        if self.rotary_emb is not None:
            if position_ids is None:
                position_ids = torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)
            rope = self.rotary_emb(position_ids, dtype)
        return rope, build_attention_mask(attention_mask, b, s, input_ids.device)

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + output layer; padded vocabulary entries are -inf (no probability)."""
        if self.decoder.final_layernorm is not None:
            hidden = self.decoder.final_layernorm(hidden)
        return mask_padded_vocab(self.output_layer(hidden), self.config.vocab_size, dim_rank(self.parallel_context, "tp"))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, segment_ids: torch.Tensor | None = None) -> CausalLMOutput:
        """``labels`` are aligned with ``input_ids`` (no shift here); ``attention_mask``/``segment_ids``
        as in docs/plugins/models.md."""
        if attention_mask is None and segment_ids is not None:
            attention_mask = segment_ids
        hidden = self.embedding(input_ids, position_ids)
        rope, mask = self.layer_inputs(input_ids, hidden.dtype, position_ids, attention_mask)
        for layer in self.decoder.layers:
            hidden = layer(hidden, rope, mask)
        logits = self.vocab_logits(hidden)
        loss = None if labels is None else causal_lm_loss(logits, labels, loss_mask, self.parallel_context)
        return CausalLMOutput(loss=loss, logits=logits)

    # -- pipeline contract (docs/pipeline.md), duck-typed: no nxd-pipeline import
    def nxd_pipeline_layout(self) -> dict[str, object]:
        head = (["decoder.final_layernorm"] if self.decoder.final_layernorm is not None else []) + ["output_layer"]
        return {"embed": ["embedding"], "layers": "decoder.layers", "head": head}

    def nxd_pipeline_embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                           **batch: object) -> torch.Tensor:
        return self.embedding(input_ids, position_ids)

    def nxd_pipeline_layer(self, layer: nn.Module, hidden: torch.Tensor, input_ids: torch.Tensor | None = None,
                           position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                           segment_ids: torch.Tensor | None = None, **batch: object) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("the GPT pipeline stages need the micro-batch's input_ids (for positions and masks)")
        if attention_mask is None and segment_ids is not None:
            attention_mask = segment_ids
        rope, mask = self.layer_inputs(input_ids, hidden.dtype, position_ids, attention_mask)
        return layer(hidden, rope, mask)

    def nxd_pipeline_head(self, hidden: torch.Tensor, labels: torch.Tensor | None = None,
                          loss_mask: torch.Tensor | None = None, **batch: object) -> torch.Tensor:
        if labels is None:
            raise ValueError("pipeline training needs 'labels' in the batch (the last stage returns the loss)")
        return causal_lm_loss(self.vocab_logits(hidden), labels, loss_mask, self.parallel_context)
