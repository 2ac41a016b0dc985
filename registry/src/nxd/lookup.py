"""Typed lookups of registered components. A miss names the distribution to install."""

from __future__ import annotations

from typing import Any

from nxd.components import Component, missing_message
from nxd.errors import ComponentNotFound
from nxd.plugins import state


def get_component(kind: str, name: str, *, need: str | None = None) -> Any:
    """The component ``name`` of ``kind``. ``need`` explains the request in the error message,
    e.g. ``need="pipeline_parallel_size=2"``."""
    components = state().components
    try:
        return components.record(kind, name).obj
    except ComponentNotFound:
        if need is None:
            raise
        raise ComponentNotFound(missing_message(kind, name, components.names(kind), need)) from None


def component_record(kind: str, name: str) -> Component:
    return state().components.record(kind, name)


def list_components(kind: str) -> list[str]:
    """Names registered for ``kind`` (``"model"``, ``"pipeline_schedule"``, ...)."""
    return state().components.names(kind)


def get_backend(name: str) -> Any:
    return get_component("backend", name)


def get_model(name: str) -> Any:
    return get_component("model", name)


def get_schedule(name: str) -> Any:
    return get_component("pipeline_schedule", name)


def get_optimizer(name: str) -> Any:
    return get_component("optimizer", name)


def get_adapter(name: str) -> Any:
    return get_component("adapter", name)


def get_checkpoint_format(name: str) -> Any:
    return get_component("checkpoint_format", name)


def get_storage(name: str) -> Any:
    return get_component("storage", name)


def get_checkpointer(name: str = "default") -> Any:
    return get_component("checkpointer", name)


def get_data_module(name: str) -> Any:
    return get_component("data_module", name)


def get_workflow(name: str, *, need: str | None = None) -> Any:
    """The training workflow ``name`` (``dpo``, ``orpo``): a :class:`nxd.specs.WorkflowFactory`."""
    return get_component("workflow", name, need=need)


def get_checkpoint_converter(name: str) -> Any:
    return get_component("checkpoint_converter", name)


def get_command(name: str) -> Any:
    return get_component("command", name)
