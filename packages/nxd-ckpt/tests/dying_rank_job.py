"""One rank of a 2-rank job for test_fault_injection: saves step_1, then starts an asynchronous
save of step_2 (``num_kept_ckpts=1``) and keeps "training". Rank 1 dies (``os._exit``, as a kill
would) as soon as its writer starts writing step_2; rank 0's writer is slowed until the training
thread has torn the process group down, as the training loop's ``finally`` does. The async save
must then not be committed: step_1 must survive retention.

argv: checkpoint dir, rendezvous file, rank; mode (argv[4]) ``destroy``: the loop's teardown
destroys the process group with the save still in flight; ``finalize``: it waits for the save
first (``nxd.finalize_checkpoint``), as nxd-training's trainer does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import nxd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_helpers import TinyNet, register_storage  # noqa: E402

from nxd_ckpt.storage import LocalStorage  # noqa: E402

ckpt_dir, store_file, rank, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]


class DyingStorage(LocalStorage):
    def __init__(self, root: str, options: dict | None = None) -> None:
        super().__init__(root[len("dying://"):], options)

    @contextlib.contextmanager
    def open_write(self, path: str):
        if path.startswith("step_2/") and path.endswith(".pt"):
            if rank == 1:
                os._exit(9)  # this rank dies with its async save in flight
            deadline = time.monotonic() + 30  # rank 0: still writing when the group goes away
            while mode == "destroy" and dist.is_initialized() and time.monotonic() < deadline:
                time.sleep(0.05)
        with super().open_write(path) as f:
            yield f


register_storage("dying", DyingStorage)
dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=60))
torch.manual_seed(1)
nxd.save_checkpoint(ckpt_dir, "step_1", model=TinyNet(), user_content={"step": 1}, num_kept_ckpts=1)
torch.manual_seed(2)
try:
    nxd.save_checkpoint(f"dying://{ckpt_dir}", "step_2", model=TinyNet(), user_content={"step": 2},
                        async_save=True, num_kept_ckpts=1)
    for _ in range(600):  # training steps: a collective each; fails once rank 1 is gone
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)
    print("rank 1 never died", flush=True)
    sys.exit(3)
finally:  # the training loop's teardown
    if mode == "finalize":
        try:
            nxd.finalize_checkpoint()
        except Exception as exc:  # noqa: BLE001 - reported; the training error propagates
            print(f"async save failed: {exc}", file=sys.stderr, flush=True)
    dist.destroy_process_group()
