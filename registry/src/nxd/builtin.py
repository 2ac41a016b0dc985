"""The core's own plugin: the ``nxd plugins`` command."""

from __future__ import annotations

import argparse
import json

from nxd.components import Command
from nxd.hookspecs import hookimpl


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _run(args: argparse.Namespace) -> int:
    from nxd.plugins import plugin_infos
    from nxd.transforms import SLOTS, recipe

    _probe_optional_hooks()
    infos = list(plugin_infos())
    steps = recipe()
    if args.json:
        print(json.dumps({"plugins": [info.__dict__ for info in infos], "slots": list(SLOTS), "recipe": steps}, indent=2,
                         default=str))
        return 0
    for info in infos:
        line = f"{info.name:<16} {info.distribution} {info.version}  [{info.status}]"
        if info.reason:
            line += f"  {info.reason}"
        print(line)
        for kind, names in info.components.items():
            print(f"    {kind}: {', '.join(names)}")
    print("recipe: the slots model transforms run in, in order, each transform when its condition holds "
          "(nxd train --validate prints what runs for a config)")
    for slot in SLOTS:
        mine = [s for s in steps if s["slot"].split(":", 1)[-1] == slot]
        if not mine:
            print(f"    {slot:<26} -")
        for step in mine:
            print(f"    {step['slot']:<26} {step['name']:<26} {step['distribution']:<20} when {step['applies']}")
    return 0


def _probe_optional_hooks() -> None:
    """Run every plugin's ``nxd_validate_config`` on nxd's default config, so a validator that
    crashes shows as ``failing`` here, not first in the middle of a launch."""
    import warnings

    from nxd.config import neuronx_distributed_config
    from nxd.errors import NxdError
    from nxd.plugins import PluginWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)  # the listing below shows it
        try:
            neuronx_distributed_config()
        except NxdError:
            pass  # a refusal of the defaults (a plugin missing for them) is not a plugin's failure


@hookimpl
def nxd_register_commands(registry) -> None:
    registry.add("plugins", Command(help="list installed nxd plugins and what each registers", add_arguments=_add_arguments, run=_run))
