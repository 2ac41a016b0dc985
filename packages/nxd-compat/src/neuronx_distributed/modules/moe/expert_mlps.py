"""``neuronx_distributed.modules.moe.expert_mlps`` (ExpertMLPs): from the nxd-moe plugin."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.expert_mlps", "nxd-moe")

from nxd_moe import *  # noqa: E402, F403
