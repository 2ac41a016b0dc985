"""``neuronx_distributed.modules.moe.loss_function`` (load_balancing_loss_func): from the nxd-moe plugin."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.loss_function", "nxd-moe")

from nxd_moe import *  # noqa: E402, F403
