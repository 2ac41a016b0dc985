"""Preference alignment for nxd: DPO and ORPO workflows, as NxD Training runs them."""

from nxd_alignment.logps import PairLogps, pair_logps, per_token_logps
from nxd_alignment.losses import DPO_LOSS_TYPES, PreferenceLoss, dpo_loss, log1mexp, orpo_loss, reward_metrics
from nxd_alignment.workflows import DPOWorkflow, ORPOWorkflow

__version__ = "0.1.0"

__all__ = [
    "DPOWorkflow", "DPO_LOSS_TYPES", "ORPOWorkflow", "PairLogps", "PreferenceLoss", "dpo_loss", "log1mexp",
    "orpo_loss", "pair_logps", "per_token_logps", "reward_metrics",
]
