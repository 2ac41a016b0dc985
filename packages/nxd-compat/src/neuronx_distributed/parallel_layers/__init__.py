"""``neuronx_distributed.parallel_layers``: nxd-tensor-parallel's TP/SP layers and helpers.

The names are imported one by one (no star import): ``parallel_state`` here must be this package's
submodule, which adds NxD's extra getters to nxd-core-parallel's.
"""

from neuronx_distributed.parallel_layers import (  # noqa: F401
    checkpointing,
    grads,
    layer_norm,
    layers,
    loss_functions,
    mappings,
    pad,
    parallel_state,
    random,
    utils,
)
from neuronx_distributed.parallel_layers.checkpointing import load, save  # noqa: F401
from neuronx_distributed.utils.model_utils import move_model_to_device  # noqa: F401
from nxd_tensor_parallel.parallel_layers import (  # noqa: F401
    ColumnParallelLinear,
    LayerNorm,
    ParallelEmbedding,
    RowParallelLinear,
    clip_grad_norm,
    copy_tensor_model_parallel_attributes,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    get_grad_norm,
    get_rng_tracker,
    get_xla_rng_tracker,
    initialize_model_parallel,
    model_parallel_manual_seed,
    model_parallel_xla_manual_seed,
    parallel_cross_entropy,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
    split_tensor_along_last_dim,
)
