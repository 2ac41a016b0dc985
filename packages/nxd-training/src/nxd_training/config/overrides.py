"""Command-line overrides (``trainer.max_steps=50``) and ``${...}`` interpolation in YAML values."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import yaml

from nxd import ConfigError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=3"`` -> (["a", "b"], 3): the value is typed by YAML (``50`` int, ``1e-4`` float,
    ``true`` bool, ``[1, 2]`` list, ``null`` None). Hydra's ``+a.b=v`` form is accepted too."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like dotted.key=value (e.g. trainer.max_steps=50)")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if not _KEY.match(key):
        raise ConfigError(f"override {text!r}: {key!r} is not a dotted key like trainer.max_steps")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc.__class__.__name__})") from None
    # YAML 1.1 reads 1e-4 as a string; users mean a number.
    if isinstance(value, str):
        try:
            value = float(value) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else value
        except ValueError:
            pass
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``raw`` with every override set (intermediate sections are created)."""
    result = copy.deepcopy(raw)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for depth, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise ConfigError(f"override {text!r}: {where} is a {type(child).__name__}, not a section")
            node = child
        node[path[-1]] = value
    return result


_REF = re.compile(r"\$\{([^${}]+)\}")


def _lookup(root: dict[str, Any], dotted: str, where: str) -> Any:
    node: Any = root
    for part in dotted.strip().lstrip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"{where}: interpolation ${{{dotted}}} refers to a key that does not exist")
        node = node[part]
    return node


def _resolve_text(root: dict[str, Any], text: str, where: str, depth: int = 0) -> Any:
    if depth > 20:
        raise ConfigError(f"{where}: interpolation nests too deeply (a cycle?)")
    match = _REF.search(text)
    if match is None:
        return text
    inner = match.group(1)
    if inner.startswith("multiply:"):
        factors = [_resolve_value(root, f.strip(), where, depth + 1) for f in inner[len("multiply:"):].split(",")]
        try:
            value: Any = 1
            for factor in factors:
                value *= int(factor)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: ${{{inner}}} needs integer factors, got {factors!r}") from None
    else:
        value = _resolve_value(root, _lookup(root, inner, where), where, depth + 1)
    if match.span() == (0, len(text)):
        return value
    return _resolve_text(root, text[: match.start()] + str(value) + text[match.end():], where, depth + 1)


def _resolve_value(root: dict[str, Any], value: Any, where: str, depth: int) -> Any:
    if isinstance(value, str):
        return _resolve_text(root, value, where, depth)
    return value


def resolve_interpolations(raw: dict[str, Any]) -> dict[str, Any]:
    """Replace OmegaConf-style ``${path.to.key}`` and ``${multiply:a,b}`` (as in NxDT's YAMLs)."""

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return _resolve_value(raw, node, path or "<root>", 0)

    return walk(raw, "")
