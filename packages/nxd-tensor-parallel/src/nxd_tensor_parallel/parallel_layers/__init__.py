"""Tensor/sequence-parallel layers, their collectives, vocab-parallel loss, RNG and grad clipping."""

from nxd_core_parallel import parallel_state
from nxd_core_parallel.grads import clip_grad_norm, get_grad_norm
from nxd_core_parallel.parallel_state import initialize_model_parallel
from nxd_core_parallel.random import (
    get_rng_tracker,
    get_xla_rng_tracker,
    model_parallel_manual_seed,
    model_parallel_xla_manual_seed,
)
from nxd_tensor_parallel.parallel_layers.layer_norm import LayerNorm
from nxd_tensor_parallel.parallel_layers.layers import (
    ColumnParallelLinear,
    LocalLinear,
    ParallelEmbedding,
    RowParallelLinear,
)
from nxd_tensor_parallel.parallel_layers.loss_functions import mask_vocab_padding, parallel_cross_entropy
from nxd_tensor_parallel.parallel_layers.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from nxd_tensor_parallel.parallel_layers.utils import (
    copy_tensor_model_parallel_attributes,
    get_padding_length,
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
    split_tensor_along_last_dim,
)

__all__ = [
    "ColumnParallelLinear", "LayerNorm", "LocalLinear", "ParallelEmbedding", "RowParallelLinear", "clip_grad_norm",
    "copy_tensor_model_parallel_attributes", "copy_to_tensor_model_parallel_region",
    "gather_from_sequence_parallel_region", "gather_from_tensor_model_parallel_region", "get_grad_norm",
    "get_padding_length", "mask_vocab_padding",
    "get_rng_tracker", "get_xla_rng_tracker", "initialize_model_parallel", "model_parallel_manual_seed",
    "model_parallel_xla_manual_seed", "parallel_cross_entropy", "parallel_state",
    "reduce_from_tensor_model_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region", "scatter_to_tensor_model_parallel_region",
    "set_defaults_if_not_set_tensor_model_parallel_attributes", "set_tensor_model_parallel_attributes",
    "split_tensor_along_last_dim",
]
