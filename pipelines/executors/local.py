"""The local executor: every step whose inputs are done runs at once, each in processes of its own,
within this machine's cores and GPUs.

- A step runs as `vlbert pipeline step SPEC` (pipelines/execution.py) in a session of its own, its
  output appended to `<step>/log.txt`: forked from a server that has imported torch already when the
  step is heavy (forked.py), started as a command when it is light; a sharded extraction as one such
  process per shard, then its closing check here; a train step with `devices: k` as k DDP processes
  started by torch's own launcher (torch.distributed.run, as `torchrun --standalone`).
- Cores: each process takes at least one; the cores free when steps start are shared between them,
  and that thread count is fixed for the step (a resumed step keeps the one it started with) and
  recorded in its step.json: it decides the step's last bits, whatever runs beside it. `threads`
  fixes it for every step instead.
- GPUs: a step whose device is cuda (or auto) takes one free GPU per process, through
  CUDA_VISIBLE_DEVICES; no two running steps share one. `gpus` gives the list to hand out
  (default: CUDA_VISIBLE_DEVICES, else every GPU torch sees).
- A failed step stops the steps that read it; the others run on, and the end names every failed step
  with its log. SIGINT or SIGTERM stops every running step's whole process group (training writes a
  checkpoint first), and a rerun resumes each.
- `jobs` caps how many launches run at once; `jobs=1` runs the steps one after another in this
  process (a step that needs several processes still gets them), as the runner always did.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from extract.progress import PROGRESS_VARIABLE, progress_summary
from pipelines.execution import (
    ATTEMPT_VARIABLE, Step, StepSpec, new_attempt, recorded, resumed_threads, run_here, run_spec, state,
)
from pipelines.executors import StepsFailed, StepStatus, last_error, read_state, settled, updating_state
from pipelines.executors.forked import ForkedProcess, shut_down, warm_up
from pipelines.steps import KINDS
from vlbert.errors import UserError, error_line, exit_status

Log = Callable[[str], None]
POLL_S = 0.5
STOP_GRACE_S = 120.0  # how long stopped steps may take to write their checkpoints before they are killed
STATUS_EVERY_S = 30.0  # status lines when the output is not a terminal


class Interrupted(UserError):
    """The run was stopped by a signal; every step resumes where it stopped on a rerun."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}: the running steps were stopped and resume "
                         "where they stopped when the pipeline runs again")
        self.exit_status = 128 + signum


@dataclass
class Task:
    """One launch: a step, or one shard of a sharded step."""

    step: Step
    shard: int | None = None

    @property
    def processes(self) -> int:
        return 1 if self.shard is not None else self.step.layout.ranks

    @property
    def name(self) -> str:
        return self.step.name + (f" shard {self.shard}" if self.shard is not None else "")


@dataclass
class Launched:
    task: Task
    process: subprocess.Popen | ForkedProcess
    cores: int
    gpus: list[str]
    threads: int


@dataclass
class Outcome:
    failed: dict[str, str] = field(default_factory=dict)  # step → its error line
    statuses: dict[str, int] = field(default_factory=dict)  # step → the exit status it failed with
    left_out: dict[str, str] = field(default_factory=dict)  # step → the failed step it reads
    causes: dict[str, Exception] = field(default_factory=dict)  # step → its error, when it ran here


def run(pipeline, log: Log, jobs: int | None = None, threads: int | None = None, gpus: list[str] | None = None,
        status_stream: TextIO | None = None) -> None:
    """Runs the pipeline's steps that are not up to date (see the module's docstring)."""
    if jobs is not None and jobs < 1:
        raise UserError(f"jobs {jobs}: expected a positive number of steps at once")
    if threads is not None and threads < 1:
        raise UserError(f"threads {threads}: expected a positive number of threads per process")
    Scheduler(pipeline, log, jobs, threads, visible_gpus() if gpus is None else list(gpus), status_stream).run()


def visible_gpus() -> list[str]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


class Scheduler:
    def __init__(self, pipeline, log: Log, jobs: int | None, threads: int | None, gpus: list[str],
                 status_stream: TextIO | None) -> None:
        self.pipeline, self.jobs, self.threads, self.gpus = pipeline, jobs, threads, gpus
        self.inline = jobs == 1
        self.cores = len(os.sched_getaffinity(0))
        self.board = StatusBoard(log, status_stream)
        self.waiting = list(pipeline.steps)  # not ready yet: an earlier step they read is not done
        self.ready: list[Task] = []
        self.running: list[Launched] = []
        self.tasks_left: dict[str, int] = {}  # step → its launches not ended yet
        self.done: set[str] = set()
        self.outcome = Outcome()
        self.attempts: dict[str, str] = {}
        self.resumed_threads: dict[str, int | None] = {}  # an interrupted step's: it resumes with them
        self.stopping: int | None = None

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        self._check_fits()
        with updating_state(self.pipeline.out) as records:
            other = _running_scheduler(records)
            if other is not None:
                raise UserError(f"{self.pipeline.out}: another run of this pipeline is going on (process {other['pid']} "
                                f"on {other['host']}); `vlbert pipeline status` shows it, `cancel` stops it")
            records.clear()
            records.update(executor="local", scheduler={"pid": os.getpid(), "host": socket.gethostname(),
                                                         "started": time.time()}, steps={})
        try:
            with self._signals_handled():
                self._loop()
        finally:
            shut_down()
            with updating_state(self.pipeline.out) as records:
                records["scheduler"]["ended"] = time.time()
        self._report()

    def _loop(self) -> None:
        while self.waiting or self.ready or self.running:
            if self.stopping is not None:
                self._stop_all()
            self._take_ready()
            if not self.ready and not self.running:
                break  # what still waits reads a step that will never be done
            self._launch()
            if self.running:
                self._poll()

    def _take_ready(self) -> None:
        """Steps whose inputs are done become ready (or done, when up to date); those reading a failed
        step are left out."""
        for step in list(self.waiting):
            failed = next((name for name in step.reads if name in self.outcome.failed or name in self.outcome.left_out),
                          None)
            if failed is not None:
                self.waiting.remove(step)
                self.outcome.left_out[step.name] = failed
                self.board.event(f"[{step.name}] not run: it reads {failed}, which failed")
                self._record(step, "not run", error=f"it reads {failed}, which failed")
                continue
            if not all(name in self.done for name in step.reads):
                continue
            self.waiting.remove(step)
            decision = state(step)
            if decision == "done":
                self.board.event(f"[{step.name}] up to date")
                self.done.add(step.name)
                continue
            if decision == "resume":
                self.resumed_threads[step.name] = resumed_threads(step)
            tasks = [Task(step, shard) for shard in range(step.layout.shards)] if step.layout.shards > 1 else [Task(step)]
            self.tasks_left[step.name] = len(tasks)
            self.attempts[step.name] = new_attempt()
            self.ready += tasks
            if not self.inline and _forked(tasks[0]):
                warm_up()  # its imports overlap whatever runs until the step starts

    def _launch(self) -> None:
        """Starts the ready launches that fit: a core per process, a GPU per process of a GPU step,
        at most `jobs` at once; the free cores are then shared among the heavy steps starting (a
        light step, `StepKind.light`, runs with one thread beside them and counts for no core)."""
        free_cores = self.cores - sum(launched.cores for launched in self.running)
        free_gpus = [gpu for gpu in self.gpus if all(gpu not in launched.gpus for launched in self.running)]
        starting: list[tuple[Task, list[str]]] = []
        for task in list(self.ready):
            if self.jobs is not None and len(self.running) + len(starting) >= self.jobs:
                break
            gpus = task.processes if task.step.layout.gpu and self.gpus else 0
            fits_alone = not self.running and not starting  # more than the machine has still runs, alone
            cores = 0 if _light(task) else task.processes
            if (cores > free_cores or gpus > len(free_gpus)) and not fits_alone:
                continue
            starting.append((task, free_gpus[:gpus]))
            free_gpus = free_gpus[gpus:]
            free_cores -= cores
            self.ready.remove(task)
        heavy = sum(task.processes for task, _ in starting if not _light(task))
        for task, gpus in starting:
            offered = self.threads or (1 if _light(task) else 1 + max(free_cores, 0) // heavy)
            self._start(task, gpus, self.resumed_threads.get(task.step.name) or offered)

    def _start(self, task: Task, gpus: list[str], threads: int) -> None:
        step = task.step
        if self.inline and task.processes == 1 and task.shard is None:
            self._run_inline(step)
            return
        step.folder.mkdir(parents=True, exist_ok=True)
        spec = StepSpec(step, threads, "shard" if task.shard is not None else "").write()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": ",".join(gpus),
               ATTEMPT_VARIABLE: self.attempts[step.name], PROGRESS_VARIABLE: str(step.progress_file(task.shard))}
        if _forked(task):
            process = ForkedProcess(step_arguments(spec, task), env, step.log_file)
        else:
            with step.log_file.open("ab") as log_file:
                process = subprocess.Popen(launch_command(spec, task), stdin=subprocess.DEVNULL, stdout=log_file,
                                           stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.running.append(Launched(task, process, 0 if _light(task) else task.processes * threads, gpus, threads))
        on = f", GPU {','.join(gpus)}" if gpus else ""
        self.board.event(f"[{task.name}] {step.kind} started: {task.processes} process(es), {threads} thread(s) each"
                         f"{on}; log {step.log_file}")
        with updating_state(self.pipeline.out) as records:
            entry = records["steps"].setdefault(step.name, {"state": "running", "pids": [], "log": str(step.log_file),
                                                            "started": time.time()})
            entry["pids"].append(process.pid)

    def _run_inline(self, step: Step) -> None:
        try:
            run_here(step, self.board.event)
        except Exception as exc:  # noqa: BLE001 - the step's error is reported with its name at the end
            self.outcome.causes[step.name] = exc
            self._failed(step, error_line(exc), exit_status(exc) or 1)
            return
        self.done.add(step.name)
        self._record(step, "done")

    def _poll(self) -> None:
        deadline = time.monotonic() + POLL_S
        while time.monotonic() < deadline and self.stopping is None:
            ended = [launched for launched in self.running if launched.process.poll() is not None]
            if ended:
                for launched in ended:
                    self.running.remove(launched)
                    self._ended(launched)
                return
            time.sleep(0.05)
        self.board.refresh([self._status_line(launched) for launched in self.running])

    def _ended(self, launched: Launched) -> None:
        step, code = launched.task.step, launched.process.returncode
        if code != 0 and step.name not in self.outcome.failed:
            self.outcome.failed[step.name] = f"exit status {code}"  # the error line once all its launches ended
            self.outcome.statuses[step.name] = code if code in (1, 2) else 1
        self.tasks_left[step.name] -= 1
        if self.tasks_left[step.name]:
            return
        if step.name in self.outcome.failed:
            self._failed(step, last_error(step.log_file) or self.outcome.failed[step.name],
                         self.outcome.statuses[step.name])
            return
        if step.layout.shards > 1:
            try:
                run_spec(StepSpec(step, launched.threads, "close"), log=appending_to(step.log_file))
            except Exception as exc:  # noqa: BLE001 - a closing check that fails is the step's failure
                self._failed(step, error_line(exc), exit_status(exc) or 1)
                return
        self.done.add(step.name)
        self.board.event(f"[{step.name}] done in {recorded(step).get('seconds', 0.0):.1f} s")
        self._record(step, "done")

    def _failed(self, step: Step, error: str, status: int) -> None:
        self.outcome.failed[step.name] = error
        self.outcome.statuses[step.name] = status
        self.board.event(f"[{step.name}] failed: {error} (log: {step.log_file})")
        self._record(step, "failed", error=error)

    def _record(self, step: Step, outcome: str, **details: Any) -> None:
        with updating_state(self.pipeline.out) as records:
            records["steps"].setdefault(step.name, {"log": str(step.log_file)}).update(state=outcome, ended=time.time(),
                                                                                       **details)

    def _status_line(self, launched: Launched) -> str:
        task = launched.task
        files = [task.step.progress_file(task.shard)]
        return f"{task.name}: {progress_summary(files) or 'starting'}"

    # ---- checks, signals, the end --------------------------------------------------------------

    def _check_fits(self) -> None:
        problems = [f"step {step.name!r}: nodes {step.layout.nodes}: several machines need --executor slurm"
                    for step in self.pipeline.steps if step.layout.nodes > 1]
        problems += [f"step {step.name!r}: devices {step.layout.ranks}, but this machine has {len(self.gpus)} GPU(s)"
                     for step in self.pipeline.steps if step.layout.gpu and self.gpus
                     and step.layout.ranks > len(self.gpus)]
        if not self.inline:  # each step sees only the GPUs it is given, as cuda:0, cuda:1, ...
            problems += [f"step {step.name!r}: device {step.params['device']}: steps side by side are each given their "
                         "GPUs; name cuda or auto (or run them one after another with --jobs 1)"
                         for step in self.pipeline.steps
                         if str(step.params.get("device", "")).startswith("cuda:")]
        if problems:
            raise UserError(f"{self.pipeline.path}: " + "; ".join(problems))

    @contextmanager
    def _signals_handled(self) -> Iterator[None]:
        """SIGINT and SIGTERM stop the run between polls (not in `jobs=1`, whose steps run here)."""
        handled = (signal.SIGINT, signal.SIGTERM)
        if self.inline or threading.current_thread() is not threading.main_thread():
            handled = ()
        before = {signum: signal.signal(signum, self._stop_requested) for signum in handled}
        try:
            yield
        finally:
            for signum, handler in before.items():
                signal.signal(signum, handler)

    def _stop_requested(self, signum: int, frame) -> None:
        self.stopping = signum

    def _stop_all(self) -> None:
        """SIGTERM to every running step's process group, SIGKILL to those still alive after the grace."""
        self.board.event(f"stopping {len(self.running)} running step(s) ...")
        for launched in self.running:
            _signal_group(launched.process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(launched.process.poll() is None for launched in self.running) and time.monotonic() < deadline:
            time.sleep(0.1)
        for launched in self.running:
            _signal_group(launched.process, signal.SIGKILL)
            launched.process.wait()
            self._record(launched.task.step, "stopped")
        if self.stopping == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(self.stopping)

    def _report(self) -> None:
        failed, left_out = self.outcome.failed, self.outcome.left_out
        if not failed:
            return
        if len(failed) == 1 and next(iter(failed)) in self.outcome.causes:  # one error, raised here: itself
            from pipelines.runner import StepFailed

            name = next(iter(failed))
            cause = self.outcome.causes[name]
            raise StepFailed(self.pipeline.path, name, cause) from cause
        steps = {step.name: step for step in self.pipeline.steps}
        lines = [f"pipeline {self.pipeline.path}: {len(failed)} step(s) failed"
                 + (f", {len(left_out)} not run" if left_out else "")]
        lines += [f"  {name}: {error} (log: {steps[name].log_file})" for name, error in failed.items()]
        lines += [f"  {name}: not run, it reads {reason}" for name, reason in left_out.items()]
        error = StepsFailed("\n".join(lines))
        error.exit_status = next(iter(self.outcome.statuses.values()))
        raise error


def _light(task: Task) -> bool:
    return KINDS[task.step.kind].light


def _forked(task: Task) -> bool:
    """A heavy launch of one process is forked from the server that imported torch (forked.py); a light
    one (it imports no torch) and torch's launcher for DDP start as commands."""
    return task.processes == 1 and not _light(task)


def step_arguments(spec: Path, task: Task) -> list[str]:
    """The `vlbert` arguments of one launch: `pipeline step SPEC`, with its shard."""
    return ["pipeline", "step", str(spec), *(["--shard", str(task.shard)] if task.shard is not None else [])]


def launch_command(spec: Path, task: Task) -> list[str]:
    """The command of one launch that is not forked: `vlbert pipeline step SPEC`, under torch's
    launcher for several DDP processes."""
    command = [sys.executable, "-m", "pipelines", *step_arguments(spec, task)]
    if task.processes > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={task.processes}", *command[1:]]
    return command


def appending_to(path: Path) -> Log:
    def log(message: str) -> None:
        with path.open("a", encoding="utf-8") as file:
            file.write(message + "\n")

    return log


def _signal_group(process: subprocess.Popen | ForkedProcess, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


class StatusBoard:
    """Events as lines; on a terminal, below them, a line per running step redrawn every second;
    elsewhere, those lines every STATUS_EVERY_S seconds."""

    def __init__(self, log: Log, stream: TextIO | None) -> None:
        self.log, self.stream = log, stream
        self.live = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.shown = 0  # lines of the live block on the screen
        self.last = time.monotonic()

    def event(self, message: str) -> None:
        self._clear()
        self.log(message)

    def refresh(self, lines: list[str]) -> None:
        now = time.monotonic()
        if self.live:
            if now - self.last >= 1.0:
                self._clear()
                self.stream.write("".join(line + "\n" for line in lines))
                self.stream.flush()
                self.shown, self.last = len(lines), now
        elif lines and now - self.last >= STATUS_EVERY_S:
            for line in lines:
                self.log(f"  {line}")
            self.last = now

    def _clear(self) -> None:
        if self.live and self.shown:
            self.stream.write(f"\x1b[{self.shown}F\x1b[J")
            self.stream.flush()
            self.shown = 0


# ---- status and cancel ---------------------------------------------------------------------------

def status(pipeline) -> list[StepStatus]:
    recorded = read_state(pipeline.out)
    alive = _running_scheduler(recorded) is not None
    rows = []
    for step in pipeline.steps:
        entry = recorded.get("steps", {}).get(step.name, {})
        done = settled(step)
        if done is not None:
            rows.append(done)
            continue
        pids = [pid for pid in entry.get("pids", []) if _alive(pid)]
        if entry.get("state") == "running" and pids:
            line = progress_summary(sorted(step.folder.glob(".progress*.json")))
            rows.append(StepStatus(step.name, "running", ",".join(map(str, pids)), str(step.log_file), line))
        elif entry.get("state") == "failed":
            rows.append(StepStatus(step.name, "failed", log=str(step.log_file), detail=entry.get("error", "")))
        elif entry.get("state") == "not run":
            rows.append(StepStatus(step.name, "not run", detail=entry.get("error", "")))
        elif entry.get("state") in ("running", "stopped"):
            rows.append(StepStatus(step.name, "stopped", log=str(step.log_file), detail="resumes on a rerun"))
        else:
            rows.append(StepStatus(step.name, "waiting" if alive else "not started"))
    return rows


def cancel(pipeline, log: Log) -> None:
    """Stops a local run of the pipeline: SIGTERM to its scheduler, which stops every running step."""
    scheduler = _running_scheduler(read_state(pipeline.out))
    if scheduler is None:
        log(f"{pipeline.out}: no run of this pipeline is going on on this machine")
        return
    os.kill(scheduler["pid"], signal.SIGTERM)
    log(f"{pipeline.out}: asked the run (process {scheduler['pid']}) to stop; its steps resume on a rerun")


def _running_scheduler(recorded: dict) -> dict | None:
    """The state file's scheduler while it runs on this machine, else None."""
    scheduler = recorded.get("scheduler", {})
    running = "ended" not in scheduler and scheduler.get("host") == socket.gethostname()
    return scheduler if running and _alive(scheduler.get("pid")) else None


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
