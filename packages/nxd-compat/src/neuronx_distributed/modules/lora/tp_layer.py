"""``neuronx_distributed.modules.lora.tp_layer``: NxD's LoRA wrappers of TP layers (see ``layer``)."""

from nxd_compat.surface import not_provided

_USE = ("wrap the model with neuronx_distributed.modules.lora.LoraModel: nxd-lora adapts ColumnParallelLinear, "
        "RowParallelLinear and GQAQKVColumnParallelLinear in place")
__getattr__ = not_provided(__name__, {n: _USE for n in ("LoraParallelLinear", "LoraGQAQKVParallelLinear")})
