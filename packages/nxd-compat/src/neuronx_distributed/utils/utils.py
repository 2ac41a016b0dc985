"""``neuronx_distributed.utils.utils``: NxD's hardware enum (nxd runs on any; Neuron types are names only)."""

from enum import Enum, auto


class hardware(Enum):  # noqa: N801 - NxD's name
    TRN1 = "trn1"
    TRN2 = "trn2"
    TRN3 = "trn3"
    CUSTOM = auto()

    @classmethod
    def _missing_(cls, value: object) -> "hardware":
        return cls.CUSTOM


def get_platform_target() -> str:
    """NxD reads the Neuron platform; nxd is not on one unless torch-neuronx says so."""
    return "custom"
