"""The plain (one-device) modules nxd's model families are built from, before their parallel plan
swaps them for tensor-parallel layers (:mod:`nxd_tensor_parallel.tensor_plan`).

They are ``nn.Linear`` / ``nn.Embedding`` (every ``isinstance`` check, optimizer and hook treats them
as such) that initialise as nxd's parallel layers do: ``init_method`` on an fp32 full weight, cast
to the parameter's dtype, zero biases. So a model built plain and then sharded holds exactly the
weights it would have had if built sharded, at any TP size, and a meta-device model re-initialises
identically (``reset_parameters``). :class:`QKVLinear` is the one-device form of
:class:`~nxd_tensor_parallel.modules.qkv_linear.GQAQKVColumnParallelLinear` (fused ``weight_qkv``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from nxd.parallel import ParallelContext
from nxd_tensor_parallel.parallel_layers.layers import InitMethod, default_linear_init, init_sharded_


class PlacedByPlan:
    """Mixin of a plain module whose forward reads the parallel layout (its TP/CP groups, whether
    its activations are sequence shards): built for one process, it learns both from the
    ``parallel_plan`` transform (:func:`nxd_tensor_parallel.tensor_plan.parallelize`), so a family's
    constructor takes only ``(config, device)``."""

    #: the context the plan parallelised the model over (``None``: one process, whole tensors)
    parallel_context: ParallelContext | None = None
    #: activations run on sequence shards: set on the instance by the plan, with the run's
    #: ``sequence_parallel``; the class default (whole sequences) states no setting the model was
    #: built for (:func:`nxd.run_config.sequence_parallel_built_for`), so the config decides alone
    sequence_parallel: bool = False


def _full_init(weight: torch.Tensor, init_method: InitMethod) -> None:
    init_sharded_(weight, tuple(weight.shape), 0, 1, init_method, 0, 1)


class Linear(nn.Linear):
    """``nn.Linear`` initialised by ``init_method`` (nxd's rule). ``fused_pieces``: the output rows
    are that many equal pieces side by side (``[gate; up]``): tensor parallelism shards each piece."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 init_method: Optional[InitMethod] = None, fused_pieces: int = 1,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        self.init_method = init_method or default_linear_init  # read by nn.Linear.__init__'s reset_parameters
        self.fused_pieces = fused_pieces
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        _full_init(self.weight, self.init_method)
        if self.bias is not None and not self.bias.is_meta:
            with torch.no_grad():
                self.bias.zero_()


class Embedding(nn.Embedding):
    """``nn.Embedding`` initialised by ``init_method`` (default ``N(0, 1)``), ``padding_idx`` row zero."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: Optional[int] = None,
                 init_method: Optional[InitMethod] = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        self.init_method = init_method or nn.init.normal_
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        _full_init(self.weight, self.init_method)
        if self.padding_idx is not None and not self.weight.is_meta:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()


class QKVLinear(nn.Module):
    """``x -> (q, k, v)`` with one fused ``weight_qkv = [q; k; v]`` (and ``bias_qkv``): the layout
    and names of ``GQAQKVColumnParallelLinear(fuse_qkv=True)`` on one device, initialised as it is
    (``init_method`` on the q, k and v weights in turn). ``kv_size_multiplier_for(tp)``: how many
    times the family replicates K/V over a TP size (NxD's ``kv_size_multiplier``; default 1)."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = True,
                 init_method: Optional[InitMethod] = None,
                 kv_size_multiplier_for: Optional[Callable[[int], int]] = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if len(output_sizes) != 2:
            raise ValueError(f"output_sizes must be [q_size, kv_size], got {list(output_sizes)}")
        self.input_size = input_size
        self.q_size, self.kv_size = int(output_sizes[0]), int(output_sizes[1])
        self.init_method = init_method or default_linear_init
        self.kv_size_multiplier_for = kv_size_multiplier_for or (lambda tp: 1)
        rows = self.q_size + 2 * self.kv_size
        self.weight_qkv = nn.Parameter(torch.empty(rows, input_size, dtype=dtype, device=device))
        self.bias_qkv = nn.Parameter(torch.empty(rows, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def full_pieces(self) -> list[torch.Tensor]:
        """The q, k and v weights (views of ``weight_qkv``)."""
        return list(self.weight_qkv.split([self.q_size, self.kv_size, self.kv_size]))

    def reset_parameters(self) -> None:
        if self.weight_qkv.is_meta:
            return
        for piece in self.full_pieces():
            _full_init(piece, self.init_method)
        if self.bias_qkv is not None:
            with torch.no_grad():
                self.bias_qkv.zero_()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = F.linear(x, self.weight_qkv, self.bias_qkv)
        q, k, v = out.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return q, k, v

    def extra_repr(self) -> str:
        return f"in={self.input_size}, q={self.q_size}, kv={self.kv_size}"


class GroupedQKVLinear(Linear):
    """Megatron's fused QKV projection on one device: an ``nn.Linear`` whose output rows are, per
    query group, ``[its q heads; its k head; its v head]`` (groups contiguous). The plan shards it
    by whole groups when TP divides ``num_kv_heads``, else with K/V replicated over TP (NxD's
    ``kv_size_multiplier``, :mod:`nxd_tensor_parallel.modules.kv_heads`), or, named ``padded`` and
    with query heads TP does not divide, with zero groups appended (NxD's ``pad_model``)."""

    def __init__(self, in_features: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool = True,
                 init_method: Optional[InitMethod] = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        #: (query heads, rows of one query group): a ``padded`` plan entry appends zero groups when TP
        #: does not divide the query heads
        self.pad_heads = (num_heads, (num_heads // num_kv_heads + 2) * head_dim)
        super().__init__(in_features, (num_heads + 2 * num_kv_heads) * head_dim, bias=bias, init_method=init_method,
                         device=device, dtype=dtype)
