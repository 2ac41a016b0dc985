"""Checkpoint file formats (plugins registered with ``nxd_register_checkpoint_formats``).

A format writes one object to a binary file object and reads it back. Loading never executes
code from the file: torch files go through ``torch.load(weights_only=True)`` and safetensors
holds raw tensors only.
"""

from __future__ import annotations

import pickle
from typing import Any, BinaryIO, Protocol

import torch

from nxd_ckpt.errors import CorruptCheckpointError


class CheckpointFormat(Protocol):
    """What a format plugin provides."""

    name: str
    #: file name suffix, including the dot
    suffix: str
    #: True if the format can hold any nested state (optimizer, scheduler), not only name -> tensor
    nested: bool

    def dump(self, obj: Any, f: BinaryIO) -> None: ...

    def load(self, f: BinaryIO, source: str) -> Any: ...


class TorchFormat:
    """``torch.save`` files, loaded with ``weights_only=True`` (no arbitrary pickles)."""

    name = "torch"
    suffix = ".pt"
    nested = True

    def dump(self, obj: Any, f: BinaryIO) -> None:
        torch.save(obj, f)

    def load(self, f: BinaryIO, source: str) -> Any:
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CorruptCheckpointError(
                f"{source}: refused to load: the file holds pickled objects or code that safe loading "
                f"(torch.load weights_only=True) does not allow ({_first_line(exc)})"
            ) from exc
        except (RuntimeError, EOFError, ValueError, OSError, KeyError) as exc:
            raise CorruptCheckpointError(f"{source}: truncated or corrupted torch file ({_first_line(exc)})") from exc


class SafetensorsFormat:
    """safetensors files: a flat ``name -> tensor`` dict (model shards)."""

    name = "safetensors"
    suffix = ".safetensors"
    nested = False

    def dump(self, obj: Any, f: BinaryIO) -> None:
        from safetensors.torch import save

        bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)] if isinstance(obj, dict) else ["<root>"]
        if bad:
            raise TypeError(f"the safetensors format holds name -> tensor dicts only; {bad[0]!r} is not a tensor")
        f.write(save({k: v.contiguous() for k, v in obj.items()}))

    def load(self, f: BinaryIO, source: str) -> Any:
        from safetensors.torch import load

        try:
            return load(f.read())
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise CorruptCheckpointError(f"{source}: truncated or corrupted safetensors file ({_first_line(exc)})") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


BUILTIN_FORMATS: dict[str, CheckpointFormat] = {"torch": TorchFormat(), "safetensors": SafetensorsFormat()}


def get_format(name: str) -> CheckpointFormat:
    """The format registered as ``name`` (built-ins work without plugin discovery)."""
    import nxd

    try:
        return nxd.get_checkpoint_format(name)
    except nxd.ComponentNotFound:
        if name in BUILTIN_FORMATS:
            return BUILTIN_FORMATS[name]
        raise


def format_for_file(filename: str) -> CheckpointFormat:
    """Pick the built-in format from a file name suffix (NxD checkpoints have no metadata)."""
    for fmt in BUILTIN_FORMATS.values():
        if filename.endswith(fmt.suffix):
            return fmt
    return BUILTIN_FORMATS["torch"]
