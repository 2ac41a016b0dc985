"""DeepSeek-V3's routing in one process: transformers' ``DeepseekV3MoE`` block (sigmoid scores,
group-limited top-k, score-correction bias, routed scaling, shared experts) as the oracle for output
and every gradient; the aux-loss-free bias update against the paper's rule; the sequence-wise balance
loss against its formula written out; grouped-GEMM eligibility."""

from __future__ import annotations

import pytest
import torch

from nxd.errors import ConfigError
from nxd_moe import (
    MoEConfig,
    MoELayer,
    attach_expert_bias_update,
    biased_routers,
    expert_bias_update,
    grouped_mm_runs,
    innermost_optimizer,
    routers_of_optimizer,
    sequence_balance_loss,
)

H, I, E, SHARED = 32, 16, 8, 2  # noqa: E741


def _hf_block():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    torch.manual_seed(0)
    cfg = DeepseekV3Config(hidden_size=H, moe_intermediate_size=I, n_routed_experts=E, n_shared_experts=SHARED,
                           num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                           norm_topk_prob=True)
    block = DeepseekV3MoE(cfg).float()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
        block.gate.e_score_correction_bias.normal_(0.0, 0.3)  # the bias changes the choice
    return block


def _layer_like(block) -> MoELayer:
    moe = MoEConfig(num_experts=E, top_k=3, dropless=True, router_activation="sigmoid", n_group=4, topk_group=2,
                    routed_scaling_factor=2.5, expert_bias=True)
    layer = MoELayer(moe, H, I, shared_intermediate_size=SHARED * I)
    with torch.no_grad():
        layer.router.weight.copy_(block.gate.weight)
        layer.router.e_score_correction_bias.copy_(block.gate.e_score_correction_bias)
        layer.experts.gate_up_proj.copy_(block.experts.gate_up_proj)
        layer.experts.down_proj.copy_(block.experts.down_proj)
        shared = block.shared_experts
        layer.shared_experts.gate_up_proj.copy_(torch.cat([shared.gate_proj.weight, shared.up_proj.weight])[None])
        layer.shared_experts.down_proj.copy_(shared.down_proj.weight[None])
    return layer


def test_matches_hf_deepseek_v3_moe_block_output_and_grads():
    block = _hf_block()
    layer = _layer_like(block)
    inputs = [torch.randn(2, 8, H, generator=torch.Generator().manual_seed(3)).requires_grad_() for _ in range(2)]
    ref, out = block(inputs[0]), layer(inputs[1])[0]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for y in (ref, out):  # the same weighted sum of each output
        (y * torch.linspace(-1, 1, H)).sum().backward()
    grads = [(inputs[1].grad, inputs[0].grad), (layer.router.weight.grad, block.gate.weight.grad),
             (layer.experts.gate_up_proj.grad, block.experts.gate_up_proj.grad)]
    for got, want in grads:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    shared = block.shared_experts
    torch.testing.assert_close(layer.shared_experts.gate_up_proj.grad[0],
                               torch.cat([shared.gate_proj.weight.grad, shared.up_proj.weight.grad]),
                               rtol=1e-5, atol=1e-6)
    # the bias is a persistent buffer under Hugging Face's name, never a parameter
    assert "router.e_score_correction_bias" in layer.state_dict()
    assert all("bias" not in n for n, _ in layer.named_parameters())


def test_bias_update_follows_the_paper_and_runs_after_each_optimizer_step():
    bias, load = torch.tensor([0.0, 0.1, -0.2, 0.0]), torch.tensor([5.0, 1.0, 2.0, 0.0])
    # b_i + gamma * sign(mean - load_i): overloaded down, underloaded up, exactly balanced unchanged
    want = torch.tensor([bias[i] + 0.01 * (1 if load[i] < 2 else -1 if load[i] > 2 else 0) for i in range(4)])
    torch.testing.assert_close(expert_bias_update(bias, load, 0.01), want)

    layer = MoELayer(MoEConfig(num_experts=4, top_k=2, dropless=True, router_activation="sigmoid",
                               expert_bias=True, bias_update_rate=0.01), H, I)
    opt = torch.optim.SGD(layer.parameters(), lr=0.0)
    assert routers_of_optimizer(opt) == biased_routers(layer) == [layer.router]
    attach_expert_bias_update(opt, routers_of_optimizer(opt))
    x = torch.randn(4, 8, H)
    for _ in range(2):  # two micro-batches of one step: their loads add up
        layer(x)[0].sum().backward()
    load = layer.router.expert_load.clone()
    assert load.sum() == 2 * 4 * 8 * 2
    opt.step()
    torch.testing.assert_close(layer.router.e_score_correction_bias, expert_bias_update(torch.zeros(4), load, 0.01))
    assert layer.router.expert_load.sum() == 0
    layer.eval()
    layer(x)  # evaluation routes with the bias but counts nothing
    assert layer.router.expert_load.sum() == 0


class _SelfNamingWrapper(torch.optim.SGD):
    """Answers ``.optimizer`` with itself, as NeuronZero1Optimizer does for NxD scripts."""

    @property
    def optimizer(self):
        return self


def test_bias_update_attaches_to_a_wrapper_whose_optimizer_is_itself():
    # regression: following ``.optimizer`` never ended, so DeepSeek under ZeRO-1 spun on every rank
    layer = MoELayer(MoEConfig(num_experts=4, top_k=2, dropless=True, router_activation="sigmoid",
                               expert_bias=True, bias_update_rate=0.01), H, I)
    opt = _SelfNamingWrapper(layer.parameters(), lr=0.0)
    assert innermost_optimizer(opt) is opt
    attach_expert_bias_update(opt, routers_of_optimizer(opt))
    layer(torch.randn(2, 4, H))[0].sum().backward()
    opt.step()
    assert layer.router.e_score_correction_bias.abs().sum() > 0


def test_sequence_balance_loss_formula():
    b, t, k = 3, 5, 2
    probs = torch.rand(b * t, E).requires_grad_()
    index = torch.topk(probs, k, dim=-1).indices
    loss = sequence_balance_loss(probs, index, b, E)
    want = 0.0
    for s in range(b):
        rows = slice(s * t, (s + 1) * t)
        f = torch.stack([(index[rows] == i).sum() for i in range(E)]).float() * E / (k * t)
        p = (probs[rows] / probs[rows].sum(-1, keepdim=True)).mean(0)
        want = want + (f * p).sum() / b
    torch.testing.assert_close(loss, want)
    loss.backward()
    assert probs.grad is not None


def test_seq_aux_loss_is_kept_by_the_layer_in_training():
    layer = MoELayer(MoEConfig(num_experts=E, top_k=2, dropless=True, seq_aux_loss_coef=1e-4), H, I)
    layer(torch.randn(2, 4, H))
    assert layer.last_seq_aux_loss is not None and layer.last_seq_aux_loss.requires_grad


@pytest.mark.parametrize("bad", [dict(n_group=3), dict(n_group=4, topk_group=5), dict(grouped_gemm="x"),
                                 dict(n_group=4, topk_group=1, top_k=3)])
def test_bad_group_settings_are_refused(bad):
    with pytest.raises(ConfigError):
        MoEConfig(**{"num_experts": E, "top_k": 2, "dropless": True, **bad})


def test_grouped_gemm_only_where_it_runs():
    assert not grouped_mm_runs(torch.zeros(4, 16), torch.zeros(2, 16, 16))  # CPU: the loop by default


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")
def test_grouped_gemm_path_equals_the_loop():
    """The grouped-GEMM path (forced; torch's reference kernel on CPU) gives the loop's output and
    gradients, an expert receiving no token included."""
    torch.manual_seed(0)
    layers = [MoELayer(MoEConfig(num_experts=E, top_k=2, dropless=True, grouped_gemm=mode), H, I,
                       shared_intermediate_size=I) for mode in ("loop", "grouped")]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(1, 3, H)  # 6 assignments over 8 experts: some get none
    outs = [layer(x)[0] for layer in layers]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    for out in outs:
        (out * torch.linspace(-1, 1, H)).sum().backward()
    for name in ("experts.gate_up_proj", "experts.down_proj", "router.weight"):
        got, want = (layer.get_parameter(name).grad for layer in layers[::-1])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
