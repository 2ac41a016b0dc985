"""Tensor/sequence-parallel layers: ColumnParallelLinear, RowParallelLinear, ParallelEmbedding.

Weights are initialised on the full (unsharded) shape with the default RNG, which agrees on every
rank, and each rank keeps its shard: the same seed gives the same model at any TP size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from nxd_core_parallel import parallel_state
from nxd_core_parallel.parallel_layers.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from nxd_core_parallel.parallel_layers.utils import divide, set_tensor_model_parallel_attributes

InitMethod = Callable[[torch.Tensor], object]


def default_linear_init(weight: torch.Tensor) -> None:
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


def shard_of(full: torch.Tensor, dim: int, stride: int, rank: int, size: int) -> torch.Tensor:
    """This rank's shard of ``full`` along ``dim``: ``stride`` interleaved pieces (Megatron layout)."""
    if size == 1:
        return full
    piece = divide(full.size(dim), size * stride, f"dimension {dim} of size")
    pieces = torch.split(full, piece, dim=dim)
    return torch.cat(pieces[rank::size], dim=dim)


def init_sharded_(param: torch.Tensor, full_shape: tuple[int, ...], dim: int, stride: int,
                  init_method: InitMethod, rank: int | None = None, size: int | None = None) -> None:
    """Initialise the full tensor with ``init_method`` and copy this rank's shard into ``param``."""
    if param.is_meta:
        return
    size = parallel_state.get_tensor_model_parallel_size() if size is None else size
    rank = parallel_state.get_tensor_model_parallel_rank() if rank is None else rank
    master = torch.empty(full_shape, dtype=torch.float32)
    init_method(master)
    with torch.no_grad():
        param.copy_(shard_of(master, dim, stride, rank, size).to(param.dtype))


def _tp_size_rank() -> tuple[int, int]:
    return parallel_state.get_tensor_model_parallel_size(), parallel_state.get_tensor_model_parallel_rank()


class ColumnParallelLinear(nn.Module):
    """``Y = X A^T + b`` with A's output dimension sharded over TP ranks."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        gather_output: bool = True,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device] = None,
        stride: int = 1,
        init_method: Optional[InitMethod] = None,
        sequence_parallel_enabled: bool = False,
        sequence_dimension: int = 0,
        skip_bias_add: bool = False,
    ) -> None:
        super().__init__()
        tp, _ = _tp_size_rank()
        self.input_size, self.output_size = input_size, output_size
        self.output_size_per_partition = divide(output_size, tp, "ColumnParallelLinear output_size")
        self.gather_output, self.stride = gather_output, stride
        self.sequence_parallel_enabled, self.sequence_dimension = sequence_parallel_enabled, sequence_dimension
        self.skip_bias_add = skip_bias_add
        self.init_method = init_method or default_linear_init
        if sequence_parallel_enabled and gather_output:
            raise ValueError("ColumnParallelLinear: sequence_parallel_enabled=True needs gather_output=False")
        self.weight = nn.Parameter(torch.empty(self.output_size_per_partition, input_size, dtype=dtype, device=device))
        set_tensor_model_parallel_attributes(self.weight, True, 0, stride)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size_per_partition, dtype=dtype, device=device))
            set_tensor_model_parallel_attributes(self.bias, True, 0, stride)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_sharded_(self.weight, (self.output_size, self.input_size), 0, self.stride, self.init_method)
        if self.bias is not None and not self.bias.is_meta:
            with torch.no_grad():
                self.bias.zero_()

    def forward(self, x: torch.Tensor):
        if self.sequence_parallel_enabled:
            x = gather_from_sequence_parallel_region(x, self.sequence_dimension, to_model_parallel=True)
        else:
            x = copy_to_tensor_model_parallel_region(x)
        out = F.linear(x, self.weight, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            out = gather_from_tensor_model_parallel_region(out)
        return (out, self.bias) if self.skip_bias_add else out

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, out={self.output_size} (per rank {self.output_size_per_partition}), "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel_enabled}")


class RowParallelLinear(nn.Module):
    """``Y = X A^T + b`` with A's input dimension sharded; partial outputs are summed over TP
    (all-reduce, or reduce-scatter along the sequence dimension with sequence parallelism)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        input_is_parallel: bool = False,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device] = None,
        stride: int = 1,
        init_method: Optional[InitMethod] = None,
        sequence_parallel_enabled: bool = False,
        sequence_dimension: int = 0,
        skip_bias_add: bool = False,
    ) -> None:
        super().__init__()
        tp, _ = _tp_size_rank()
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_partition = divide(input_size, tp, "RowParallelLinear input_size")
        self.input_is_parallel, self.stride = input_is_parallel, stride
        self.sequence_parallel_enabled, self.sequence_dimension = sequence_parallel_enabled, sequence_dimension
        self.skip_bias_add = skip_bias_add
        self.init_method = init_method or default_linear_init
        if sequence_parallel_enabled and not input_is_parallel:
            raise ValueError("RowParallelLinear: sequence_parallel_enabled=True needs input_is_parallel=True")
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_partition, dtype=dtype, device=device))
        set_tensor_model_parallel_attributes(self.weight, True, 1, stride)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype, device=device))
            set_tensor_model_parallel_attributes(self.bias, False, -1, 1)
            # Under SP the bias is added to a sequence shard, so its gradient is partial per rank.
            self.bias.sequence_parallel_enabled = sequence_parallel_enabled
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_sharded_(self.weight, (self.output_size, self.input_size), 1, self.stride, self.init_method)
        if self.bias is not None and not self.bias.is_meta:
            with torch.no_grad():
                self.bias.zero_()

    def forward(self, x: torch.Tensor):
        if not self.input_is_parallel:
            x = scatter_to_tensor_model_parallel_region(x)
        out = F.linear(x, self.weight)
        if self.sequence_parallel_enabled:
            out = reduce_scatter_to_sequence_parallel_region(out, self.sequence_dimension)
        else:
            out = reduce_from_tensor_model_parallel_region(out)
        if self.skip_bias_add:
            return out, self.bias
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return (f"in={self.input_size} (per rank {self.input_size_per_partition}), out={self.output_size}, "
                f"input_is_parallel={self.input_is_parallel}, sequence_parallel={self.sequence_parallel_enabled}")


class ParallelEmbedding(nn.Module):
    """Embedding table sharded over TP: by vocabulary (default) or, with
    ``shard_across_embedding=True``, by the embedding dimension."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: Optional[int] = None,
        init_method: Optional[InitMethod] = None,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device] = None,
        shard_across_embedding: bool = False,
        sequence_parallel_enabled: bool = False,
        sequence_dimension: int = 0,
    ) -> None:
        super().__init__()
        tp, rank = _tp_size_rank()
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.shard_across_embedding = shard_across_embedding
        self.sequence_parallel_enabled, self.sequence_dimension = sequence_parallel_enabled, sequence_dimension
        self.init_method = init_method or nn.init.normal_
        if shard_across_embedding:
            self.partition_dim = 1
            local = (num_embeddings, divide(embedding_dim, tp, "ParallelEmbedding embedding_dim"))
            self.vocab_start_index, self.vocab_end_index = 0, num_embeddings
        else:
            self.partition_dim = 0
            per_rank = divide(num_embeddings, tp, "ParallelEmbedding num_embeddings")
            local = (per_rank, embedding_dim)
            self.vocab_start_index, self.vocab_end_index = rank * per_rank, (rank + 1) * per_rank
        self.weight = nn.Parameter(torch.empty(*local, dtype=dtype, device=device))
        set_tensor_model_parallel_attributes(self.weight, True, self.partition_dim, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_sharded_(self.weight, (self.num_embeddings, self.embedding_dim), self.partition_dim, 1, self.init_method)
        if self.padding_idx is not None and not self.weight.is_meta:
            local = self.padding_idx - self.vocab_start_index
            if 0 <= local < self.weight.size(0):
                with torch.no_grad():
                    self.weight[local].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.shard_across_embedding:
            out = F.embedding(input_ids, self.weight, self.padding_idx)
            out = gather_from_tensor_model_parallel_region(out)
            if self.sequence_parallel_enabled:
                out = scatter_to_sequence_parallel_region(out, self.sequence_dimension)
            return out
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)
        local_pad = None
        if self.padding_idx is not None and self.vocab_start_index <= self.padding_idx < self.vocab_end_index:
            local_pad = self.padding_idx - self.vocab_start_index
        out = F.embedding(local_ids, self.weight, local_pad)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel_enabled:
            return reduce_scatter_to_sequence_parallel_region(out, self.sequence_dimension)
        return reduce_from_tensor_model_parallel_region(out)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, sharded_dim={self.partition_dim}, "
                f"sequence_parallel={self.sequence_parallel_enabled}")
