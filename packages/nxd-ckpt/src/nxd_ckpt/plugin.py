"""nxd plugin entry point for nxd-ckpt: registers the checkpointer, formats, storages and the
``nxd ckpt`` command with the core."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_checkpointers(registry: Any) -> None:
    from nxd_ckpt.checkpointer import Checkpointer

    registry.add("default", Checkpointer())


@nxd.hookimpl
def nxd_register_checkpoint_formats(registry: Any) -> None:
    from nxd_ckpt.formats import SafetensorsFormat, TorchFormat

    registry.add("torch", TorchFormat())
    registry.add("safetensors", SafetensorsFormat())


@nxd.hookimpl
def nxd_register_storages(registry: Any) -> None:
    from nxd_ckpt.storage import FsspecStorage, LocalStorage

    registry.add("file", LocalStorage)
    registry.add("s3", FsspecStorage)
    registry.add("memory", FsspecStorage)


@nxd.hookimpl
def nxd_register_checkpoint_converters(registry: Any) -> None:
    from nxd_ckpt.convert import BUILTIN_CONVERTERS

    for name, converter in BUILTIN_CONVERTERS.items():
        registry.add(name, converter)


@nxd.hookimpl
def nxd_register_commands(registry: Any) -> None:
    from nxd_ckpt.cli import CKPT_COMMAND

    registry.add("ckpt", CKPT_COMMAND)
