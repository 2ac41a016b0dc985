"""Migration from Neuron NeMo-Megatron (NNM), NeMo and NxD: configs and checkpoints.

* :func:`migrate_config` / ``nxd migrate config in.yaml -o out.yaml``;
* the ``nnm`` checkpoint converter: ``nxd ckpt convert --from nnm`` = ``nxd migrate checkpoint``.
"""

from __future__ import annotations

from nxd_migrate.config import MigrationReport, migrate_config, schema_accepts

__all__ = ["MigrationReport", "migrate_config", "schema_accepts"]
