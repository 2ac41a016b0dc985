"""NxD's module tree beyond what its examples import: every name below (NxD Release 2.29's
public or example-used names of these modules) resolves, or raises an error that says what it is
and what to use; never a bare AttributeError or ModuleNotFoundError."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

#: module -> names, from aws-neuron/neuronx-distributed src/ at commit fbac349 (for parallel_layers.mappings
#: / utils / comm / layers_utils, modules.qkv_linear_utils / lora.*, trainer.checkpoint_storage: every name the
#: module defines at top level, private helpers included where NxD's scripts call them)
NXD_NAMES = {
    "neuronx_distributed.parallel_layers": ["save", "load", "ColumnParallelLinear", "parallel_state"],
    "neuronx_distributed.parallel_layers.checkpointing": ["save", "load", "get_sharded_model_dict",
                                                          "ensure_directory_exists"],
    "neuronx_distributed.parallel_layers.mappings": ["nonzero_partition_dim_swap", "_reduce",
        "_split_along_last_dim", "_split_along_first_dim", "_split_along_dim", "_gather_along_dim",
        "_gather_along_first_dim", "_gather_along_last_dim", "_reduce_scatter_along_first_dim",
        "_reduce_scatter_along_last_dim", "_reduce_scatter_along_dim", "_all_to_all_in_expert_parallel_region",
        "_CopyToModelParallelRegion", "_ReduceFromModelParallelRegion", "_ScatterToModelParallelRegion",
        "_GatherFromModelParallelRegion", "_ScatterToSequenceParallelRegion", "_GatherFromSequenceParallelRegion",
        "_ReduceScatterToSequenceParallelRegion", "_AllToAllInExpertParallelRegion",
        "_ScatterInputChannelsToModelParallelRegion", "copy_to_tensor_model_parallel_region",
        "reduce_from_tensor_model_parallel_region", "reduce_from_context_model_parallel_region",
        "scatter_input_channels_to_tensor_model_parallel_region", "scatter_to_tensor_model_parallel_region",
        "gather_from_tensor_model_parallel_region", "scatter_to_sequence_parallel_region",
        "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
        "reduce_scatter_to_tensor_model_parallel_region_with_dim",
        "gather_from_tensor_model_parallel_region_with_dim", "enter_expert_parallel_region",
        "exit_expert_parallel_region", "_ScatterToProcessGroupSPMD", "_RoundRobinScatterToProcessGroupSPMD",
        "scatter_to_process_group_spmd", "round_robin_scatter_to_process_group_spmd"],
    "neuronx_distributed.parallel_layers.utils": ["logger", "EmbeddingUtility",
        "param_is_not_tensor_parallel_duplicate", "set_tensor_model_parallel_attributes",
        "set_defaults_if_not_set_tensor_model_parallel_attributes", "copy_tensor_model_parallel_attributes",
        "ensure_divisibility", "divide", "split_tensor_along_dim", "get_padding_length",
        "split_tensor_along_last_dim", "split_tensor_along_second_dim", "is_torch_version_greater_than_2",
        "is_pjrt_device", "requires_init_pg_override", "cast_tensor", "cast_all", "cast_if_autocast_enabled",
        "move_all_tensor_to_cpu", "get_local_world_size", "move_model_to_device", "verify_casted_dtype",
        "indices_split_along_dim", "initialize_fallback_parallel_state"],
    "neuronx_distributed.parallel_layers.layers_utils": ["_linear_autograd_base_setup_fwd",
        "_linear_autograd_base_setup_bwd", "_linear_autograd_bwd_grad_reduce", "_linear_autograd_bwd_no_weight_grad",
        "_linear_autograd_bwd_input_grad"],
    "neuronx_distributed.parallel_layers.comm": ["logger", "cpu_reduce_scatter", "gloo_reduce_scatter",
        "reduce_scatter", "all_gather", "all_reduce"],
    "neuronx_distributed.modules.qkv_linear_utils": ["check_use_bias", "check_requires_grad",
        "_qkvlinear_autograd_base_setup_fwd", "_qkvlinear_autograd_base_setup_bwd",
        "_qkvlinear_autograd_bwd_grad_reduce", "_qkvlinear_autograd_bwd_no_weight_grad",
        "_qkvlinear_autograd_bwd_input_grad"],
    "neuronx_distributed.modules.lora.config": ["LoraConfig"],
    "neuronx_distributed.modules.lora.model": ["MODELS_TO_LORA_TARGET_MODULES_MAPPING", "logger", "WEIGHTS_NAME",
        "CONFIG_NAME", "LoraModel"],
    "neuronx_distributed.modules.lora.layer": ["LoraLayer", "LoraLinear", "LoraEmbedding", "LoraConv2d"],
    "neuronx_distributed.modules.lora.tp_layer": ["LoraParallelLinear", "LoraGQAQKVParallelLinear"],
    "neuronx_distributed.trainer.checkpoint_storage": ["logger", "MB", "SHM_PATH", "BaseCheckpointStorage",
        "FilesysCheckpointStorage", "wait_decrementing_with_jitter", "is_slow_down_error", "S3CheckpointStorage",
        "create_checkpoint_storage"],
    "neuronx_distributed.trainer.checkpoint": ["save_checkpoint", "load_checkpoint", "_xser_load_data"],
    "neuronx_distributed.pipeline.partition": ["create_partitions", "stage_to_pipeline_parallel_rank",
                                               "partition_traced_model"],
    "neuronx_distributed.scripts.checkpoint_converter": ["CheckpointConverterBase"],
    "neuronx_distributed.scripts.yaml_converter": ["convert_yaml_to_json"],
}
LIGHTNING = {f"neuronx_distributed.lightning.{m}": [c] for m, c in (
    ("checkpoint_io", "NeuronCheckpointIO"), ("logger", "NeuronTensorBoardLogger"), ("module", "NeuronLTModule"),
    ("neuron_hooks_callback", "NeuronHooksCallback"), ("precision_plugin", "NeuronXLAPrecisionPlugin"),
    ("progress_bar", "NeuronTQDMProgressBar"), ("strategy", "NeuronXLAStrategy"),
    ("accelerator", "NeuronXLAAccelerator"), ("launcher", "_NeuronXLALauncher"))}


def _cases():
    cases = list(NXD_NAMES.items())
    if importlib.util.find_spec("nxd_lightning") is not None:
        cases += list(LIGHTNING.items())
    return [(m, n) for m, names in cases for n in names]


@pytest.mark.parametrize(("module", "name"), _cases())
def test_nxd_name_resolves_or_says_why(module, name):
    mod = importlib.import_module(module)
    try:
        getattr(mod, name)
    except NotImplementedError as exc:
        assert f"{name} (NxD) is not provided" in str(exc) or name in str(exc)
    assert not hasattr(mod, "no_such_nxd_name")  # unknown names stay AttributeErrors (hasattr works)


def test_torch_neuronx_stand_in_names_the_platform_and_refuses_the_rest(xla_stand_in):
    from torch_neuronx.utils import get_platform_target

    from neuronx_distributed.utils.utils import hardware

    assert hardware(get_platform_target()) is hardware.CUSTOM
    import torch_neuronx

    with pytest.raises(RuntimeError, match="needs Neuron hardware"):
        torch_neuronx.trace  # noqa: B018


def test_torch_xla_stand_in_has_the_modules_older_nxd_examples_import(xla_stand_in):
    # NxD's examples up to Release 2.18 import torch_xla.distributed.xla_backend (and BERT's
    # torch_xla.debug.metrics) before init_process_group("xla")
    importlib.import_module("torch_xla.distributed.xla_backend")
    import torch_xla.debug.metrics as met

    assert "no XLA metrics" in met.metrics_report() and met.counter_names() == []
    with pytest.raises(RuntimeError, match="reads XLA's compiler metrics"):
        met.metric_data  # noqa: B018


def both_signatures_body() -> dict:
    import neuronx_distributed as nxd_api

    config = nxd_api.neuronx_distributed_config(tensor_parallel_size=1)

    def get_model(flags: dict, out: int = 1) -> torch.nn.Module:
        return torch.nn.Linear(flags["width"], out)

    # NxD <= 2.20: initialize_parallel_model(nxd_config, model_fn, *model_args) -- its examples' get_model(flags)
    old = nxd_api.initialize_parallel_model(config, get_model, {"width": 3}, out=2)
    # NxD >= 2.21: include_buffers third
    new = nxd_api.initialize_parallel_model(config, get_model, False, {"width": 5})
    return {"old": tuple(old.module.weight.shape), "new": tuple(new.module.weight.shape)}


def test_initialize_parallel_model_takes_both_nxd_signatures(rank_pool):
    for out in rank_pool(2).run(both_signatures_body):  # DP=2: the pool the other two-rank test uses
        assert out == {"old": (2, 3), "new": (1, 5)}


def collectives_body() -> dict:
    import torch.distributed as dist

    import nxd
    from neuronx_distributed.parallel_layers import mappings, parallel_state
    from neuronx_distributed.parallel_layers.utils import get_local_world_size
    from nxd_core_parallel.xla_model import reduce_gradients  # the torch_xla stand-in's xm

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank = dist.get_rank()
    x = torch.arange(12.0).view(4, 3)
    part = mappings._split_along_first_dim(x)
    out = {"split": torch.equal(part, x[2 * rank:2 * rank + 2]),
           "gather": torch.equal(mappings._gather_along_first_dim(part), x),
           "reduce_scatter": torch.equal(mappings._reduce_scatter_along_first_dim(x), 2 * x[2 * rank:2 * rank + 2]),
           "last": torch.equal(mappings._gather_along_last_dim(mappings._split_along_last_dim(x[:, :2])), x[:, :2]),
           "local_world": get_local_world_size()}
    # NxD's region autograd classes, called as NxD's code calls them
    y = x.clone().requires_grad_()
    mappings._CopyToModelParallelRegion.apply(y).sum().backward()
    out["regions"] = (torch.equal(mappings._ReduceFromModelParallelRegion.apply(x), 2 * x)
                      and torch.equal(mappings._GatherFromModelParallelRegion.apply(
                          mappings._ScatterToModelParallelRegion.apply(x[:, :2])), x[:, :2])
                      and torch.equal(y.grad, torch.full_like(x, 2.0)))
    layer = torch.nn.Linear(2, 1, bias=False)
    layer.weight.grad = torch.full_like(layer.weight, float(rank + 1))
    reduce_gradients(torch.optim.SGD(layer.parameters(), lr=1.0),
                     groups=parallel_state.get_tensor_model_parallel_group(as_list=True))
    out["grad"] = layer.weight.grad.flatten().tolist()
    # NxD's KV-group and world-group helpers: the groups nxd's GQA layers use, every rank
    parallel_state.initialize_kv_group(2, sequential_ranks_in_group=True)
    out["kv"] = list(nxd.get_parallel_context().kv_shared_dim(2).ranks)
    out["world"] = parallel_state.get_world_group(as_list=True)
    out["world_group"] = parallel_state.get_world_group() is dist.group.WORLD
    return out


def test_mapping_helpers_and_reduce_gradients_on_two_ranks(rank_pool):
    out = rank_pool(2).run(collectives_body)
    for o in out:
        assert o["split"] and o["gather"] and o["reduce_scatter"] and o["last"] and o["local_world"] == 2
        assert o["regions"]
        assert o["grad"] == [1.5, 1.5]  # (1 + 2) / world size, as torch-xla's xm.reduce_gradients
        assert o["kv"] == [0, 1] and o["world"] == [[0, 1]] and o["world_group"]


def test_nxd_helpers_compute_as_nxd_defines_them():
    from neuronx_distributed.modules.qkv_linear_utils import check_use_bias
    from neuronx_distributed.parallel_layers import utils
    from neuronx_distributed.parallel_layers.mappings import nonzero_partition_dim_swap
    from nxd_compat.surface import NotProvidedError

    assert utils.EmbeddingUtility.range_from_global_vocab_size(10, 1, 2) == (5, 10)
    x = torch.arange(24.0).view(2, 4, 3)
    assert [c.shape[1] for c in utils.split_tensor_along_second_dim(x, 2)] == [2, 2]
    assert utils.indices_split_along_dim(x, 1, 1, 2).tolist() == [2, 3]
    cast = utils.cast_all({"a": [x, torch.ones(1, dtype=torch.int64)]})
    assert cast["a"][0].dtype == torch.bfloat16 and cast["a"][1].dtype == torch.int64
    first_row = nonzero_partition_dim_swap(lambda t, dim: t[:1])
    assert torch.equal(first_row(x, 2), x[:, :, :1])
    w = torch.nn.Parameter(torch.ones(2))
    assert check_use_bias(None, False, w, torch.zeros(1), None) and not check_use_bias(w, True, None, None, None)
    utils.set_tensor_model_parallel_attributes(w, True, 0, 1, num_partitions=2)
    assert (w.tensor_model_parallel, w.partition_dim, w.num_partitions) == (True, 0, 2)
    with pytest.raises(NotProvidedError, match="rank_ordering"):
        utils.set_tensor_model_parallel_attributes(torch.nn.Parameter(torch.ones(2)), True, 0, 1, 2, [1, 0])
