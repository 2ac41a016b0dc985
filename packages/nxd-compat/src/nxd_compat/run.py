"""``nxd-compat-run SCRIPT [ARGS...]``: run an NxD script written for torch-xla, unchanged, on CPU or CUDA.

Where torch-xla is not installed, a stand-in for the ``torch_xla`` modules NxD's examples import
(``core.xla_model``, ``runtime``, ``distributed.parallel_loader``, ``distributed.xla_multiprocessing``,
``utils.checkpoint``) is put on the path, with optimum-neuron's generation patch for TP models
(``optimum.neuron.utils.training_utils``), ``init_process_group("xla")`` gets gloo (CPU) or NCCL (CUDA),
and tensors made on ``device="xla"`` land on nxd's device. Where torch-xla is installed the script
runs as is. Launch ranks with torchrun: ``torchrun --nproc-per-node 2 -m nxd_compat.run train.py ...``.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from pathlib import Path

STAND_IN = Path(__file__).parent / "xla_stand_in"


def _say(message: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(f"nxd-compat-run: {message}", file=sys.stderr, flush=True)


class _OptimumNeuronStandIn(importlib.abc.MetaPathFinder):
    """``optimum.neuron`` from the stand-in also where optimum itself (a regular package, which
    would hide the stand-in's ``optimum`` directory) is installed."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname != "optimum.neuron":
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(STAND_IN / "optimum")])


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if args else 2)
    script = Path(args[0])
    if not script.is_file():
        raise SystemExit(f"nxd-compat-run: {script} is not a file; usage: nxd-compat-run SCRIPT [ARGS...]")
    if importlib.util.find_spec("torch_xla") is not None:
        _say("torch-xla is installed; running the script on it as is")
    else:
        sys.path.insert(0, str(STAND_IN))
        sys.meta_path.insert(0, _OptimumNeuronStandIn())
        from nxd_compat import xla_emulation

        xla_emulation.install()
        _say(f"torch-xla is not installed; its calls run on nxd's {os.environ['NXD_BACKEND']} backend "
             "(process group 'xla' = gloo on CPU, NCCL on CUDA)")
    sys.argv = [str(script), *args[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # a script ending with sys.exit(0) has finished too
        if exc.code not in (0, None):
            raise
    _finish()


def _finish() -> None:
    """After the script returned: its in-flight asynchronous saves commit and every rank reaches the end."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        import nxd

        nxd.finalize_checkpoint()  # raises a failed save's error: the run must not look successful
        dist.barrier()  # no rank leaves while another may still talk to it


def cli() -> None:
    """The command (``nxd-compat-run``, ``python -m nxd_compat.run``): :func:`main`, then leave
    the way ``multiprocessing`` ends its children: Python's exit handlers run and output is flushed,
    then ``os._exit`` skips the native teardown. Left to interpreter shutdown, the process group the
    script left open aborted a rank now and then ("terminate called without an active exception",
    in 2 CI runs of NxD's TP+SP+ZeRO-1 example, after it had trained and written its metrics;
    destroying the group first did not prevent it)."""
    main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


if __name__ == "__main__":
    cli()
