"""The ``nxd`` command: its verbs come from plugins through ``nxd_register_commands``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nxd import __version__, quiet_imports, warning_lines
from nxd.catalog import CATALOG
from nxd.errors import ConfigError, NxdError
from nxd.plugins import state


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The ``nxd`` parser; with ``verb`` (the command being run) only that verb's own arguments are
    added (every verb is still listed), so running one verb never calls the other plugins."""
    parser = argparse.ArgumentParser(prog="nxd", description="nxd: hardware-neutral distributed training for PyTorch LLMs")
    parser.add_argument("--version", action="version", version=f"nxd {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    components = state().components
    missing = sorted(set(CATALOG["command"]) - set(components.names("command")))
    for component in components.all("command"):
        sub = verbs.add_parser(component.name, help=component.obj.help, description=component.obj.help)
        if verb is None or component.name == verb:
            component.obj.add_arguments(sub)
        sub.set_defaults(_run=component.obj.run)
    if missing:
        parser.epilog = "more verbs from plugins not installed: " + ", ".join(
            f"{verb} ({CATALOG['command'][verb]})" for verb in missing
        )
    return parser


def take_trailing_flags(args: argparse.Namespace, switches: Iterable[str] = (),
                        valued: Mapping[str, Callable[[str], Any]] | None = None) -> None:
    """A verb's flags may follow its overrides (``nxd train cfg.yaml a.b=1 --validate``), which
    argparse's REMAINDER keeps as overrides: each switch found there sets its attribute True, each
    valued flag (``--x v`` or ``--x=v``) its value parsed by ``valued[flag]``; the rest stay
    ``args.overrides``."""
    valued = valued or {}
    rest, items = [], list(args.overrides)
    while items:
        item = items.pop(0)
        name, eq, value = item.partition("=")
        if item in switches:
            setattr(args, item[2:].replace("-", "_"), True)
        elif name in valued:
            raw = value if eq else (items.pop(0) if items else None)
            if raw is None:
                raise ConfigError(f"{name} needs a value")
            try:
                setattr(args, name[2:].replace("-", "_"), valued[name](raw))
            except ValueError:
                raise ConfigError(f"{name}: not a number: {raw!r}") from None
        else:
            rest.append(item)
    args.overrides = rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warning_lines.install()
    quiet_imports.install()
    verb = argv[0] if argv and not argv[0].startswith("-") else None
    try:
        parser = build_parser(verb)
        if verb in CATALOG["command"] and verb not in state().components.names("command"):
            parser.exit(2, f"nxd: '{verb}' is provided by a plugin that is not installed: pip install "
                           f"{CATALOG['command'][verb]}\n")
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        return int(args._run(args) or 0)
    except NxdError as exc:  # nxd's own errors say what is wrong; a traceback would bury it
        print(f"nxd: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling (still importing, validating)
        print("nxd: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
