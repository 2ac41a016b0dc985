"""Entry point of one rank under torchrun: ``python -m nxd_training.worker <run>/config.yaml``."""

from __future__ import annotations

import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record


@record  # writes torchrun's error file, so the agent reports the rank that failed first, with its traceback
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m nxd_training.worker RUN_DIR/config.yaml", file=sys.stderr)
        return 2
    from nxd_training.config.resolved import load_resolved
    from nxd_training.loop import train
    from nxd_training.parent_death import die_with_parent

    die_with_parent()  # a rank never outlives torchrun's agent (SIGKILL: nothing to clean up that a save needs)
    from nxd import quiet_imports, warning_lines

    warning_lines.install()
    quiet_imports.install()
    from nxd_training import rank_status
    from nxd_training.hang import CollectiveTimeout, dump_stack_on_sigterm, explain_collective_timeout

    run_dir = Path(argv[0]).parent
    rank = rank_status.identity()["rank"]
    stack_out = dump_stack_on_sigterm(run_dir, rank)  # noqa: F841 - kept open
    from nxd_training import heartbeat

    heartbeat.start(rank, rank_status.progress, rank_status.changed)  # nxd train's hang watch (distributed_strategy.heartbeat_timeout)
    try:
        config = load_resolved(argv[0])  # the config `nxd train` resolved, deserialised: never resolved again
        try:
            train(config)
        except RuntimeError as exc:
            timed_out = explain_collective_timeout(exc, config.distributed_strategy.collective_timeout)
            if timed_out is None:
                raise
            raise timed_out from exc  # the error file then names this rank and the configured timeout
    except SystemExit as exc:  # something called sys.exit() in the middle of training
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        rank_status.write(run_dir, "exit", code=code)
        raise
    except BaseException as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        # a timeout records its collective: the launcher's last line then names the rank that never came
        timeout = (exc.site or {}) if isinstance(exc, CollectiveTimeout) else None
        rank_status.write(run_dir, "exception", rank_status.brief(f"{type(exc).__name__}: {first}"),
                          collective=timeout)
        raise
    rank_status.write(run_dir, "finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
