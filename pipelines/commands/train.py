"""`vlbert train RUN.yaml`: one training run (stages) from a FeatureStore."""

from pathlib import Path

import click
import yaml

from train.engine.config import RunConfig
from train.engine.trainer import Trainer


@click.command("train")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--resume", is_flag=True, help="Continue the run in its `out` folder from its latest checkpoint.")
@click.option("--out", type=click.Path(file_okay=False), help="Override the config's `out` folder.")
@click.option("--device", help="Override the config's device (cpu, cuda, cuda:N).")
def train_command(config: Path, resume: bool, out: str | None, device: str | None) -> None:
    """Train the stages of CONFIG (RunConfig fields in YAML); under torchrun, with DDP.

    Each stage ends with its task's metric on the evaluation split, printed and kept in
    OUT/stages/<i>-<name>/eval.json; metrics.jsonl and tensorboard/ hold the training curves.
    """
    values = yaml.safe_load(config.read_text()) or {}
    values.update({k: v for k, v in (("out", out), ("device", device)) if v})
    try:
        run = RunConfig.from_dict(values)
    except (TypeError, ValueError) as exc:
        raise click.ClickException(f"{config}: {exc}") from None
    try:
        Trainer(run, log=click.echo).fit(resume=resume)
    except FileExistsError as exc:
        raise click.ClickException(str(exc)) from None


COMMANDS = [train_command]
