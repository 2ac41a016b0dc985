"""``neuronx_distributed.modules.moe``: NxD's MoE API (``MoE``, ``RouterTopK``, ``RouterSinkhorn``,
``ExpertMLPs``, ``SharedExperts``, ``load_balancing_loss_func``, ``ACT2FN``) with NxD's constructor
arguments, on nxd-moe. The package exports what NxD's ``__init__`` exports."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe", "nxd-moe")

from .expert_mlps import ExpertMLPs  # noqa: E402
from .loss_function import load_balancing_loss_func  # noqa: E402
from .model import MoE  # noqa: E402
from .model_utils import ACT2FN  # noqa: E402
from .routing import RouterSinkhorn, RouterTopK  # noqa: E402

__all__ = ["ACT2FN", "ExpertMLPs", "MoE", "RouterSinkhorn", "RouterTopK", "load_balancing_loss_func"]
