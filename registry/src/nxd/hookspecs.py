"""The hook contracts between the nxd core and its plugins (pluggy project ``"nxd"``).

Two families:

* **Registration hooks** (``nxd_register_*``) receive a :class:`nxd.components.Registrar` bound to
  one kind of component and to the calling plugin's distribution, and call
  ``registrar.add(name, component, **metadata)``. The core calls each plugin's implementation
  separately so a duplicate name is reported with both distributions.
* **Lifecycle hooks** run while the NxD facade sets up parallel state, models and optimizers.

Compatibility rule: adding a parameter to a hook is compatible (pluggy passes only the arguments an
implementation names); renaming or removing a hook or parameter is a major plugin-API change. The
lifecycle hooks that run with model parallelism set up receive it as ``context`` (the
:class:`nxd.parallel.ParallelContext`, or ``None`` when ``torch.distributed`` is not initialised);
an implementation written before the argument existed simply does not name it.
Every hook is documented in docs/hooks.md; a test keeps the two in step.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT_NAME = "nxd"
#: The plugin-API version this core speaks. Plugins declare ``NXD_PLUGIN_API = (min, max)``.
#: 2: model transforms (``nxd_register_model_transforms``), the typed ``NxdConfig``.
#: 3: the context is passed everywhere (layers, losses, grads, HF import/export, ``nxd.save/load``
#: take it; the one fallback is ``nxd.parallel.resolve_context``), a family's parallel plan is data
#: applied by transforms, ``nxd_plan_run``; version 1's ``nxd_wrap_model`` is gone. Migration notes
#: in docs/hooks.md.
#: 4: transforms declare a named ``slot`` of the recipe (integer ``order`` and its anchors are
#: gone), may take the family (``spec``) and an ``after_optimizer_step``; ``nxd_wrap_optimizer`` is
#: gone (its one use, nxd-moe's balancer, is the ``expert_parallel`` transform's ``after_optimizer_step``);
#: hooks, transforms and optimizer factories receive the typed ``nxd.run_config.RunConfig`` (not a dict).
PLUGIN_API_VERSION = 4
#: The oldest plugin-API version still accepted (what a later version removed, a hook or a transform's
#: integer order, is refused naming its replacement).
OLDEST_PLUGIN_API = 2
#: Hooks an older plugin-API had, -> what replaces them (a plugin still implementing one is refused
#: with this advice rather than as a misspelling).
REMOVED_HOOKS = {
    "nxd_wrap_model": "removed in plugin-API 3: register a model transform instead (nxd_register_model_transforms "
                      "with nxd.transforms.ModelTransform in the phase's slot; docs/hooks.md, migrating to 3)",
    "nxd_wrap_optimizer": "removed in plugin-API 4: give your model transform an after_optimizer_step(optimizer, "
                          "context, config) returning what runs after each step (docs/hooks.md, migrating to 4)",
}

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------- registration hooks
@hookspec
def nxd_register_backends(registry: Any) -> None:
    """Register device backends (``cpu``, ``cuda``, ``xla``, ...).

    A backend object provides ``name``, ``is_available() -> bool``, ``device()``,
    ``process_group_backend`` (e.g. ``"gloo"``) and ``synchronize()``.
    """


@hookspec
def nxd_register_models(registry: Any) -> None:
    """Register model specs (``llama``, ...): how to build one from a config, its transformer
    layer classes, core-attention classes, Hugging Face key mapping and default LoRA targets.
    The contract is documented in docs/plugins/models.md."""


@hookspec
def nxd_register_pipeline_schedules(registry: Any) -> None:
    """Register pipeline schedules by name (``gpipe``, ``1f1b``, ``interleaved_1f1b``, ...)."""


@hookspec
def nxd_register_optimizers(registry: Any) -> None:
    """Register optimizer wrapper factories: ``default`` (data-parallel all-reduce + clipping)
    and ``zero1``. A factory is called as ``factory(nxd_config, optimizer_class, parameters,
    **defaults)`` and returns a ``torch.optim.Optimizer``; a factory that names a ``context``
    parameter also receives the parallel context (``nxd.parallel.call_with_context``).
    ``initialize_parallel_optimizer`` does not pick one by name: the data-parallel strategy (a
    model transform, ``nxd_register_model_transforms``) makes the optimizer, usually with one of these."""


@hookspec
def nxd_register_model_transforms(registry: Any) -> None:
    """Register model transforms (kind ``model_transform``): the ordered, open list that applies
    parallelism and every other model rewrite after a model is built (parallel plan, low precision,
    adapters, activation checkpointing, compile, pipeline split, the data-parallel strategy). A
    transform has ``name``, ``order``, ``applies(context, config)`` and ``apply(model, context,
    config)``; a data-parallel strategy also ``make_optimizer``. Contract: :mod:`nxd.transforms`."""


@hookspec
def nxd_register_adapters(registry: Any) -> None:
    """Register parameter-efficient adapters (``lora``). An adapter is called as
    ``adapter(model, adapter_config) -> nn.Module``."""


@hookspec
def nxd_register_checkpoint_formats(registry: Any) -> None:
    """Register checkpoint file formats (``torch``, ``safetensors``, ...)."""


@hookspec
def nxd_register_storages(registry: Any) -> None:
    """Register checkpoint storages by URL scheme (``file``, ``s3``, ...)."""


@hookspec
def nxd_register_checkpointers(registry: Any) -> None:
    """Register the engine behind ``nxd.save_checkpoint``/``load_checkpoint`` (name ``default``):
    an object with ``save``, ``load``, ``has_checkpoint`` and ``finalize`` methods. Methods that
    name a ``context`` parameter receive the parallel context."""


@hookspec
def nxd_register_data_modules(registry: Any) -> None:
    """Register data modules selected by name from the YAML config (``indexed``, ``sft``, ...)."""


@hookspec
def nxd_register_workflows(registry: Any) -> None:
    """Register training workflows (``dpo``, ``orpo``, ...) selected by the YAML's
    ``model_alignment_strategy`` key. A workflow is a :class:`nxd.specs.WorkflowFactory`."""


@hookspec
def nxd_register_checkpoint_converters(registry: Any) -> None:
    """Register checkpoint converters for ``nxd ckpt convert --from NAME --to NAME`` (``hf``,
    ``nxd``, ``full``, ``nnm``, ...): objects with ``read(request) -> FullState`` and/or
    ``write(full_state, request)`` (nxd-ckpt's ``nxd_ckpt.Converter``)."""


@hookspec
def nxd_register_commands(registry: Any) -> None:
    """Register verbs of the ``nxd`` command. A command is a :class:`nxd.components.Command`."""


# --------------------------------------------------------------------------- lifecycle hooks
@hookspec(firstresult=True)
def nxd_initialize_parallel(nxd_config: dict) -> Any:
    """Set up the process groups of every parallel dimension for ``nxd_config`` (called by
    ``neuronx_distributed_config`` when ``torch.distributed`` is initialized) and return the
    :class:`nxd.parallel.ParallelContext` built; the core makes it current."""


@hookspec(firstresult=True)
def nxd_build_model(nxd_config: dict, model_fn: Any, model_args: tuple, model_kwargs: dict,
                    include_buffers: bool, context: Any) -> Any:
    """Build the user's model for ``initialize_parallel_model`` (meta-device init, bounded
    concurrent materialisation, device placement on ``context.device``). Return the ``nn.Module``
    or ``None``. ``include_buffers``: meta-device init also puts buffers on the meta device (NxD's
    argument). ``context``: the parallel context (``None`` without ``torch.distributed``)."""


@hookspec
def nxd_validate_config(nxd_config: dict) -> None:
    """Check a plugin's part of an NxD config; raise :class:`nxd.errors.ConfigError` naming the
    field and the valid values."""


@hookspec(firstresult=True)
def nxd_plan_run(config: Any, device_memory_gib: Any) -> Any:
    """Plan a resolved training config before any rank starts (``nxd train`` calls it through
    :func:`nxd.trainer.plan_run`; nxd-plan implements it). Return the plan's one-line summary (a
    ``str``) or ``None``. Raise :class:`nxd.errors.ConfigError` when a rank cannot be built (the
    planner builds the ranks before launch: name the rank and the config key) or when the plan proves
    a rank cannot fit the device memory (``device_memory_gib``, else the memory of the config's
    device type when known), naming the rank and the nearest layouts that fit; never for a memory
    that is unknown."""


@hookspec
def nxd_checkpoint_extras(model: Any, path: str, tag: str, phase: str, context: Any) -> None:
    """Write or read a plugin's own files next to a checkpoint. The checkpointer calls it (through
    :func:`nxd.trainer.checkpoint_extras`) on every rank with ``phase="saved"`` once ``path/tag`` is
    committed, and with ``phase="loaded"`` after ``load_checkpoint`` restored ``model``. Collective:
    implementations must act (or not) alike on every rank. ``context``: the parallel context the
    checkpointer saved or loaded with."""
