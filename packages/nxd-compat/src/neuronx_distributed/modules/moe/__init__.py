"""``neuronx_distributed.modules.moe``: mixture of experts, provided by the nxd-moe plugin."""

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe", "nxd-moe")
