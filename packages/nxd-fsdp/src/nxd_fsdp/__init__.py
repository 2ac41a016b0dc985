"""nxd-fsdp: FSDP2 (``torch.distributed.fsdp.fully_shard``) as an nxd data-parallel strategy, on a
DeviceMesh taken from nxd's parallel context. See docs/fsdp.md."""

from nxd_fsdp.config import FsdpConfig, check_fsdp, refusals, resolve_fsdp_config
from nxd_fsdp.mesh import fsdp_mesh
from nxd_fsdp.model import FSDPModel
from nxd_fsdp.optimizer import FSDPOptimizer
from nxd_fsdp.shard import shard_model, sharded_state_dict
from nxd_fsdp.strategy import fsdp_settings, make_optimizer, shard

__all__ = ["FSDPModel", "FSDPOptimizer", "FsdpConfig", "check_fsdp", "fsdp_mesh", "fsdp_settings", "make_optimizer",
           "refusals", "resolve_fsdp_config", "shard", "shard_model", "sharded_state_dict"]
