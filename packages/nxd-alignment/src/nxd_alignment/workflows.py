"""The ``dpo`` and ``orpo`` workflows: what the trainer calls per run and per micro-batch
(the :class:`nxd.specs.Workflow` contract)."""

from __future__ import annotations

from typing import Any

import torch

from nxd.errors import ConfigError
from nxd_alignment import reference
from nxd_alignment.logps import forward_logits, pair_logps, per_token_logps
from nxd_alignment.losses import dpo_loss, orpo_loss, reward_metrics
from nxd_alignment.options import DPOOptions, ORPOOptions


def _logp_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"logps/chosen": chosen.detach().mean(), "logps/rejected": rejected.detach().mean()}


class DPOWorkflow:
    """Direct Preference Optimization against a frozen reference policy."""

    data_module = "preference"
    supports_pipeline = False

    def __init__(self, options: dict[str, Any] | None) -> None:
        self.options = DPOOptions.parse(options)
        self.data_options = dict(self.options.data_options)
        self.reference: Any = None

    def prepare(self, model: torch.nn.Module, data: Any, *, device: torch.device, dp_group: Any,
                resumed_step: int) -> None:
        if self.options.precompute_ref_log_probs:
            for split in ("train", "valid"):
                if data.sources.get(split) is None or split in data.reference_logps:
                    continue  # restored with the data position on resume
                if resumed_step > 0:
                    raise ConfigError(f"the checkpoint resumed at step {resumed_step} holds no precomputed reference "
                                      f"log-probs for the {split} split; the reference model is gone, so they cannot "
                                      "be recomputed (start from the pretrained checkpoint instead)")
                data.set_reference_logps(split, reference.precompute(model, data, split, device=device,
                                                                     dp_group=dp_group))
        elif reference.adapter_switches(model):
            self.reference = reference.DisabledAdapters(model)
        elif resumed_step > 0:
            raise ConfigError("model_alignment_strategy.dpo.precompute_ref_log_probs=false copies the policy as the "
                              f"reference before the first step, but this run resumed at step {resumed_step} (the "
                              "policy has trained); use precompute_ref_log_probs: true (kept in checkpoints) or LoRA")
        else:
            self.reference = reference.FrozenCopy(model)

    def _reference_logps(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if "reference_chosen_logps" in batch:
            return batch["reference_chosen_logps"].float(), batch["reference_rejected_logps"].float()
        if self.reference is None:
            raise RuntimeError("DPOWorkflow.loss called before prepare(): no reference log-probs")
        return self.reference.logps(batch)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logps = pair_logps(per_token_logps(forward_logits(model, batch), batch["labels"], batch["loss_mask"]),
                           batch["loss_mask"])
        ref_chosen, ref_rejected = self._reference_logps(batch)
        result = dpo_loss(logps.chosen, logps.rejected, ref_chosen, ref_rejected, beta=self.options.beta,
                          loss_type=self.options.loss_type, chosen_lengths=logps.chosen_lengths,
                          rejected_lengths=logps.rejected_lengths)
        return result.loss, {**reward_metrics(result), **_logp_metrics(logps.chosen, logps.rejected)}


class ORPOWorkflow:
    """Odds-Ratio Preference Optimization: SFT loss on the chosen response plus an odds-ratio term;
    no reference model."""

    data_module = "preference"
    supports_pipeline = False

    def __init__(self, options: dict[str, Any] | None) -> None:
        self.options = ORPOOptions.parse(options)
        self.data_options = dict(self.options.data_options)

    def prepare(self, model: torch.nn.Module, data: Any, *, device: torch.device, dp_group: Any,
                resumed_step: int) -> None:
        return None

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = forward_logits(model, batch)
        m = batch["input_ids"].shape[0] // 2
        # TRL: the chosen NLL covers prompt and response (every real token), token-averaged
        real = batch["segment_ids"] != 0
        token_logps = per_token_logps(logits, batch["labels"], real)
        chosen_real = real[:m].sum().clamp(min=1)
        nll = -token_logps[:m].sum() / chosen_real
        response = token_logps * (batch["loss_mask"] != 0)
        chosen_avg, rejected_avg = pair_logps(response, batch["loss_mask"]).averaged()
        result, log_odds = orpo_loss(chosen_avg, rejected_avg, nll, beta=self.options.beta)
        metrics = {**reward_metrics(result), **_logp_metrics(chosen_avg, rejected_avg),
                   "nll_loss": nll.detach(), "log_odds_chosen": log_odds.mean()}
        return result.loss, metrics


def dpo(options: dict[str, Any] | None) -> DPOWorkflow:
    return DPOWorkflow(options)


def orpo(options: dict[str, Any] | None) -> ORPOWorkflow:
    return ORPOWorkflow(options)
