"""Files written by torch.save, read with torch's weights-only unpickler: tensors and plain containers
load, any other object is refused before it runs. Torch's refusal is several lines that advise
loading the file again with `weights_only=False`, which runs whatever the file holds; the project
never gives that advice: `refusal` says in one line what was refused (or what is damaged).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from vlbert.utils.errors import UserError

_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")  # the weights-only unpickler's words
_UNPICKLER_ERROR = re.compile(r"WeightsUnpickler error:\s*([^\n]+)")


def refused_global(error: pickle.UnpicklingError) -> str | None:
    """The object (module.name) torch's weights-only unpickler refused, or None for another failure."""
    found = _REFUSED_GLOBAL.search(str(error))
    return found.group(1) if found else None


def refusal(error: pickle.UnpicklingError) -> str:
    """What a weights-only load refused, in one line without torch's advice."""
    refused = refused_global(error)
    if refused is not None:
        return f"holds objects beyond tensors ({refused}), which are not loaded: loading them could run code"
    detail = _UNPICKLER_ERROR.search(str(error))  # torch's first lines are its advice
    return f"a damaged PyTorch checkpoint ({detail.group(1).strip() if detail else 'its pickle cannot be read'})"


def first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def load_weights_only(path: str | Path, error: type[Exception] = UserError) -> Any:
    """torch.load of `path` on the CPU, weights only; `error` naming the file when it holds anything
    else. Other failures (a damaged zip archive) are the caller's to name."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise error(f"{path}: {refusal(exc)}") from None
