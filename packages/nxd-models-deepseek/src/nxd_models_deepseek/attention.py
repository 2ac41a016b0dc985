"""Multi-head latent attention (DeepSeek-V2/V3), built on one device and sharded by the family's
plan (:mod:`nxd_models_deepseek.plan`).

Queries: ``q_b_proj(norm(q_a_proj(x)))`` (or ``q_proj(x)`` without ``q_lora_rank``); keys and
values from one compressed latent: ``kv_a_proj_with_mqa(x)`` = ``[c_kv (kv_lora_rank); k_rope]``,
``kv_b_proj(norm(c_kv))`` = per head ``[k_nope; v]``. RoPE acts on the decoupled ``qk_rope_head_dim``
part only; the rotary key ``k_rope`` is one head shared by all heads.

Tensor parallelism: heads are split (``q_b_proj``/``q_proj`` and ``kv_b_proj`` column-parallel,
``o_proj`` row-parallel); the down projections and their norms are small and replicated, computed on
the whole sequence (gathered under sequence parallelism). Their outputs' gradients are complete on
every rank after the column-parallel layers' all-reduce, except the shared rotary key's, which each
rank's heads only partly use: it is summed over TP (``copy_to_tensor_model_parallel_region``).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from nxd.parallel import ParallelContext, dim_group, dim_size
from nxd_modeling.rotary import apply_rotary, yarn_softmax_scale
from nxd_models_deepseek.config import DeepseekV3Config
from nxd_models_llama import KVCache, LlamaCoreAttention
from nxd_tensor_parallel.layout_rules import head_layout
from nxd_tensor_parallel.modules import plain
from nxd_tensor_parallel.modules.plain import PlacedByPlan
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)

SEQUENCE_DIM = 1


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """DeepSeek's checkpoints rotate pairs ``(x0, x1), (x2, x3), ...``; reordered as
    ``[x0, x2, ...; x1, x3, ...]`` the rotate-half RoPE gives the same result (HF's
    ``apply_rotary_pos_emb_interleave`` returns this order too)."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class LatentRMSNorm(RMSNorm):
    """The RMSNorm of a low-rank latent (``q_a_layernorm``, ``kv_a_layernorm``): replicated and
    applied to the whole sequence, never sequence-parallel (its own class so the parallel plan,
    which reads every plain ``RMSNorm`` as sequence-parallel, leaves it out)."""


class DeepseekV3Attention(PlacedByPlan, nn.Module):
    """Built plain; the plan shards its heads and gives it its context and sequence parallelism."""

    def __init__(self, config: DeepseekV3Config, layer_idx: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.num_heads = config.num_attention_heads  # this rank's, once the plan shards the heads
        self.kv_size_multiplier = 1  # every head has its own keys: nothing replicated
        init = partial(nn.init.normal_, mean=0.0, std=config.initializer_range)
        dtype, n, bias = config.torch_dtype, config.num_attention_heads, config.attention_bias
        # column parallel by the plan, on whole-sequence inputs (its whole_sequence)
        column = partial(plain.Linear, bias=False, init_method=init, dtype=dtype, device=device)
        norm = partial(LatentRMSNorm, eps=config.rms_norm_eps, dtype=dtype, device=device)
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=bias, dtype=dtype, device=device)
            self.q_a_layernorm = norm(config.q_lora_rank)
            self.q_b_proj = column(config.q_lora_rank, n * config.qk_head_dim)
        else:
            self.q_proj = column(config.hidden_size, n * config.qk_head_dim)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, config.kv_lora_rank + config.qk_rope_head_dim,
                                            bias=bias, dtype=dtype, device=device)
        self.kv_a_layernorm = norm(config.kv_lora_rank)
        self.kv_b_proj = column(config.kv_lora_rank, n * (config.qk_nope_head_dim + config.v_head_dim))
        self.core_attention = LlamaCoreAttention()
        #: YaRN with ``mscale_all_dim`` sharpens the softmax by this factor (transformers' ``yarn_apply_mscale``);
        #: applied to the queries so every attention core (SDPA, ring attention) keeps its 1/sqrt(d)
        self.softmax_scale = yarn_softmax_scale(config.rope_scaling)
        self.o_proj = plain.Linear(n * config.v_head_dim, config.hidden_size, bias=bias, init_method=init, dtype=dtype,
                                   device=device)
        self.reset_parameters()

    def nxd_parallelized(self, context: ParallelContext | None) -> None:
        """This rank's heads once the plan has sharded the projections over ``context``'s TP."""
        tp = dim_size(context, "tp")
        # MLA: each query head has its own K/V (no replication, no padding)
        head_layout(self.config.num_attention_heads, None, tp, replicate_kv=False)
        self.num_heads = self.config.num_attention_heads // tp

    def reset_parameters(self) -> None:
        """The replicated down projections start like the parallel layers: ``N(0, initializer_range)``."""
        for linear in (getattr(self, "q_a_proj", None), self.kv_a_proj_with_mqa):
            if linear is not None and not linear.weight.is_meta:
                nn.init.normal_(linear.weight, 0.0, self.config.initializer_range)
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)

    def forward(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attention_mask: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        c = self.config
        x = hidden_states
        tp_group = dim_group(self.parallel_context, "tp")
        if self.sequence_parallel and dim_size(self.parallel_context, "tp") > 1:
            # the replicated projections see the whole sequence; their input gradient is complete on
            # every rank, so backward keeps this rank's slice of it
            x = gather_from_sequence_parallel_region(x, SEQUENCE_DIM, to_model_parallel=False, process_group=tp_group)
        b, s, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if c.q_lora_rank else self.q_proj(x)
        q = q.view(b, s, self.num_heads, c.qk_head_dim).transpose(1, 2)
        q_pass, q_rot = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        kv_latent, k_rot = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_latent)).view(b, s, self.num_heads, -1).transpose(1, 2)
        k_pass, value = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        k_rot = copy_to_tensor_model_parallel_region(k_rot, process_group=tp_group).view(b, 1, s, c.qk_rope_head_dim)
        if c.rope_interleave:
            q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
        q_rot, k_rot = apply_rotary(q_rot, cos, sin), apply_rotary(k_rot, cos, sin)
        query = torch.cat([q_pass, q_rot], dim=-1)
        if self.softmax_scale != 1.0:
            query = query * self.softmax_scale
        key = torch.cat([k_pass, k_rot.expand(b, self.num_heads, s, c.qk_rope_head_dim)], dim=-1)
        if kv_cache is not None:
            key, value = kv_cache.update(self.layer_idx, key, value)
        out = self.core_attention(query, key, value, attention_mask)  # softmax scale 1/sqrt(qk_head_dim) (x softmax_scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.num_heads * c.v_head_dim))
