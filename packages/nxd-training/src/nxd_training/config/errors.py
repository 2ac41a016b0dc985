"""Turn pydantic's validation errors into one readable :class:`nxd.ConfigError`.

Every line reads ``dotted.path: what is wrong``; an unknown key also gets a did-you-mean
suggestion and the list of valid keys of its section.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from nxd import ConfigError


def dotted(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "<root>"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def keys_of(model: type[BaseModel]) -> list[str]:
    """The YAML keys a section accepts (aliases where a field has one)."""
    return [field.alias or name for name, field in model.model_fields.items()]


def section_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section model that holds the key at ``loc`` (None when loc leaves the schema)."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is None or not isinstance(part, str):
            return None
        by_key = {field.alias or name: field for name, field in model.model_fields.items()}
        field = by_key.get(part)
        candidates = _models_in(field.annotation) if field is not None else []
        model = candidates[0] if candidates else None
    return model


def suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(root: type[BaseModel], error: dict[str, Any], listed: set[str] | None = None) -> str:
    """One line for one pydantic error; ``listed`` holds the sections whose valid keys were already
    shown (each section's list appears once per message)."""
    loc = tuple(error["loc"])
    path = dotted(loc)
    if error["type"] == "extra_forbidden":
        section = section_at(root, loc)
        valid = keys_of(section) if section is not None else []
        key = str(loc[-1])
        where = dotted(loc[:-1]) if len(loc) > 1 else "top level"
        hint = suggest(key, valid)
        seen = listed is not None and where in listed
        if listed is not None:
            listed.add(where)
        listing = f"; valid keys in {where}: {', '.join(valid)}" if valid and not seen else ""
        return f"{path}: unknown key{hint}{listing}"
    if error["type"] == "missing":
        if loc and isinstance(loc[-1], int):
            return f"{dotted(loc[:-1])}: too few items (item {loc[-1]} is missing)"
        return f"{path}: required key is missing"
    # union errors carry the member type in the loc (e.g. ('trainer', 'max_time', 'str')); keep the user path
    clean = tuple(part for part in loc if not (isinstance(part, str) and ("[" in part or part in _TYPE_TAGS)))
    return f"{dotted(clean)}: {error['msg']} (got {_short(error.get('input'))})"


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "dict", "none", "function-after", "literal"}


def config_error(root: type[BaseModel], exc: ValidationError, source: str = "config") -> ConfigError:
    """One ConfigError listing every problem pydantic found (deduplicated, in order)."""
    by_path: dict[str, list[str]] = {}
    listed: set[str] = set()
    for error in exc.errors(include_url=False):
        path, _, message = describe(root, error, listed).partition(": ")
        messages = by_path.setdefault(path, [])
        if message not in messages:
            messages.append(message)
    # a union (int | float, ...) reports once per member: one line per path, alternatives joined
    lines = [f"{path}: {' | '.join(messages)}" for path, messages in by_path.items()]
    head = f"invalid {source}: {len(lines)} problem{'s' if len(lines) != 1 else ''}"
    return ConfigError(head + "\n  " + "\n  ".join(lines))
