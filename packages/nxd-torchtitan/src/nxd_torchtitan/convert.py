"""``nxd ckpt convert --from torchtitan`` / ``--to torchtitan``: a torchtitan DCP checkpoint folder
and nxd's full model state, through each family's own Hugging Face import/export.

Reading: the folder (a DCP checkpoint, or torchtitan's ``checkpoint/`` folder of ``step-N``
checkpoints: the newest, or ``--tag step-N``) is read directly in one process
(:mod:`nxd_ckpt.dcp_folder`); its names give its torchtitan layout (0.3.0 or <= 0.2); the model's
numbers come from ``--config`` (:func:`nxd_torchtitan.model_args.read_args_file`) or the
``nxd_torchtitan.json`` a ``--to torchtitan`` wrote beside the tensors. A training checkpoint's
optimizer, LR schedule, data loader and step are named and not converted.

Writing: a model-only DCP folder under torchtitan 0.3.0's names, plus ``nxd_torchtitan.json`` (the
model's :class:`~nxd_torchtitan.model_args.TitanArgs`), which torchtitan loads with
``--checkpoint.initial_load_path <folder> --checkpoint.initial_load_model_only`` (docs/torchtitan.md).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any

import torch

from nxd_ckpt.convert import Converter, ConvertRequest, FullState, single_rank
from nxd_ckpt.dcp_folder import is_dcp_folder, read_dcp_model, write_dcp_folder
from nxd_ckpt.errors import CheckpointError
from nxd_torchtitan.model_args import ARGS_FILE, TitanArgs, from_nxd_config, read_args_file, to_nxd_config
from nxd_torchtitan.names import V03, detect_version, family, hf_to_torchtitan, torchtitan_to_hf

_STEP = re.compile(r"step-(\d+)")


def checkpoint_folder(path: str, tag: str | None = None) -> str:
    """The DCP folder ``path`` names: itself, or in torchtitan's ``checkpoint/`` folder ``tag``
    (``step-N``; another tag names the nxd checkpoint a conversion writes) or the newest complete
    ``step-N``."""
    if tag is not None and _STEP.fullmatch(tag):
        folder = os.path.join(path, tag)
        if not is_dcp_folder(folder):
            raise CheckpointError(f"{folder} is not a complete DCP checkpoint (no .metadata)")
        return folder
    if is_dcp_folder(path):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"{path} does not exist")
    steps = sorted((int(m.group(1)), name) for name in os.listdir(path)
                   if (m := _STEP.fullmatch(name)) and is_dcp_folder(os.path.join(path, name)))
    if not steps:
        hf = os.path.isfile(os.path.join(path, "model.safetensors.index.json")) or any(
            name.endswith(".safetensors") for name in os.listdir(path))
        raise CheckpointError(f"{path}: neither a DCP checkpoint (.metadata) nor a torchtitan checkpoint folder "
                              "with complete step-N checkpoints" + (" (it holds safetensors: torchtitan's "
                              "last_save_in_hf export is a Hugging Face folder, read it with --from hf)" if hf else ""))
    return os.path.join(path, steps[-1][1])


def _args(request: ConvertRequest, folder: str, recorded: dict | None = None) -> TitanArgs:
    """The model's args: --config (args or a Hugging Face config with --model), else the folder's own."""
    config = request.config
    if config is None and os.path.isfile(os.path.join(folder, ARGS_FILE)):
        config = read_args_file(os.path.join(folder, ARGS_FILE))
    config = config or recorded
    if config is None:
        raise CheckpointError(f"{folder}: torchtitan checkpoints do not record the model; pass --config with a "
                              "torchtitan flavor (MODULE:FLAVOR such as llama3:8B, torchtitan installed), a JSON of "
                              "its args (family, dim, n_layers, ...) or a Hugging Face config.json with --model")
    try:
        if "family" in config:
            return TitanArgs.from_dict(config, "--config")
        if request.model is None:
            raise CheckpointError("--config is a Hugging Face config: --model names its family (llama or qwen3)")
        return from_nxd_config(request.model, config)
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"--from torchtitan: {exc}") from None


def _nxd_state(args: TitanArgs, hf: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """nxd's full state of the model ``args`` from its Hugging Face-named tensors (the family's own import)."""
    import nxd
    from nxd_modeling.hf_interop import write_hf_dir

    spec, config = nxd.get_model(args.family), to_nxd_config(args)
    with tempfile.TemporaryDirectory() as tmp, single_rank() as context:
        write_hf_dir(tmp, config, hf)
        model = nxd.build_parallel_model(spec, config, context=context)
        try:
            spec.load_hf(model, tmp)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{where}: its tensors do not fit the model of --config ({exc})") from None
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def read_torchtitan(request: ConvertRequest) -> FullState:
    folder = checkpoint_folder(request.input, request.tag)
    args = _args(request, folder)
    fam = family(args.family)
    titan, groups = read_dcp_model(folder)
    try:
        version = detect_version(set(titan), folder)
        hf = torchtitan_to_hf(titan, fam, n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, head_dim=args.head_dim,
                              tied=args.enable_weight_tying, version=version)
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{folder}: {exc}") from None
    if groups:
        print(f"{folder}: model converted; its training state ({', '.join(sorted(groups))}) is not: torchtitan's "
              "optimizer and schedule states are keyed by its own parameter names and containers, which nxd's "
              "optimizers do not read")
    print(f"{folder}: torchtitan {version if version == V03 else '<= 0.2'} layout, {fam.torchtitan_module} "
          f"({args.n_layers} layers, dim {args.dim})")
    state = _nxd_state(args, hf, folder)
    return FullState(state, to_nxd_config(args), args.family)


def _hf_state(spec: Any, config: dict, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Hugging Face-named tensors of nxd's full ``state`` (the family's own export)."""
    from safetensors.torch import load_file

    import nxd

    with tempfile.TemporaryDirectory() as tmp, single_rank() as context:
        model = nxd.build_parallel_model(spec, config, context=context)
        model.load_state_dict(state, strict=True)
        spec.save_hf(model, tmp)
        files = sorted(f for f in os.listdir(tmp) if f.endswith(".safetensors"))
        return {k: v for f in files for k, v in load_file(os.path.join(tmp, f)).items()}


def to_torchtitan_state(family_name: str, config: dict, state: dict[str, torch.Tensor],
                        version: str = V03) -> tuple[dict[str, torch.Tensor], TitanArgs]:
    """nxd's full (TP=1) ``state`` of model ``family_name`` with ``config`` as torchtitan's model state
    dict in ``version``'s layout, and the torchtitan model's args."""
    import nxd

    args = from_nxd_config(family_name, config)
    hf = _hf_state(nxd.get_model(family_name), config, state)
    titan = hf_to_torchtitan(hf, family(family_name), n_heads=args.n_heads, n_kv_heads=args.n_kv_heads,
                             head_dim=args.head_dim, tied=args.enable_weight_tying, version=version)
    return titan, args


def write_torchtitan(full: FullState, request: ConvertRequest) -> None:
    name = request.model or full.model
    config = request.config or full.config
    if name is None or config is None:
        raise CheckpointError("--to torchtitan needs the model: --model (llama or qwen3) and --config config.json "
                              "(checkpoints of nxd train record both)")
    if full.lora is not None:
        raise CheckpointError("--to torchtitan: a LoRA run's state holds adapters torchtitan's model has no place "
                              "for; merge them first (nxd ckpt convert --from nxd --to hf --lora merge), then "
                              "convert that: --from hf --to torchtitan")
    try:
        titan, args = to_torchtitan_state(name, config, full.state)
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"--to torchtitan: {exc}") from None
    write_dcp_folder(request.output, titan, files={ARGS_FILE: json.dumps(args.to_dict(), indent=1).encode()})
    print(f"{request.output}: torchtitan 0.3.0 {family(name).torchtitan_module} weights (model only: load with "
          f"--checkpoint.initial_load_path {request.output} --checkpoint.initial_load_model_only; the optimizer "
          "starts fresh)")


def _config_file(path: str) -> dict:
    try:
        return read_args_file(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"--config {path}: {exc}") from None


TORCHTITAN_CONVERTER = Converter(
    read_torchtitan, write_torchtitan, config_from_file=_config_file,
    help="torchtitan DCP checkpoint (Llama 3, Qwen3; 0.3.0 and <= 0.2 names): model weights both ways")
