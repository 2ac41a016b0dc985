"""torchtitan's Llama 3 state-dict names for nxd's Llama weights, and back.

torchtitan (``torchtitan/models/llama3``) names the weights after Meta's original code and keeps
each projection separate; its ``Llama3StateDictAdapter`` maps them to and from Hugging Face's names:

=====================================================  ======================================
Hugging Face (nxd's export names)                      torchtitan
=====================================================  ======================================
``model.embed_tokens.weight``                          ``tok_embeddings.weight``
``model.layers.N.self_attn.{q,k,v,o}_proj.weight``     ``layers.N.attention.w{q,k,v,o}.weight``
``model.layers.N.mlp.{gate,up,down}_proj.weight``      ``layers.N.feed_forward.w{1,3,2}.weight``
``model.layers.N.input_layernorm.weight``              ``layers.N.attention_norm.weight``
``model.layers.N.post_attention_layernorm.weight``     ``layers.N.ffn_norm.weight``
``model.norm.weight``                                  ``norm.weight``
``lm_head.weight``                                     ``output.weight``
=====================================================  ======================================

and, beyond the names, the rows of ``wq`` and ``wk`` within each head: torchtitan's RoPE rotates
interleaved pairs (dims ``2i, 2i+1``, as complex numbers), Hugging Face's and nxd's rotate halves
(dims ``i, i + head_dim/2``), so row ``2i + j`` of a torchtitan head is row ``i + j * head_dim/2``
of the Hugging Face head. nxd's own names (fused ``qkv_proj.weight_qkv`` and
``gate_up_proj.weight``) go through the Hugging Face names with nxd-models-llama's mapping
(:func:`nxd_models_llama.hf_mapping.plan_for`), at TP=1: the input is the full (TP- and
DP-gathered) state dict, e.g. ``model.state_dict()`` of an FSDP run at TP=1."""

from __future__ import annotations

import re

import torch

from nxd_core_parallel.hf_interop import place_piece, split_by_pieces
from nxd_models_llama.config import LlamaConfig
from nxd_models_llama.hf_mapping import hf_shapes, plan_for

#: Hugging Face name -> torchtitan name (``{}``: the layer index)
TORCHTITAN_FROM_HF: dict[str, str] = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
HF_FROM_TORCHTITAN = {v: k for k, v in TORCHTITAN_FROM_HF.items()}
_LAYER = re.compile(r"\d+")


def _check(config: LlamaConfig) -> None:
    for field in ("attention_bias", "mlp_bias"):
        if getattr(config, field, False):
            raise ValueError(f"torchtitan's Llama has no biases: a model with {field}=true has no torchtitan layout")
    if config.head_dim % 2:
        raise ValueError(f"head_dim {config.head_dim} is odd: RoPE rotates pairs")


def _rename(key: str, table: dict[str, str]) -> str:
    abstract = _LAYER.sub("{}", key, count=1)
    if abstract not in table:
        raise KeyError(f"{key}: not a Llama weight torchtitan names ({sorted(table)[:3]}...)")
    layer = _LAYER.search(key)
    return table[abstract].format(layer.group(0)) if layer else table[abstract]


def _pair_order(heads: int, head_dim: int) -> torch.Tensor:
    """Rows of a Hugging Face (halves) projection in torchtitan's (interleaved) order."""
    half = head_dim // 2
    within = torch.tensor([i + j * half for i in range(half) for j in range(2)])
    return torch.cat([h * head_dim + within for h in range(heads)])


def _heads_of(hf_key: str, config: LlamaConfig) -> int | None:
    if hf_key.endswith("self_attn.q_proj.weight"):
        return config.num_attention_heads
    if hf_key.endswith("self_attn.k_proj.weight"):
        return config.num_key_value_heads
    return None


def hf_to_torchtitan(hf: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Hugging Face-named Llama weights under torchtitan's names and RoPE row order."""
    _check(config)
    out = {}
    for key, value in hf.items():
        heads = _heads_of(key, config)
        out[_rename(key, TORCHTITAN_FROM_HF)] = value[_pair_order(heads, config.head_dim)] if heads else value
    if config.tie_word_embeddings and "output.weight" not in out:  # torchtitan keeps its head separate
        out["output.weight"] = out["tok_embeddings.weight"].clone()
    return out


def torchtitan_to_hf(titan: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """The inverse of :func:`hf_to_torchtitan`."""
    _check(config)
    out = {}
    for key, value in titan.items():
        hf_key = _rename(key, HF_FROM_TORCHTITAN)
        heads = _heads_of(hf_key, config)
        if heads:
            order = _pair_order(heads, config.head_dim)
            value = torch.empty_like(value).index_copy_(0, order, value)
        out[hf_key] = value
    if config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def nxd_to_hf(state: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """A full (TP=1) nxd Llama state dict under Hugging Face's names (fused weights split)."""
    shapes, out = hf_shapes(config), {}
    for name, tensor in state.items():
        pieces = plan_for(name, config, 1, 0, 1)
        for piece, chunk in zip(pieces, split_by_pieces(tensor, pieces)):
            place_piece(out, shapes[piece.hf_key], piece, chunk)
    return out


def hf_to_nxd(hf: dict[str, torch.Tensor], config: LlamaConfig, names: list[str]) -> dict[str, torch.Tensor]:
    """The nxd parameters ``names`` (full, TP=1) from Hugging Face-named weights (fused weights joined)."""
    out = {}
    for name in names:
        pieces = plan_for(name, config, 1, 0, 1)
        parts = [hf[p.hf_key] if p.dim is None else hf[p.hf_key].index_select(p.dim, torch.tensor(p.index))
                 for p in pieces]
        out[name] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=pieces[0].dim)
    return out


def to_torchtitan(state: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """A full (TP=1) nxd Llama state dict as torchtitan's Llama 3 state dict."""
    return hf_to_torchtitan(nxd_to_hf(state, config), config)


def from_torchtitan(titan: dict[str, torch.Tensor], config: LlamaConfig, names: list[str]) -> dict[str, torch.Tensor]:
    """torchtitan's Llama 3 state dict as the nxd parameters ``names`` (e.g. ``model.state_dict()``'s keys)."""
    return hf_to_nxd(torchtitan_to_hf(titan, config), config, names)
