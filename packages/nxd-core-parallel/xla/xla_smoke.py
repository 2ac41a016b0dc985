"""XLA backend check, run by the optional ``nox -s xla`` session (needs torch-xla; not part of the
default test command). Single process on the XLA CPU device (PJRT_DEVICE=CPU): the same small
model trained through the NxD API on the xla backend and on the cpu backend must give the same
losses (XLA CPU fp32: 1e-4 relative), and the loss must fall."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

import nxd
from nxd_core_parallel import backends
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

VOCAB, HID, STEPS = 32, 16, 10


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = ParallelEmbedding(VOCAB, HID)
        self.norm = RMSNorm(HID)
        self.up = ColumnParallelLinear(HID, 32, gather_output=False)
        self.down = RowParallelLinear(32, HID, input_is_parallel=True)
        self.head = ColumnParallelLinear(HID, VOCAB, gather_output=True)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.down(F.silu(self.up(self.norm(h))))
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def build() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def train(backend: str) -> list[float]:
    os.environ["NXD_BACKEND"] = backend
    cfg = nxd.neuronx_distributed_config()
    model = nxd.initialize_parallel_model(cfg, build)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=1e-2)
    device = backends.get_device()
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        start = torch.randint(0, VOCAB, (4, 1), generator=g)
        seq = (start + torch.arange(9)) % VOCAB
        loss = model.run_train(seq[:, :-1].to(device), seq[:, 1:].to(device))
        opt.step()
        opt.zero_grad()
        backends.synchronize()  # mark_step on XLA
        losses.append(float(loss.cpu()))
    return losses


def main() -> None:
    xla_losses = train("xla")
    assert backends.current_backend().name == "xla"
    cpu_losses = train("cpu")
    worst = max(abs(a - b) / abs(b) for a, b in zip(xla_losses, cpu_losses))
    print(f"xla losses {xla_losses}\ncpu losses {cpu_losses}\nmax relative diff {worst:.2e}")
    assert worst < 1e-4, worst
    assert xla_losses[-1] < xla_losses[0], "loss must fall"


if __name__ == "__main__":
    main()
