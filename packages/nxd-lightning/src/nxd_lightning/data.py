"""Data for Lightning on nxd: NxD's ``NeuronLightningDataModule`` (a ``dataloader_fn`` called with
this rank's data-parallel size and rank) and :class:`NeuronDataLoader`, which turns an nxd data
module (``nxd.get_data_module(name)(...)``) into a resumable Lightning training loader."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from lightning.pytorch import LightningDataModule


class NeuronLightningDataModule(LightningDataModule):
    """``dataloader_fn(data_dir, batch_size, dp_size, dp_rank, *data_args, **data_kwargs)`` builds
    this rank's loader; TP and PP ranks of one data-parallel replica get the same data."""

    def __init__(self, dataloader_fn: Callable[..., Any], data_dir: str, batch_size: int,
                 data_args: tuple = (), data_kwargs: dict | None = None) -> None:
        super().__init__()
        self.dataloader_fn = dataloader_fn
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.data_args = tuple(data_args)
        self.data_kwargs = dict(data_kwargs or {})

    def setup(self, stage: str) -> None:
        pass

    @property
    def data_parallel_size(self) -> int:
        return data_parallel_size()

    @property
    def data_parallel_rank(self) -> int:
        return data_parallel_rank()

    def train_dataloader(self) -> Any:
        return self.dataloader_fn(self.data_dir, self.batch_size, self.data_parallel_size, self.data_parallel_rank,
                                  *self.data_args, **self.data_kwargs)


def data_parallel_size() -> int:
    from nxd_core_parallel import parallel_state as ps

    return ps.get_data_parallel_size() if ps.model_parallel_is_initialized() else 1


def data_parallel_rank() -> int:
    from nxd_core_parallel import parallel_state as ps

    return ps.get_data_parallel_rank() if ps.model_parallel_is_initialized() else 0


class NeuronDataLoader:
    """An nxd data module's endless micro-batches as a sized, resumable Lightning loader.

    ``length`` is how many micro-batches make one Lightning "epoch" (a sized loader also tells
    Lightning not to read ahead, so the saved position is exactly the consumed one). Its state is
    every data-parallel rank's position (gathered when Lightning saves, since the checkpoint's
    Lightning state is written once), and each rank continues from its own on load.
    """

    def __init__(self, data_module: Any, length: int = 2**31 - 1, keys: tuple[str, ...] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        self.data_module = data_module
        self.length = int(length)
        self.keys = keys
        self.extra = dict(extra or {})
        self._iterator: Iterator[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._iterator = self.data_module.train_batches()
        for _ in range(self.length):
            batch = next(self._iterator)
            if self.keys is not None:
                batch = {k: v for k, v in batch.items() if k in self.keys}
            yield {**batch, **self.extra}

    def state_dict(self) -> dict[str, Any]:
        mine = self.data_module.state_dict()
        if not (dist.is_available() and dist.is_initialized()):
            return {"dp_states": [mine]}
        from nxd_core_parallel import parallel_state as ps

        states: list[Any] = [None] * ps.get_data_parallel_size()
        dist.all_gather_object(states, mine, group=ps.get_data_parallel_group())
        return {"dp_states": states}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        states = state.get("dp_states")
        size, rank = data_parallel_size(), data_parallel_rank()
        if not isinstance(states, list) or len(states) != size:
            got = len(states) if isinstance(states, list) else states
            raise ValueError(f"NeuronDataLoader: the checkpoint holds data positions for {got} data-parallel "
                             f"ranks, this run has {size}")
        self.data_module.load_state_dict(states[rank])
