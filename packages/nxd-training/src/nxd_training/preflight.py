"""Checks of the machine and the file system that ``nxd train`` runs before it starts any rank:
each failure here would otherwise surface inside the ranks, after minutes of start-up or training
(a log directory that is a file, an accelerator that is not there, a checkpoint to resume that does
not exist, a Hugging Face folder to start from that does not match the model, a tokenizer that
generation needs only at the end, a model that cannot fit)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

import nxd
from nxd.config import check_run_config
from nxd.errors import ConfigError
from nxd_training.config.features import builds_model_type
from nxd_training.config.nxdt import MODEL_KEY_MAP
from nxd_training.config.plan import file_tokenizer, qlora_mode, tokenizer_path
from nxd_training.config.resolved import model_spec_of
from nxd_training.config.schema import (
    DataConfig,
    ExpManagerConfig,
    GenerationConfig,
    ModelConfig,
    TrainerConfig,
    TrainingConfig,
)
from nxd_training.runtime import parse_max_time, select_backend

#: bytes per parameter for fp32 weights + grads + Adam's two moments (the common worst case)
_BYTES_PER_PARAM = 16
PRETRAINED_KEY = "model.pretrained_checkpoint"


def preflight(config: TrainingConfig, log_dir: Path) -> None:
    """Raise :class:`ConfigError` naming the key and what would be valid for anything that cannot work.
    Last, every plugin's ``nxd_validate_config`` hook judges the run's RunConfig (once per run: ranks do not)."""
    _writable_dir(log_dir, "the run directory (exp_manager.exp_dir / explicit_log_dir)")
    remote_checkpoints_writable(config.exp_manager, log_dir)
    backend = select_backend(config.trainer)  # the ranks' own choice, so an absent device is refused here first
    ops = config.model.fused_kernels
    if ops and backend != "cuda":
        raise ConfigError(f"model.fused_kernels {ops}: these are Triton kernels for CUDA GPUs, and this run uses "
                          f"trainer.accelerator={backend}; remove model.fused_kernels or run with trainer.accelerator=cuda")
    parse_max_time(config.trainer.max_time)
    em = config.exp_manager
    _resume(em.resume_from_checkpoint)
    run = config.run
    check_pretrained(config.model, em.resume_from_checkpoint, model_spec_of(run), dict(run.derived.model),
                     qlora_mode(config) is not None)
    _qlora_weights_from(config)
    _resume_layout(config, log_dir, run.derived.dp)
    # the format is checked whenever it is used or written down (a wrong name is wrong with checkpointing off too)
    if em.create_checkpoint_callback or em.resume_from_checkpoint or "checkpoint_format" in em.model_fields_set:
        nxd.get_component("checkpoint_format", em.checkpoint_format,
                          need=f"exp_manager.checkpoint_format={em.checkpoint_format}")
    if em.create_checkpoint_callback and em.checkpoint_callback_params.save_top_k == 0:
        raise ConfigError("exp_manager.checkpoint_callback_params.save_top_k=0 would keep no checkpoint of a run that "
                          "saves them: set exp_manager.create_checkpoint_callback=false to save none, or save_top_k "
                          "to N >= 1 (the newest N) or -1 (all)")
    _tokenizer(config.data, config.generation)
    _memory(config.model, config.trainer, run.derived.world_size)
    check_run_config(run)  # last: the plugins judge a config whose files and machine passed


def _writable_dir(path: Path, what: str) -> None:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{what}: {probe} is a file, not a directory; choose another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: cannot write under {probe} (permission denied)")


def remote_checkpoints_writable(em: ExpManagerConfig, log_dir: Path) -> None:
    """Checkpoints to a URL (``dirpath: s3://bucket/run``): one small object written and removed
    before any rank starts, so a missing bucket or wrong credentials are refused now, not at the
    first save hours into the run (local folders: :func:`_writable_dir`)."""
    from nxd_training.exp_manager import checkpoint_dir, is_url

    url = checkpoint_dir(em, log_dir)
    if not em.create_checkpoint_callback or not is_url(url):
        return
    import uuid

    from nxd_ckpt.storage import open_storage

    probe = f".nxd-preflight-{uuid.uuid4().hex[:8]}"  # names starting with "." are never tags
    try:
        storage = open_storage(url)
        with storage.open_write(probe) as f:
            f.write(b"nxd")
        storage.remove_file(probe)
    except Exception as exc:  # noqa: BLE001 - any storage error: the run could not save there
        raise ConfigError(f"exp_manager.checkpoint_callback_params.dirpath={url}: cannot write there "
                          f"({type(exc).__name__}: {exc}); check that the bucket exists and the credentials "
                          "(e.g. AWS_* variables) allow writing") from None


def _resume(source: str | None) -> None:
    if not source or "://" in source:
        return  # remote URLs are checked by the storage plugin when the ranks open them
    path = Path(source)
    if not path.exists():
        raise ConfigError(f"exp_manager.resume_from_checkpoint: {path} does not exist (give a checkpoint directory "
                          "<dir>/<tag> written by nxd)")
    if looks_like_hf_folder(path):
        raise ConfigError(f"exp_manager.resume_from_checkpoint: {path} is a Hugging Face model folder, not an nxd "
                          f"checkpoint; to start a run from its weights use model.pretrained_checkpoint={path}")


def _qlora_weights_from(config: TrainingConfig) -> None:
    """QLoRA with ``model.weight_init_only`` from a checkpoint (``nxd eval`` of a QLoRA run, or a new
    run from one's adapters): the checkpoint must be a QLoRA run's of the same base format, which
    holds the adapters and every other tensor but not the NF4 base (quantised again from
    ``model.pretrained_checkpoint``). Another checkpoint's base weights would not be the NF4 base."""
    mode, em = qlora_mode(config), config.exp_manager
    if mode is None or not (em.resume_from_checkpoint and config.model.weight_init_only) or "://" in em.resume_from_checkpoint:
        return
    from nxd_ckpt.run_dir import checkpoint_record
    from nxd_training.exp_manager import split_checkpoint_path

    parent, tag = split_checkpoint_path(em.resume_from_checkpoint)
    lora = checkpoint_record(parent, tag).get("lora") or {}
    if lora.get("quantize_base") != mode:
        raise ConfigError(f"model_alignment_strategy.peft.quantize_base={mode!r} with exp_manager.resume_from_checkpoint="
                          f"{em.resume_from_checkpoint} and model.weight_init_only: that checkpoint is not a QLoRA "
                          f"({mode}) run's (its record's quantize_base: {lora.get('quantize_base')!r}); the NF4 base is "
                          "quantised from model.pretrained_checkpoint, not from another checkpoint's weights: export "
                          "that checkpoint to Hugging Face (nxd ckpt convert) and name it there")


def _resume_layout(config: TrainingConfig, log_dir: Path, dp: int) -> None:
    """A resume that loads optimizer state needs a layout that state reshards to: refused here, not
    on every rank after launch (the composition matrix found "resume on another TP" failing there)."""
    from nxd.errors import NxdError
    from nxd_ckpt.layout import newest_complete_tag, read_done
    from nxd_ckpt.load import optimizer_reshard_refusal
    from nxd_ckpt.metadata import read_metadata
    from nxd_ckpt.storage import open_storage
    from nxd_training.exp_manager import checkpoint_dir, is_url, split_checkpoint_path
    from nxd_training.resume_rules import data_position_refusal

    em, ds = config.exp_manager, config.distributed_strategy
    source: tuple[str, str | None, str] | None = None
    ckpt_dir = checkpoint_dir(em, log_dir)
    if em.resume_if_exists and not is_url(ckpt_dir) and Path(ckpt_dir).is_dir():
        source = (ckpt_dir, newest_complete_tag(open_storage(ckpt_dir)), "exp_manager.resume_if_exists")
    elif em.resume_from_checkpoint and not config.model.weight_init_only and not is_url(em.resume_from_checkpoint):
        source = (*split_checkpoint_path(em.resume_from_checkpoint), "exp_manager.resume_from_checkpoint")
    if source is None or source[1] is None:
        return
    folder, tag, key = source
    storage = open_storage(folder)
    tp, pp = ds.tensor_model_parallel_size, ds.pipeline_model_parallel_size
    try:  # verified against the digest its `done` records before a word of it is believed
        meta = read_metadata(storage, tag, read_done(storage, tag).get("metadata"))
    except NxdError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    refusal = optimizer_reshard_refusal(storage, tag, meta, tp, pp)
    if not refusal and key == "exp_manager.resume_if_exists":  # the run's own: one data position per DP rank
        refusal = data_position_refusal((meta or {}).get("degrees", {}).get("dp"), dp, storage.describe(tag))
    if refusal:
        raise ConfigError(f"{key}: {refusal}: resume at the layout it was saved at, or start from its weights with "
                          f"exp_manager.resume_from_checkpoint={folder}/{tag} and model.weight_init_only=true "
                          "(the optimizer, schedule and data position then start fresh)")


def _tokenizer(data: DataConfig, gen: GenerationConfig | None) -> None:
    """A tokenizer given as a path (absolute, ./, ../, ~ or a file name) must exist; hub names and
    built-in names are the data module's to resolve; a tokenizer built from files needs its files.
    ``generation.prompts`` need the tokenizer at the end of the run: its path must exist now."""
    files = file_tokenizer(data)
    if files is not None:
        from nxd_data.tokenizers import load_tokenizer

        load_tokenizer(files)  # refuses naming data.tokenizer.<key> and the missing file
        return
    path = tokenizer_path(data)
    if path is None or "://" in str(path):
        return
    text = str(path)
    looks_like_path = text.startswith(("/", "./", "../", "~")) or text.endswith((".json", ".model", ".vocab", ".txt"))
    if looks_like_path and not Path(text).expanduser().exists():
        raise ConfigError(f"data.tokenizer: {text} does not exist (give a tokenizer file or folder, or a Hugging Face "
                          "hub name)")
    if gen is not None and gen.prompts and not Path(path).exists():
        raise ConfigError(f"generation.prompts need the tokenizer, and {path} does not exist (data.tokenizer / "
                          "model.tokenizer); fix the path or drop generation.prompts")


def _memory(m: ModelConfig, tr: TrainerConfig, world_size: int) -> None:
    """Refuse sizes that cannot fit by a wide margin (weights + grads + Adam, sharded over all ranks,
    against the machine's RAM for CPU runs); borderline cases are left to the run."""
    h, layers, vocab = m.hidden_size, m.num_layers, m.vocab_size
    if not (h and layers) or tr.accelerator not in ("cpu", "auto") or torch.cuda.is_available():
        return
    ffn = m.ffn_hidden_size or 4 * h
    experts = max(int(getattr(m.moe, "num_experts", 1) or 1), 1) if getattr(m, "moe", None) is not None else 1
    params = layers * (4 * h * h + 3 * h * ffn * experts) + 2 * (vocab or 0) * h  # an estimate from the keys
    try:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that reports it
        return
    needed = params * _BYTES_PER_PARAM / tr.num_nodes  # at least one full copy per node's share
    if needed > 4 * available:
        raise ConfigError(
            f"model: about {params / 1e9:.1f}B parameters need ~{needed / 2**30:.0f} GiB for weights, gradients and "
            f"optimizer state, but this machine has {available / 2**30:.0f} GiB (over {world_size} ranks); reduce "
            "model.num_layers / hidden_size, or run on more or larger machines"
        )

def looks_like_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def looks_like_nxd_checkpoint(path: Path) -> bool:
    return any((path / name).exists() for name in ("done", "checkpoint", "model", "checkpoints", "metadata.json"))


def check_pretrained(model: ModelConfig, resume_from_checkpoint: str | None, spec: Any, model_dict: dict[str, Any],
                     quantized_base: bool = False) -> None:
    """``model.pretrained_checkpoint``: refuse, naming the field, a Hugging Face folder the run could
    not start from (checked before launch: the folder, its weights, its ``config.json`` against the
    model section; each rank then loads its slices through ``ModelSpec.load_hf``). ``quantized_base``
    (QLoRA): the folder is the NF4 base of every start, a resumed one too."""
    source = model.pretrained_checkpoint
    if not source:
        return
    if "://" in source:
        raise ConfigError(f"{PRETRAINED_KEY}={source}: give a local Hugging Face model folder (download it first, e.g. "
                          "huggingface-cli download NAME --local-dir DIR)")
    if resume_from_checkpoint and not quantized_base:
        raise ConfigError(f"{PRETRAINED_KEY} and exp_manager.resume_from_checkpoint are both set: start from the Hugging Face "
                          "weights or from an nxd checkpoint, not both")
    path = Path(source)
    if not path.is_dir():
        raise ConfigError(f"{PRETRAINED_KEY}: {path} is not a directory (give a Hugging Face model folder: config.json + "
                          "*.safetensors)")
    if not looks_like_hf_folder(path):
        if looks_like_nxd_checkpoint(path):
            raise ConfigError(f"{PRETRAINED_KEY}: {path} is an nxd checkpoint, not a Hugging Face folder; to start from its "
                              "weights use exp_manager.resume_from_checkpoint=<dir>/<tag> with model.weight_init_only=true")
        found = "pytorch_model.bin only; save it as safetensors (model.save_pretrained(dir, safe_serialization=True))" \
            if any(path.glob("pytorch_model*.bin")) else "no config.json and *.safetensors"
        raise ConfigError(f"{PRETRAINED_KEY}: {path} holds {found}")
    if getattr(spec, "load_hf", None) is None:
        raise ConfigError(f"{PRETRAINED_KEY}: model.architecture={spec.name!r} cannot load Hugging Face weights (its "
                          "ModelSpec has no load_hf)")
    hf = json.loads((path / "config.json").read_text(encoding="utf-8"))
    model_type = hf.get("model_type")
    types = tuple(getattr(spec, "hf_model_types", ()) or ()) or (spec.name,)
    if model_type and not builds_model_type(spec, model_type):
        raise ConfigError(f"{PRETRAINED_KEY}: {path}/config.json has model_type {model_type!r}, which model.architecture="
                          f"{spec.name!r} does not build (it builds {', '.join(types)})")
    _same_shape(model, model_dict, hf, path)


def _same_shape(model: ModelConfig, ours: dict[str, Any], hf: dict[str, Any], path: Path) -> None:
    for key, hf_key in MODEL_KEY_MAP.items():
        if hf_key not in hf or hf_key not in ours or ours[hf_key] == hf[hf_key]:
            continue
        set_here = getattr(model, key, None) is not None
        field = f"model.{key}={ours[hf_key]}" if set_here else f"model.model_config's {hf_key}={ours[hf_key]}"
        raise ConfigError(f"{PRETRAINED_KEY}: {field} disagrees with {path}/config.json ({hf_key}={hf[hf_key]}); remove the "
                          f"key from the model section (the folder's config.json is the model's) or fix it")

