"""What every executor shares, on the local one in this process: cancel signals only the run's own
scheduler, the run lock tells a run killed outright from one going on, a step record that cannot be
read stops the run without emptying a finished folder, status and cancel read the run's settings from
its folder, input digests are taken again only when a file changed, bounds are refused before anything
runs, a step's data workers fit in the cores it is given, and the fork server warms up while a light
step runs (another executor: test_executor_toy.py)."""

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipelines import execution
from pipelines.cli import main
from pipelines.executors import executor_named
from pipelines.executors.base import CannotRun, RunGoingOn, State, running, updating_state
from pipelines.executors.local import process_identity
from pipelines.runner import load_pipeline, run_pipeline
from tests.helpers.pipelines import step_record, train_step_on, write_pipeline
from train.engine.run_folder import RunFolder

LOCAL = executor_named("local")
LIGHT_STEPS = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
               {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]


def record_scheduler(out: Path, pid: int, identity: str | None) -> None:
    """The state file of a local run whose scheduler was process `pid` (`identity`: which process)."""
    with updating_state(out) as records:
        records.clear()
        records.update(executor="local", scheduler={"pid": pid, "identity": identity, "host": socket.gethostname(),
                                                    "started": time.time()}, steps={})


def test_cancel_signals_the_run_s_own_scheduler_and_reports_a_dead_or_reused_pid(tmp_path):
    out = tmp_path / "out"
    pipeline = load_pipeline(write_pipeline(tmp_path, LIGHT_STEPS))
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        # The recorded scheduler was killed outright (no `ended`), and its pid now belongs to a stranger.
        record_scheduler(out, stranger.pid, "an earlier process/1234")
        messages = []
        LOCAL.cancel(pipeline, messages.append)
        assert messages[-1] == (f"{out}: no run of this pipeline is going on; its last run's scheduler (process "
                                f"{stranger.pid} on {socket.gethostname()}) ended without recording its end "
                                "(killed?), so that pid was not signalled")
        with running(out):  # a run goes on, but the pid it recorded is not its scheduler any more
            LOCAL.cancel(pipeline, messages.append)
            assert messages[-1] == (f"{out}: process {stranger.pid} is no longer the run's scheduler (its pid was "
                                    "taken by another process): nothing was signalled")
            assert stranger.poll() is None
            record_scheduler(out, stranger.pid, process_identity(stranger.pid))  # now it is the scheduler
            LOCAL.cancel(pipeline, messages.append)
        assert stranger.wait(timeout=10) == -signal.SIGTERM
        assert messages[-1] == f"{out}: asked the run (process {stranger.pid}) to stop; its steps resume on a rerun"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_run_killed_outright_under_jobs_1_is_known_as_over(tiny_world, tmp_path):
    steps = [train_step_on(tiny_world, "long", steps=3000)]
    path = write_pipeline(tmp_path, steps)
    out = tmp_path / "out"
    pipeline = load_pipeline(path)
    with (tmp_path / "run.log").open("w") as output:
        run = subprocess.Popen([sys.executable, "-m", "pipelines", "pipeline", "run", str(path), "--jobs", "1"],
                               stdout=output, stderr=subprocess.STDOUT)
    log, deadline = out / "long" / "log.txt", time.monotonic() + 180
    while not (log.is_file() and "stage vqa: starting at step 0" in log.read_text()) and time.monotonic() < deadline:
        assert run.poll() is None, (tmp_path / "run.log").read_text()
        time.sleep(0.1)
    (row,) = LOCAL.status(pipeline)
    assert (row.state, row.job) == (State.RUNNING, str(run.pid))  # the step runs in the scheduler's process
    with pytest.raises(RunGoingOn, match=f"{out}: another run of this pipeline is going on \\(pid {run.pid} on"):
        run_pipeline(path, log=lambda _: None)
    run.kill()
    run.wait()

    (row,) = LOCAL.status(pipeline)
    assert row.state == State.STOPPED and row.detail == "resumes on a rerun"
    messages = []
    LOCAL.cancel(pipeline, messages.append)
    assert "ended without recording its end (killed?), so that pid was not signalled" in messages[0]
    with running(out):  # a new run is not refused
        pass


@pytest.mark.parametrize("damage", ["unreadable", "damaged"])
def test_a_step_record_that_cannot_be_read_stops_the_run_in_one_line_and_empties_nothing(tmp_path, monkeypatch,
                                                                                       damage):
    path = write_pipeline(tmp_path, LIGHT_STEPS)
    out = run_pipeline(path, log=lambda _: None)
    finished = {file: file.read_bytes() for file in (out / "world").rglob("*") if file.is_file()}
    record = out / "world" / "step.json"
    if damage == "unreadable":  # what NFS says of a file replaced on another client, for one
        read_text = Path.read_text

        def failing(self, *args, **kwargs):
            if self == record:
                raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), str(self))
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", failing)
        said = f"{record}: cannot read a step's record ({os.strerror(errno.ESTALE)}); its folder was left as it is"
    else:
        record.write_text('{"kind": "world", "par')
        finished[record] = record.read_bytes()
        said = f"{record}: damaged (not a step's record); its folder was left as it is"
    for command in (["run", "--jobs", "1"], ["run", "--jobs", "2"], ["status"]):
        result = CliRunner().invoke(main, ["pipeline", *command, str(path)])
        assert (result.exit_code, result.output) == (1, f"Error: {said}\n"), command
    monkeypatch.undo()
    assert {file: file.read_bytes() for file in (out / "world").rglob("*") if file.is_file()} == finished


def test_status_and_cancel_read_the_run_s_settings_from_its_folder(tmp_path):
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump({"name": "own", "inputs": {"images": None}, "steps": [
        {"name": "world", "kind": "world", "images": "${inputs.images}", "seed": 1},
        {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]}))
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["pipeline", "run", str(path), "--jobs", "1", "--out", str(run),
                                       "--set", "images=3", "--set", "world.seed=2"])
    assert result.exit_code == 0, result.output

    shown = CliRunner().invoke(main, ["pipeline", "status", str(path), "--out", str(run)])
    assert (shown.exit_code, shown.output) == (0, "world       done\nvocabulary  done\n")
    shown = CliRunner().invoke(main, ["pipeline", "status", str(path), "--out", str(run), "--set", "world.seed=5"])
    assert shown.output.splitlines()[0] == ("world       outdated: done for other parameters or inputs than these: "
                                            f"a run redoes it (log: {run / 'world' / 'log.txt'})")
    cancelled = CliRunner().invoke(main, ["pipeline", "cancel", str(path), "--out", str(run)])
    assert (cancelled.exit_code, cancelled.output) == (0, f"{run}: no run of this pipeline is going on\n")


def test_an_input_file_is_read_for_its_digest_again_only_when_its_size_or_mtime_changed(tmp_path, monkeypatch):
    texts = tmp_path / "texts.txt"
    texts.write_text("a zebra sleeps under a tree\n" * 4)
    path = write_pipeline(tmp_path, [{"name": "vocabulary", "kind": "vocabulary", "texts": [str(texts)],
                                      "min_frequency": 1, "size": 60}])
    run_pipeline(path, log=lambda _: None)
    (step,) = load_pipeline(path).steps
    digested = []
    digest = execution._digest
    monkeypatch.setattr(execution, "_digest", lambda file: digested.append(file) or digest(file))
    assert execution.state(step) == "done" and digested == []
    os.utime(texts, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: read again, the same text
    assert execution.state(step) == "done" and digested == [texts]
    texts.write_text("a zebra sleeps under a bush\n" * 4)  # the same size, another text
    assert execution.state(step) == "start"


def test_more_processes_or_threads_than_the_machine_has_are_refused_before_anything_runs(tiny_world, tmp_path):
    cores = len(os.sched_getaffinity(0))
    path = write_pipeline(tmp_path, [train_step_on(tiny_world, "ddp", devices=cores + 1)])
    with pytest.raises(CannotRun) as refused:
        run_pipeline(path, log=lambda _: None, gpus=[])
    assert str(refused.value) == (f"{path}: step 'ddp': devices {cores + 1}: on the CPU each is a gloo process of "
                                  f"its own, and this machine gives this run {cores} cores")
    path = write_pipeline(tmp_path, LIGHT_STEPS)
    result = CliRunner().invoke(main, ["pipeline", "run", str(path), "--threads", str(cores + 1)])
    assert (result.exit_code, result.output) == (2, f"Error: {path}: threads {cores + 1}: expected a number of "
                                                    f"threads per process from 1 to the {cores} cores this machine "
                                                    "gives this run\n")
    result = CliRunner().invoke(main, ["pipeline", "run", str(path), "--executor", "slurm", "--jobs", "2"])
    assert (result.exit_code, result.output) == (2, "Error: jobs: not an option of the slurm executor (Slurm decides "
                                                    "how many jobs run at once; slurm.array_parallelism bounds an "
                                                    "extraction's shards)\n")
    assert not (tmp_path / "out").exists()


def test_omp_num_threads_caps_the_threads_a_step_is_given(tiny_world, tmp_path, monkeypatch):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a step is given one thread anyway")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    steps = [{"name": "cache", "kind": "extract", "images": str(tiny_world / "world"), "detector": "tiny",
              "batch_size": 4, "progress": False}]
    out = run_pipeline(write_pipeline(tmp_path, steps), log=lambda _: None, jobs=2, gpus=[])
    assert step_record(out, "cache")["threads"] == 1  # alone on the machine it would have had every core


def test_a_step_s_data_workers_fit_in_the_cores_it_is_given(tiny_world, tmp_path):
    """A train step given one thread makes its samples in its own process: a DataLoader worker would
    take a core that the scheduler gave to the step beside it."""
    step = train_step_on(tiny_world, "finetune")
    del step["stages"][0]["num_workers"]
    out = run_pipeline(write_pipeline(tmp_path, [step]), log=lambda _: None, jobs=2, threads=1, gpus=[])
    assert step_record(out, "finetune")["threads"] == 1
    assert RunFolder(out / "finetune").speed()["vqa"]["workers"] == 0


def test_the_fork_server_warms_up_as_a_light_step_starts_before_the_first_heavy_one(tmp_path, monkeypatch):
    from pipelines.executors import local

    events = []
    monkeypatch.setattr(local, "warm_up", lambda: events.append("warm up"))
    start = local.Scheduler._start
    monkeypatch.setattr(local.Scheduler, "_start",
                        lambda self, task, gpus, threads: events.append(task.name) or start(self, task, gpus, threads))
    steps = [LIGHT_STEPS[0], {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny",
                              "batch_size": 4, "progress": False}]
    file = write_pipeline(tmp_path, steps)
    run_pipeline(file, log=lambda _: None, jobs=2, gpus=[])
    assert events == ["warm up", "world", "cache"]  # its imports overlap the world's generation
    events.clear()
    run_pipeline(file, log=lambda _: None, jobs=2, gpus=[])
    assert events == []  # nothing to run: no server
