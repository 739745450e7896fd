"""`vlbert pipeline run|status|cancel|report FILE`: chained steps that skip what is up to date, resume what
was cut off and run side by side, on this machine or on a Slurm cluster, and the page of a run;
`vlbert pipeline step SPEC` is one step's process, as the executors start it."""

import sys
from pathlib import Path

import click

from pipelines.commands import own_threads
from pipelines.executors import DEFAULT, EXECUTORS


def _pipeline_options(command):
    command = click.option("--out", type=click.Path(file_okay=False, path_type=Path),
                           help="Output folder (default: the file's `out`).")(command)
    command = click.option("--set", "settings", multiple=True, metavar="NAME=VALUE",
                           help="An input the file declares, STEP.FIELD / STEP.STAGE.FIELD / STEP.FIELD+ "
                                "(append), slurm.KEY, or an executor's option EXECUTOR.OPTION (local.jobs=2 is "
                                "--jobs 2) (repeatable); VALUE is read as YAML, null is none. "
                                "out=DIR is --out.")(command)
    return click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))(command)


def _run_of(file: Path, settings: tuple[str, ...], out: Path | None):
    """The pipeline of the run in the output folder, with the settings it recorded and these over them."""
    from pipelines.runner import load_run, parse_settings, with_out

    return load_run(file, with_out(file, out, parse_settings(settings)))


@click.group("pipeline")
def pipeline_group() -> None:
    """Run pipeline files (YAML): world or data → extract → pre-train → fine-tune → report."""


@pipeline_group.command("run")
@_pipeline_options
@click.option("--jobs", type=click.IntRange(min=1),
              help="Steps at once (local executor) [default: as many as the cores and GPUs allow]; 1 runs them "
                   "one after another in this process. Also --set local.jobs=N.")
@click.option("--threads", type=click.IntRange(min=1),
              help="CPU threads of every step's processes [default: the free cores shared among the steps "
                   "starting; on Slurm, slurm.cpus_per_task, which --threads sets]; results are bitwise the "
                   "same for the same count. Also --set local.threads=N (slurm.threads=N).")
@click.option("--executor", type=click.Choice(list(EXECUTORS)), default=DEFAULT, show_default=True,
              help="local: this machine; slurm: a job per step through submitit (settings: slurm.KEY).")
@click.option("--wait", is_flag=True,
              help="slurm: wait for the jobs and report their end [default: submit and return]; the local "
                   "executor always waits. Also --set slurm.wait=true.")
def run_command(file: Path, settings: tuple[str, ...], out: Path | None, jobs: int | None, threads: int | None,
                executor: str, wait: bool) -> None:
    """Run FILE's steps, each into its own folder under the output folder, every step whose inputs
    are done at once (within the machine's cores and GPUs, or as Slurm jobs).

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
    stops the steps that read it; the others run on, and the command ends naming every failed
    step with its log (<out>/<step>/log.txt). Rerunning skips done steps, resumes interrupted
    ones and redoes steps whose parameters (--set values included) or inputs changed. Ctrl-C
    stops every running step (training writes a checkpoint first); a rerun resumes them.
    Clusters: docs/cluster.md.
    """
    from pipelines.runner import parse_settings, run_pipeline

    root = run_pipeline(file, out, log=click.echo, settings=parse_settings(settings),
                        executor=executor, jobs=jobs, threads=threads, wait=wait, status_stream=sys.stdout)
    click.echo(f"pipeline outputs: {root.resolve()}")


@pipeline_group.command("status")
@_pipeline_options
def status_command(file: Path, settings: tuple[str, ...], out: Path | None) -> None:
    """Each step's state (done, running, queued, failed, cancelled, stopped, not run, outdated, waiting,
    not started), its job or process, its log and its progress, from the run of FILE that its output
    folder records: --out (or FILE's `out`) is enough, the --set values that run was given are read
    from there (--set values given here change them)."""
    from pipelines.executors import executor_of

    pipeline = _run_of(file, settings, out)
    rows = executor_of(pipeline.out).status(pipeline)
    width = max(len(row.step) for row in rows)
    for row in rows:
        job = f" [{row.job}]" if row.job else ""
        detail = f": {row.detail}" if row.detail else ""
        log = f" (log: {row.log})" if row.log and row.state != "done" else ""
        click.echo(f"{row.step:<{width}}  {row.state}{job}{detail}{log}")


@pipeline_group.command("cancel")
@_pipeline_options
def cancel_command(file: Path, settings: tuple[str, ...], out: Path | None) -> None:
    """Stop the run of FILE in its output folder (--out is enough, as for status): its queued and running
    Slurm jobs are cancelled, or a local run is asked to stop (its steps resume on a rerun)."""
    from pipelines.executors import executor_of

    pipeline = _run_of(file, settings, out)
    executor_of(pipeline.out).cancel(pipeline, click.echo)


@pipeline_group.command("report")
@_pipeline_options
def report_command(file: Path, settings: tuple[str, ...], out: Path | None) -> None:
    """Write report.html of the run of FILE (into its report step's folder, or its output folder): every
    stage's result with its interval, the comparisons, the loss curves, the timeline of the steps,
    the stores' boxes and the analyses' figures. A run that failed halfway gets its page too: what
    exists is shown, and what is missing is named."""
    from pipelines.steps.report import rebuild_page
    from vlbert.utils.errors import UserError

    pipeline = _run_of(file, settings, out)
    if not pipeline.out.is_dir():
        raise UserError(f"{pipeline.out}: no such folder: {file} has not run into it (give its --out)")
    page, missing = rebuild_page(pipeline)
    for line in missing:
        click.echo(f"missing: {line}")
    click.echo(f"report: {page.resolve()}")


@pipeline_group.command("step", hidden=True)
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--shard", type=click.IntRange(min=0), help="The shard of a sharded step this process extracts.")
@own_threads
def step_command(spec: Path, shard: int | None) -> None:
    """Run one step of a pipeline as its executor wrote it into SPEC (pipelines/execution.py)."""
    from pipelines.execution import StepSpec, run_spec
    from pipelines.executors import executor_named

    loaded = StepSpec.from_file(spec)
    run_spec(loaded, shard, log=click.echo, attempt=executor_named(loaded.executor).attempt())


COMMANDS = [pipeline_group]
