"""Checks shared by every benchmark's predictions file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from train.data.files import DataError

SHOWN = 5  # ids shown of a longer list


def check_prediction_ids(expected: Iterable[Any], given: Iterable[Any], what: str, path: str | Path) -> None:
    """DataError when the predictions in `path` name some `what` (e.g. "question_id") twice, leave
    some of `expected` out, or name ids not in `expected`; it says how many and shows the first few."""
    expected, given = set(expected), list(given)
    problems = []
    repeated = sorted((i for i, n in Counter(given).items() if n > 1), key=str)
    if repeated:
        problems.append(f"{len(repeated)} {what}s predicted more than once ({_first(repeated)})")
    missing = sorted(expected.difference(given), key=str)
    if missing:
        problems.append(f"{len(missing)} of {len(expected)} {what}s have no prediction ({_first(missing)})")
    unknown = sorted(set(given).difference(expected), key=str)
    if unknown:
        problems.append(f"{len(unknown)} predictions name unknown {what}s ({_first(unknown)})")
    if problems:
        raise DataError(f"{path}: " + "; ".join(problems))


def _first(ids: list[Any]) -> str:
    shown = ", ".join(repr(i) for i in ids[:SHOWN])
    return f"first: {shown}" + (", ..." if len(ids) > SHOWN else "")
