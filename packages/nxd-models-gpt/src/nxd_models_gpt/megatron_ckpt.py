"""Load Megatron-LM / NeMo GPT checkpoints (``mp_rank_XX[_YYY]/model_optim_rng.pt`` or NeMo's
``mp_rank_XX[_YYY]/model_weights.ckpt``) into nxd's GPT at any TP degree.

Both of Megatron's state-dict layouts are read, weights-only (:mod:`nxd_models_gpt.safe_load`):

* legacy (``megatron/legacy/model``, NeMo's non-mcore GPT): ``model.language_model.{embedding.
  word_embeddings, embedding.position_embeddings, encoder.layers.N.{input_layernorm,
  self_attention.query_key_value, self_attention.dense, post_attention_layernorm,
  mlp.dense_h_to_4h, mlp.dense_4h_to_h}, encoder.final_layernorm, output_layer}`` (older files:
  ``transformer`` for ``encoder``, ``attention`` for ``self_attention``);
* Megatron-core: ``embedding.*``, ``decoder.layers.N.*`` with nxd's own module names, including
  Transformer Engine's fused ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``.

Layer numbers are local to each pipeline stage (``_YYY``); TP shards (``mp_rank_XX``) are merged by
Megatron's partitioning (rows of QKV / fc1 / vocabulary, columns of the output projections; swiglu's
``fc1`` shard is ``[gate_r; up_r]``) and re-cut for this model's TP degree. The vocabulary padding
of the checkpoint is dropped and this model's padding added (zeros).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nxd.parallel import dim_rank, dim_size
from nxd_core_parallel.dtensor import copy_whole_
from nxd_modeling.hf_interop import clean_param_name as clean_name
from nxd_models_gpt.hf_io import unwrap_model
from nxd_models_gpt.safe_load import load_weights_only
from nxd_tensor_parallel.modules.grouped_qkv import GroupedQKVColumnParallelLinear

_RANK_DIR = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?$")
_RANK_FILES = ("model_optim_rng.pt", "model_weights.ckpt", "model_rng.pt")
_LAYER = re.compile(r"^(?:encoder|transformer|decoder)\.layers\.(\d+)\.(.+)$")

#: legacy / Transformer Engine module names -> nxd's, inside one layer
_LAYER_RENAMES = (
    ("self_attention.query_key_value.", "self_attention.linear_qkv."),
    ("attention.query_key_value.", "self_attention.linear_qkv."),
    ("self_attention.dense.", "self_attention.linear_proj."),
    ("attention.dense.", "self_attention.linear_proj."),
    ("post_attention_layernorm.", "pre_mlp_layernorm."),
    ("mlp.dense_h_to_4h.", "mlp.linear_fc1."),
    ("mlp.dense_4h_to_h.", "mlp.linear_fc2."),
)
_TE_NORMS = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
             "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
             "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
             "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias"}
#: Megatron args -> nxd GPTConfig keys (see :func:`config_from_megatron_args`)
_ARG_KEYS = ("hidden_size", "ffn_hidden_size", "num_layers", "num_attention_heads", "max_position_embeddings",
             "kv_channels", "normalization", "position_embedding_type", "rotary_base",
             "apply_query_key_layer_scaling", "init_method_std", "hidden_dropout", "attention_dropout",
             "openai_gelu", "make_vocab_size_divisible_by")


class MegatronCheckpointError(ValueError):
    """A Megatron checkpoint that cannot be loaded into this model (names the file and field)."""


def resolve_checkpoint_dir(path: str | os.PathLike) -> Path:
    """``path`` itself, or the iteration named by its ``latest_checkpointed_iteration.txt``."""
    path = Path(path)
    tracker = path / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        text = tracker.read_text().strip()
        path = path / ("release" if text == "release" else f"iter_{int(text):07d}")
    return path


def rank_files(path: str | os.PathLike) -> dict[tuple[int, int], Path]:
    """``{(tp_rank, pp_rank): file}`` of a Megatron/NeMo checkpoint directory."""
    root = resolve_checkpoint_dir(path)
    if not root.is_dir():
        raise MegatronCheckpointError(f"{root}: no such checkpoint directory")
    found: dict[tuple[int, int], Path] = {}
    for d in sorted(root.iterdir()):
        m = _RANK_DIR.match(d.name)
        if not m or not d.is_dir():
            continue
        files = [d / f for f in _RANK_FILES if (d / f).is_file()]
        if not files:
            raise MegatronCheckpointError(f"{d}: none of {list(_RANK_FILES)} in this rank directory")
        found[(int(m.group(1)), int(m.group(2) or 0))] = files[0]
    if not found:
        hint = " (a torch_dist checkpoint: not supported, convert it to the torch format first)" \
            if (root / "metadata.json").is_file() or (root / ".metadata").is_file() else ""
        raise MegatronCheckpointError(f"{root}: no mp_rank_XX[_YYY] directories{hint}; "
                                      f"found {sorted(p.name for p in root.iterdir())}")
    tps = {t for t, _ in found}
    pps = {p for _, p in found}
    if found.keys() != {(t, p) for t in range(len(tps)) for p in range(len(pps))}:
        raise MegatronCheckpointError(f"{root}: incomplete rank grid {sorted(found)} (expected TP 0..{len(tps) - 1} "
                                      f"x PP 0..{len(pps) - 1})")
    return found


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _model_state(state: Any, file: Path) -> tuple[dict[str, Any], Any]:
    """``(flat model state, args or None)`` from one rank file."""
    if not isinstance(state, Mapping):
        raise MegatronCheckpointError(f"{file}: expected a dict, got {type(state).__name__}")
    if "model0" in state or "model1" in state:
        raise MegatronCheckpointError(f"{file}: virtual-pipeline checkpoints (model0, model1, ...) are not supported")
    model = state.get("model", state.get("state_dict", state))
    flat = _flatten(model)
    out = {}
    for key, value in flat.items():
        for prefix in ("model.", "module.", "language_model."):
            if key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out, state.get("args")


def nxd_name(key: str, post_ln: bool) -> str | None:
    """nxd parameter name (local layer number kept) for a Megatron key; ``None`` for keys without
    weights (``_extra_state``, rotary buffers, the pipeline's tied head copy)."""
    if key.endswith("_extra_state") or "inv_freq" in key or key.startswith("word_embeddings_for_head") \
            or key.startswith(("optimizer", "rng_state")):
        return None
    if key.startswith("embedding."):
        return key
    if key.startswith("output_layer."):
        return key
    for stack in ("encoder.", "transformer.", "decoder."):
        if key.startswith(stack + "final_layernorm.") or key.startswith(stack + "final_norm."):
            return "decoder.final_layernorm." + key.rsplit(".", 1)[1]
    m = _LAYER.match(key)
    if not m:
        raise MegatronCheckpointError(f"checkpoint key {key!r} is not part of a Megatron GPT model")
    rest = _TE_NORMS.get(m.group(2), m.group(2))
    for old, new in _LAYER_RENAMES:
        if rest.startswith(old):
            rest = new + rest[len(old):]
            break
    if post_ln:  # NeMo post-LN: input_layernorm follows attention, post_attention_layernorm the MLP
        rest = rest.replace("input_layernorm.", "post_attention_layernorm.").replace(
            "pre_mlp_layernorm.", "post_mlp_layernorm.")
    return f"decoder.layers.{m.group(1)}.{rest}"


def _merge(name: str, shards: list[torch.Tensor], gated: bool) -> torch.Tensor:
    """Megatron's TP shards of one tensor -> the full tensor."""
    if len(shards) == 1:
        return shards[0]
    if name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")):
        return torch.cat(shards, 0)
    if ".linear_fc1." in name:
        if gated:
            halves = [s.chunk(2, dim=0) for s in shards]
            return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
        return torch.cat(shards, 0)
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return torch.cat(shards, 1)
    return shards[0]  # replicated


def _shard(name: str, full: torch.Tensor, tp: int, rank: int, gated: bool) -> torch.Tensor:
    """The full tensor -> this model's TP ``rank`` shard (the inverse of :func:`_merge`)."""
    if tp == 1:
        return full
    if name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")) \
            or (".linear_fc1." in name and not gated):
        return full.chunk(tp, 0)[rank]
    if ".linear_fc1." in name:
        gate, up = full.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]], 0)
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return full.chunk(tp, 1)[rank]
    return full


def read_megatron_state_dict(path: str | os.PathLike, post_ln: bool = False, gated: bool = False,
                             num_layers: int | None = None) -> tuple[dict[str, torch.Tensor], Any]:
    """Every rank file merged into one full state dict with nxd names and global layer numbers,
    plus the checkpoint's ``args`` (or ``None``)."""
    files = rank_files(path)
    tp_size = 1 + max(t for t, _ in files)
    pp_size = 1 + max(p for _, p in files)
    per_stage: dict[int, dict[str, list[torch.Tensor]]] = {}
    args = None
    for (_tp_rank, pp_rank), file in sorted(files.items()):
        flat, file_args = _model_state(load_weights_only(file), file)
        args = args or file_args
        stage = per_stage.setdefault(pp_rank, {})
        for key, value in flat.items():
            name = nxd_name(key, post_ln)
            if name is None or value is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise MegatronCheckpointError(f"{file}: {key} holds a {type(value).__name__}, not a tensor")
            stage.setdefault(name, []).append(value)
    layers = num_layers or getattr(args, "num_layers", None)
    if layers is None or layers % pp_size:
        raise MegatronCheckpointError(f"{path}: cannot place layers of {pp_size} pipeline stages "
                                      f"(num_layers={layers!r}); pass num_layers")
    per = layers // pp_size
    full: dict[str, torch.Tensor] = {}
    for pp_rank, stage in per_stage.items():
        for name, shards in stage.items():
            if len(shards) != tp_size:
                raise MegatronCheckpointError(f"{path}: {name} is in {len(shards)} of {tp_size} TP rank files "
                                              f"of pipeline stage {pp_rank}")
            m = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
            if m:
                local = int(m.group(1))
                if local >= per:
                    raise MegatronCheckpointError(f"{path}: stage {pp_rank} has layer {local}, more than "
                                                  f"num_layers/pp = {per}")
                name = f"decoder.layers.{pp_rank * per + local}.{m.group(2)}"
            if name in full and name.startswith("embedding."):
                continue  # the first stage's copy
            full[name] = _merge(name, shards, gated)
    return full, args


def config_from_megatron_args(args: Any, vocab_size: int | None = None) -> dict[str, Any]:
    """Megatron's saved ``args`` -> a GPT config dict (``vocab_size``: the tokenizer's; Megatron
    stores only the padded size, used when none is given)."""
    if args is None:
        raise MegatronCheckpointError("the checkpoint has no 'args': build the config from your model YAML instead")
    a = vars(args)
    cfg = {k: a[k] for k in _ARG_KEYS if a.get(k) is not None}
    cfg["vocab_size"] = vocab_size or a["padded_vocab_size"]
    cfg["layernorm_epsilon"] = a.get("norm_epsilon", a.get("layernorm_epsilon", 1e-5))
    cfg["activation"] = "swiglu" if a.get("swiglu") else "gelu"
    cfg["has_bias"] = a.get("add_bias_linear", True)
    cfg["share_embeddings_and_output_weights"] = not a.get("untie_embeddings_and_output_weights", False)
    cfg["rotary_percentage"] = a.get("rotary_percent", 1.0)
    if a.get("group_query_attention"):
        cfg["num_query_groups"] = a["num_query_groups"]
    if a.get("use_rotary_position_embeddings"):
        cfg["position_embedding_type"] = "rope"
    return cfg


@torch.no_grad()
def load_megatron_checkpoint(model: nn.Module, path: str | os.PathLike, strict: bool = True) -> Any:
    """Load a Megatron-LM / NeMo GPT checkpoint (any TP/PP layout) into ``model`` at the TP degree it
    was built for (pipeline parallelism on the nxd side: not supported). Returns the checkpoint's ``args``."""
    module = unwrap_model(model)
    config = module.config
    context = module.parallel_context
    if dim_size(context, "pp") > 1:
        raise NotImplementedError("load_megatron_checkpoint into a pipeline-parallel model: load at PP=1 and save "
                                  "an nxd checkpoint, which reshards to any PP")
    gated = config.activation == "swiglu"
    full, args = read_megatron_state_dict(path, config.transformer_block_type == "post_ln", gated, config.num_layers)
    _check_args(args, config, path)
    tp, rank = dim_size(context, "tp"), dim_rank(context, "tp")
    used = set()
    for raw_name, param in module.named_parameters():
        name = clean_name(raw_name)
        source = name
        if name == "output_layer.weight" and name not in full and config.share_embeddings_and_output_weights:
            source = "embedding.word_embeddings.weight"
        if source not in full:
            raise MegatronCheckpointError(f"{path}: no tensor for {name} in the checkpoint")
        tensor = full[source]
        used.add(source)
        if name.endswith(("word_embeddings.weight", "output_layer.weight")):
            if tensor.shape[0] < config.vocab_size:
                raise MegatronCheckpointError(f"{path}: {name} has {tensor.shape[0]} rows, fewer than vocab_size "
                                              f"{config.vocab_size}")
            tensor = torch.cat([tensor[: config.vocab_size],
                                tensor.new_zeros(module.padded_vocab_size - config.vocab_size, *tensor.shape[1:])])
        owner = module.get_submodule(raw_name.rpartition(".")[0])
        if isinstance(owner, GroupedQKVColumnParallelLinear):  # K/V replicated over TP: the layer's own rows
            local = owner.local_of(tensor)
        else:
            local = _shard(name, tensor, tp, rank, gated)
        if local.shape != param.shape:
            raise MegatronCheckpointError(f"{path}: {name} gives shape {list(local.shape)} on TP rank {rank}, the "
                                          f"model has {list(param.shape)}; check the model config against the "
                                          "checkpoint's")
        copy_whole_(param, local)  # under FSDP this rank's rows of it
    leftover = sorted(set(full) - used - ({"output_layer.weight"} if config.share_embeddings_and_output_weights else set()))
    if leftover and strict:
        raise MegatronCheckpointError(f"{path}: checkpoint tensors the model does not use: {leftover[:5]}; pass "
                                      "strict=False to ignore them")
    return args


def _check_args(args: Any, config: Any, path: Any) -> None:
    if args is None:
        return
    a = vars(args)
    checks = {"hidden_size": config.hidden_size, "num_layers": config.num_layers,
              "num_attention_heads": config.num_attention_heads, "ffn_hidden_size": config.ffn_hidden_size}
    for key, ours in checks.items():
        if a.get(key) is not None and a[key] != ours:
            raise MegatronCheckpointError(f"{path}: checkpoint args.{key}={a[key]!r} but the model has {key}={ours!r}")


_LEGACY_NAMES = (("self_attention.linear_qkv.", "self_attention.query_key_value."),
                 ("self_attention.linear_proj.", "self_attention.dense."),
                 ("pre_mlp_layernorm.", "post_attention_layernorm."),
                 ("mlp.linear_fc1.", "mlp.dense_h_to_4h."), ("mlp.linear_fc2.", "mlp.dense_4h_to_h."))


def _legacy_key(name: str, post_ln: bool) -> list[str]:
    """nxd name (stage-local layer number) -> path inside ``model['language_model']``."""
    if name.startswith("embedding."):
        return ["embedding", name.split(".")[1], name.rsplit(".", 1)[1]]
    if name.startswith("output_layer."):
        return ["output_layer", name.rsplit(".", 1)[1]]
    key = name.replace("decoder.", "", 1)
    if post_ln:
        key = key.replace("post_attention_layernorm.", "input_layernorm.").replace(
            "post_mlp_layernorm.", "post_attention_layernorm.")
    for ours, theirs in _LEGACY_NAMES:
        key = key.replace(ours, theirs)
    return ["encoder", key]


@torch.no_grad()
def save_megatron_checkpoint(state: dict[str, torch.Tensor], config: Any, out_dir: str | os.PathLike,
                             tp: int = 1, pp: int = 1, iteration: int = 0) -> None:
    """Write a full (TP=1, nxd-named) GPT state dict as a Megatron-LM checkpoint in the legacy layout:
    ``out_dir/iter_XXXXXXX/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt`` (weights, ``args``,
    ``checkpoint_version`` 3.0; no optimizer) and ``latest_checkpointed_iteration.txt``. The
    vocabulary is padded Megatron's way for ``tp`` (zero rows)."""
    from nxd_models_gpt.config import GPTConfig

    config = GPTConfig.from_dict(config) if isinstance(config, dict) else config
    if config.num_layers % pp:
        raise ValueError(f"num_layers ({config.num_layers}) must be divisible by pp ({pp})")
    if config.num_query_groups % tp:
        raise ValueError(f"tp={tp} must divide num_query_groups ({config.num_query_groups}): Megatron's checkpoint "
                         "splits linear_qkv by whole query groups and has no K/V replication (nxd's "
                         "kv_size_multiplier); write it at a tp dividing the groups")
    gated, post_ln = config.activation == "swiglu", config.transformer_block_type == "post_ln"
    padded = config.padded_vocab_size(tp)
    per = config.num_layers // pp
    args = argparse.Namespace(
        num_layers=config.num_layers, hidden_size=config.hidden_size, ffn_hidden_size=config.ffn_hidden_size,
        num_attention_heads=config.num_attention_heads, kv_channels=config.kv_channels,
        group_query_attention=config.num_query_groups != config.num_attention_heads,
        num_query_groups=config.num_query_groups, max_position_embeddings=config.max_position_embeddings,
        padded_vocab_size=padded, make_vocab_size_divisible_by=config.make_vocab_size_divisible_by,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, swiglu=gated,
        normalization=config.normalization, norm_epsilon=config.layernorm_epsilon,
        position_embedding_type=config.position_embedding_type, rotary_percent=config.rotary_percentage,
        rotary_base=config.rotary_base, add_bias_linear=config.has_bias,
        untie_embeddings_and_output_weights=not config.share_embeddings_and_output_weights,
        openai_gelu=config.openai_gelu, init_method_std=config.init_method_std,
        apply_query_key_layer_scaling=config.apply_query_key_layer_scaling,
        hidden_dropout=config.hidden_dropout, attention_dropout=config.attention_dropout)
    root = Path(out_dir)
    iter_dir = root / f"iter_{iteration:07d}"
    for name in list(state):
        if name.endswith(("word_embeddings.weight", "output_layer.weight")):
            real = state[name][: config.vocab_size]
            state = {**state, name: torch.cat([real, real.new_zeros(padded - config.vocab_size, real.shape[1])])}
    for pp_rank in range(pp):
        first, last = pp_rank == 0, pp_rank == pp - 1
        for tp_rank in range(tp):
            lm: dict[str, Any] = {}
            for name, tensor in state.items():
                if name.startswith("embedding.") and not first:
                    continue
                if name.startswith(("output_layer.", "decoder.final_layernorm.")) and not last:
                    continue
                if name == "output_layer.weight" and config.share_embeddings_and_output_weights:
                    continue
                m = re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name)
                local = name
                if m:
                    if int(m.group(1)) // per != pp_rank:
                        continue
                    local = f"decoder.layers.{int(m.group(1)) % per}.{m.group(2)}"
                path = _legacy_key(local, post_ln)
                node = lm
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = _shard(name, tensor, tp, tp_rank, gated).clone()
            d = iter_dir / (f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else ""))
            d.mkdir(parents=True, exist_ok=True)
            torch.save({"args": args, "checkpoint_version": 3.0, "iteration": iteration,
                        "model": {"language_model": lm}}, d / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(f"{iteration}\n")
