"""Settings for every command: a TOML or JSON file read into a pydantic config, then `-c a.b=value`
overrides, then the command's own flags.

One layer for the judge, the agent and the synthesis commands, so that a file, an override and a
mistake in either behave the same everywhere. Overrides are typed: the value is read as a TOML
value (`1e-3`, `true`, `"text"`, `[1, 2]`), else as JSON (`null`), else kept as the plain string,
and pydantic validates the result against the field. Every error is a `SettingsError` whose
message names the file or the override, says what is wrong, and lists the valid field names
where a name was not one of them.
"""

from __future__ import annotations

import json
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class SettingsError(ValueError):
    """A settings file or an override that cannot be applied (the CLIs exit with status 2)."""


# -- files -----------------------------------------------------------------------------------------

def read_file(path: Path | str | None, section: str | None = None) -> dict[str, Any]:
    """A settings file as a dict: TOML when its name ends in .toml, JSON otherwise. With `section`,
    the table of that name when the file has one (a file may hold several commands' settings),
    else the whole file. No path: no settings."""
    if path is None:
        return {}
    path = Path(path)
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{path}: no such settings file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: cannot be read: {exc}") from None
    if not text.strip():
        example = "n_timed = 50" if kind == "TOML" else '{"n_timed": 50}'
        raise SettingsError(f"{path}: the file is empty; a settings file holds a {kind} table of fields, "
                            f"e.g. {example}")
    try:
        values = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from None
    except json.JSONDecodeError as exc:
        hint = " (a TOML file needs the .toml suffix)" if "=" in text.split("\n", 1)[0] else ""
        raise SettingsError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: "
                            f"{exc.msg}{hint}") from None
    if not isinstance(values, dict):
        raise SettingsError(f"{path}: expected a table of settings (an object of field names), "
                            f"got a {type(values).__name__}")
    if section is not None and isinstance(values.get(section), dict):
        values = values[section]
    return dict(values)


# -- overrides -------------------------------------------------------------------------------------

def parse_value(raw: str) -> Any:
    """An override's value: a TOML value, else JSON, else the string as written."""
    text = raw.strip()
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=value` as (["a", "b"], parsed value)."""
    key, sep, raw = item.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not all(path):
        raise SettingsError(f"-c expects key=value (nested fields as a.b=value), got {item!r}")
    return path, parse_value(raw)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds, through Optional/unions (`LLMConfig | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for a in typing.get_args(annotation) if (m := _nested_model(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None


def field_names(model: type[BaseModel]) -> list[str]:
    return sorted(model.model_fields)


def apply_overrides(values: Mapping[str, Any], overrides: Iterable[str], model: type[BaseModel]) -> dict[str, Any]:
    """`values` with each `a.b=value` override set, every name on the path checked against the
    fields of `model` and of the models nested in it."""
    out = _copy(values)
    for item in overrides:
        path, value = parse_override(item)
        target, current = out, model
        for depth, name in enumerate(path):
            if name not in current.model_fields:
                raise SettingsError(f"-c {item}: {current.__name__} has no field {name!r}; valid fields: "
                                    f"{', '.join(field_names(current))}")
            if depth == len(path) - 1:
                target[name] = value
                break
            nested = _nested_model(current.model_fields[name].annotation)
            if nested is None:
                raise SettingsError(f"-c {item}: {'.'.join(path[:depth + 1])} is a single value, not a table "
                                    f"of settings")
            child = target.get(name)
            if isinstance(child, BaseModel):
                child = child.model_dump()
            target[name] = child = dict(child) if isinstance(child, Mapping) else {}
            target, current = child, nested
    return out


def _copy(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in values.items()}


def split_overrides(overrides: Iterable[str] | None, sections: Iterable[str],
                    default: str) -> dict[str, list[str]]:
    """Route the `-c` items of a command that has several configs: `SECTION.field=value` to that
    section, anything else to `default` (so `-c n_timed=5` keeps meaning the judge's field)."""
    out: dict[str, list[str]] = {name: [] for name in sections}
    out.setdefault(default, [])
    for item in overrides or []:
        head, dot, rest = item.partition(".")
        head = head.strip()
        if dot and head in out and "=" in rest:
            out[head].append(rest)
        else:
            out[default].append(item)
    return out


# -- validation ------------------------------------------------------------------------------------

def validate(model: type[M], values: Mapping[str, Any], what: str = "settings") -> M:
    """`model(**values)`, with pydantic's errors as one SettingsError (see `explain`)."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise explain(model, exc, what) from None


def explain(model: type[BaseModel], exc: ValidationError, what: str = "settings") -> SettingsError:
    """Pydantic's errors for `model` as one SettingsError: each bad field with what is wrong, and
    the valid names where a name is unknown."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            owner = _model_at(model, error["loc"][:-1])
            valid = f"; valid fields: {', '.join(field_names(owner))}" if owner is not None else ""
            lines.append(f"  {where}: not a field of {(owner or model).__name__}{valid}")
        else:
            lines.append(f"  {where}: {error['msg']} (got {error.get('input')!r})")
    return SettingsError(f"invalid {what}:\n" + "\n".join(lines))


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for name in loc:
        if current is None or not isinstance(name, str) or name not in current.model_fields:
            return None
        current = _nested_model(current.model_fields[name].annotation)
    return current


def load(model: type[M], path: Path | str | None = None, overrides: Iterable[str] = (), *,
         section: str | None = None, flags: Mapping[str, Any] | None = None, what: str | None = None) -> M:
    """A config from its file (or its `section` of the file), then the `-c` overrides, then the
    flags the command was given (those not None), in that order of precedence."""
    values = apply_overrides(read_file(path, section), overrides, model)
    values.update({k: v for k, v in (flags or {}).items() if v is not None})
    return validate(model, values, what or f"{section or model.__name__} settings")
