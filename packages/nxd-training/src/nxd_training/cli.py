"""The ``nxd train`` and ``nxd plot`` verbs (registered through ``nxd_register_commands``)."""

from __future__ import annotations

import argparse
import sys

from nxd import Command, ComponentNotFound, ConfigError


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file, or hub:<name> for a shipped config (e.g. hub:quickstart)")
    # REMAINDER so flags may follow the overrides (nxd train cfg.yaml a.b=1 --validate)
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="dotted.key=value overrides, e.g. trainer.max_steps=50")
    parser.add_argument("--validate", action="store_true", help="validate the config and print the plan; do not train")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML")


def _require_rendezvous(config) -> None:
    tr = config.trainer
    if tr.num_nodes > 1 and not config.launcher.rdzv_endpoint:
        raise ConfigError(f"trainer.num_nodes={tr.num_nodes}: set launcher.rdzv_endpoint (host:port reachable from every "
                          "node) so the nodes can find each other, or run under SLURM (srun) or a torchrun-style "
                          "environment (MASTER_ADDR/MASTER_PORT, e.g. a Kubernetes PyTorchJob) that says it; "
                          "see docs/cluster.md")


def _run_train(args: argparse.Namespace) -> int:
    from nxd_training.cluster import apply_cluster
    from nxd_training.config.loader import dump_config, load_config
    from nxd_training.config.plan import make_plan
    from nxd_training.data_prep import prepare_data
    from nxd_training.exp_manager import resolve_log_dir
    from nxd_training.launcher import launch
    from nxd_training.preflight import preflight

    for flag in ("--validate", "--print-config"):
        if flag in args.overrides:
            args.overrides = [o for o in args.overrides if o != flag]
            setattr(args, flag[2:].replace("-", "_"), True)
    try:
        config, cluster_note = apply_cluster(prepare_data(load_config(args.config, args.overrides, check=False)))
        plan = make_plan(config)
        preflight(config, resolve_log_dir(config), plan)
        if not args.validate:
            _require_rendezvous(config)  # a multi-node run needs one before anything starts; validation does not
    except (ConfigError, ComponentNotFound) as exc:
        print(f"nxd train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(config))
    print(f"nxd train: {config.name}: world size {plan.world_size} = TP {plan.tp} x PP {plan.pp} x DP {plan.dp}, "
          f"{plan.num_microbatches} micro-batch(es) per step, seq length {plan.seq_length}, data module {plan.data_module!r}")
    if cluster_note:
        print(f"nxd train: {cluster_note}")
    if args.validate:
        print("config is valid")
        return 0
    return launch(config, resolve_log_dir(config))  # says "writing to" once the run directory is its own


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
