"""nxd plugin entry point for nxd-migrate: the ``migrate`` verb and the ``nnm`` checkpoint converter."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_commands(registry: Any) -> None:
    from nxd_migrate.cli import MIGRATE

    registry.add("migrate", MIGRATE)


@nxd.hookimpl
def nxd_register_checkpoint_converters(registry: Any) -> None:
    from nxd_ckpt import Converter
    from nxd_migrate.nnm_checkpoint import model_config_from_file, read_nnm

    registry.add("nnm", Converter(read=read_nnm, config_from_file=model_config_from_file,
                                  help="Neuron NeMo-Megatron tp_rank_XX_pp_rank_XXX/model_optim_rng.ckpt (read only)"))
