"""Tensor/sequence-parallel layers: ColumnParallelLinear, RowParallelLinear, ParallelEmbedding.

Weights are initialised on the full (unsharded) shape with the default RNG, which agrees on every
rank, and each rank keeps its shard: the same seed gives the same model at any TP size.

``pad=True`` (NxD): a sharded size not divisible by the TP size is padded at its end with zero
rows/columns (the real ones are initialised exactly as without padding). The padding never shows:
gathered outputs are cut back to the real size, the padded rows get no gradient, and the weight is
marked (``mark_padding``) so checkpoints, resharding and exports hold the real size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from nxd.parallel import ParallelContext, dim_group, dim_rank, dim_size, resolve_context
from nxd_tensor_parallel.parallel_layers import comm
from nxd_tensor_parallel.parallel_layers.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from nxd_tensor_parallel.parallel_layers.utils import (
    divide,
    get_padding_length,
    mark_padding,
    set_tensor_model_parallel_attributes,
)

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
                  init_method: InitMethod, rank: int, size: int, pad: int = 0) -> None:
    """Initialise the full tensor with ``init_method`` and copy shard ``rank`` of ``size`` into
    ``param``; ``pad`` zero entries are appended along ``dim`` first (``pad=True`` layers)."""
    if param.is_meta:
        return
    master = torch.empty(full_shape, dtype=torch.float32)
    init_method(master)
    if pad:
        widths = [0, 0] * (master.dim() - 1 - dim) + [0, pad]
        master = F.pad(master, widths)
    with torch.no_grad():
        param.copy_(shard_of(master, dim, stride, rank, size).to(param.dtype))


def _tp_size_rank(group: Any, context: ParallelContext | None) -> tuple[int, int]:
    """TP size and rank: of ``group`` (NxD's ``tensor_model_parallel_group=``) or of the context's TP group."""
    if group is not None:
        return comm.group_size(group), comm.group_rank(group)
    return dim_size(context, "tp"), dim_rank(context, "tp")


def tensor_parallel_group_of(layer: nn.Module) -> Any:
    """The TP group a layer works over: its explicit ``tensor_model_parallel_group=``, else its
    context's TP group (``None`` without model parallelism)."""
    group = getattr(layer, "tensor_parallel_group", None)
    if group is None:
        group = getattr(layer, "tensor_model_parallel_group", None)
    return group if group is not None else dim_group(getattr(layer, "parallel_context", None), "tp")


def tensor_parallel_size_rank_of(layer: nn.Module) -> tuple[int, int]:
    """``(size, rank)`` of :func:`tensor_parallel_group_of` (``(1, 0)`` without model parallelism)."""
    group = tensor_parallel_group_of(layer)
    return (comm.group_size(group), comm.group_rank(group)) if group is not None else (1, 0)


def column_parallel_input(x: torch.Tensor, layer: nn.Module, group: Any,
                          reduce_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``x`` as a column-parallel ``layer`` (or an adapter beside it) multiplies it: gathered over
    the sequence under the layer's sequence parallelism, else through the TP copy region; either
    way its gradient is summed over TP (in ``reduce_dtype`` when given)."""
    if layer.sequence_parallel_enabled:
        return gather_from_sequence_parallel_region(x, layer.sequence_dimension, to_model_parallel=True,
                                                    process_group=group, reduce_dtype=reduce_dtype)
    return copy_to_tensor_model_parallel_region(x, process_group=group, reduce_dtype=reduce_dtype)


#: Named in a layer's size error: with pad=True a size not divisible by TP is padded inside.
_PAD_HINT = "; pass pad=True to pad it with zero rows that never show (NxD's option)"


def _pad_length(layer: str, pad: bool, size: int, tp: int, stride: int = 1, alignment: int = 1) -> int:
    """Entries ``pad=True`` appends to ``size`` (0 without ``pad``: ``divide`` then names the size)."""
    if not pad:
        return 0
    extra = get_padding_length(size, tp, alignment)
    if extra and stride != 1:
        raise ValueError(f"{layer}(pad=True, stride={stride}): padding a strided (interleaved) weight is ambiguous; "
                         "use stride=1 or a size divisible by tensor_parallel_size x stride")
    return extra


def _check_nxd_options(layer: str, rank_ordering: Any) -> None:
    """NxD options nxd does not implement are refused, never ignored."""
    if rank_ordering is not None and list(rank_ordering) != sorted(rank_ordering):
        raise ValueError(f"{layer}(rank_ordering={rank_ordering!r}): a custom shard-to-rank order is not supported "
                         "by nxd; leave rank_ordering=None")


class LocalLinear:
    """The matmul a sharded layer runs on this rank's weight shard: ``F.linear``. A low-precision
    model transform (nxd-fp8) swaps the layer's class to a subclass that overrides it, so the
    communication around the matmul (gathers, reductions, sequence parallelism) stays as it is."""

    def local_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.linear(x, weight, bias)


class _ShardedLinear(LocalLinear, nn.Module):
    """What the column and row layers share: the weight's sharded init (along ``weight_shard_dim``)
    and NxD's re-init name."""

    weight_shard_dim: int

    def _setup(self, kind: str, input_size: int, output_size: int, stride: int, init_method: Optional[InitMethod],
               sequence_parallel_enabled: bool, sequence_dimension: Optional[int], keep_master_weight: bool,
               skip_bias_add: bool, pad: bool, pad_length: Callable[[int], int], group: Any,
               reduce_dtype: torch.dtype, rank_ordering: Optional[list], context: ParallelContext | None) -> int:
        """The options both layers take, NxD's checks on them, and the padded size of the sharded
        dimension per rank (``pad_length(tp)`` is its padding)."""
        self.tensor_parallel_group = group
        # NxD-style construction (no context=) builds for the current context: the one fallback
        self.parallel_context = resolve_context(context)
        tp, _ = _tp_size_rank(group, self.parallel_context)
        _check_nxd_options(kind, rank_ordering)
        self.input_size, self.output_size = input_size, output_size
        sharded = output_size if self.weight_shard_dim == 0 else input_size
        self.pad_size = pad_length(tp)
        self.stride, self.pad = stride, pad
        self.sequence_parallel_enabled = sequence_parallel_enabled
        # NxD: None means 0 (the [s, b, h] layout) when sequence parallelism is on
        self.sequence_dimension = 0 if sequence_dimension is None else int(sequence_dimension)
        self.skip_bias_add, self.keep_master_weight, self.reduce_dtype = skip_bias_add, keep_master_weight, reduce_dtype
        self.init_method = init_method or default_linear_init
        side = "output_size" if self.weight_shard_dim == 0 else "input_size"
        return divide(sharded + self.pad_size, tp, f"{kind} {side}", _PAD_HINT)

    def reset_parameters(self) -> None:
        size, rank = _tp_size_rank(self.tensor_parallel_group, self.parallel_context)
        init_sharded_(self.weight, (self.output_size, self.input_size), self.weight_shard_dim, self.stride,
                      self.init_method, rank, size, pad=self.pad_size)
        if self.bias is not None and not self.bias.is_meta:
            with torch.no_grad():
                self.bias.zero_()

    def init_weight_cpu(self) -> None:
        """NxD's name for re-initialising the weights (e.g. after meta-device init)."""
        self.reset_parameters()


class ColumnParallelLinear(_ShardedLinear):
    """``Y = X A^T + b`` with A's output dimension sharded over TP ranks."""

    weight_shard_dim = 0

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
        sequence_dimension: Optional[int] = None,
        keep_master_weight: bool = False,
        skip_bias_add: bool = False,
        pad: bool = False,
        pad_alignment_size_per_rank: int = 1,
        keep_padded_output: bool = False,
        tensor_model_parallel_group: Any = None,
        reduce_dtype: torch.dtype = torch.float32,
        rank_ordering: Optional[list] = None,
        context: ParallelContext | None = None,
    ) -> None:
        super().__init__()
        self.output_size_per_partition = self._setup(
            "ColumnParallelLinear", input_size, output_size, stride, init_method, sequence_parallel_enabled,
            sequence_dimension, keep_master_weight, skip_bias_add, pad,
            lambda tp: _pad_length("ColumnParallelLinear", pad, output_size, tp, stride, pad_alignment_size_per_rank),
            tensor_model_parallel_group, reduce_dtype, rank_ordering, context)
        self.gather_output, self.keep_padded_output = gather_output, keep_padded_output
        if sequence_parallel_enabled and gather_output:
            raise ValueError("ColumnParallelLinear: sequence_parallel_enabled=True needs gather_output=False")
        self.weight = nn.Parameter(torch.empty(self.output_size_per_partition, input_size, dtype=dtype, device=device))
        set_tensor_model_parallel_attributes(self.weight, True, 0, stride)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size_per_partition, dtype=dtype, device=device))
            set_tensor_model_parallel_attributes(self.bias, True, 0, stride)
        else:
            self.register_parameter("bias", None)
        if self.pad_size:
            for p in (self.weight, self.bias):
                if p is not None:
                    mark_padding(p, output_size, pad_alignment_size_per_rank)
        self.reset_parameters()

    def forward(self, x: torch.Tensor):
        group = tensor_parallel_group_of(self)
        x = column_parallel_input(x, self, group, self.reduce_dtype)
        out = self.local_linear(x, self.weight, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            out = gather_from_tensor_model_parallel_region(out, process_group=group)
            if self.pad_size and not self.keep_padded_output:
                # contiguous, as NxD's output is: NxD scripts .view() it
                out = out.narrow(-1, 0, self.output_size).contiguous()
        return (out, self.bias) if self.skip_bias_add else out

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, out={self.output_size} (per rank {self.output_size_per_partition}), "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel_enabled}")


class RowParallelLinear(_ShardedLinear):
    """``Y = X A^T + b`` with A's input dimension sharded; partial outputs are summed over TP
    (all-reduce, or reduce-scatter along the sequence dimension with sequence parallelism)."""

    weight_shard_dim = 1

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
        sequence_dimension: Optional[int] = None,
        keep_master_weight: bool = False,
        skip_bias_add: bool = False,
        pad: bool = False,
        reduce_output: bool = True,
        tensor_model_parallel_group: Any = None,
        reduce_dtype: torch.dtype = torch.float32,
        tile_cc: bool = False,
        rank_ordering: Optional[list] = None,
        context: ParallelContext | None = None,
    ) -> None:
        super().__init__()
        self.input_size_per_partition = self._setup(
            "RowParallelLinear", input_size, output_size, stride, init_method, sequence_parallel_enabled,
            sequence_dimension, keep_master_weight, skip_bias_add, pad,
            lambda tp: _pad_length("RowParallelLinear", pad, input_size, tp, stride),
            tensor_model_parallel_group, reduce_dtype, rank_ordering, context)
        self.input_is_parallel = input_is_parallel
        # reduce_output=False (NxD): return this rank's partial sum; the caller reduces it.
        self.reduce_output = reduce_output
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
        if self.pad_size:
            mark_padding(self.weight, input_size)
        self.reset_parameters()

    def forward(self, x: torch.Tensor):
        group = tensor_parallel_group_of(self)
        if not self.input_is_parallel:
            if self.pad_size:
                x = F.pad(x, (0, self.pad_size))
            x = scatter_to_tensor_model_parallel_region(x, process_group=group)
        out = self.local_linear(x, self.weight)
        if not self.reduce_output:
            pass
        elif self.sequence_parallel_enabled:
            out = reduce_scatter_to_sequence_parallel_region(out, self.sequence_dimension, process_group=group,
                                                             reduce_dtype=self.reduce_dtype)
        else:
            out = reduce_from_tensor_model_parallel_region(out, process_group=group, reduce_dtype=self.reduce_dtype)
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
        max_norm: Optional[float] = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        init_method: Optional[InitMethod] = None,
        device: Optional[torch.device] = None,
        dtype: torch.dtype = torch.float32,
        shard_across_embedding: bool = False,
        pad: bool = False,
        sequence_parallel_enabled: bool = False,
        tensor_model_parallel_group: Any = None,
        use_spmd_rank: bool = False,
        sequence_dimension: Optional[int] = None,
        tile_cc: bool = False,
        rank_ordering: Optional[list] = None,
        collect_output: bool = True,
        context: ParallelContext | None = None,
        pad_alignment_size_per_rank: int = 1,
    ) -> None:
        super().__init__()
        self.tensor_model_parallel_group = tensor_model_parallel_group
        self.parallel_context = resolve_context(context)
        tp, rank = _tp_size_rank(tensor_model_parallel_group, self.parallel_context)
        _check_nxd_options("ParallelEmbedding", rank_ordering)
        self.pad_size = _pad_length("ParallelEmbedding", pad, embedding_dim if shard_across_embedding else num_embeddings,
                                    tp, alignment=pad_alignment_size_per_rank)
        if max_norm is not None or sparse:
            raise ValueError("ParallelEmbedding: max_norm and sparse=True are not supported by nxd (as NxD on Neuron); "
                             "leave max_norm=None, sparse=False")
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.norm_type, self.scale_grad_by_freq, self.collect_output = norm_type, scale_grad_by_freq, collect_output
        self.shard_across_embedding, self.pad = shard_across_embedding, pad
        # None (NxD's default): the output is transposed to NxD's [s, b, h] and split on dim 0 under
        # sequence parallelism; an explicit dimension splits the [b, s, h] output on that dimension.
        self.sequence_parallel_enabled, self.sequence_dimension = sequence_parallel_enabled, sequence_dimension
        self.init_method = init_method or nn.init.normal_
        if shard_across_embedding:
            self.partition_dim = 1
            local = (num_embeddings, divide(embedding_dim + self.pad_size, tp, "ParallelEmbedding embedding_dim", _PAD_HINT))
            self.vocab_start_index, self.vocab_end_index = 0, num_embeddings
        else:
            self.partition_dim = 0
            per_rank = divide(num_embeddings + self.pad_size, tp, "ParallelEmbedding num_embeddings", _PAD_HINT)
            local = (per_rank, embedding_dim)
            self.vocab_start_index, self.vocab_end_index = rank * per_rank, (rank + 1) * per_rank
        self.weight = nn.Parameter(torch.empty(*local, dtype=dtype, device=device))
        set_tensor_model_parallel_attributes(self.weight, True, self.partition_dim, 1)
        if self.pad_size:
            mark_padding(self.weight, embedding_dim if shard_across_embedding else num_embeddings,
                         pad_alignment_size_per_rank)
        self.reset_parameters()

    def init_weight_cpu(self) -> None:
        """NxD's name for re-initialising the weights (e.g. after meta-device init)."""
        self.reset_parameters()

    def reset_parameters(self) -> None:
        size, rank = _tp_size_rank(self.tensor_model_parallel_group, self.parallel_context)
        init_sharded_(self.weight, (self.num_embeddings, self.embedding_dim), self.partition_dim, 1, self.init_method,
                      rank, size, pad=self.pad_size)
        if self.padding_idx is not None and not self.weight.is_meta:
            local = self.padding_idx - self.vocab_start_index
            if 0 <= local < self.weight.size(0):
                with torch.no_grad():
                    self.weight[local].zero_()

    def sequence_layout(self, out: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``out`` in the layout split under sequence parallelism, and the dimension split (what
        an adapter added to this layer's output, e.g. LoRA, follows)."""
        if self.sequence_dimension is None:
            return out.transpose(0, 1).contiguous(), 0  # [b, s, h] -> NxD's [s, b, h]
        return out, self.sequence_dimension

    def _embed(self, ids: torch.Tensor, padding_idx: Optional[int]) -> torch.Tensor:
        return F.embedding(ids, self.weight, padding_idx, None, self.norm_type, self.scale_grad_by_freq)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.shard_across_embedding:
            out = self._embed(input_ids, self.padding_idx)
            if not self.collect_output:
                return out
            group = tensor_parallel_group_of(self)
            out = gather_from_tensor_model_parallel_region(out, process_group=group)
            if self.pad_size:
                out = out.narrow(-1, 0, self.embedding_dim)
            if self.sequence_parallel_enabled:
                out, dim = self.sequence_layout(out)
                out = scatter_to_sequence_parallel_region(out, dim, process_group=group)
            return out
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)
        local_pad = None
        if self.padding_idx is not None and self.vocab_start_index <= self.padding_idx < self.vocab_end_index:
            local_pad = self.padding_idx - self.vocab_start_index
        out = self._embed(local_ids, local_pad)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if not self.collect_output:
            return out
        group = tensor_parallel_group_of(self)  # the group of the collective that sums the shards
        if self.sequence_parallel_enabled:
            out, dim = self.sequence_layout(out)
            return reduce_scatter_to_sequence_parallel_region(out, dim, process_group=group)
        return reduce_from_tensor_model_parallel_region(out, process_group=group)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, sharded_dim={self.partition_dim}, "
                f"sequence_parallel={self.sequence_parallel_enabled}")
