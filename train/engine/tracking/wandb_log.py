"""Weights & Biases (`tracking.wandb: true`, the `wandb` extra): one W&B run per run folder, its id kept in
the folder's tracking.json, so every stage and every resumed attempt continues it (resume="allow").

W&B reads its own environment: WANDB_MODE=offline writes the run under WANDB_DIR (default ./wandb) for
`wandb sync` later, WANDB_API_KEY and WANDB_ENTITY as ever. Each stage's scalars are plotted against its
own step (`<stage>/step`): a W&B run's own step only grows, and every stage counts from 1."""

from __future__ import annotations

from train.engine.tracking.base import TrackedStage, Tracker, register


@register("wandb")
class WandbTracker(Tracker):
    package = "wandb"
    extra = "wandb"

    def __init__(self, target: TrackedStage) -> None:
        import wandb

        run_id = target.run_id(self.name)
        self.run = wandb.init(project=target.settings.project, name=target.run_name,
                              id=run_id, resume="allow", reinit="create_new",  # id None: W&B makes one
                              config=target.hyperparameters if run_id is None else None)
        if run_id is None:
            target.record_run_id(self.name, self.run.id)
        self.step_key = f"{target.stage}/step"
        self.run.define_metric(self.step_key)
        self.run.define_metric(f"{target.stage}/*", step_metric=self.step_key)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, self.step_key: step})

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
