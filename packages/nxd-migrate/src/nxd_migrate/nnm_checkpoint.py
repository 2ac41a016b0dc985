"""Neuron NeMo-Megatron (NNM) checkpoints -> nxd.

NNM writes ``<dir>/tp_rank_XX_pp_rank_XXX/model_optim_rng.ckpt`` (one torch file per TP x PP
rank; the model under ``["state_dict"]``, Megatron names, layers numbered from 0 on every
pipeline stage). :func:`read_nnm` merges the shards into one full state under nxd's Llama names,
which nxd-ckpt writes as a checkpoint that loads (and reshards) at any TP/PP:

    nxd ckpt convert --from nnm --to nxd --input <nnm dir> --output <dir> --config config.json

Megatron Llama layout handled (what NNM's Llama used, and NeMo's GQA variant):

* ``self_attention.query_key_value.weight``: TP shards over query groups; inside, each group is
  ``[q heads of the group; k head; v head]`` rows (MHA: one head per group);
* ``mlp.dense_h_to_4h.weight`` (gate) + ``mlp.dense_h_to_4h_2.weight`` (up), or a fused
  ``dense_h_to_4h`` whose every TP shard is ``[gate shard; up shard]``;
* column-parallel weights split rows (dim 0), row-parallel (``dense``, ``dense_4h_to_h``) columns;
  norms are replicated.
Optimizer states are not converted (NxD Training's converter does not either): resume with a
fresh optimizer (``model.weight_init_only: true``).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from nxd_ckpt import CheckpointError, ConvertRequest, FullState

SHARD_DIR = re.compile(r"^tp_rank_(\d+)_pp_rank_(\d+)$")
FILE_NAME = "model_optim_rng.ckpt"
LAYER = re.compile(r"^(?:model\.)?(?:module\.)?language_model\.encoder\.layers\.(\d+)\.(.+)$")
#: non-layer keys (prefix-stripped) -> (nxd name, TP split dim or None for replicated)
GLOBAL_KEYS = {
    "language_model.embedding.word_embeddings.weight": ("model.embed_tokens.weight", 0),
    "language_model.encoder.final_layernorm.weight": ("model.norm.weight", None),
    "language_model.output_layer.weight": ("lm_head.weight", 0),
}
#: buffers NNM keeps in the state dict that nxd recomputes
SKIPPED = re.compile(r"(rotary_pos_emb\.inv_freq|\._extra_state|\.inv_freq)$")


def _strip(key: str) -> str:
    for prefix in ("model.", "module."):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key


def list_shards(path: str) -> dict[tuple[int, int], str]:
    """``{(tp, pp): file}`` of an NNM checkpoint directory; raises naming what is missing."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (expected tp_rank_XX_pp_rank_XXX/{FILE_NAME} inside)")
    shards = {}
    for name in sorted(os.listdir(path)):
        match = SHARD_DIR.match(name)
        if match:
            file = os.path.join(path, name, FILE_NAME)
            if not os.path.isfile(file):
                raise CheckpointError(f"{os.path.join(path, name)}: has no {FILE_NAME}")
            shards[(int(match.group(1)), int(match.group(2)))] = file
    if not shards:
        raise CheckpointError(f"{path}: no tp_rank_XX_pp_rank_XXX/{FILE_NAME} shards (is it an NNM checkpoint?)")
    tps = sorted({t for t, _ in shards})
    pps = sorted({p for _, p in shards})
    missing = [f"tp_rank_{t:02d}_pp_rank_{p:03d}" for t in tps for p in pps if (t, p) not in shards]
    if missing or tps != list(range(len(tps))) or pps != list(range(len(pps))):
        raise CheckpointError(f"{path}: incomplete NNM checkpoint: missing {', '.join(missing) or 'rank numbers'}")
    return shards


def _load(file: str, allow_pickle: bool) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(file, map_location="cpu", weights_only=not allow_pickle)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        hint = "" if allow_pickle else " (NeMo stores its config as pickled objects: if you trust the file, allow pickles)"
        raise CheckpointError(f"{file}: cannot load: {str(exc).splitlines()[0]}{hint}") from None
    state = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: no 'state_dict' in the checkpoint")
    return state


def _heads(config: dict[str, Any]) -> tuple[int, int, int]:
    try:
        heads = int(config.get("num_attention_heads"))
        kv = int(config.get("num_key_value_heads") or config.get("num_kv_heads") or config.get("num_query_groups") or heads)
        hidden = int(config.get("hidden_size"))
    except (TypeError, ValueError):
        raise CheckpointError("converting NNM attention needs the model config: num_attention_heads, hidden_size "
                              "(and num_key_value_heads for GQA); pass --config config.json") from None
    return heads, kv, hidden


def _split_qkv(full: torch.Tensor, heads: int, kv: int, head_dim: int) -> torch.Tensor:
    """Megatron's grouped ``[g: q heads, k, v]`` rows -> nxd's ``[all q; all k; all v]``."""
    per_group = heads // kv
    groups = full.reshape(kv, per_group + 2, head_dim, full.shape[-1])
    q = groups[:, :per_group].reshape(heads * head_dim, -1)
    k = groups[:, per_group].reshape(kv * head_dim, -1)
    v = groups[:, per_group + 1].reshape(kv * head_dim, -1)
    return torch.cat([q, k, v], dim=0)


def _layer_key(rest: str) -> tuple[str, int | None] | None:
    table = {
        "input_layernorm.weight": ("input_layernorm.weight", None),
        "post_attention_layernorm.weight": ("post_attention_layernorm.weight", None),
        "self_attention.dense.weight": ("self_attn.o_proj.weight", 1),
        "mlp.dense_4h_to_h.weight": ("mlp.down_proj.weight", 1),
    }
    return table.get(rest)


def merge_nnm(shards: dict[tuple[int, int], dict[str, torch.Tensor]], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Full nxd state from NNM shards ``{(tp, pp): state_dict}``."""
    tp = 1 + max(t for t, _ in shards)
    pp = 1 + max(p for _, p in shards)
    heads, kv, hidden = _heads(config)
    head_dim = int(config.get("head_dim") or hidden // heads)
    offsets, offset = {}, 0
    for stage in range(pp):  # NNM numbers layers from 0 on every stage
        offsets[stage] = offset
        local = {int(m.group(1)) for k in shards[(0, stage)] if (m := LAYER.match(k))}
        offset += (max(local) + 1) if local else 0
    out: dict[str, torch.Tensor] = {}
    unknown: list[str] = []

    def cat(stage: int, key: str, dim: int | None) -> torch.Tensor:
        parts = [shards[(t, stage)][key] for t in range(tp)]
        return parts[0].clone() if dim is None else torch.cat(parts, dim=dim)

    for stage in range(pp):
        for key in shards[(0, stage)]:
            bare = _strip(key)
            if SKIPPED.search(key) or bare == "word_embeddings.weight":
                continue  # recomputed buffers; the last stage's copy of tied embeddings
            if bare in GLOBAL_KEYS:
                name, dim = GLOBAL_KEYS[bare]
                if name == "model.embed_tokens.weight" and name in out:
                    continue  # the last stage's copy of tied embeddings
                out[name] = cat(stage, key, dim)
                continue
            match = LAYER.match(key)
            if match is None:
                unknown.append(key)
                continue
            layer, rest = offsets[stage] + int(match.group(1)), match.group(2)
            prefix = f"model.layers.{layer}."
            simple = _layer_key(rest)
            if simple is not None:
                out[prefix + simple[0]] = cat(stage, key, simple[1])
            elif rest == "self_attention.query_key_value.weight":
                out[prefix + "self_attn.qkv_proj.weight_qkv"] = _split_qkv(cat(stage, key, 0), heads, kv, head_dim)
            elif rest == "mlp.dense_h_to_4h.weight":
                second = key.replace("dense_h_to_4h.weight", "dense_h_to_4h_2.weight")
                if second in shards[(0, stage)]:
                    gate, up = cat(stage, key, 0), cat(stage, second, 0)
                else:  # fused: every TP shard is [gate shard; up shard]
                    halves = [shards[(t, stage)][key].chunk(2, dim=0) for t in range(tp)]
                    gate = torch.cat([h[0] for h in halves]); up = torch.cat([h[1] for h in halves])  # noqa: E702
                out[prefix + "mlp.gate_up_proj.weight"] = torch.cat([gate, up], dim=0)
            elif rest == "mlp.dense_h_to_4h_2.weight":
                continue  # merged with dense_h_to_4h above
            else:
                unknown.append(key)
    if unknown:
        raise CheckpointError(f"NNM checkpoint has {len(unknown)} keys this converter does not map (a non-Llama "
                              f"model?): {', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}")
    return out


def hf_config_from_nnm(cfg: dict[str, Any]) -> dict[str, Any]:
    """NNM's model section -> Hugging Face ``config.json`` keys (nxd's Llama accepts those)."""
    keys = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
            "num_attention_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
            "num_query_groups": "num_key_value_heads", "max_position_embeddings": "max_position_embeddings",
            "layernorm_epsilon": "rms_norm_eps", "share_embeddings_and_output_weights": "tie_word_embeddings",
            "init_method_std": "initializer_range", "rotary_base": "rope_theta", "kv_channels": "head_dim"}
    return {dst: cfg[src] for src, dst in keys.items() if cfg.get(src) is not None and not isinstance(cfg[src], str)}


def model_config_from_file(path: str) -> dict[str, Any]:
    """``--config`` for the nnm converter: an NNM YAML (its ``model`` section) or a ``config.json``."""
    if path.endswith((".yaml", ".yml")):
        from nxd_training.config import read_yaml

        return hf_config_from_nnm(read_yaml(path).get("model") or {})
    return json.loads(Path(path).read_text())


def read_nnm(request: ConvertRequest) -> FullState:
    """``nxd ckpt convert --from nnm``: the merged full state (+ the model config when known)."""
    allow_pickle = bool(request.options.get("allow_pickle", False))
    files = list_shards(request.input)
    shards = {rank: _load(file, allow_pickle) for rank, file in files.items()}
    config = dict(request.config or {})
    if not config:  # NeMo stores its model config in the checkpoint's hyper_parameters
        first = torch.load(files[(0, 0)], map_location="cpu", weights_only=not allow_pickle)
        cfg = (first.get("hyper_parameters") or {}).get("cfg") if isinstance(first, dict) else None
        config = hf_config_from_nnm(dict(cfg)) if cfg else {}
    state = merge_nnm(shards, config)
    vocab = state.get("model.embed_tokens.weight")
    if vocab is not None:
        config.setdefault("vocab_size", int(vocab.shape[0]))
    layers = {int(k.split(".")[2]) for k in state if k.startswith("model.layers.")}
    config.setdefault("num_hidden_layers", len(layers))
    config.setdefault("tie_word_embeddings", "lm_head.weight" not in state)
    gate_up = state.get("model.layers.0.mlp.gate_up_proj.weight")
    if gate_up is not None:
        config.setdefault("intermediate_size", int(gate_up.shape[0]) // 2)
    return FullState(state, config)
