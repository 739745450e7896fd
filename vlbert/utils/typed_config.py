"""Dataclasses from mappings (a YAML file's, a command line's), checked with one set of rules.

Detector configs, run configs, VLBertConfig and pipeline step parameters all load through
`from_mapping`: names must be fields (an unknown one is named with the closest known one), required
fields present, values of the annotated type (bool, int, float, str, Path, list, tuple, dict, a
nested dataclass or a list of them, `X | None`, `Literal[...]`), with integers widened to floats,
`5e-5` read as the number it spells, one path as a list of one where a field is a list of paths
(`EXISTING_PATHS`), and every float finite. A field's `Range` (metadata `at_least(0)`,
`above(0)`) bounds its numbers. A mistake is one error of the caller's class naming the key path
(`stages[0].base_lr`); `load_yaml` (every config file's reader, bounded) and `located` add the file
and line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from vlbert.utils.errors import UserError


class FieldError(UserError):
    """A mapping that does not fit its dataclass, for callers that have no error class of their own."""


# Field metadata of an input path: it must exist when the job that reads it starts (not when the
# config loads: in a pipeline, it may be an earlier step's output).
EXISTING_PATH = {"must_exist": True}
# Field metadata of a list of input paths: each must exist, and one path given alone is a list of one.
EXISTING_PATHS = {**EXISTING_PATH, "one_as_list": True}


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


@dataclass(frozen=True)
class Range:
    """The numbers a field takes (a list's or tuple's: each item), its metadata under "range"."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive: bool = False  # the minimum itself is not taken

    def problem(self, value: float) -> str | None:
        low = self.minimum is None or (value > self.minimum if self.exclusive else value >= self.minimum)
        if low and (self.maximum is None or value <= self.maximum):
            return None
        least = f"{'more than' if self.exclusive else 'at least'} {self.minimum}" if self.minimum is not None else ""
        most = f"at most {self.maximum}" if self.maximum is not None else ""
        return f"expected {' and '.join(filter(None, (least, most)))}, found {value!r}"


def at_least(minimum: float, maximum: float | None = None) -> dict[str, Range]:
    """Field metadata: numbers from `minimum` (to `maximum`)."""
    return {"range": Range(minimum, maximum)}


def above(minimum: float, maximum: float | None = None) -> dict[str, Range]:
    """Field metadata: numbers greater than `minimum` (up to `maximum`)."""
    return {"range": Range(minimum, maximum, exclusive=True)}


SEEDS = at_least(0, 2**32 - 1)  # a seed's range, as NumPy's (runs derive further seeds from one)


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
    annotated, numbers in their `Range`. A field's `checked_by` metadata, a function (value, key path),
    checks it instead. `cls.unknown_field_hint(name, values)`, where defined, says more of an unknown
    name than the closest known one."""
    specs = {spec.name: spec for spec in dataclasses.fields(cls)}
    unknown = [name for name in values if name not in specs]
    hint = getattr(cls, "unknown_field_hint", lambda name, values: None)
    problems = [f"unknown field {name!r}" + (hint(name, values) or did_you_mean(str(name), specs)) for name in unknown]
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
    if base is list and metadata.get("one_as_list") and isinstance(value, str):
        value = [value]
    field_type = FIELD_TYPES[base]
    if not field_type.accepts(value):
        raise _error(error, where, f"expected {field_type.expected}, found {describe(value)}")
    if base in (list, tuple) and args:
        item = args[0]  # list[X], tuple[X, ...] and tuples of one type
        value = [_checked(v, item, metadata, f"{where}[{i}]", error) for i, v in enumerate(value)]
        return field_type.normalise(value)
    value = field_type.normalise(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise _error(error, where, f"expected a finite number, found {value}")
    bounds = metadata.get("range")
    problem = bounds.problem(value) if bounds is not None and base in (int, float) else None
    if problem is not None:
        raise _error(error, where, problem)
    return value


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
    field takes), bounded as files are (`load_yaml`); text that is not YAML is an `error` at `where`."""
    try:
        return _parsed(text)[0]
    except yaml.YAMLError as exc:
        raise _error(error, where, f"VALUE is not YAML ({yaml_problem(exc)}); quote it") from None
    except _Refused as exc:
        raise _error(error, where, exc.problem) from None


# ---- YAML files, bounded, with the line of each key ------------------------------------------

# What aliases (`*name`) may add to a document, in values: a config's anchors share a few settings,
# while nested ones (9 anchors of 9 aliases each: 9**9 values) would fill the memory of whatever
# walks the value.
MAX_ALIAS_VALUES = 100_000
MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    """A YAML document that parses but is not taken: `problem` at `mark` (its line)."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem)
        self.problem, self.mark = problem, mark


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader for what a config holds: a date-like value stays the text it is (JSON, in
    which runs are recorded, has no dates); sets, binary and ordered pairs are refused."""

    def refuse_tag(self, node: yaml.Node) -> Any:
        raise _Refused(f"!!{node.tag.rsplit(':', 1)[-1]} is not a config value: write a list, a mapping or text",
                       node.start_mark)


_ConfigLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.constructor.SafeConstructor.construct_yaml_str)
for _tag in ("set", "binary", "omap", "pairs"):
    _ConfigLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _ConfigLoader.refuse_tag)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML syntax error in one line: where it is, and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (getattr(exc, "problem", None) or str(exc).splitlines()[0])


def load_yaml(path: str | Path, error: type[Exception] = FieldError, name: str | None = None
              ) -> tuple[Any, dict[str, int]]:
    """The value a YAML file holds and the line (from 1) of each key path in it (`stages[0].steps`),
    for every config file. Refused, with an `error` starting with `name` (default: the path): a file
    it cannot read, bytes that are not UTF-8, invalid YAML, a key given twice in one mapping (a key
    that a merge `<<: *x` brings and the mapping sets again is not), a recursive alias, and aliases
    that expand the document by more than MAX_ALIAS_VALUES values."""
    name = str(path) if name is None else name
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{name}: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{name}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8") from None
    try:
        return _parsed(text)
    except yaml.YAMLError as exc:
        raise error(f"{name}: invalid YAML, {yaml_problem(exc)}") from None
    except _Refused as exc:
        line = f":{exc.mark.line + 1}" if exc.mark is not None else ""
        raise error(f"{name}{line}: {exc.problem}") from None


def _parsed(text: str) -> tuple[Any, dict[str, int]]:
    """`text`'s value and key lines; the node graph is checked before any value is built."""
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _check_graph(node, loader)
        lines: dict[str, int] = {}
        _key_lines(node, "", lines)
        return loader.construct_document(node), lines
    except RecursionError:
        raise _Refused("values nested too deeply to read") from None
    except ValueError as exc:  # a value PyYAML resolves but Python refuses, e.g. an int of 5000 digits
        raise _Refused(f"a value that cannot be read ({exc})") from None
    finally:
        loader.dispose()


def _check_graph(root: yaml.Node, loader: _ConfigLoader) -> None:
    """`_Refused` for a key given twice in a mapping, a recursive alias, or aliases adding more than
    MAX_ALIAS_VALUES values. An alias is the node it names, so the graph's nodes are each visited once
    and the document's expanded size counted without expanding it."""
    sizes: dict[int, int] = {}  # node id → the values it stands for, aliases expanded
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _Refused("an alias inside the value it names (a recursive alias)", node.start_mark)
        open_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            _check_keys(node, loader)
            children = [child for pair in node.value for child in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        sizes[id(node)] = 1 + sum(size(child) for child in children)
        open_nodes.discard(id(node))
        return sizes[id(node)]

    added = size(root) - len(sizes)
    if added > MAX_ALIAS_VALUES:
        raise _Refused(f"aliases (*NAME) would expand it by {added:,} values, more than the {MAX_ALIAS_VALUES:,} "
                       "a config may hold (nested anchors and aliases?)")


def _check_keys(node: yaml.MappingNode, loader: _ConfigLoader) -> None:
    """`_Refused` at the second of two keys of `node` that are equal (`<<` merge keys left out: the keys
    a merge brings are defaults that the mapping's own keys replace)."""
    first: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue  # a mapping or list as a key: the constructor refuses it
        key = loader.construct_object(key_node)
        if key in first:
            raise _Refused(f"key {key!r} given twice in one mapping (first on line {first[key].start_mark.line + 1})",
                           key_node.start_mark)
        first[key] = key_node


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


def located(name: str, lines: Mapping[str, int | tuple[str, int]], exc: Exception) -> str:
    """`exc`'s message after the file `name` and, where the file has its key, the line: `run.yaml:7: …`;
    a key's line given as (file, line) (`load_with_bases`: a base file's key) names that file."""
    where = lines.get(getattr(exc, "key", None) or "") if getattr(exc, "key", None) else None
    name, line = where if isinstance(where, tuple) else (name, where)
    return f"{name}:{line}: {exc}" if line else f"{name}: {exc}"


# ---- key paths: `stages[0].base_lr`, as messages name keys and `--set` sets them ------------------

_KEY_PART = re.compile(r"(?:^|\.)([^.\[\]]+)|\[(\d+)\]")


def key_parts(key: str, error: type[Exception] = FieldError) -> list[str | int]:
    """`stages[0].base_lr` → ["stages", 0, "base_lr"]; an `error` for text that is no key path."""
    parts = list(_KEY_PART.finditer(key))
    if not parts or parts[0].group(1) is None or key.startswith(".") or "".join(p.group(0) for p in parts) != key:
        raise error(f"{key!r}: not a key path (NAME, NAME.KEY, NAME[INDEX].KEY, ...)")
    return [part.group(1) if part.group(1) is not None else int(part.group(2)) for part in parts]


def with_setting(values: Mapping[str, Any], key: str, value: Any, error: type[Exception] = FieldError
                 ) -> dict[str, Any]:
    """A copy of mapping `values` with key path `key` set to `value` (a command line's `--set KEY=VALUE`): a
    mapping's key is set or added, a list's item replaced; `KEY+` appends `value` (a list's items, or it) to
    the list at KEY. The mappings and lists on the way are new, so `values` stays as it is; an `error` naming
    `key` for a path through something else, or an item beyond a list's end. The result is checked as the
    file's values are, by whoever reads it."""
    append = key.endswith("+")
    parts = key_parts(key[:-1] if append else key, error)

    def replaced(node: Any, index: int) -> Any:
        if index == len(parts):
            if not append:
                return value
            if not isinstance(node, list) and node is not None:
                raise error(f"{key}: {_key_path(parts)} is {describe(node)}, not a list to append to")
            return [*(node or []), *(value if isinstance(value, list) else [value])]
        part, where = parts[index], _key_path(parts[:index])
        if isinstance(part, int):
            if not isinstance(node, list):
                raise error(f"{key}: {where} is {describe(node)}, not a list")
            if part >= len(node):
                raise error(f"{key}: {where} holds {len(node)} item(s), it has no [{part}]")
            return [*node[:part], replaced(node[part], index + 1), *node[part + 1:]]
        if node is None:
            node = {}
        if not isinstance(node, Mapping):
            raise error(f"{key}: {where} is {describe(node)}, not a mapping whose {part!r} could be set")
        return {**node, part: replaced(node.get(part), index + 1)}

    return replaced(values, 0)


def _key_path(parts: list[str | int]) -> str:
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else join_key(path, part)
    return path


def under_key(path: str, key: str) -> bool:
    """Whether key path `path` is `key` or lies in its value."""
    return path == key or path.startswith((key + ".", key + "["))


# ---- bases: a config file that builds on another ------------------------------------------------

BASE = "base"  # the key of a config file that names the file it builds on


def load_with_bases(path: str | Path, error: type[Exception] = FieldError, name: Callable[[Path], str] = str,
                    keeps: Callable[[Any], bool] = lambda base: False, expected: str = "a file"
                    ) -> tuple[Any, dict[str, tuple[str, int]]]:
    """`load_yaml` of a file whose `base:` names another file (relative to the file naming it; which may
    name another): the file's mapping merged over its base's, key by key in mappings, a list or other value
    replacing the base's whole. Returns the merged value and, for each key, the (file, line) it comes from
    (for `located`); `name` names a file in messages. A `base` that `keeps` (a preset's name) stays in the
    value for the caller. An `error` for a base that is not text or names no file (`expected` says what it
    should name), a base that is not a mapping, and a cycle of bases."""
    return _with_bases(Path(path), error, name, keeps, expected, [])


def _with_bases(path: Path, error: type[Exception], name: Callable[[Path], str], keeps: Callable[[Any], bool],
                expected: str, chain: list[Path]) -> tuple[Any, dict[str, tuple[str, int]]]:
    values, lines = load_yaml(path, error, name(path))
    origins = {key: (name(path), line) for key, line in lines.items()}
    if not isinstance(values, Mapping) or BASE not in values or keeps(values[BASE]):
        return values, origins
    here = f"{name(path)}:{lines[BASE]}: {BASE}"
    base = values[BASE]
    if not isinstance(base, str) or not base:
        raise error(f"{here}: expected {expected}, found {describe(base)}")
    base_path = path.parent / base
    chain = [*chain, path.resolve()]
    if base_path.resolve() in chain:
        cycle = [*chain[chain.index(base_path.resolve()):], base_path.resolve()]
        raise error(f"{here}: a cycle of bases, {' → '.join(map(str, cycle))}")
    if not base_path.is_file():
        raise error(f"{here}: {base!r} is not {expected} ({base_path}: no such file)")
    base_values, base_origins = _with_bases(base_path, error, name, keeps, expected, chain)
    if not isinstance(base_values, Mapping):
        raise error(f"{here}: {base_path} holds {describe(base_values)}, not a mapping to build on")
    replaced: list[str] = []
    merged = _merged(base_values, {key: value for key, value in values.items() if key != BASE}, "", replaced)
    kept = {key: origin for key, origin in base_origins.items() if not any(under_key(key, path) for path in replaced)}
    return merged, {**kept, **{key: origin for key, origin in origins.items() if key != BASE}}


def _merged(base: Any, own: Any, path: str, replaced: list[str]) -> Any:
    """`own` over `base` (at key path `path`): mappings key by key, anything else replacing the base's
    whole; the key paths of the base's values replaced whole are added to `replaced`."""
    if not (isinstance(base, Mapping) and isinstance(own, Mapping)):
        replaced.append(path)
        return own
    return {**base, **{key: _merged(base[key], value, join_key(path, str(key)), replaced) if key in base else value
                       for key, value in own.items()}}
