"""submitit against the real two-node Slurm of the `slurm_cluster` fixture: what an executor builds on
(plain jobs, tasks on both nodes, DDP task ranks, arrays, afterok chains, checkpoint and requeue,
preemption).

Measured on the 2-core CI machine (Slurm 22.05.8, submitit 1.5.4, load average 4-8 from neighbours):
the cluster starts in 0.5-1.3 s once the packages are there (1.2-1.3 s with its two slurmd; the first
run here installed them and started in under 7 s); a job runs about 1 s after sbatch. Cases: plain
job 2-3 s, 2 tasks 1-4 s, array of 3 3-6 s, the afterok pair and the blocked dependency 9-11 s,
signal and requeue 14-15 s (a requeued job waits cred_expire=10 s; 120 s on a stock Slurm),
preemption 34-36 s (slurmctld kills a preempted job at its next 30 s check after GraceTime); the
module 68-77 s in all.
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import submitit

from tests.helpers.slurm import NODE_ADDRESS, Daemon, running_slurm, slurm_commands_or_skip, wait_for_daemons

JOB_TIMEOUT_S = 90
ROOT = Path(__file__).resolve().parents[2]


def executor(cluster, folder: Path, **parameters) -> submitit.AutoExecutor:
    """Jobs unpickle this module's functions by name: the repository root goes on their path, from
    whatever folder pytest runs in."""
    jobs = submitit.AutoExecutor(folder=folder, cluster="slurm")
    jobs.update_parameters(**{"slurm_partition": cluster.partition, "timeout_min": 5, "cpus_per_task": 1,
                              "slurm_setup": [f'export PYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}"'],
                              **parameters})
    return jobs


def wait_done(job: submitit.Job) -> None:
    """job.result() waits forever for a job that ends without a result (sacct is off): bound it."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not job.done():
        if time.monotonic() > deadline:
            pytest.fail(f"job {job.job_id} not done after {JOB_TIMEOUT_S} s; squeue: {squeue(job.job_id)!r}; "
                        f"stderr:\n{job.stderr()}")
        time.sleep(0.5)


def squeue(job_id: str) -> str:
    """'STATE REASON' of a job Slurm still lists, '' once it has left the queue."""
    listing = subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T %r"],
                             capture_output=True, text=True)
    return listing.stdout.strip()


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {JOB_TIMEOUT_S} s for {what}")
        time.sleep(0.2)


def write_and_double(path: str, value: int) -> dict:
    Path(path).write_text(str(value))
    return {"double": 2 * value, "cwd": os.getcwd(),
            **{name: os.environ.get(name) for name in ("SLURM_CONF", "SLURM_JOB_ID")}}


def test_plain_job_returns_its_value_and_writes_a_file(slurm_cluster, tmp_path):
    job = executor(slurm_cluster, tmp_path / "jobs").submit(write_and_double, str(tmp_path / "out.txt"), 21)
    wait_done(job)
    result = job.result()
    assert result["double"] == 42
    assert (tmp_path / "out.txt").read_text() == "21"
    # The job runs where it was submitted, in the submitting environment: its own Slurm commands
    # (submitit's requeue) find this cluster.
    assert result["cwd"] == os.getcwd()
    assert result["SLURM_CONF"] == str(slurm_cluster.conf)
    assert result["SLURM_JOB_ID"] == job.job_id
    assert job.paths.stdout.exists() and job.paths.stderr.exists()


def test_a_job_of_two_nodes_runs_a_task_on_each_and_their_names_resolve_as_no_hosts(slurm_cluster, tmp_path):
    first, second = slurm_cluster.nodes
    ran = subprocess.run(["srun", "--nodes=2", "--ntasks=2", "--output=none", "bash", "-c",
                          f"echo $SLURM_PROCID $SLURMD_NODENAME > {tmp_path}/$SLURM_PROCID.txt"],
                         capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert ran.returncode == 0, ran.stderr
    assert [(tmp_path / f"{rank}.txt").read_text().split() for rank in (0, 1)] == [["0", first], ["1", second]]
    for node in slurm_cluster.nodes:
        with pytest.raises(socket.gaierror):  # as on sites whose node names are not host names
            socket.getaddrinfo(node, None)
        shown = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, check=True)
        assert f"NodeAddr={NODE_ADDRESS} " in shown.stdout


def task_ranks() -> dict:
    names = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "CUDA_VISIBLE_DEVICES")
    from_slurm = {name: os.environ.get(name) for name in names}
    submitit.helpers.TorchDistributedEnvironment().export()
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
    return {"slurm": from_slurm, "torch": {name: os.environ.get(name) for name in names}}


def test_two_tasks_are_ranks_0_and_1_of_2(slurm_cluster, tmp_path):
    jobs = executor(slurm_cluster, tmp_path / "jobs", tasks_per_node=2, gpus_per_node=2)
    job = jobs.submit(task_ranks)
    wait_done(job)
    ranks = job.results()
    assert [task["slurm"] for task in ranks] == [
        {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank), "CUDA_VISIBLE_DEVICES": "0,1"}
        for rank in (0, 1)]
    torch_env = [task["torch"] for task in ranks]
    assert [(task["RANK"], task["WORLD_SIZE"], task["LOCAL_RANK"]) for task in torch_env] == [
        ("0", "2", "0"), ("1", "2", "1")]
    assert [task["CUDA_VISIBLE_DEVICES"] for task in torch_env] == ["0", "1"]
    # submitit's: the first node's name, which no host table knows here (the executor asks Slurm for its address)
    assert torch_env[0]["MASTER_ADDR"] == torch_env[1]["MASTER_ADDR"] == slurm_cluster.nodes[0]
    assert torch_env[0]["MASTER_PORT"] == torch_env[1]["MASTER_PORT"]


def square(value: int) -> tuple[int, str]:
    return value * value, os.environ["SLURM_ARRAY_TASK_ID"]


def test_array_results_come_back_in_order(slurm_cluster, tmp_path):
    jobs = executor(slurm_cluster, tmp_path / "jobs", slurm_array_parallelism=3)
    array = jobs.map_array(square, [3, 1, 2])
    first_id = array[0].job_id.split("_")[0]
    assert [job.job_id for job in array] == [f"{first_id}_{index}" for index in range(3)]
    for job in array:
        wait_done(job)
    assert [job.result() for job in array] == [(9, "0"), (1, "1"), (4, "2")]


def write_after(path: str, seconds: float) -> None:
    time.sleep(seconds)
    Path(path).write_text("first")


def read_marker(path: str) -> str:
    return Path(path).read_text()


def fail() -> None:
    raise ValueError("this job fails")


@pytest.mark.slow  # the executor's tests submit after failed jobs (tests/pipelines/test_slurm_executor.py)
def test_afterok_waits_for_success_and_never_starts_after_a_failure(slurm_cluster, tmp_path):
    marker = tmp_path / "first.txt"
    first = executor(slurm_cluster, tmp_path / "jobs").submit(write_after, str(marker), 3)
    second = executor(slurm_cluster, tmp_path / "jobs",
                      slurm_additional_parameters={"dependency": f"afterok:{first.job_id}"}).submit(
        read_marker, str(marker))
    wait_for(lambda: squeue(second.job_id) == "PENDING Dependency", "the second job to wait on the first")
    wait_done(second)
    assert second.result() == "first"

    failing = executor(slurm_cluster, tmp_path / "jobs").submit(fail)
    blocked_marker = tmp_path / "blocked.txt"
    blocked = executor(slurm_cluster, tmp_path / "jobs",
                       slurm_additional_parameters={"dependency": f"afterok:{failing.job_id}"}).submit(
        write_after, str(blocked_marker), 0)
    wait_done(failing)
    with pytest.raises(Exception, match="this job fails"):
        failing.result()
    # Without kill_invalid_depend Slurm keeps the dependent job pending for ever: whoever waits on
    # it must read squeue's reason and cancel it.
    wait_for(lambda: squeue(blocked.job_id) == "PENDING DependencyNeverSatisfied", "the blocked job's reason")
    wait_for(lambda: squeue(failing.job_id).startswith("FAILED"), "the failed job's state")
    blocked.cancel()
    wait_for(lambda: squeue(blocked.job_id).startswith("CANCELLED"), "the blocked job to be cancelled")
    assert not blocked.done()  # no result, no sacct: submitit cannot tell it ended
    assert not blocked_marker.exists()


def run_counted(counter: str) -> int:
    """Counts a job's runs in a file; the first run waits (for a signal, a preemption), a later
    one returns its number at once."""
    path = Path(counter)
    runs = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(runs))
    if runs == 1:
        time.sleep(JOB_TIMEOUT_S)
    return runs


class CountedRuns(submitit.helpers.Checkpointable):
    """Checkpointable's checkpoint resubmits the same call."""

    def __call__(self, counter: str) -> int:
        return run_counted(counter)


@pytest.mark.slow  # the executor's requeue test does this with a training step (tests/pipelines/test_slurm_executor.py)
def test_a_signalled_checkpointable_job_is_requeued_and_finishes_on_its_second_run(slurm_cluster, tmp_path):
    counter = tmp_path / "runs.txt"
    job = executor(slurm_cluster, tmp_path / "jobs").submit(CountedRuns(), str(counter))
    wait_for(lambda: counter.exists(), "the first run to start")
    # submitit's own drill (Job._interrupt): SIGTERM, which it only logs, then USR2, the signal that
    # Slurm sends signal_delay_s before the time limit (--signal=USR2@90), on which it checkpoints.
    for signal_name in ("TERM", "USR2"):
        sent = subprocess.run(["scancel", f"--signal={signal_name}", job.job_id], capture_output=True, text=True)
        assert sent.returncode == 0, sent.stderr
    wait_done(job)
    assert job.result() == 2
    assert counter.read_text() == "2"


def count_runs_noting_sigterm(counter: str, terms: str) -> int:
    """`run_counted`, with its own SIGTERM handler that notes the signal (submitit's only logs it),
    as a training step must, to checkpoint before a preemption's kill."""
    def note(signum, frame):
        with open(terms, "a") as noted:
            noted.write("TERM\n")

    signal.signal(signal.SIGTERM, note)
    return run_counted(counter)


@pytest.mark.slow  # about 35 s: Slurm's preemption waits out its GraceTime and its 30 s check
def test_a_preempted_job_gets_sigterm_and_slurm_requeues_it(slurm_cluster, tmp_path):
    counter, terms = tmp_path / "runs.txt", tmp_path / "terms.txt"
    # the urgent partition's node, whole: the urgent job finds no room but by preempting it
    whole_node = {"cpus_per_task": slurm_cluster.cpus,
                  "slurm_additional_parameters": {"nodelist": slurm_cluster.nodes[0]}}
    job = executor(slurm_cluster, tmp_path / "jobs", **whole_node).submit(
        count_runs_noting_sigterm, str(counter), str(terms))
    wait_for(lambda: counter.exists(), "the first run to start")
    urgent = executor(slurm_cluster, tmp_path / "jobs", slurm_partition=slurm_cluster.urgent_partition,
                      **whole_node).submit(read_marker, str(counter))
    wait_done(urgent)
    assert urgent.result() == "1"  # it ran between the preempted job's two runs
    wait_done(job)
    assert job.result() == 2
    assert terms.read_text().startswith("TERM\n")

def test_a_second_cluster_beside_the_first_keeps_to_itself(slurm_cluster, tmp_path):
    seen = tmp_path / "conf.txt"
    with running_slurm(nodes=("n1",)) as second:  # a node of the same name, in a cluster of its own
        assert os.environ["SLURM_CONF"] == str(second.conf) != str(slurm_cluster.conf)
        subprocess.run(["sbatch", "--wait", "--output=/dev/null", "--wrap", f"echo $SLURM_CONF > {seen}"], check=True)
    assert seen.read_text().strip() == str(second.conf)
    assert not second.folder.exists()
    assert os.environ["SLURM_CONF"] == str(slurm_cluster.conf)
    node = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%T"], capture_output=True, text=True, check=True)
    assert set(node.stdout.split()) == {"idle"}  # in each partition


def test_a_daemon_that_dies_at_start_is_an_error_carrying_its_log(tmp_path):
    log = tmp_path / "slurmd.log"
    log.write_text("slurmd: fatal: Unable to determine this slurmd's NodeName\n")
    daemon = Daemon("slurmd", subprocess.Popen(["sh", "-c", "exit 3"]), (log,))
    with pytest.raises(RuntimeError, match="(?s)slurmd exited with status 3.*Unable to determine"):
        wait_for_daemons(lambda: False, "the node", [daemon])


def test_without_root_the_cluster_is_skipped_saying_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        slurm_commands_or_skip()
