"""Typed component registries filled by the ``nxd_register_*`` hooks."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nxd.catalog import KIND_WORDS, provider_of
from nxd.errors import ComponentNotFound, PluginError

#: registration hook name -> component kind
REGISTRATION_HOOKS: dict[str, str] = {
    "nxd_register_backends": "backend",
    "nxd_register_models": "model",
    "nxd_register_pipeline_schedules": "pipeline_schedule",
    "nxd_register_optimizers": "optimizer",
    "nxd_register_model_transforms": "model_transform",
    "nxd_register_adapters": "adapter",
    "nxd_register_checkpoint_formats": "checkpoint_format",
    "nxd_register_storages": "storage",
    "nxd_register_checkpointers": "checkpointer",
    "nxd_register_data_modules": "data_module",
    "nxd_register_workflows": "workflow",
    "nxd_register_checkpoint_converters": "checkpoint_converter",
    "nxd_register_commands": "command",
}


@dataclass(frozen=True)
class Component:
    """One registered component and where it came from."""

    kind: str
    name: str
    obj: Any
    distribution: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Command:
    """A verb of the ``nxd`` command.

    ``add_arguments(parser)`` declares its options (and sub-verbs, if any);
    ``run(args) -> int`` executes it and returns the exit code.
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class Registrar:
    """What a registration hook receives: adds components of one kind on behalf of one plugin."""

    def __init__(self, components: Components, kind: str, distribution: str) -> None:
        self._components = components
        self.kind = kind
        self.distribution = distribution

    def add(self, name: str, obj: Any, **metadata: Any) -> None:
        """Register ``obj`` under ``name``; a name another distribution registered is an error."""
        self._components.add(Component(self.kind, name, obj, self.distribution, metadata))


class Components:
    """All registered components, by kind and name."""

    def __init__(self) -> None:
        self._by_kind: dict[str, dict[str, Component]] = {kind: {} for kind in REGISTRATION_HOOKS.values()}
        # (kind, name) -> why: names two plugins registered; using one is an error, never a silent pick
        self._conflicts: dict[tuple[str, str], str] = {}

    def add(self, component: Component) -> None:
        self.check_free(component)
        self._by_kind[component.kind][component.name] = component

    def check_free(self, component: Component) -> None:
        """Raise :class:`PluginError` unless ``component`` is well-formed and its name is free."""
        word = KIND_WORDS[component.kind]
        if not isinstance(component.name, str) or not component.name:
            raise PluginError(
                f"{component.distribution} registered a {word} with an invalid name "
                f"{component.name!r}: names are non-empty strings"
            )
        if component.obj is None:
            raise PluginError(f"{component.distribution} registered the {word} {component.name!r} as None")
        if component.kind == "model_transform":
            from nxd.transforms import check_transform

            check_transform(component.name, component.obj, component.distribution)
        existing = self._by_kind[component.kind].get(component.name)
        if existing is not None:
            message = (
                f"{word} {component.name!r} is registered twice: by "
                f"{existing.distribution} and by {component.distribution}. Uninstall one of them, or "
                "disable one with NXD_DISABLE_PLUGINS."
            )
            self._conflicts[(component.kind, component.name)] = message
            raise PluginError(message)

    def names(self, kind: str) -> list[str]:
        # a kind no installed hook defines yet (e.g. a newer plugin API's) simply has no components
        return sorted(self._by_kind.get(kind, {}))

    def all(self, kind: str | None = None) -> list[Component]:
        kinds = [kind] if kind else list(self._by_kind)
        return [c for k in kinds for c in sorted(self._by_kind[k].values(), key=lambda c: c.name)]

    def record(self, kind: str, name: str) -> Component:
        """The :class:`Component` registered as ``name``; a miss names what to install."""
        if kind not in self._by_kind:
            raise ComponentNotFound(f"unknown component kind {kind!r}; kinds: {', '.join(self._by_kind)}")
        if (kind, name) in self._conflicts:
            raise PluginError(self._conflicts[(kind, name)])
        try:
            return self._by_kind[kind][name]
        except KeyError:
            raise ComponentNotFound(missing_message(kind, name, self.names(kind))) from None


def missing_message(kind: str, name: str, installed: list[str], need: str | None = None) -> str:
    """``need`` says why the component was asked for, e.g. ``"pipeline_parallel_size=2"``."""
    word = KIND_WORDS.get(kind, kind)
    provider = provider_of(kind, name)
    have = ", ".join(installed) if installed else "none"
    head = f"{need} needs the {word} {name!r}" if need else f"no {word} named {name!r} is installed"
    if provider:
        return f"{head}: pip install {provider} (installed {word}s: {have})"
    # not one of nxd's own distributions: a third-party plugin's name, or one nothing provides
    return (f"{head}; installed {word}s: {have}. No nxd distribution provides {name!r}; "
            f"if a third-party plugin does, install it (`nxd plugins` lists what is installed)")
