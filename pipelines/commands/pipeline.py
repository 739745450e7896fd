"""`vlbert pipeline run FILE`: chained steps that skip what is up to date and resume what was cut off."""

from pathlib import Path

import click

from pipelines.runner import parse_setting, run_pipeline


@click.group("pipeline")
def pipeline_group() -> None:
    """Run pipeline files (YAML): world or data → extract → pre-train → fine-tune → report."""


@pipeline_group.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="An input the file declares (repeatable); VALUE is read as YAML. out=DIR is --out.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Output folder (default: the file's `out`).")
def run_command(file: Path, settings: tuple[str, ...], out: Path | None) -> None:
    """Run FILE's steps in order, each into its own folder under the output folder.

    FILE's `inputs:` are what you give with --set NAME=VALUE (dataset root, images root,
    detector weights, BERT or converted VL-BERT checkpoint, ...): an input whose default is
    null must be given. Steps use them as ${inputs.NAME}, an earlier step's folder as ${STEP}
    and FILE's folder as ${here}.

    The whole file is checked before any step runs (unknown keys, wrong types, inputs
    without a value); a step that fails ends the command with one line naming it. Rerunning
    skips done steps, resumes an interrupted one and redoes steps whose parameters (--set
    values included) or inputs changed.
    """
    root = run_pipeline(file, out, log=click.echo, settings=dict(parse_setting(text) for text in settings))
    click.echo(f"pipeline outputs: {root.resolve()}")


COMMANDS = [pipeline_group]
