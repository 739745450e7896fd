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
  checkpoint first, its DataLoader workers waiting for it: train.engine.stopping), says in one line
  per step how it stopped, records it stopped (not failed), and a rerun resumes each. With `jobs=1`
  the signal reaches the step running here, and training stops the same way.
- `jobs` caps how many launches run at once; `jobs=1` runs the steps one after another in this
  process (a step that needs several processes still gets them), as the runner always did.
- Bounds, checked before anything runs: a DDP step's `devices` at most the GPUs given (or, on the
  CPU, where each is a gloo process, the cores), `threads` at most the cores; OMP_NUM_THREADS, where
  set, caps the threads a step is given unless `threads` says otherwise.
- The run's scheduler is recorded in the state file with its pid and what tells that process from a
  later one given the same pid (the boot and its start time); `cancel` signals it only while the run
  lock is held and that process is still the one recorded: a dead or reused pid is reported, never
  signalled, and a pid that is not a process's (0, -1, 1, true, beyond pid_max, this process's own or
  its group's) or has no identity recorded is a damaged record, named in one line. A step's processes
  are recorded the same way, so a reused pid never shows as running.
- A step's processes end with the scheduler, however it ends (kill -9 included: processes.py): they
  stop as on its SIGTERM, and a rerun waits for those of the last run still stopping, then resumes.
- Every process started runs with PYTHONSAFEPATH (`python -P`), torch's launcher and its ranks too: a
  `train.py` in the folder the run started from does not stand in for the project's `train`.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, TextIO

from pipelines.execution import Step, StepSpec, new_attempt, recorded, resumed_threads, run_here, run_spec, state
from pipelines.executors.base import (
    Executor, Launch, State, StepFailed, StepsFailed, damaged_state, last_error, launched_steps, read_run,
    record_launch, record_run, run_going_on,
)
from pipelines.executors.allocation import Demand, Limits, allocate
from pipelines.executors.board import StatusBoard
from pipelines.executors.environment import local_environment
from pipelines.executors.forked import shut_down, warm_up
from pipelines.executors.launchers import Launched, Process, Task, Way, forks, launchers, way_of
from pipelines.executors.processes import (
    ENDING_GRACE_S, process_identity, recorded_pid, scheduler_variable, wait_for_end,
)
from pipelines.executors.records import LaunchRecord, RunRecord, SchedulerRecord
from pipelines.executors.shard_limits import local_processes, too_many_shards
from vlbert.utils.errors import Stopped, error_line, exit_status
from vlbert.utils.progress import progress_summary
from vlbert.utils.step_environment import ATTEMPT

Log = Callable[[str], None]
NAME = "local"
POLL_S = 0.5
STOP_GRACE_S = 120.0  # how long stopped steps may take to write their checkpoints before they are killed


class Interrupted(Stopped):
    """The run was stopped by a signal; every step resumes where it stopped on a rerun."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}: the running steps were stopped and resume "
                         "where they stopped when the pipeline runs again", signum)


@dataclass
class Outcome:
    failed: dict[str, str] = field(default_factory=dict)  # step → its error line
    statuses: dict[str, int] = field(default_factory=dict)  # step → the exit status it failed with
    left_out: dict[str, str] = field(default_factory=dict)  # step → the failed step it reads
    causes: dict[str, Exception] = field(default_factory=dict)  # step → its error, when it ran here


@dataclass(frozen=True)
class LocalOptions:
    """The local executor's run options (`--jobs`, `--threads`; `--set local.OPTION=VALUE`)."""

    jobs: int | None = field(default=1, metadata={"help": "launches at once; 1: one after another in this process, "
                                                          "null: as many as the cores and GPUs allow"})
    threads: int | None = field(default=None, metadata={"help": "CPU threads of every step's processes; null: the "
                                                                "free cores shared among the steps starting"})
    gpus: tuple[str, ...] | None = field(default=None, metadata={
        "help": "the GPUs to hand out; null: CUDA_VISIBLE_DEVICES, else every GPU torch sees"})


class LocalExecutor(Executor):
    name = NAME
    options = LocalOptions

    def problems(self, pipeline, options: LocalOptions) -> list[str]:
        jobs, threads = options.jobs, options.threads
        cores = len(os.sched_getaffinity(0))
        gpus = visible_gpus() if options.gpus is None else options.gpus
        problems = []
        if jobs is not None and jobs < 1:
            problems.append(f"jobs {jobs}: expected a positive number of steps at once")
        if threads is not None and not 1 <= threads <= cores:
            problems.append(f"threads {threads}: expected a number of threads per process from 1 to the {cores} "
                            "cores this machine gives this run")
        for step in pipeline.steps:
            where = f"step {step.name!r}: "
            if step.layout.nodes > 1:
                problems.append(where + f"nodes {step.layout.nodes}: several machines need a cluster's executor")
            elif step.layout.gpu and gpus and step.layout.ranks > len(gpus):
                problems.append(where + f"devices {step.layout.ranks}, but this machine has {len(gpus)} GPU(s)")
            elif not (step.layout.gpu and gpus) and step.layout.ranks > cores:
                problems.append(where + f"devices {step.layout.ranks}: on the CPU each is a gloo process of its own, "
                                f"and this machine gives this run {cores} cores")
            if jobs != 1 and str(step.params.get("device", "")).startswith("cuda:"):
                # each step sees only the GPUs it is given, as cuda:0, cuda:1, ...
                problems.append(where + f"device {step.params['device']}: steps side by side are each given their "
                                "GPUs; name cuda or auto (or run them one after another with --jobs 1)")
        return problems + too_many_shards(pipeline, *local_processes())

    def run(self, pipeline, log: Log, options: LocalOptions, status_stream: TextIO | None = None) -> None:
        """Runs the pipeline's steps that are not up to date (see the module's docstring)."""
        gpus = visible_gpus() if options.gpus is None else list(options.gpus)
        Scheduler(pipeline, log, options.jobs, options.threads, gpus, status_stream).run()

    def launches(self, pipeline) -> tuple[dict[str, Launch], bool]:
        return {name: launch for name, entry in launched_steps(pipeline.out, NAME).items()
                if (launch := _launch_of(pipeline.out, name, entry)) is not None}, run_going_on(pipeline.out)

    def cancel(self, pipeline, log: Log) -> None:
        """Stops a local run of the pipeline: SIGTERM to its scheduler, which stops every running step;
        only while the run goes on and its recorded scheduler is still that process."""
        out = pipeline.out
        scheduler = _recorded_scheduler(out)
        if not run_going_on(out):
            log(f"{out}: no run of this pipeline is going on"
                + (f"; its last run's scheduler (process {scheduler.pid} on {scheduler.host}) ended without "
                   "recording its end (killed?), so that pid was not signalled" if scheduler else ""))
        elif scheduler is None:
            log(f"{out}: a run of this pipeline is going on, but it recorded no local scheduler: nothing was "
                "signalled (`vlbert pipeline status` shows what runs)")
        elif scheduler.host != socket.gethostname():
            log(f"{out}: the run's scheduler is process {scheduler.pid} on host {scheduler.host}: run "
                "`vlbert pipeline cancel` there")
        elif scheduler.pid in (os.getpid(), os.getpgrp()):
            raise damaged_state(out, f"its scheduler's pid {scheduler.pid} is this process's own or its process "
                                     "group's", ": nothing was signalled")
        elif process_identity(scheduler.pid) != scheduler.identity:
            log(f"{out}: process {scheduler.pid} is no longer the run's scheduler (its pid was taken by another "
                "process): nothing was signalled")
        else:
            os.kill(scheduler.pid, signal.SIGTERM)
            log(f"{out}: asked the run (process {scheduler.pid}) to stop; its steps resume on a rerun")

    def attempt(self) -> str | None:
        return os.environ.get(ATTEMPT)


@dataclass(frozen=True)
class RecordedScheduler:
    pid: int
    identity: str
    host: str


def _recorded_scheduler(out: Path) -> RecordedScheduler | None:
    """The local scheduler that the state file of `out` records without its end; None when it records
    none (another executor ran last) or its end. Nothing is signalled on the word of a record that is
    not one (a pid that is not a process's, no identity, no host): StateUnreadable naming the file."""
    run = read_run(out)
    scheduler = run.scheduler if run.executor == NAME else None
    if scheduler is None or isinstance(scheduler, SchedulerRecord) and scheduler.ended is not None:
        return None
    if not isinstance(scheduler, SchedulerRecord):
        raise damaged_state(out, "its scheduler is not a record", ": nothing was signalled")
    try:
        pid = recorded_pid(scheduler.pid)
    except ValueError as exc:
        raise damaged_state(out, f"its scheduler's pid: {exc}", ": nothing was signalled") from None
    identity, host = scheduler.identity, scheduler.host
    if not isinstance(identity, str):
        raise damaged_state(out, f"no identity (start time and boot) of its scheduler, process {pid}",
                            ": nothing was signalled")
    if not (isinstance(host, str) and host.isprintable() and 0 < len(host) <= 255):
        raise damaged_state(out, f"no host name of its scheduler, process {pid}", ": nothing was signalled")
    return RecordedScheduler(pid, identity, host)


def _launch_of(out: Path, step: str, record: LaunchRecord) -> Launch | None:
    """What the scheduler recorded of a step's launch, as a Launch; None when it ended well."""
    attempts = (record.attempt,) if record.attempt is not None else ()
    if record.state == State.FAILED:
        return Launch(State.FAILED, detail=record.error or "", attempts=attempts)
    if record.state == State.NOT_RUN:  # never launched: a step it reads failed
        return Launch(State.CANCELLED, detail=record.error or "")
    if record.state not in (State.RUNNING, State.STOPPED):
        return None
    alive = [str(pid) for pid in _live_processes(out, step, record)]
    if record.state == State.RUNNING and alive:
        return Launch(State.RUNNING, ",".join(alive), attempts=attempts)
    return Launch(State.STOPPED, detail="resumes on a rerun", attempts=attempts)


def _recorded_processes(out: Path, step: str, record: LaunchRecord) -> dict[int, str | None]:
    """The processes the state file of `out` records for a step's launch, {pid: identity}; a pid that
    is not a process's is StateUnreadable naming the file."""
    processes = record.processes
    if not isinstance(processes, dict):
        raise damaged_state(out, f"step {step!r}: its processes are not a record")
    pids = {}
    for key, identity in processes.items():
        try:  # a JSON object's keys are strings: the pid's digits
            pid = recorded_pid(int(key) if key.isascii() and key.isdigit() and len(key) <= 10 else key)
        except ValueError as exc:
            raise damaged_state(out, f"step {step!r}: a process's pid: {exc}") from None
        pids[pid] = identity if isinstance(identity, str) else None  # none: it ended before it was recorded
    return pids


def _live_processes(out: Path, step: str, record: LaunchRecord) -> dict[int, str]:
    """The step's recorded processes that still run: {pid: identity}."""
    return {pid: identity for pid, identity in _recorded_processes(out, step, record).items()
            if identity is not None and process_identity(pid) == identity}


def visible_gpus() -> list[str]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


class Scheduler:
    def __init__(self, pipeline, log: Log, jobs: int | None, threads: int | None, gpus: list[str],
                 status_stream: TextIO | None) -> None:
        from vlbert.utils.threads import thread_count

        self.pipeline, self.threads, self.gpus = pipeline, threads, gpus
        self.inline = jobs == 1
        self.cores = len(os.sched_getaffinity(0))
        # OMP_NUM_THREADS, where set, bounds the threads a step is offered
        self.limits = Limits(self.cores, jobs, threads, thread_count(env=os.environ, default=None))
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
        self.scheduler = scheduler_variable()  # what tells this process to the steps it starts
        # Whether this run started steps from the fork server (forked.py), which it then stops. Not
        # otherwise: stopping a server that someone else started waits for every process holding its
        # pipe, a failed inline step's DataLoader workers too.
        self.forking = False
        self.launchers = launchers(NAME, self._run_inline, self._environment)

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """The loop, under the run lock that the caller holds (base.running), recorded in the state file."""
        self._wait_for_the_last_run()
        scheduler = SchedulerRecord(os.getpid(), process_identity(os.getpid()), socket.gethostname(), time.time())
        record_run(self.pipeline.out, lambda _: RunRecord(NAME, scheduler))
        try:
            with self._signals_handled():
                self._loop()
        finally:
            if self.forking:
                shut_down()
            record_run(self.pipeline.out, _scheduler_ended)
        self._report()

    def _wait_for_the_last_run(self) -> None:
        """Waits for the processes of the last run's steps that outlived their scheduler (killed outright:
        this run holds the lock it held): they are stopping (processes.end_with_scheduler), and their steps
        resume here once they let go of their locks. After the grace they are killed; this run then goes on."""
        out = self.pipeline.out
        left = {pid: identity for name, launch in launched_steps(out, NAME).items()
                for pid, identity in _live_processes(out, name, launch).items() if pid != os.getpid()}
        if not left:
            return
        self.board.event(f"waiting for {len(left)} process(es) of the last run's steps to stop, as they do when "
                         f"their scheduler has ended: {', '.join(map(str, left))}")
        deadline = time.monotonic() + ENDING_GRACE_S + 1.0
        for pid, identity in left.items():
            wait_for_end(pid, identity, max(deadline - time.monotonic(), 0.0))

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
                # for the run's timeline (pipelines/report/timeline.py); status derives it from the graph
                self._record(step, State.NOT_RUN, error=f"it reads {failed}, which failed")
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
            shards = range(step.layout.shards) if step.layout.shards > 1 else [None]
            tasks = [Task(step, shard) for shard in shards]
            self.tasks_left[step.name] = len(tasks)
            self.attempts[step.name] = new_attempt()
            self.ready += tasks
        # The server's imports (~5 s) overlap what runs before the first heavy step (a light world or
        # preparation step): it starts as soon as a step is to run and a heavy one is ready or to come.
        to_come = [*self.ready, *(Task(step) for step in self.waiting)]
        if not self.inline and not self.forking and self.ready and any(forks(task) for task in to_come):
            self.forking = True
            warm_up()

    def _launch(self) -> None:
        """Starts the ready launches that fit (allocation.py: cores, GPUs, `jobs`, each one's threads)."""
        free_cores = self.cores - sum(launched.cores for launched in self.running)
        free_gpus = [gpu for gpu in self.gpus if all(gpu not in launched.gpus for launched in self.running)]
        tasks = {task.name: task for task in self.ready}
        starts = allocate([self._demand(task) for task in self.ready], len(self.running), free_cores, free_gpus,
                          self.limits)
        for start in starts:
            self.ready.remove(tasks[start.name])
        for start in starts:
            self._start(tasks[start.name], list(start.gpus), start.threads)

    def _demand(self, task: Task) -> Demand:
        """What `task` asks for: a GPU per process of a GPU step (where GPUs are given), the threads its
        step resumes with."""
        return Demand(task.name, task.processes, task.processes if task.step.layout.gpu and self.gpus else 0,
                      task.light, self.resumed_threads.get(task.step.name))

    def _start(self, task: Task, gpus: list[str], threads: int) -> None:
        way = way_of(task, self.inline)
        self.forking = self.forking or way is Way.FORKED
        launched = self.launchers[way].start(task, threads, gpus)
        if launched is None:  # it ran here, to its end
            return
        self.running.append(launched)
        on = f", GPU {','.join(gpus)}" if gpus else ""
        self.board.event(f"[{task.name}] {task.step.kind} started: {task.processes} process(es), {threads} thread(s) "
                         f"each{on}; log {task.step.log_file}")
        self._record_process(task.step, launched.process.pid)

    def _environment(self, task: Task, threads: int, gpus: list[str]) -> dict[str, str]:
        return local_environment(task.step, task.shard, threads, task.processes, gpus, self.scheduler,
                                 self.attempts[task.step.name])

    def _record_process(self, step: Step, pid: int) -> None:
        """A process of the step's launch, with what tells it from a later process of the same pid."""
        def with_process(launch: LaunchRecord | None) -> LaunchRecord:
            launch = launch or LaunchRecord(State.RUNNING, started=time.time(), attempt=self.attempts[step.name])
            return launch.with_process(pid, process_identity(pid))

        record_launch(self.pipeline.out, step.name, with_process)

    def _run_inline(self, step: Step) -> None:
        self._record_process(step, os.getpid())
        try:
            run_here(step, self.board.event, NAME, self.threads, self.attempts[step.name])
        except (Stopped, KeyboardInterrupt) as exc:  # a signal reached the step here: the run stops
            self._stopped(Task(step), error_line(exc) if isinstance(exc, Stopped) else "interrupted (SIGINT)")
            raise _interruption(getattr(exc, "signum", signal.SIGINT)) from exc
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
                run_spec(StepSpec(step, NAME, launched.threads, "close"), log=appending_to(step.log_file))
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

    def _record(self, step: Step, outcome: str, **details: str) -> None:
        record_launch(self.pipeline.out, step.name,
                      lambda launch: replace(launch or LaunchRecord(), state=outcome, ended=time.time(), **details))

    def _status_line(self, launched: Launched) -> str:
        task = launched.task
        files = [task.step.progress_file(task.shard)]
        return f"{task.name}: {progress_summary(files) or 'starting'}"

    # ---- checks, signals, the end --------------------------------------------------------------

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
        """SIGTERM to every running step's process group, SIGKILL to what is left of each after the
        grace; one line per launch says how it ended."""
        self.board.event(f"stopping {len(self.running)} running step(s) ...")
        for launched in self.running:
            _signal_group(launched.process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(launched.process.poll() is None for launched in self.running) and time.monotonic() < deadline:
            time.sleep(0.1)
        for launched in self.running:
            killed = launched.process.poll() is None
            _signal_group(launched.process, signal.SIGKILL)
            launched.process.wait()
            if launched.process.returncode == 0:
                self._ended(launched)  # it finished before the signal reached it
            else:
                self._stopped(launched.task, f"killed: still running {STOP_GRACE_S:.0f} s after the stop" if killed
                              else _how_it_stopped(launched))
        raise _interruption(self.stopping)

    def _stopped(self, task: Task, how: str) -> None:
        self.board.event(f"[{task.name}] {how}")
        self._record(task.step, "stopped")

    def _report(self) -> None:
        failed, left_out = self.outcome.failed, self.outcome.left_out
        if not failed:
            return
        if len(failed) == 1 and next(iter(failed)) in self.outcome.causes:  # one error, raised here: itself
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


def _scheduler_ended(run: RunRecord) -> RunRecord:
    return replace(run, scheduler=replace(run.scheduler, ended=time.time()))


def _interruption(signum: int) -> BaseException:
    """What a run stopped by `signum` ends with: Ctrl-C's own KeyboardInterrupt, else `Interrupted`."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Interrupted(signum)


def _how_it_stopped(launched: Launched) -> str:
    """The error line the launch's process ended with (training: the step and checkpoint it stopped
    at), else its exit status."""
    said = last_error(launched.task.step.log_file, launched.log_start)
    if said.startswith("Error: "):
        return said.removeprefix("Error: ")
    code = launched.process.returncode
    return f"ended by {signal.Signals(-code).name}" if code < 0 else f"ended with exit status {code}"


def appending_to(path: Path) -> Log:
    def log(message: str) -> None:
        with path.open("a", encoding="utf-8") as file:
            file.write(message + "\n")

    return log


def _signal_group(process: Process, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


EXECUTOR = LocalExecutor()
