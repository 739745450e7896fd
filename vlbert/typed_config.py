"""Dataclasses from mappings (a YAML file's, a command line's), checked with one set of rules.

Detector configs, run configs, VLBertConfig and pipeline step parameters all load through
`from_mapping`: names must be fields (an unknown one is named with the closest known one), required
fields present, values of the annotated type (bool, int, float, str, Path, list, tuple, dict, a
nested dataclass or a list of them, `X | None`, `Literal[...]`), with integers widened to floats and
`5e-5` read as the number it spells. A mistake is one error of the caller's class naming the key
path (`stages[0].base_lr`); `load_yaml` and `located` add the file and line.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from vlbert.errors import UserError


class FieldError(UserError):
    """A mapping that does not fit its dataclass, for callers that have no error class of their own."""


# Field metadata of an input path: it must exist when the job that reads it starts (not when the
# config loads: in a pipeline, it may be an earlier step's output).
EXISTING_PATH = {"must_exist": True}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the known name closest to a misspelt `name`, else nothing."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class FieldType:
    """How values of an annotated type are recognised, named in messages and normalised."""

    accepts: Callable[[Any], bool]
    expected: str
    normalise: Callable[[Any], Any] = lambda value: value


# PyYAML (YAML 1.1) reads `5e-5` as text: a float needs a dot and a signed exponent there. Such
# text is taken as the number it spells, as a user writing a learning rate means it.
_EXPONENT_AS_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def _is_number(value: Any) -> bool:
    if isinstance(value, str):
        return _EXPONENT_AS_TEXT.fullmatch(value.strip()) is not None
    return isinstance(value, (int, float)) and not isinstance(value, bool)


FIELD_TYPES: dict[Any, FieldType] = {
    bool: FieldType(lambda v: isinstance(v, bool), "true or false"),
    int: FieldType(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: FieldType(_is_number, "a number", float),
    str: FieldType(lambda v: isinstance(v, str), "a string"),
    Path: FieldType(lambda v: isinstance(v, (str, Path)), "a path", Path),
    list: FieldType(lambda v: isinstance(v, (list, tuple)), "a list", list),
    tuple: FieldType(lambda v: isinstance(v, (list, tuple)), "a list", tuple),
    dict: FieldType(lambda v: isinstance(v, Mapping), "a mapping", dict),
    Any: FieldType(lambda v: True, "anything"),
}


def from_mapping(cls: type, values: Any, where: str = "", error: type[Exception] = FieldError) -> Any:
    """An instance of dataclass `cls` from a mapping, or an `error` naming the key at fault; `where` is
    the key path of a nested one (`stages[0]`), `cls.SETTINGS` (if set) what such a mapping holds.
    The class's own checks run as it is built."""
    if not isinstance(values, Mapping):
        settings = getattr(cls, "SETTINGS", f"{cls.__name__} fields")
        raise _error(error, where, f"expected a mapping of {settings}, found {describe(values)}")
    return cls(**checked_fields(cls, values, where, error))


def checked_fields(cls: type, values: Mapping, where: str = "", error: type[Exception] = FieldError
                   ) -> dict[str, Any]:
    """`values` checked against dataclass `cls`'s fields: names known, required ones present, types as
    annotated. A field's `checked_by` metadata, a function (value, key path), checks it instead."""
    specs = {spec.name: spec for spec in dataclasses.fields(cls)}
    unknown = [name for name in values if name not in specs]
    problems = [f"unknown field {name!r}" + did_you_mean(str(name), specs) for name in unknown]
    problems += [f"missing required field {name!r}" for name, spec in specs.items()
                 if name not in values and spec.default is dataclasses.MISSING
                 and spec.default_factory is dataclasses.MISSING]
    if problems:  # located at the first unknown key where there is one
        key = join_key(where, str(unknown[0])) if unknown else where
        raise _error(error, key, "; ".join(problems), _named(where, values))
    hints = typing.get_type_hints(cls)
    return {name: _checked(value, hints[name], specs[name].metadata, join_key(where, name), error)
            for name, value in values.items()}


def _checked(value: Any, hint: Any, metadata: Mapping, where: str, error: type[Exception]) -> Any:
    if "checked_by" in metadata:
        return metadata["checked_by"](value, where)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))  # `X | None` only
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise _error(error, where, f"{value!r} is not one of {', '.join(map(str, choices))}"
                         + did_you_mean(str(value), map(str, choices)))
        return value
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, where, error)
    base, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    field_type = FIELD_TYPES[base]
    if not field_type.accepts(value):
        raise _error(error, where, f"expected {field_type.expected}, found {describe(value)}")
    if base in (list, tuple) and args:
        item = args[0]  # list[X], tuple[X, ...] and tuples of one type
        value = [_checked(v, item, {}, f"{where}[{i}]", error) for i, v in enumerate(value)]
    return field_type.normalise(value)


def _error(error: type[Exception], key: str, problem: str, shown: str | None = None) -> Exception:
    """`error` saying `problem` at `key`; its `key` attribute is the key path, for `located`."""
    where = key if shown is None else shown
    exc = error(f"{where}: {problem}" if where else problem)
    exc.key = key
    return exc


def describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return repr(value)


def _named(where: str, values: Mapping) -> str:
    """`where`, with the entry's name when it has one: `stages[0] ('pretrain')`."""
    name = values.get("name") if where else None
    return f"{where} ({name!r})" if isinstance(name, str) else where


def join_key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def from_text(text: str, error: type[Exception] = FieldError, where: str = "") -> Any:
    """A command line's value read as YAML (`5`, `true`, `[1, 2]`, `null`, `5e-5` as text that a float
    field takes); text that is not YAML is an `error` at `where`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _error(error, where, f"VALUE is not YAML ({yaml_problem(exc)}); quote it") from None


# ---- YAML files, with the line of each key ---------------------------------------------------

def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML syntax error in one line: where it is, and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (getattr(exc, "problem", None) or str(exc).splitlines()[0])


def load_yaml(text: str, name: str, error: type[Exception] = FieldError) -> tuple[Any, dict[str, int]]:
    """The value a YAML text holds and the line (from 1) of each key path in it (`stages[0].steps`);
    invalid YAML is an `error` starting with `name` (the file)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{name}: invalid YAML, {yaml_problem(exc)}") from None
    lines: dict[str, int] = {}
    _key_lines(node, "", lines)
    return value, lines


def _key_lines(node: Any, path: str, lines: dict[str, int]) -> None:
    if node is None:
        return
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, item in node.value:
            lines[join_key(path, str(key.value))] = key.start_mark.line + 1
            _key_lines(item, join_key(path, str(key.value)), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _key_lines(item, f"{path}[{i}]", lines)


def located(name: str, lines: Mapping[str, int], exc: Exception) -> str:
    """`exc`'s message after the file `name` and, where the file has its key, the line: `run.yaml:7: …`."""
    line = lines.get(getattr(exc, "key", None) or "")
    return f"{name}:{line}: {exc}" if getattr(exc, "key", None) and line else f"{name}: {exc}"
