"""Which devices run FP8 matmuls: refused before launch, with the reason, everywhere else."""

from __future__ import annotations

import torch

#: compute capability torch._scaled_mm needs: per-tensor scales from Ada/Hopper (8.9), per-row
#: scales (torchao's rowwise recipes, CUTLASS kernels) from Hopper (9.0)
TENSORWISE_CAPABILITY = (8, 9)
ROWWISE_CAPABILITY = (9, 0)


def default_device_type() -> str:
    """The device type this process trains on unless told: the current accelerator, else cpu."""
    if torch.accelerator.is_available():
        return torch.accelerator.current_accelerator().type
    return "cpu"


def fp8_refusal(device_type: str, recipe: str, emulate: bool) -> str | None:
    """Why FP8 training with ``recipe`` cannot run on ``device_type`` (``None``: it can)."""
    if emulate:
        return None  # torchao's emulation does the FP8 rounding in high precision on any device
    # the key as a user writes it: YAML first (nxd train), then the NxD API's transform option
    emulation = ("; to check the wiring without FP8 hardware set precision.fp8.emulate=true (NxD API: "
                 "model_transforms={'fp8': {'emulate': True}}; torchao's emulation: FP8 numerics in high "
                 "precision, no speed-up)")
    if device_type != "cuda":
        return (f"FP8 matmuls (torch._scaled_mm) need an NVIDIA GPU of compute capability >= 8.9 (Ada, Hopper "
                f"and later) and this run trains on {device_type!r}{emulation}")
    if not torch.cuda.is_available():
        return f"the run trains on cuda but this process sees no CUDA device{emulation}"
    if torch.version.hip:
        return (f"torchao's float8 training recipes target NVIDIA GPUs; this is a ROCm device "
                f"({torch.cuda.get_device_name()}){emulation}")
    need = ROWWISE_CAPABILITY if recipe.startswith("rowwise") else TENSORWISE_CAPABILITY
    have = torch.cuda.get_device_capability()
    if have < need:
        return (f"recipe {recipe!r} needs compute capability >= {need[0]}.{need[1]}, and "
                f"{torch.cuda.get_device_name()} has {have[0]}.{have[1]}{emulation}")
    return None
