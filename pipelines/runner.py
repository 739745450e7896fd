"""Runs a pipeline file: named steps in order, each writing one folder under the pipeline's `out`.

    name: vqa
    out: runs/vqa
    inputs:                    # what a user gives with `--set NAME=VALUE`; null: no default
      data: null
      lr: 1.0e-5
    steps:
      - {name: data, kind: prepare, source: vqa2, root: "${inputs.data}"}
      - {name: cache, kind: extract, images: "${inputs.data}", image_list: "${data}/images.txt"}
      - {name: finetune, kind: train, store: "${cache}", ..., stages: [{..., base_lr: "${inputs.lr}"}]}

Step kinds: world, prepare, extract, vocabulary, train, report (pipelines/steps.py). In a value,
`${step}` is an earlier step's folder, `${here}` the pipeline file's folder and `${inputs.NAME}` an
input's value: a value that is only the reference takes the input's type (`lr: 1.0e-5` stays a
number), one with text around it the text of the value. In `--set NAME=VALUE`, VALUE is read as
YAML (`3` is a number, `yes` true, `null` no value; quote to keep text: `--set 'name="yes"'`), and
`1e-5` reaches a number field as the number it spells; `--set out=DIR` sets `out`. An input's
default may use `${here}`. A prepare step's keys other than source, root, images and max_missing
are the source's options. Other top-level keys may hold mappings or lists that steps share
through YAML anchors and merge keys (`<<: *common`); nothing else reads them.

The whole file is checked when it loads, before any step runs: unknown `--set` names, inputs left
without a value (all of them, with the `--set` to pass), and every step's keys and types (a train
step's run and stage fields, an extract step's options, ...). Every problem is one line of one
PipelineError: `FILE: step 'NAME' (kind): problem`. A step that fails while running raises
StepFailed, naming the pipeline and the step, with the step's error as its cause.

A step records its parameters (references resolved, so inputs included, and a digest of the files
and earlier steps it reads) in `<out>/<step>/step.json` when it starts and marks it done when it
ends. A rerun skips done steps whose parameters and inputs are unchanged, resumes a step that was
interrupted (extraction and training continue from what they committed), and starts a step again
from nothing when its parameters or inputs changed (a new `--set` value redoes the steps using it).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import yaml

from extract.config import yaml_problem
from pipelines.steps import KINDS, did_you_mean
from train.engine.config import RunConfigError

STEP_FILE = "step.json"
REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a step's folder, an input's name
TOP_LEVEL = ("name", "out", "inputs", "steps")
HERE = "here"
INPUT = "inputs."  # the prefix of an input's reference
OUT = "out"  # the setting that names the output folder


class PipelineError(ValueError):
    """A pipeline file that cannot be run as given; each line names the file (and the step)."""


class StepFailed(Exception):
    """A step that raised while running; `cause` is its error (also `__cause__`)."""

    def __init__(self, pipeline: Path, step: str, cause: Exception) -> None:
        super().__init__(f"pipeline {pipeline}, step {step!r}: {cause}")
        self.pipeline, self.step, self.cause = pipeline, step, cause


@dataclass(frozen=True)
class Step:
    name: str
    kind: str
    folder: Path
    params: dict[str, Any]  # references resolved
    reads: tuple[str, ...]  # the earlier steps it refers to


@dataclass(frozen=True)
class Pipeline:
    path: Path
    out: Path
    steps: list[Step]


def parse_setting(text: str) -> tuple[str, Any]:
    """`NAME=VALUE` from the command line: VALUE read as YAML; one JSON cannot hold (a date) stays text."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise PipelineError(f"--set {text}: expected NAME=VALUE")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise PipelineError(f"--set {text}: VALUE is not YAML ({yaml_problem(exc)}); quote it") from None
    return name, parsed if isinstance(parsed, (str, int, float, bool, list, dict, type(None))) else value


def load_pipeline(path: str | Path, settings: Mapping[str, Any] | None = None) -> Pipeline:
    """The pipeline of file `path` with `settings` (input name → value, `out`), every reference
    resolved and every step's parameters checked; PipelineError listing every problem."""
    path = Path(path)
    document = _read(path)
    settings = {name: str(value) if isinstance(value, Path) else value for name, value in (settings or {}).items()}
    here = str(path.resolve().parent)
    inputs = _input_values(path, document, settings, here)
    references: dict[str, Any] = {HERE: here, **{INPUT + name: value for name, value in inputs.items()}}
    problems = _top_level_problems(path, document, references)
    if problems:
        raise PipelineError("\n".join(problems))
    out = _out(path, document, settings, references)
    steps = []
    for index, entry in enumerate(document["steps"]):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(key), str) for key in ("name", "kind")):
            problems.append(f"{path}: steps[{index}]: every step needs a `name` and a `kind`: {entry!r}")
            continue
        step, step_problems = _step(entry, out, references)
        problems += [f"{path}: step {step.name!r} ({step.kind}): {problem}" for problem in step_problems]
        references[step.name] = str(step.folder)
        steps.append(step)
    if problems:
        raise PipelineError("\n".join(problems))
    return Pipeline(path, out, steps)


def run_pipeline(path: str | Path, out: str | Path | None = None, log: Callable[[str], None] = print,
                 settings: Mapping[str, Any] | None = None) -> Path:
    """Runs every step that is not up to date; returns the pipeline's output folder. `out` is the
    setting `out` (`--out`); `settings` the `--set` values. PipelineError before any step runs when
    the file cannot be run as given; StepFailed when a step raises."""
    settings = dict(settings or {})
    if out is not None:
        if settings.get(OUT) is not None and Path(str(settings[OUT])) != Path(out):
            raise PipelineError(f"{path}: two output folders given: {out} and out={settings[OUT]}")
        settings[OUT] = out
    pipeline = load_pipeline(path, settings)
    pipeline.out.mkdir(parents=True, exist_ok=True)
    folders = {step.name: step.folder for step in pipeline.steps}
    for step in pipeline.steps:
        try:
            _run_step(step, folders, log)
        except Exception as exc:  # noqa: BLE001 - re-raised with the step named; the CLI decides what it is
            raise StepFailed(pipeline.path, step.name, exc) from exc
    return pipeline.out


# ---- loading -------------------------------------------------------------------------------------

def _read(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: invalid YAML, {yaml_problem(exc)}") from None
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read pipeline ({exc.strerror})") from None
    if not isinstance(document, dict) or not isinstance(document.get("steps"), list) or not document["steps"]:
        raise PipelineError(f"{path}: expected a mapping with a list of `steps`")
    return document


def _input_values(path: Path, document: dict[str, Any], settings: dict[str, Any], here: str) -> dict[str, Any]:
    """The declared inputs with the settings' values, defaults' `${here}` resolved."""
    declared = document.get("inputs") or {}
    if not isinstance(declared, dict):
        raise PipelineError(f"{path}: `inputs` must map each input's name to its default (null: none)")
    bad = [str(name) for name in declared if not isinstance(name, str) or not NAME.fullmatch(name) or name == OUT]
    if bad:
        raise PipelineError(f"{path}: inputs: {', '.join(bad)}: not usable as an input's name "
                            f"(letters, digits, `_.-`; `{OUT}` is the output folder's setting)")
    names = [*declared, OUT]
    unknown = [name for name in settings if name not in names]
    if unknown:
        raise PipelineError(f"{path}: --set {', '.join(unknown)}: not an input of this pipeline"
                            f"{did_you_mean(unknown[0], names)}; its inputs: {', '.join(names)}")
    values = {**declared, **{name: value for name, value in settings.items() if name != OUT}}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise PipelineError(f"{path}: no value for input{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                            f"pass {' '.join(f'--set {name}=...' for name in missing)}")
    unresolved = [f"{path}: inputs: {name} refers to ${{{ref}}}; an input may refer to ${{{HERE}}} only"
                  for name, value in values.items() for ref in _references(value) if ref != HERE]
    if unresolved:
        raise PipelineError("\n".join(unresolved))
    return {name: _resolve(value, {HERE: here}) for name, value in values.items()}


def _top_level_problems(path: Path, document: dict[str, Any], references: dict[str, Any]) -> list[str]:
    problems = [f"{path}: unknown key {key!r}" + did_you_mean(key, TOP_LEVEL)
                + "; other top-level keys may only hold mappings or lists that steps share through YAML anchors"
                for key, value in document.items() if key not in TOP_LEVEL and not isinstance(value, (dict, list))]
    problems += [f"{path}: `{key}` must be a string, found {document[key]!r}"
                 for key in ("name", OUT) if key in document and not isinstance(document[key], str)]
    problems += [f"{path}: out refers to ${{{ref}}}; it may refer to ${{{HERE}}} and inputs only"
                 for ref in _references(document.get(OUT)) if ref not in references]
    return problems


def _out(path: Path, document: dict[str, Any], settings: dict[str, Any], references: dict[str, Any]) -> Path:
    """The setting `out`, else the file's `out`, else runs/<the pipeline's name>."""
    if settings.get(OUT) is not None:
        return Path(str(settings[OUT]))
    return Path(str(_resolve(document.get(OUT, f"runs/{document.get('name', path.stem)}"), references)))


def _step(entry: dict[str, Any], out: Path, references: dict[str, Any]) -> tuple[Step, list[str]]:
    """A pipeline file's step and its problems; `references` holds the earlier steps' folders."""
    name, kind = entry["name"], entry["kind"]
    params = {key: value for key, value in entry.items() if key not in ("name", "kind")}
    problems = []
    if not NAME.fullmatch(name):
        problems.append("a step's name is its folder's: letters, digits and `_.-`")
    elif name in references:
        problems.append(f"the name {name!r} is taken ({HERE!r}, or an earlier step's)")
    if kind not in KINDS:
        problems.append(f"unknown kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    unknown = [ref for ref in _references(params) if ref not in references]
    problems += [f"refers to ${{{ref}}}, not a declared input (declared: "
                 f"{', '.join(r[len(INPUT):] for r in references if r.startswith(INPUT)) or 'none'})"
                 if ref.startswith(INPUT) else f"refers to ${{{ref}}}, not an earlier step" for ref in unknown]
    if not unknown:
        params = _resolve(params, references)
        if kind in KINDS:
            try:
                KINDS[kind].check(params)
            except RunConfigError as exc:
                problems.append(str(exc))
    reads = tuple(dict.fromkeys(ref for ref in _references(entry) if ref != HERE and not ref.startswith(INPUT)))
    return Step(name, kind, out / name, params, reads), problems


def _references(value: Any) -> list[str]:
    return REFERENCE.findall(json.dumps(value))


def _resolve(value: Any, references: Mapping[str, Any]) -> Any:
    """`value` with `${...}` replaced; a string that is one reference becomes the referred value."""
    if isinstance(value, str):
        whole = REFERENCE.fullmatch(value)
        if whole:
            return references[whole.group(1)]
        return REFERENCE.sub(lambda m: str(references[m.group(1)]), value)
    if isinstance(value, list):
        return [_resolve(v, references) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, references) for k, v in value.items()}
    return value


# ---- running -------------------------------------------------------------------------------------

def _run_step(step: Step, folders: dict[str, Path], log: Callable[[str], None]) -> None:
    stamp = {"kind": step.kind, "params": step.params, "inputs": _input_digests(step, folders)}
    previous = _read_stamp(step.folder)
    if previous is not None and _same(previous, stamp):
        if previous.get("done"):
            log(f"[{step.name}] up to date")
            return
        log(f"[{step.name}] resuming an interrupted run")
        resume = True
    else:
        if step.folder.exists():
            log(f"[{step.name}] parameters or inputs changed: starting again")
            shutil.rmtree(step.folder)
        resume = False
    step.folder.mkdir(parents=True, exist_ok=True)
    _write_stamp(step.folder, {**stamp, "done": False})
    started = time.perf_counter()
    log(f"[{step.name}] {step.kind} ...")
    KINDS[step.kind].run(step.params, step.folder, resume, log)
    _write_stamp(step.folder, {**stamp, "done": True, "seconds": round(time.perf_counter() - started, 2)})
    log(f"[{step.name}] done in {time.perf_counter() - started:.1f} s")


def _input_digests(step: Step, folders: dict[str, Path]) -> dict[str, str]:
    """For every earlier step it refers to: a digest of its step.json (so a rerun of that step, with
    other results, makes this one stale too); for other existing files it names: their content."""
    read = [folders[name] for name in step.reads]
    digests = {name: _digest(folders[name] / STEP_FILE) for name in step.reads if (folders[name] / STEP_FILE).is_file()}
    for value in _strings(step.params):
        path = Path(value)
        if path.is_file() and not any(path.is_relative_to(folder) for folder in read):
            digests[value] = _digest(path)
    return digests


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _strings(value: Any) -> Iterator[str]:
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
