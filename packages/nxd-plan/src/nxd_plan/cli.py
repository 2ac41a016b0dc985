"""The ``nxd plan`` verb (registered through ``nxd_register_commands``)."""

from __future__ import annotations

import argparse
import json
import sys

from nxd import Command, ComponentNotFound, ConfigError
from nxd.cli import take_trailing_flags

#: flags that may also follow the overrides (nxd.cli.take_trailing_flags), with their value's parser
FLAGS_WITH_VALUE = {"--device-memory": float, "--peak-tflops": float, "--link-gbps": float, "--device": str}
FLAGS = ("--json", "--dry-run")


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file, or hub:<name> (read exactly as `nxd train` reads it)")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="dotted.key=value overrides, as for nxd train")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (every rank)")
    parser.add_argument("--dry-run", action="store_true",
                        help="build every rank's shard with the real parallel code on a fake process group")
    parser.add_argument("--device-memory", type=float, default=None, metavar="GiB",
                        help="memory per device; ranks above it are flagged and fitting layouts proposed")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense peak per device (TFLOP/s)")
    parser.add_argument("--link-gbps", type=float, default=None, help="bandwidth between nodes per device (GB/s)")
    parser.add_argument("--device", default=None, help="trn1, trn2, h100, h200 or cpu (default: from the config)")


def _run(args: argparse.Namespace) -> int:
    from nxd_plan import report
    from nxd_plan.planner import make_run_plan

    try:
        take_trailing_flags(args, FLAGS, FLAGS_WITH_VALUE)  # as with nxd train
        options = {"device": args.device, "peak_tflops": args.peak_tflops, "link_gbps": args.link_gbps}
        plan = make_run_plan(args.config, args.overrides, memory_gib=args.device_memory, **options)
    except (ConfigError, ComponentNotFound, ValueError) as exc:
        print(f"nxd plan: {exc}", file=sys.stderr)
        return 2
    out = plan.as_dict()
    if not args.json:
        print(report.text(plan), flush=True)
    status = 0
    if args.device_memory is not None and plan.over_memory():
        from nxd_plan.proposals import propose

        found = propose(plan, args.config, args.overrides, args.device_memory, **options)
        out["proposals"] = [{"overrides": change, "max_peak_bytes": p.max_peak, "step_time_s": p.step_time_s,
                             "mfu": p.mfu} for change, p in found]
        if not args.json:
            if found:
                print(f"\nlayouts that fit {args.device_memory:g} GiB (nearest first):")
                for change, p in found:
                    keys = " ".join(f"{k}={v}" for k, v in change.items())
                    print(f"  {keys}: peak {p.max_peak / 2**30:.2f} GiB, step ~{p.step_time_s:.3g} s, "
                          f"MFU ~{100 * p.mfu:.0f}%")
            else:
                print(f"\nno nearby layout fits {args.device_memory:g} GiB")
    if args.dry_run:
        from nxd_plan.dryrun import dry_run

        def progress(done: int, total: int) -> None:
            if not args.json and (done % 64 == 0 or done == total):
                print(f"nxd plan: dry run: {done}/{total} ranks built", file=sys.stderr, flush=True)

        result = dry_run(plan, args.config, args.overrides, progress=progress)
        out["dry_run"] = {"ranks_built": result.ranks_built, "seconds": result.seconds, "ok": result.ok,
                          "parameters_total": result.parameters_total,
                          "problems": {str(k): v for k, v in result.problems.items()}}
        if not args.json:
            print(f"\ndry run: {result.ranks_built} ranks built on a fake process group in {result.seconds:.1f} s; "
                  + ("every rank agrees with the plan" if result.ok else f"{len(result.problems)} rank(s) disagree:"))
            for rank, problems in sorted(result.problems.items())[:20]:
                print(f"  rank {rank}: " + "; ".join(problems))
        if not result.ok:
            status = 1
    if args.json:
        print(json.dumps(out, indent=1))
    return status


PLAN = Command(help="memory, communication and time per rank for a training config; --dry-run builds every "
                    "rank's shard on a fake process group", add_arguments=_arguments, run=_run)
