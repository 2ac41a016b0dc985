"""``neuronx_distributed.trainer.trainer``: NxD's entry points (nxd's facade), where NxD defines them."""

from typing import Any, Callable

import torch

import nxd
from neuronx_distributed.modules.lora import LoraConfig, LoraModel  # noqa: F401 - NxD's module imports them
from neuronx_distributed.trainer.model import NxDModel  # noqa: F401
from nxd import initialize_parallel_optimizer, neuronx_distributed_config
from nxd_compat.surface import not_provided

__all__ = ["initialize_parallel_model", "initialize_parallel_optimizer", "neuronx_distributed_config"]


def initialize_parallel_model(nxd_config: dict, model_fn: Callable[..., torch.nn.Module], *args: Any,
                              **model_kwargs: Any) -> torch.nn.Module:
    """NxD's ``initialize_parallel_model`` in both of its signatures: ``(nxd_config, model_fn,
    include_buffers=False, *model_args, **model_kwargs)`` since Release 2.21, and
    ``(nxd_config, model_fn, *model_args, **model_kwargs)`` up to 2.20, which NxD's examples of
    those releases call with ``model_fn``'s argument third (``get_model(flags)``). A third argument
    that is not a bool can only be the older call's first model argument."""
    if args and not isinstance(args[0], bool):
        args = (False, *args)  # NxD <= 2.20 had no include_buffers: buffers were built as usual
    return nxd.initialize_parallel_model(nxd_config, model_fn, *args, **model_kwargs)


_OPTIMIZER = ("NxD's optimizer construction for its own ZeRO-1 and XLA bucket settings; "
              "neuronx_distributed.trainer.initialize_parallel_optimizer builds nxd's (ZeRO-1 included)")
__getattr__ = not_provided(__name__, {
    "initialize_optimizer_from_class": _OPTIMIZER,
    "filter_to_local_parameter_group": "NxD's delayed XLA tracing (meta-device parameters swapped after "
                                       "partitioning); nxd-pipeline does not trace",
})
