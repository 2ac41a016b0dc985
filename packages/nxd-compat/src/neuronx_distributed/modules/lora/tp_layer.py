"""``neuronx_distributed.modules.lora.tp_layer``: NxD's LoRA wrappers of TP layers (see ``layer``).

The adapter is sharded as its base (nxd-lora's rule, NxD's and PEFT's): A replicated and B split
over the output for a column-parallel base, A split over the input and B replicated for a
row-parallel one; GQA's q/k/v get one A/B pair each.
"""

from neuronx_distributed.modules.lora.layer import LoraLayer
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["LoraGQAQKVParallelLinear", "LoraParallelLinear"]


class LoraParallelLinear(LoraLayer):
    accepts = (ColumnParallelLinear, RowParallelLinear)


class LoraGQAQKVParallelLinear(LoraLayer):
    accepts = (GQAQKVColumnParallelLinear,)
