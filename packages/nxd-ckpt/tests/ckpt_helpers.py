"""Small models, failing storages and other test helpers shared by the nxd-ckpt tests."""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

import torch

import nxd
from nxd_ckpt.storage import LocalStorage


class TinyNet(torch.nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
        self.drop = torch.nn.Dropout(dropout)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


class FailingStorage(LocalStorage):
    """A local disk that fails writes whose path contains ``fail_on`` (a full disk, say)."""

    fail_on = "model/"

    def __init__(self, root: str, options: dict | None = None) -> None:
        super().__init__(root[len("failing://"):], options)

    @contextlib.contextmanager
    def open_write(self, path: str):
        if self.fail_on in path:
            raise OSError(28, "No space left on device", self.describe(path))
        with super().open_write(path) as f:
            yield f


def register_storage(scheme: str, factory: Any) -> None:
    """Register a storage plugin in-process (once per scheme)."""
    if scheme in nxd.list_components("storage"):
        return
    module = types.ModuleType(f"nxd_ckpt_test_storage_{scheme}")

    @nxd.hookimpl
    def nxd_register_storages(registry: Any) -> None:
        registry.add(scheme, factory)

    module.nxd_register_storages = nxd_register_storages
    module.NXD_PLUGIN_API = (3, 3)
    sys.modules[module.__name__] = module
    nxd.register_plugin(module, name=module.__name__)


class ShardedMomentum:
    """A minimal optimizer with ZeRO-1's duck-typed checkpoint contract: each DP rank owns a
    contiguous slice of one flat state vector and describes it with global offsets."""

    nxd_zero1 = True

    def __init__(self, numel: int, dp_rank: int, dp_size: int) -> None:
        per = -(-numel // dp_size)
        self.numel, self.start = numel, min(dp_rank * per, numel)
        self.end = min(self.start + per, numel)
        self.momentum = torch.zeros(self.end - self.start)

    def state_dict(self) -> dict:
        return {"numel": self.numel, "start": self.start, "momentum": self.momentum}

    def load_state_dict(self, sd: dict) -> None:
        assert sd["start"] == self.start and sd["numel"] == self.numel, "same DP size expected"
        self.momentum = sd["momentum"].clone()

    def load_state_dict_from_shards(self, shards: list[dict]) -> None:
        full = torch.full((self.numel,), float("nan"))
        for sd in shards:
            full[sd["start"]:sd["start"] + len(sd["momentum"])] = sd["momentum"]
        self.momentum = full[self.start:self.end].clone()
