"""The load flow: model weights (resharded when TP/PP differ), optimizer (ZeRO-1 resharded when
DP differs), scheduler, RNG states, and the user content that ``load_checkpoint`` returns."""

from __future__ import annotations

import io
import warnings
from typing import Any

import torch

from nxd_ckpt.checksum import verify
from nxd_ckpt.errors import CheckpointError, CorruptCheckpointError
from nxd_ckpt.formats import format_for_file, get_format
from nxd_ckpt.layout import parse_shard_name, rng_name, shard_ep_rank, shard_name
from nxd_ckpt.metadata import shardings_of
from nxd_ckpt.nxd_dcp import is_nxd_dcp_optim, nxd_dcp_xla_shard, read_dcp
from nxd_ckpt.nxd_layouts import adapt_qkv_names, nxd_written_degrees
from nxd_ckpt.nxd_optim_reshard import nxd_optimizer_state_at
from nxd_ckpt.nxd_reshard import needs_nxd_reshard, nxd_written_state, warn_tiled
from nxd_ckpt.rng import restore_rng_state
from nxd_ckpt.sharding import Sharding, global_shape, merge_shards, split_full
from nxd_ckpt.snapshot import unwrap_model
from nxd_ckpt.storage import Storage
from nxd_ckpt.topology import Topology
from nxd_ckpt.xser import is_xser_in_storage, load_from_storage
from nxd_core_parallel.dtensor import shard_like
from nxd_core_parallel.xla_zero1_layout import is_xla_state


class Reader:
    """Reads (and caches) files of one checkpoint, naming the file in every error; verifies each
    file against the checksum recorded in the metadata (checkpoints saved with checksums)."""

    def __init__(self, storage: Storage, tag: str, meta: dict | None = None) -> None:
        self.storage, self.tag = storage, tag
        self.files: dict[str, dict] | None = (meta or {}).get("files")
        self._cache: dict[str, Any] = {}
        #: attention modules of an NxD-written tag whose TP ranks the model load renumbered (tiled K/V)
        self.nxd_renumbered: list[str] = []

    def has(self, rel: str) -> bool:
        return rel in self.files if self.files is not None else self.storage.exists(f"{self.tag}/{rel}")

    def load(self, rel: str, fmt_name: str | None = None) -> Any:
        if rel not in self._cache:
            path = f"{self.tag}/{rel}"
            where = self.storage.describe(path)
            if not self.storage.exists(path):
                recorded = " (metadata.json records it: it was deleted)" if self.files and rel in self.files else ""
                raise CheckpointError(f"{where}: missing from checkpoint{recorded}; is it complete, and saved with "
                                      "this layout?")
            if self.files is None and is_xser_in_storage(self.storage, path):  # NxD's use_xser layout
                self._cache[rel] = load_from_storage(self.storage, path)
                return self._cache[rel]
            fmt = get_format(fmt_name) if fmt_name else format_for_file(rel)
            with self.storage.open_read(path) as f:
                data = f.read()
            if self.files is not None:
                if rel not in self.files:
                    raise CorruptCheckpointError(f"{where}: not among the files metadata.json records for this "
                                                 "checkpoint (added after it was saved?)")
                verify(data, self.files[rel], where, {self.storage.describe(f"{self.tag}/{p}"): d
                                                       for p, d in self.files.items() if p != rel})
            self._cache[rel] = fmt.load(io.BytesIO(data), where)
        return self._cache[rel]

    def verify_files(self, prefix: str) -> None:
        """Check every file recorded under ``prefix`` against its checksum before another library
        (DCP) reads them itself; a checkpoint without recorded checksums (NxD's) is read as it is."""
        if self.files is None:
            return
        for rel in sorted(r for r in self.files if r.startswith(prefix)):
            where = self.storage.describe(f"{self.tag}/{rel}")
            if not self.storage.exists(f"{self.tag}/{rel}"):
                raise CheckpointError(f"{where}: missing from checkpoint (metadata.json records it: it was deleted)")
            with self.storage.open_read(f"{self.tag}/{rel}") as f:
                verify(f.read(), self.files[rel], where, {self.storage.describe(f"{self.tag}/{p}"): d
                                                          for p, d in self.files.items() if p != rel})

    def drop(self) -> None:
        self._cache.clear()


def model_file(meta: dict | None, reader: Reader, tp_rank: int, pp_rank: int, ep_rank: int = 0) -> tuple[str, str | None]:
    """The model file of ``(tp_rank, pp_rank)``; in a checkpoint NxD wrote with expert
    parallelism (one file per EP rank, each holding that rank's experts) the one of ``ep_rank``."""
    if meta is not None:
        fmt = get_format(meta.get("model_format", "torch"))
        return f"model/{shard_name(0, tp_rank, pp_rank, fmt.suffix)}", fmt.name
    candidates = [name for name in reader.storage.list_files(f"{reader.tag}/model")
                  if (parsed := parse_shard_name(name)) and parsed[1:3] == (tp_rank, pp_rank)]
    for name in candidates:
        if shard_ep_rank(name) in (None, ep_rank):
            return f"model/{name}", None
    if candidates:
        raise CheckpointError(f"checkpoint {reader.storage.describe(reader.tag)}: NxD wrote its model files per "
                              f"expert-parallel rank ({', '.join(sorted(candidates))}) and none is EP rank {ep_rank}'s; "
                              "load it at the expert_parallel_size it was saved with, or merge it with NxD's "
                              "checkpoint_converter --convert_to_full_state first")
    return f"model/{shard_name(0, tp_rank, pp_rank)}", None


def _rank_model_state(meta: dict | None, reader: Reader, topo: Topology) -> tuple[str, dict[str, Any]]:
    """This rank's model file and its state. NxD's per-EP-rank files hold the non-expert tensors
    in EP rank 0's file only (as its converter writes them; NxD's loader reads them from there):
    another EP rank's state is its own file over EP rank 0's."""
    rel, fmt = model_file(meta, reader, topo.tp_rank, topo.pp_rank, topo.ep_rank)
    state = reader.load(rel, fmt)
    if meta is None and shard_ep_rank(rel.rsplit("/", 1)[-1]):
        first, _ = model_file(meta, reader, topo.tp_rank, topo.pp_rank, 0)
        state = {**reader.load(first, fmt), **state}
    return rel, state


def _first_shape_mismatch(target: dict[str, Any], saved_shape: dict[str, list[int]], expected: dict[str, list[int]],
                          also: dict[str, list[int]] | None = None) -> None:
    """Raise on the first tensor whose saved shape is not the model's (nor its ``also`` shape)."""
    for name in target:
        if name in saved_shape and list(saved_shape[name]) not in (list(expected[name]), (also or {}).get(name)):
            raise CheckpointError(
                f"tensor {name!r}: checkpoint has shape {list(saved_shape[name])}, the model expects "
                f"{list(expected[name])} (first mismatching tensor; was the checkpoint saved from a different model config?)"
            )


def check_shard(where: str, state: dict[str, Any], meta: dict, topo: Topology) -> None:
    """Every tensor of a model shard has the dtype and (sharded) shape metadata.json records for
    it at this rank's TP rank and PP stage: catches a shard file from another rank or model."""
    entries = meta.get("tensors", {})
    for name, t in state.items():
        entry = entries.get(name)
        if entry is None or not isinstance(t, torch.Tensor):
            continue
        sh = Sharding.from_json(entry["sharding"])
        shape = global_shape(tuple(t.shape), sh, meta["degrees"]["tp"])
        dtype = str(t.dtype).removeprefix("torch.")
        if list(shape) != list(entry["shape"]) or dtype != entry["dtype"] or int(entry["pp_rank"]) != topo.pp_rank:
            raise CorruptCheckpointError(
                f"{where}: tensor {name!r} is {dtype} {list(t.shape)} (pipeline stage {topo.pp_rank}); metadata.json "
                f"records {entry['dtype']} of global shape {entry['shape']} on stage {entry['pp_rank']} "
                "(a shard file of another rank, or altered?)"
            )


def load_model(reader: Reader, meta: dict | None, model: Any, topo: Topology, strict: bool) -> None:
    if isinstance(model, dict):  # NxD's Lightning path passes a dict to be filled
        model.update(_rank_model_state(meta, reader, topo)[1])
        return
    module, adapters = _load_target(reader, meta, unwrap_model(model), topo)
    target = module.state_dict()
    shardings = shardings_of(module, target)
    padded = next((k for k, sh in shardings.items() if sh is not None and sh.head_padding is not None), None)
    if meta is None and padded is not None:  # NxD places padded heads its own ways (per hardware), unrecorded
        raise CheckpointError(f"{reader.storage.describe(reader.tag)} was written by NxD (no metadata.json), and this "
                              f"model pads its attention heads at TP={topo.tp} ({padded}): NxD's head padding layout "
                              "is not recorded in its checkpoints; load it at a tensor-parallel size dividing "
                              "num_attention_heads, then save it with nxd")
    if meta is None and needs_nxd_reshard(reader, shardings, topo.tp, topo.pp):
        state, tiled = nxd_written_state(reader, module, shardings, topo.tp, topo.tp_rank, topo.pp)
        reader.nxd_renumbered = tiled
        if tiled:
            warn_tiled(reader.storage.describe(reader.tag), tiled, nxd_written_degrees(reader.storage, reader.tag)[0])
    elif meta is None or (meta["degrees"]["tp"], meta["degrees"]["pp"]) == (topo.tp, topo.pp):
        rel, state = _rank_model_state(meta, reader, topo)
        if meta is not None:
            check_shard(reader.storage.describe(f"{reader.tag}/{rel}"), state, meta, topo)
        else:  # written by NxD: its modules' Q/K/V naming may differ from this model's
            state = adapt_qkv_names(state, module)
        saved = {k: list(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
        # an expert-parallel parameter's state holds every expert; NxD's EP files hold the rank's own
        local = {k: list(p.shape) for k, p in module.named_parameters() if getattr(p, "expert_model_parallel", False)}
        _first_shape_mismatch(target, saved, {k: list(v.shape) for k, v in target.items()}, local)
    else:
        state = _reshard(reader, meta, target, shardings, topo, strict)
    missing = [k for k in target if k not in state] + adapters
    unexpected = [k for k in state if k not in target] if (meta is None or topo.pp == 1) else []
    where = reader.storage.describe(reader.tag)
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"model state in {where} does not match the model: {len(missing)} of its tensors are not in the "
            f"checkpoint {missing[:8]}{'...' if len(missing) > 8 else ''}, {len(unexpected)} checkpoint tensors "
            f"match nothing in the model {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}. Loading would "
            "leave the missing ones at their initial values: check that the model is built as the checkpoint's "
            "was (architecture, fused or separate projections, names); strict=False loads the overlap only, "
            "warning with the name of every tensor it leaves at its initial value"
        )
    if missing:
        warnings.warn(f"{where}: strict=False left {len(missing)} model tensor(s) at their initial values (not in "
                      f"the checkpoint): {missing}", stacklevel=4)
    # parameters a data-parallel strategy cut into DTensors (FSDP) take their own rows of each whole tensor
    params = dict(module.named_parameters())
    module.load_state_dict({k: shard_like(v, params[k]) if k in params else v for k, v in state.items() if k in target},
                           strict=False)


def _load_target(reader: Reader, meta: dict | None, module: Any, topo: Topology) -> tuple[Any, list[str]]:
    """The module a checkpoint's names belong to, and the tensors of ``module`` it cannot hold.

    A checkpoint of a plain model loads into that model wrapped by an adapter (a LoRA model keeps
    its base under ``module.``; ``get_base_model()`` returns it, as in NxD and PEFT): the base
    loads, and the adapter's own tensors are reported as not in the checkpoint (NxD's LoraModel
    loads a base state dict into its base the same way: fine-tuning from pretrained weights)."""
    get_base_model = getattr(module, "get_base_model", None)
    base = get_base_model() if callable(get_base_model) else module
    if base is module or not isinstance(base, torch.nn.Module):
        return module, []
    saved = set(meta["tensors"]) if meta is not None else set(_rank_model_state(meta, reader, topo)[1])
    wrapped = module.state_dict(keep_vars=True)
    base_state = base.state_dict(keep_vars=True)
    if saved & set(wrapped) or not saved & set(base_state):
        return module, []  # saved from the wrapped model (or neither): names as they are
    base_tensors = {id(t) for t in base_state.values()}
    return base, [k for k, t in wrapped.items() if id(t) not in base_tensors]


def _reshard(reader: Reader, meta: dict, target: dict[str, Any], shardings: dict[str, Sharding | None],
             topo: Topology, strict: bool) -> dict[str, torch.Tensor]:
    """Build this rank's state from a checkpoint saved at other TP/PP degrees."""
    saved_tp = meta["degrees"]["tp"]
    entries = meta["tensors"]
    expected = {k: global_shape(tuple(v.shape), shardings.get(k), topo.tp) for k, v in target.items()}
    _first_shape_mismatch(target, {k: e["shape"] for k, e in entries.items()}, expected)
    out: dict[str, torch.Tensor] = {}
    for name in target:
        entry = entries.get(name)
        if entry is None:
            continue
        pp = int(entry["pp_rank"])
        saved_sh = Sharding.from_json(entry["sharding"])
        if saved_sh is None:
            full = reader.load(*model_file(meta, reader, 0, pp))[name]
        else:
            full = merge_shards([reader.load(*model_file(meta, reader, r, pp))[name] for r in range(saved_tp)], saved_sh)
        if list(full.shape) != list(entry["shape"]):
            raise CheckpointError(f"tensor {name!r}: shards in the checkpoint assemble to {list(full.shape)}, "
                                  f"metadata says {entry['shape']}")
        target_sh = shardings.get(name)
        out[name] = split_full(full, target_sh, topo.tp, topo.tp_rank, name) if target_sh else full
    return out


def optimizer_reshard_refusal(storage: Storage, tag: str, meta: dict | None, tp: int, pp: int) -> str | None:
    """Why ``tag``'s optimizer state cannot be loaded at TP=``tp`` PP=``pp`` (None: it can). The
    rule :func:`load_optimizer` applies, also asked before launch (``nxd train --validate``)."""
    if meta is None:
        return None  # NxD-written: its own layouts, checked against the files when loaded
    saved = (meta["degrees"]["tp"], meta["degrees"]["pp"])
    if saved == (tp, pp) or (is_nxd_dcp_optim(storage, tag) and saved[1] == pp):  # NxD's DCP layout reshards TP
        return None
    return (f"{storage.describe(f'{tag}/optim')}: optimizer state was saved at TP={saved[0]} PP={saved[1]} and "
            f"does not reshard to TP={tp} PP={pp}")


def load_optimizer(reader: Reader, meta: dict | None, optimizer: Any, topo: Topology, model: Any = None) -> None:
    zero1_now = bool(getattr(optimizer, "nxd_zero1", False))
    where = reader.storage.describe(f"{reader.tag}/optim")
    dcp = is_nxd_dcp_optim(reader.storage, reader.tag)
    if meta is not None and dcp and meta["degrees"]["pp"] == topo.pp and meta["degrees"]["tp"] != topo.tp:
        _load_nxd_optimizer_resharded(reader, optimizer, model, topo, zero1_now)  # NxD's layout (use_zero1_dcp)
        return
    refusal = optimizer_reshard_refusal(reader.storage, reader.tag, meta, topo.tp, topo.pp)
    if refusal:
        raise CheckpointError(f"{refusal}; pass optimizer=None to load the weights only")
    if meta is None:
        _check_nxd_optimizer_layout(reader, topo)
        if nxd_written_degrees(reader.storage, reader.tag)[0] != topo.tp:
            _load_nxd_optimizer_resharded(reader, optimizer, model, topo, zero1_now)
            return
        if dcp:
            _load_nxd_dcp_optimizer(reader, optimizer, model, topo, zero1_now)
            return
    if meta is not None and not meta.get("has_optimizer", True):
        raise CheckpointError(f"checkpoint {reader.storage.describe(reader.tag)} was saved without optimizer state "
                              "(pass optimizer=None to load the weights only)")
    if meta is not None and dcp:  # saved with use_zero1_dcp=True
        _load_nxd_dcp_optimizer(reader, optimizer, model, topo, zero1_now)
        return
    # the shards the save wrote (metadata.json records them), so a deleted one is named, not guessed at
    names = ([p.split("/", 1)[1] for p in reader.files if p.startswith("optim/")] if reader.files is not None
             else reader.storage.list_files(f"{reader.tag}/optim"))
    files = [parse_shard_name(n) for n in names]
    mine = sorted(p[0] for p in files if p and p[1:3] == (topo.tp_rank, topo.pp_rank))
    if not mine:
        raise CheckpointError(
            f"{where}: no optimizer state for tp_rank {topo.tp_rank} pp_rank {topo.pp_rank} (the checkpoint "
            "has no metadata.json to say what was saved; pass optimizer=None to load the weights only)"
        )
    if meta is not None:
        saved_zero1 = bool(meta["zero1"])
    else:  # written by NxD: one shard per DP rank, or at DP=1 torch-xla's ZeRO-1 keys
        saved_zero1 = len(mine) > 1 or is_xla_state(reader.load(f"optim/{shard_name(mine[0], topo.tp_rank, topo.pp_rank)}"))
    if not zero1_now:
        if saved_zero1:
            raise CheckpointError(f"{where}: saved by a ZeRO-1 optimizer (one shard per DP rank); load it into a "
                                  "ZeRO-1 optimizer (zero_one_enabled=True)")
        optimizer.load_state_dict(reader.load(f"optim/{shard_name(0, topo.tp_rank, topo.pp_rank)}"))
        return
    if not saved_zero1:
        raise CheckpointError(f"{where}: saved by a non-ZeRO optimizer; the current optimizer is ZeRO-1")
    saved_ep = meta["degrees"].get("ep", 1) if meta is not None else topo.ep
    # NxD's own ZeRO-1 shards each hold rows of every parameter: a DP rank reads all of them
    if len(mine) == topo.dp and saved_ep == topo.ep and meta is not None:
        optimizer.load_state_dict(reader.load(f"optim/{shard_name(topo.dp_rank, topo.tp_rank, topo.pp_rank)}"))
    else:
        shards = [reader.load(f"optim/{shard_name(d, topo.tp_rank, topo.pp_rank)}") for d in mine]
        optimizer.load_state_dict_from_shards(shards)


def _check_nxd_optimizer_layout(reader: Reader, topo: Topology) -> None:
    """NxD's optimizer files hold one TP/PP rank's state each: they reshard across TP and DP, not
    across PP (each stage's parameter list differs and NxD's files do not name them)."""
    where = reader.storage.describe(f"{reader.tag}/optim")
    tp, pp = nxd_written_degrees(reader.storage, reader.tag)
    if pp != topo.pp:
        raise CheckpointError(f"{where}: optimizer state written by NxD at TP={tp} PP={pp} does not reshard to this "
                              f"run's PP={topo.pp} (the model does); pass optimizer=None to load the weights only, "
                              f"or load it at PP={pp}")
    if reader.nxd_renumbered:
        raise CheckpointError(f"{where}: the model's K/V heads were tiled over TP by NxD and nxd's ranks took them "
                              f"renumbered ({reader.nxd_renumbered[0]}, ...); NxD's optimizer state of each TP rank "
                              "cannot follow them: pass optimizer=None to load the weights only")


def _load_nxd_optimizer_resharded(reader: Reader, optimizer: Any, model: Any, topo: Topology, zero1_now: bool) -> None:
    """NxD's optimizer state of another TP, each tensor resharded as its parameter (``nxd_optim_reshard``)."""
    where = reader.storage.describe(f"{reader.tag}/optim")
    if model is None:
        raise CheckpointError(f"{where}: NxD's optimizer state was written at another TP and reshards like the "
                              "model's parameters: pass the model too")
    state, zero1 = nxd_optimizer_state_at(reader, unwrap_model(model), optimizer, topo.tp, topo.tp_rank, topo.pp,
                                          topo.pp_rank, is_nxd_dcp_optim(reader.storage, reader.tag))
    if zero1 != zero1_now:
        raise CheckpointError(f"{where}: saved by {'a ZeRO-1' if zero1 else 'a non-ZeRO'} optimizer; the current "
                              f"optimizer is {'ZeRO-1' if zero1_now else 'not ZeRO-1'} (zero_one_enabled)")
    if zero1:
        optimizer.load_state_dict_from_shards([state])
    else:
        optimizer.load_state_dict(state)


def _load_nxd_dcp_optimizer(reader: Reader, optimizer: Any, model: Any, topo: Topology, zero1_now: bool) -> None:
    """NxD's ZeRO-1 state saved with DCP (``use_zero1_dcp=True``): keyed by parameter name, so the
    model names the optimizer's parameters."""
    where = reader.storage.describe(f"{reader.tag}/optim")
    if not zero1_now:
        raise CheckpointError(f"{where}: NxD's ZeRO-1 optimizer state (torch.distributed.checkpoint layout); the "
                              "current optimizer is not ZeRO-1")
    if model is None:
        raise CheckpointError(f"{where}: NxD's DCP optimizer state is keyed by parameter name: pass the model too")
    names = {id(p): n for n, p in unwrap_model(model).named_parameters()}
    groups = [[(names.get(id(p), "?"), p) for p in g["params"]] for g in optimizer.param_groups]
    reader.verify_files("optim/")  # DCP reads the files itself: checked against metadata.json first
    state = read_dcp(reader.storage, f"{reader.tag}/optim")
    optimizer.load_state_dict_from_shards([nxd_dcp_xla_shard(state, groups, topo.tp_rank, topo.pp_rank, where)])


def restore_rng(reader: Reader, meta: dict | None, topo: Topology) -> None:
    if meta is None or not meta.get("has_rng"):
        return
    if meta["degrees"]["world"] != topo.world:
        warnings.warn(f"checkpoint {reader.tag} was saved by {meta['degrees']['world']} ranks and is loaded by "
                      f"{topo.world}: RNG states are per rank and were not restored", stacklevel=3)
        return
    restore_rng_state(reader.load(rng_name(topo.rank)))
