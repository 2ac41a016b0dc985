"""Where every nxd parameter of one TP rank comes from in a Hugging Face Llama checkpoint.

A *plan* lists, for one local parameter, the HF tensors and the index ranges (along one
dimension) whose concatenation is that rank's shard. Import reads exactly those slices; export
gathers every rank's shard and writes each piece back to its HF rows, so both directions share one
description and cannot drift apart.

Layout notes (also published as ``spec.extras["hf_key_mapping"]``):

* ``self_attn.qkv_proj.weight_qkv`` = this rank's ``[q; k; v]`` rows (HF ``q_proj``/``k_proj``/
  ``v_proj``), heads contiguous per rank.
* With KV replication (``kv_size_multiplier`` m > 1, when TP does not divide the KV-head count)
  TP rank r holds KV piece ``r // m`` of the ``tp / m`` pieces (nxd-tensor-parallel's Megatron
  layout: replicas on neighbouring ranks). The piece holds every KV head its contiguous query
  heads ``[r*Lq, (r+1)*Lq)`` attend to (for odd counts, e.g. 3 KV heads at TP=2, that is all of
  them, and the attention picks each query head's KV head), so q/k/v and ``o_proj`` shards are
  contiguous slices in HF head order.
* Query heads TP does not divide are padded (``kv_heads.HeadPadding``: zero query heads at the
  end of each KV group, zero groups): a shard's padded heads are zero rows (``Piece.zeros``) no
  HF tensor holds, so imports fill them with zeros and exports drop them.
* ``mlp.gate_up_proj.weight`` = this rank's ``[gate; up]`` rows (``fused_splits``).
* A vocabulary not divisible by TP is padded at its end (``pad=True``): the last ranks' embedding
  and LM-head shards end in zero rows that no HF tensor holds (``Piece.zeros``).
"""

from __future__ import annotations

import re

from nxd_modeling.hf_pipeline import Piece
from nxd_models_llama.config import LlamaConfig
from nxd_tensor_parallel.modules import kv_heads
from nxd_tensor_parallel.parallel_layers import get_padding_length


def _rows(key: str, start: int, stop: int, dim: int = 0) -> Piece:
    return Piece(key, dim, tuple(range(start, stop)))


def _heads(key: str, heads: list[int | None], head_dim: int, dim: int = 0) -> list[Piece]:
    """The pieces of ``heads`` (HF head indices; None: a padded head, zero rows no HF tensor holds)."""
    runs: list[tuple[list[int], int]] = [([], 0)]  # (real heads, zero heads after them)
    for h in heads:
        if h is None:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        elif runs[-1][1]:
            runs.append(([h], 0))
        else:
            runs[-1][0].append(h)
    return [Piece(key, dim, tuple(r * head_dim + d for r in run for d in range(head_dim)), zeros=zeros * head_dim)
            for run, zeros in runs]


def heads_of_rank(config: LlamaConfig, tp: int, rank: int, kv_size_multiplier: int
                  ) -> tuple[list[int | None], list[int | None]]:
    """``(query heads, kv heads)`` (HF head indices; None: a padded head) held by TP ``rank``, in
    local order: contiguous query heads, and KV piece ``rank // m`` of the ``tp / m`` distinct KV
    pieces (:func:`nxd_tensor_parallel.modules.kv_heads.heads_of_rank`); when TP does not divide the
    query heads, those of the padded layout (:func:`~nxd_tensor_parallel.modules.kv_heads.head_padding_for`)."""
    padding = kv_heads.head_padding_for(config.num_attention_heads, config.num_key_value_heads, tp)
    if padding.padded:
        return padding.heads_of_rank(tp, rank)
    q, kv = kv_heads.heads_of_rank(config.num_attention_heads, config.num_key_value_heads, tp, rank,
                                   kv_size_multiplier)
    return list(q), list(kv)


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def tied_hf_key(name: str, config: LlamaConfig) -> str:
    """``name``, or the embedding's key for the LM head of a tied model: the copy a later pipeline
    stage keeps of the tied weight is read from the one tensor HF stores."""
    return "model.embed_tokens.weight" if name == "lm_head.weight" and config.tie_word_embeddings else name


def plan_for(name: str, config: LlamaConfig, tp: int, rank: int, kv_size_multiplier: int) -> list[Piece]:
    """The pieces that make parameter ``name`` (nxd name) on TP ``rank``."""
    hd, inter = config.head_dim, config.intermediate_size
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        vocab = config.vocab_size
        per = (vocab + get_padding_length(vocab, tp)) // tp
        start, stop = min(rank * per, vocab), min((rank + 1) * per, vocab)
        return [Piece(tied_hf_key(name, config), 0, tuple(range(start, stop)), zeros=per - (stop - start))]
    if name == "model.norm.weight":
        return [Piece(name, None)]
    match = _LAYER.match(name)
    if match is None:
        raise KeyError(name)
    prefix, rest = f"model.layers.{match.group(1)}.", match.group(2)
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    q_heads, kv_heads = heads_of_rank(config, tp, rank, kv_size_multiplier)
    if rest in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                "self_attn.k_norm.weight"):
        return [Piece(name, None)]
    if rest in ("self_attn.qkv_proj.weight_qkv", "self_attn.qkv_proj.bias_qkv"):
        kind = rest.rsplit("_", 1)[0].rsplit(".", 1)[1]  # "weight" or "bias"
        return [*_heads(f"{attn}q_proj.{kind}", q_heads, hd), *_heads(f"{attn}k_proj.{kind}", kv_heads, hd),
                *_heads(f"{attn}v_proj.{kind}", kv_heads, hd)]
    split = re.fullmatch(r"self_attn\.qkv_proj\.(weight|bias)_([qkv])", rest)
    if split:
        kind, which = split.groups()
        return _heads(f"{attn}{which}_proj.{kind}", q_heads if which == "q" else kv_heads, hd)
    if rest == "self_attn.o_proj.weight":
        return _heads(f"{attn}o_proj.weight", q_heads, hd, dim=1)
    if rest == "self_attn.o_proj.bias":
        return [Piece(f"{attn}o_proj.bias", None)]
    if rest in ("mlp.gate_up_proj.weight", "mlp.gate_up_proj.bias"):
        kind = rest.rsplit(".", 1)[1]
        per = inter // tp
        return [_rows(f"{mlp}gate_proj.{kind}", rank * per, (rank + 1) * per),
                _rows(f"{mlp}up_proj.{kind}", rank * per, (rank + 1) * per)]
    if rest == "mlp.down_proj.weight":
        per = inter // tp
        return [_rows(f"{mlp}down_proj.weight", rank * per, (rank + 1) * per, dim=1)]
    if rest == "mlp.down_proj.bias":
        return [Piece(f"{mlp}down_proj.bias", None)]
    raise KeyError(name)


def hf_shapes(config: LlamaConfig, dense_mlp: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor of the HF checkpoint for ``config`` and its shape. ``dense_mlp=False`` leaves
    out the MLP tensors (a family with its own feed-forward, such as Mixtral's experts)."""
    h, v, hd, inter = config.hidden_size, config.vocab_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
        })
        if config.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        if dense_mlp:
            shapes.update({p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                           p + "mlp.down_proj.weight": (h, inter)})
        if config.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,), p + "self_attn.o_proj.bias": (h,)})
        if config.mlp_bias and dense_mlp:
            shapes.update({p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                           p + "mlp.down_proj.bias": (h,)})
    return shapes


#: Published mapping (``spec.extras["hf_key_mapping"]``): nxd module -> HF modules, and how split.
HF_KEY_MAPPING: list[dict[str, object]] = [
    {"nxd": "model.embed_tokens.weight", "hf": ["model.embed_tokens.weight"], "partition_dim": 0,
     "note": "vocabulary-parallel: rank r holds rows [r*V/tp, (r+1)*V/tp)"},
    {"nxd": "model.layers.{i}.input_layernorm.weight", "hf": ["model.layers.{i}.input_layernorm.weight"],
     "partition_dim": None, "note": "replicated"},
    {"nxd": "model.layers.{i}.self_attn.qkv_proj.weight_qkv",
     "hf": ["model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
            "model.layers.{i}.self_attn.v_proj.weight"],
     "partition_dim": 0,
     "note": "local rows = [q heads of this rank; its kv heads; its kv heads] (fused_splits), all "
             "contiguous in HF order; with kv_size_multiplier m>1 rank r holds kv piece r // m"},
    {"nxd": "model.layers.{i}.self_attn.o_proj.weight", "hf": ["model.layers.{i}.self_attn.o_proj.weight"],
     "partition_dim": 1, "note": "columns of this rank's query heads"},
    {"nxd": "model.layers.{i}.post_attention_layernorm.weight",
     "hf": ["model.layers.{i}.post_attention_layernorm.weight"], "partition_dim": None, "note": "replicated"},
    {"nxd": "model.layers.{i}.mlp.gate_up_proj.weight",
     "hf": ["model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"], "partition_dim": 0,
     "note": "local rows = [gate rows r*I/tp..(r+1)*I/tp; up rows, same range] (fused_splits, pieces contiguous)"},
    {"nxd": "model.layers.{i}.mlp.down_proj.weight", "hf": ["model.layers.{i}.mlp.down_proj.weight"],
     "partition_dim": 1, "note": "columns r*I/tp..(r+1)*I/tp"},
    {"nxd": "model.norm.weight", "hf": ["model.norm.weight"], "partition_dim": None, "note": "replicated"},
    {"nxd": "lm_head.weight", "hf": ["lm_head.weight"], "partition_dim": 0,
     "note": "vocabulary-parallel; absent (shared with embed_tokens) when tie_word_embeddings"},
]

#: HF/PEFT module name -> (nxd module suffix, which fused piece or None). LoRA uses this.
HF_MODULE_TO_NXD: dict[str, tuple[str, str | None]] = {
    "q_proj": ("self_attn.qkv_proj", "q"),
    "k_proj": ("self_attn.qkv_proj", "k"),
    "v_proj": ("self_attn.qkv_proj", "v"),
    "o_proj": ("self_attn.o_proj", None),
    "gate_proj": ("mlp.gate_up_proj", "gate"),
    "up_proj": ("mlp.gate_up_proj", "up"),
    "down_proj": ("mlp.down_proj", None),
    "embed_tokens": ("model.embed_tokens", None),
    "lm_head": ("lm_head", None),
}
