"""Every ``neuronx_distributed`` name NxD's examples import resolves through nxd-compat.

Two sources: the vendored Llama examples (parsed here, so a newly vendored file is checked too),
and the full list of the 54 distinct names imported by aws-neuron/neuronx-distributed's
``examples/training`` at fbac349 (Release 2.29), which includes the DBRX/BERT/GPT-NeoX examples.
Names nxd implements in an optional plugin must fail with an ImportError naming the distribution.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent / "nxd_examples"

#: The 54 names (module[.attribute]) imported by NxD's examples/training at fbac349.
NXD_EXAMPLE_NAMES = """
neuronx_distributed
neuronx_distributed.kernels.flash_attn.nki_flash_attn_func
neuronx_distributed.kernels.ring_attention_kernel.nki_ring_attn_func
neuronx_distributed.lightning.NeuronHooksCallback
neuronx_distributed.lightning.NeuronLTModule
neuronx_distributed.lightning.NeuronTQDMProgressBar
neuronx_distributed.lightning.NeuronTensorBoardLogger
neuronx_distributed.lightning.NeuronXLAPrecisionPlugin
neuronx_distributed.lightning.NeuronXLAStrategy
neuronx_distributed.modules.lora.LoraConfig
neuronx_distributed.modules.moe.expert_mlps.ExpertMLPs
neuronx_distributed.modules.moe.loss_function.load_balancing_loss_func
neuronx_distributed.modules.moe.model.MoE
neuronx_distributed.modules.moe.routing.RouterTopK
neuronx_distributed.modules.qkv_linear.GQAQKVColumnParallelLinear
neuronx_distributed.optimizer.NeuronZero1Optimizer
neuronx_distributed.overrides.transformer_overrides.apply_rotary_pos_emb
neuronx_distributed.parallel_layers.ColumnParallelLinear
neuronx_distributed.parallel_layers.ParallelEmbedding
neuronx_distributed.parallel_layers.RowParallelLinear
neuronx_distributed.parallel_layers.checkpointing
neuronx_distributed.parallel_layers.grads
neuronx_distributed.parallel_layers.layer_norm
neuronx_distributed.parallel_layers.layer_norm.LayerNorm
neuronx_distributed.parallel_layers.layers
neuronx_distributed.parallel_layers.layers.ColumnParallelLinear
neuronx_distributed.parallel_layers.layers.ParallelEmbedding
neuronx_distributed.parallel_layers.layers.RowParallelLinear
neuronx_distributed.parallel_layers.loss_functions.parallel_cross_entropy
neuronx_distributed.parallel_layers.mappings
neuronx_distributed.parallel_layers.move_model_to_device
neuronx_distributed.parallel_layers.pad.generate_padding_mask
neuronx_distributed.parallel_layers.parallel_state
neuronx_distributed.parallel_layers.parallel_state.get_context_model_parallel_rank
neuronx_distributed.parallel_layers.parallel_state.get_context_model_parallel_size
neuronx_distributed.parallel_layers.parallel_state.get_context_model_parallel_src_tgt_pairs
neuronx_distributed.parallel_layers.parallel_state.get_data_parallel_rank
neuronx_distributed.parallel_layers.parallel_state.get_data_parallel_size
neuronx_distributed.parallel_layers.parallel_state.get_pipeline_model_parallel_rank
neuronx_distributed.parallel_layers.parallel_state.get_tensor_model_parallel_rank
neuronx_distributed.parallel_layers.parallel_state.get_tensor_model_parallel_size
neuronx_distributed.parallel_layers.parallel_state.initialize_model_parallel
neuronx_distributed.parallel_layers.parallel_state.rmsg
neuronx_distributed.parallel_layers.random.model_parallel_xla_manual_seed
neuronx_distributed.parallel_layers.utils
neuronx_distributed.parallel_layers.utils.requires_init_pg_override
neuronx_distributed.scripts.checkpoint_converter.CheckpointConverterBase
neuronx_distributed.trainer.initialize_parallel_model
neuronx_distributed.trainer.initialize_parallel_optimizer
neuronx_distributed.utils.adamw_fp32_optim_params.AdamW_FP32OptimParams
neuronx_distributed.utils.batch_utils.get_batch_on_this_context_parallel_rank
neuronx_distributed.utils.logger.get_logger
neuronx_distributed.utils.model_utils.move_model_to_device
neuronx_distributed.utils.utils.hardware
""".split()

#: Name prefixes served by an optional nxd plugin: (module that provides them, distribution).
OPTIONAL = {"neuronx_distributed.modules.moe": ("nxd_moe", "nxd-moe"),
            "neuronx_distributed.lightning": ("lightning", "nxd-compat[lightning]")}

#: Names the examples call unconditionally (the rest only in certain modes); also checked by attribute.
NXD_CALLED_ATTRIBUTES = {
    "neuronx_distributed": ["neuronx_distributed_config", "initialize_parallel_model", "initialize_parallel_optimizer",
                            "save_checkpoint", "load_checkpoint", "has_checkpoint", "finalize_checkpoint"],
    "neuronx_distributed.parallel_layers.parallel_state": [
        "get_context_model_parallel_group", "get_data_parallel_replica_groups", "arrange_kv_groups",
        "get_tensor_model_parallel_group", "get_data_parallel_group", "model_parallel_is_initialized"],
}


def vendored_names() -> set[str]:
    names = set()
    for path in EXAMPLES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("neuronx_distributed"):
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("neuronx_distributed"))
    return names


def resolve(name: str) -> object:
    """``import a.b.c`` if it is a module, else ``from a.b import c``."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def optional_owner(name: str) -> tuple[str, str] | None:
    for prefix, owner in OPTIONAL.items():
        if name == prefix or name.startswith(prefix + "."):
            return owner
    return None


def test_vendored_examples_are_in_the_full_list():
    assert vendored_names() <= set(NXD_EXAMPLE_NAMES), vendored_names() - set(NXD_EXAMPLE_NAMES)
    assert len(NXD_EXAMPLE_NAMES) == len(set(NXD_EXAMPLE_NAMES)) == 54


@pytest.mark.parametrize("name", NXD_EXAMPLE_NAMES)
def test_name_resolves(name):
    owner = optional_owner(name)
    if owner is not None and importlib.util.find_spec(owner[0]) is None:
        with pytest.raises(ImportError, match=f"pip install {owner[1].split('[')[0]}"):
            resolve(name)
        return
    assert resolve(name) is not None


@pytest.mark.parametrize("module", sorted(NXD_CALLED_ATTRIBUTES))
def test_called_names_exist(module):
    imported = importlib.import_module(module)
    missing = [a for a in NXD_CALLED_ATTRIBUTES[module] if not hasattr(imported, a)]
    assert not missing, missing


def test_head_padding_is_nxd_core_parallels():
    """NxD's DBRX example masks padded query heads with ``generate_padding_mask(...,
    hardware_type=hardware(get_platform_target()))``: on nxd that is its own (NxD's trn2) KV layout."""
    from neuronx_distributed.parallel_layers.pad import generate_padding_mask, pad_model
    from neuronx_distributed.utils.utils import get_platform_target, hardware
    from nxd_tensor_parallel.parallel_layers import pad

    assert pad_model is pad.pad_model
    masks = [generate_padding_mask(48, 64, 8, 32, r, hardware_type=hardware(get_platform_target())) for r in range(4)]
    assert [m.tolist() for m in masks] == [[True, True]] * 3 + [[False, False]]
    with pytest.raises(ValueError, match="adjacent ranks"):
        generate_padding_mask(48, 64, 8, 32, 0, hardware_type=hardware.TRN1)
