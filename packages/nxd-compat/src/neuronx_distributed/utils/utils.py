"""``neuronx_distributed.utils.utils``: NxD's hardware and HLO-metadata enums (nxd runs on any hardware;
Neuron types are names only) and its JSON reader."""

import json
import os
from enum import Enum, auto
from typing import Any


class hardware(Enum):  # noqa: N801 - NxD's name
    TRN1 = "trn1"
    TRN2 = "trn2"
    TRN3 = "trn3"
    CUSTOM = auto()

    @classmethod
    def _missing_(cls, value: object) -> "hardware | None":
        """NxD's aliases; nxd's own platform (``get_platform_target()``: "custom") and NxD's
        NEURON_PLATFORM_TARGET_OVERRIDE are CUSTOM; anything else is a ValueError as in NxD."""
        aliases = {"trn1": cls.TRN1, "trn1n": cls.TRN1, "inf2": cls.TRN1, "trn2": cls.TRN2, "trn3": cls.TRN3}
        if value in aliases:
            return aliases[value]
        if value in (get_platform_target(), os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")):
            return cls.CUSTOM
        return None


class HloMetadataLevel(Enum):
    """NxD's HLO metadata levels (its tracing; nxd does not trace, the names resolve as NxD's)."""

    DEBUG = "debug"
    INFO = "info"
    NONE = "none"

    @classmethod
    def _missing_(cls, value: object) -> "HloMetadataLevel | None":
        if value is True:  # NxD's older boolean debug flag
            return cls.DEBUG
        if value is False:
            return cls.INFO
        return None


def get_dict_from_json(json_file: str | os.PathLike) -> dict[Any, Any]:
    """NxD's: the JSON file's content; a ValueError naming the file when it is missing or not JSON."""
    try:
        with open(json_file, encoding="utf-8") as opened_file:
            return json.loads(opened_file.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"Failed to parse JSON file '{json_file}': {e}") from e
    except FileNotFoundError as e:
        raise ValueError(f"JSON file not found at '{json_file}': {e}") from e


def get_platform_target() -> str:
    """NxD reads the Neuron platform; nxd is not on one unless torch-neuronx says so."""
    return "custom"
