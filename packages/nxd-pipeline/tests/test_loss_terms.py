"""A head that reports named loss terms (``loss_terms``, as an MoE model's lm/aux losses): on 2
gloo ranks both pipeline ranks receive the last stage's terms, summed over the micro-batches, equal
to the unsplit model's; a term set that changes between steps reaches every rank too."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from nxd_pipeline import NxDPPModel
from nxd_pipeline.toy import ToyLM, toy_batch


class TermsLM(ToyLM):
    """``loss = ce + 0.1 * reg``, reported as the terms ``ce`` and ``reg`` (and ``extra`` when set)."""

    extra = False

    def nxd_pipeline_head(self, hidden: torch.Tensor, labels: torch.Tensor, **_: Any) -> dict[str, Any]:
        ce = F.cross_entropy(self.head(self.norm(hidden)).flatten(0, 1), labels.flatten())
        reg = self.head.weight.pow(2).mean()
        terms = {"ce": ce, "reg": reg, **({"extra": 2 * reg} if self.extra else {})}
        return {"loss": ce + 0.1 * reg, "loss_terms": terms}

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        hidden = self.nxd_pipeline_embed(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return self.nxd_pipeline_head(hidden, labels)


def terms_body() -> dict[str, Any]:
    torch.manual_seed(0)
    full = TermsLM(num_layers=4)
    reference = copy.deepcopy(full)
    micro = [toy_batch(2, 5, seed=s) for s in range(2)]
    expected = {n: sum(reference(**b)["loss_terms"][n].detach() for b in micro) for n in ("ce", "reg")}
    model = NxDPPModel(full, 2, {"num_microbatches": 2, "schedule": "1f1b"})
    sums: dict[str, torch.Tensor] = {}
    loss = model.run_train(*micro, loss_terms=sums)
    error = max(float((sums[n] - expected[n]).abs() / expected[n].abs()) for n in expected)
    added = float(((sums["ce"] + 0.1 * sums["reg"]) / 2 - loss).abs() / loss.abs())
    full.extra = True  # the last stage's term set changes: its names travel again
    evaluated: dict[str, torch.Tensor] = {}
    model.run_eval(*micro, loss_terms=evaluated)
    plain = model.run_eval(*micro)  # no terms asked for: the loss alone
    return {"names": sorted(sums), "error": error, "added": added, "eval_names": sorted(evaluated),
            "extra": float(evaluated["extra"] / (2 * evaluated["reg"])), "plain": float(plain)}


def test_pipeline_ranks_receive_the_last_stages_loss_terms(rank_pool):
    first, second = rank_pool(2).run(terms_body)
    print(f"\nPP=2 loss terms vs unsplit: {first['error']:.2e}; (ce + 0.1 reg) / 2 vs loss: {first['added']:.2e}")
    for r in (first, second):
        assert r["names"] == ["ce", "reg"] and r["eval_names"] == ["ce", "extra", "reg"]
        assert r["error"] < 1e-6 and r["added"] < 1e-6 and abs(r["extra"] - 1) < 1e-6
    assert first == second
