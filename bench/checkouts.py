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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHECKOUT_VARIABLE = "BENCH_CHECKOUT"


def checkout() -> Path:
    """The checkout whose code this process measures."""
    return Path(os.environ.get(CHECKOUT_VARIABLE, ROOT))


def run_child(script: str, code: Path, spec: dict[str, Any], every_line: bool = False) -> Any:
    """`script --child SPEC` in a fresh process measuring the code at `code`: the JSON object it
    prints last, or with `every_line` each line of its output that is a JSON object."""
    env = {**os.environ, CHECKOUT_VARIABLE: str(code)}
    done = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], env=env, capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"the measurement with the code at {code} failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    if every_line:
        return [json.loads(line) for line in lines if line.startswith("{")]
    return json.loads(lines[-1])
