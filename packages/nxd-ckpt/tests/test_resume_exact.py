"""Resumed training equals uninterrupted training bit for bit (fp32, CPU): weights, optimizer,
scheduler, every RNG (Python, NumPy, torch, the TP RNG tracker) and the data position."""

from __future__ import annotations

import random

import numpy as np
import torch
from ckpt_helpers import TinyNet

import nxd
from nxd_core_parallel.random import get_rng_tracker

DATA = torch.linspace(-1, 1, 64 * 4).reshape(64, 4)


def _setup():
    torch.manual_seed(0)
    model = TinyNet(dropout=0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def _step(model, opt, sched, position: int) -> tuple[float, int]:
    """One step; draws from every RNG so a missed restore changes the loss."""
    batch = DATA[position:position + 4] + float(np.random.randn()) * 0.01 + random.random() * 0.01
    with get_rng_tracker().fork():
        noise = torch.rand(4, 3)  # tensor-parallel RNG stream
    loss = (model(batch) - noise).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    return loss.item(), position + 4


def _seed_all() -> None:
    random.seed(7)
    np.random.seed(7)
    tracker = get_rng_tracker()
    tracker.reset()
    tracker.add("model-parallel-rng", 2718)


def test_resumed_losses_equal_uninterrupted(tmp_path):
    _seed_all()
    model, opt, sched = _setup()
    position, straight = 0, []
    for _ in range(6):
        loss, position = _step(model, opt, sched, position)
        straight.append(loss)

    _seed_all()
    model, opt, sched = _setup()
    position, resumed = 0, []
    for _ in range(3):
        loss, position = _step(model, opt, sched, position)
        resumed.append(loss)
    nxd.save_checkpoint(str(tmp_path), "step_3", model=model, optimizer=opt, scheduler=sched,
                        user_content={"data_position": position}, async_save=True)
    nxd.finalize_checkpoint()

    # a "new process": different RNG states and fresh objects
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    get_rng_tracker().reset()
    get_rng_tracker().add("model-parallel-rng", 5)
    model, opt, sched = _setup()
    position = nxd.load_checkpoint(str(tmp_path), model=model, optimizer=opt, scheduler=sched)["data_position"]
    for _ in range(3):
        loss, position = _step(model, opt, sched, position)
        resumed.append(loss)
    assert resumed == straight  # exact float equality


def test_without_rng_restore_the_run_diverges(tmp_path):
    """The control: the test above can fail — skipping the RNG restore changes the losses."""
    _seed_all()
    model, opt, sched = _setup()
    _step(model, opt, sched, 0)
    nxd.save_checkpoint(str(tmp_path), "s", model=model, optimizer=opt, scheduler=sched)
    expected, _ = _step(model, opt, sched, 4)
    model, opt, sched = _setup()
    torch.manual_seed(3)
    nxd.load_checkpoint(str(tmp_path), model=model, optimizer=opt, scheduler=sched, load_rng=False)
    assert _step(model, opt, sched, 4)[0] != expected
