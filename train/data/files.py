"""Reading dataset files as published: every problem is a DataError naming the file (and line).

Parsing is bounded: values nested deeper than Python can parse, and integers longer than Python
converts from text (sys.get_int_max_str_digits(), 4,300 digits by default), are DataErrors naming
the file, not tracebacks. A leading UTF-8 byte order mark is dropped, as editors on Windows add one."""

from __future__ import annotations

import codecs
import json
import reprlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from vlbert.utils.errors import UserError

BOM = codecs.BOM_UTF8
T = TypeVar("T")


class DataError(UserError):
    """A dataset, annotation or predictions file that cannot be used as given; the message names the
    file, and the line or item where there is one."""


def read_json(path: str | Path) -> Any:
    """The JSON value of `path`; DataError with the line and column of a syntax error."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _loads(data, str(path), at_line=True)


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-blank line of a JSON-lines file, streamed."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield number, parse_json_line(line, path, number)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def parse_json_line(line: bytes | str, path: str | Path, number: int) -> Any:
    return _loads(line, f"{path}:{number}", at_line=False)


def _loads(data: bytes | str, where: str, at_line: bool) -> Any:
    """json.loads of `data` (bytes: a BOM is dropped), every failure a DataError starting with `where`."""
    try:
        return json.loads(data.removeprefix("\ufeff") if isinstance(data, str) else data)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if at_line else f"column {exc.colno}"
        raise DataError(f"{where}: invalid JSON at {at}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deeply to read") from None
    except ValueError:  # what json.loads raises past that: int() of a number with too many digits
        raise DataError(f"{where}: holds an integer of more than {sys.get_int_max_str_digits()} digits") from None


def read_text(path: str | Path) -> str:
    """The UTF-8 text of `path`, without a leading BOM; DataError when it cannot be read as such."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


class _BoundedRepr(reprlib.Repr):
    def repr_int(self, value: int, level: int) -> str:
        if value.bit_length() > 64:  # repr() refuses past 4,300 digits; a message needs none of them
            return f"<an integer of {value.bit_length()} bits>"
        return repr(value)


_SHOWN = _BoundedRepr()
_SHOWN.maxstring = _SHOWN.maxother = 60


def shown(value: Any) -> str:
    """`value` for a message: a repr cut short in depth and length. An input value can be nested
    deeper than repr() goes, or share its parts (a pickle's memo) so that its full repr grows with
    the square of the file's size."""
    return _SHOWN.repr(value)



def string_fields(value: Any, fields: tuple[str, ...], path: str | Path, line: int) -> dict[str, Any]:
    """`value`, a JSON line of a published file, when it is an object whose `fields` are strings;
    DataError naming the file and line otherwise."""
    if not isinstance(value, dict):
        raise DataError(f"{path}:{line}: expected a JSON object, found {type(value).__name__}")
    for key in fields:
        if not isinstance(value.get(key), str):
            raise DataError(f"{path}:{line}: {key!r}: expected a string, found {shown(value.get(key))}")
    return value


def read_lines_once_each(path: Path, parse: Callable[[Any, Path, int], T], key: Callable[[T], str], what: str,
                         why: str = "") -> Iterator[T]:
    """Every line of a published JSON-lines file, parsed (`parse(value, path, line)`), in its order,
    streamed; DataError naming the line where an item's `key` (a `what`) was seen before."""
    first_line: dict[str, int] = {}
    for line, value in iter_jsonl(path):
        item = parse(value, path, line)
        if key(item) in first_line:
            raise DataError(f"{path}:{line}: {what} {shown(key(item))} appears again (first on line "
                            f"{first_line[key(item)]}){why}")
        first_line[key(item)] = line
        yield item
