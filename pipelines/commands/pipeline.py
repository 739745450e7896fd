"""`vlbert pipeline run FILE`: chained steps that skip what is up to date and resume what was cut off."""

from pathlib import Path

import click

from pipelines.runner import run_pipeline


@click.group("pipeline")
def pipeline_group() -> None:
    """Run pipeline files (YAML): world or data → extract → pre-train → fine-tune → report."""


@pipeline_group.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Output folder (default: the file's `out`).")
def run_command(file: Path, out: Path | None) -> None:
    """Run FILE's steps in order; rerunning skips done steps and resumes an interrupted one."""
    root = run_pipeline(file, out, log=click.echo)
    click.echo(f"pipeline outputs: {root.resolve()}")


COMMANDS = [pipeline_group]
