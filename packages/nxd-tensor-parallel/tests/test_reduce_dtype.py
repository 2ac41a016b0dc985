"""NxD's ``reduce_dtype``: the TP layers sum their partial results (Row: the output; Column and
GQA QKV: the input gradient) in that dtype. An fp32 layer with ``reduce_dtype=bf16`` (NxDT's
``precision.parallel_layers_reduce_dtype: bf16``) must equal the sum of bf16-rounded partials,
which an fp32 sum is not; real gloo ranks, with and without sequence parallelism."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from nxd_core_parallel import parallel_state as ps
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

SEQ, BATCH, HID, OUT = 4, 2, 8, 6


def _data(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _partials(local: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.detach().contiguous())
    return parts


def _bf16_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    total = parts[0].bfloat16()
    for p in parts[1:]:
        total = total + p.bfloat16()
    return total.float()


def _seq_slice(t: torch.Tensor) -> torch.Tensor:
    return t.chunk(dist.get_world_size(), dim=0)[dist.get_rank()]


def row_body(reduce_dtype: torch.dtype, sp: bool) -> bool:
    ps.initialize_model_parallel(2)
    torch.manual_seed(0)
    layer = RowParallelLinear(HID, OUT, bias=False, input_is_parallel=True, sequence_parallel_enabled=sp,
                              reduce_dtype=reduce_dtype)
    x = _data(SEQ, BATCH, HID // 2, seed=1 + dist.get_rank())
    partial = x @ layer.weight.detach().t()  # what this rank adds to the sum
    out = layer(x)
    parts = _partials(partial)
    expected = _bf16_sum(parts) if reduce_dtype == torch.bfloat16 else sum(parts)
    expected = _seq_slice(expected) if sp else expected
    return torch.equal(out.detach(), expected)


def column_body(reduce_dtype: torch.dtype, sp: bool, qkv: bool) -> bool:
    ps.initialize_model_parallel(2)
    torch.manual_seed(0)
    if qkv:
        layer = GQAQKVColumnParallelLinear(HID, [4, 2], bias=False, gather_output=False,
                                           sequence_parallel_enabled=sp, reduce_dtype=reduce_dtype)
        weight = torch.cat([layer.weight_q, layer.weight_k, layer.weight_v]) if not layer.fuse_qkv else layer.weight_qkv
    else:
        layer = ColumnParallelLinear(HID, OUT, bias=False, gather_output=False, sequence_parallel_enabled=sp,
                                     reduce_dtype=reduce_dtype)
        weight = layer.weight
    full = _data(SEQ, BATCH, HID, seed=1)
    x = (_seq_slice(full) if sp else full).requires_grad_()
    out = layer(x)
    outs = out if isinstance(out, tuple) else (out,)
    upstream = [_data(*o.shape, seed=10 + i + dist.get_rank()) for i, o in enumerate(outs)]
    sum((o * u).sum() for o, u in zip(outs, upstream)).backward()
    partial = torch.cat(upstream, dim=-1) @ weight.detach()  # this rank's share of the input gradient
    parts = _partials(partial)
    expected = _bf16_sum(parts) if reduce_dtype == torch.bfloat16 else sum(parts)
    expected = _seq_slice(expected) if sp else expected
    return torch.equal(x.grad, expected)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("reduce_dtype", [torch.bfloat16, torch.float32])
def test_row_parallel_output_summed_in_reduce_dtype(rank_pool, reduce_dtype, sp):
    assert rank_pool(2).run(row_body, reduce_dtype, sp) == [True, True]


@pytest.mark.parametrize("qkv", [False, True])
@pytest.mark.parametrize("sp", [False, True])
def test_column_parallel_input_grad_summed_in_reduce_dtype(rank_pool, sp, qkv):
    assert rank_pool(2).run(column_body, torch.bfloat16, sp, qkv) == [True, True]


def test_bf16_sum_differs_from_fp32_here():
    """The check above can tell the two apart: these partials' fp32 and bf16 sums differ."""
    parts = [_data(SEQ, BATCH, OUT, seed=s) for s in (1, 2)]
    assert not torch.equal(_bf16_sum(parts), parts[0] + parts[1])
