"""The one reader of the JSON records that the project writes and reads back: a pipeline step's
step.json, an executor's state file, a run's settings, a FeatureStore's meta.json, a training run's
run.json and its stages' eval.json. Such a file may be damaged by anyone (an editor, a full disk, a
copy cut short, bytes of another encoding): whatever keeps it from being read is one error of the
caller's class naming the file, and nothing is changed. This module imports nothing of the project
but its errors, so every package reads its records through it.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlbert.utils.errors import UserError


def read_record(path: str | Path, what: str, error: type[UserError], consequence: str = "") -> dict | None:
    """The JSON object in file `path`; None where there is no such file. One that exists but cannot
    be read (a read error, bytes that are not UTF-8, anything but a JSON object) is `error`, naming
    the file, `what` it holds and the `consequence` (e.g. "; its folder was left as it is")."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc}){consequence}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: damaged (not {what}: byte {exc.start} is not UTF-8 text){consequence}") from None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, an integer of too many digits, nested too deeply
        value = None
    if not isinstance(value, dict):
        raise error(f"{path}: damaged (not {what}){consequence}")
    return value
