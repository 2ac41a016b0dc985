"""Each TP/SP layer against its unsharded torch twin on real gloo ranks (fp32, forward + grads)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from nxd_core_parallel import parallel_state as ps
from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    parallel_cross_entropy,
)

TOL = 1e-5
SEQ, BATCH, HID, OUT, VOCAB = 8, 2, 12, 16, 24


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def gather_tp(t: torch.Tensor, dim: int, step: int = 1) -> torch.Tensor:
    """Concatenate the TP shards of ``t`` of TP ranks ``0, step, 2*step, ...`` (test-side, plain collectives)."""
    group = ps.get_tensor_model_parallel_group()
    parts = [torch.empty_like(t) for _ in range(ps.get_tensor_model_parallel_size())]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return torch.cat(parts[::step], dim=dim)


def chunk(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.chunk(ps.get_tensor_model_parallel_size(), dim=dim)[ps.get_tensor_model_parallel_rank()]


def data(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ bodies (run on every rank)
def column_body(tp: int, sp: bool, gather: bool, seq_dim: int) -> float:
    ps.initialize_model_parallel(tp)
    torch.manual_seed(1)
    layer = ColumnParallelLinear(HID, OUT, bias=True, gather_output=gather, sequence_parallel_enabled=sp,
                                 sequence_dimension=seq_dim)
    ref = torch.nn.Linear(HID, OUT)
    with torch.no_grad():
        ref.weight.copy_(gather_tp(layer.weight, 0))
        ref.bias.copy_(data(OUT, seed=5))
        layer.bias.copy_(chunk(ref.bias, 0))
    shape = (SEQ, BATCH, HID) if seq_dim == 0 else (BATCH, SEQ, HID)
    x_full = data(*shape, seed=2).requires_grad_()
    w_full = data(*shape[:-1], OUT, seed=3)
    x = (chunk(x_full, seq_dim) if sp else x_full).detach().requires_grad_()
    out = layer(x)
    ref_out = ref(x_full)
    (ref_out * w_full).sum().backward()
    exp_out, w = (ref_out, w_full) if gather else (chunk(ref_out, -1), chunk(w_full, -1))
    (out * w).sum().backward()
    exp_xgrad = chunk(x_full.grad, seq_dim) if sp else x_full.grad
    return max(rel(out, exp_out), rel(x.grad, exp_xgrad), rel(layer.weight.grad, chunk(ref.weight.grad, 0)),
               rel(layer.bias.grad, chunk(ref.bias.grad, 0)))


def row_body(tp: int, sp: bool, input_is_parallel: bool, seq_dim: int) -> float:
    ps.initialize_model_parallel(tp)
    torch.manual_seed(1)
    layer = RowParallelLinear(HID, OUT, bias=True, input_is_parallel=input_is_parallel,
                              sequence_parallel_enabled=sp, sequence_dimension=seq_dim)
    ref = torch.nn.Linear(HID, OUT)
    with torch.no_grad():
        ref.weight.copy_(gather_tp(layer.weight, 1))
        ref.bias.copy_(data(OUT, seed=5))
        layer.bias.copy_(ref.bias)
    shape = (SEQ, BATCH, HID) if seq_dim == 0 else (BATCH, SEQ, HID)
    x_full = data(*shape, seed=2).requires_grad_()
    w_full = data(*shape[:-1], OUT, seed=3)
    x = (chunk(x_full, -1) if input_is_parallel else x_full).detach().requires_grad_()
    out = layer(x)
    ref_out = ref(x_full)
    (ref_out * w_full).sum().backward()
    exp_out, w = (chunk(ref_out, seq_dim), chunk(w_full, seq_dim)) if sp else (ref_out, w_full)
    (out * w).sum().backward()
    allreduce_sequence_parallel_gradients(layer.parameters())
    exp_xgrad = chunk(x_full.grad, -1) if input_is_parallel else x_full.grad
    return max(rel(out, exp_out), rel(x.grad, exp_xgrad), rel(layer.weight.grad, chunk(ref.weight.grad, 1)),
               rel(layer.bias.grad, ref.bias.grad))


def embedding_body(tp: int, sp: bool, across_hidden: bool) -> float:
    ps.initialize_model_parallel(tp)
    torch.manual_seed(1)
    layer = ParallelEmbedding(VOCAB, HID, padding_idx=3, shard_across_embedding=across_hidden,
                              sequence_parallel_enabled=sp, sequence_dimension=1)
    dim = 1 if across_hidden else 0
    ref = torch.nn.Embedding(VOCAB, HID, padding_idx=3)
    with torch.no_grad():
        ref.weight.copy_(gather_tp(layer.weight, dim))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(4))
    ids[0, 0] = 3
    w_full = data(BATCH, SEQ, HID, seed=3)
    out = layer(ids)
    ref_out = ref(ids)
    (ref_out * w_full).sum().backward()
    exp_out, w = (chunk(ref_out, 1), chunk(w_full, 1)) if sp else (ref_out, w_full)
    (out * w).sum().backward()
    assert float(ref.weight[3].abs().sum()) == 0.0, "padding row must start at zero"
    return max(rel(out, exp_out), rel(layer.weight.grad, chunk(ref.weight.grad, dim)))


def cross_entropy_body(tp: int, smoothing: float) -> float:
    ps.initialize_model_parallel(tp)
    logits_full = data(BATCH, SEQ, VOCAB, seed=7).mul_(3).requires_grad_()
    target = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(8))
    weights = data(BATCH, SEQ, seed=9)
    ref = F.cross_entropy(logits_full.reshape(-1, VOCAB), target.reshape(-1), reduction="none",
                          label_smoothing=smoothing).view(BATCH, SEQ)
    (ref * weights).sum().backward()
    logits = chunk(logits_full, -1).detach().requires_grad_()
    loss = parallel_cross_entropy(logits, target, label_smoothing=smoothing)
    (loss * weights).sum().backward()
    return max(rel(loss, ref), rel(logits.grad, chunk(logits_full.grad, -1)))


def gqa_body(tp: int, q_heads: int, kv_heads: int, multiplier: int, fuse: bool, gather: bool, sp: bool) -> float:
    ps.initialize_model_parallel(tp)
    head = 4
    q_size, kv_size = q_heads * head, kv_heads * head
    torch.manual_seed(1)
    layer = GQAQKVColumnParallelLinear(HID, [q_size, kv_size], bias=True, gather_output=gather,
                                       sequence_parallel_enabled=sp, sequence_dimension=1,
                                       kv_size_multiplier=multiplier, fuse_qkv=fuse)
    unique = tp // multiplier
    if fuse:
        wq, wk, wv = torch.split(layer.weight_qkv.detach(), list(layer.weight_qkv.fused_splits))
    else:
        wq, wk, wv = layer.weight_q.detach(), layer.weight_k.detach(), layer.weight_v.detach()
    # Megatron's layout: KV piece j lives on the `multiplier` neighbouring ranks j*m .. j*m + m - 1.
    piece = ps.get_tensor_model_parallel_rank() // multiplier
    refs = [torch.nn.Linear(HID, n) for n in (q_size, kv_size, kv_size)]
    with torch.no_grad():
        for ref, w, step in zip(refs, (wq, wk, wv), (1, multiplier, multiplier)):
            ref.weight.copy_(gather_tp(w, 0, step))
            ref.bias.copy_(data(ref.bias.numel(), seed=ref.bias.numel()))
        biases = [chunk(refs[0].bias, 0)] + [r.bias.chunk(unique)[piece] for r in refs[1:]]
        if fuse:
            layer.bias_qkv.copy_(torch.cat(biases))
        else:
            for name, b in zip("qkv", biases):
                getattr(layer, f"bias_{name}").copy_(b)
    x_full = data(BATCH, SEQ, HID, seed=2).requires_grad_()
    x = (chunk(x_full, 1) if sp else x_full).detach().requires_grad_()
    outs = layer(x)
    ref_outs = [r(x_full) for r in refs]
    # Each TP rank sees its KV piece; the unsharded equivalent repeats each piece `multiplier` times in a row.
    expanded = [ref_outs[0]] + [o.unflatten(-1, (unique, -1)).repeat_interleave(multiplier, dim=-2).flatten(-2)
                                for o in ref_outs[1:]]
    ws = [data(BATCH, SEQ, o.size(-1), seed=10 + i) for i, o in enumerate(expanded)]
    if gather:
        expanded, ws = ref_outs, [w[..., : o.size(-1)] for w, o in zip(ws, ref_outs)]
        local_ws = ws
    else:
        local_ws = [chunk(w, -1) for w in ws]
    sum((o * w).sum() for o, w in zip(expanded, ws)).backward()
    sum((o * w).sum() for o, w in zip(outs, local_ws)).backward()
    diffs = [rel(x.grad, chunk(x_full.grad, 1) if sp else x_full.grad)]
    for out, exp in zip(outs, expanded):
        diffs.append(rel(out, exp if gather else chunk(exp, -1)))
    exp_grads = [chunk(refs[0].weight.grad, 0)] + [r.weight.grad.chunk(unique)[piece] for r in refs[1:]]
    exp_bgrads = [chunk(refs[0].bias.grad, 0)] + [r.bias.grad.chunk(unique)[piece] for r in refs[1:]]
    if fuse:
        got = torch.split(layer.weight_qkv.grad, list(layer.weight_qkv.fused_splits))
        got_b = torch.split(layer.bias_qkv.grad, list(layer.weight_qkv.fused_splits))
    else:
        got = [getattr(layer, f"weight_{n}").grad for n in "qkv"]
        got_b = [getattr(layer, f"bias_{n}").grad for n in "qkv"]
    diffs += [rel(g, e) for g, e in zip(got, exp_grads)] + [rel(g, e) for g, e in zip(got_b, exp_bgrads)]
    return max(diffs)


def rms_norm_body(tp: int, sp: bool) -> float:
    ps.initialize_model_parallel(tp)
    norm = RMSNorm(HID, eps=1e-5, sequence_parallel_enabled=sp)
    with torch.no_grad():
        norm.weight.copy_(data(HID, seed=1))
    x_full = data(BATCH, SEQ, HID, seed=2).requires_grad_()
    w_full = data(BATCH, SEQ, HID, seed=3)
    ref_w = norm.weight.detach().clone().requires_grad_()
    ref = ref_w * (x_full * torch.rsqrt(x_full.pow(2).mean(-1, keepdim=True) + 1e-5))
    (ref * w_full).sum().backward()
    x, w = (chunk(x_full, 1), chunk(w_full, 1)) if sp else (x_full, w_full)
    x = x.detach().requires_grad_()
    out = norm(x)
    (out * w).sum().backward()
    allreduce_sequence_parallel_gradients(norm.parameters())
    exp_x = chunk(x_full.grad, 1) if sp else x_full.grad
    return max(rel(out, chunk(ref, 1) if sp else ref), rel(x.grad, exp_x), rel(norm.weight.grad, ref_w.grad))


def same_model_any_tp_body(tp: int, stride: int) -> torch.Tensor:
    """Same seed -> same full weights whatever the TP size (strided shards interleave)."""
    ps.initialize_model_parallel(tp)
    torch.manual_seed(11)
    layer = ColumnParallelLinear(HID, OUT, stride=stride)
    parts = gather_tp(layer.weight, 0).chunk(tp)
    return torch.cat([parts[r].chunk(stride)[s] for s in range(stride) for r in range(tp)])


# ------------------------------------------------------------------ tests
MAX_SEEN: dict[str, float] = {}


def check(name: str, values: list[float]) -> None:
    worst = max(values)
    MAX_SEEN[name] = worst
    print(f"{name}: max relative diff {worst:.3e}")
    assert worst < TOL, f"{name}: {worst} >= {TOL}"


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("sp,gather,seq_dim", [(False, True, 0), (False, False, 0), (True, False, 0), (True, False, 1)])
def test_column_parallel_linear(rank_pool, tp, sp, gather, seq_dim):
    check(f"column tp={tp} sp={sp}", rank_pool(2).run(column_body, tp, sp, gather, seq_dim))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("sp,input_is_parallel,seq_dim", [(False, False, 0), (False, True, 0), (True, True, 0), (True, True, 1)])
def test_row_parallel_linear(rank_pool, tp, sp, input_is_parallel, seq_dim):
    check(f"row tp={tp} sp={sp}", rank_pool(2).run(row_body, tp, sp, input_is_parallel, seq_dim))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("across_hidden", [False, True])
def test_parallel_embedding(rank_pool, tp, sp, across_hidden):
    check(f"embedding tp={tp} sp={sp}", rank_pool(2).run(embedding_body, tp, sp, across_hidden))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_parallel_cross_entropy(rank_pool, tp, smoothing):
    check(f"cross_entropy tp={tp}", rank_pool(2).run(cross_entropy_body, tp, smoothing))


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("gather,sp", [(False, False), (True, False), (False, True)])
def test_gqa_qkv_kv_heads_below_tp(rank_pool, fuse, gather, sp):
    # 1 KV head at TP=2: kv_size_multiplier=2 replicates it on both ranks.
    check("gqa tp=2 kv=1", rank_pool(2).run(gqa_body, 2, 4, 1, 2, fuse, gather, sp))


@pytest.mark.parametrize("fuse", [True, False])
def test_gqa_qkv_no_replication(rank_pool, fuse):
    check("gqa tp=2 kv=2", rank_pool(2).run(gqa_body, 2, 4, 2, 1, fuse, False, False))


@pytest.mark.parametrize("sp", [False, True])
def test_rms_norm(rank_pool, sp):
    check("rms_norm", rank_pool(2).run(rms_norm_body, 2, sp))


@pytest.mark.parametrize("stride", [1, 2])
def test_init_is_independent_of_tp(rank_pool, stride):
    one = rank_pool(2).run(same_model_any_tp_body, 1, stride)[0]
    two = rank_pool(2).run(same_model_any_tp_body, 2, stride)[0]
    assert torch.equal(one, two)
    if stride == 2:  # rank 0 holds pieces 0 and 2 of 4, not the first half
        first_half = rank_pool(2).run(_rank0_shard, 2)[0]
        assert not torch.equal(first_half, one[: OUT // 2])


def _rank0_shard(tp: int) -> torch.Tensor:
    ps.initialize_model_parallel(tp)
    torch.manual_seed(11)
    return ColumnParallelLinear(HID, OUT, stride=2).weight.detach().clone()


# TP=4 (4 ranks on 2 cores: only a few cases)
@pytest.mark.slow
@pytest.mark.four_ranks
def test_tp4_layers(rank_pool):
    pool = rank_pool(4)
    check("column tp=4 sp", pool.run(column_body, 4, True, False, 1))
    check("row tp=4 sp", pool.run(row_body, 4, True, True, 1))
    check("embedding tp=4", pool.run(embedding_body, 4, False, False))
    check("cross_entropy tp=4", pool.run(cross_entropy_body, 4, 0.1))
    # 2 KV heads at TP=4: each replicated twice on neighbouring ranks (KV-shared groups {0,1} and {2,3}).
    check("gqa tp=4 kv=2", pool.run(gqa_body, 4, 8, 2, 2, True, False, False))
    check("gqa tp=4 kv=2 gather unfused", pool.run(gqa_body, 4, 8, 2, 2, False, True, False))
    assert pool.run(_kv_groups, 4) == [[[0, 1], [0, 1, 2, 3]]] * 2 + [[[2, 3], [0, 1, 2, 3]]] * 2


def _kv_groups(tp: int) -> list[list[int]]:
    ps.initialize_model_parallel(tp)
    return [ps.get_kv_shared_group(m, as_list=True) for m in (2, 4)]
