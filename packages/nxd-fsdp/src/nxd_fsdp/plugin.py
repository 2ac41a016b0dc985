"""nxd plugin entry point for nxd-fsdp."""

from __future__ import annotations

import nxd

NXD_PLUGIN_API = (1, 1)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_validate_config(nxd_config: dict) -> None:
    from nxd_fsdp.config import check_fsdp, resolve_fsdp_config
    from nxd_fsdp.strategy import CONFIG_KEY

    fsdp = resolve_fsdp_config(nxd_config.get(CONFIG_KEY))
    if fsdp is not None:
        check_fsdp(fsdp, data_parallel_size=None, expert_parallel_size=nxd_config.get("expert_parallel_size", 1),
                   context_parallel_size=nxd_config.get("context_parallel_size", 1),
                   zero1=bool(nxd_config.get("optimizer_config", {}).get("zero_one_enabled")))
