"""``nxd plan`` against measurement: the planned peak per rank beside the peak the trainer measures
(``trainer.profile.profile_memory`` on the CPU: live tensors when the profiled step starts plus the
CPU allocator's high-water mark during it) for small runs of ``nxd train``'s loop on 2 gloo ranks,
one per layout variant (nxd_plan.accuracy.VARIANTS). Prints planned / measured (goal: within 10%).
Run: python benchmarks/bench_plan.py [variant ...]
"""

from __future__ import annotations

import sys
import tempfile

from nxd_plan.accuracy import VARIANTS, measurable_config
from nxd_plan.planner import make_run_plan
from nxd_testing.ranks import run_on_ranks


def _measure(config: dict) -> int:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    return train(load_config(config)).profile_peak_memory_bytes


def main(names: list[str]) -> None:
    from nxd_data.quickstart import prepare_quickstart_data

    corpus = prepare_quickstart_data(tempfile.mkdtemp(), vocab_size=512)
    print(f"{'variant':<22}{'rank':>5}{'planned MiB':>13}{'measured MiB':>14}{'error':>8}")
    for name in names or list(VARIANTS):
        config = measurable_config(corpus, tempfile.mkdtemp(), **VARIANTS[name])
        measured = run_on_ranks(config["trainer"]["devices"], _measure, config)
        plan = make_run_plan(config)
        for rank, peak in enumerate(measured):
            planned = plan.ranks[rank].peak_bytes
            print(f"{name:<22}{rank:>5}{planned / 2**20:>13.2f}{peak / 2**20:>14.2f}{planned / peak - 1:>+8.1%}",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
