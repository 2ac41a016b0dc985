"""Checkpoint file formats (plugins registered with ``nxd_register_checkpoint_formats``).

A format writes one object to a binary file object and reads it back. Loading never executes
code from the file: torch files go through ``torch.load(weights_only=True)`` and safetensors
holds raw tensors only.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import struct
import threading
from collections.abc import Iterator
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


_zip_crc_lock = threading.Lock()


@contextlib.contextmanager
def _torch_zip_crc(enabled: bool) -> Iterator[None]:
    """torch.save's ``compute_crc32`` switch is process-wide; a torch.save in another thread
    during a checkpoint write also skips the zip CRC (torch.load still reads such files)."""
    from torch.utils.serialization import config

    with _zip_crc_lock:
        previous = config.save.compute_crc32
        config.save.compute_crc32 = enabled
        try:
            yield
        finally:
            config.save.compute_crc32 = previous


class TorchFormat:
    """``torch.save`` files, loaded with ``weights_only=True`` (no arbitrary pickles)."""

    name = "torch"
    suffix = ".pt"
    nested = True

    def dump(self, obj: Any, f: BinaryIO) -> None:
        # torch's own zip CRC-32 was the whole CPU cost of torch.save (1.5 GB/s vs 29 GB/s without);
        # the writer checksums every byte of the file already. torch.load does not need it.
        with _torch_zip_crc(False):
            torch.save(obj, f)

    def load(self, f: BinaryIO, source: str) -> Any:
        head = f.read(4)
        f.seek(0)
        # torch.save writes a zip archive (legacy files: a pickle, protocol byte 0x80); anything
        # else is not a torch file at all, whatever the unpickler would say about it
        if head[:4] != b"PK\x03\x04" and head[:1] != b"\x80":
            what = "is empty" if not head else f"does not start like a torch file (first bytes {head.hex()})"
            raise CorruptCheckpointError(f"{source}: corrupted or not a torch checkpoint file: it {what}")
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            if "weights only" not in str(exc).lower():
                raise CorruptCheckpointError(f"{source}: truncated or corrupted torch file ({_first_line(exc)})") from exc
            raise CorruptCheckpointError(
                f"{source}: refused to load: the file holds pickled objects or code that safe loading "
                f"(torch.load weights_only=True) does not allow ({_first_line(exc)})"
            ) from exc
        except (RuntimeError, EOFError, ValueError, OSError, KeyError) as exc:
            raise CorruptCheckpointError(f"{source}: truncated or corrupted torch file ({_first_line(exc)})") from exc


#: safetensors' dtype names
_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def _raw_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of CPU tensor ``t`` without copying them (a copy only if ``t`` is not contiguous)."""
    if not t.is_contiguous():
        t = t.contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class SafetensorsFormat:
    """safetensors files: a flat ``name -> tensor`` dict (model shards).

    Written by streaming: the header, then each tensor's bytes straight from its storage (no
    ``safetensors.save`` to an in-memory copy of the whole file), in the order and alignment
    safetensors itself uses, so any safetensors reader loads the file.
    """

    name = "safetensors"
    suffix = ".safetensors"
    nested = False

    def dump(self, obj: Any, f: BinaryIO) -> None:
        bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)] if isinstance(obj, dict) else ["<root>"]
        if bad:
            raise TypeError(f"the safetensors format holds name -> tensor dicts only; {bad[0]!r} is not a tensor")
        unsupported = [k for k, v in obj.items() if v.dtype not in _ST_DTYPES]
        if unsupported:
            raise TypeError(f"the safetensors format cannot hold {obj[unsupported[0]].dtype} ({unsupported[0]!r})")
        # safetensors' order: larger alignment first, then by name
        names = sorted(obj, key=lambda k: (-obj[k].element_size(), k))
        header: dict[str, Any] = {}
        offset = 0
        for name in names:
            t = obj[name]
            size = t.numel() * t.element_size()
            header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            t = obj[name].detach()
            if t.device.type != "cpu":
                t = t.to("cpu")
            f.write(_raw_bytes(t))

    def load(self, f: BinaryIO, source: str) -> Any:
        from safetensors.torch import load

        try:
            return dict(load(f.read()))
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
