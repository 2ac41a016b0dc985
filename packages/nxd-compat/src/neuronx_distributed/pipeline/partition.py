"""``neuronx_distributed.pipeline.partition``: NxD's layer partitioning helpers.

``create_partitions`` and ``stage_to_pipeline_parallel_rank`` are vendored from aws-neuron/
neuronx-distributed (Apache-2.0), ``src/neuronx_distributed/pipeline/partition.py`` at commit
fbac349 (Release 2.29). NxD's FX-tracing partitioner (``partition_traced_model``,
``analyze_pipeline_module``) is not provided: nxd-pipeline cuts models without tracing.
"""

from typing import Any

# module globals, as in NxD, so that mock.patch("neuronx_distributed.pipeline.partition.get_pipeline_model_parallel_size")
# changes stage_to_pipeline_parallel_rank's default as it does in NxD
from neuronx_distributed.parallel_layers.parallel_state import (  # noqa: F401
    get_pipeline_model_parallel_rank,
    get_pipeline_model_parallel_size,
)

__all__ = ["create_partitions", "stage_to_pipeline_parallel_rank"]

_TRACING = ("partition_traced_model", "analyze_pipeline_module", "analyze_shared_weights_across_stages")


def stage_to_pipeline_parallel_rank(stage: int, pp_size: int | None = None) -> int:
    if pp_size is None:
        pp_size = get_pipeline_model_parallel_size()
    return stage % pp_size


def create_partitions(pipeline_parallel_size: int, model_layer_names: list[str]) -> list[str]:
    """
    Evenly split the transformer layers between the PP ranks.
    If the transformer layers are not evenly divisible by the PP ranks, we distribute the remaining layers to the
    latter pipeline ranks.
    """
    num_hidden_layers = len(model_layer_names)
    num_layer_per_partition = num_hidden_layers // pipeline_parallel_size
    assert num_layer_per_partition >= 1, f"The partition cannot be created; num_hidden_layers should be atleast equal to \
        pipeline_parallel_size, but found num_hidden_layers = {num_hidden_layers} and pipeline_parallel_size = {pipeline_parallel_size}"
    layers_per_partition = [num_layer_per_partition for x in range(pipeline_parallel_size)]
    remainder = num_hidden_layers % pipeline_parallel_size
    if remainder > 0:
        for i in range(-remainder, 0):
            layers_per_partition[i] += 1
    assert sum(layers_per_partition) == num_hidden_layers

    pipeline_cuts = []
    current_cut = 0
    for layers in layers_per_partition[:-1]:
        current_cut += layers
        pipeline_cuts.append(model_layer_names[current_cut - 1])
    assert len(pipeline_cuts) == (pipeline_parallel_size - 1)
    return pipeline_cuts


def __getattr__(name: str) -> Any:
    if name in _TRACING:
        raise NotImplementedError(f"neuronx_distributed.pipeline.partition.{name} works on an FX-traced model; "
                                  "nxd-pipeline does not trace (docs/pipeline.md: declare nxd_pipeline_* methods or "
                                  "use the Hugging Face decoder layout)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
