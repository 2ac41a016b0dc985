"""The decoder adapter carries router logits between stages for models shaped like NxD's MoE
examples (``modeling_mixtral_moe_nxd``, ``modeling_dbrx_moe_nxd``): each decoder layer takes the
router logits of the layers before it (``past_router_logits``) and returns them with its own
appended; the loss adds a load-balancing term over all of them. A tiny model of that shape, with
DBRX's module names (``transformer.wte/blocks/norm_f``), on two gloo ranks against the unsplit
model in one process: fp32 loss and every gradient within 1e-5 relative; and the packing of a
stage's tensors round-trips exactly."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nxd_pipeline import NxDPPModel
from nxd_pipeline.packing import pack, unpack

VOCAB, HIDDEN, EXPERTS, LAYERS = 32, 16, 4, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(EXPERTS))

    def forward(self, hidden_states: torch.Tensor, past_router_logits: torch.Tensor | None,
                attention_mask: torch.Tensor | None = None, output_router_logits: bool = False) -> tuple:
        logits = self.router(hidden_states).reshape(-1, EXPERTS)
        weights = logits.softmax(-1).reshape(*hidden_states.shape[:-1], EXPERTS, 1)
        mixed = sum(weights[..., e, :] * expert(hidden_states) for e, expert in enumerate(self.experts))
        outputs = (hidden_states + mixed,)
        if output_router_logits:
            if past_router_logits is not None:
                logits = torch.cat((past_router_logits, logits), dim=0)
            outputs += (logits,)
        return outputs


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm_f = nn.LayerNorm(HIDDEN)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> tuple:
        hidden, all_router_logits = self.wte(input_ids), None
        for block in self.blocks:
            outputs = block(hidden, all_router_logits, attention_mask=attention_mask, output_router_logits=True)
            hidden, all_router_logits = outputs[0], outputs[-1]
        return self.norm_f(hidden), all_router_logits


class TinyNxDMoELM(nn.Module):
    base_model_prefix = "transformer"

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(output_router_logits=True)
        self.transformer = Base()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None,
                use_cache: bool | None = None) -> SimpleNamespace:
        hidden, router_logits = self.transformer(input_ids, attention_mask)
        loss = nn.functional.cross_entropy(self.lm_head(hidden).flatten(0, 1), labels.flatten())
        probs = router_logits.softmax(-1)  # a load-balancing term: not a sum over layers or tokens
        chosen = nn.functional.one_hot(probs.argmax(-1), EXPERTS).float()
        aux = EXPERTS * (probs.mean(0) * chosen.mean(0)).sum()
        return SimpleNamespace(loss=loss + 0.1 * aux)


def carry_body(microbatches: int) -> tuple[float, float, int]:
    torch.manual_seed(0)
    full = TinyNxDMoELM()
    reference = copy.deepcopy(full)
    ids = torch.randint(0, VOCAB, (2 * microbatches, 8), generator=torch.Generator().manual_seed(1))
    for part in ids.chunk(microbatches):  # the pipeline's loss: the mean over its micro-batches
        (reference(part, part.clone()).loss / microbatches).backward()
    ref_loss = sum(reference(p, p.clone()).loss.detach() for p in ids.chunk(microbatches)) / microbatches
    model = NxDPPModel(full, 2, {"num_microbatches": microbatches})
    loss = model.run_train(input_ids=ids, labels=ids.clone())
    ref = dict(reference.named_parameters())
    worst, checked = 0.0, 0
    for name, param in model.local_module().named_parameters():
        worst = max(worst, float((param.grad - ref[name].grad).abs().max() / ref[name].grad.abs().max()))
        checked += 1
    return float((loss - ref_loss).abs() / ref_loss.abs()), worst, checked


@pytest.mark.slow
def test_router_logits_cross_stages_as_in_nxds_moe_examples(rank_pool):
    per_rank = rank_pool(2).run(carry_body, 2)
    loss_diff, grad_diff = max(r[0] for r in per_rank), max(r[1] for r in per_rank)
    print(f"PP=2, 2 micro-batches: loss rel diff {loss_diff:.2e}, grad rel diff {grad_diff:.2e}")
    assert loss_diff <= 1e-5 and grad_diff <= 1e-5
    assert sum(r[2] for r in per_rank) == len(list(TinyNxDMoELM().parameters()))


def test_stage_tensors_pack_and_unpack_exactly_with_gradients():
    hidden = torch.randn(2, 3, 4, dtype=torch.bfloat16, requires_grad=True)
    logits = torch.randn(6, 5, requires_grad=True)
    packed = pack([hidden, None, logits])
    back = unpack(packed)
    assert back[1] is None and back[0].dtype == torch.bfloat16 and torch.equal(back[0], hidden)
    assert torch.equal(back[2], logits)
    (back[0].float().sum() + 2 * back[2].sum()).backward()
    assert torch.equal(hidden.grad, torch.ones_like(hidden)) and torch.equal(logits.grad, torch.full_like(logits, 2.0))
