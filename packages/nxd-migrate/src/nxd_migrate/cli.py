"""``nxd migrate config`` and ``nxd migrate checkpoint``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from nxd import Command, ConfigError

#: exit code when some keys could not be carried over (the output is still written)
EXIT_UNSUPPORTED = 3


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="migrate_verb", metavar="VERB", required=True)
    cfg = verbs.add_parser("config", help="convert a Neuron NeMo-Megatron or NeMo YAML into nxd's YAML")
    cfg.add_argument("input", help="NNM / NeMo config YAML")
    cfg.add_argument("-o", "--output", required=True, help="nxd config YAML to write")
    cfg.add_argument("--from", dest="source", default="auto", choices=["auto", "nnm", "nemo", "nxd"])
    cfg.add_argument("--allow-unsupported", action="store_true",
                     help=f"exit 0 even when keys were not carried over (default: exit {EXIT_UNSUPPORTED})")
    ck = verbs.add_parser("checkpoint", help="convert an NNM checkpoint (tp_rank_XX_pp_rank_XXX/model_optim_rng.ckpt) "
                                             "into an nxd checkpoint (same as nxd ckpt convert --from nnm --to nxd)")
    ck.add_argument("--from", dest="source", default="nnm", choices=["nnm"])
    ck.add_argument("--input", required=True, help="NNM checkpoint directory (holding tp_rank_* folders)")
    ck.add_argument("--output", required=True, help="nxd checkpoint directory to write")
    ck.add_argument("--tag", default="converted", help="checkpoint tag to write (default: converted)")
    ck.add_argument("--config", help="model config.json (HF keys), or an NNM YAML whose model section is used")
    ck.add_argument("--allow-pickle", action="store_true",
                    help="load NNM files that hold pickled objects (NeMo configs): only for files you trust")


def _header(report) -> str:
    lines = ["# converted by `nxd migrate config` from a " + report.source_kind.upper() + " config"]
    if report.unsupported:
        lines.append("# NOT carried over (unsupported; see docs/migration.md):")
        lines += [f"#   {k}: {v!r}" for k, v, _ in report.unsupported]
    return "\n".join(lines) + "\n"


def _config(args: argparse.Namespace) -> int:
    from nxd_migrate.config import migrate_config
    from nxd_training.config import read_yaml

    raw = read_yaml(args.input)
    out, report = migrate_config(raw, args.source)
    Path(args.output).write_text(_header(report) + yaml.safe_dump(out, sort_keys=False))
    print(report.format())
    print(f"wrote {args.output}")
    if report.unsupported and not args.allow_unsupported:
        print(f"nxd migrate config: {len(report.unsupported)} unsupported keys (listed above; exit {EXIT_UNSUPPORTED}, "
              "--allow-unsupported to accept)", file=sys.stderr)
        return EXIT_UNSUPPORTED
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    """``nxd ckpt convert --from nnm --to nxd`` under the migration verb: one implementation."""
    from nxd_ckpt import run_convert

    run_convert("nnm", "nxd", args.input, args.output, tag=args.tag, config_path=args.config,
                allow_pickle=args.allow_pickle)
    return 0


def _run(args: argparse.Namespace) -> int:
    from nxd_ckpt import CheckpointError

    try:
        return {"config": _config, "checkpoint": _checkpoint}[args.migrate_verb](args)
    except (ConfigError, CheckpointError, OSError, ValueError) as exc:
        print(f"nxd migrate {args.migrate_verb}: error: {exc}", file=sys.stderr)
        return 1


MIGRATE = Command(help="migrate Neuron NeMo-Megatron / NeMo configs and checkpoints to nxd", add_arguments=_add_arguments,
                  run=_run)
