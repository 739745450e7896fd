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
- Bounds, checked before anything is submitted: every setting is one submitit takes, and what each
  step's job asks for (nodes, tasks and GPUs per node, CPUs per task) fits the partition's nodes as
  `sinfo` lists them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from extract.progress import PROGRESS_VARIABLE
from pipelines.execution import STATE_FOLDER, Step, StepSpec, run_spec, state
from pipelines.executors.base import (
    LIVE, Executor, Launch, State, StepsFailed, last_error, launched_steps, updating_state,
)
from pipelines.executors.board import StatusBoard
from vlbert.errors import UserError, error_line, exit_status
from vlbert.typed_config import did_you_mean

Log = Callable[[str], None]
NAME = "slurm"  # also its settings' section
SUBMITIT_FOLDER = "slurm"  # under the pipeline's state folder
WAIT_POLL_S = 5.0
# Slurm's states of a job that has not ended, as squeue names them
JOB_STATES = {"PENDING": State.QUEUED, "CONFIGURING": State.QUEUED, "REQUEUED": State.QUEUED,
              "REQUEUE_HOLD": State.QUEUED, "RESIZING": State.RUNNING, "RUNNING": State.RUNNING,
              "COMPLETING": State.RUNNING, "SUSPENDED": State.RUNNING, "STOPPED": State.RUNNING,
              "SIGNALING": State.RUNNING}
# What a job's processes read their attempt from: an array's tasks share its id; a requeued job keeps
# its id, and its restart count makes it a new attempt, which resumes.
JOB_VARIABLES = ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID")


class SlurmError(UserError):
    """Slurm settings that submitit refuses, or a Slurm command that fails."""


class SlurmExecutor(Executor):
    name = NAME
    section = NAME

    def problems(self, pipeline, *, wait: bool = False, status_stream: TextIO | None = None) -> list[str]:
        return _unknown_settings(pipeline) or _unfit_jobs(pipeline)

    def run(self, pipeline, log: Log, *, wait: bool = False, status_stream: TextIO | None = None) -> None:
        """Submits every step that is not done and not queued or running already; with `wait`, waits
        for them (a line per running step on `status_stream`, a terminal) and raises StepsFailed naming
        every step that failed."""
        import submitit

        live = _live_jobs()
        previous = launched_steps(pipeline.out, NAME)
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
        with updating_state(pipeline.out) as records:
            records.clear()
            records.update(executor=NAME, steps={name: {"jobs": ids} for name, ids in jobs_of.items()})
        if wait and jobs_of:
            _wait(self, pipeline, set(jobs_of), StatusBoard(log, status_stream))

    def launches(self, pipeline) -> tuple[dict[str, Launch], bool]:
        live = _live_jobs()
        recorded = launched_steps(pipeline.out, NAME)
        launches = {}
        for step in pipeline.steps:
            jobs = recorded.get(step.name, {}).get("jobs", [])
            if not jobs:
                continue
            states = [job_state for job in jobs for job_state in live.get(_job_base(job), [])]
            named = ", ".join(jobs)
            attempts = tuple(f"{variable}={_job_base(job)}." for job in jobs for variable in JOB_VARIABLES)
            if any(JOB_STATES.get(job_state) is State.RUNNING for job_state, _ in states):
                launches[step.name] = Launch(State.RUNNING, named, attempts=attempts)
            elif any(job_state in JOB_STATES for job_state, _ in states):
                reason = next(reason for job_state, reason in states if job_state in JOB_STATES)
                detail = "a step it reads failed" if reason == "DependencyNeverSatisfied" else reason
                launches[step.name] = Launch(State.QUEUED, named, detail, attempts)
            elif step.log_file.is_file():
                launches[step.name] = Launch(State.FAILED, named, last_error(step.log_file), attempts)
            else:
                launches[step.name] = Launch(State.CANCELLED, named, "its job ended before it ran", attempts)
        return launches, any(launch.state in LIVE for launch in launches.values())

    def cancel(self, pipeline, log: Log) -> None:
        """scancel for every job of a step not done."""
        recorded = launched_steps(pipeline.out, NAME)
        jobs = [job for step in pipeline.steps if state(step) != "done"
                for job in recorded.get(step.name, {}).get("jobs", [])]
        if not jobs:
            log(f"{pipeline.out}: no job to cancel")
            return
        _slurm_command(["scancel", *jobs])
        log(f"cancelled job(s) {', '.join(jobs)}")

    def attempt(self) -> str | None:
        variable = next((name for name in JOB_VARIABLES if os.environ.get(name)), None)
        if variable is None:
            return None
        return f"{variable}={os.environ[variable]}.{os.environ.get('SLURM_RESTART_COUNT', 0)}"


def _submit(submitit, pipeline, step: Step, after: list[str]) -> list[str]:
    folder = pipeline.out / STATE_FOLDER / SUBMITIT_FOLDER
    settings = _settings(pipeline, step, after)
    threads = int(settings.get("cpus_per_task", 1))
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(**settings)
    step.folder.mkdir(parents=True, exist_ok=True)
    if step.layout.shards == 1:
        return [executor.submit(StepJob(StepSpec(step, NAME, threads).write())).job_id]
    shards = executor.map_array(StepJob(StepSpec(step, NAME, threads, "shard").write()), range(step.layout.shards))
    array = shards[0].job_id.split("_")[0]
    closing = submitit.SlurmExecutor(folder=folder)
    closing.update_parameters(**_settings(pipeline, step, [array], closing=True))
    close = closing.submit(StepJob(StepSpec(step, NAME, 1, "close").write()))
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
    own = pipeline.step_executor_settings.get(step.name, {}).get(NAME, {})
    chosen = {**pipeline.executor_settings.get(NAME, {}), **derived, **own}
    if after:  # the user's additional parameters join the dependency's
        chosen["additional_parameters"] = {**derived["additional_parameters"],
                                           **(chosen.get("additional_parameters") or {})}
    if closing:
        chosen.pop("gpus_per_node", None)
    return chosen


def _unknown_settings(pipeline) -> list[str]:
    """A problem for each Slurm setting that submitit's SlurmExecutor does not take."""
    import submitit

    known = submitit.SlurmExecutor._valid_parameters()
    sources = [(NAME, pipeline.executor_settings.get(NAME, {}))] + [
        (f"step {name!r}: {NAME}", sections[NAME]) for name, sections in pipeline.step_executor_settings.items()
        if NAME in sections]
    return [f"{where}.{key}: not a Slurm setting of submitit's SlurmExecutor{did_you_mean(key, known)}"
            for where, section in sources for key in section if key not in known]


def _unfit_jobs(pipeline) -> list[str]:
    """A problem for each step whose job asks for more than a node of its partition has (or for more
    nodes than the partition has), as sinfo lists them."""
    partitions = _partitions()
    default = next((name for name, partition in partitions.items() if partition.default), None)
    problems = []
    for step in pipeline.steps:
        settings = _settings(pipeline, step, [])
        name = settings.get("partition") or default
        if name not in partitions:
            problems.append(f"step {step.name!r}: partition {name!r}: not one that sinfo lists "
                            f"({', '.join(partitions) or 'none'})")
            continue
        try:
            nodes, tasks, cpus = (int(settings.get(key) or 1) for key in ("nodes", "ntasks_per_node", "cpus_per_task"))
            gpus = int(settings.get("gpus_per_node") or 0)
        except (TypeError, ValueError) as exc:
            problems.append(f"step {step.name!r}: {NAME} settings: expected whole numbers of nodes, tasks, CPUs and "
                            f"GPUs ({exc})")
            continue
        most = partitions[name]
        asked = [(nodes, most.nodes, f"nodes {nodes}", "nodes"),
                 (tasks * cpus, most.cpus, f"{tasks} task(s) × cpus_per_task {cpus}", "CPUs a node"),
                 (gpus, most.gpus, f"gpus_per_node {gpus}", "GPUs a node")]
        problems += [f"step {step.name!r}: {what}: partition {name!r} has at most {limit} {unit}"
                     for count, limit, what, unit in asked if count > limit]
    return problems


@dataclass
class Partition:
    """What sinfo says of a partition: whether it is the default, its nodes, the most CPUs and GPUs one has."""

    default: bool = False
    nodes: int = 0
    cpus: int = 0
    gpus: int = 0


def _partitions() -> dict[str, Partition]:
    lines = _slurm_command(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%G"]).splitlines()
    partitions: dict[str, Partition] = {}
    for line in lines:
        _, name, cpus, gres = line.split("|")
        partition = partitions.setdefault(name.rstrip("*"), Partition())
        partition.default = partition.default or name.endswith("*")
        partition.nodes += 1
        partition.cpus = max(partition.cpus, int(cpus))
        partition.gpus = max(partition.gpus, _gpus(gres))
    return partitions


def _gpus(gres: str) -> int:
    """The GPUs of a node's generic resources as sinfo writes them: `gpu:2`, `gpu:a100:8(S:0-1)`, `(null)`."""
    return sum(int(count) for count in re.findall(r"\bgpu(?::[^:,(]+)?:(\d+)", gres))


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
                run_spec(spec, shard, log=lambda message: print(message, flush=True), attempt=EXECUTOR.attempt())
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
    live: dict[str, list[tuple[str, str]]] = {}
    for line in _slurm_command(["squeue", "-h", "-r", "-o", "%i|%T|%r"]).splitlines():
        job, _, rest = line.partition("|")
        job_state, _, reason = rest.partition("|")
        live.setdefault(_job_base(job.strip()), []).append((job_state.strip(), reason.strip()))
    return live


def _slurm_command(command: list[str]) -> str:
    """The output of a Slurm command; SlurmError naming it when it cannot run or fails."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{command[0]}: cannot ask Slurm ({exc})") from None
    if result.returncode != 0:
        raise SlurmError(f"{command[0]}: {result.stderr.strip() or f'exit status {result.returncode}'}")
    return result.stdout


def _job_base(job: str) -> str:
    return job.split("_")[0]


def _wait(executor: SlurmExecutor, pipeline, submitted: set[str], board: StatusBoard) -> None:
    """Polls until no submitted step is queued or running, saying each change (and, on a terminal, each
    running step's progress); StepsFailed names every step that did not end done."""
    said: dict[str, State] = {}
    while True:
        rows = [row for row in executor.status(pipeline) if row.step in submitted]
        for row in rows:
            if said.get(row.step) != row.state:
                said[row.step] = row.state
                board.event(f"[{row.step}] {row.state}" + (f": {row.detail}" if row.detail and row.state not in LIVE
                                                           else ""))
        if all(row.state not in LIVE for row in rows):
            break
        board.refresh([f"{row.step}: {row.detail or 'starting'}" for row in rows if row.state is State.RUNNING])
        time.sleep(WAIT_POLL_S)
    failed = [row for row in rows if row.state not in (State.DONE, State.NOT_RUN)]
    unrun = [row for row in rows if row.state is State.NOT_RUN]
    if failed:
        raise StepsFailed(f"pipeline {pipeline.path}: {len(failed)} step(s) failed"
                          + (f", {len(unrun)} not run" if unrun else "") + "\n"
                          + "\n".join(f"  {row.step}: {row.detail} (log: {row.log})" for row in failed)
                          + "".join(f"\n  {row.step}: not run, {row.detail}" for row in unrun))


EXECUTOR = SlurmExecutor()
