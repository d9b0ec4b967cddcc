"""Dataclass configs with a docstring per field, read from YAML and overridden by CLI flags.

Every field of a config dataclass becomes a `--flag` (underscores become dashes); the docstring written
under the field is its help text and its comment in the saved `config.yaml`. Precedence: defaults < YAML
file < flags. Unknown keys, wrong types and out-of-range values are `UsageError`s with one-line messages: the
checks are driven by each field's type hint (`check_value`), so `batch_size: PositiveInt` is all a field declares.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import math
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

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


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The interval a number field must lie in, attached to its type: `Annotated[int, Bounds(low=0, low_open=True)]`.

    Every number field is also finite: NaN and infinity are never a setting.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself excluded
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        low, high = (f"{x:.0f}" if float(x).is_integer() else f"{x:g}" for x in (self.low or 0, self.high or 0))
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        return f"{'<' if self.high_open else '<='} {high}" if self.high is not None else "finite"


POSITIVE = Bounds(low=0, low_open=True)
NON_NEGATIVE = Bounds(low=0)
UNIT_INTERVAL = Bounds(low=0, high=1)
PositiveInt = Annotated[int, POSITIVE]
NonNegativeInt = Annotated[int, NON_NEGATIVE]
PositiveFloat = Annotated[float, POSITIVE]
NonNegativeFloat = Annotated[float, NON_NEGATIVE]
Seed = Annotated[int, Bounds(low=0, high=2**32 - 1)]  # numpy's and every seeding function's range


@dataclasses.dataclass(frozen=True)
class FieldType:
    """What a field's type hint allows: its base type, whether null means "none", its interval, its choices."""

    kind: type  # bool, int, float or str (a list field: its items')
    optional: bool = False  # `X | None`: null is a value ("none"); otherwise null is refused
    bounds: Bounds = Bounds()
    choices: tuple[str, ...] = ()  # `Literal[...]`
    many: bool = False  # `list[X]`: a list of X (YAML: a list, or one X; a flag: one or more X); [] is "none"

    @property
    def item(self) -> FieldType:
        """The type of one item of a list field (null never is one)."""
        return dataclasses.replace(self, many=False, optional=False)

    @property
    def noun(self) -> str:
        if self.many:
            return f"a list of items, each {self.item.noun}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        nouns = {bool: "true or false", int: "an integer", float: "a number", str: "a non-empty string"}
        bounds = "" if self.bounds == Bounds() else f" {self.bounds}"
        return nouns[self.kind] + bounds


def field_types(cls: type) -> dict[str, FieldType]:
    """Each field's `FieldType`, read from the dataclass's type hints."""
    found = {}
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if name not in {field.name for field in dataclasses.fields(cls)}:
            continue
        optional = False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            args = typing.get_args(hint)
            optional = type(None) in args
            hint = next(arg for arg in args if arg is not type(None))
        many = typing.get_origin(hint) is list
        if many:
            (hint,) = typing.get_args(hint)
        bounds = Bounds()
        if typing.get_origin(hint) is Annotated:
            hint, *extras = typing.get_args(hint)
            bounds = next((extra for extra in extras if isinstance(extra, Bounds)), Bounds())
        choices: tuple[str, ...] = ()
        if typing.get_origin(hint) is Literal:
            choices, hint = typing.get_args(hint), str
        found[name] = FieldType(hint, optional, bounds, choices, many)
    return found


def check_value(name: str, value: Any, field_type: FieldType) -> Any:
    """`value` (from YAML or a flag) as the field's type, or a one-line UsageError naming the field.

    Refused: null (unless the type is optional), empty or blank strings, lists and maps, booleans for numbers or
    strings, numbers for strings, non-numeric strings for numbers, NaN/inf, values outside the field's bounds or
    choices. A number may come as a string (flags always do; YAML reads 1e-5 as a string). A list field takes a list
    (or a tuple, or one item alone) whose every item is checked as above; [] means none.
    """
    kind = field_type.kind

    def refuse(why: str = "") -> UsageError:
        shown = "null (an empty value)" if value is None else repr(value)
        return UsageError(f"{name}: expected {field_type.noun}, got {shown}{why}")

    if value is None:
        if field_type.optional:
            return None
        raise refuse()
    if field_type.many:
        if isinstance(value, dict):
            raise refuse()
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        try:
            return [check_value(name, item, field_type.item) for item in items]
        except UsageError:
            raise refuse() from None
    if isinstance(value, (list, dict)) or (isinstance(value, bool) and kind is not bool):
        raise refuse()
    if kind is bool:
        if not isinstance(value, bool):
            raise refuse()
        return value
    if kind is str:
        if not isinstance(value, str):
            raise refuse(" (quote it in YAML if it is meant as text)")
        if not value.strip() or (field_type.choices and value not in field_type.choices):
            raise refuse()
        return value
    number = _number(value, kind)
    if number is None or number not in field_type.bounds:
        raise refuse()
    return number


def _number(value: Any, kind: type) -> int | float | None:
    """`value` as an int or float, or None when it is not one (a non-integer for an int, text that is no number)."""
    try:
        if isinstance(value, str):
            try:
                number: Any = int(value.strip())
            except ValueError:
                number = float(value)
        else:
            number = value
        if not isinstance(number, (int, float)):
            return None
        float(number)  # OverflowError: an integer too large for any setting
        if kind is int and isinstance(number, float):
            return int(number) if number.is_integer() else None  # (False for NaN and infinity)
        return number if kind is int else float(number)
    except (TypeError, ValueError, OverflowError):
        return None


class Checked:
    """An argparse `type` that checks a flag like a config field: `add_argument("--batch", type=POSITIVE_INT)`.

    Its `field_type` says what it accepts (the tests read it to generate out-of-range values for every flag). A flag
    of a config field (`field` given) is refused with the same message as its YAML key.
    """

    def __init__(self, kind: type | FieldType, bounds: Bounds = Bounds(), field: str | None = None):
        self.field_type = kind if isinstance(kind, FieldType) else FieldType(kind, bounds=bounds)
        self.field = field
        self.__name__ = self.field_type.kind.__name__  # argparse names the type in its messages

    def __call__(self, text: str) -> Any:
        if self.field is not None:
            return check_value(self.field, text, self.field_type)  # (a UsageError passes through argparse)
        try:
            return check_value("flag", text, self.field_type)
        except UsageError:
            raise argparse.ArgumentTypeError(f"expected {self.field_type.noun}, got {text!r}") from None


POSITIVE_INT, NON_NEGATIVE_INT = Checked(int, POSITIVE), Checked(int, NON_NEGATIVE)
POSITIVE_FLOAT = Checked(float, POSITIVE)
SEED = Checked(int, typing.get_args(Seed)[1])


def field_sections(cls: type) -> dict[str, str]:
    """The section each field is written under: the latest `# --- title` comment line above it in the class ("" before
    the first)."""
    source = textwrap.dedent(inspect.getsource(cls))
    headings = {number: match[1].strip() for number, line in enumerate(source.splitlines(), start=1)
                if (match := re.match(r"\s*# --- (.+)", line))}
    sections = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = [number for number in headings if number < node.lineno]
            sections[node.target.id] = headings[max(above)] if above else ""
    return sections


def metavar(field_type: FieldType, given: str | None) -> str:
    """What a field's flag takes, as its help shows it: the class's own word (`FILE`), the choices, or the kind."""
    if given is not None:
        return given
    if field_type.choices:
        return "{" + ",".join(field_type.choices) + "}"
    return {int: "INT", float: "FLOAT", str: "TEXT"}[field_type.kind]


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
                         title: str = "{}") -> None:
    """One flag per field (but those in `skip`), in an argument group per section of the class (`field_sections`;
    `title` formats a section's name), each showing what it takes: the class's `METAVARS` word for it (`FILE`,
    `FILE.py:FUNC`), else its choices or kind. Defaults are suppressed so that only the flags actually given override
    the YAML. A list field's flag takes one or more values (`--reward-funcs a.py:f runs/rm`)."""
    docs = field_docs(cls)
    kinds = field_types(cls)
    sections = field_sections(cls)
    metavars: dict[str, str] = getattr(cls, "METAVARS", {})
    groups: dict[str, Any] = {"": parser}
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        section = sections.get(field.name, "")
        if section not in groups:
            groups[section] = parser.add_argument_group(title.format(section))
        group = groups[section]
        field_type = kinds[field.name]
        flag = "--" + field.name.replace("_", "-")
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore
        help_text = f"{docs.get(field.name, '')} (default: {default!r})"
        if field_type.kind is bool and not field_type.many:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        else:
            item = field_type.item if field_type.many else field_type
            group.add_argument(flag, type=Checked(item, field=field.name), default=argparse.SUPPRESS,
                               nargs="+" if field_type.many else None,
                               metavar=metavar(item, metavars.get(field.name)), help=help_text)


class DuplicateKey(yaml.YAMLError):
    """A mapping that gives one key twice (`DuplicateKeyLoader`)."""

    def __init__(self, key: Any, first_line: int, second_line: int):
        super().__init__(f"key {key!r} is given twice (lines {first_line} and {second_line}); keep one")


class DuplicateKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, but a key given twice in one mapping is an error: SafeLoader keeps the last silently, so
    `beta: 0.05` ... `beta: 0.5` would run with 0.5 without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<` merges may override on purpose; a non-scalar key is refused by SafeLoader itself
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in lines:
                raise DuplicateKey(key, lines[key], line)
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=DuplicateKeyLoader)
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read config file {path}: {error}") from None
    except DuplicateKey as error:
        raise UsageError(f"{path}: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise UsageError(f"{path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


def build_config(cls: type[T], *sources: dict[str, Any], origin: dict[str, str] | None = None,
                 flags: bool = False) -> T:
    """Merge sources left to right into a `cls`, checking keys and types, then run its `validate()`. A failed relation
    check names each field as the user gave it (`name_settings`): `origin` names the file each field's final value
    came from (`config_from_args`), `flags` says the others were command-line flags."""
    names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    kinds = field_types(cls)
    values: dict[str, Any] = {}
    for source in sources:
        for key, value in source.items():
            name = str(key).replace("-", "_")
            if name not in names:
                raise UsageError(f"unknown config key {key!r}{did_you_mean(name, names)}")
            values[name] = check_value(name, value, kinds[name])
    try:
        config = cls(**values)  # (a config class may validate itself as it is made: TrainConfig does)
        validate = getattr(config, "validate", None)
        if validate is not None:
            validate()
    except UsageError as error:
        raise UsageError(name_settings(str(error), names, set(values), origin or {}, flags)) from None
    return config


def did_you_mean(name: str, names: typing.Iterable[str]) -> str:
    """"; did you mean 'x'?" for the closest of `names` to a misspelt `name`, or ""."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


DEFAULT_NOTE = ", the default"


def shown(config: Any, name: str) -> str:
    """A field as a failed relation check names it: `minibatch_size (16)`, or `minibatch_size (16, the default)` when
    its value is its default (the user may not know it has one). `name_settings` rewrites it as the user gave it."""
    field = next(field for field in dataclasses.fields(config) if field.name == name)
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore
    value = getattr(config, name)
    return f"{name} ({value}{DEFAULT_NOTE if value == default else ''})"


def name_settings(message: str, names: typing.Iterable[str], given: set[str], origin: dict[str, str],
                  flags: bool = False) -> str:
    """`message`, a failed check naming fields as `shown` does, in the user's terms: a field they gave loses the
    default note (its value may equal the default), one whose value came from a file says so (`minibatch_size (8,
    from configs/x.yaml)`), and from the command line (`flags`) the others are named by their flag
    (`--minibatch-size (16, the default)`). A field of `origin` named without its value in brackets gets a note at
    the end."""
    named: set[str] = set()

    def rewrite(match: re.Match) -> str:
        name, inside = match[1], match[2]
        named.add(name)
        if name in given:
            inside = inside.removesuffix(DEFAULT_NOTE)
        if name in origin:
            return f"{name} ({inside}, from {origin[name]})"
        return f"{'--' + name.replace('_', '-') if flags else name} ({inside})"

    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    message = re.sub(rf"(?<![\w-])({alternatives}) \(([^()]*)\)", rewrite, message)
    for name, where in origin.items():
        if name not in named and re.search(rf"(?<![\w-]){name}\b", message):
            message += f" ({name} from {where})"
    return message


def config_from_args(cls: type[T], args: argparse.Namespace, extra: tuple[str, ...] = ()) -> T:
    """Build `cls` from `--config FILE` (if given) and the field flags present in `args`."""
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    path = getattr(args, "config", None)
    from_file = read_yaml(path) if path else {}
    from_flags = {k: v for k, v in vars(args).items() if k in names and k not in extra}
    origin = {str(key).replace("-", "_"): path for key in from_file} if path else {}
    return build_config(cls, from_file, from_flags, origin={k: v for k, v in origin.items() if k not in from_flags},
                        flags=True)


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


THREADS_HELP = ("CPU threads of torch's operations; 0 = torch's default (one per core, or OMP_NUM_THREADS). 1 is "
                "faster where other jobs share the cores (default: 0)")


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """`--threads N` of a command that trains or samples without a config of its own (utils/threads.use_threads sets
    it before torch loads)."""
    parser.add_argument("--threads", type=NON_NEGATIVE_INT, default=0, metavar="N", help=THREADS_HELP)
