"""Runs a pipeline file: named steps in order, each writing one folder under the pipeline's `out`.

    name: demo
    out: runs/demo
    steps:
      - {name: world, kind: world, images: 600}
      - {name: cache, kind: extract, images: ${world}, detector: tiny, mask_variants: 2}
      ...

`${step}` in a value is that step's folder, `${here}` the pipeline file's folder. A step records its parameters (with `${...}`
resolved, and a digest of the files its inputs are) in `<out>/<step>/step.json` when it starts and
marks it done when it ends. A rerun skips done steps whose parameters and inputs are unchanged,
resumes a step that was interrupted (extraction and training continue from what they committed),
and starts a step again from nothing when its parameters or inputs changed.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from extract.config import yaml_problem
from pipelines import steps as step_kinds

STEP_FILE = "step.json"
REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")


class PipelineError(ValueError):
    """A pipeline file that cannot be run; the message names the file and the step."""


def load_pipeline(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        pipeline = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: invalid YAML, {yaml_problem(exc)}") from None
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read pipeline ({exc.strerror})") from None
    if not isinstance(pipeline, dict) or not isinstance(pipeline.get("steps"), list):
        raise PipelineError(f"{path}: expected a mapping with a list of `steps`")
    names = {"here"}
    for step in pipeline["steps"]:
        if not isinstance(step, dict) or "name" not in step or "kind" not in step:
            raise PipelineError(f"{path}: every step needs a `name` and a `kind`: {step!r}")
        if step["kind"] not in step_kinds.KINDS:
            raise PipelineError(f"{path}: step {step['name']!r}: unknown kind {step['kind']!r} "
                                f"(known: {', '.join(sorted(step_kinds.KINDS))})")
        for ref in REFERENCE.findall(json.dumps(step)):
            if ref not in names:
                raise PipelineError(f"{path}: step {step['name']!r} refers to ${{{ref}}}, not an earlier step")
        names.add(step["name"])
    pipeline.setdefault("out", f"runs/{pipeline.get('name', path.stem)}")
    return pipeline


def run_pipeline(path: str | Path, out: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Runs every step that is not up to date; returns the pipeline's output folder."""
    pipeline = load_pipeline(path)
    root = Path(out or pipeline["out"])
    root.mkdir(parents=True, exist_ok=True)
    folders: dict[str, Path] = {"here": Path(path).resolve().parent}
    for step in pipeline["steps"]:
        name, kind = step["name"], step["kind"]
        folder = root / name
        folders[name] = folder
        params = _resolve({k: v for k, v in step.items() if k not in ("name", "kind")}, folders)
        stamp = {"kind": kind, "params": params, "inputs": _input_digests(params, folders)}
        previous = _read_stamp(folder)
        if previous is not None and _same(previous, stamp):
            if previous.get("done"):
                log(f"[{name}] up to date")
                continue
            log(f"[{name}] resuming an interrupted run")
            resume = True
        else:
            if folder.exists():
                log(f"[{name}] parameters or inputs changed: starting again")
                shutil.rmtree(folder)
            resume = False
        folder.mkdir(parents=True, exist_ok=True)
        _write_stamp(folder, {**stamp, "done": False})
        started = time.perf_counter()
        log(f"[{name}] {kind} ...")
        step_kinds.KINDS[kind](params, folder, resume=resume, log=log)
        _write_stamp(folder, {**stamp, "done": True, "seconds": round(time.perf_counter() - started, 2)})
        log(f"[{name}] done in {time.perf_counter() - started:.1f} s")
    return root


def _resolve(value: Any, folders: dict[str, Path]) -> Any:
    if isinstance(value, str):
        return REFERENCE.sub(lambda m: str(folders[m.group(1)]), value)
    if isinstance(value, list):
        return [_resolve(v, folders) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, folders) for k, v in value.items()}
    return value


def _input_digests(params: dict, folders: dict[str, Path]) -> dict[str, str]:
    """For every earlier step a parameter points into: a digest of its step.json (so a rerun of that
    step, with other results, makes this one stale too); for other existing files: their content."""
    digests = {}
    text = json.dumps(params)
    for name, folder in folders.items():
        if name != "here" and str(folder) in text and (folder / STEP_FILE).is_file():
            digests[name] = hashlib.sha256((folder / STEP_FILE).read_bytes()).hexdigest()
    for value in _strings(params):
        path = Path(value)
        if path.is_file() and not any(str(f) in value for n, f in folders.items() if n != "here"):
            digests[value] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def _same(previous: dict, stamp: dict) -> bool:
    return all(previous.get(key) == stamp[key] for key in ("kind", "params", "inputs"))


def _read_stamp(folder: Path) -> dict | None:
    path = folder / STEP_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _write_stamp(folder: Path, stamp: dict) -> None:
    tmp = folder / (STEP_FILE + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1))
    tmp.replace(folder / STEP_FILE)
