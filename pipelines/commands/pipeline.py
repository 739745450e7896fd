"""`vlbert pipeline run FILE`: chained steps that skip what is up to date and resume what was cut off."""

from pathlib import Path

import click


@click.group("pipeline")
def pipeline_group() -> None:
    """Run pipeline files (YAML): world or data → extract → pre-train → fine-tune → report."""


@pipeline_group.command("run")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
              help="An input the file declares, or STEP.FIELD / STEP.STAGE.FIELD (repeatable); VALUE is read "
                   "as YAML, null is none. out=DIR is --out.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Output folder (default: the file's `out`).")
def run_command(file: Path, settings: tuple[str, ...], out: Path | None) -> None:
    """Run FILE's steps in order, each into its own folder under the output folder.

    FILE's `inputs:` are what you give with --set NAME=VALUE (dataset root, images root,
    detector weights, BERT or converted VL-BERT checkpoint, ...): an input whose default is
    null must be given, as a value or as null (none: e.g. no checkpoint to start from). Steps
    use them as ${inputs.NAME}, an earlier step's folder as ${STEP} and FILE's folder as ${here}.

    --set STEP.FIELD=VALUE changes any field of a step (--set finetune.max_length=64,
    --set finetune.model=base), STEP.STAGE.FIELD a field of a train step's stage named STAGE
    (--set finetune.vqa.steps=100, --set finetune.vqa.base_lr=1e-5), STEP.FIELD.KEY one key of
    a mapping field (--set cache.overrides.score_thresh=0.5).

    Everything is checked before any step runs, and every problem is named together: unknown
    --set names, inputs without a value, unknown keys and wrong types, input paths that do not
    exist, a device this machine lacks, an unknown detector, a starting checkpoint whose
    vocabulary or feature size differs from the tokenizer's or the store's. A step that fails
    ends the command with one line naming it. Rerunning skips done steps, resumes an
    interrupted one and redoes steps whose parameters (--set values included) or inputs changed.
    """
    from pipelines.runner import parse_setting, run_pipeline

    root = run_pipeline(file, out, log=click.echo, settings=dict(parse_setting(text) for text in settings))
    click.echo(f"pipeline outputs: {root.resolve()}")


COMMANDS = [pipeline_group]
