"""How the local scheduler starts a launch: three ways behind one face (`Launcher.start`), one for
each `Way`, in the table `launchers` makes:

- inline: with `jobs=1`, a step of one process runs in the scheduler's own process;
- forked: a heavy launch of one process is forked from the server that imported torch (forked.py);
- command: a light launch (it imports no torch) and torch's launcher for DDP start as commands.

A launch out of the scheduler's process writes its spec, appends its output to the step's log and
runs in a session of its own with the environment the scheduler gives it.
"""

from __future__ import annotations

import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Callable

from pipelines.execution import Step, StepSpec
from pipelines.executors.forked import ForkedProcess
from pipelines.steps import KINDS

Process = subprocess.Popen | ForkedProcess


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

    @property
    def light(self) -> bool:
        return KINDS[self.step.kind].light


@dataclass
class Launched:
    task: Task
    process: Process
    cores: int
    gpus: list[str]
    threads: int
    log_start: int  # the size of the step's log when the launch started: what follows is the launch's


class Way(StrEnum):
    INLINE = "inline"
    FORKED = "forked"
    COMMAND = "command"


def way_of(task: Task, inline: bool) -> Way:
    """How `task` starts (the module's docstring); `inline`: the run's steps run one after another here."""
    if inline and task.processes == 1 and task.shard is None:
        return Way.INLINE
    return Way.FORKED if forks(task) else Way.COMMAND


def forks(task: Task) -> bool:
    """Whether `task`, out of the scheduler's process, is forked from the server (else a command)."""
    return task.processes == 1 and not task.light


class Launcher(ABC):
    @abstractmethod
    def start(self, task: Task, threads: int, gpus: list[str]) -> Launched | None:
        """Starts `task` with `threads` per process on `gpus`; None where it ran to its end here."""


class InlineLauncher(Launcher):
    def __init__(self, run: Callable[[Step], None]) -> None:
        self.run = run  # runs the step here and records how it ended

    def start(self, task: Task, threads: int, gpus: list[str]) -> None:
        self.run(task.step)


class ProcessLauncher(Launcher):
    """A launch in processes of its own, run for `executor`; `environment` gives theirs."""

    def __init__(self, executor: str, environment: Callable[[Task, int, list[str]], dict[str, str]]) -> None:
        self.executor, self.environment = executor, environment

    def start(self, task: Task, threads: int, gpus: list[str]) -> Launched:
        step = task.step
        step.folder.mkdir(parents=True, exist_ok=True)
        log_start = step.log_file.stat().st_size if step.log_file.exists() else 0
        spec = StepSpec(step, self.executor, threads, "shard" if task.shard is not None else "").write()
        process = self.process(task, spec, self.environment(task, threads, gpus))
        return Launched(task, process, 0 if task.light else task.processes * threads, gpus, threads, log_start)

    @abstractmethod
    def process(self, task: Task, spec: Path, env: dict[str, str]) -> Process:
        """The launch's process (its first: torch's launcher for DDP), started."""


class ForkedLauncher(ProcessLauncher):
    def process(self, task: Task, spec: Path, env: dict[str, str]) -> Process:
        return ForkedProcess(step_arguments(spec, task), env, task.step.log_file)


class CommandLauncher(ProcessLauncher):
    def process(self, task: Task, spec: Path, env: dict[str, str]) -> Process:
        with task.step.log_file.open("ab") as log_file:
            return subprocess.Popen(launch_command(spec, task), stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)


def launchers(executor: str, run_here: Callable[[Step], None],
              environment: Callable[[Task, int, list[str]], dict[str, str]]) -> dict[Way, Launcher]:
    """One scheduler's launcher of each way: `run_here` runs a step inline, the others start processes."""
    return {Way.INLINE: InlineLauncher(run_here), Way.FORKED: ForkedLauncher(executor, environment),
            Way.COMMAND: CommandLauncher(executor, environment)}


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
