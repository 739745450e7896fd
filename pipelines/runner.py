"""Loads a pipeline file: named steps, each writing one folder under the pipeline's `out`, and runs
them through an executor (pipelines/executors: on this machine, or as Slurm jobs).

    name: vqa
    out: runs/vqa
    inputs:                    # what a user gives with `--set NAME=VALUE`; null: must be given
      data: null
      vlbert: null             # given as a folder, or as null: none (start from scratch)
      lr: 1.0e-5
    steps:
      - {name: data, kind: prepare, source: vqa2, root: "${inputs.data}"}
      - {name: cache, kind: extract, images: "${inputs.data}", image_list: "${data}/images.txt"}
      - {name: finetune, kind: train, store: "${cache}", init_from: "${inputs.vlbert}", ...,
         stages: [{name: vqa, ..., base_lr: "${inputs.lr}"}]}

Step kinds: world, prepare, extract, vocabulary, train, evaluate, report (pipelines/steps.py). In a
value, `${step}` is an earlier step's folder, `${here}` the pipeline file's folder and
`${inputs.NAME}` an input's value: a value that is only the reference takes the input's type
(`lr: 1.0e-5` stays a number), one with text around it the text of the value. In `--set
NAME=VALUE`, VALUE is read as YAML (`3` is a number, `yes` true, `null` none; quote to keep text:
`--set 'name="yes"'`), and `1e-5` reaches a number field as the number it spells; `--set out=DIR`
sets `out`. An input's value may use `${here}` and `${STEP}` (resolved where a step uses the input).
An input whose default is null must be given:
a value, or `null` for none, which a field that may be empty (a checkpoint to start from, a
corpus) takes as absent; a text that uses it (`${inputs.data}/x`) needs a value. A prepare step's
keys other than source, root, images and max_missing are the source's options. Other top-level
keys may hold mappings or lists that steps share through YAML anchors and merge keys
(`<<: *common`); nothing else reads them.

`--set STEP.FIELD=VALUE` sets a field of the step named STEP (its value as written in the file is
replaced; references in VALUE are resolved as in the file): `--set finetune.max_length=64`,
`--set finetune.model=base` (a train step's model size), `--set 'finetune.predict=["${data}/test.jsonl"]'`.
`STEP.FIELD.KEY` sets one key of a mapping field (`--set finetune.model.hidden_size=256`,
`--set cache.overrides.score_thresh=0.5`), `STEP.FIELD+=VALUE` appends to a list field (a stage:
`--set 'finetune.stages+={name: e2e, task: vqa, steps: 100, visual: end2end}'`), and in a train
step `STEP.STAGE.FIELD` a field of the stage named STAGE (`--set finetune.vqa.steps=100`). Whatever
their order, whole fields are set first, then appends (each one given, in order), then keys and stage
fields, so a stage field may name a stage that `+=` adds; an input's value may refer to `${here}` and
steps only. A name the file declares as an input is the input. An executor's settings section
(pipelines/executors: `slurm:`) is a top-level mapping, a step's own mapping, or `--set SECTION.KEY=VALUE`;
`--set EXECUTOR.OPTION=VALUE` is an executor's run option (`local.jobs` is `--jobs`, `slurm.wait` `--wait`).

The whole file is checked when it loads, before any step runs, and every problem found is named
together, one line each, in one PipelineError (`FILE: step 'NAME' (kind): problem`): `--set` names
that are neither an input nor a step's field or stage (with the closest name), inputs left without
a value (all of them, with the `--set` to pass), every step's keys and types (a train step's run
and stage fields, model size and loss names, an extract step's options, ...), and then what each
step would read: every input path that is not inside an earlier step's folder must exist, the
device (and each precision on it) must be usable on this machine, the extract step's detector must
be a preset or a readable detector YAML, and a train step's starting checkpoint (init_from, else
bert) must have a vocab_size equal to its vocabulary's size and (init_from) a visual_feature_size
equal to the store's feature size, where the store exists or its extract step's detector gives it.
A step that fails while running raises StepFailed, naming the pipeline and the step, with the
step's error as its cause.

A step records its parameters (references resolved, so inputs included, and a digest of the files
and earlier steps it reads) in `<out>/<step>/step.json` when it starts and marks it done when it
ends. A rerun skips done steps whose parameters and inputs are unchanged, resumes a step that was
interrupted (extraction and training continue from what they committed), and starts a step again
from nothing when its parameters or inputs changed (a new `--set` value redoes the steps using it).
A run records the settings it was given in `<out>/.pipeline/settings.json`, from which `load_run`
loads the pipeline of a run folder for `status` and `cancel`, without the `--set` values again.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TextIO

from pipelines.execution import STATE_FOLDER, Step, named_strings, strings
from pipelines.executors import DEFAULT, EXECUTORS, executor_named, sections
from pipelines.executors.base import StepFailed, option_names  # noqa: F401 - StepFailed: what run_pipeline raises
from pipelines.steps import KINDS, Foreknown, Layout, StepKind
from train.engine.config import RunConfigError
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.errors import UserError
from vlbert.utils.paths import output_folder
from vlbert.utils.records import read_record
from vlbert.utils.typed_config import checked_fields, did_you_mean, from_text, load_yaml

REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a step's folder, an input's name
TOP_LEVEL = ("name", "out", "inputs", "steps")  # and each executor's settings section
SETTINGS_FILE = "settings.json"  # under the state folder: the settings a run was given, for status and cancel
HERE = "here"
INPUT = "inputs."  # the prefix of an input's reference
OUT = "out"  # the setting that names the output folder
APPEND = "+"  # `--set STEP.FIELD+=VALUE` appends VALUE to a list field


class PipelineError(UserError):
    """A pipeline file that cannot be run as given; each line names the file (and the step)."""


@dataclass(frozen=True)
class Pipeline:
    path: Path
    out: Path
    steps: list[Step]
    # an executor's section → its settings: the file's top-level section with `--set SECTION.KEY` values
    executor_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    # step → an executor's section → the step's own settings of that section
    step_executor_settings: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # an executor → its run options given as `--set EXECUTOR.OPTION=VALUE`
    run_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def parse_setting(text: str) -> tuple[str, Any]:
    """`NAME=VALUE` from the command line: VALUE read as YAML; one JSON cannot hold (a date) stays text."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise PipelineError(f"--set {text}: expected NAME=VALUE")
    parsed = from_text(value, PipelineError, f"--set {text}")
    return name, parsed if isinstance(parsed, (str, int, float, bool, list, dict, type(None))) else value


def parse_settings(texts: Iterable[str]) -> dict[str, Any]:
    """The `--set` values of a command line, by name: a later value of a name replaces an earlier one,
    but appends (`NAME+=VALUE`) given several times all append, in order."""
    settings: dict[str, Any] = {}
    for name, value in map(parse_setting, texts):
        if name.endswith(APPEND) and name in settings:
            value = [*_as_items(settings[name]), *_as_items(value)]
        settings[name] = value
    return settings


def _as_items(value: Any) -> list[Any]:
    """What an append adds: a list's items, or the value itself."""
    return value if isinstance(value, list) else [value]


def load_pipeline(path: str | Path, settings: Mapping[str, Any] | None = None) -> Pipeline:
    """The pipeline of file `path` with `settings` (input name → value, `out`, `STEP.FIELD`), every
    reference resolved and every step checked; PipelineError listing every problem."""
    path = Path(path)
    document = _read(path)
    settings = {name: str(value) if isinstance(value, Path) else value for name, value in (settings or {}).items()}
    here = str(path.resolve().parent)
    declared = _declared_inputs(path, document)
    step_names = [entry["name"] for entry in document["steps"] if isinstance(entry, dict)
                  and isinstance(entry.get("name"), str)]
    given, step_settings, executor_settings, run_options, problems = _sorted_settings(path, step_names, declared,
                                                                                      settings)
    inputs, unset, input_problems = _input_values(path, declared, given, here, step_names)
    problems += input_problems
    references: dict[str, Any] = {HERE: here, **{INPUT + name: value for name, value in inputs.items()}}
    top_level = _top_level_problems(path, document, references)
    if top_level:
        raise PipelineError("\n".join(problems + top_level))
    out = _out(path, document, settings, references)
    problems += _out_problems(path, out)
    known = Foreknown(unset=tuple(f"${{{INPUT}{name}}}" for name in unset))
    steps, step_executor_settings = [], {}
    owners: dict[str, Path] = {}  # a step's reference, and its outputs', → the step's folder
    named_once = list(known.unset)  # markers of problems that follow from one named elsewhere
    for index, entry in enumerate(document["steps"]):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(key), str) for key in ("name", "kind")):
            problems.append(f"{path}: steps[{index}]: every step needs a `name` and a `kind`: {entry!r}")
            continue
        problems += [f"{path}: step {entry['name']!r}: `{section}` must map {section} settings to values"
                     for section in sections() if not isinstance(entry.get(section) or {}, dict)]
        step_executor_settings[entry["name"]] = {section: entry[section] or {} for section in sections()
                                                 if section in entry}
        entry = {key: value for key, value in entry.items() if key not in sections()}
        step, step_problems = _step(entry, out, references, step_settings.get(entry["name"], {}), known, owners)
        problems += [f"{path}: step {step.name!r} ({step.kind}): {problem}" for problem in step_problems
                     if not any(marker in problem for marker in named_once)]  # named once: as an input, a step
        outputs = KINDS[step.kind].outputs(step.params, step.folder) if step.kind in KINDS else {}
        if step_problems and not outputs:  # its outputs are unknown because its own problems are named
            named_once.append(f"${{{step.name}.")
        named = {step.name: str(step.folder), **{f"{step.name}.{output}": path for output, path in outputs.items()}}
        references.update(named)
        owners.update(dict.fromkeys(named, step.folder))
        known.step_folders.append(step.folder)
        steps.append(step)
    if problems:
        raise PipelineError("\n".join(problems))
    return Pipeline(path, out, steps, {section: {**(document.get(section) or {}), **executor_settings.get(section, {})}
                                       for section in sections()}, step_executor_settings, run_options)


def with_out(path: str | Path, out: str | Path | None, settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `--set` values with `--out` as the setting `out`; two different ones are a PipelineError."""
    settings = dict(settings or {})
    if out is not None:
        if settings.get(OUT) is not None and Path(str(settings[OUT])) != Path(out):
            raise PipelineError(f"{path}: two output folders given: {out} and out={settings[OUT]}")
        settings[OUT] = out
    return settings


def run_pipeline(path: str | Path, out: str | Path | None = None, log: Callable[[str], None] = print,
                 settings: Mapping[str, Any] | None = None, executor: str = DEFAULT,
                 status_stream: TextIO | None = None, **options: Any) -> Path:
    """Runs every step that is not up to date; returns the pipeline's output folder. `out` is the
    setting `out` (`--out`); `settings` the `--set` values, which the output folder records for
    `status` and `cancel` (`load_run`). `executor` (pipelines/executors) runs the steps, `options`
    are its run's (local: `jobs`, by default 1: one after another in this process, None: as many as
    the cores and GPUs allow, `threads`, `gpus`; slurm: `wait`, `threads`), also given as settings
    `EXECUTOR.OPTION`: one it does not take is refused when given; `status_stream` (a terminal) shows
    a line per running step. PipelineError before any step runs when the file cannot be run as given,
    CannotRun when the executor cannot run it (more processes than the machine or partition has,
    unknown settings), RunGoingOn while another process runs the same output folder; StepFailed (or
    StepsFailed, naming each) when steps fail."""
    from pipelines.executors.base import CannotRun, running

    chosen = executor_named(executor)
    chosen.options_from(options)  # what it does not take is refused before the file is read
    settings = with_out(path, out, settings)
    pipeline = load_pipeline(path, settings)
    taken = chosen.options_from(_joined_options(path, options, pipeline.run_options.get(executor, {}), executor))
    problems = chosen.problems(pipeline, taken)
    if problems:
        raise CannotRun("\n".join(f"{pipeline.path}: {problem}" for problem in problems))
    declare_out(pipeline)
    made_folder(pipeline.out)
    with running(pipeline.out):
        write_atomically(pipeline.out / STATE_FOLDER / SETTINGS_FILE,
                         json.dumps({name: value for name, value in settings.items() if name != OUT}, indent=1,
                                    default=str))
        chosen.run(pipeline, log, taken, status_stream)
    return pipeline.out


def _joined_options(path: str | Path, given: Mapping[str, Any], settings: Mapping[str, Any], executor: str
                    ) -> dict[str, Any]:
    """The run options `given` (as keywords, a command's flags; None or False: not given) with those of the
    `--set EXECUTOR.OPTION` settings; one given both ways, with two values, is a PipelineError."""
    twice = [f"--{name} {given[name]} and --set {executor}.{name}={value}" for name, value in settings.items()
             if given.get(name) not in (None, False, value)]
    if twice:
        raise PipelineError(f"{path}: {'; '.join(twice)}: the same option given twice; give one of them")
    return {**given, **settings}


def declare_out(pipeline: Pipeline) -> None:
    """Declares the pipeline's output folder the one its steps write (vlbert/utils/paths.py `output_folder`);
    OutputOverlapError where it is, lies inside or holds an input of a step: an existing path that the
    step's parameters name outside the steps' folders (an extract step's images, an annotation file)."""
    folders = [Path(os.path.abspath(step.folder)) for step in pipeline.steps]
    output_folder(pipeline.out, [(f"step {step.name!r}: {field}", text) for step in pipeline.steps
                                 for field, text in named_strings(step.params) if _outside(text, folders)], OUT)


def _outside(text: str, folders: list[Path]) -> bool:
    """Whether the path `text` exists (os.path.exists: text no file system takes names none) and lies in
    none of `folders` (as written, not resolved)."""
    return os.path.exists(text) and not any(Path(os.path.abspath(text)).is_relative_to(folder) for folder in folders)


def load_run(path: str | Path, settings: Mapping[str, Any] | None = None) -> Pipeline:
    """The pipeline of the run in an output folder (`out` of `settings`, else the file's `out` where it
    names no input): loaded with the settings that run was given (its folder records them), and
    `settings` over them, so that `status` and `cancel` need no `--set` again."""
    path, settings = Path(path), dict(settings or {})
    out = settings.get(OUT)
    if out is None:
        written = _out_text(path, _read(path))
        if isinstance(written, str) and set(_references(written)) <= {HERE}:
            out = _resolve(written, {HERE: str(path.resolve().parent)})
    recorded = recorded_settings(Path(str(out))) if out is not None else {}
    return load_pipeline(path, {**recorded, **settings})


def recorded_settings(out: Path) -> dict[str, Any]:
    """The settings the last run in `out` was given (but `out`); {} where none ran."""
    return read_record(out / STATE_FOLDER / SETTINGS_FILE, "the settings of a run", PipelineError) or {}


# ---- loading -------------------------------------------------------------------------------------

def _read(path: Path) -> dict[str, Any]:
    document, _ = load_yaml(path, PipelineError)
    if not isinstance(document, dict) or not isinstance(document.get("steps"), list) or not document["steps"]:
        raise PipelineError(f"{path}: expected a mapping with a list of `steps`")
    return document


def _declared_inputs(path: Path, document: dict[str, Any]) -> dict[str, Any]:
    declared = document.get("inputs") or {}
    if not isinstance(declared, dict):
        raise PipelineError(f"{path}: `inputs` must map each input's name to its default (null: none)")
    bad = [str(name) for name in declared if not isinstance(name, str) or not NAME.fullmatch(name) or name == OUT]
    if bad:
        raise PipelineError(f"{path}: inputs: {', '.join(bad)}: not usable as an input's name "
                            f"(letters, digits, `_.-`; `{OUT}` is the output folder's setting)")
    return declared


def _sorted_settings(path: Path, step_names: list[str], declared: dict[str, Any], settings: dict[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any], dict[str, Any], list[str]]:
    """The settings of inputs, those of steps' fields (step name → {FIELD or STAGE.FIELD: value}), the
    executors' settings (section → {KEY: value} of `SECTION.KEY`), their run options (executor →
    {OPTION: value} of `EXECUTOR.OPTION`, each checked against its option's type), and a problem for
    each name that is none of these or holds a value its option does not take."""
    inputs, steps, executor_settings, run_options, problems = {}, {}, {}, {}, []
    for name, value in settings.items():
        step = max((s for s in step_names if name.startswith(s + ".")), key=len, default=None)
        prefix, _, key = name.partition(".")
        if name in declared:
            inputs[name] = value
        elif step is not None:
            steps.setdefault(step, {})[name[len(step) + 1:]] = value
        elif key and prefix in EXECUTORS and key in option_names(executor_named(prefix)):
            try:
                run_options.setdefault(prefix, {}).update(
                    checked_fields(executor_named(prefix).options, {key: value}, f"--set {prefix}", PipelineError))
            except PipelineError as exc:  # named with the other problems
                problems.append(f"{path}: {exc}")
        elif key and prefix in sections():
            executor_settings.setdefault(prefix, {})[key] = value
        elif key and prefix in EXECUTORS:  # an executor that takes no settings: its options only
            problems.append(_unknown_option(path, name, executor_named(prefix)))
        elif name != OUT:
            problems.append(_unknown_setting(path, name, [*declared, OUT], step_names))
    return inputs, steps, executor_settings, run_options, problems


def _unknown_option(path: Path, name: str, executor) -> str:
    options = option_names(executor)
    return (f"{path}: --set {name}: not an option of the {executor.name} executor"
            f"{did_you_mean(name.partition('.')[2], options)}; its options: "
            + "; ".join(f"{option} ({help})" for option, help in options.items()))


def _unknown_setting(path: Path, name: str, inputs: list[str], steps: list[str]) -> str:
    head = name.partition(".")[0] if "." in name else name
    return (f"{path}: --set {name}: not an input nor a step of this pipeline{did_you_mean(head, inputs + steps)}; "
            f"inputs: {', '.join(inputs)}; steps (--set STEP.FIELD=VALUE): {', '.join(steps)}")


def _input_values(path: Path, declared: dict[str, Any], given: dict[str, Any], here: str, step_names: list[str]
                  ) -> tuple[dict[str, Any], list[str], list[str]]:
    """The declared inputs with the given values, `${here}` resolved (a step's folder, `${STEP}`, is
    resolved where a step uses the input); the inputs without a value (null in the file and not given:
    their references stay as written); the problems. A value given as null is none; one that refers to
    an input, itself included, or to no step is refused."""
    values = {**declared, **given}
    unset = [name for name, value in values.items() if value is None and name not in given]
    problems = [f"{path}: no value for input{'s' if len(unset) > 1 else ''} {', '.join(unset)}; "
                f"pass {' '.join(f'--set {name}=...' for name in unset)}"] if unset else []
    unresolved = [f"{path}: inputs: {name} refers to ${{{ref}}}{_not_a_step(ref, name)}; an input may refer to "
                  f"${{{HERE}}} and steps only" for name, value in values.items() for ref in _references(value)
                  if ref != HERE and not any(ref == step or ref.startswith(step + ".") for step in step_names)]
    if unresolved:
        raise PipelineError("\n".join(problems + unresolved))
    resolved = {name: f"${{{INPUT}{name}}}" if name in unset else _resolve(value, {HERE: here}, partial=True)
                for name, value in values.items()}
    return resolved, unset, problems


def _not_a_step(ref: str, name: str) -> str:
    """Why `${ref}` in input `name`'s value names no step."""
    if ref == name:
        return ", itself (a step's value reads an input as ${" + INPUT + name + "})"
    return "" if ref.startswith(INPUT) else ", not a step of this pipeline"


def _top_level_problems(path: Path, document: dict[str, Any], references: dict[str, Any]) -> list[str]:
    known = [*TOP_LEVEL, *sections()]
    problems = [f"{path}: unknown key {key!r}" + did_you_mean(key, known)
                + "; other top-level keys may only hold mappings or lists that steps share through YAML anchors"
                for key, value in document.items() if key not in known and not isinstance(value, (dict, list))]
    problems += [f"{path}: `{section}` must map {section} settings to values, found {document[section]!r}"
                 for section in sections() if not isinstance(document.get(section) or {}, dict)]
    problems += [f"{path}: `{key}` must be a string, found {document[key]!r}"
                 for key in ("name", OUT) if key in document and not isinstance(document[key], str)]
    problems += [f"{path}: out refers to ${{{ref}}}; it may refer to ${{{HERE}}} and inputs only"
                 for ref in _references(document.get(OUT)) if ref not in references]
    return problems


def _out(path: Path, document: dict[str, Any], settings: dict[str, Any], references: dict[str, Any]) -> Path:
    """The setting `out`, else the file's `out`, else runs/<the pipeline's name>."""
    if settings.get(OUT) is not None:
        return Path(str(settings[OUT]))
    return Path(str(_resolve(_out_text(path, document), references)))


def _out_text(path: Path, document: dict[str, Any]) -> Any:
    """The file's `out` as written, else runs/<the pipeline's name>."""
    return document.get(OUT, f"runs/{document.get('name', path.stem)}")


def _out_problems(path: Path, out: Path) -> list[str]:
    """A problem when `out`, or a folder it would be made in, is an existing file."""
    file = next((folder for folder in (out, *out.parents) if folder.exists() and not folder.is_dir()), None)
    if file is None:
        return []
    where = "is a file" if file == out else f"would be made inside {file}, a file"
    return [f"{path}: out: {out} {where}; the output folder must be a folder or not exist yet"]


def _step(entry: dict[str, Any], out: Path, references: dict[str, Any], settings: dict[str, Any],
          known: Foreknown, owners: dict[str, Path]) -> tuple[Step, list[str]]:
    """A pipeline file's step with its `--set STEP.…` `settings`, and its problems; `references` holds
    the inputs, the earlier steps' folders and outputs (`owners`: whose folder each is), `known` what
    the load checks know of them. References in inputs' and settings' values are resolved too."""
    name, kind = entry["name"], entry["kind"]
    inputs = {ref: value for ref, value in references.items() if ref.startswith(INPUT)}
    # New containers, so that settings change this step only (YAML aliases share them between steps).
    params = _resolve({key: value for key, value in entry.items() if key not in ("name", "kind")}, inputs,
                      partial=True)
    problems = []
    if not NAME.fullmatch(name):
        problems.append("a step's name is its folder's: letters, digits and `_.-`")
    elif name in references:
        problems.append(f"the name {name!r} is taken ({HERE!r}, or an earlier step's)")
    if kind not in KINDS:
        problems.append(f"unknown kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    if kind in KINDS:
        problems += [f"--set {name}.{field}: {problem}" for field, value in _in_setting_order(settings)
                     for problem in [_set_field(params, field, value, KINDS[kind])] if problem]
    unknown = [ref for ref in _references(params) if ref not in references]
    problems += [_unknown_reference(ref, references) for ref in unknown]
    nulls = _null_in_text(params, references)
    problems += nulls
    folder = out / name
    reads = {owner.name: owner for owner in dict.fromkeys(owners[ref] for ref in _references(params) if ref in owners)}
    layout = Layout()
    if not unknown:
        params = _resolve(params, references)
        if kind in KINDS and not nulls:
            checked = _checked_step(KINDS[kind], params, folder, known)
            problems += checked
            layout = KINDS[kind].layout(params) if not checked else layout
    return Step(name, kind, folder, params, reads, layout), problems


def _unknown_reference(ref: str, references: dict[str, Any]) -> str:
    if ref.startswith(INPUT):
        declared = [r[len(INPUT):] for r in references if r.startswith(INPUT)]
        return f"refers to ${{{ref}}}, not a declared input (declared: {', '.join(declared) or 'none'})"
    step = max((name for name in references if ref.startswith(name + ".")), key=len, default=None)
    if step is None:
        return f"refers to ${{{ref}}}, not an earlier step"
    offered = [name[len(step) + 1:] for name in references if name.startswith(step + ".")]
    output = ref[len(step) + 1:]
    if not offered:
        return (f"refers to ${{{ref}}}, but step {step!r} offers nothing by name: a train step (without "
                "seeds) offers final, predictions, STAGE.final and STAGE.predictions")
    return f"refers to ${{{ref}}}, but step {step!r} offers no {output!r}; it offers {', '.join(offered)}"


def _checked_step(kind: StepKind, params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    """The parameters' problem, else every problem with what the step would read."""
    try:
        kind.check(params)
    except RunConfigError as exc:
        return [str(exc)]
    return kind.verify(params, folder, known)


def _in_setting_order(settings: dict[str, Any]) -> list[tuple[str, Any]]:
    """A step's `--set` values in the order that lets each build on the others, whatever the command
    line's order: whole fields first (`stages=[...]`), then appends (`stages+=...`), then keys and
    stage fields (`model.hidden_size`, `e2e.steps` of a stage just appended); the command line's
    order within each."""
    def rank(field: str) -> int:
        return 2 if "." in field else 1 if field.endswith(APPEND) else 0

    return sorted(settings.items(), key=lambda item: rank(item[0]))


def _set_field(params: dict[str, Any], field: str, value: Any, kind: StepKind) -> str | None:
    """Sets `FIELD`, `FIELD.KEY` (in a mapping field: `model.hidden_size`) or, in a train step,
    `STAGE.FIELD` (the stage named STAGE); `FIELD+` appends to a list field (a stage, or a list of
    them, to `stages+`); the problem with the name, or None."""
    head, _, rest = field.partition(".")
    fields = kind.fields(params)
    if head.endswith(APPEND) and not rest and head[:-len(APPEND)] in fields:
        head = head[:-len(APPEND)]
        if not isinstance(params.get(head) or [], list):
            return f"{head} is {params[head]!r}, not a list that {field} could append to"
        params[head] = [*(params.get(head) or []), *_as_items(value)]
        return None
    if head in fields:
        if not rest:
            params[head] = value
            return None
        if params.get(head) is not None and not isinstance(params[head], dict):
            return f"{head} is {params[head]!r}, not a mapping whose {rest!r} could be set"
        params[head] = _with_key(params.get(head) or {}, rest.split("."), value)
        return None
    listed = params.get("stages")  # a train step's; anything but a list is its check's to name
    stages = {stage.get("name"): stage for stage in (listed if isinstance(listed, list) else [])
              if isinstance(stage, dict)}
    stage_name = max((s for s in stages if isinstance(s, str) and (field + ".").startswith(s + ".")), key=len,
                     default=None) if kind.stage_fields else None
    if stage_name is None:
        return (f"no field {'or stage ' if kind.stage_fields else ''}{head!r}"
                f"{did_you_mean(head, [*fields, *(s for s in stages if isinstance(s, str))])}")
    stage_field = field[len(stage_name) + 1:]
    if not stage_field:
        return f"{stage_name!r} is a stage: name one of its fields after it ({stage_name}.steps, ...)"
    if stage_field not in kind.stage_fields:
        return f"stage {stage_name!r} has no field {stage_field!r}{did_you_mean(stage_field, kind.stage_fields)}"
    stages[stage_name][stage_field] = value
    return None


def _with_key(mapping: dict[str, Any], keys: list[str], value: Any) -> dict[str, Any]:
    inner = mapping.get(keys[0])
    return {**mapping, keys[0]: value if len(keys) == 1 else _with_key(inner if isinstance(inner, dict) else {},
                                                                        keys[1:], value)}


def _null_in_text(params: dict[str, Any], references: dict[str, Any]) -> list[str]:
    """A problem for each input given as null (none) that a text uses: `${inputs.data}/x` has no value."""
    return [f"{text!r}: input {ref[len(INPUT):]} is null (none), but this text needs its value"
            for text in strings(params) if not REFERENCE.fullmatch(text)
            for ref in REFERENCE.findall(text) if ref in references and references[ref] is None]


def _references(value: Any) -> list[str]:
    return REFERENCE.findall(json.dumps(value))


def _resolve(value: Any, references: Mapping[str, Any], partial: bool = False) -> Any:
    """`value` with `${...}` replaced, in new containers; a string that is one reference becomes the
    referred value. `partial`: references that `references` lacks, and nulls inside a text, stay as
    written (resolved, or named as problems, later)."""
    if isinstance(value, str):
        whole = REFERENCE.fullmatch(value)
        if whole and (whole.group(1) in references or not partial):
            return references[whole.group(1)]
        return REFERENCE.sub(lambda m: _as_text(m, references, partial), value)
    if isinstance(value, list):
        return [_resolve(v, references, partial) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, references, partial) for k, v in value.items()}
    return value


def _as_text(match: re.Match, references: Mapping[str, Any], partial: bool) -> str:
    ref = match.group(1)
    if partial and references.get(ref) is None:
        return match.group(0)
    return str(references[ref])
