"""``pad=True`` (NxD): sizes not divisible by TP are padded inside the layer and never show.

Each padded layer at TP=2 against its unpadded torch twin on real gloo ranks (fp32, forward and
grads of the real rows), the padding rows staying zero with zero gradient, and the vocabulary-
parallel loss over a padded vocabulary (padding masked to -inf) equal to torch's cross-entropy
over the real one, label smoothing included.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from nxd_core_parallel import parallel_state as ps
from nxd_tensor_parallel.parallel_layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    get_padding_length,
    mask_vocab_padding,
    parallel_cross_entropy,
)

TOL = 1e-5
BATCH, SEQ, HID, ODD = 2, 6, 8, 13  # ODD: not divisible by TP=2 (padded to 14)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def gather(t: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(ps.get_tensor_model_parallel_size())]
    dist.all_gather(parts, t.detach().contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=dim)


def data(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def padded_layers_body(tp: int) -> dict[str, float]:
    ps.initialize_model_parallel(tp)
    errors: dict[str, float] = {}
    x_full = data(BATCH, SEQ, HID, seed=1)
    ids = torch.randint(0, ODD, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    ids[0, 0] = ODD - 1  # the last real row sits next to the padding
    with pytest.raises(ValueError, match="stride"):
        ColumnParallelLinear(HID, ODD, stride=2, pad=True)  # interleaved + padded: ambiguous, refused

    # ColumnParallelLinear(pad=True, gather_output=True): output cut back to the real size
    torch.manual_seed(3)
    col = ColumnParallelLinear(HID, ODD, bias=True, gather_output=True, pad=True)
    torch.manual_seed(3)
    ref = torch.nn.Linear(HID, ODD)
    ref.weight.data.copy_(gather(col.weight, 0)[:ODD])
    with torch.no_grad():
        ref.bias.normal_()
        col.bias.copy_(F.pad(ref.bias, (0, col.pad_size)).chunk(tp)[ps.get_tensor_model_parallel_rank()])
    w = data(BATCH, SEQ, ODD, seed=4)
    x = x_full.clone().requires_grad_()
    xr = x_full.clone().requires_grad_()
    out = col(x)
    assert out.shape[-1] == ODD, out.shape
    assert out.is_contiguous()  # NxD scripts .view() it
    out.view(-1)
    (out * w).sum().backward()
    (ref(xr) * w).sum().backward()
    full_grad = gather(col.weight.grad, 0)
    errors["column out"] = rel(out, ref(x_full))
    errors["column grads"] = max(rel(x.grad, xr.grad), rel(full_grad[:ODD], ref.weight.grad))
    errors["column pad rows"] = float(gather(col.weight, 0)[ODD:].abs().sum() + full_grad[ODD:].abs().sum())

    # RowParallelLinear(pad=True, input_is_parallel=False): the input is padded before the split
    torch.manual_seed(5)
    row = RowParallelLinear(ODD, HID, bias=False, input_is_parallel=False, pad=True)
    ref = torch.nn.Linear(ODD, HID, bias=False)
    ref.weight.data.copy_(gather(row.weight, 1)[:, :ODD])
    x_full = data(BATCH, SEQ, ODD, seed=6)
    x, xr = x_full.clone().requires_grad_(), x_full.clone().requires_grad_()
    w = data(BATCH, SEQ, HID, seed=7)
    (row(x) * w).sum().backward()
    (ref(xr) * w).sum().backward()
    errors["row out"] = rel(row(x_full), ref(x_full))
    errors["row grads"] = max(rel(x.grad, xr.grad), rel(gather(row.weight.grad, 1)[:, :ODD], ref.weight.grad))

    # ParallelEmbedding(pad=True), sharded by vocabulary and by the embedding dimension
    for across, size in ((False, ODD), (True, HID + 1)):
        torch.manual_seed(8)
        emb = ParallelEmbedding(ODD, size if across else HID, shard_across_embedding=across, pad=True)
        dim = 1 if across else 0
        full = gather(emb.weight, dim)
        ref = torch.nn.Embedding(ODD, size if across else HID)
        ref.weight.data.copy_(full[:, :size] if across else full[:ODD])
        w = data(BATCH, SEQ, ref.weight.shape[1], seed=9)
        out = emb(ids)
        (out * w).sum().backward()
        (ref(ids) * w).sum().backward()
        grad = gather(emb.weight.grad, dim)
        errors[f"embedding across={across}"] = max(rel(out, ref(ids)),
                                                   rel(grad[:, :size] if across else grad[:ODD], ref.weight.grad))
        padding = full[:, size:] if across else full[ODD:]
        errors[f"embedding across={across} pad rows"] = float(padding.abs().sum())

    # padded vocabulary: mask_vocab_padding + parallel_cross_entropy == torch over the real vocabulary
    logits_full = data(BATCH, SEQ, ODD, seed=10).mul_(3)
    target = torch.randint(0, ODD, (BATCH, SEQ), generator=torch.Generator().manual_seed(11))
    padded = F.pad(logits_full, (0, get_padding_length(ODD, tp)))
    for smoothing in (0.0, 0.1):
        ref_in = logits_full.clone().requires_grad_()
        ref_loss = F.cross_entropy(ref_in.reshape(-1, ODD), target.reshape(-1), reduction="none",
                                   label_smoothing=smoothing)
        ref_loss.sum().backward()
        local = padded.chunk(tp, dim=-1)[ps.get_tensor_model_parallel_rank()].clone().requires_grad_()
        loss = parallel_cross_entropy(mask_vocab_padding(local, ODD), target, label_smoothing=smoothing)
        loss.sum().backward()
        grad = gather(local.grad, -1)
        errors[f"loss smoothing={smoothing}"] = max(rel(loss.reshape(-1), ref_loss), rel(grad[..., :ODD], ref_in.grad))
        errors[f"loss smoothing={smoothing} pad grad"] = float(grad[..., ODD:].abs().sum())
    return errors


def test_padded_layers_and_loss_hide_the_padding(rank_pool):
    results = rank_pool(2).run(padded_layers_body, 2)
    worst = {k: max(r[k] for r in results) for k in results[0]}
    print(f"\npad=True at TP=2, vocabulary/size {ODD}: {worst}")
    bad = {k: v for k, v in worst.items() if v > TOL}
    assert not bad, bad


def test_padding_length_follows_nxd():
    assert get_padding_length(50257, 8) == 7 and get_padding_length(64, 8) == 0
    assert get_padding_length(101, 2, alignment_per_rank=4) == 3  # shards of 52 (a multiple of 4)
