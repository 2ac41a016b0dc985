"""Load a YAML config (a file or ``hub:<name>``), apply overrides, validate it completely.

Read NxDT YAML and compose it the way NxDT (Hydra/OmegaConf) does: OmegaConf loads the file,
command-line overrides are merged in, and interpolations are resolved by OmegaConf itself
(``${model.x}``, relative ``${.encoder_seq_length}``, ``${oc.env:VAR}``, NeMo's ``${multiply:a,b}``).

The result is a plain mapping for the pydantic schema. These functions are public: ``nxd migrate
config`` reads configs through them so both commands see a file identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from nxd import ConfigError
from nxd_training.config.errors import config_error, suggest
from nxd_training.config.nxdt.history import lift_alignment
from nxd_training.config.overrides import parse_override
from nxd_training.config.resolved import RESOLVED_KEY, dump_resolved
from nxd_training.config.schema import TrainingConfig

HUB_PREFIX = "hub:"


def _multiply(*factors: Any) -> Any:
    """NeMo's ``multiply`` resolver (NxDT: ``model_parallel_size: ${multiply:${tp}, ${pp}}``)."""
    product: Any = 1
    for factor in factors:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise ValueError(f"multiply needs numbers, got {factor!r}")
        product *= factor
    return product


def _register_resolvers() -> None:
    register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver
    if not OmegaConf.has_resolver("multiply"):
        register("multiply", _multiply, replace=True)


_register_resolvers()


def hub_names() -> list[str]:
    """Names of the configs shipped in ``nxd_training/hub`` (``nxd train hub:<name>``)."""
    folder = resources.files("nxd_training") / "hub"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def hub_path(name: str) -> Path:
    names = hub_names()
    if name not in names:
        raise ConfigError(f"no hub config named {name!r}{suggest(name, names)}; available: {', '.join(names)}")
    return Path(str(resources.files("nxd_training") / "hub" / f"{name}.yaml"))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _yaml_error(path: Path | str, exc: yaml.YAMLError) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or _first_line(exc)
    if "duplicate key" in str(problem):
        first = getattr(exc, "context_mark", None)
        seen = f" (the mapping starts at line {first.line + 1})" if first is not None else ""
        return ConfigError(f"{path}: {problem}{where}{seen}; each key may appear once in a mapping")
    return ConfigError(f"{path}: not valid YAML{where}: {problem}")


def read_yaml(source: str | Path) -> dict[str, Any]:
    """The mapping in a YAML file (``hub:<name>`` reads a shipped config), interpolations kept as
    written. Refuses, naming the file: a missing file, bytes that are not UTF-8, invalid YAML, a
    key repeated in one mapping (OmegaConf's strict loader), and a top level that is no mapping."""
    text = str(source)
    path = hub_path(text[len(HUB_PREFIX):]) if text.startswith(HUB_PREFIX) else Path(source)
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a directory; give the YAML file in it (e.g. "
                          f"{str(path / 'config.yaml')!r}) or a hub config ({', '.join(hub_names())})")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist (hub configs: {', '.join(hub_names())})")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}, line {line}); "
                          "save the config as UTF-8") from None
    if not any(line.strip() and not line.lstrip().startswith(("#", "---")) for line in text.splitlines()):
        raise ConfigError(f"{path}: the file is empty (no config sections); give a config YAML, e.g. hub:quickstart "
                          "(`nxd train hub:quickstart --print-config` prints one)")
    try:
        node = OmegaConf.create(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    except (OmegaConfBaseException, AssertionError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: the top level must be a mapping of sections ({_first_line(exc)})") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got a list")
    return OmegaConf.to_container(node, resolve=False)  # type: ignore[return-value]


def _set_override(node: DictConfig, text: str) -> None:
    path, value = parse_override(text)
    current: Any = node
    for depth, part in enumerate(path[:-1]):
        child = current.get(part) if isinstance(current, DictConfig) else None
        if child is None:
            current[part] = {}
            child = current[part]
        if not isinstance(child, DictConfig):
            where = ".".join(path[: depth + 1])
            kind = type(OmegaConf.to_object(child) if OmegaConf.is_config(child) else child).__name__
            raise ConfigError(f"override {text!r}: {where} is a {kind}, not a section")
        current = child
    current[path[-1]] = value


def compose(raw: dict[str, Any], overrides: Sequence[str] = (), source: str = "config") -> DictConfig:
    """``raw`` as an OmegaConf node with the command-line overrides merged in (not yet resolved)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{source}: keys must be strings, got {bad[0]!r}")
    try:
        node = OmegaConf.create(raw)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raise ConfigError(f"{source}: {key + ': ' if key else ''}{_first_line(exc)}") from None
    for text in overrides:
        try:
            _set_override(node, text)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"override {text!r}: {_first_line(exc)}") from None
    return node


def resolve(raw: dict[str, Any], overrides: Sequence[str] = (), source: str = "config") -> dict[str, Any]:
    """The config as NxDT's trainer sees it: overrides applied, every interpolation resolved by
    OmegaConf. A failing interpolation is reported with the key that holds it."""
    node = compose(raw, overrides, source)
    try:
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "<root>"
        written = _written(OmegaConf.to_container(node, resolve=False), key)
        shown = f" (written {written!r})" if isinstance(written, str) and "${" in written else ""
        raise ConfigError(f"invalid {source}: {key}{shown}: {_first_line(exc)}") from None


def _written(tree: Any, key: str) -> Any:
    """The value at dotted ``key`` as written (before resolution), or None."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def parse_config(raw: dict[str, Any], overrides: Sequence[str] = (), source: str = "config") -> TrainingConfig:
    """Schema-level validation only (types, ranges, unknown keys) of the OmegaConf-resolved config;
    see :func:`load_config`. A written run config's ``resolved`` section is dropped: the sections
    are the source, and resolving them again is :func:`load_config`'s job."""
    if isinstance(raw, dict) and RESOLVED_KEY in raw:
        raw = {k: v for k, v in raw.items() if k != RESOLVED_KEY}
    resolved = resolve(raw, overrides, source)
    try:
        config = TrainingConfig.model_validate(resolved)
    except ValidationError as exc:
        raise config_error(TrainingConfig, exc, source) from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # odd YAML shapes pydantic did not expect
        raise ConfigError(f"invalid {source}: {exc}") from None
    return lift_alignment(config)  # NxDT's earlier data.alignment_strategy, read where later releases put it


def load_config(source: str | Path | dict[str, Any], overrides: Sequence[str] = (),
                check: bool = True) -> TrainingConfig:
    """Load and validate the whole config: schema, cross-field rules, and every plugin it needs
    (model, data module, pipeline, ZeRO-1, LoRA) — all before any process starts. With ``check``
    (the default) the result is resolved (once, here: it carries its RunConfig); without it, the
    schema-checked sections only (``nxd train`` resolves them after data preparation)."""
    if isinstance(source, dict):
        raw, name = source, "config"
    else:
        raw, name = read_yaml(source), str(source)
    config = parse_config(raw, overrides, name)
    if check:
        from nxd_training.config.plan import resolve_config

        return resolve_config(config)
    return config


def dump_config(config: TrainingConfig) -> str:
    """The config as YAML: a resolved config with its ``resolved`` section (what every run
    directory holds and every rank reads), else the sections alone."""
    if config.resolved:
        return dump_resolved(config)
    data = config.model_dump(mode="json", by_alias=True, exclude_none=False)
    return yaml.safe_dump(data, sort_keys=False)
