"""Subprocess for test_faults: saves step_1, then starts step_2 (mode ``overwrite``: saves over
step_1) through a slow storage and announces (by creating a file) that it is being written, so
the test can kill it mid-save."""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

import nxd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_helpers import TinyNet, register_storage  # noqa: E402

from nxd_ckpt.storage import LocalStorage  # noqa: E402

ckpt_dir, signal_file, mode = sys.argv[1:4]


class SlowStorage(LocalStorage):
    def __init__(self, root: str, options: dict | None = None) -> None:
        super().__init__(root[len("slow://"):], options)

    @contextlib.contextmanager
    def open_write(self, path: str):
        with super().open_write(path) as f:
            yield f
        if path.startswith(("step_2/", ".saving-step_1/")) and path.endswith(".pt"):
            open(signal_file, "w").close()  # noqa: SIM115 - a marker file
            time.sleep(60)  # the test kills us here


register_storage("slow", SlowStorage)
torch.manual_seed(1)
nxd.save_checkpoint(ckpt_dir, "step_1", model=TinyNet(), user_content={"step": 1})
torch.manual_seed(2)
nxd.save_checkpoint(f"slow://{ckpt_dir}", "step_1" if mode == "overwrite" else "step_2", model=TinyNet(),
                    user_content={"step": 2},
                    async_save=mode == "async", num_kept_ckpts=1)
time.sleep(60)
