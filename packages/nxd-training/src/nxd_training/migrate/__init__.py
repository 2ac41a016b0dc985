"""Migration from Neuron NeMo-Megatron (NNM), NeMo and NxD: configs and checkpoints.

* :func:`migrate_config` / ``nxd migrate config in.yaml -o out.yaml``;
* ``nxd ckpt convert --from nnm`` (registered with nxd-ckpt) and ``nxd migrate checkpoint``.
"""

from __future__ import annotations

from typing import Any

from nxd_training.migrate.config import MigrationReport, migrate_config, schema_accepts


def register_nnm_source() -> None:
    """Make ``nxd ckpt convert --from nnm`` available (nxd-ckpt's public registry)."""
    from nxd_ckpt import register_convert_source
    from nxd_training.migrate.nnm_checkpoint import read_nnm

    register_convert_source("nnm", read_nnm)


def register_commands(registry: Any) -> None:
    """Called from nxd-training's ``nxd_register_commands`` hook: the ``migrate`` verb, and the
    ``nnm`` source of ``nxd ckpt convert``."""
    from nxd_training.migrate.cli import MIGRATE

    registry.add("migrate", MIGRATE)
    register_nnm_source()


__all__ = ["MigrationReport", "migrate_config", "register_commands", "register_nnm_source", "schema_accepts"]
