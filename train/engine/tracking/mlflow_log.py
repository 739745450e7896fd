"""MLflow (`tracking.mlflow: true`, the `mlflow` extra): one MLflow run per run folder in the experiment
`tracking.project`, its id kept in the folder's tracking.json, so every stage and every resumed attempt
continues it. The tracking URI is `tracking.mlflow_uri`, else MLflow's own (MLFLOW_TRACKING_URI).

MLflow's parameters are flat and written once (it refuses a changed value), when the run is created.
MLflow 3 opens a file store (file://...) only with MLFLOW_ALLOW_FILE_STORE=true."""

from __future__ import annotations

import time

from train.engine.errors import RunConfigError
from train.engine.tracking.base import TrackedStage, Tracker, flat, register


@register("mlflow")
class MlflowTracker(Tracker):
    package = "mlflow"
    extra = "mlflow"

    def __init__(self, target: TrackedStage) -> None:
        from mlflow import MlflowClient, get_tracking_uri
        from mlflow.exceptions import MlflowException

        uri = target.settings.mlflow_uri or get_tracking_uri()
        self.run_id = target.run_id(self.name)
        try:
            self.client = MlflowClient(uri)
            if self.run_id is None:
                self.run_id = self._created_run(target)
            else:
                self.client.update_run(self.run_id, status="RUNNING")
        except MlflowException as exc:  # a store it cannot open, a run id it does not hold
            raise RunConfigError(f"tracking.mlflow_uri: {uri}: {exc.message}") from None

    def _created_run(self, target: TrackedStage) -> str:
        from mlflow.entities import Param

        project = target.settings.project
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        run_id = self.client.create_run(experiment_id, run_name=target.run_name).info.run_id
        target.record_run_id(self.name, run_id)
        self.client.log_batch(run_id, params=[Param(key, str(value))
                                              for key, value in flat(target.hyperparameters).items()])
        return run_id

    def scalars(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(tag, value, now, step) for tag, value in values.items()])

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
