"""The ``nxd`` command: its verbs come from plugins through ``nxd_register_commands``."""

from __future__ import annotations

import argparse
import sys

from nxd import __version__, warning_lines
from nxd.catalog import CATALOG
from nxd.errors import NxdError
from nxd.plugins import state


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The ``nxd`` parser; with ``verb`` (the command being run) only that verb's own arguments are
    added (every verb is still listed), so running one verb never calls the other plugins."""
    parser = argparse.ArgumentParser(prog="nxd", description="nxd: hardware-neutral distributed training for PyTorch LLMs")
    parser.add_argument("--version", action="version", version=f"nxd {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    components = state().components
    for component in components.all("command"):
        sub = verbs.add_parser(component.name, help=component.obj.help, description=component.obj.help)
        if verb is None or component.name == verb:
            component.obj.add_arguments(sub)
        sub.set_defaults(_run=component.obj.run)
    missing = sorted(set(CATALOG["command"]) - set(components.names("command")))
    if missing:
        parser.epilog = "more verbs from plugins not installed: " + ", ".join(
            f"{verb} ({CATALOG['command'][verb]})" for verb in missing
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warning_lines.install()
    try:
        return _main(argv)
    except NxdError as exc:  # nxd's own errors say what is wrong; a traceback would bury it
        print(f"nxd: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command's own handling (still importing, validating)
        print("nxd: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    if argv and not argv[0].startswith("-") and argv[0] in CATALOG["command"] and argv[0] not in state().components.names("command"):
        parser.exit(2, f"nxd: '{argv[0]}' is provided by a plugin that is not installed: pip install {CATALOG['command'][argv[0]]}\n")
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
