"""Dataclass configs with a docstring per field, read from YAML and overridden by CLI flags.

Every field of a config dataclass becomes a `--flag` (underscores become dashes); the docstring written
under the field is its help text and its comment in the saved `config.yaml`. Precedence: defaults < YAML
file < flags. Unknown keys, wrong types and out-of-range values are `UsageError`s with one-line messages.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ppo_rlhf.errors import UsageError

T = TypeVar("T")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (the convention CleanRL and tyro use)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _field_type(cls: type, field: dataclasses.Field) -> type:
    hint = typing.get_type_hints(cls)[field.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is typing.Literal:  # a choice: read as its values' type, checked by validate()
        hint = type(typing.get_args(hint)[0])
    return hint


def _coerce(name: str, value: Any, kind: type) -> Any:
    """Convert a YAML or CLI value to the field's type; YAML gives '1e-5' as a string, for example."""
    if value is None:
        return None
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "yes", "1", "on"):
                return True
            if str(value).lower() in ("false", "no", "0", "off"):
                return False
            raise ValueError
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int("1e400"), float(10**400)
        raise UsageError(f"{name}: expected {kind.__name__}, got {value!r}") from None
    return value


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field. Defaults are suppressed so that only the flags actually given override the YAML."""
    docs = field_docs(cls)
    for field in dataclasses.fields(cls):
        kind = _field_type(cls, field)
        flag = "--" + field.name.replace("_", "-")
        help_text = f"{docs.get(field.name, '')} (default: {field.default!r})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, type=str, default=argparse.SUPPRESS, metavar=kind.__name__.upper(), help=help_text)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read config file {path}: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UsageError(f"{path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def build_config(cls: type[T], *sources: dict[str, Any]) -> T:
    """Merge sources left to right into a `cls`, checking keys and types, then run its `validate()`."""
    names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    kinds = {field.name: _field_type(cls, field) for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for source in sources:
        for key, value in source.items():
            name = str(key).replace("-", "_")
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise UsageError(f"unknown config key {key!r}{hint}")
            values[name] = _coerce(name, value, kinds[name])
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def config_from_args(cls: type[T], args: argparse.Namespace, extra: tuple[str, ...] = ()) -> T:
    """Build `cls` from `--config FILE` (if given) and the field flags present in `args`."""
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    from_file = read_yaml(args.config) if getattr(args, "config", None) else {}
    from_flags = {k: v for k, v in vars(args).items() if k in names and k not in extra}
    return build_config(cls, from_file, from_flags)


def to_yaml(config: Any) -> str:
    """The config as YAML with each field's docstring as a comment above it."""
    docs = field_docs(type(config))
    lines = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in docs:
            lines.append(f"# {docs[field.name]}")
        lines.append(yaml.safe_dump({field.name: value}, default_flow_style=False, sort_keys=False).strip())
    return "\n".join(lines) + "\n"
