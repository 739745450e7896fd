"""The Slurm executor against a real two-node Slurm (tests/helpers/slurm.py): a pipeline as jobs after
the jobs they read, an extraction as a job array over both nodes equal to a local one, status through
queued, running and done, failures that cancel what reads them, resubmission and cancel. Training
across the two nodes: tests/pipelines/test_slurm_two_nodes.py."""

import json
import re
import subprocess
import time

import numpy as np
import pytest

from extract.store.reader import FeatureStore
from pipelines.executors import executor_named
from pipelines.executors.base import CannotRun, StepsFailed, read_state
from pipelines.runner import load_pipeline, load_run, run_pipeline
from pipelines.world.tiny import TINY_MODEL
from tests.helpers.pipelines import STEPS_WITH_A_FAILURE, write_pipeline
from train.engine.run_folder import RunFolder
from vlbert.utils.threads import configured_threads

SLURM = executor_named("slurm")


def settings(cluster) -> dict:
    return {"slurm.partition": cluster.partition, "slurm.time": 10}


def states_until_settled(pipeline, timeout_s: float = 240) -> dict[str, list[str]]:
    """Each step's states as `status` shows them, in order, polled every 0.1 s (as a user's loop might)
    until every step has settled."""
    seen: dict[str, list[str]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = SLURM.status(pipeline)
        for row in rows:
            if seen.setdefault(row.step, [])[-1:] != [row.state]:
                seen[row.step].append(row.state)
        if all(row.state in ("done", "failed", "cancelled", "not run") for row in rows):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"the pipeline did not settle in {timeout_s} s: {seen}")


def test_a_pipeline_runs_as_jobs_its_extraction_as_an_array_over_both_nodes_equal_to_one_local_extraction(
        slurm_cluster, tiny_world, tmp_path):
    steps = [{"name": "world", "kind": "world", "images": 12, "seed": 3},  # the tiny world's images
             {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "mask_variants": 2,
              "batch_size": 4, "progress": False, "shards": 4},  # 4 one-CPU tasks: more than a node's 2 CPUs
             {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
             {"name": "vqa", "kind": "train", "devices": 2,  # one job of two tasks: the DDP ranks, gloo on the CPU
              "store": "${cache}", "train_annotations": "${world}/train.jsonl",
              "eval_annotations": "${world}/val.jsonl", "vocabulary": "${vocabulary}", "max_length": 40,
              "model": dict(TINY_MODEL), "stages": [{"name": "vqa", "task": "vqa", "steps": 20, "batch_size": 4,
                                                     "num_workers": 0}]},
             {"name": "report", "kind": "report", "runs": ["${vqa}"]}]
    path = write_pipeline(tmp_path, steps)
    messages = []
    out = run_pipeline(path, log=messages.append, settings=settings(slurm_cluster), executor="slurm")
    assert any(m.startswith("[vqa] submitted: job ") and "(after " in m for m in messages)
    seen = states_until_settled(load_run(path))  # the settings the run recorded
    # never a word of failure (a done step called failed, those after it not run) in a run that succeeded
    assert all(set(states) <= {"queued", "running", "done"} and states[-1] == "done" for states in seen.values()), seen
    assert "running" in seen["vqa"] and seen["vqa"].index("running") < seen["vqa"].index("done")
    assert seen["report"][0] == "queued"  # it waited for the training's job

    with FeatureStore(out / "cache") as array, FeatureStore(tiny_world / "cache") as local:
        assert len(array.shards) == 4 and sorted(array.keys()) == sorted(local.keys())
        for key in local.keys():
            for name, value in local[key].items():
                assert np.array_equal(value, array[key][name]) if isinstance(value, np.ndarray) else value == array[key][name]
    record = json.loads((out / "vqa" / "step.json").read_text())
    assert record["done"] and record["executor"] == "slurm" and record["attempt"].startswith("SLURM_JOB_ID=")
    assert record["processes"] == 2 and RunFolder(out / "vqa").world()["size"] == 2
    jobs = read_state(out)["steps"]
    assert len(jobs["cache"]["jobs"]) == 2  # the array, then the job that checks its shards
    assert RunFolder(out / "vqa").last_stage().done and (out / "report" / "report.json").is_file()
    log = (out / "cache" / "log.txt").read_text()
    assert "every shard complete" in log
    placed = dict(re.findall(r"\[cache\] shard (\d) of 4 on node (n\d) ", log))
    assert sorted(placed) == ["0", "1", "2", "3"] and set(placed.values()) == set(slurm_cluster.nodes), placed

    messages.clear()
    run_pipeline(path, log=messages.append, settings=settings(slurm_cluster), executor="slurm")
    assert messages == [f"[{step['name']}] up to date" for step in steps]  # nothing submitted again


def test_a_failed_job_cancels_the_jobs_that_read_it_and_wait_names_it(slurm_cluster, tmp_path):
    path = write_pipeline(tmp_path, STEPS_WITH_A_FAILURE)
    with pytest.raises(StepsFailed) as failed:
        run_pipeline(path, log=lambda _: None, settings=settings(slurm_cluster), executor="slurm", wait=True)
    message = str(failed.value)
    assert "1 step(s) failed, 1 not run" in message and "missing.jsonl" in message
    assert "after-bad: not run, it reads bad, which failed" in message
    rows = {row.step: row for row in SLURM.status(load_pipeline(path, settings(slurm_cluster)))}
    assert rows["fine"].state == "done" and rows["bad"].state == "failed"
    assert rows["bad"].log == str(tmp_path / "out" / "bad" / "log.txt")


def test_queued_jobs_are_cancelled_and_unknown_slurm_settings_refused_before_submitting(slurm_cluster, tmp_path):
    steps = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
             {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]
    path = write_pipeline(tmp_path, steps, slurm={"partiton": "debug"})
    with pytest.raises(CannotRun, match=r"slurm.partiton: not a Slurm setting of submitit's SlurmExecutor "
                                            r"\(did you mean 'partition'\?\)"):
        run_pipeline(path, log=lambda _: None, executor="slurm")
    assert not (tmp_path / "out" / "world").exists()

    path = write_pipeline(tmp_path, steps)
    too_many = {"slurm.cpus_per_task": slurm_cluster.cpus + 1}
    with pytest.raises(CannotRun, match=fr"step 'world': 1 task\(s\) × cpus_per_task {slurm_cluster.cpus + 1}: "
                                        fr"partition 'debug' has at most {slurm_cluster.cpus} CPUs a node"):
        run_pipeline(path, log=lambda _: None, settings={**settings(slurm_cluster), **too_many}, executor="slurm")
    assert not (tmp_path / "out" / "world").exists()

    path = write_pipeline(tmp_path, steps, slurm={"additional_parameters": {"begin": "now+600"}})  # held for ten minutes
    run_pipeline(path, log=lambda _: None, settings=settings(slurm_cluster), executor="slurm")
    pipeline = load_pipeline(path, settings(slurm_cluster))
    assert [row.state for row in SLURM.status(pipeline)] == ["queued", "queued"]
    messages = []
    run_pipeline(path, log=messages.append, settings=settings(slurm_cluster), executor="slurm")
    assert messages[0].startswith("[world] already queued or running: job ")
    SLURM.cancel(pipeline, messages.append)
    assert messages[-1].startswith("cancelled job(s) ")
    deadline = time.monotonic() + 30
    while any(row.state == "queued" for row in SLURM.status(pipeline)) and time.monotonic() < deadline:
        time.sleep(0.5)
    rows = SLURM.status(pipeline)
    assert [row.state for row in rows] == ["cancelled", "not run"]
    assert rows[1].detail == "it reads world, which was cancelled"


# The two-node fault test (tests/pipelines/test_slurm_two_nodes.py) warns a training job the same way in CI; this
# single-node one stays for `-m slow`.
@pytest.mark.slow
def test_a_training_job_warned_by_slurm_checkpoints_requeues_and_ends_with_the_weights_of_an_uninterrupted_run(
        slurm_cluster, tiny_world, tmp_path):
    steps = [{"name": "long", "kind": "train", "store": str(tiny_world / "cache"),
              "train_annotations": str(tiny_world / "world" / "train.jsonl"),
              "eval_annotations": str(tiny_world / "world" / "val.jsonl"), "vocabulary": str(tiny_world / "vocab"),
              "max_length": 40, "model": dict(TINY_MODEL),
              "stages": [{"name": "vqa", "task": "vqa", "steps": 500, "batch_size": 4, "num_workers": 0,
                          "checkpoint_minutes": 0}]}]
    path = write_pipeline(tmp_path, steps)
    out = run_pipeline(path, log=lambda _: None, settings=settings(slurm_cluster), executor="slurm")
    (job,) = read_state(out)["steps"]["long"]["jobs"]
    snapshot, deadline = out / "long" / ".progress.json", time.monotonic() + 180
    while not (snapshot.is_file() and json.loads(snapshot.read_text())["n"] >= 3) and time.monotonic() < deadline:
        assert not json.loads((out / "long" / "step.json").read_text() if (out / "long" / "step.json").is_file()
                              else "{}").get("done"), "the job ended before it could be signalled"
        time.sleep(0.2)
    # What Slurm sends signal_delay_s before the time limit, or at a preemption (submitit's --signal)
    subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    seen = states_until_settled(load_pipeline(path, settings(slurm_cluster)))
    assert seen["long"][-1] == "done", seen
    log = (out / "long" / "log.txt").read_text()
    assert "stopped by SIGUSR2" in log and "[long] resuming an interrupted run" in log
    assert "resuming from" in log and json.loads((out / "long" / "step.json").read_text())["attempt"].endswith(".1")

    with configured_threads(1):  # as the job's one CPU
        straight = run_pipeline(path, tmp_path / "straight", log=lambda _: None, jobs=1)
    final = RunFolder(out / "long").last_stage().final / "model.safetensors"
    assert final.read_bytes() == (RunFolder(straight / "long").last_stage().final / "model.safetensors").read_bytes()
