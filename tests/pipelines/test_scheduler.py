"""The local executor: steps side by side in processes of their own, within the cores and GPUs given;
the same results as one after another; failures stop only what reads them; shards and DDP processes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from extract.store.reader import FeatureStore
from pipelines.cli import main
from pipelines.executors import board, executor_named
from pipelines.executors.base import StepsFailed, read_state
from pipelines.executors.forked import ForkedProcess, shut_down
from pipelines.executors.processes import process_identity
from pipelines.runner import load_pipeline, run_pipeline
from tests.helpers.pipelines import STEPS_WITH_A_FAILURE, step_record, train_step_on, write_pipeline
from train.engine.run_folder import RunFolder
from vlbert.utils.errors import UserError
from vlbert.utils.progress import PROGRESS_VARIABLE
from vlbert.utils.threads import configured_threads


def test_steps_side_by_side_give_bitwise_the_results_of_steps_one_after_another(tiny_world, tmp_path):
    steps = [
        {"name": "cache", "kind": "extract", "images": str(tiny_world / "world"), "detector": "tiny",
         "mask_variants": 1, "batch_size": 4, "progress": False},
        train_step_on(tiny_world, "pretrain", "pretrain"),
        train_step_on(tiny_world, "vqa", "vqa", init_from="${pretrain.final}"),
        train_step_on(tiny_world, "refexp", "refexp", init_from="${pretrain.final}"),
    ]
    path = write_pipeline(tmp_path, steps)
    one = run_pipeline(path, tmp_path / "one", log=lambda _: None, jobs=1, threads=1)
    messages = []
    both = run_pipeline(path, tmp_path / "both", log=messages.append, jobs=2, threads=1)
    assert any("[vqa] train started" in m for m in messages) and any("[refexp] train started" in m for m in messages)
    for step in ("cache", "pretrain", "vqa", "refexp"):
        assert step_record(one, step)["threads"] == step_record(both, step)["threads"] == 1
    assert step_record(both, "vqa")["executor"] == "local" and (both / "vqa" / "log.txt").is_file()
    assert step_record(one, "vqa")["precision"] == step_record(both, "vqa")["precision"] == {"vqa": "fp32"}

    with FeatureStore(one / "cache") as first, FeatureStore(both / "cache") as second:
        assert first.keys() == second.keys()
        for key in first.keys():
            for name, value in first[key].items():
                assert np.array_equal(value, second[key][name]) if isinstance(value, np.ndarray) else value == second[key][name]
    for step in ("pretrain", "vqa", "refexp"):
        stage_one, stage_both = RunFolder(one / step).last_stage(), RunFolder(both / step).last_stage()
        assert (stage_one.final / "model.safetensors").read_bytes() == (stage_both.final / "model.safetensors").read_bytes()
    for step in ("vqa", "refexp"):
        scores = RunFolder(one / step).last_stage().item_scores("val")
        assert scores.read_bytes() == RunFolder(both / step).last_stage().item_scores("val").read_bytes()
    predictions = RunFolder(one / "vqa").last_stage().predictions_folder
    assert [p.read_bytes() for p in sorted(predictions.iterdir())] == [
        p.read_bytes() for p in sorted(RunFolder(both / "vqa").last_stage().predictions_folder.iterdir())]


# Two threads each on 2 cores, one step after the other: allocation's table tests decide it
# (tests/pipelines/test_allocation.py); the run itself is behind -m slow.
@pytest.mark.parametrize("threads, side_by_side", [(1, True), pytest.param(2, False, marks=pytest.mark.slow)])
def test_steps_given_threads_claim_a_core_for_each(tiny_world, tmp_path, monkeypatch, threads, side_by_side):
    """On 2 cores two independent steps run side by side with one thread each, one after another with two
    each: side by side, their 4 threads would spin-wait on each other's cores."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    steps = [train_step_on(tiny_world, name, steps=20) for name in ("first", "second")]
    out = run_pipeline(write_pipeline(tmp_path, steps), log=lambda _: None, jobs=None, threads=threads)
    launched = read_state(out)["steps"]
    first, second = (launched[name] for name in ("first", "second"))
    assert (first["started"] < second["ended"] and second["started"] < first["ended"]) == side_by_side
    assert step_record(out, "first")["threads"] == step_record(out, "second")["threads"] == threads


def test_a_gpu_goes_to_one_step_at_a_time_while_cpu_steps_run_beside(tiny_world, tmp_path, monkeypatch):
    """One fake GPU: the two GPU steps (device auto) take turns on it, the CPU step runs beside them."""
    # long enough for a status line: a forked step process starts at once
    steps = [train_step_on(tiny_world, name, steps=60, device=device)
             for name, device in (("gpu-a", "auto"), ("gpu-b", "auto"), ("cpu", "cpu"))]
    monkeypatch.setattr(board, "STATUS_EVERY_S", 0.5)  # off a terminal, a line per running step this often
    messages = []
    out = run_pipeline(write_pipeline(tmp_path, steps), log=messages.append, jobs=None, threads=1, gpus=["7"])
    assert any(re.fullmatch(r"  (gpu-[ab]|cpu): (starting|vqa: \d+/60 step .*)", m) for m in messages), messages
    assert "[gpu-a] train started: 1 process(es), 1 thread(s) each, GPU 7; log " + str(out / "gpu-a" / "log.txt") in messages
    launched = read_state(out)["steps"]  # each step's process, from its start to its end
    spans = {step: (launched[step]["started"], launched[step]["ended"]) for step in ("gpu-a", "gpu-b", "cpu")}
    assert step_record(out, "gpu-a")["devices"] == step_record(out, "gpu-b")["devices"] == "7"
    assert step_record(out, "cpu")["devices"] == ""

    def overlap(a, b):
        return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]

    assert not overlap("gpu-a", "gpu-b")
    assert overlap("cpu", "gpu-a") or overlap("cpu", "gpu-b")
    # auto found no CUDA in the process (a fake GPU), so it trained on the CPU
    assert RunFolder(out / "gpu-a").config()["device"] == "auto"


def test_a_failed_step_stops_what_reads_it_and_the_rest_finishes(tmp_path):
    path = write_pipeline(tmp_path, STEPS_WITH_A_FAILURE)
    with pytest.raises(StepsFailed) as failed:
        run_pipeline(path, log=lambda _: None, jobs=2)
    message = str(failed.value)
    assert "1 step(s) failed, 1 not run" in message
    assert f"bad: Error: {tmp_path / 'out' / 'world' / 'missing.jsonl'}" in message
    assert f"(log: {tmp_path / 'out' / 'bad' / 'log.txt'})" in message
    assert "after-bad: not run, it reads bad" in message
    assert step_record(tmp_path / "out", "fine")["done"] and not (tmp_path / "out" / "after-bad").exists()
    assert failed.value.exit_status == 2

    rows = {row.step: row for row in executor_named("local").status(load_pipeline(path))}
    assert rows["world"].state == rows["fine"].state == "done"
    assert rows["bad"].state == "failed" and "missing.jsonl" in rows["bad"].detail
    assert rows["after-bad"].state == "not run" and rows["after-bad"].detail == "it reads bad, which failed"
    shown = CliRunner().invoke(main, ["pipeline", "status", str(path)])
    assert shown.exit_code == 0 and shown.output.splitlines() == [
        "world      done", f"bad        failed: {rows['bad'].detail} (log: {tmp_path / 'out' / 'bad' / 'log.txt'})",
        "after-bad  not run: it reads bad, which failed",
        "fine       done"]
    assert CliRunner().invoke(main, ["pipeline", "cancel", str(path)]).output == (
        f"{tmp_path / 'out'}: no run of this pipeline is going on\n")


def test_shards_and_ddp_processes_run_as_processes_of_one_step(tiny_world, tmp_path):
    steps = [{"name": "sharded", "kind": "extract", "images": str(tiny_world / "world"), "detector": "tiny",
              "batch_size": 4, "progress": False, "shards": 2},
             train_step_on(tiny_world, "ddp", devices=2, seed=3)]
    out = run_pipeline(write_pipeline(tmp_path, steps), log=lambda _: None, jobs=None, threads=1)
    with FeatureStore(out / "sharded") as sharded, FeatureStore(tiny_world / "cache") as whole:
        assert len(sharded.shards) == 2 and sorted(sharded.keys()) == sorted(whole.keys())
        key = whole.keys()[0]
        assert np.array_equal(sharded[key]["features"], whole[key]["features"])
    assert step_record(out, "sharded")["done"] and "every shard complete" in (out / "sharded" / "log.txt").read_text()
    assert step_record(out, "ddp")["processes"] == 2
    assert RunFolder(out / "ddp").last_stage().done


def test_set_values_name_steps_and_append_stages(tiny_world, tmp_path):
    path = write_pipeline(tmp_path, [{"name": "vocab", "kind": "vocabulary", "world": str(tiny_world / "world")},
                            train_step_on(tiny_world, "finetune")])
    pipeline = load_pipeline(path, {"finetune.vocabulary": "${vocab}",
                                    "finetune.stages+": {"name": "e2e", "task": "vqa", "steps": 1, "visual": "end2end"}})
    finetune = pipeline.steps[1]
    assert finetune.params["vocabulary"] == str(tmp_path / "out" / "vocab")
    assert list(finetune.reads) == ["vocab"]
    assert [stage["name"] for stage in finetune.params["stages"]] == ["vqa", "e2e"]


@pytest.fixture(scope="module")
def long_step(tiny_world, tmp_path_factory):
    """A train step long enough to be stopped midway (its DataLoader workers with it), checkpointing only
    when stopped, and the final weights of its uninterrupted run."""
    step = train_step_on(tiny_world, "long", steps=80)
    step["stages"][0].update(checkpoint_minutes=0, num_workers=2)
    folder = tmp_path_factory.mktemp("straight")
    with configured_threads(1):
        straight = run_pipeline(write_pipeline(folder, [step]), log=lambda _: None, jobs=1)
    return step, (RunFolder(straight / "long").last_stage().final / "model.safetensors").read_bytes()


# How a run is stopped: the signal, sent to the scheduler alone or to its whole process group (as Ctrl-C
# on a terminal does), with the steps forked (the default) or run in the scheduler's process (--jobs 1).
STOPS = [pytest.param(signal.SIGINT, "scheduler", [], id="int-scheduler"),
         pytest.param(signal.SIGINT, "group", ["--jobs", "1"], id="int-group-jobs1"),
         pytest.param(signal.SIGTERM, "scheduler", [], id="term-scheduler", marks=pytest.mark.slow),
         pytest.param(signal.SIGINT, "group", [], id="int-group", marks=pytest.mark.slow),
         pytest.param(signal.SIGINT, "scheduler", ["--jobs", "1"], id="int-scheduler-jobs1", marks=pytest.mark.slow)]


@pytest.mark.parametrize("signum, receiver, jobs", STOPS)
def test_a_stopped_run_checkpoints_each_training_step_and_a_rerun_resumes_it_to_the_uninterrupted_weights(
        long_step, tmp_path, signum, receiver, jobs):
    step, straight = long_step
    path = write_pipeline(tmp_path, [step])
    out, inline_progress = tmp_path / "out", tmp_path / "progress.json"
    progress = inline_progress if jobs else out / "long" / ".progress.json"
    with (tmp_path / "run.log").open("w") as output:
        command = [sys.executable, "-m", "pipelines", "pipeline", "run", str(path), "--threads", "1", *jobs]
        run = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, PROGRESS_VARIABLE: str(inline_progress)})
    deadline = time.monotonic() + 180
    while not (progress.is_file() and json.loads(progress.read_text())["n"] >= 1) and time.monotonic() < deadline:
        assert run.poll() is None, (tmp_path / "run.log").read_text()
        time.sleep(0.05)
    if receiver == "group":
        os.killpg(run.pid, signum)
    else:
        run.send_signal(signum)
    assert run.wait(timeout=180) == 128 + signum
    said, log = (tmp_path / "run.log").read_text(), (out / "long" / "log.txt").read_text()
    step_signal = signum if jobs else signal.SIGTERM  # what the scheduler stops its step processes with
    stopped = re.search(rf"^\[long\] {re.escape(str(out / 'long'))}: stage vqa, step (\d+) \(checkpoint-\1 written\): "
                        rf"stopped by {step_signal.name}; rerun to resume from there", said, re.MULTILINE)
    assert stopped and "Traceback" not in said + log, said + log
    ending = "Interrupted." if signum == signal.SIGINT else "Error: stopped by SIGTERM: the running steps were stopped"
    assert said.splitlines()[-1].startswith(ending)
    stage = RunFolder(out / "long").stage(0, "vqa")
    assert stage.checkpoints() == [stage.checkpoint(int(stopped.group(1)))] and not stage.done
    assert not step_record(out, "long")["done"] and read_state(out)["steps"]["long"]["state"] == "stopped"

    messages = []
    with configured_threads(1):
        run_pipeline(path, log=messages.append, jobs=1)
    assert step_record(out, "long")["done"] and "[long] resuming an interrupted run" in messages
    assert (stage.final / "model.safetensors").read_bytes() == straight


@pytest.fixture(scope="module")
def ddp_step(tiny_world, tmp_path_factory):
    """`long_step` as two DDP processes, and the final weights of its uninterrupted run."""
    step = train_step_on(tiny_world, "long", steps=80, devices=2)
    step["stages"][0].update(checkpoint_minutes=0)
    straight = run_pipeline(write_pipeline(tmp_path_factory.mktemp("straight-ddp"), [step]), log=lambda _: None,
                            jobs=1, threads=1)
    return step, (RunFolder(straight / "long").last_stage().final / "model.safetensors").read_bytes()


@pytest.mark.parametrize("training", ["long_step", pytest.param("ddp_step", marks=pytest.mark.slow)])
def test_a_scheduler_killed_outright_from_a_folder_holding_train_py_ends_its_steps_and_a_rerun_resumes_them(
        training, request, tmp_path):
    """`vlbert pipeline run` from a research repository's root (its own train.py and extract.py there):
    a light step (a command) and the training (forked from the server, or DDP ranks under torch's
    launcher) import the project's packages; the run killed outright, the training's processes stop
    with it (a checkpoint written), and a rerun resumes at once to the weights of an uninterrupted run."""
    step, straight = request.getfixturevalue(training)
    path = write_pipeline(tmp_path, [{"name": "world", "kind": "world", "images": 3, "seed": 1}, step])
    out, folder = tmp_path / "out", tmp_path / "research"
    folder.mkdir()
    for script in ("train.py", "extract.py"):
        (folder / script).write_text("raise SystemExit(\"a research repository's own script\")\n")
    with (tmp_path / "run.log").open("w") as output:
        run = subprocess.Popen([str(Path(sys.executable).with_name("vlbert")), "pipeline", "run", str(path),
                                "--threads", "1"], cwd=folder, stdout=output, stderr=subprocess.STDOUT,
                               start_new_session=True)
    progress, deadline = out / "long" / ".progress.json", time.monotonic() + 180
    while not (progress.is_file() and json.loads(progress.read_text())["n"] >= 1) and time.monotonic() < deadline:
        assert run.poll() is None, (tmp_path / "run.log").read_text()
        time.sleep(0.05)
    run.kill()
    run.wait()
    assert "failed" not in (tmp_path / "run.log").read_text()  # the world step (done, or stopped with the run)
    recorded = {int(pid): identity for entry in read_state(out)["steps"].values()
                for pid, identity in entry["processes"].items() if identity}
    while any(process_identity(pid) == identity for pid, identity in recorded.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid, identity in recorded.items() if process_identity(pid) == identity] == []
    log = (out / "long" / "log.txt").read_text()
    assert re.search(r"stage vqa, step (\d+) \(checkpoint-\1 written\): stopped by SIGTERM", log), log

    messages = []
    with configured_threads(1):
        run_pipeline(path, log=messages.append, jobs=1)
    said = "\n".join(messages) + (out / "long" / "log.txt").read_text()  # DDP ranks: in the step's log
    assert step_record(out, "world")["done"] and "resuming an interrupted run" in said, said
    assert (RunFolder(out / "long").last_stage().final / "model.safetensors").read_bytes() == straight


@pytest.mark.cuda
def test_independent_gpu_steps_run_one_per_gpu_and_none_on_a_gpu_another_holds(tiny_world, tmp_path):
    import torch

    gpus = [str(index) for index in range(torch.cuda.device_count())]
    names = [f"gpu-{index}" for index in range(len(gpus) + 1)]  # one more than the GPUs: it waits for one
    steps = [train_step_on(tiny_world, name, device="cuda") for name in names]
    out = run_pipeline(write_pipeline(tmp_path, steps), log=lambda _: None, jobs=None, threads=1)
    launched = read_state(out)["steps"]
    for first in names:
        for second in names:
            overlap = launched[first]["started"] < launched[second]["ended"] and \
                launched[second]["started"] < launched[first]["ended"]
            if first != second and overlap:
                assert step_record(out, first)["devices"] != step_record(out, second)["devices"]
    assert {step_record(out, name)["devices"] for name in names} == set(gpus)
    with pytest.raises(UserError, match=r"device cuda:0: steps side by side are each given their GPUs"):
        run_pipeline(write_pipeline(tmp_path, [train_step_on(tiny_world, "indexed", device="cuda:0")], "indexed.yaml"),
                     log=lambda _: None, jobs=None)


def _describe_process(arguments: list[str]) -> None:
    """A forked command for the test below: what its process looks like, then the exit status asked for."""
    import multiprocessing
    import os

    print(json.dumps({"start_method": multiprocessing.get_start_method(), "session": os.getsid(0) == os.getpid(),
                      "variable": os.environ.get("VLBERT_TEST_VARIABLE"), "inherited": "HOME" in os.environ}))
    raise SystemExit(int(arguments[0]))


@pytest.fixture(scope="module")
def fork_server():
    """The fork server that the tests using it start, stopped after them: a process that later tests
    fork must not inherit its pipe (stopping it would then wait for that process)."""
    yield
    shut_down()


@pytest.mark.parametrize("status", [0, 3])
def test_a_forked_step_process_has_its_session_environment_log_and_exit_status_and_starts_workers_as_a_command(
        tmp_path, status, fork_server):
    import multiprocessing

    log = tmp_path / "log.txt"
    log.write_text("before\n")
    process = ForkedProcess([str(status)], {"VLBERT_TEST_VARIABLE": "given"}, log, command=_describe_process)
    assert process.wait() == status and process.returncode == status
    before, described = log.read_text().splitlines()
    # the step's workers (DataLoader, decoding) start by this platform's default, not by a new forkserver
    assert before == "before" and json.loads(described) == {
        "start_method": multiprocessing.get_all_start_methods()[0], "session": True, "variable": "given",
        "inherited": False}
