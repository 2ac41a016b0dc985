"""nxd plugin entry point for nxd-moe: a library for model plugins (it registers no component); it
checks the parts of ``neuronx_distributed_config`` expert parallelism cannot honour yet."""

from __future__ import annotations

import nxd
from nxd.errors import ConfigError

NXD_PLUGIN_API = (1, 1)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_validate_config(nxd_config: dict) -> None:
    ep = nxd_config.get("expert_parallel_size", 1)
    if ep > 1 and nxd_config.get("optimizer_config", {}).get("zero_one_enabled"):
        raise ConfigError(f"expert_parallel_size={ep} with ZeRO-1 (optimizer_config.zero_one_enabled / "
                          "distributed_strategy.zero1) is not supported yet: ZeRO-1 shards every parameter over the "
                          "whole data-parallel group, but experts differ between EP ranks; turn ZeRO-1 off or use "
                          "expert_parallel_size=1")
