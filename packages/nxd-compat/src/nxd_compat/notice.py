"""The one-time notice that ``neuronx_distributed`` is nxd, and the check for a real NxD install."""

from __future__ import annotations

import importlib.metadata
import os
import warnings

#: Distributions that ship AWS's own ``neuronx_distributed`` package.
REAL_NXD_DISTRIBUTIONS = ("neuronx-distributed", "neuronx_distributed")
QUIET_ENV = "NXD_COMPAT_QUIET"

_announced = False


class NxdCompatWarning(UserWarning):
    """``neuronx_distributed`` resolved to nxd (nxd-compat)."""


def real_nxd_version() -> str | None:
    """The version of an installed AWS ``neuronx-distributed`` distribution, if any."""
    for name in REAL_NXD_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def announce() -> None:
    """Warn once per process. A real neuronx-distributed next to nxd-compat is always reported: both
    install the same ``neuronx_distributed`` directory, so whichever was installed last wins."""
    global _announced
    if _announced:
        return
    _announced = True
    real = real_nxd_version()
    if real is not None:
        warnings.warn(
            f"neuronx-distributed {real} is installed next to nxd-compat; both provide the import name "
            "'neuronx_distributed' and this process is using nxd-compat's (nxd). Uninstall one of them "
            "(pip uninstall nxd-compat to use AWS's NxD on Neuron).",
            NxdCompatWarning, stacklevel=3,
        )
        return
    if os.environ.get(QUIET_ENV) != "1":
        warnings.warn(
            "neuronx_distributed is provided by nxd-compat: NxD's API on nxd (torch.distributed: gloo/NCCL/XLA). "
            f"Set {QUIET_ENV}=1 to silence this notice.",
            NxdCompatWarning, stacklevel=3,
        )
