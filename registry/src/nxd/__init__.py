"""nxd: open, hardware-neutral distributed training for PyTorch LLMs with NxD's API.

``import nxd`` is the drop-in for ``import neuronx_distributed as nxd``: the facade below keeps
NxD's names and signatures and dispatches to the installed plugins.
"""

from __future__ import annotations

__version__ = "0.1.0"

from nxd import parallel, transforms
from nxd.components import Command
from nxd.config import neuronx_distributed_config
from nxd.errors import ComponentNotFound, ConfigError, NxdError, PluginError
from nxd.hookspecs import PLUGIN_API_VERSION, hookimpl, hookspec
from nxd.lookup import (
    get_adapter,
    get_backend,
    get_checkpoint_converter,
    get_checkpoint_format,
    get_checkpointer,
    get_command,
    get_component,
    get_data_module,
    get_model,
    get_optimizer,
    get_schedule,
    get_storage,
    get_workflow,
    list_components,
)
from nxd.parallel import ParallelContext, ParallelDim, current_parallel_context, get_parallel_context
from nxd.plugins import register_plugin
from nxd.trainer import (
    finalize_checkpoint,
    has_checkpoint,
    initialize_parallel_model,
    initialize_parallel_optimizer,
    load_checkpoint,
    save_checkpoint,
)
from nxd.transforms import build_parallel_model

__all__ = [
    "PLUGIN_API_VERSION", "Command", "ComponentNotFound", "ConfigError", "NxdError", "ParallelContext", "ParallelDim",
    "PluginError", "build_parallel_model", "current_parallel_context", "get_parallel_context", "parallel", "transforms",
    "finalize_checkpoint", "get_adapter", "get_backend", "get_checkpoint_converter", "get_checkpoint_format", "get_checkpointer",
    "get_command", "get_component", "get_data_module", "get_model", "get_optimizer", "get_schedule",
    "get_storage", "get_workflow", "has_checkpoint", "hookimpl", "hookspec", "initialize_parallel_model",
    "initialize_parallel_optimizer", "list_components", "load_checkpoint", "neuronx_distributed_config",
    "register_plugin", "save_checkpoint",
]
