"""Where a run's curves go beside metrics.jsonl: the backends switched on in the run config's `tracking:`
(TensorBoard by default; W&B and MLflow where installed and switched on), each a `Tracker` registered in
`BACKENDS` by its module. A new backend is one module here and its switch in `TrackingConfig`."""

from __future__ import annotations

import importlib.util
from contextlib import ExitStack

from train.engine.config import TrackingConfig
from train.engine.errors import RunConfigError
from train.engine.tracking import mlflow_log, tensorboard_log, wandb_log  # noqa: F401 - they register themselves
from train.engine.tracking.base import BACKENDS, TrackedStage, Tracker


def switched_on(settings: TrackingConfig) -> list[type[Tracker]]:
    """The backends `settings` switches on, in registration order."""
    return [backend for name, backend in BACKENDS.items() if getattr(settings, name)]


def check_installed(settings: TrackingConfig) -> None:
    """RunConfigError in one line for a backend switched on whose package is not installed, before
    anything trains (the package itself is imported only when its stage log opens)."""
    for backend in switched_on(settings):
        if importlib.util.find_spec(backend.package) is None:
            install = f"vlbert-pipeline[{backend.extra}]" if backend.extra else backend.package
            raise RunConfigError(f"tracking.{backend.name}: true, but the {backend.package} package is not installed "
                                 f"(pip install '{install}'), or set tracking.{backend.name}: false")


def open_trackers(target: TrackedStage, stack: ExitStack) -> list[Tracker]:
    """The stage's trackers, each closed by `stack`; one that fails to open leaves the others to it."""
    trackers = []
    for backend in switched_on(target.settings):
        tracker = backend(target)
        stack.push(lambda kind, *_, tracker=tracker: tracker.close(failed=kind is not None))
        trackers.append(tracker)
    return trackers
