"""Running a benchmark's measurement with another checkout's code, for side-by-side comparisons.

A benchmark started with `--baseline PATH` runs each measurement in a fresh process of its own
script (`--child SPEC`), which imports the project from `checkout()`: this tree, or the checkout
the parent named (e.g. `git worktree add /tmp/base HEAD~1`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
CHECKOUT_VARIABLE = "BENCH_CHECKOUT"


def checkout() -> Path:
    """The checkout whose code this process measures."""
    return Path(os.environ.get(CHECKOUT_VARIABLE, ROOT))


def run_child(script: str, code: Path, spec: dict[str, Any], each: Callable[[dict], None] | None = None) -> Any:
    """`script --child SPEC` in a fresh process measuring the code at `code`: the JSON object it
    prints last, or with `each`, every line of its output that is a JSON object, handed to `each`
    as it comes (so that a run stopped by a time limit has shown what it measured) and returned."""
    env = {**os.environ, CHECKOUT_VARIABLE: str(code)}
    with tempfile.TemporaryFile("w+") as errors:  # a file: a full pipe would stall the child
        child = subprocess.Popen([sys.executable, script, "--child", json.dumps(spec)], env=env,
                                 stdout=subprocess.PIPE, stderr=errors, text=True)
        lines = []
        for line in child.stdout:
            lines.append(line)
            if each is not None and line.startswith("{"):
                each(json.loads(line))
        if child.wait():
            errors.seek(0)
            raise RuntimeError(f"the measurement with the code at {code} failed:\n{errors.read()[-3000:]}")
    if each is not None:
        return [json.loads(line) for line in lines if line.startswith("{")]
    return json.loads(lines[-1])
