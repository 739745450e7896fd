"""A train step across the two nodes of the `slurm_cluster` fixture (tests/helpers/slurm.py), whose
names resolve as no host's: its ranks meet where Slurm says, each rank's node is recorded, and it
survives a node lost (Slurm requeues it), Slurm's warning before a time limit (it checkpoints and
requeues itself) and a rank killed (it fails in bounded time, naming the rank; a rerun resumes),
ending bitwise as the uninterrupted run of two ranks on one machine and on one Slurm node. The ranks'
rendezvous fails in one line when it cannot be reached.

Each job start costs ~10 s of imports on 2 busy cores: the two-node run is the interrupted one (four
starts), compared with the two uninterrupted ones, which run side by side.
"""

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pipelines.executors import executor_named
from pipelines.executors.base import CannotRun
from pipelines.runner import load_run, run_pipeline
from tests.helpers.pipelines import step_record, train_step_on, write_pipeline
from tests.pipelines.test_slurm_executor import settings, states_until_settled
from train.engine.distributed import RendezvousError, World, rendezvous
from train.engine.run_folder import RunFolder

SLURM = executor_named("slurm")
STEPS = 80  # a few seconds of training: time to lose a node, warn and kill a rank before the stage ends
CHECKPOINT_EVERY = 5
TIMEOUT_S = 240  # for anything a job does on 2 busy cores (imports alone take ~10 s)


def training(world: Path, name: str, **layout) -> dict:
    """The train step of every run here (with one thread per rank, `--threads 1`): a checkpoint every 5 steps."""
    step = train_step_on(world, name, steps=STEPS, **layout)
    step["stages"][0]["checkpoint_every"] = CHECKPOINT_EVERY
    return step


def wait_for(condition, what: str):
    deadline = time.monotonic() + TIMEOUT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {TIMEOUT_S} s for {what}")
        time.sleep(0.2)
    return value


def stage_of(out: Path, step: str):
    return RunFolder(out / step).stage(0, "vqa")


def outputs(stage) -> dict[str, bytes]:
    """What a stage's results are, file by file: final weights, predictions, item scores."""
    files = [stage.final / "model.safetensors", *sorted(stage.predictions_folder.iterdir()),
             *sorted(stage.item_scores("val").parent.iterdir())]
    return {path.relative_to(stage.path).as_posix(): path.read_bytes() for path in files}


@pytest.fixture(scope="module")
def uninterrupted(slurm_cluster, tiny_world, tmp_path_factory) -> dict[str, Path]:
    """The train step with two ranks, one thread each, on one Slurm node (submitted first) and on this
    machine (the local executor, while the job runs): each one's output folder."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    (folder / "local").mkdir()
    on_slurm = write_pipeline(folder, [training(tiny_world, "one-node", devices=2)])
    slurm_out = run_pipeline(on_slurm, log=lambda _: None, settings=settings(slurm_cluster), executor="slurm",
                             threads=1)
    local = write_pipeline(folder / "local", [training(tiny_world, "local", devices=2)])
    local_out = run_pipeline(local, log=lambda _: None, jobs=None, threads=1, wait=True)  # it waits anyway
    seen = states_until_settled(load_run(on_slurm), TIMEOUT_S)
    assert seen["one-node"][-1] == "done", seen
    return {"local": local_out / "local", "one node": slurm_out / "one-node"}


def test_two_ranks_train_bitwise_alike_on_one_machine_and_on_one_slurm_node_and_say_where_they_ran(uninterrupted):
    local, one_node = (outputs(RunFolder(out).stage(0, "vqa")) for out in uninterrupted.values())
    assert local.keys() == one_node.keys() and len(local) >= 3  # final weights, predictions, item scores
    for name in local:
        assert local[name] == one_node[name], name
    host = socket.gethostname()
    assert RunFolder(uninterrupted["local"]).world()["ranks"] == [{"host": host}] * 2
    on_slurm = step_record(uninterrupted["one node"].parent, "one-node")
    assert on_slurm["ranks"] == [{"host": host, "node": on_slurm["ranks"][0]["node"]}] * 2
    assert on_slurm["threads"] == 1 and on_slurm["processes"] == 2


def test_threads_is_cpus_per_task_on_slurm_and_given_twice_is_refused(slurm_cluster, tmp_path):
    path = write_pipeline(tmp_path, [{"name": "world", "kind": "world", "images": 3, "seed": 1}])
    with pytest.raises(CannotRun, match=r"--threads 1 and slurm.cpus_per_task 2: on Slurm --threads is cpus_per_task; "
                                        r"give one of them$"):
        run_pipeline(path, log=lambda _: None, settings={**settings(slurm_cluster), "slurm.cpus_per_task": 2},
                     executor="slurm", threads=1)
    assert not (tmp_path / "out").exists()
    out = run_pipeline(path, log=lambda _: None, settings=settings(slurm_cluster), executor="slurm", threads=2)
    assert states_until_settled(load_run(path), TIMEOUT_S)["world"][-1] == "done"
    assert step_record(out, "world")["threads"] == 2  # the job's CPUs and its process's threads


def task_pid(job: str, rank: int) -> int:
    """The process of the job's task `rank` (submitit's, which runs the step)."""
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (f"SLURM_JOB_ID={job}".encode() in environ and f"SLURM_PROCID={rank}".encode() in environ
                and b"submitit.core._submit" in command):
            return int(entry.name)
    return 0


def checkpoint_after(stage, step: int) -> int:
    """The step of the stage's newest complete checkpoint if it is later than `step`, else 0."""
    latest = stage.latest_checkpoint()
    number = int(latest.name.rpartition("-")[2]) if latest else 0
    return number if number > step else 0


def resumed_at(text: str) -> list[int]:
    """The step each attempt in a step's log resumed its stage from."""
    return [int(step) for step in re.findall(r"resuming from \S+ \(step (\d+)\)", text)]


def test_a_lost_node_and_a_warning_requeue_the_job_a_killed_rank_fails_it_and_a_rerun_ends_as_uninterrupted(
        uninterrupted, slurm_cluster, tiny_world, tmp_path):
    path = write_pipeline(tmp_path, [training(tiny_world, "two-nodes", nodes=2)])
    out = run_pipeline(path, log=lambda _: None, settings=settings(slurm_cluster), executor="slurm", threads=1)
    pipeline, stage, log = load_run(path), stage_of(out, "two-nodes"), out / "two-nodes" / "log.txt"

    def row(state: str):
        shown = SLURM.status(pipeline)[0]
        return shown if shown.state == state else None

    # A node lost mid-run: Slurm ends the job on both nodes and requeues it (it was submitted --requeue).
    wait_for(lambda: checkpoint_after(stage, 0), "a first checkpoint")
    assert not stage.done, "the stage ended before a node could be lost"
    subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=lost in a test"], check=True)
    waiting = wait_for(lambda: row("queued"), "the requeued job")
    assert waiting.detail.startswith("requeued after a node failure (n2), attempt 2 ("), waiting.detail
    # What rank 0 leaves when its node dies while it writes a checkpoint: never resumed from, swept
    half = stage.path / f"checkpoint-{STEPS - CHECKPOINT_EVERY}.tmp"
    half.mkdir()
    (half / "model.safetensors").write_bytes((stage.latest_checkpoint() / "model.safetensors").read_bytes()[:100])
    subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True)  # where still down

    # Slurm's warning before the time limit or a preemption (submitit's USR2): every rank stops at one
    # step, rank 0 writes its checkpoint (the others wait for it) and requeues the job.
    second = wait_for(lambda: resumed_at(log.read_text()), "the second attempt to resume")[0]
    assert re.search(r"\[two-nodes\] rank 1 of 2 on node n2 \(host \S+\), job \d+, attempt 2", log.read_text())
    running = wait_for(lambda: row("running"), "the requeued job running")
    assert running.detail.startswith("requeued after a node failure (n2), attempt 2"), running.detail
    wait_for(lambda: checkpoint_after(stage, second), "a checkpoint of the second attempt")
    (job,) = json.loads((out / ".pipeline" / "state.json").read_text())["steps"]["two-nodes"]["jobs"]
    subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    assert wait_for(lambda: row("queued"), "the job requeued by itself").detail.startswith("requeued, attempt 3 (")
    assert log.read_text().count("stopped by SIGUSR2") == 2  # each rank said so

    # One rank killed: srun ends the other at once (no collective waits out its timeout); the step fails.
    third = wait_for(lambda: resumed_at(log.read_text())[1:], "the third attempt to resume")[0]
    wait_for(lambda: checkpoint_after(stage, third), "a checkpoint of the third attempt")
    os.kill(wait_for(lambda: task_pid(job, 1), "rank 1's process"), signal.SIGKILL)
    failed = wait_for(lambda: row("failed"), "the job to end")
    assert failed.detail == "rank 1 on node n2: Killed (srun), so Slurm ended the other ranks"
    last = checkpoint_after(stage, 0)

    # A rerun resumes from the last complete checkpoint and ends as the uninterrupted run did.
    run_pipeline(path, log=lambda _: None, settings=settings(slurm_cluster), executor="slurm", threads=1)
    assert states_until_settled(pipeline, TIMEOUT_S)["two-nodes"][-1] == "done"
    text = log.read_text()
    assert resumed_at(text) == [second, third, last] and second < third < last < STEPS - CHECKPOINT_EVERY
    assert f"removed what an interrupted write left in {out / 'two-nodes'}: stages/0-vqa/{half.name}" in text
    assert outputs(stage) == outputs(stage_of(uninterrupted["local"].parent, "local"))
    ranks = [{"host": socket.gethostname(), "node": node} for node in slurm_cluster.nodes]
    record = step_record(out, "two-nodes")
    assert record["ranks"] == RunFolder(out / "two-nodes").world()["ranks"] == ranks and record["threads"] == 1
    met = text.partition("stage vqa: starting at step 0")[0]  # the first attempt, until its ranks met
    assert "rank 1 of 2 on node n2" in met and "Traceback" not in met and "c10d" not in met


def test_a_rendezvous_that_cannot_be_reached_fails_in_one_line_naming_address_port_and_node(tmp_path):
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    met = tmp_path / "rendezvous.json"
    met.write_text(json.dumps({"address": "127.0.0.1", "port": port, "node": "n1"}))
    with pytest.raises(RendezvousError, match=fr"^rendezvous at 127.0.0.1:{port} \(rank 0's node n1\): not reached "
                                              r"from rank 1 in 1 s \(Connection refused\)$"):
        rendezvous(World(1, 2), met, timeout_s=1)
    with pytest.raises(RendezvousError, match=r"rank 0 did not say where the ranks meet within 1 s"):
        rendezvous(World(1, 2), tmp_path / "never-written.json", timeout_s=1)
    with pytest.raises(RendezvousError, match=r": 0 of the 1 other ranks came within 1 s$"):
        rendezvous(World(0, 2), tmp_path / "rank-0.json", timeout_s=1)
    assert json.loads((tmp_path / "rank-0.json").read_text())["port"] > 0  # where it waited
