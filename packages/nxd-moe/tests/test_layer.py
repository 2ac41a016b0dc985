"""Single-process MoE layer semantics: Hugging Face's Mixtral block and aux loss as oracles, an
independent capacity-dropping reference, Sinkhorn balancing, config validation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nxd.errors import ConfigError
from nxd_moe import MoEConfig, MoELayer, expert_capacity, load_balancing_loss, router_z_loss, sinkhorn

H, I, E = 32, 48, 4  # noqa: E741 (hidden, intermediate, experts)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def _hf_block(seed: int = 0):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(seed)
    cfg = MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=2)
    block = MixtralSparseMoeBlock(cfg).float()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    return block


def _layer_like(block, **moe) -> MoELayer:
    layer = MoELayer(MoEConfig(num_experts=E, top_k=2, dropless=True, **moe), H, I)
    with torch.no_grad():
        layer.router.weight.copy_(block.gate.weight)
        layer.experts.gate_up_proj.copy_(block.experts.gate_up_proj)
        layer.experts.down_proj.copy_(block.experts.down_proj)
    return layer


def test_dropless_matches_hf_mixtral_block_output_and_grads():
    block = _hf_block()
    layer = _layer_like(block)
    x = torch.randn(2, 8, H)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = block(x1)
    out, logits = layer(x2)
    assert _rel(out, ref) < 1e-6
    (ref * torch.arange(H)).sum().backward()
    (out * torch.arange(H)).sum().backward()
    assert _rel(x2.grad, x1.grad) < 1e-5
    assert _rel(layer.router.weight.grad, block.gate.weight.grad) < 1e-5
    assert _rel(layer.experts.gate_up_proj.grad, block.experts.gate_up_proj.grad) < 1e-5
    assert _rel(layer.experts.down_proj.grad, block.experts.down_proj.grad) < 1e-5
    assert logits.shape == (16, E)


def test_dropless_equals_all_experts_computation():
    """Every token through every expert, masked by the normalised top-k affinities."""
    block = _hf_block(1)
    layer = _layer_like(block)
    x = torch.randn(3, 5, H)
    out, _ = layer(x)
    t = x.reshape(-1, H)
    probs = F.softmax(t @ layer.router.weight.T, dim=-1)
    top = probs.topk(2, dim=-1)
    w = torch.zeros_like(probs).scatter(1, top.indices, top.values / top.values.sum(-1, keepdim=True))
    dense = torch.zeros_like(t)
    for e in range(E):
        gate, up = (t @ layer.experts.gate_up_proj[e].T).split(I, dim=-1)
        dense += w[:, e:e + 1] * ((F.silu(gate) * up) @ layer.experts.down_proj[e].T)
    assert _rel(out.reshape(-1, H), dense) < 1e-6


def _reference_capacity(tokens, weights_fn, index, capacity, normalize):
    """Independent reference: walk tokens in order, give each expert its first `capacity` arrivals."""
    taken = [0] * E
    kept = torch.zeros_like(index, dtype=torch.bool)
    for t in range(index.shape[0]):
        seen = set()
        for k in range(index.shape[1]):
            e = int(index[t, k])
            if e not in seen:
                taken[e] += 1
                seen.add(e)
            kept[t, k] = taken[e] <= capacity
    return kept


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.5])
def test_capacity_factor_drops_like_reference(factor):
    block = _hf_block(2)
    layer = _layer_like(block)
    layer.config = MoEConfig(num_experts=E, top_k=2, capacity_factor=factor, dropless=False)
    b, s = 2, 12
    x = torch.randn(b, s, H)
    out, _ = layer(x)
    # reference: tokens in NxD's order (sequence position first), capacity from the formula
    t = x.transpose(0, 1).reshape(-1, H)
    probs = F.softmax(t @ layer.router.weight.T, dim=-1)
    top = probs.topk(2, dim=-1)
    capacity = math.ceil(b * s * 2 * factor / E)
    assert expert_capacity(b * s, E, 2, factor) == min(capacity, b * s)
    kept = _reference_capacity(t, None, top.indices, min(capacity, b * s), True)
    assert factor >= 1.5 or not kept.all(), "the test should drop something"
    vals = top.values * kept
    vals = vals / vals.sum(-1, keepdim=True).clamp_min(1e-30)
    ref = torch.zeros_like(t)
    for ti in range(t.shape[0]):
        for k in range(2):
            if kept[ti, k]:
                e = int(top.indices[ti, k])
                gate, up = (t[ti] @ layer.experts.gate_up_proj[e].T).split(I)
                ref[ti] += vals[ti, k] * ((F.silu(gate) * up) @ layer.experts.down_proj[e].T)
    ref = ref.view(s, b, H).transpose(0, 1)
    assert _rel(out, ref) < 1e-6


def test_capacity_factor_large_enough_is_dropless():
    cfg = MoEConfig(num_experts=E, top_k=2, capacity_factor=2.0, dropless=False)
    assert cfg.effective_capacity_factor is None
    assert MoEConfig(num_experts=8, top_k=2, capacity_factor=2.0).effective_capacity_factor == 2.0


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_matches_hf(masked):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(3)
    b, s = 2, 6
    logits = [torch.randn(b * s, E) for _ in range(2)]
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 4:] = 0
    ours = load_balancing_loss(logits, E, 2, mask if masked else None)
    ref = load_balancing_loss_func(tuple(logits), E, 2, mask if masked else None)
    assert _rel(ours, ref) < 1e-6, (ours, ref)


def test_router_z_loss():
    logits = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    expected = (math.log(2) ** 2 + math.log(math.e + math.e ** 2) ** 2) / 2
    assert abs(router_z_loss(logits).item() - expected) < 1e-6


def test_sinkhorn_balances_columns():
    torch.manual_seed(0)
    cost = torch.randn(64, 4) + torch.tensor([3.0, 0.0, 0.0, 0.0])  # expert 0 is everyone's favourite
    balanced = sinkhorn(cost, 30)
    before = torch.bincount(cost.argmax(1), minlength=4)
    after = torch.bincount(balanced.argmax(1), minlength=4)
    assert before.max() > 40 and after.max() < before.max()
    col = balanced.sum(0)
    assert _rel(col, torch.full_like(col, col.mean().item())) < 1e-3


def test_sinkhorn_router_trains_top1_and_evaluates_by_logits():
    layer = MoELayer(MoEConfig(num_experts=E, top_k=1, routing_algorithm="sinkhorn", capacity_factor=None,
                               dropless=True), H, I)
    x = torch.randn(2, 8, H)
    out, logits = layer(x)
    assert out.shape == x.shape
    layer.eval()
    index = layer.router(x.reshape(-1, H))[2]
    assert index.equal(logits.argmax(-1, keepdim=True))


@pytest.mark.parametrize("bad, match", [
    (dict(top_k=5), "top_k"), (dict(routing_algorithm="hash"), "routing_algorithm"),
    (dict(routing_algorithm="sinkhorn", top_k=2), "top-1"), (dict(dropout=0.1), "dropout"),
    (dict(dropless=False, capacity_factor=None), "capacity_factor"), (dict(expert_choice=True), "unknown keys"),
])
def test_config_errors_name_the_key(bad, match):
    with pytest.raises(ConfigError, match=match):
        MoEConfig.from_dict({"num_experts": E, **bad})


def test_nxdt_dropless_config_values_validate():
    # hf_mixtral_8x7b_dropless_config.yaml: capacity_factor 0.0 with dropless True
    cfg = MoEConfig.from_dict(dict(num_experts=8, frequency=1, dropout=0.0, capacity_factor=0.0, dropless=True,
                                   routing_algorithm="top_k", top_k=2, output_router_logits=True,
                                   router_aux_loss_coef=0.02, normalize_top_k_affinities=True))
    assert cfg.effective_capacity_factor is None



def test_sigmoid_router_activation_matches_an_all_experts_reference():
    """``router_activation: sigmoid`` (NxD's act_fn): each token's output is its top-2 experts
    (by logit) weighted by their sigmoid affinities renormalised to sum to 1; the load-balancing
    loss uses the sigmoid affinities as its probabilities."""
    torch.manual_seed(3)
    layer = MoELayer(MoEConfig(num_experts=E, top_k=2, dropless=True, router_activation="sigmoid"), H, I)
    x = torch.randn(2, 5, H)
    out, logits = layer(x)
    tokens = x.reshape(-1, H)
    aff = torch.sigmoid(tokens @ layer.router.weight.T)
    top = aff.topk(2, dim=-1)
    weights = torch.zeros_like(aff).scatter(1, top.indices, top.values / top.values.sum(-1, keepdim=True))
    w = layer.experts
    expected = torch.zeros_like(tokens)
    for e in range(E):
        gate, up = F.linear(tokens, w.gate_up_proj[e]).split(I, dim=-1)
        expected += weights[:, e:e + 1] * F.linear(F.silu(gate) * up, w.down_proj[e])
    assert _rel(out.reshape(-1, H), expected) < 1e-5
    chosen = F.one_hot(top.indices, E).float().mean(0)  # [k, E] fraction of tokens per choice
    reference = E * (chosen * aff.mean(0)).sum()
    assert _rel(load_balancing_loss([logits], E, 2, activation="sigmoid"), reference) < 1e-6


def test_sinkhorn_tol_stops_early():
    cost = torch.randn(64, E, generator=torch.Generator().manual_seed(0))
    converged = sinkhorn(cost, 500)
    early = sinkhorn(cost, 500, tol=1e-3)
    assert not torch.equal(early, converged) and _rel(early, converged) < 1e-2
    assert torch.equal(sinkhorn(cost, 30, tol=0.0), sinkhorn(cost, 30))  # tol 0 never stops early
    assert MoEConfig(num_experts=E, top_k=1, routing_algorithm="sinkhorn", dropless=True,
                     sinkhorn_tol="None").sinkhorn_tol is None  # NxDT's YAML writes `sinkhorn_tol: None`


def test_expert_init_is_the_same_at_every_ep_and_tp_degree():
    """EP rank r's experts are experts [r*E/ep, (r+1)*E/ep) of the whole init, and TP rank t's slice
    of each is t's gate and up rows / down columns of it (the ranks' experts are not copies of each
    other); the RNG is left where the whole build leaves it. So a meta-device build, initialised
    after the expert-parallel plan split it, equals the plain build split."""
    from nxd_moe import ExpertMLPs, ExpertShard

    def build(shard: ExpertShard) -> tuple[ExpertMLPs, torch.Tensor]:
        torch.manual_seed(7)
        experts = ExpertMLPs(4, 8, 6, shard=shard)
        return experts, torch.randn(3)

    full, after = build(ExpertShard())
    for ep, tp in ((2, 1), (1, 2), (2, 2)):
        for ep_rank in range(ep):
            for tp_rank in range(tp):
                part, after_part = build(ExpertShard(ep_size=ep, ep_rank=ep_rank, tp_size=tp, tp_rank=tp_rank))
                first, count = ep_rank * 4 // ep, 4 // ep
                gate, up = full.gate_up_proj[first:first + count].chunk(2, dim=1)
                rows = slice(tp_rank * 6 // tp, (tp_rank + 1) * 6 // tp)
                assert torch.equal(part.gate_up_proj, torch.cat([gate[:, rows], up[:, rows]], dim=1))
                assert torch.equal(part.down_proj, full.down_proj[first:first + count, :, rows])
                assert torch.equal(after_part, after)
    assert not torch.equal(full.gate_up_proj[0], full.gate_up_proj[2])


def test_autocast_bf16_matches_transformers_block_under_the_same_autocast():
    """Under bf16 autocast the experts' matmuls give bf16 rows and the residual stream stays fp32:
    the layer sums them in the stream's dtype (it raised in index_add before), as transformers does."""
    block = _hf_block()
    layer = _layer_like(block)
    x = torch.randn(2, 8, H)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = block(x1)
        out, _ = layer(x2)
    assert out.dtype == ref.dtype
    assert _rel(out, ref) < 2e-2  # bf16 matmuls in both (8 mantissa bits), in different orders
    out.float().sum().backward()
    assert x2.grad is not None and torch.isfinite(x2.grad).all()
