"""What every tracking backend is: a `Tracker` that one stage's log (train.engine.stage_log) opens when the
stage starts, sends scalars to and closes; `register` adds a backend to `BACKENDS` under its name, which is
also its switch in the run config's `tracking:` (train.engine.config.TrackingConfig)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from train.engine.config import TrackingConfig
from train.engine.errors import RunConfigError
from train.engine.run_folder import RunFolder, StageFolder
from vlbert.utils.atomic import write_atomically
from vlbert.utils.records import read_record


@dataclass(frozen=True)
class TrackedStage:
    """The stage a tracker logs: where its run folder is, the step it starts from (what an interrupted
    attempt logged past it is stale), the run config (the hyper-parameters) and the `tracking:` settings."""

    run: RunFolder
    folder: StageFolder
    stage: str
    start: int
    hyperparameters: dict[str, Any]
    settings: TrackingConfig

    @property
    def run_name(self) -> str:
        return self.settings.name or self.run.root.name

    def run_id(self, backend: str) -> str | None:
        """The id of the run that `backend` tracks this run folder's run as, where an earlier stage or
        attempt started one: a resumed run continues it."""
        recorded = read_record(self.run.tracking_file, "the tracked runs' ids", RunConfigError) or {}
        return recorded.get(backend)

    def record_run_id(self, backend: str, run_id: str) -> None:
        recorded = read_record(self.run.tracking_file, "the tracked runs' ids", RunConfigError) or {}
        write_atomically(self.run.tracking_file, json.dumps({**recorded, backend: run_id}, indent=1))


class Tracker:
    """One backend's view of a stage: opened with the stage (logging the hyper-parameters once per tracked
    run), given each step's and each logging interval's scalars, closed with the stage."""

    name: ClassVar[str]
    package: ClassVar[str]  # the module it imports, only when switched on
    extra: ClassVar[str | None] = None  # the project's extra that installs it; None: a dependency

    def __init__(self, target: TrackedStage) -> None:
        raise NotImplementedError

    def scalars(self, values: dict[str, float], step: int) -> None:
        """`values` under their tags (`<stage>/<name>`) at the stage's optimiser step `step`."""
        raise NotImplementedError

    def close(self, failed: bool) -> None:
        """`failed`: the stage stopped on an exception (a crash, an interrupt), so the run is marked so."""
        raise NotImplementedError


BACKENDS: dict[str, type[Tracker]] = {}


def register(name: str) -> Callable[[type[Tracker]], type[Tracker]]:
    def registered(backend: type[Tracker]) -> type[Tracker]:
        backend.name = name
        BACKENDS[name] = backend
        return backend

    return registered


def flat(values: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as one level of `a.b.0.c` keys (backends whose parameters are flat: MLflow's)."""
    items = values.items() if isinstance(values, dict) else enumerate(values) if isinstance(values, list) else None
    if items is None or not values:
        return {prefix: values}
    return {key: value for name, item in items for key, value in flat(item, f"{prefix}.{name}".lstrip(".")).items()}
