"""nxd plugin entry point for nxd-models-gpt: registers the ``gpt`` model spec and the ``megatron``
checkpoint converter."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_models(registry: Any) -> None:
    from nxd_models_gpt.spec import SPEC

    registry.add("gpt", SPEC, presets=sorted(SPEC.presets))


@nxd.hookimpl
def nxd_register_checkpoint_converters(registry: Any) -> None:
    """``nxd ckpt convert --from megatron`` / ``--to megatron`` (when nxd-ckpt is installed)."""
    try:
        from nxd_ckpt import Converter
    except ImportError:  # nxd-ckpt is optional: without it there is no `nxd ckpt` to convert with
        return
    from nxd_models_gpt.convert import read_megatron, write_megatron

    registry.add("megatron", Converter(read=read_megatron, write=write_megatron,
                                       help="Megatron-LM / NeMo mp_rank_XX[_YYY]/model_optim_rng.pt (GPT family)"))
