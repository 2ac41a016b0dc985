"""The ``nxd train`` and ``nxd plot`` verbs (registered through ``nxd_register_commands``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nxd.trainer
from nxd import Command, ComponentNotFound, ConfigError
from nxd.cli import take_trailing_flags
from nxd.transforms import format_recipe, recipe_for


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file, or hub:<name> for a shipped config (e.g. hub:quickstart)")
    # REMAINDER so flags may follow the overrides (nxd train cfg.yaml a.b=1 --validate)
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="dotted.key=value overrides, e.g. trainer.max_steps=50")
    parser.add_argument("--validate", action="store_true", help="validate the config and print the plan; do not train")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML (what every rank reads) and exit without training")
    parser.add_argument("--device-memory", type=float, default=None, metavar="GiB",
                        help="memory per device for the pre-launch plan (nxd-plan): a layout the plan proves cannot "
                             "fit is refused (default: the device's own memory when known; never checked on CPU)")


def _require_rendezvous(tr: Any, launcher: Any) -> None:
    """A multi-node run (``trainer.num_nodes``) needs ``launcher.rdzv_endpoint`` or a cluster that says it."""
    if tr.num_nodes > 1 and not launcher.rdzv_endpoint:
        raise ConfigError(f"trainer.num_nodes={tr.num_nodes}: set launcher.rdzv_endpoint (host:port reachable from every "
                          "node) so the nodes can find each other, or run under SLURM (srun) or a torchrun-style "
                          "environment (MASTER_ADDR/MASTER_PORT, e.g. a Kubernetes PyTorchJob) that says it; "
                          "see docs/cluster.md")


@dataclass
class PreparedRun:
    """What ``nxd train`` decided before starting anything: the one resolved config (``config.run``:
    its RunConfig, translated once; each rank reads it from config.yaml), the run directory."""

    config: Any  # nxd_training.config.TrainingConfig, resolved
    log_dir: Path
    cluster_note: str | None = None


def prepare_run(source: str, overrides: list[str]) -> PreparedRun:
    """Load, prepare data, apply the cluster's environment, resolve once and run the preflight
    checks: everything ``nxd train`` does before it launches (raises ConfigError)."""
    from nxd_training.cluster import apply_cluster
    from nxd_training.config.loader import load_config
    from nxd_training.config.plan import resolve_config
    from nxd_training.data_prep import prepare_data
    from nxd_training.exp_manager import resolve_log_dir
    from nxd_training.preflight import preflight

    sections, cluster_note = apply_cluster(prepare_data(load_config(source, overrides, check=False)))
    config = resolve_config(sections)  # the one resolution: validation, printing and every rank use it
    log_dir = resolve_log_dir(config)
    preflight(config, log_dir)
    return PreparedRun(config, log_dir, cluster_note)


def _run_train(args: argparse.Namespace) -> int:
    from nxd_training.config.loader import dump_config
    from nxd_training.launcher import launch, restart_note

    try:
        take_trailing_flags(args, ("--validate", "--print-config"), {"--device-memory": float})
        dry = args.validate or args.print_config
        run = prepare_run(args.config, args.overrides)
        if not dry:
            _require_rendezvous(run.config.trainer, run.config.launcher)  # a multi-node run needs one before anything starts; validation does not
    except (ConfigError, ComponentNotFound) as exc:
        print(f"nxd train: {exc}", file=sys.stderr)
        return 2
    config = run.config
    # with --print-config, stdout is the YAML alone (so `> run.yaml` is a config nxd train reads back)
    info = sys.stderr if args.print_config else sys.stdout
    if args.print_config:
        print(dump_config(config), end="")
    r = config.run.derived
    print(f"nxd train: {config.name}: model {r.architecture!r} ({r.architecture_reason}), "
          f"world size {r.world_size} = {layout(config.run, r.dp)}, "
          f"{r.num_microbatches} micro-batch(es) per step, seq length {r.seq_length}, "
          f"data module {r.data_module!r}", file=info)
    for note in r.notes:
        print(f"nxd train: note: {note}", file=info)
    if run.cluster_note:
        print(f"nxd train: {run.cluster_note}", file=info)
    restart = restart_note(config, run.log_dir)
    if restart:
        print(restart, file=info)
    try:
        summary = nxd.trainer.plan_run(config, args.device_memory)  # nxd-plan, when installed
    except ConfigError as exc:
        print(f"nxd train: {exc}", file=sys.stderr)
        return 2
    if summary:
        print(f"nxd train: {summary}", file=info)
    else:
        print(f"nxd train: {DRY_RUN_SKIPPED}", file=info)
    if args.validate:
        print("nxd train: recipe (the model transforms, in slot order; each rank runs those marked runs):", file=info)
        from nxd_training.config.resolved import model_spec_of

        print("\n".join(format_recipe(recipe_for(None, config.run, model_spec_of(config.run)))), file=info)
    if dry:
        print("config is valid" + ("; not training (--print-config)" if args.print_config else ""), file=info)
        return 0
    return launch(config, run.log_dir)  # says "writing to" once the run directory is its own


#: said when no planner ran: the config is checked, each rank's own build is not
DRY_RUN_SKIPPED = ("dry run skipped: no plugin planned the run (nxd-plan builds one rank of every role with the "
                   "ranks' own code on the meta device before launch; install it from packages/nxd-plan), so a "
                   "failure only a rank's build finds shows at launch")


def layout(run_config: Any, dp: int) -> str:
    """``TP 2 x PP 1 x DP 2`` (CP, EP when used): the sizes of the run's RunConfig, as printed."""
    sizes = run_config.sizes()
    parts = [f"TP {sizes['tp']}", f"PP {sizes['pp']}"] + [f"{d.upper()} {sizes[d]}" for d in ("cp",) if sizes[d] > 1]
    parts.append(f"DP {dp}" + (f" (EP {sizes['ep']})" if sizes["ep"] > 1 else ""))
    return " x ".join(parts)


def _plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories (holding metrics.jsonl)")
    parser.add_argument("-o", "--output", default="loss.png", help="PNG to write (default loss.png)")
    parser.add_argument("--metrics", default="loss,tokens_per_s", help="comma-separated metrics, one panel each")


def _run_plot(args: argparse.Namespace) -> int:
    from nxd_training.plot import plot_runs

    try:
        out = plot_runs(args.runs, args.output, [m for m in args.metrics.split(",") if m])
    except (FileNotFoundError, ValueError) as exc:
        print(f"nxd plot: {exc}", file=sys.stderr)
        return 2
    print(f"nxd plot: wrote {out}")
    return 0


TRAIN = Command(help="train a model from a YAML config (NxD Training schema)", add_arguments=_train_arguments, run=_run_train)
PLOT = Command(help="plot loss/throughput curves of runs to a PNG", add_arguments=_plot_arguments, run=_run_plot)
