"""NxD's sequence-parallel layout: with no ``sequence_dimension`` the embedding hands out
``[s/tp, b, h]`` (NxD transposes ``[b, s, h]`` and splits the sequence, dim 0), and the linear
layers gather / reduce-scatter dim 0. A block written that way against its unsharded twin on 2 gloo
ranks (fp32, forward + grads), also with the TP group passed as ``tensor_model_parallel_group=``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nxd_core_parallel import parallel_state as ps
from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear
from nxd_tensor_parallel.parallel_layers.mappings import gather_from_sequence_parallel_region

TOL = 1e-5
BATCH, SEQ, HID, FFN, VOCAB = 2, 8, 12, 16, 24


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


class Block(torch.nn.Module):
    def __init__(self, sp: bool, group) -> None:
        super().__init__()
        kw = {"sequence_parallel_enabled": sp, "tensor_model_parallel_group": group}
        self.embed = ParallelEmbedding(VOCAB, HID, **kw)
        self.up = ColumnParallelLinear(HID, FFN, gather_output=False, **kw)
        self.down = RowParallelLinear(FFN, HID, input_is_parallel=True, **kw)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)  # [s/tp, b, h] under SP, else [b, s, h]
        return h + self.down(F.gelu(self.up(h)))


def plain_forward(block: Block, ids: torch.Tensor) -> torch.Tensor:
    """The twin's math with plain torch ops (its layers would consult the global TP group)."""
    h = F.embedding(ids, block.embed.weight)
    up = F.linear(h, block.up.weight, block.up.bias)
    return h + F.linear(F.gelu(up), block.down.weight, block.down.bias)


def body(tp: int, sp: bool, explicit_group: bool) -> float:
    ps.destroy_model_parallel()
    torch.manual_seed(5)
    ref = Block(False, None)  # the unsharded twin: weights are drawn on the full shape, so they agree
    ps.initialize_model_parallel(tp)
    group = ps.get_tensor_model_parallel_group() if explicit_group else None
    torch.manual_seed(5)
    block = Block(sp, group)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    out = block(ids)
    ref_out = plain_forward(ref, ids)
    if sp:
        assert out.shape == (SEQ // tp, BATCH, HID), out.shape
        out = gather_from_sequence_parallel_region(out, 0, to_model_parallel=False).transpose(0, 1)
    ref_out.square().sum().backward()
    out.square().sum().backward()
    allreduce_sequence_parallel_gradients(block.parameters())
    rank = ps.get_tensor_model_parallel_rank()
    errors = [rel(out, ref_out)]
    for name, shard_dim in (("embed.weight", 0), ("up.weight", 0), ("down.weight", 1), ("down.bias", None)):
        local = dict(block.named_parameters())[name].grad
        full = dict(ref.named_parameters())[name].grad
        expected = full if shard_dim is None else full.chunk(tp, dim=shard_dim)[rank]
        errors.append(rel(local, expected))
    return max(errors)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("explicit_group", [False, True])
def test_nxd_sequence_layout_matches_unsharded(rank_pool, sp, explicit_group):
    errors = rank_pool(2).run(body, 2, sp, explicit_group)
    assert max(errors) < TOL, errors


def test_rank_ordering_is_refused_not_ignored():
    with pytest.raises(ValueError, match="rank_ordering"):
        RowParallelLinear(4, 4, rank_ordering=[1, 0])
