"""Several tensors carried between pipeline stages as the one tensor a stage sends.

A stage's output travels as one tensor (nxd_pipeline.comm). A model that hands more than its
hidden state to the next stage (NxD's MoE examples: the router logits of every layer so far)
packs them into one 1-D tensor that describes itself: a header with each part's shape and dtype,
then the parts' values. Packing is differentiable (concatenation, slicing and casts), so the
gradient of the packed tensor is each part's gradient. The values travel in float32 (float64
when a part is float64): float16/bfloat16 widen and narrow back exactly, and shapes below 2**24
are exact in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MAX_DIMS = 8
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_PART = 2 + _MAX_DIMS  # ndim (-1: None), dtype index, dims


def pack(parts: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """``parts`` (tensors or None) as one 1-D tensor (see the module doc)."""
    present = [p for p in parts if p is not None]
    for p in present:
        if p.dtype not in _DTYPES or p.dim() > _MAX_DIMS:
            raise TypeError(f"a pipeline stage carries floating tensors of at most {_MAX_DIMS} dims, got "
                            f"{p.dtype} with {p.dim()} dims")
    wide = torch.float64 if any(p.dtype == torch.float64 for p in present) else torch.float32
    device = present[0].device if present else None
    header = [float(len(parts))]
    for p in parts:
        dims = [] if p is None else list(p.shape)
        header += [-1.0 if p is None else float(p.dim()), 0.0 if p is None else float(_DTYPES.index(p.dtype))]
        header += [float(d) for d in dims] + [0.0] * (_MAX_DIMS - len(dims))
    values = [torch.tensor(header, dtype=wide, device=device)]
    values += [p.reshape(-1).to(wide) for p in present]
    return torch.cat(values)


def unpack(packed: torch.Tensor) -> list[torch.Tensor | None]:
    """The parts :func:`pack` packed, with their shapes and dtypes (views of ``packed``)."""
    count = int(packed[0].item())
    header = packed[1:1 + count * _PART].tolist()
    offset, parts = 1 + count * _PART, []
    for i in range(count):
        ndim, dtype, *dims = header[i * _PART:(i + 1) * _PART]
        if ndim < 0:
            parts.append(None)
            continue
        shape = [int(d) for d in dims[:int(ndim)]]
        numel = 1
        for d in shape:
            numel *= d
        parts.append(packed[offset:offset + numel].view(shape).to(_DTYPES[int(dtype)]))
        offset += numel
    return parts
