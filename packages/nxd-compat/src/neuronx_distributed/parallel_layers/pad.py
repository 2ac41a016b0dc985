"""``neuronx_distributed.parallel_layers.pad``: attention-head padding (NxD's ``pad_model``)."""

from typing import Any


def generate_padding_mask(num_heads: int, num_heads_with_pad: int, num_kv_heads: int, tp_degree: int, tp_rank: int,
                          hardware_type: Any = None) -> Any:
    raise NotImplementedError("padding attention heads to a multiple of the tensor parallel size (NxD's pad_model / "
                              "generate_padding_mask) is not implemented by nxd yet; choose a head count divisible "
                              f"by tp_degree={tp_degree}")


def pad_model(model: Any, tp_degree: int, n_heads: int, *args: Any, **kwargs: Any) -> Any:
    return generate_padding_mask(n_heads, n_heads, n_heads, tp_degree, 0)
