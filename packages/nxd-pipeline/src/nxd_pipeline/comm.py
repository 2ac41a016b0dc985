"""Point-to-point traffic between pipeline stages over the pipeline process group.

Sends are non-blocking (``isend``) and waited at the end of the step; a receive is posted one
receiving action ahead (``irecv``) and waited where the data is needed. Every message carries a tag naming (kind, stage, micro-batch), so activations and
gradients that share a direction (interleaved schedules wrap around the ring) never mix, whatever
order a schedule issues them in.
"""

from __future__ import annotations

from collections.abc import Callable
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


def batch_signature(batch: dict) -> tuple:
    """Shapes and dtypes of a micro-batch's tensors. Every rank holds the same batch, so sender and
    receiver agree on it without a message: an activation shape exchanged for one signature is
    reused for every later micro-batch (and step) with the same signature."""
    return tuple((k, tuple(v.shape), v.dtype) for k, v in batch.items() if isinstance(v, torch.Tensor))


class P2P:
    """Tagged sends/receives of one pipeline step.

    Activation shapes travel once per (stage, batch signature) and are remembered in ``shapes``
    (kept by the caller across steps). Receives can be posted ahead of need (:meth:`prepost_*`),
    so the transfer overlaps the compute before it rather than starting when the data is needed.
    """

    def __init__(self, pg: PipelineGroup, shapes: dict | None = None) -> None:
        self.pg = pg
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        self._shapes: dict[tuple[int, tuple], tuple[torch.Size, torch.dtype]] = {} if shapes is None else shapes
        self._posted: dict[int, tuple[dist.Work, torch.Tensor]] = {}
        #: where P2P buffers live: NCCL moves only CUDA tensors, gloo CPU ones
        nccl = dist.get_backend(pg.group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")

    def _isend(self, tensor: torch.Tensor, to_pp_rank: int, message_tag: int) -> None:
        tensor = tensor.contiguous()
        work = dist.isend(tensor, dst=self.pg.ranks[to_pp_rank], group=self.pg.group, tag=message_tag)
        self._pending.append((work, tensor))

    def _post(self, tensor: torch.Tensor, from_pp_rank: int, message_tag: int) -> None:
        if message_tag not in self._posted:
            work = dist.irecv(tensor, src=self.pg.ranks[from_pp_rank], group=self.pg.group, tag=message_tag)
            self._posted[message_tag] = (work, tensor)

    def _recv(self, make: Callable[[], torch.Tensor], from_pp_rank: int, message_tag: int) -> torch.Tensor:
        posted = self._posted.pop(message_tag, None)
        if posted is None:
            tensor = make()
            dist.recv(tensor, src=self.pg.ranks[from_pp_rank], group=self.pg.group, tag=message_tag)
            return tensor
        posted[0].wait()
        return posted[1]

    def send_activation(self, tensor: torch.Tensor, to_pp_rank: int, stage: int, microbatch: int,
                        signature: tuple = ()) -> None:
        """Send the input of ``stage`` (the output of ``stage - 1``)."""
        meta = (tensor.shape, tensor.dtype)
        known = self._shapes.get((stage, signature))
        if known is None:
            if tensor.dim() > _MAX_DIMS or tensor.dtype not in _DTYPES:
                raise TypeError(
                    f"pipeline stage {stage - 1} returned a {tensor.dtype} tensor of {tensor.dim()} dims; stages "
                    f"pass one tensor of at most {_MAX_DIMS} dims with dtype in {_DTYPES}"
                )
            header = torch.zeros(_MAX_DIMS + 2, dtype=torch.int64, device=self.device)
            header[0], header[1] = tensor.dim(), _DTYPES.index(tensor.dtype)
            header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
            self._isend(header, to_pp_rank, tag(HEADER, stage, microbatch))
            self._shapes[(stage, signature)] = meta
        elif known != meta:
            raise RuntimeError(
                f"pipeline stage {stage - 1} returned shape {tuple(tensor.shape)} {tensor.dtype} for micro-batch "
                f"{microbatch}, but {tuple(known[0])} {known[1]} for an earlier one with the same batch shapes; "
                "a stage's output shape must follow from the batch's tensor shapes"
            )
        self._isend(tensor.detach(), to_pp_rank, tag(ACTIVATION, stage, microbatch))

    def _activation_meta(self, from_pp_rank: int, stage: int, microbatch: int,
                         signature: tuple) -> tuple[torch.Size, torch.dtype]:
        meta = self._shapes.get((stage, signature))
        if meta is None:
            header = self._recv(lambda: torch.empty(_MAX_DIMS + 2, dtype=torch.int64, device=self.device), from_pp_rank,
                                tag(HEADER, stage, microbatch))
            ndim = int(header[0])
            meta = torch.Size(header[2:2 + ndim].tolist()), _DTYPES[int(header[1])]
            self._shapes[(stage, signature)] = meta
        return meta

    def recv_activation(self, from_pp_rank: int, stage: int, microbatch: int, signature: tuple = ()) -> torch.Tensor:
        shape, dtype = self._activation_meta(from_pp_rank, stage, microbatch, signature)
        return self._recv(lambda: torch.empty(shape, dtype=dtype, device=self.device), from_pp_rank, tag(ACTIVATION, stage, microbatch))

    def prepost_activation(self, from_pp_rank: int, stage: int, microbatch: int, signature: tuple = ()) -> None:
        """Post the receive of an activation now if its shape is already known (never blocks)."""
        meta = self._shapes.get((stage, signature))
        if meta is not None:
            self._post(torch.empty(meta[0], dtype=meta[1], device=self.device), from_pp_rank, tag(ACTIVATION, stage, microbatch))

    def send_gradient(self, tensor: torch.Tensor, to_pp_rank: int, stage: int, microbatch: int) -> None:
        """Send the gradient of ``stage``'s input back to ``stage - 1``."""
        self._isend(tensor.detach(), to_pp_rank, tag(GRADIENT, stage, microbatch))

    def recv_gradient(self, like: torch.Tensor, from_pp_rank: int, stage: int, microbatch: int) -> torch.Tensor:
        return self._recv(lambda: torch.empty_like(like), from_pp_rank, tag(GRADIENT, stage, microbatch))

    def prepost_gradient(self, like: torch.Tensor, from_pp_rank: int, stage: int, microbatch: int) -> None:
        self._post(torch.empty_like(like), from_pp_rank, tag(GRADIENT, stage, microbatch))

    def finish(self) -> None:
        """Wait for every send of the step (a step never leaves traffic behind)."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
        # left only after an error (a step consumes every receive it posts); waiting could hang
        self._posted.clear()
