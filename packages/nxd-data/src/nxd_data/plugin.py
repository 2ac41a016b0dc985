"""nxd plugin entry point for nxd-data: registers this package's components with the core."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_data_modules(registry: Any) -> None:
    from nxd_data.factories import indexed, sft
    from nxd_data.hf_module import hf
    from nxd_data.preference_module import preference

    registry.add("indexed", indexed, description="Megatron indexed (.bin/.idx) pretraining data: blends, splits")
    registry.add("sft", sft, description="JSONL prompt/completion or chat SFT data, packed or padded")
    registry.add("preference", preference, description="prompt/chosen/rejected pairs for DPO/ORPO (JSONL or saved HF dataset)")
    registry.add("hf", hf, description="Hugging Face dataset saved with save_to_disk: token ids or text (needs nxd-data[hf])")


@nxd.hookimpl
def nxd_register_commands(registry: Any) -> None:
    from nxd_data.cli import DATA_COMMAND

    registry.add("data", DATA_COMMAND)
