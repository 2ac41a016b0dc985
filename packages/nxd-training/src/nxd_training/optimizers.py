"""``model.optim.name`` -> the torch optimizer and the config keys it takes: the one list of names."""

from __future__ import annotations

import torch

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], tuple[str, ...]]] = {
    "adamw": (torch.optim.AdamW, ("lr", "weight_decay", "betas", "eps")),
    "adamw_fp32optstate": (torch.optim.AdamW, ("lr", "weight_decay", "betas", "eps")),
    "adam": (torch.optim.Adam, ("lr", "weight_decay", "betas", "eps")),
    "sgd": (torch.optim.SGD, ("lr", "weight_decay", "momentum")),
    "adagrad": (torch.optim.Adagrad, ("lr", "weight_decay", "eps")),
    "rmsprop": (torch.optim.RMSprop, ("lr", "weight_decay", "eps", "momentum")),
    "adamax": (torch.optim.Adamax, ("lr", "weight_decay", "betas", "eps")),
    "adadelta": (torch.optim.Adadelta, ("lr", "weight_decay", "eps")),
}
