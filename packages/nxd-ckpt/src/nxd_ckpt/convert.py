"""``nxd ckpt convert``: move model weights between checkpoint kinds through a full state.

A conversion reads a *source* into a :class:`FullState` (unsharded tensors under nxd parameter
names, plus the model config when known) and hands it to a *target*. Built-in kinds:

* ``nxd``  — an nxd/NxD sharded checkpoint directory (read: consolidated from any TP/PP; write:
  a TP=1/PP=1 checkpoint, which ``load_checkpoint`` reshards to any TP/PP on load);
* ``full`` — one torch file holding the full state dict (NxD's "full state");
* ``hf``   — a Hugging Face model directory, through the model plugin's ``ModelSpec.load_hf`` /
  ``save_hf`` (``--model NAME``);
* ``dcp``  — a ``torch.distributed.checkpoint`` folder under nxd's parameter names (what
  ``nxd_fsdp.dcp.save_dcp`` writes), read and written in one process (:mod:`nxd_ckpt.dcp_folder`).

Every kind is a :class:`Converter` registered through the core hook
``nxd_register_checkpoint_converters`` (kind ``checkpoint_converter``), so it shows in
``nxd plugins``; nxd-migrate adds ``nnm``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from nxd_ckpt.errors import CheckpointError


@dataclass
class FullState:
    state: dict[str, torch.Tensor]
    #: model config dict (Hugging Face config.json keys) when known
    config: dict | None = None
    #: the registered model name, when the source records it (an ``nxd train`` checkpoint)
    model: str | None = None
    #: the tokenizer the model was trained with (a local folder or file), when recorded
    tokenizer: str | None = None
    #: a LoRA run's ``LoraConfig`` fields: ``state`` then holds ``module.*`` (base) and ``lora_layers.*``
    lora: dict | None = None


@dataclass
class ConvertRequest:
    input: str
    output: str
    model: str | None = None
    tag: str | None = None
    config: dict | None = None
    options: dict[str, Any] = field(default_factory=dict)


ConvertSource = Callable[[ConvertRequest], FullState]
ConvertTarget = Callable[[FullState, ConvertRequest], None]


@dataclass(frozen=True)
class Converter:
    """One checkpoint kind: how to read it into a :class:`FullState` and/or write one out."""

    read: ConvertSource | None = None
    write: ConvertTarget | None = None
    #: ``--config PATH`` -> model config dict, for kinds whose config is not a ``config.json``
    config_from_file: Callable[[str], dict] | None = None
    help: str = ""


def _converters(side: str) -> dict[str, Any]:
    import nxd

    found = {name: getattr(nxd.get_checkpoint_converter(name), side)
             for name in nxd.list_components("checkpoint_converter")}
    return {name: fn for name, fn in found.items() if fn is not None}


def convert_sources() -> dict[str, ConvertSource]:
    return _converters("read")


def convert_targets() -> dict[str, ConvertTarget]:
    return _converters("write")


def convert(source: str, target: str, request: ConvertRequest) -> FullState:
    sources, targets = convert_sources(), convert_targets()
    if source not in sources:
        raise CheckpointError(f"--from {source!r} is not a known source; known: {', '.join(sorted(sources))} "
                              "(nnm: pip install nxd-migrate; torchtitan: pip install nxd-torchtitan)")
    if target not in targets:
        raise CheckpointError(f"--to {target!r} is not a known target; known: {', '.join(sorted(targets))} "
                              "(torchtitan: pip install nxd-torchtitan)")
    full = sources[source](request)
    targets[target](full, request)
    return full


def read_config_file(source: str, path: str | None) -> dict | None:
    """``--config PATH``: the source converter's own reader when it has one, else ``config.json``."""
    if path is None:
        return None
    import nxd

    names = nxd.list_components("checkpoint_converter")
    reader = getattr(nxd.get_checkpoint_converter(source), "config_from_file", None) if source in names else None
    if reader is not None:
        return reader(path)
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"--config {path}: not a JSON model config (Hugging Face config.json keys): {exc.msg} at line "
            f"{exc.lineno}. A run of nxd train needs no --config: give its run directory (nxd ckpt convert --from "
            "nxd --to hf RUN_DIR); its checkpoints record the model") from None


def run_convert(source: str, target: str, input: str, output: str | None = None, *, model: str | None = None,
                tag: str | None = None, config_path: str | None = None, allow_pickle: bool = False,
                lora: str | None = None) -> FullState:
    """What ``nxd ckpt convert`` (and ``nxd migrate checkpoint``) run: convert and report.

    An ``nxd train`` run directory is a valid ``input`` for ``--from nxd`` (its ``checkpoints/``
    are read); ``output`` then defaults to ``<run dir>/hf/<tag>`` for ``--to hf``. ``lora``
    (``merge`` or ``adapter``) says how a LoRA run's adapters leave for ``hf``."""
    from nxd_ckpt.run_dir import checkpoint_root, is_run_dir

    run_dir = source == "nxd" and is_run_dir(input)
    if run_dir:
        input = checkpoint_root(input)
    if output is None:
        if not (run_dir and target == "hf"):
            raise CheckpointError("--output is required (it defaults only for --from nxd --to hf of a run directory)")
        from nxd_ckpt.consolidate import resolve_tag

        output = os.path.join(os.path.dirname(input), "hf", tag or resolve_tag(input, None))
    request = ConvertRequest(input, output, model, tag, read_config_file(source, config_path),
                             options={"allow_pickle": allow_pickle, "lora": lora})
    full = convert(source, target, request)
    where = f"{output}/{tag}" if tag and target == "nxd" else output
    print(f"converted {len(full.state)} tensors: {source} {input} -> {target} {where}")
    return full


# ---------------------------------------------------------------------------- models for hf
@contextlib.contextmanager
def single_rank() -> Iterator[Any]:
    """The parallel context to build models for: inside a process group the current one (a
    command called from a running job: the one fallback, ``resolve_context``), else a one-rank gloo
    group with TP = PP = 1 started here and ended on exit."""
    import torch.distributed as dist

    from nxd.parallel import destroy_parallel_context, resolve_context
    from nxd_core_parallel.context import start_parallel_context

    if dist.is_initialized():
        yield resolve_context()
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield start_parallel_context()
        finally:
            destroy_parallel_context()
            dist.destroy_process_group()


def _spec(request: ConvertRequest, need: str, recorded: str | None = None) -> Any:
    import nxd

    name = request.model or recorded
    if not name:
        raise CheckpointError(f"{need} needs --model NAME (a registered model: {', '.join(nxd.list_components('model'))}); "
                              "checkpoints of nxd train record it, this one does not")
    try:
        spec = nxd.get_model(name)
    except nxd.ComponentNotFound as exc:
        raise CheckpointError(f"{need}: {exc}") from None
    hook = "load_hf" if need == "--from hf" else "save_hf"
    if getattr(spec, hook) is None:
        raise CheckpointError(f"model {name!r} does not provide ModelSpec.{hook}; {need} is not possible")
    return spec


def _read_hf(request: ConvertRequest) -> FullState:
    import nxd

    spec = _spec(request, "--from hf")
    config_path = os.path.join(request.input, "config.json")
    config = request.config or json.loads(open(config_path).read())
    with single_rank() as context:
        model = nxd.build_parallel_model(spec, config, context=context)
        spec.load_hf(model, request.input)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return FullState(state, config)


def _write_hf(full: FullState, request: ConvertRequest) -> None:
    import nxd
    from nxd_ckpt.hf_export import copy_tokenizer, lora_mode, write_lora_hf

    spec = _spec(request, "--to hf", full.model)
    config = request.config or full.config
    if config is None:
        raise CheckpointError("--to hf needs the model config: pass --config config.json (checkpoints of nxd train "
                              "record it, this one does not)")
    mode = lora_mode(full, request.options.get("lora"), request.input)
    with single_rank() as context:
        model = nxd.build_parallel_model(spec, config, context=context)
        try:
            if mode is None:
                model.load_state_dict(full.state, strict=True)
                spec.save_hf(model, request.output)
            else:
                write_lora_hf(spec, model, full, mode, request.output)
        except ValueError as exc:  # e.g. a config the Hugging Face layout cannot express
            raise CheckpointError(f"--to hf ({spec.name}): {exc}") from None
    copy_tokenizer(full.tokenizer, request.output)


def _read_nxd(request: ConvertRequest) -> FullState:
    from nxd_ckpt.consolidate import full_model_state, resolve_tag
    from nxd_ckpt.run_dir import checkpoint_record
    from nxd_ckpt.storage import open_storage

    tag = resolve_tag(request.input, request.tag)
    state = full_model_state(request.input, tag)
    storage = open_storage(request.input)
    config = None
    if storage.exists(f"{tag}/config.json"):
        with storage.open_read(f"{tag}/config.json") as f:
            config = json.loads(f.read().decode())
    record = checkpoint_record(request.input, tag)
    return FullState(state, request.config or config or record.get("config"), record.get("name"),
                     record.get("tokenizer"), record.get("lora"))


def read_user_content(path: str, tag: str) -> Any:
    """The ``user_content`` saved with checkpoint ``path/tag`` (``None`` when it has none)."""
    from nxd_ckpt.layout import read_done
    from nxd_ckpt.load import Reader
    from nxd_ckpt.metadata import read_metadata
    from nxd_ckpt.storage import open_storage

    storage = open_storage(path)
    meta = read_metadata(storage, tag, read_done(storage, tag).get("metadata"))
    reader = Reader(storage, tag, meta)
    saved = meta.get("has_user_content") if meta is not None else reader.has("user_content.pt")
    return reader.load("user_content.pt") if saved else None


def _write_nxd(full: FullState, request: ConvertRequest) -> None:
    import nxd
    from nxd_ckpt.storage import open_storage

    tag = request.tag or "converted"
    nxd.save_checkpoint(request.output, tag, model=full.state, save_rng=False)
    config = request.config or full.config
    if config is not None:
        with open_storage(request.output).open_write(f"{tag}/config.json") as f:
            f.write(json.dumps(config, indent=1).encode())


def _read_full(request: ConvertRequest) -> FullState:
    from nxd_ckpt.formats import format_for_file

    with open(request.input, "rb") as f:
        state = format_for_file(request.input).load(f, request.input)
    return FullState(dict(state), request.config)


def _write_full(full: FullState, request: ConvertRequest) -> None:
    from nxd_ckpt.formats import format_for_file

    os.makedirs(os.path.dirname(os.path.abspath(request.output)), exist_ok=True)
    with open(request.output, "wb") as f:
        format_for_file(request.output).dump(full.state, f)


def _read_dcp(request: ConvertRequest) -> FullState:
    from nxd_ckpt.dcp_folder import read_dcp_model

    state, groups = read_dcp_model(request.input)
    if groups:
        print(f"{request.input}: model tensors converted; its {', '.join(sorted(groups))} state is not (nxd's "
              "optimizer layout differs: resume the optimizer with nxd_fsdp.dcp.load_dcp instead)")
    return FullState(state, request.config)


def _write_dcp(full: FullState, request: ConvertRequest) -> None:
    from nxd_ckpt.dcp_folder import write_dcp_folder

    write_dcp_folder(request.output, full.state)
    config = request.config or full.config
    if config is not None:
        with open(os.path.join(request.output, "config.json"), "w") as f:
            json.dump(config, f, indent=1)


#: nxd-ckpt's own kinds (registered by its plugin module)
BUILTIN_CONVERTERS: dict[str, Converter] = {
    "hf": Converter(_read_hf, _write_hf, help="Hugging Face model directory (--model NAME)"),
    "nxd": Converter(_read_nxd, _write_nxd, help="nxd/NxD sharded checkpoint directory"),
    "full": Converter(_read_full, _write_full, help="one torch/safetensors file with the full state dict"),
    "dcp": Converter(_read_dcp, _write_dcp, help="torch.distributed.checkpoint folder under nxd's names (model only)"),
}
