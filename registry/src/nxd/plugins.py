"""Plugin discovery: entry points in the ``nxd.plugins`` group, loaded on first use.

Environment controls (comma-separated entry-point or distribution names):

* ``NXD_LOAD_PLUGINS`` — load only these plugins;
* ``NXD_DISABLE_PLUGINS`` — never load these;
* ``NXD_STRICT_PLUGINS=1`` — a plugin that fails to import, declares an unsupported plugin-API
  version, or implements an unknown hook raises instead of being skipped with a warning.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from nxd import hookspecs
from nxd.components import REGISTRATION_HOOKS, Component, Components, Registrar
from nxd.errors import NxdError, PluginError

ENTRY_POINT_GROUP = "nxd.plugins"
CORE_DISTRIBUTION = "nxd"


class PluginWarning(UserWarning):
    """A plugin was skipped; the message says which and why."""


@dataclass
class PluginInfo:
    """What ``nxd plugins`` reports about one plugin."""

    name: str
    distribution: str
    version: str
    module: str
    status: str = "loaded"  # loaded | skipped | disabled | failing (a hook raised when called)
    reason: str = ""
    components: dict[str, list[str]] = field(default_factory=dict)


def _env_names(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def strict_mode() -> bool:
    return os.environ.get("NXD_STRICT_PLUGINS", "").lower() in {"1", "true", "yes", "on"}


class PluginState:
    """The plugin manager, what it loaded, and the components the plugins registered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self._distribution_of: dict[str, str] = {}
        self.components = Components()

    # ------------------------------------------------------------------ loading
    def load_entry_points(self) -> None:
        from nxd import builtin

        self.register(builtin, name="nxd", distribution=CORE_DISTRIBUTION, version=_version(CORE_DISTRIBUTION))
        only, disabled = _env_names("NXD_LOAD_PLUGINS"), _env_names("NXD_DISABLE_PLUGINS") or set()
        first_party = _first_party_distributions()

        def dist_of(ep: metadata.EntryPoint) -> str:
            return ep.dist.name if ep.dist is not None else "<unknown distribution>"

        # by name, a first-party distribution before any other: a clash never disables a built-in
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP),
                         key=lambda e: (e.name, dist_of(e) not in first_party, dist_of(e))):
            dist = dist_of(ep)
            version = ep.dist.version if ep.dist is not None else "?"
            if (only is not None and not ({ep.name, dist} & only)) or ({ep.name, dist} & disabled):
                self.infos.append(PluginInfo(ep.name, dist, version, ep.value, "disabled", "by environment"))
                continue
            if self.pm.has_plugin(ep.name):  # not imported: the name is taken, and only one may hold it
                other = self._distribution_of.get(ep.name, "?")
                self._skip(PluginInfo(ep.name, dist, version, ep.value),
                           f"its plugin name {ep.name!r} is already taken by {other}; rename the entry point in "
                           f"{dist}'s [project.entry-points.\"{ENTRY_POINT_GROUP}\"]")
                continue
            try:
                module = ep.load()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - a plugin's sys.exit() at import must not end nxd
                self._skip(PluginInfo(ep.name, dist, version, ep.value), f"failed to import: {exc!r}", exc)
                continue
            self.register(module, name=ep.name, distribution=dist, version=version)

    def register(self, plugin: Any, *, name: str, distribution: str, version: str = "0") -> bool:
        """Register one plugin object (module or instance). Returns whether it was accepted."""
        info = PluginInfo(name, distribution, version, getattr(plugin, "__name__", type(plugin).__name__))
        problem = _api_problem(plugin)
        if problem:
            return self._skip(info, problem)
        if self.pm.has_plugin(name):
            other = self._distribution_of.get(name, "?")
            raise PluginError(f"two plugins are named {name!r}: one from {other}, one from {distribution}")
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:  # a hook implementation with arguments its spec lacks
            return self._skip(info, f"a hook implementation does not match nxd's hook contract: {exc}", exc)
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(name=name)
            return self._skip(info, f"implements a hook nxd does not define (misspelled?): {exc}", exc)
        try:
            staged = self._stage(plugin, info)
        except PluginError as exc:
            self.pm.unregister(name=name)
            return self._skip(info, str(exc), exc)
        self._distribution_of[name] = distribution
        self.infos.append(info)
        for component in staged:
            self.components.add(component)
        return True

    def _skip(self, info: PluginInfo, reason: str, cause: BaseException | None = None) -> bool:
        message = f"nxd plugin {info.name!r} from {info.distribution} was skipped: {reason}"
        if strict_mode():
            raise PluginError(message + " (NXD_STRICT_PLUGINS is set)") from cause
        warnings.warn(message, PluginWarning, stacklevel=3)
        info.status, info.reason = "skipped", reason
        self.infos.append(info)
        return False

    def _stage(self, plugin: Any, info: PluginInfo) -> list[Component]:
        """Run the plugin's registration hooks into a private registry, so a hook that raises, or a
        name another plugin already holds, rejects this plugin whole and leaves the others intact."""
        staged = Components()
        for hook_name, kind in REGISTRATION_HOOKS.items():
            impl = getattr(plugin, hook_name, None)
            if impl is None or not hasattr(impl, hookspecs.PROJECT_NAME + "_impl"):
                continue
            try:
                impl(registry=Registrar(staged, kind, info.distribution))
            except PluginError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure makes the plugin unusable
                raise PluginError(f"its {hook_name} hook raised {exc!r}") from exc
            if staged.names(kind):
                info.components[kind] = staged.names(kind)
        for component in staged.all():
            self.components.check_free(component)
        return staged.all()

    # ------------------------------------------------------------------ calling hooks
    def _results(self, hook_name: str, optional: bool, kwargs: dict[str, Any]) -> Iterator[Any]:
        """Each implementation's non-None result in pluggy's order, called lazily one at a time."""
        for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):
            try:
                result = impl.function(**{k: kwargs[k] for k in impl.argnames})
            except NxdError:
                raise
            except Exception as exc:  # noqa: BLE001 - a plugin's bug is reported as the plugin's
                self.report_failure(impl.plugin_name, hook_name, exc, optional=optional)
                continue
            if result is not None:
                yield result

    def call_each(self, hook_name: str, *, optional: bool, **kwargs: Any) -> list[Any]:
        """Call every implementation of ``hook_name``, one at a time, so a failure names its plugin
        and distribution. nxd's own errors (a ``ConfigError`` refusing a config) pass through; any
        other exception is a broken plugin: ``optional`` hooks warn, mark the plugin ``failing`` in
        ``nxd plugins`` and go on without it, others raise :class:`PluginError`."""
        return list(self._results(hook_name, optional, kwargs))

    def call_first(self, hook_name: str, *, optional: bool, **kwargs: Any) -> Any:
        """A ``firstresult`` hook called like :meth:`call_each`: implementations in pluggy's order
        until one returns a value, a failing one named (and, when ``optional``, skipped)."""
        return next(self._results(hook_name, optional, kwargs), None)

    def report_failure(self, plugin_name: str, hook_name: str, exc: BaseException, *, optional: bool) -> None:
        dist = self._distribution_of.get(plugin_name, "?")
        reason = f"its {hook_name} hook raised {exc!r}"
        message = f"nxd plugin {plugin_name!r} from {dist}: {reason}"
        if not optional or strict_mode():
            raise PluginError(message + (" (NXD_STRICT_PLUGINS is set)" if optional else "")) from exc
        for info in self.infos:
            if info.name == plugin_name and info.status in ("loaded", "failing") and reason not in info.reason:
                info.status, info.reason = "failing", "; ".join(r for r in (info.reason, reason) if r)
        warnings.warn(message + "; skipped it (this hook is optional)", PluginWarning, stacklevel=3)


def _api_problem(plugin: Any) -> str:
    removed = [name for name in hookspecs.REMOVED_HOOKS
               if getattr(getattr(plugin, name, None), f"{hookspecs.PROJECT_NAME}_impl", None) is not None]
    if removed:
        return f"it implements {removed[0]}, {hookspecs.REMOVED_HOOKS[removed[0]]}"
    declared = getattr(plugin, "NXD_PLUGIN_API", None)
    if declared is None:
        return ""  # undeclared plugins are assumed to speak the current API
    try:
        low, high = declared
    except (TypeError, ValueError):
        return f"NXD_PLUGIN_API must be a (min, max) pair of ints, got {declared!r}"
    if high < hookspecs.OLDEST_PLUGIN_API or low > hookspecs.PLUGIN_API_VERSION:
        return (
            f"it supports plugin-API versions {low}..{high}, but this nxd core speaks version "
            f"{hookspecs.PLUGIN_API_VERSION} (and accepts {hookspecs.OLDEST_PLUGIN_API}..{hookspecs.PLUGIN_API_VERSION}); "
            "install a release of the plugin built for it"
        )
    return ""


def _first_party_distributions() -> set[str]:
    """The distributions of this repository (the catalog's providers and the core)."""
    from nxd.catalog import CATALOG

    return {dist for names in CATALOG.values() for dist in names.values()} | {CORE_DISTRIBUTION}


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "0+unknown"


_state: PluginState | None = None
_lock = threading.RLock()


def state() -> PluginState:
    """The process-wide plugin state, discovering entry points on first use."""
    global _state
    with _lock:
        if _state is None:
            fresh = PluginState()
            fresh.load_entry_points()
            _state = fresh
        return _state


def reset() -> None:
    """Forget loaded plugins; the next use rediscovers them (tests and long-lived tools)."""
    global _state
    with _lock:
        _state = None


def register_plugin(plugin: Any | ModuleType, *, name: str, distribution: str = "<in-process>") -> None:
    """Register a plugin object in this process without an entry point (tests, notebooks)."""
    state().register(plugin, name=name, distribution=distribution)


def plugin_infos() -> Iterator[PluginInfo]:
    return iter(state().infos)
