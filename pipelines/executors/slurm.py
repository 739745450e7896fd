"""The Slurm executor: each step a job submitted through submitit, starting after the jobs of the steps
it reads (`afterok`; a job whose input failed is cancelled by Slurm, kill-on-invalid-dep).

- A step's job runs `pipelines.execution.run_spec` on a spec file under `<out>/.pipeline/specs/`, its
  output appended to `<step>/log.txt` (submitit's own logs: `<out>/.pipeline/slurm/`).
- An extract step with `shards: n` is a job array of n tasks (task i extracts `shard=(i, n)`),
  followed by a small job that checks the shards and marks the step done.
- A train step with `devices: k` and `nodes: m` is one job of m nodes × k tasks, the DDP ranks
  (rank, local rank and world size from Slurm's variables, rendezvous on the first node); a GPU step
  asks for a GPU per task.
- Preemption and time limits: Slurm signals the job (`--signal`, submitit's USR2) before it stops
  it; a training step writes a checkpoint at its next step and the job requeues itself through
  submitit's checkpointing, so it resumes where it stopped. Other steps requeue at once (they
  resume from what they committed).
- Settings: the pipeline's `slurm:` section and `--set slurm.KEY=VALUE`, then a step's own `slurm:`,
  are passed to submitit's SlurmExecutor (partition, account, time (minutes), cpus_per_task,
  mem, qos, constraint, signal_delay_s, setup, additional_parameters, ...). What a step's layout
  decides (nodes, tasks per node, GPUs per node, the dependency) is set by this executor, and a
  step's own section may still change it. cpus_per_task is also each process's thread count.
- A rerun submits only what is not done and not already queued or running (it depends on those).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from extract.progress import PROGRESS_VARIABLE, progress_summary
from pipelines.execution import LOG_FILE, STATE_FOLDER, Step, StepSpec, run_spec, state
from pipelines.executors import StepsFailed, StepStatus, last_error, read_state, settled, updating_state
from vlbert.errors import UserError, error_line, exit_status
from vlbert.typed_config import did_you_mean

Log = Callable[[str], None]
SUBMITIT_FOLDER = "slurm"  # under the pipeline's state folder
WAIT_POLL_S = 5.0
# Slurm's states of a job that has not ended, as squeue names them
LIVE = {"PENDING": "queued", "CONFIGURING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued",
        "RESIZING": "running", "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "running",
        "STOPPED": "running", "SIGNALING": "running"}
# A step in one of these states will not be done by its jobs, and what that is called for a step reading it
ENDED_UNDONE = {"failed": "failed", "cancelled": "was cancelled", "not run": "did not run"}


class SlurmError(UserError):
    """Slurm settings that submitit refuses, or a Slurm command that fails."""


def run(pipeline, log: Log, jobs: int | None = None, wait: bool = False) -> None:
    """Submits every step that is not done and not queued or running already; with `wait`, waits for
    them and raises StepsFailed naming every step that failed."""
    import submitit

    _check_settings(pipeline)
    live = _live_jobs()
    recorded = read_state(pipeline.out)
    previous = recorded.get("steps", {}) if recorded.get("executor") == "slurm" else {}
    jobs_of: dict[str, list[str]] = {}  # step → the jobs that complete it (the last one ends it)
    will_run: set[str] = set()
    for step in pipeline.steps:
        if not will_run.intersection(step.reads) and state(step) == "done":
            log(f"[{step.name}] up to date")
            continue
        will_run.add(step.name)
        queued = previous.get(step.name, {}).get("jobs", [])
        if queued and any(_job_base(job) in live for job in queued):
            log(f"[{step.name}] already queued or running: job {', '.join(queued)}")
            jobs_of[step.name] = queued
            continue
        after = [jobs_of[name][-1] for name in step.reads if name in jobs_of]
        jobs_of[step.name] = _submit(submitit, pipeline, step, after)
        log(f"[{step.name}] submitted: job {', '.join(jobs_of[step.name])}"
            + (f" (after {', '.join(after)})" if after else "") + f"; log {step.log_file}")
    folders = {step.name: step.folder for step in pipeline.steps}
    with updating_state(pipeline.out) as records:
        records.clear()
        records.update(executor="slurm", steps={name: {"jobs": ids, "log": str(folders[name] / LOG_FILE)}
                                                for name, ids in jobs_of.items()})
    if wait and jobs_of:
        _wait(pipeline, set(jobs_of), log)


def _submit(submitit, pipeline, step: Step, after: list[str]) -> list[str]:
    folder = pipeline.out / STATE_FOLDER / SUBMITIT_FOLDER
    settings = _settings(pipeline, step, after)
    threads = int(settings.get("cpus_per_task", 1))
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(**settings)
    step.folder.mkdir(parents=True, exist_ok=True)
    if step.layout.shards == 1:
        return [executor.submit(StepJob(StepSpec(step, threads, executor="slurm").write())).job_id]
    shards = executor.map_array(StepJob(StepSpec(step, threads, "shard", "slurm").write()), range(step.layout.shards))
    array = shards[0].job_id.split("_")[0]
    closing = submitit.SlurmExecutor(folder=folder)
    closing.update_parameters(**{**_settings(pipeline, step, [array], closing=True)})
    close = closing.submit(StepJob(StepSpec(step, 1, "close", "slurm").write()))
    return [array, close.job_id]


def _settings(pipeline, step: Step, after: list[str], closing: bool = False) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for the step's job (its closing job: one small task)."""
    layout = step.layout
    derived: dict[str, Any] = {"job_name": f"{pipeline.path.stem}.{step.name}", "nodes": 1, "ntasks_per_node": 1}
    if not closing:
        derived.update(nodes=layout.nodes, ntasks_per_node=layout.ranks)
        if layout.gpu:
            derived["gpus_per_node"] = layout.ranks
    if after:
        derived["dependency"] = "afterok:" + ":".join(after)
        derived["additional_parameters"] = {"kill-on-invalid-dep": "yes"}
    chosen = {**pipeline.slurm, **derived, **pipeline.step_slurm.get(step.name, {})}
    if after:  # the user's additional parameters join the dependency's
        chosen["additional_parameters"] = {**derived["additional_parameters"],
                                           **(chosen.get("additional_parameters") or {})}
    if closing:
        chosen.pop("gpus_per_node", None)
    return chosen


def _check_settings(pipeline) -> None:
    """Every Slurm setting is one that submitit's SlurmExecutor takes, before anything is submitted."""
    import submitit

    known = submitit.SlurmExecutor._valid_parameters()
    sources = [("slurm", pipeline.slurm)] + [(f"step {name!r}: slurm", section)
                                             for name, section in pipeline.step_slurm.items()]
    problems = [f"{where}.{key}: not a Slurm setting of submitit's SlurmExecutor{did_you_mean(key, known)}"
                for where, section in sources for key in section if key not in known]
    if problems:
        raise SlurmError(f"{pipeline.path}: " + "; ".join(problems))


class StepJob:
    """A step's job: what submitit pickles and runs on the cluster. Requeued through submitit's
    checkpointing when Slurm warns of preemption or the time limit (`checkpoint`)."""

    def __init__(self, spec: Path) -> None:
        self.spec = spec

    def __call__(self, shard: int | None = None) -> None:
        import submitit

        spec = StepSpec.from_file(self.spec)
        os.environ["OMP_NUM_THREADS"] = str(spec.threads)
        os.environ[PROGRESS_VARIABLE] = str(spec.step.progress_file(shard))
        if spec.step.layout.ranks * spec.step.layout.nodes > 1 and spec.part != "close":
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        requeue = signal.getsignal(signal.SIGUSR2)  # submitit's: checkpoint() below, then requeue
        with _appended_to(spec.step.log_file):
            try:
                run_spec(spec, shard, log=lambda message: print(message, flush=True))
            except _interruption() as stopped:
                print(stopped, flush=True)
                if stopped.signum == signal.SIGUSR2 and callable(requeue):
                    requeue(stopped.signum, None)  # submitit requeues the job, which resumes
                raise
            except Exception as exc:  # noqa: BLE001 - said in the step's log as the command says it, then raised
                if exit_status(exc) is None:
                    traceback.print_exc()
                print(f"Error: {error_line(exc)}", file=sys.stderr, flush=True)
                raise

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Called by submitit when the job is to be requeued: the same call again, which resumes."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _interruption() -> type[BaseException]:
    from train.engine.stopping import TrainingInterrupted

    return TrainingInterrupted


class _appended_to:
    """stdout and stderr (the file descriptors, so that child processes' output goes too) appended
    to `path` while the block runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
        os.close(descriptor)

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, saved in zip((1, 2), self.saved):
            os.dup2(saved, target)
            os.close(saved)


# ---- Slurm's view --------------------------------------------------------------------------------

def _live_jobs() -> dict[str, list[tuple[str, str]]]:
    """Every job squeue lists, by base id (an array's tasks under the array's id): [(state, reason)]."""
    try:
        result = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T|%r"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"squeue: cannot ask Slurm for its jobs ({exc})") from None
    if result.returncode != 0:
        raise SlurmError(f"squeue: {result.stderr.strip() or f'exit status {result.returncode}'}")
    live: dict[str, list[tuple[str, str]]] = {}
    for line in result.stdout.splitlines():
        job, _, rest = line.partition("|")
        job_state, _, reason = rest.partition("|")
        live.setdefault(_job_base(job.strip()), []).append((job_state.strip(), reason.strip()))
    return live


def _job_base(job: str) -> str:
    return job.split("_")[0]


def status(pipeline) -> list[StepStatus]:
    recorded = read_state(pipeline.out).get("steps", {})
    live = _live_jobs()
    rows: dict[str, StepStatus] = {}
    for step in pipeline.steps:
        done = settled(step)
        jobs = recorded.get(step.name, {}).get("jobs", [])
        named = ", ".join(jobs)
        states = [entry for job in jobs for entry in live.get(_job_base(job), [])]
        unrun = next((name for name in step.reads if rows[name].state in ENDED_UNDONE), None)
        if done is not None:
            rows[step.name] = StepStatus(step.name, "done", named, str(step.log_file))
        elif any(LIVE.get(job_state) == "running" for job_state, _ in states):
            progress = progress_summary(sorted(step.folder.glob(".progress*.json")))
            rows[step.name] = StepStatus(step.name, "running", named, str(step.log_file), progress)
        elif any(job_state in LIVE for job_state, _ in states):
            reason = next(reason for job_state, reason in states if job_state in LIVE)
            detail = "a step it reads failed" if reason == "DependencyNeverSatisfied" else reason
            rows[step.name] = StepStatus(step.name, "queued", named, str(step.log_file), detail)
        elif jobs and unrun is not None:
            rows[step.name] = StepStatus(step.name, "not run", named,
                                         detail=f"it reads {unrun}, which {ENDED_UNDONE[rows[unrun].state]}")
        elif jobs and step.log_file.is_file():
            rows[step.name] = StepStatus(step.name, "failed", named, str(step.log_file), last_error(step.log_file))
        elif jobs:
            rows[step.name] = StepStatus(step.name, "cancelled", named, detail="its job ended before it ran")
        else:
            rows[step.name] = StepStatus(step.name, "not started")
    return list(rows.values())


def cancel(pipeline, log: Log) -> None:
    """scancel for every job of a step not done."""
    recorded = read_state(pipeline.out).get("steps", {})
    jobs = [job for step in pipeline.steps if state(step) != "done"
            for job in recorded.get(step.name, {}).get("jobs", [])]
    if not jobs:
        log(f"{pipeline.out}: no job to cancel")
        return
    result = subprocess.run(["scancel", *jobs], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SlurmError(f"scancel {' '.join(jobs)}: {result.stderr.strip()}")
    log(f"cancelled job(s) {', '.join(jobs)}")


def _wait(pipeline, submitted: set[str], log: Log) -> None:
    """Polls until every submitted step is done or failed, saying each change."""
    said: dict[str, str] = {}
    while True:
        rows = [row for row in status(pipeline) if row.step in submitted]
        for row in rows:
            if said.get(row.step) != row.state:
                said[row.step] = row.state
                log(f"[{row.step}] {row.state}" + (f": {row.detail}" if row.detail and row.state == "failed" else ""))
        if all(row.state in ("done", *ENDED_UNDONE) for row in rows):
            break
        time.sleep(WAIT_POLL_S)
    failed = [row for row in rows if row.state in ("failed", "cancelled")]
    unrun = [row for row in rows if row.state == "not run"]
    if failed:
        raise StepsFailed(f"pipeline {pipeline.path}: {len(failed)} step(s) failed"
                          + (f", {len(unrun)} not run" if unrun else "") + "\n"
                          + "\n".join(f"  {row.step}: {row.detail} (log: {row.log})" for row in failed)
                          + "".join(f"\n  {row.step}: not run, {row.detail}" for row in unrun))
