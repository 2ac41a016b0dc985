"""``neuronx_distributed.modules.moe``: NxD's MoE API (``MoE``, ``RouterTopK``, ``RouterSinkhorn``,
``ExpertMLPs``, ``load_balancing_loss_func``) with NxD's constructor arguments, on nxd-moe."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe", "nxd-moe")
