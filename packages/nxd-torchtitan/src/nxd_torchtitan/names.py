"""torchtitan's state-dict names for the families nxd shares with it, in both of its layouts.

torchtitan names weights after Meta's original code; its ``StateDictAdapter`` of each family maps them
to and from Hugging Face's names, which nxd's families import and export. This module is that map
(and its inverse) for two torchtitan layouts, told apart by the names a checkpoint holds:

=====================================================  ====================================  ==========================================
Hugging Face                                           torchtitan <= 0.2                     torchtitan 0.3.0
=====================================================  ====================================  ==========================================
``model.embed_tokens.weight``                          ``tok_embeddings.weight``             ``tok_embeddings.weight``
``model.layers.N.self_attn.{q,k,v}_proj.weight``       ``layers.N.attention.w{q,k,v}.weight``  ``layers.N.attention.qkv_linear.w{q,k,v}.weight``
``model.layers.N.self_attn.o_proj.weight``             ``layers.N.attention.wo.weight``      ``layers.N.attention.wo.weight``
``model.layers.N.self_attn.{q,k}_norm.weight`` (Qwen3) ``layers.N.attention.{q,k}_norm.weight``  the same
``model.layers.N.mlp.{gate,up,down}_proj.weight``      ``layers.N.feed_forward.w{1,3,2}.weight``  the same
``model.layers.N.input_layernorm.weight``              ``layers.N.attention_norm.weight``    the same
``model.layers.N.post_attention_layernorm.weight``     ``layers.N.ffn_norm.weight``          the same
``model.norm.weight``                                  ``norm.weight``                       ``norm.weight``
``lm_head.weight``                                     ``output.weight``                     ``lm_head.weight``
=====================================================  ====================================  ==========================================

Beyond the names, Llama 3's ``wq``/``wk`` rows within each head: its RoPE (``ComplexRoPE``) rotates
interleaved pairs (dims ``2i, 2i+1``), Hugging Face's and nxd's rotate halves (``i, i + head_dim/2``),
so row ``2i + j`` of a torchtitan head is row ``i + j * head_dim/2`` of the Hugging Face head (the
permutation torchtitan's ``Llama3StateDictAdapter`` applies). Qwen3's RoPE (``CosSinRoPE``) rotates
halves: its rows are Hugging Face's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

#: torchtitan's layouts: the one of 0.3.0 and the one of releases up to 0.2
V03, V02 = "0.3", "0.2"
VERSIONS = (V03, V02)


@dataclass(frozen=True)
class Family:
    """A model family nxd and torchtitan both have."""

    #: nxd's registered model name
    name: str
    #: torchtitan's module under ``torchtitan.models``
    torchtitan_module: str
    #: RoPE over interleaved pairs (Llama 3's ComplexRoPE): ``wq``/``wk`` rows re-ordered
    interleaved_rope: bool
    #: per-head RMSNorm of q and k (Qwen3)
    qk_norm: bool


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "llama3", interleaved_rope=True, qk_norm=False),
    "qwen3": Family("qwen3", "qwen3", interleaved_rope=False, qk_norm=True),
}


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"model {name!r} has no torchtitan mapping; mapped families: {', '.join(FAMILIES)} "
                         "(torchtitan's llama3 and qwen3 dense models)")
    return FAMILIES[name]


_SHARED = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
}
_QKV = {"q": "model.layers.{}.self_attn.q_proj.weight", "k": "model.layers.{}.self_attn.k_proj.weight",
        "v": "model.layers.{}.self_attn.v_proj.weight"}
_BY_VERSION = {
    V03: {**{hf: f"layers.{{}}.attention.qkv_linear.w{x}.weight" for x, hf in _QKV.items()},
          "lm_head.weight": "lm_head.weight"},
    V02: {**{hf: f"layers.{{}}.attention.w{x}.weight" for x, hf in _QKV.items()}, "lm_head.weight": "output.weight"},
}
_QK_NORM = {"model.layers.{}.self_attn.q_norm.weight": "layers.{}.attention.q_norm.weight",
            "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attention.k_norm.weight"}
_LAYER = re.compile(r"\d+")


def torchtitan_from_hf(fam: Family, version: str) -> dict[str, str]:
    """Hugging Face name -> torchtitan name (``{}``: the layer index) for ``fam`` in ``version``'s layout."""
    if version not in VERSIONS:
        raise ValueError(f"torchtitan layout {version!r} unknown; known: {', '.join(VERSIONS)}")
    return {**_SHARED, **_BY_VERSION[version], **(_QK_NORM if fam.qk_norm else {})}


def detect_version(keys: list[str] | set[str], where: str) -> str:
    """Which torchtitan layout the state-dict ``keys`` (read from ``where``) are in."""
    new = any(".attention.qkv_linear." in k for k in keys) or "lm_head.weight" in keys
    old = any(re.search(r"\.attention\.w[qkv]\.", k) for k in keys) or "output.weight" in keys
    if new and old:
        raise ValueError(f"{where}: mixes torchtitan 0.3.0 names (attention.qkv_linear.*, lm_head) with <= 0.2 names "
                         "(attention.wq, output); not one torchtitan model")
    if not new and not old:
        sample = ", ".join(sorted(keys)[:4])
        raise ValueError(f"{where}: no torchtitan attention/head names (attention.qkv_linear.wq or attention.wq, "
                         f"lm_head or output) among its tensors ({sample}, ...)")
    return V03 if new else V02


def _rename(key: str, table: dict[str, str], what: str) -> str:
    abstract = _LAYER.sub("{}", key, count=1)
    if abstract not in table:
        raise KeyError(f"{key}: not a weight {what} names (e.g. {', '.join(sorted(table)[:3])})")
    layer = _LAYER.search(key)
    return table[abstract].format(layer.group(0)) if layer else table[abstract]


def _pair_order(heads: int, head_dim: int) -> torch.Tensor:
    """Rows of a Hugging Face (halves) projection in torchtitan's (interleaved) order."""
    half = head_dim // 2
    within = torch.tensor([i + j * half for i in range(half) for j in range(2)])
    return torch.cat([h * head_dim + within for h in range(heads)])


def _heads(hf_key: str, n_heads: int, n_kv_heads: int) -> int | None:
    if hf_key.endswith("self_attn.q_proj.weight"):
        return n_heads
    if hf_key.endswith("self_attn.k_proj.weight"):
        return n_kv_heads
    return None


def hf_to_torchtitan(hf: dict[str, torch.Tensor], fam: Family, *, n_heads: int, n_kv_heads: int, head_dim: int,
                     tied: bool, version: str = V03) -> dict[str, torch.Tensor]:
    """Hugging Face-named weights under torchtitan's names (and, for Llama 3, its RoPE row order).
    A tied head is written under both names, as torchtitan's model state dict holds it."""
    table, out = torchtitan_from_hf(fam, version), {}
    for key, value in hf.items():
        heads = _heads(key, n_heads, n_kv_heads) if fam.interleaved_rope else None
        out[_rename(key, table, "Hugging Face's " + fam.name)] = value[_pair_order(heads, head_dim)] if heads else value
    head = table["lm_head.weight"]
    if tied and head not in out:
        out[head] = out["tok_embeddings.weight"]
    return out


def torchtitan_to_hf(titan: dict[str, torch.Tensor], fam: Family, *, n_heads: int, n_kv_heads: int, head_dim: int,
                     tied: bool, version: str) -> dict[str, torch.Tensor]:
    """The inverse of :func:`hf_to_torchtitan`; a tied model's head is dropped (HF ties it)."""
    back = {v: k for k, v in torchtitan_from_hf(fam, version).items()}
    out = {}
    for key, value in titan.items():
        hf_key = _rename(key, back, f"torchtitan {version}'s {fam.torchtitan_module}")
        heads = _heads(hf_key, n_heads, n_kv_heads) if fam.interleaved_rope else None
        if heads:
            value = torch.empty_like(value).index_copy_(0, _pair_order(heads, head_dim), value)
        out[hf_key] = value
    if tied:
        out.pop("lm_head.weight", None)
    return out
