"""NxD's ``GroupLimitedRouter`` (DeepSeek-V3 ``noaux_tc``) against transformers'
``DeepseekV3TopkRouter`` on the same weights and correction bias: the same experts and
weights (NxD's caller normalises and scales the gathered top-k, as NxD's unit test does), and
NxD's 0.0 fill for the groups left out, where transformers' -inf keeps every pick inside them."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nxd_moe")
pytest.importorskip("transformers")

H, E, K, N_GROUP, TOPK_GROUP, T, SCALE = 16, 8, 2, 4, 2, 12, 2.5


def _routers(bias: torch.Tensor):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from neuronx_distributed.modules.moe.routing import GroupLimitedRouter, RouterBase

    torch.manual_seed(0)
    nxd = GroupLimitedRouter(num_experts=E, top_k=K, hidden_size=H, n_group=N_GROUP, topk_group=TOPK_GROUP).eval()
    assert isinstance(nxd, RouterBase)
    nxd.e_score_correction_bias = bias
    config = DeepseekV3Config(hidden_size=H, n_routed_experts=E, num_experts_per_tok=K, n_group=N_GROUP,
                              topk_group=TOPK_GROUP, norm_topk_prob=True, routed_scaling_factor=SCALE)
    hf = DeepseekV3TopkRouter(config).eval()
    with torch.no_grad():
        hf.weight.copy_(nxd.linear_router.weight)
        hf.e_score_correction_bias.copy_(bias)
    return nxd, hf


def test_group_limited_router_matches_transformers_deepseek_v3():
    bias = torch.linspace(-0.1, 0.1, E)  # corrected scores stay > 0: both fills pick alike
    nxd, hf = _routers(bias)
    x = torch.randn(3, T // 3, H)
    logits, affinities, index = nxd(x)
    hf_logits, hf_weights, hf_index = hf(x)
    torch.testing.assert_close(logits, hf_logits, rtol=0, atol=0)
    order = hf_index.argsort(dim=1)  # transformers' top-k is unsorted
    hf_index, hf_weights = hf_index.gather(1, order), hf_weights.gather(1, order)
    index, nxd_order = index.sort(dim=1)
    assert torch.equal(index, hf_index)
    picked = affinities.gather(1, index)
    # fp32 sigmoid (NxD: fp64 then cast) and a 2-term sum: a few ulp
    torch.testing.assert_close(picked / (picked.sum(-1, keepdim=True) + 1e-20) * SCALE, hf_weights,
                               rtol=1e-6, atol=1e-6)


def test_group_limited_router_fills_left_out_groups_with_zero_as_nxd():
    nxd, hf = _routers(torch.full((E,), -2.0))  # every corrected score < 0: NxD's 0.0 fill outranks them
    x = torch.randn(T, H)
    _, _, index = nxd(x)
    _, _, hf_index = hf(x)
    groups = torch.topk((torch.sigmoid(x @ nxd.linear_router.weight.T) - 2.0).view(T, N_GROUP, -1).topk(2)[0].sum(-1),
                        TOPK_GROUP)[1]
    in_chosen = lambda idx: (idx.unsqueeze(-1) // (E // N_GROUP) == groups.unsqueeze(1)).any(-1)  # noqa: E731
    assert in_chosen(hf_index).all() and not in_chosen(index).any()


def test_group_limited_router_without_correction_bias_says_so():
    from neuronx_distributed.modules.moe.routing import GroupLimitedRouter

    router = GroupLimitedRouter(num_experts=E, top_k=K, hidden_size=H, n_group=N_GROUP, topk_group=TOPK_GROUP)
    with pytest.raises(AttributeError, match="e_score_correction_bias"):
        router(torch.randn(T, H))
