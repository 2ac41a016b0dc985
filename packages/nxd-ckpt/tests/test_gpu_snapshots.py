"""CUDA state (``@pytest.mark.gpu``; ``nox -s gpu`` on a GPU machine): a synchronous save copies device
tensors through reused page-locked buffers, an asynchronous one snapshots into them, an overlapped one
copies on a side stream while the optimizer step waits on the training stream. Each loads back as
the state at the call, bit for bit, though two optimizer steps ran right after it."""

from __future__ import annotations

import pytest
import torch

import nxd

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (nox -s gpu on a GPU machine)")]


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 64)).cuda()
    model.register_buffer("seen", torch.zeros(4, device="cuda"))
    return model


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(8, 1024, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("mode", ["sync", "async", "overlapped"])
def test_cuda_state_round_trips_as_of_the_call(tmp_path, mode):
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt)
    expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    moments = [opt.state[p]["exp_avg"].cpu().clone() for p in model.parameters()]
    waits: list[float] = []
    extra = {"overlap_snapshot": True, "on_snapshot_wait": waits.append} if mode == "overlapped" else {}
    nxd.save_checkpoint(str(tmp_path), mode, model=model, optimizer=opt, async_save=mode != "sync", save_rng=False,
                        **extra)
    model.seen += 1  # a buffer changed right after the call
    _step(model, opt)
    _step(model, opt)
    nxd.finalize_checkpoint()
    assert len(waits) == (mode == "overlapped")
    loaded = _model()
    lopt = torch.optim.AdamW(loaded.parameters(), lr=1e-2)
    nxd.load_checkpoint(str(tmp_path), mode, model=loaded, optimizer=lopt, load_rng=False)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v.cpu(), expected[k]), k
    for p, m in zip(loaded.parameters(), moments):
        assert torch.equal(lopt.state[p]["exp_avg"].cpu(), m)
