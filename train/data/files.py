"""Reading dataset files as published: every problem is a DataError naming the file (and line)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator


class DataError(ValueError):
    """A dataset, annotation or predictions file that cannot be used as given; the message names the
    file, and the line or item where there is one."""


def read_json(path: str | Path) -> Any:
    """The JSON value of `path`; DataError with the line and column of a syntax error."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


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
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{number}: invalid JSON at column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from None


def write_atomically(path: str | Path, text: str) -> None:
    """`text` in `path`, replacing it whole or not at all."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
