"""The check that the `vlbert` command makes before it imports anything else of the project: that
`extract`, `train`, `pipelines` and `vlbert` are this project's packages, not files of the folder the
command runs from (a research repository's own `train.py`, as many have) or of another folder on
Python's import path. Standard library only: it runs before any of those packages is imported.

`python -m pipelines` puts the current folder first on the import path, `python -P -m pipelines`
does not; the `vlbert` command and the processes an executor starts never do.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGES = ("extract", "train", "pipelines", "vlbert")
ROOT = Path(__file__).resolve().parents[1]  # the folder holding this project's packages
USAGE = 2  # vlbert.utils.errors.USAGE, which cannot be imported before vlbert is checked


def shadowing(name: str) -> str | None:
    """What Python imports as `name` instead of this project's package, or None when it imports the package."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None  # not found at all: the import itself says so
    found = spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or []), None)
    own = ROOT / name
    if found is not None and Path(found).resolve() in (own, own / "__init__.py"):
        return None
    return found or repr(spec)


def check_own_packages() -> None:
    """Ends the process with one line and exit status 2 when a file shadows one of the project's packages."""
    for name in PACKAGES:
        found = shadowing(name)
        if found is not None:
            print(f"Error: {found}: Python imports this as `{name}` instead of this project's package "
                  f"({ROOT / name}); run from another folder, or as `python -P -m pipelines`", file=sys.stderr)
            raise SystemExit(USAGE)
