"""NxD's ``pad_model``: 3 attention heads at TP=2, padded to 4, give the unpadded model's logits.

The model follows NxD's recipe (local heads = ``divide(n + get_number_of_extra_heads(n, tp), tp)``).
The same seed builds it in this process without TP (the single-process oracle) and on 2 real gloo
ranks, once through ``neuronx_distributed_config(pad_model=True)`` + ``initialize_parallel_model``
and once by calling ``pad_model(..., wrapped_classes=(Attention,), pad_hook_fn=...)``; fp32 logits
and the real rows' gradients must match within 1e-5 and the padding must stay zero with zero grad.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import nxd
from nxd.errors import ConfigError
from nxd_core_parallel import parallel_state as ps
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear
from nxd_tensor_parallel.parallel_layers.pad import get_number_of_extra_heads, pad_model, pad_model_from_config
from nxd_tensor_parallel.parallel_layers.utils import divide

TOL = 1e-5
HEADS, HEAD_DIM, VOCAB, BATCH, SEQ = 3, 8, 30, 2, 5  # VOCAB: a multiple of HEADS (the head stays unpadded)
HIDDEN = HEADS * HEAD_DIM


class Attention(nn.Module):
    def __init__(self, padded: bool = True) -> None:
        super().__init__()
        tp = ps.get_tensor_model_parallel_size()
        extra = get_number_of_extra_heads(HEADS, tp) if padded else 0
        self.local_heads = divide(HEADS + extra, tp)
        self.split_size = HIDDEN
        self.qkv = nn.ModuleList(ColumnParallelLinear(HIDDEN, HIDDEN, gather_output=False) for _ in range(3))
        self.o_proj = RowParallelLinear(HIDDEN, HIDDEN, input_is_parallel=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (p(x).view(BATCH, SEQ, self.local_heads, HEAD_DIM).transpose(1, 2) for p in self.qkv)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(BATCH, SEQ, -1))


class TinyLM(nn.Module):
    def __init__(self, padded: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)  # layers initialise the full shape, so every TP size gets the same model
        self.config = SimpleNamespace(num_attention_heads=HEADS)
        self.embed = ParallelEmbedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Attention(padded) for _ in range(2))
        self.head = ColumnParallelLinear(HIDDEN, VOCAB, bias=False, gather_output=True)
        tp, rank = ps.get_tensor_model_parallel_size(), ps.get_tensor_model_parallel_rank()
        with torch.no_grad():  # non-zero biases (the same full vectors at every TP size)
            for p in self.parameters():
                if p.dim() == 1:
                    sharded = getattr(p, "tensor_model_parallel", False)
                    full = torch.randn(p.shape[0] * (tp if sharded else 1))
                    p.copy_(full.chunk(tp)[rank] if sharded else full)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer(h)
        return self.head(h)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randn(BATCH, SEQ, VOCAB, generator=g)


def run(model: nn.Module) -> dict[str, torch.Tensor]:
    ids, weights = inputs()
    logits = model(ids)
    (logits * weights).sum().backward()
    return {"logits": logits.detach(), "q_grad": model.layers[0].qkv[0].weight.grad,
            "q": model.layers[0].qkv[0].weight.detach(), "o_grad": model.layers[1].o_proj.weight.grad,
            "o": model.layers[1].o_proj.weight.detach(), "v_bias": model.layers[1].qkv[2].bias.detach()}


def gathered(out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's shards gathered into the full padded tensors."""
    def cat(t: torch.Tensor, dim: int) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(ps.get_tensor_model_parallel_size())]
        dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
        return torch.cat(parts, dim)
    dims = {"q_grad": 0, "q": 0, "o_grad": 1, "o": 1, "v_bias": 0}
    return {k: cat(v, dims[k]) if k in dims else v for k, v in out.items()}


def padded_ranks_body() -> dict[str, dict[str, torch.Tensor]]:
    config = nxd.neuronx_distributed_config(tensor_parallel_size=2, pad_model=True)
    through_config = nxd.initialize_parallel_model(config, TinyLM)
    hooked: list[float] = []
    explicit = pad_model(TinyLM(), 2, HEADS, wrapped_classes=(Attention,),
                         pad_hook_fn=lambda m, ratio: hooked.append(ratio) if isinstance(m, Attention) else None)
    assert hooked == [4 / 3, 4 / 3], hooked
    assert explicit.head.weight.shape == (VOCAB // 2, HIDDEN)  # outside wrapped_classes: untouched
    with pytest.raises(ValueError, match="not divisible by tensor parallel size 2.*pad_model"):
        TinyLM(padded=False)
    assert through_config.head.weight.shape == (VOCAB // 2, HIDDEN)  # the LM head is never padded
    return {"config": gathered(run(through_config)), "explicit": gathered(run(explicit))}


def test_padded_heads_match_the_unpadded_single_process_model(rank_pool):
    want = run(TinyLM())
    real = HEADS * HEAD_DIM
    for name, got in rank_pool(2).run(padded_ranks_body)[0].items():
        errors = {
            "logits": float((got["logits"] - want["logits"]).abs().max() / want["logits"].abs().max()),
            "q grad": float((got["q_grad"][:real] - want["q_grad"]).abs().max() / want["q_grad"].abs().max()),
            "o grad": float((got["o_grad"][:, :real] - want["o_grad"]).abs().max() / want["o_grad"].abs().max()),
        }
        padding = float(got["q"][real:].abs().sum() + got["o"][:, real:].abs().sum() + got["v_bias"][real:].abs().sum()
                        + got["q_grad"][real:].abs().sum() + got["o_grad"][:, real:].abs().sum())
        print(f"\npad_model ({name}) 3 heads at TP=2 vs one process: {errors}, padding {padding}")
        assert got["q"].shape[0] == 4 * HEAD_DIM and padding == 0.0
        assert max(errors.values()) < TOL, errors


def test_pad_model_arguments():
    assert [get_number_of_extra_heads(n, 4) for n in (4, 5, 6, 7)] == [0, 3, 2, 1]
    model = TinyLM()
    assert pad_model(model, 1, HEADS) is model  # TP=1: nothing to pad
    with pytest.raises(ValueError, match="sharded over 1 ranks"):
        pad_model(model, 2, HEADS)
    with pytest.raises(ValueError, match="n_heads must be a positive int"):
        pad_model(model, 2, 0)
    with pytest.raises(ConfigError, match="config.num_attention_heads"):
        pad_model_from_config(nn.Linear(2, 2))


@pytest.mark.parametrize("heads, padded, kv, tp, dead", [
    # NxD's test/unit_test/parallel_layers/test_padding.py (trn2 cases): (rows, columns) of the mask that are False
    (48, 64, 8, 32, (slice(3, None, 4), slice(None))),
    (200, 224, 8, 32, (slice(3, None, 4), slice(4, None))),
    (24, 32, 8, 4, (slice(None), slice(6, None))),
])
def test_generate_padding_mask_is_nxds_trn2_mask(heads, padded, kv, tp, dead):
    from nxd_tensor_parallel.parallel_layers.pad import generate_padding_mask

    want = torch.ones(tp, padded // tp, dtype=torch.bool)
    want[dead] = False
    for rank in range(tp):
        for hardware_type in (None, "trn2"):
            assert torch.equal(generate_padding_mask(heads, padded, kv, tp, rank, hardware_type), want[rank])
    with pytest.raises(ValueError, match="adjacent ranks"):
        generate_padding_mask(heads, padded, kv, tp, 0, "trn1")
    with pytest.raises(RuntimeError, match="Unexpected hardware_type"):
        generate_padding_mask(heads, padded, kv, tp, 0, "trn999")


# GQA, NxD's other route (its DBRX example): 3 query heads over 1 KV head at TP=2. The KV head is
# replicated on both ranks (kv_size_multiplier=2), the query heads are padded to 4 (slot 3 is padding,
# given random weights here) and generate_padding_mask zeroes the padded head's attention output.
GQA_HEADS, GQA_DIM, GQA_HIDDEN = 3, 4, 8


def gqa_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    names = {"q": (GQA_HEADS * GQA_DIM, GQA_HIDDEN), "k": (GQA_DIM, GQA_HIDDEN), "v": (GQA_DIM, GQA_HIDDEN),
             "o": (GQA_HIDDEN, GQA_HEADS * GQA_DIM), "q_pad": (GQA_DIM, GQA_HIDDEN), "o_pad": (GQA_HIDDEN, GQA_DIM),
             "x": (BATCH, SEQ, GQA_HIDDEN)}
    return {k: torch.randn(*shape, generator=g) * 0.5 for k, shape in names.items()}


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    q, k, v = (t.view(BATCH, SEQ, -1, GQA_DIM).transpose(1, 2) for t in (q, k, v))
    k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa_padded_body(w: dict[str, torch.Tensor]) -> torch.Tensor:
    from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
    from nxd_tensor_parallel.parallel_layers.pad import generate_padding_mask

    ps.initialize_model_parallel(2)
    rank, padded = ps.get_tensor_model_parallel_rank(), GQA_HEADS + get_number_of_extra_heads(GQA_HEADS, 2)
    qkv = GQAQKVColumnParallelLinear(GQA_HIDDEN, [padded * GQA_DIM, GQA_DIM], bias=False, gather_output=False,
                                     kv_size_multiplier=2, fuse_qkv=False)
    o_proj = RowParallelLinear(padded * GQA_DIM, GQA_HIDDEN, bias=False, input_is_parallel=True)
    with torch.no_grad():
        qkv.weight_q.copy_(torch.cat([w["q"], w["q_pad"]]).chunk(2)[rank])
        qkv.weight_k.copy_(w["k"])
        qkv.weight_v.copy_(w["v"])
        o_proj.weight.copy_(torch.cat([w["o"], w["o_pad"]], dim=1).chunk(2, dim=1)[rank])
    mask = generate_padding_mask(GQA_HEADS, padded, 1, 2, rank)
    out = gqa_attention(*qkv(w["x"]), heads=padded // 2, kv_heads=1) * mask.view(1, -1, 1, 1)
    return o_proj(out.transpose(1, 2).reshape(BATCH, SEQ, -1)).detach()


def test_gqa_padding_mask_matches_the_unpadded_model(rank_pool):
    w = gqa_weights()
    ref = gqa_attention(w["x"] @ w["q"].T, w["x"] @ w["k"].T, w["x"] @ w["v"].T, heads=GQA_HEADS, kv_heads=1)
    ref = ref.transpose(1, 2).reshape(BATCH, SEQ, -1) @ w["o"].T
    errors = [float((out - ref).abs().max() / ref.abs().max()) for out in rank_pool(2).run(gqa_padded_body, w)]
    print(f"\nGQA 3 query heads / 1 KV head padded at TP=2 with generate_padding_mask vs one process: {errors}")
    assert max(errors) < TOL, errors
