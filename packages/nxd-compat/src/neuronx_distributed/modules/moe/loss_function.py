"""``neuronx_distributed.modules.moe.loss_function``: NxD's ``load_balancing_loss_func`` name for
nxd-moe's ``load_balancing_loss``."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.loss_function", "nxd-moe")

from nxd_moe import load_balancing_loss as load_balancing_loss_func  # noqa: E402

__all__ = ["load_balancing_loss_func"]
