"""``neuronx_distributed.modules.moe.expert_mlps``: nxd-moe's ``ExpertMLPs``."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.expert_mlps", "nxd-moe")

from nxd_moe import ExpertMLPs  # noqa: E402

__all__ = ["ExpertMLPs"]
