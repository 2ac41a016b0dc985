"""FP8 training through torchao's float8 training, as the nxd model transform ``fp8``.

Turn it on with ``nxd.neuronx_distributed_config(model_transforms={"fp8": {"recipe": "rowwise"}})``
or, in ``nxd train``'s YAML, ``precision.type: fp8`` (options under ``precision.fp8``); docs/fp8.md.
"""

from nxd import quiet_imports
from nxd_fp8.options import DEFAULT_SKIPPED, NAME, RECIPES, Fp8Options, parse_options
from nxd_fp8.support import fp8_refusal
from nxd_fp8.transform import FP8_TRANSFORM, check_device, options_of

# runs before any nxd_fp8 module (layers, convert) imports torchao: its load noise is not the user's business
quiet_imports.install()

__all__ = ["DEFAULT_SKIPPED", "FP8_TRANSFORM", "NAME", "RECIPES", "Fp8Options", "check_device", "fp8_refusal",
           "options_of", "parse_options"]


def __getattr__(name: str):  # the conversion imports torchao (seconds): only when asked for
    if name in ("convert_to_fp8", "Fp8Report"):
        from nxd_fp8 import convert

        return getattr(convert, name)
    raise AttributeError(name)
