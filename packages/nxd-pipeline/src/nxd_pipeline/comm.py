"""Point-to-point traffic between pipeline stages over the pipeline process group.

Sends are non-blocking (``isend``) and waited at the end of the step; receives block where the
data is needed. Every message carries a tag naming (kind, stage, micro-batch), so activations and
gradients that share a direction (interleaved schedules wrap around the ring) never mix, whatever
order a schedule issues them in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

ACTIVATION, GRADIENT, HEADER = 0, 1, 2
_MAX_DIMS = 8
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32]


def tag(kind: int, stage: int, microbatch: int) -> int:
    if stage >= 1 << 12 or microbatch >= 1 << 16:
        raise ValueError(f"pipeline message tag out of range: stage {stage}, micro-batch {microbatch}")
    return (kind << 28) | (stage << 16) | microbatch


@dataclass(frozen=True)
class PipelineGroup:
    """This rank's pipeline group: ``ranks[i]`` is the global rank of pipeline rank ``i``."""

    group: dist.ProcessGroup | None
    ranks: tuple[int, ...]
    rank: int  # this process's pipeline rank

    @property
    def size(self) -> int:
        return len(self.ranks)


class P2P:
    """Tagged sends/receives of one pipeline step; shapes of activations travel once per stage."""

    def __init__(self, pg: PipelineGroup) -> None:
        self.pg = pg
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        self._sent_header: set[int] = set()
        self._meta: dict[int, tuple[torch.Size, torch.dtype]] = {}

    def _isend(self, tensor: torch.Tensor, to_pp_rank: int, message_tag: int) -> None:
        tensor = tensor.contiguous()
        work = dist.isend(tensor, dst=self.pg.ranks[to_pp_rank], group=self.pg.group, tag=message_tag)
        self._pending.append((work, tensor))

    def _recv(self, tensor: torch.Tensor, from_pp_rank: int, message_tag: int) -> torch.Tensor:
        dist.recv(tensor, src=self.pg.ranks[from_pp_rank], group=self.pg.group, tag=message_tag)
        return tensor

    def send_activation(self, tensor: torch.Tensor, to_pp_rank: int, stage: int, microbatch: int) -> None:
        """Send the input of ``stage`` (the output of ``stage - 1``)."""
        if stage not in self._sent_header:
            if tensor.dim() > _MAX_DIMS or tensor.dtype not in _DTYPES:
                raise TypeError(
                    f"pipeline stage {stage - 1} returned a {tensor.dtype} tensor of {tensor.dim()} dims; stages "
                    f"pass one tensor of at most {_MAX_DIMS} dims with dtype in {_DTYPES}"
                )
            header = torch.zeros(_MAX_DIMS + 2, dtype=torch.int64)
            header[0], header[1] = tensor.dim(), _DTYPES.index(tensor.dtype)
            header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
            self._isend(header, to_pp_rank, tag(HEADER, stage, 0))
            self._sent_header.add(stage)
        self._isend(tensor.detach(), to_pp_rank, tag(ACTIVATION, stage, microbatch))

    def recv_activation(self, from_pp_rank: int, stage: int, microbatch: int) -> torch.Tensor:
        meta = self._meta.get(stage)
        if meta is None:
            header = self._recv(torch.empty(_MAX_DIMS + 2, dtype=torch.int64), from_pp_rank, tag(HEADER, stage, 0))
            ndim = int(header[0])
            meta = torch.Size(header[2:2 + ndim].tolist()), _DTYPES[int(header[1])]
            self._meta[stage] = meta
        return self._recv(torch.empty(meta[0], dtype=meta[1]), from_pp_rank, tag(ACTIVATION, stage, microbatch))

    def send_gradient(self, tensor: torch.Tensor, to_pp_rank: int, stage: int, microbatch: int) -> None:
        """Send the gradient of ``stage``'s input back to ``stage - 1``."""
        self._isend(tensor.detach(), to_pp_rank, tag(GRADIENT, stage, microbatch))

    def recv_gradient(self, like: torch.Tensor, from_pp_rank: int, stage: int, microbatch: int) -> torch.Tensor:
        return self._recv(torch.empty_like(like), from_pp_rank, tag(GRADIENT, stage, microbatch))

    def finish(self) -> None:
        """Wait for every send of the step (a step never leaves traffic behind)."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
