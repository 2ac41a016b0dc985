"""``neuronx_distributed.modules.moe.model``: NxD's ``MoE`` name for nxd-moe's ``MoELayer`` (its
constructor takes nxd-moe's arguments; see docs/migration.md)."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.model", "nxd-moe")

from nxd_moe import MoELayer as MoE  # noqa: E402

__all__ = ["MoE"]
