"""Nothing signalled that is not the run's: `cancel` reads its pids and job ids as written by someone
careless or hostile, a step's process ends with its scheduler however it ends (kill -9), a rerun waits
for the last run's processes still stopping, and no file of the folder a command runs from stands in
for the project's packages (locally and on Slurm)."""

import os
import reprlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.execution import StepSpec
from pipelines.executors import slurm
from pipelines.executors.base import running, state_file, updating_state
from pipelines.executors.processes import SCHEDULER_VARIABLE, pid_max, process_identity
from pipelines.own_packages import ROOT
from pipelines.runner import load_pipeline, run_pipeline
from tests.helpers.pipelines import step_record, write_pipeline

LIGHT_STEPS = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
               {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]
BOUND_S = 60  # how long a process may take to end; far more than it takes


@pytest.fixture
def signals(monkeypatch):
    """The signals this process sends, recorded instead of sent (a regression must not end the test's
    own process group, every process of the user's, or init)."""
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    monkeypatch.setattr(os, "killpg", lambda group, signum: sent.append((-group, signum)))
    return sent


def record(out: Path, **records) -> None:
    with updating_state(out) as recorded:
        recorded.clear()
        recorded.update(records)


def scheduler_of(pid, identity="unset") -> dict:
    """A scheduler's record; its identity that of the process of that pid where none is given."""
    identity = process_identity(pid) if identity == "unset" else identity
    return {"pid": pid, "identity": identity, "host": socket.gethostname(), "started": time.time()}


def not_a_pid(value) -> str:
    return f"{value} is not a process id (one from 2 to {pid_max() - 1})"


@pytest.mark.parametrize("pid, problem", [
    (0, not_a_pid(0)),  # kill(0): the canceller's own process group
    (-1, not_a_pid(-1)),  # kill(-1): every process the user may signal
    (1, not_a_pid(1)),  # init
    (True, "True is not a whole number"),  # read as 1 before
    (4194304000, not_a_pid(4194304000)),  # an OverflowError traceback before
    (12.0, "12.0 is not a whole number"),
    ("123", "'123' is not a whole number"),
    (None, "None is not a whole number"),
], ids=["0", "-1", "1", "true", "huge", "float", "string", "none"])
def test_cancel_signals_no_pid_that_is_not_a_process_s(tmp_path, signals, pid, problem):
    path, out = write_pipeline(tmp_path, LIGHT_STEPS), tmp_path / "out"
    record(out, executor="local", scheduler=scheduler_of(pid), steps={})
    with running(out):  # a run goes on: the lock is held
        result = CliRunner().invoke(main, ["pipeline", "cancel", str(path)])
    assert (result.exit_code, result.output) == (
        1, f"Error: {state_file(out)}: damaged (its scheduler's pid: {problem}): nothing was signalled\n")
    assert signals == []


def test_cancel_signals_neither_its_own_process_nor_its_group_nor_a_scheduler_recorded_without_identity(
        tmp_path, signals):
    path, out = write_pipeline(tmp_path, LIGHT_STEPS), tmp_path / "out"
    stranger = subprocess.Popen(["cat"], stdin=subprocess.PIPE)  # ends when its input does: no signal to send
    try:
        with running(out):
            for pid, said in [(os.getpid(), f"its scheduler's pid {os.getpid()} is this process's own or its "
                                            "process group's"),
                              (os.getpgrp(), f"its scheduler's pid {os.getpgrp()} is this process's own or its "
                                             "process group's"),
                              (stranger.pid, "no identity (start time and boot) of its scheduler, process "
                                             f"{stranger.pid}")]:
                # a group's leader may have ended (a shell's background job): it has no identity then
                record(out, executor="local", steps={},
                       scheduler=scheduler_of(pid, None if pid == stranger.pid else process_identity(pid) or "boot/1"))
                result = CliRunner().invoke(main, ["pipeline", "cancel", str(path)])
                assert (result.exit_code, result.output) == (
                    1, f"Error: {state_file(out)}: damaged ({said}): nothing was signalled\n"), pid
            record(out, executor="local", steps={}, scheduler="pid 5")
            result = CliRunner().invoke(main, ["pipeline", "cancel", str(path)])
            assert result.output == (f"Error: {state_file(out)}: damaged (its scheduler is not a record): nothing "
                                     "was signalled\n")
        assert signals == [] and stranger.poll() is None
    finally:
        stranger.stdin.close()
        stranger.wait()


@pytest.mark.parametrize("key, problem", [("0", not_a_pid(0)), ("-1", "'-1' is not a whole number"),
                                          ("1", not_a_pid(1)), ("abc", "'abc' is not a whole number"),
                                          ("9" * 5000, f"{reprlib.repr('9' * 5000)} is not a whole number")],
                         ids=["0", "-1", "1", "letters", "5000-digits"])
def test_status_reads_a_step_s_pids_as_process_ids_or_says_in_one_line_which_is_not(tmp_path, key, problem):
    path, out = write_pipeline(tmp_path, LIGHT_STEPS), tmp_path / "out"
    record(out, executor="local", scheduler=scheduler_of(os.getpid()),
           steps={"world": {"state": "running", "processes": {key: None}, "attempt": "a"}})
    result = CliRunner().invoke(main, ["pipeline", "status", str(path)])
    assert (result.exit_code, result.output) == (
        1, f"Error: {state_file(out)}: damaged (step 'world': a process's pid: {problem})\n")


def test_a_step_process_that_ended_before_it_was_recorded_is_not_shown_running(tmp_path):
    path, out = write_pipeline(tmp_path, LIGHT_STEPS), tmp_path / "out"
    ended = subprocess.Popen(["true"])
    ended.wait()
    record(out, executor="local", scheduler=scheduler_of(os.getpid()),
           steps={"world": {"state": "running", "processes": {str(ended.pid): None}, "attempt": "a"}})
    result = CliRunner().invoke(main, ["pipeline", "status", str(path)])
    assert result.output.splitlines()[0] == (f"world       stopped: resumes on a rerun "
                                             f"(log: {out / 'world' / 'log.txt'})")


@pytest.mark.parametrize("jobs", [["-u"], ["--me"], "12", [12], ["12", "all"], None],
                         ids=["option", "long-option", "string", "number", "word", "none"])
def test_slurm_cancel_gives_scancel_only_job_ids(tmp_path, monkeypatch, jobs):
    path, out = write_pipeline(tmp_path, LIGHT_STEPS), tmp_path / "out"
    record(out, executor="slurm", steps={"world": {"jobs": jobs}})
    commands = []
    monkeypatch.setattr(slurm, "_slurm_command", lambda command: commands.append(command) or "")
    result = CliRunner().invoke(main, ["pipeline", "cancel", str(path)])
    if isinstance(jobs, list):
        wrong = f"job id {next(job for job in jobs if job != '12')!r} is not a Slurm job's"
    else:
        wrong = f"{jobs!r} is not a list of job ids"
    assert (result.exit_code, result.output) == (
        1, f"Error: {state_file(out)}: damaged (step 'world': {wrong}): nothing was cancelled\n")
    assert commands == []
    record(out, executor="slurm", steps={"world": {"jobs": ["12", "13_1"]}})
    result = CliRunner().invoke(main, ["pipeline", "cancel", str(path)])
    assert result.exit_code == 0 and commands == [["scancel", "12", "13_1"]]


def test_a_light_step_s_process_ends_when_its_scheduler_is_killed_outright(tmp_path):
    """A command step (`python -m pipelines pipeline step SPEC`, its parent the scheduler): stopped at once
    when the scheduler that its environment names is gone; a forked step and DDP ranks: test_scheduler.py."""
    scheduler = subprocess.Popen(["sleep", "600"])  # stands for the scheduler: kill -9 leaves it nothing to do
    (step,) = load_pipeline(write_pipeline(tmp_path, [{"name": "world", "kind": "world", "images": 100000,
                                                       "seed": 1}])).steps
    step.folder.mkdir(parents=True)
    spec = StepSpec(step, "local", 1).write()
    with step.log_file.open("ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "pipelines", "pipeline", "step", str(spec)],
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, SCHEDULER_VARIABLE: f"{scheduler.pid} "
                                                                          f"{process_identity(scheduler.pid)}"})
    try:
        deadline = time.monotonic() + BOUND_S
        while not (step.folder / "images").is_dir() and time.monotonic() < deadline:  # the step runs
            assert process.poll() is None, step.log_file.read_text()
            time.sleep(0.1)
        scheduler.kill()
        scheduler.wait()
        assert process.wait(timeout=BOUND_S) == -signal.SIGTERM  # a world step stops at once on SIGTERM
    finally:
        process.kill()
        process.wait()


def test_a_rerun_waits_for_the_last_run_s_step_processes_still_stopping(tmp_path):
    path, out = write_pipeline(tmp_path, LIGHT_STEPS), tmp_path / "out"
    stopping = subprocess.Popen(["sleep", "600"])  # a step's process whose scheduler was killed outright
    processes = {str(stopping.pid): process_identity(stopping.pid)}
    record(out, executor="local", steps={"world": {"state": "running", "processes": processes}})
    messages = []

    def log(message: str) -> None:
        messages.append(message)
        if message.startswith("waiting for"):
            assert stopping.poll() is None  # it was waited for while it ran
            stopping.kill()

    try:
        run_pipeline(path, log=log)
    finally:
        stopping.kill()
        stopping.wait()
    assert messages[0] == (f"waiting for 1 process(es) of the last run's steps to stop, as they do when their "
                           f"scheduler has ended: {stopping.pid}")
    assert step_record(out, "vocabulary")["done"]


@pytest.fixture
def research_folder(tmp_path):
    """A folder holding a research repository's own train.py and extract.py."""
    folder = tmp_path / "research"
    folder.mkdir()
    (folder / "train.py").write_text("print(\"the user's training script\")\n")
    (folder / "extract.py").write_text("print(\"the user's extraction script\")\n")
    return folder


def test_a_command_run_where_a_file_shadows_a_project_package_says_which_in_one_line(research_folder):
    (research_folder / "extract.py").unlink()
    command = [sys.executable, "-m", "pipelines", "--help"]
    shadowed = subprocess.run(command, cwd=research_folder, capture_output=True, text=True)
    assert (shadowed.returncode, shadowed.stdout, shadowed.stderr) == (
        2, "", f"Error: {research_folder / 'train.py'}: Python imports this as `train` instead of this project's "
               f"package ({ROOT / 'train'}); run from another folder, or as `python -P -m pipelines`\n")
    safe = subprocess.run([sys.executable, "-P", *command[1:]], cwd=research_folder, capture_output=True, text=True)
    assert safe.returncode == 0 and safe.stdout.startswith("Usage: "), safe.stderr


def test_slurm_jobs_started_from_a_folder_holding_train_py_import_the_project_s_packages(
        slurm_cluster, research_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(research_folder)  # sbatch starts a job in the folder it was given in
    path = write_pipeline(tmp_path, LIGHT_STEPS[:1])
    out = run_pipeline(path, log=lambda _: None, settings={"slurm.partition": slurm_cluster.partition,
                                                           "slurm.time": 10}, executor="slurm", wait=True)
    assert step_record(out, "world")["done"] and step_record(out, "world")["executor"] == "slurm"


@pytest.mark.parametrize("given", ["abc", "0 x", "1", "-7 x", "4194304000 x", "12.5 x"])
def test_a_scheduler_variable_that_names_no_process_is_one_line_before_anything_runs(given):
    """A step's process reads the scheduler's pid from its environment, which anyone may set."""
    result = subprocess.run([sys.executable, "-m", "pipelines", "--version"], capture_output=True, text=True,
                            env={**os.environ, SCHEDULER_VARIABLE: given}, timeout=60)
    assert result.returncode == 2 and result.stdout == "", result
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: {SCHEDULER_VARIABLE}={given!r}: ") and line.endswith(": unset it")
