"""The Slurm executor: each step a job submitted through submitit, starting after the jobs of the steps
it reads (`afterok`; a job whose input failed is cancelled by Slurm, kill-on-invalid-dep).

- A step's job runs `pipelines.execution.run_spec` on a spec file under `<out>/.pipeline/specs/`, its
  output appended to `<step>/log.txt` (submitit's own logs: `<out>/.pipeline/slurm/`).
- An extract step with `shards: n` is a job array of n tasks (task i extracts `shard=(i, n)`),
  followed by a small job that checks the shards and marks the step done.
- A train step with `devices: k` and `nodes: m` is one job of m nodes × k tasks, the DDP ranks
  (rank, local rank and world size from Slurm's variables); they meet at the address Slurm has for
  rank 0's node, the job's first, on a port rank 0 is given by the system and says in a file of the
  pipeline's state folder (train.engine.distributed.rendezvous). A GPU step asks for a GPU per task.
  srun ends the other ranks as soon as one dies (--kill-on-bad-exit), and status names the rank and
  node that srun saw end first.
- Each task says in the step's log where it runs (its rank or shard, Slurm node, host and attempt).
- Preemption and time limits: Slurm signals the job (`--signal`, submitit's USR2) before it stops
  it; a training step writes a checkpoint at its next step and the job requeues itself through
  submitit's checkpointing, so it resumes where it stopped (rank 0 writes and requeues; the other
  ranks of a DDP job end cleanly, lest srun end rank 0 mid-write). Other steps requeue at once (they
  resume from what they committed). Every job is submitted with --requeue: Slurm requeues it when
  one of its nodes fails, and status says so while it waits ("requeued after a node failure (n2),
  attempt 2"), from what srun wrote in the job's own log.
- Settings: the pipeline's `slurm:` section and `--set slurm.KEY=VALUE`, then a step's own `slurm:`,
  are passed to submitit's SlurmExecutor (partition, account, time (minutes), cpus_per_task,
  mem, qos, constraint, signal_delay_s, setup, additional_parameters, ...). What a step's layout
  decides (nodes, tasks per node, GPUs per node, the dependency) is set by this executor, and a
  step's own section may still change it. cpus_per_task is also each process's thread count, which
  `--threads N` sets for every step (as the local executor gives every step N threads).
- A rerun submits only what is not done and not already queued or running (it depends on those).
- Bounds, checked before anything is submitted: every setting is one submitit takes, and what each
  step's job asks for (nodes, tasks and GPUs per node, CPUs per task) fits the partition's nodes as
  `sinfo` lists them.
"""

from __future__ import annotations

import os
import re
import reprlib
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from pipelines.execution import STATE_FOLDER, Step, StepSpec, run_spec, state
from pipelines.executors.base import (
    LIVE, Executor, Launch, State, StepsFailed, damaged_state, last_error, launched_steps, record_run,
)
from pipelines.executors.board import StatusBoard
from pipelines.executors.environment import slurm_variables
from pipelines.executors.processes import append_output_to
from pipelines.executors.records import LaunchRecord, RunRecord
from pipelines.executors.shard_limits import array_tasks, too_many_shards
from vlbert.utils.atomic import made_folder
from vlbert.utils.errors import UserError, error_line, exit_status
from vlbert.utils.typed_config import did_you_mean

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
JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,12})?")  # a job's, or an array task's
# The jobs' interpreter: -P keeps the folder a job starts in (where `run` was given, by default) off its
# import path, so that a train.py there does not stand in for the project's `train`.
PYTHON = f"{shlex.quote(sys.executable)} -P"
NODE_VARIABLE = "SLURMD_NODENAME"
RENDEZVOUS_FOLDER = "rendezvous"  # under the pipeline's state folder: where a DDP job's ranks meet
# What a job's task writes into the job's own log (submitit's, which srun also writes into) when it
# starts: what srun and Slurm write after the last of these lines is of the latest attempt.
ATTEMPT_MARKER = "vlbert: starting"
# srun's line for a task that ended badly: "srun: error: n2: task 1: Killed", "... tasks 0-1: ..."
ENDED_TASK = re.compile(r"srun: error: (\S+): tasks? (\S+): (.+)")
EXIT_CODE = "Exited with exit code"  # a task that ended on its own: its error line says more
NODE_FAILURE = re.compile(r"Node failure on (\S+)")  # srun's line when Slurm finds a node of the job lost


class SlurmError(UserError):
    """Slurm settings that submitit refuses, or a Slurm command that fails."""


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm executor's run options (`--wait`, `--threads`; `--set slurm.OPTION=VALUE`, beside its settings)."""

    wait: bool = field(default=False, metadata={"help": "wait for the jobs and report their end; false: submit "
                                                        "and return"})
    threads: int | None = field(default=None, metadata={"help": "each process's CPUs and threads, cpus_per_task "
                                                                "of every step"})


class SlurmExecutor(Executor):
    name = NAME
    section = NAME
    options = SlurmOptions
    waits = False
    instead = {"jobs": "Slurm decides how many jobs run at once; slurm.array_parallelism bounds an extraction's "
                       "shards"}

    def problems(self, pipeline, options: SlurmOptions) -> list[str]:
        threads = options.threads
        return (_unknown_settings(pipeline) or _threads_given_twice(pipeline, threads) or _unfit_jobs(pipeline, threads)
                or too_many_shards(pipeline, *array_tasks(_slurm_command(["scontrol", "show", "config"]))))

    def run(self, pipeline, log: Log, options: SlurmOptions, status_stream: TextIO | None = None) -> None:
        """Submits every step that is not done and not queued or running already, each of its processes
        with `options.threads` CPUs and threads (cpus_per_task) where given; with `options.wait`, waits for
        them (a line per running step on `status_stream`, a terminal) and raises StepsFailed naming every
        step that failed."""
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
            queued = previous.get(step.name, LaunchRecord()).jobs
            if queued and any(_job_base(job) in live for job in queued):
                log(f"[{step.name}] already queued or running: job {', '.join(queued)}")
                jobs_of[step.name] = queued
                continue
            after = [jobs_of[name][-1] for name in step.reads if name in jobs_of]
            jobs_of[step.name] = _submit(submitit, pipeline, step, after, options.threads)
            log(f"[{step.name}] submitted: job {', '.join(jobs_of[step.name])}"
                + (f" (after {', '.join(after)})" if after else "") + f"; log {step.log_file}")
        record_run(pipeline.out, lambda _: RunRecord(NAME, steps={name: LaunchRecord(jobs=ids)
                                                                  for name, ids in jobs_of.items()}))
        if options.wait and jobs_of:
            _wait(self, pipeline, set(jobs_of), StatusBoard(log, status_stream))

    def launches(self, pipeline) -> tuple[dict[str, Launch], bool]:
        live = _live_jobs()
        recorded = launched_steps(pipeline.out, NAME)
        launches = {}
        for step in pipeline.steps:
            jobs = recorded.get(step.name, LaunchRecord()).jobs
            if not jobs:
                continue
            listed = [entry for job in jobs for entry in live.get(_job_base(job), [])]
            waiting = next((entry for entry in listed if JOB_STATES.get(entry.state) is State.QUEUED), None)
            named = ", ".join(jobs)
            attempts = tuple(f"{variable}={_job_base(job)}." for job in jobs for variable in JOB_VARIABLES)
            running = next((entry for entry in listed if JOB_STATES.get(entry.state) is State.RUNNING), None)
            if running is not None:  # its attempt's log is the latest: the cause is in the one before
                launches[step.name] = Launch(State.RUNNING, named, _requeued(pipeline, running, back=1), attempts)
            elif waiting is not None:
                launches[step.name] = Launch(State.QUEUED, named, _why_queued(pipeline, waiting), attempts)
            elif step.log_file.is_file():
                launches[step.name] = Launch(State.FAILED, named, _why_failed(pipeline, step, jobs[-1]), attempts)
            else:
                launches[step.name] = Launch(State.CANCELLED, named, "its job ended before it ran", attempts)
        return launches, any(launch.state in LIVE for launch in launches.values())

    def cancel(self, pipeline, log: Log) -> None:
        """scancel for every job of a step not done."""
        recorded = launched_steps(pipeline.out, NAME)
        jobs = [job for step in pipeline.steps if state(step) != "done"
                for job in _recorded_jobs(pipeline.out, step.name, recorded.get(step.name, LaunchRecord()))]
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


def _recorded_jobs(out: Path, step: str, launch: LaunchRecord) -> list[str]:
    """The job ids the state file records for a step; one that is not a job's id (`-u`, a number, a string
    for the list) is StateUnreadable naming the file: scancel would read it as an option or other jobs."""
    jobs = launch.jobs
    wrong = [f"{reprlib.repr(jobs)} is not a list of job ids"] if not isinstance(jobs, list) else [
        f"job id {reprlib.repr(job)} is not a Slurm job's" for job in jobs
        if not (isinstance(job, str) and JOB_ID.fullmatch(job))]
    if wrong:
        raise damaged_state(out, f"step {step!r}: {wrong[0]}", ": nothing was cancelled")
    return jobs


def _submit(submitit, pipeline, step: Step, after: list[str], threads: int | None) -> list[str]:
    folder = _submitit_folder(pipeline)
    settings = _settings(pipeline, step, after, threads=threads)
    threads = int(settings.get("cpus_per_task", 1))
    executor = submitit.SlurmExecutor(folder=folder, python=PYTHON)
    executor.update_parameters(**settings)
    step.folder.mkdir(parents=True, exist_ok=True)
    if step.layout.shards == 1:
        return [executor.submit(StepJob(StepSpec(step, NAME, threads).write())).job_id]
    shards = executor.map_array(StepJob(StepSpec(step, NAME, threads, "shard").write()), range(step.layout.shards))
    array = shards[0].job_id.split("_")[0]
    closing = submitit.SlurmExecutor(folder=folder, python=PYTHON)
    closing.update_parameters(**_settings(pipeline, step, [array], closing=True))
    close = closing.submit(StepJob(StepSpec(step, NAME, 1, "close").write()))
    return [array, close.job_id]


def _settings(pipeline, step: Step, after: list[str], closing: bool = False,
              threads: int | None = None) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters for the step's job (its closing job: one small task), each
    process with `threads` CPUs where given."""
    layout = step.layout
    # --requeue: when a node of the job fails, Slurm requeues it (it resumes) rather than ending it
    additional: dict[str, Any] = {"requeue": True, **({"kill-on-invalid-dep": "yes"} if after else {})}
    derived: dict[str, Any] = {"job_name": f"{pipeline.path.stem}.{step.name}", "nodes": 1, "ntasks_per_node": 1}
    srun_args = []
    if not closing:
        derived.update(nodes=layout.nodes, ntasks_per_node=layout.ranks)
        if layout.gpu:
            derived["gpus_per_node"] = layout.ranks
        if _distributed(step):  # a rank that dies ends the others now, not at a collective's timeout
            srun_args.append("--kill-on-bad-exit=1")
        if threads is not None:
            derived["cpus_per_task"] = threads
    if after:
        derived["dependency"] = "afterok:" + ":".join(after)
    section = pipeline.executor_settings.get(NAME, {})
    own = pipeline.step_executor_settings.get(step.name, {}).get(NAME, {})
    chosen = {**section, **derived, **own}
    # the user's additional parameters and srun arguments join the executor's
    chosen["additional_parameters"] = {**additional, **(section.get("additional_parameters") or {}),
                                       **(own.get("additional_parameters") or {})}
    if srun_args or chosen.get("srun_args"):
        chosen["srun_args"] = [*srun_args, *(chosen.get("srun_args") or [])]
    if closing:
        chosen.pop("gpus_per_node", None)
    return chosen


def _threads_given_twice(pipeline, threads: int | None) -> list[str]:
    """A problem for each Slurm setting of cpus_per_task other than `--threads` (the same setting)."""
    if threads is None:
        return []
    return [f"--threads {threads} and {where}.cpus_per_task {section['cpus_per_task']}: on Slurm --threads is "
            "cpus_per_task; give one of them" for where, section in _sections(pipeline)
            if "cpus_per_task" in section and section["cpus_per_task"] != threads]


def _unknown_settings(pipeline) -> list[str]:
    """A problem for each Slurm setting that submitit's SlurmExecutor does not take."""
    import submitit

    known = submitit.SlurmExecutor._valid_parameters()
    return [f"{where}.{key}: not a Slurm setting of submitit's SlurmExecutor{did_you_mean(key, known)}"
            for where, section in _sections(pipeline) for key in section if key not in known]


def _sections(pipeline) -> list[tuple[str, dict[str, Any]]]:
    """The pipeline's Slurm settings, and each step's own, with where they are given."""
    return [(NAME, pipeline.executor_settings.get(NAME, {}))] + [
        (f"step {name!r}: {NAME}", sections[NAME]) for name, sections in pipeline.step_executor_settings.items()
        if NAME in sections]


def _unfit_jobs(pipeline, threads: int | None = None) -> list[str]:
    """A problem for each step whose job asks for more than a node of its partition has (or for more
    nodes than the partition has), as sinfo lists them."""
    partitions = _partitions()
    default = next((name for name, partition in partitions.items() if partition.default), None)
    problems = []
    for step in pipeline.steps:
        settings = _settings(pipeline, step, [], threads=threads)
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
        attempt = EXECUTOR.attempt()
        print(f"{ATTEMPT_MARKER} {attempt}", file=sys.stderr, flush=True)
        distributed = _distributed(spec.step) and spec.part != "close"
        if distributed:
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        os.environ.update(slurm_variables(spec.step, shard, spec.threads,
                                          _rendezvous_file(spec.step) if distributed else None))
        requeue = signal.getsignal(signal.SIGUSR2)  # submitit's: checkpoint() below, then requeue
        with _appended_to(spec.step.log_file):
            print(f"[{spec.step.name}] {_task(spec, shard)} on node {os.environ.get(NODE_VARIABLE)} (host "
                  f"{socket.gethostname()}), job {os.environ.get('SLURM_JOB_ID')}, attempt "
                  f"{int(os.environ.get('SLURM_RESTART_COUNT', 0)) + 1}", flush=True)
            try:
                run_spec(spec, shard, log=lambda message: print(message, flush=True), attempt=attempt)
            except _interruption() as stopped:
                print(stopped, flush=True)
                if _distributed(spec.step) and os.environ.get("RANK") != "0":
                    return  # rank 0 writes the checkpoint and requeues; a bad exit here would make srun end it
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


def _task(spec: StepSpec, shard: int | None) -> str:
    """Which of the step's processes this one is."""
    if spec.part == "close":
        return "the check of its shards"
    if shard is not None:
        return f"shard {shard} of {spec.step.layout.shards}"
    if _distributed(spec.step):
        return f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}"
    return "its process"


def _distributed(step: Step) -> bool:
    """Whether the step's job is a DDP run of several ranks."""
    return step.layout.ranks * step.layout.nodes > 1


def _rendezvous_file(step: Step) -> Path:
    """Where rank 0 of this attempt of the step's job says where its ranks meet (a new file for each
    attempt: a requeued job's ranks never read the last one's)."""
    folder = made_folder(step.state_folder / RENDEZVOUS_FOLDER)
    return folder / f"{step.name}-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_RESTART_COUNT', 0)}.json"


def _interruption() -> type[BaseException]:
    from train.engine.stopping import TrainingInterrupted

    return TrainingInterrupted


class _appended_to:
    """stdout and stderr (the file descriptors, so that child processes' output goes too) appended
    to `path` while the block runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.saved = os.dup(1), os.dup(2)
        append_output_to(self.path)

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, saved in zip((1, 2), self.saved):
            os.dup2(saved, target)
            os.close(saved)


# ---- Slurm's view --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Listed:
    """A job as squeue lists it: its id (an array's task's), state, Slurm's reason for it, and how many
    times Slurm requeued it."""

    job: str
    state: str
    reason: str
    restarts: int


def _live_jobs() -> dict[str, list[Listed]]:
    """Every job squeue lists, by base id (an array's tasks under the array's id)."""
    live: dict[str, list[Listed]] = {}
    listing = _slurm_command(["squeue", "-h", "-r", "-O", "JobArrayID:|,State:|,RestartCnt:|,Reason:|"])
    for line in listing.splitlines():
        job, job_state, restarts, reason, *_ = (field.strip() for field in line.split("|"))
        live.setdefault(_job_base(job), []).append(Listed(job, job_state, reason, int(restarts or 0)))
    return live


def _why_queued(pipeline, waiting: Listed) -> str:
    """What status says of a job that waits: Slurm's reason, and once Slurm requeued it, the attempt it
    is and why (what srun wrote into the job's log before the requeue)."""
    reason = "a step it reads failed" if waiting.reason == "DependencyNeverSatisfied" else waiting.reason
    requeued = _requeued(pipeline, waiting)
    return f"{requeued} ({reason})" if requeued else reason


def _requeued(pipeline, job: Listed, back: int = 0) -> str:
    """Once Slurm requeued `job`, the attempt it is and why (what srun wrote into the log of the attempt
    `back` before the latest, the one requeued); "" for a first attempt."""
    if not job.restarts:
        return ""
    lost = NODE_FAILURE.findall(_last_attempt(pipeline, job.job, back))
    cause = f" after a node failure ({', '.join(dict.fromkeys(lost))})" if lost else ""
    return f"requeued{cause}, attempt {job.restarts + 1}"


def _why_failed(pipeline, step: Step, job: str) -> str:
    """What status says of a step whose job ended undone: the task that srun saw end first by a signal
    (killed, out of memory), with its rank and node; else the step's error line."""
    first = ENDED_TASK.search(_last_attempt(pipeline, job))
    if first is None or first.group(3).startswith(EXIT_CODE):
        return last_error(step.log_file)
    node, tasks, how = first.groups()
    if not _distributed(step):
        return f"its process on node {node}: {how} (srun)"
    return f"rank {tasks} on node {node}: {how} (srun), so Slurm ended the other ranks"


def _last_attempt(pipeline, job: str, back: int = 0) -> str:
    """What the job's own log (submitit's, which srun writes into) holds of the job's latest attempt
    (`back`: of the one that many attempts before it)."""
    try:
        text = (_submitit_folder(pipeline) / f"{job}_0_log.err").read_text(errors="replace")
    except OSError:
        return ""
    attempts = text.split(ATTEMPT_MARKER)
    return attempts[-1 - back] if back < len(attempts) else ""


def _submitit_folder(pipeline) -> Path:
    return pipeline.out / STATE_FOLDER / SUBMITIT_FOLDER


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
