"""`vlbert train RUN.yaml`: one training run (stages) from a FeatureStore."""

from pathlib import Path

import click



@click.command("train")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--resume", is_flag=True,
              help="Continue the unfinished run in its `out` folder from its latest checkpoints.")
@click.option("--restart", is_flag=True,
              help="Discard the run in the `out` folder (stages, metrics, TensorBoard logs, recorded config) and start over.")
@click.option("--skip-damaged", is_flag=True,
              help="Train and evaluate without samples whose FeatureStore record is damaged, counting them "
                   "(damaged_records: skip).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Set a field of CONFIG (repeatable): a key path such as stages[0].base_lr, model.hidden_size or "
                   "stages[1].options.answers; KEY+=VALUE appends to a list (stages+={name: ..., task: ...}). "
                   "VALUE is read as YAML, as pipeline run's --set reads it; --out and --device replace it.")
@click.option("--out", type=click.Path(file_okay=False), help="Override the config's `out` folder.")
@click.option("--device", help="Override the config's device (cpu, cuda, cuda:N).")
def train_command(config: Path, resume: bool, restart: bool, skip_damaged: bool, settings: tuple[str, ...],
                  out: str | None, device: str | None) -> None:
    """Train the stages of CONFIG (a run config in YAML); under torchrun, with DDP.

    The run config's fields and each stage's, with their defaults, are listed in docs/training.md,
    section "Run config fields". A run config may build on another: `base: other.yaml` (relative to
    CONFIG), whose fields it replaces (a mapping's key by key).

    Each stage ends with its task's metric on the evaluation split, printed and kept in
    the stage's folder under OUT (docs/training.md, "Run folder"), beside the training curves.
    OUT must hold this run or none: a run folder trained with another config is refused (the
    differences are listed) unless --restart. Rerunning a finished run trains nothing.
    """
    from pipelines.runner import parse_settings
    from train.engine.config import load_run_config
    from train.engine.trainer import Trainer

    if resume and restart:
        raise click.UsageError("--resume continues the run in the out folder and --restart discards it: pass one")
    options = {"out": out, "device": device, "damaged_records": "skip" if skip_damaged else None}
    given = {name: value for name, value in options.items() if value is not None}
    run = load_run_config(config, {**parse_settings(settings), **given})
    Trainer(run, log=click.echo).fit(resume=resume, restart=restart)


COMMANDS = [train_command]
