"""``neuronx_distributed.modules.moe.routing``: nxd-moe's routers."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.routing", "nxd-moe")

from nxd_moe import RouterSinkhorn, RouterTopK  # noqa: E402

__all__ = ["RouterSinkhorn", "RouterTopK"]
