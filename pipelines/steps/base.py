"""What every kind of pipeline step is made of: the `StepKind` record, the `Layout` of its processes,
what the load checks know of earlier steps (`Foreknown`), and the helpers the kinds share.

A kind's `run(params, folder, resume, log)` does the step into its own folder. When the pipeline
loads, before any step runs, its `check(params)` validates the parameters (reading no file; it
raises RunConfigError naming the key at fault), then its `verify(params, folder, known)` lists
every problem with what the step would read: input paths that do not exist (those inside an
earlier step's folder excepted), the device and precision, the detector, a vocabulary that does
not fit the model it starts from, a store whose feature size is not the model's. `verify` also
records in `known` what its folder will hold (an extract step's feature size). `check` and `run`
go through one parsing function per kind (vlbert.utils.typed_config's loader, as every config: known names,
required ones, types, `1e-5` read as the number it spells), so what was checked is what runs;
`fields(params)` names what `--set STEP.FIELD` may set, `stage_fields` what `STEP.STAGE.FIELD` may.
`layout(params)` says how many processes a step runs as (an extraction's shards, a training's DDP
ranks and nodes) and whether each takes a GPU; a sharded kind's `close` checks, after every shard,
that the step is complete.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from train.engine.errors import RunConfigError
from vlbert.utils.typed_config import describe, did_you_mean, from_mapping

Log = Callable[[str], None]

# Stands for the step's folder where parameters are checked without running the step.
CHECKED_OUT = "(the step's folder)"


@dataclass
class Foreknown:
    """What the pipeline knows at load about the folders its steps will write, and which values wait
    for an input without a value yet (the load checks leave both out)."""

    step_folders: list[Path] = dataclasses.field(default_factory=list)  # the earlier steps'
    feature_sizes: dict[Path, int] = dataclasses.field(default_factory=dict)  # store folder → its detector's
    vocabularies: dict[Path, Path] = dataclasses.field(default_factory=dict)  # vocabulary step → the folder it copies
    unset: tuple[str, ...] = ()  # `${inputs.NAME}` of inputs without a value

    def checkable(self, value: Any) -> bool:
        """Whether `value` is a given value that names no earlier step's output."""
        if not isinstance(value, str) or any(marker in value for marker in self.unset):
            return False
        path = Path(value).absolute()
        return not any(path.is_relative_to(folder.absolute()) for folder in self.step_folders)


Verify = Callable[[dict[str, Any], Path, Foreknown], list[str]]


def _nothing_to_verify(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    return []


def _no_outputs(params: dict[str, Any], folder: Path) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Layout:
    """The processes a step runs as: `shards` independent ones (each `shard=(i, shards)`), or one run of
    `ranks` processes on each of `nodes` machines (DDP); `gpu`: each process takes a GPU where the
    machine has some (device cuda, or auto)."""

    shards: int = 1
    ranks: int = 1
    nodes: int = 1
    gpu: bool = False

    @property
    def processes(self) -> int:
        return self.shards * self.ranks * self.nodes


def _single_process(params: dict[str, Any]) -> Layout:
    return Layout()


def takes_gpu(device: Any) -> bool:
    return isinstance(device, str) and (device == "auto" or device.startswith("cuda"))


@dataclass(frozen=True)
class StepKind:
    # (params, folder, resume, log) and, for a kind whose layout has shards, shard=(i, n)
    run: Callable[..., None]
    check: Callable[[dict[str, Any]], object]  # its value is unused: it raises RunConfigError or nothing
    fields: Callable[[dict[str, Any]], list[str]]  # the parameters a step of this kind takes
    verify: Verify = _nothing_to_verify
    stage_fields: tuple[str, ...] = ()  # a train step's stages: what STEP.STAGE.FIELD may set
    # What later steps may name beyond the step's folder: `${STEP.NAME}` → a path in it.
    outputs: Callable[[dict[str, Any], Path], dict[str, str]] = _no_outputs
    layout: Callable[[dict[str, Any]], Layout] = _single_process
    # (params, folder, log): after every shard of a sharded step, a problem with the whole is an error
    close: Callable[[dict[str, Any], Path, Log], None] | None = None
    # Seconds of one thread's work (a world, a vocabulary, a report): such a step runs beside the others
    # with one thread and leaves the cores to the heavy steps that start with it.
    light: bool = False
    # (params, folder) → what the step's step.json records once it is done (a train step: each stage's
    # precision as its device resolved it)
    outcome: Callable[[dict[str, Any], Path], dict[str, Any]] = lambda params, folder: {}


def parse(cls: type, params: dict[str, Any]) -> Any:
    """`params` as an instance of dataclass `cls`, checked field by field."""
    return from_mapping(cls, params, error=RunConfigError)


def registered(params: dict[str, Any], key: str, registry: Iterable[str]) -> str:
    """`params[key]`, a name in `registry` (a step's source or benchmark), else RunConfigError naming it."""
    name, known = params.get(key), sorted(registry)
    if not isinstance(name, str):
        raise RunConfigError(f"{key}: expected one of {', '.join(known)}, found {describe(name)}")
    if name not in known:
        raise RunConfigError(f"{key}: {name!r} is not one of {', '.join(known)}{did_you_mean(name, known)}")
    return name


def field_names(cls: type, *extra: str, leaving_out: tuple[str, ...] = ()) -> Callable[[dict[str, Any]], list[str]]:
    """The `fields` of a kind whose parameters are dataclass `cls`'s fields (and `extra`)."""
    return lambda params: [f.name for f in dataclasses.fields(cls) if f.name not in leaving_out] + list(extra)


def missing_paths(named: Iterable[tuple[str, Any]], known: Foreknown) -> list[str]:
    """A problem for each (field, path) whose given path does not exist."""
    return [f"{name}: {path} does not exist" for name, path in named
            if path is not None and known.checkable(path) and not Path(path).exists()]


def device_problems(device: str, precisions: Iterable[str], known: Foreknown,
                     allowed: dict[str, Any] | None = None) -> list[str]:
    """The device's problem on this machine, else those of the precisions run on it."""
    from vlbert.utils.device import DeviceError, check_device
    from vlbert.utils.precision import PRECISIONS, PrecisionError, precision, resolved_precision

    if not known.checkable(device):
        return []
    try:
        checked = check_device(device)
    except DeviceError as exc:
        return [str(exc)]
    problems = []
    for name in dict.fromkeys(precisions):
        try:
            precision(resolved_precision(name, checked), allowed or PRECISIONS).check(checked)
        except PrecisionError as exc:
            problems.append(str(exc))
    return problems


