"""``neuronx_distributed.parallel_layers.pad``: attention-head padding (NxD's ``pad_model``), from
nxd-core-parallel."""

from typing import Any

from nxd_core_parallel.parallel_layers.pad import get_number_of_extra_heads, pad_model

__all__ = ["generate_padding_mask", "get_number_of_extra_heads", "pad_model"]


def generate_padding_mask(num_heads: int, num_heads_with_pad: int, num_kv_heads: int, tp_degree: int, tp_rank: int,
                          hardware_type: Any = None) -> Any:
    raise NotImplementedError("generate_padding_mask masks padded query heads in NxD inference's Trainium KV-head "
                              "layouts (trn1/trn2), which nxd does not have; nxd's pad_model pads whole heads with "
                              "zeros (exact without a mask) in models built from ColumnParallelLinear/"
                              f"RowParallelLinear. For GQA, choose a tensor-parallel size dividing {num_heads}")
