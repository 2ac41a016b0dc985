"""``neuronx_distributed.scripts.checkpoint_converter``: NxD's HF <-> NxD checkpoint converter.

nxd's converters are the ``nxd ckpt convert`` command (nxd-ckpt) and the model plugins' Hugging Face
import/export; this class says so instead of writing a layout nxd would not read.
"""

from typing import Any


class CheckpointConverterBase:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "neuronx_distributed.scripts.checkpoint_converter.CheckpointConverterBase is not provided by nxd-compat: "
            "convert with `nxd ckpt convert --from <format> --to nxd ...`, or load Hugging Face weights through "
            "the model plugin (e.g. nxd-models-llama)"
        )
