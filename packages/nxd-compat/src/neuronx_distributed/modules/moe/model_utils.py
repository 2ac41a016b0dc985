"""``neuronx_distributed.modules.moe.model_utils``: NxD's activation table and enums.

``ACT2FN``, ``GLUType`` and ``ACTFunc`` are vendored from aws-neuron/neuronx-distributed
(Apache-2.0), ``src/neuronx_distributed/modules/moe/model_utils.py`` at commit fbac349 (Release
2.29), without NxD's logger warnings. The Neuron-kernel helpers are not provided."""

from collections.abc import Callable
from enum import Enum

import torch
import torch.nn.functional as F

from nxd_compat.surface import not_provided

__all__ = ["ACT2FN", "ACTFunc", "GLUType"]

ACT2FN: dict[str, Callable] = {
    "gelu": F.gelu,
    "leaky_relu": F.leaky_relu,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "tanh": torch.tanh,
}


class GLUType(Enum):
    """GLU types of NxD's experts: ``GLU`` is ``act(gate) * up``; ``SWIGLU`` is
    ``gate * act(gate) * up``."""

    GLU = "glu"
    SWIGLU = "swiglu"

    @classmethod
    def validate(cls, glu_type):
        if isinstance(glu_type, cls):
            return glu_type
        if glu_type is None:
            glu_type = "glu"
        if glu_type not in [e.value for e in cls]:
            raise ValueError(f"glu_type={glu_type} not supported, must be one of {[e.value for e in cls]}")
        return cls(glu_type)


class ACTFunc(Enum):
    """Activation functions of NxD's MoE kernels (value: the kernel's id)."""

    def __new__(cls, id, name):
        obj = object.__new__(cls)
        obj._value_ = id
        obj.id = id
        obj.name_str = name
        return obj

    SILU = (0, "silu")
    GELU = (1, "gelu")
    GELU_TANH_APPROX = (2, "gelu_tanh_approx")
    SIGMOID = (3, "sigmoid")
    RELU = (4, "relu")
    TANH = (5, "tanh")
    LEAKY_RELU = (6, "leaky_relu")

    @classmethod
    def validate(cls, act_func):
        if isinstance(act_func, cls):
            return act_func
        if act_func is None:
            return cls.SIGMOID
        if isinstance(act_func, str):
            for member in cls:
                if member.name_str == act_func:
                    return member
            raise ValueError(f"act_func={act_func} not supported, must be one of: {[e.name_str for e in cls]}")
        raise ValueError(f"Invalid type for act_func: {type(act_func)}")


_KERNEL = "NxD's Neuron MoE kernel (NKI) and inference settings; nxd-moe computes the experts with torch"
__getattr__ = not_provided(__name__, dict.fromkeys((
    "get_kernel_activation_func_id", "create_spmd_ranks", "DEFAULT_SELECTIVE_LOADING_THRESHOLD", "DEFAULT_BLOCK_SIZE",
    "DEFAULT_SKIP_MODE", "DEFAULT_LNC_SIZE", "DEFAULT_PADDING_VALUE", "DEFAULT_HIDDEN_ACT_SCALING_FACTOR"), _KERNEL))
