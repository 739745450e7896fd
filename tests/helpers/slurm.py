"""A real Slurm for the tests: Debian's `slurm-wlm` and `munge` (installed with apt-get where missing,
as root), munged, slurmctld and one slurmd per node started on this host and stopped by pid.

A cluster of two nodes by default, `n1` and `n2`: one slurmd each (`slurmd -N NAME`, which Debian's
build allows: multiple-slurmd), each on a port of its own, both at 127.0.0.1 (`NodeAddr`). Their names
resolve as no host's (no host table is touched), as on the many sites whose node names are not host
names: whatever must reach a node asks Slurm for its address.

Everything the daemons open (munge socket, ports, state, spool, logs, pid files) is this cluster's
own, in a private folder or picked free at start, so a daemon left by an earlier session, or another
session's cluster, never collides with it. `SLURM_CONF` points sbatch, squeue, scancel, sinfo and
submitit at it while it runs; a job inherits it, so the Slurm commands a job runs find it too."""

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGES = ("slurm-wlm", "munge")
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"  # the daemons live here, outside many users' PATH
APT_LOCK_WAIT = "DPkg::Lock::Timeout=300"  # another session may be installing at the same time
MUNGE_KEY = Path("/etc/munge/munge.key")
PARTITION = "debug"  # every node
URGENT_PARTITION = "urgent"  # the first node; its jobs preempt the default partition's: SIGTERM, GraceTime, requeue
NODES = ("n1", "n2")
NODE_ADDRESS = "127.0.0.1"
# Two GPUs as gres backed by character devices that exist everywhere: Slurm hands them out to jobs
# (gpus_per_node) and sets CUDA_VISIBLE_DEVICES, so GPU placement is tested on a CPU-only machine.
FAKE_GPU_DEVICES = ("/dev/zero", "/dev/null")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 15
LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: its slurm.conf, its nodes, its partitions (the default one over every node,
    and an urgent one on the first node whose jobs preempt the default one's), each node's resources,
    and its folder (daemon logs: slurmctld.log, slurmd-NODE.log, munge/munged.log, and each daemon's
    NAME.out)."""

    folder: Path
    conf: Path
    nodes: tuple[str, ...]
    partition: str
    urgent_partition: str
    cpus: int  # each node's
    gpus: int  # each node's


@dataclass(frozen=True)
class Daemon:
    name: str
    process: subprocess.Popen
    logs: tuple[Path, ...]  # its log file, and the file its stdout and stderr go to

    def tail(self) -> str:
        parts = []
        for log in self.logs:
            if log.exists() and log.stat().st_size:
                lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                parts.append(f"--- {log} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(parts) or f"--- {self.name} wrote no log"

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def slurm_commands_or_skip() -> None:
    """Installs slurm-wlm and munge with apt-get where a command is missing; skips (the one reason
    to skip) where that cannot be done here: not root, or no apt-get."""
    path = os.environ.get("PATH", "") + ":" + SBIN_PATH
    missing = [name for name in COMMANDS if shutil.which(name, path=path) is None]
    if os.geteuid() != 0:
        pytest.skip("a Slurm test cluster needs root (munged runs as munge, slurmd as root)"
                    + (f"; missing: {' '.join(missing)}" if missing else ""))
    if not missing:
        return
    if shutil.which("apt-get") is None:
        pytest.skip(f"Slurm commands missing ({' '.join(missing)}) and no apt-get to install "
                    f"{' and '.join(PACKAGES)}")
    install = ["apt-get", "install", "-y", "-q", "-o", APT_LOCK_WAIT, "--no-install-recommends", *PACKAGES]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if _run(install, env).returncode != 0:  # usually: no package lists yet
        _checked(["apt-get", "update", "-q", "-o", APT_LOCK_WAIT], env)
        _checked(install, env)


def ensure_munge_key() -> None:
    """munged refuses a key that is not the munge user's, or that others may read."""
    if MUNGE_KEY.exists():
        return
    munge = pwd.getpwnam("munge")
    MUNGE_KEY.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(MUNGE_KEY.parent, munge.pw_uid, munge.pw_gid)
    descriptor = os.open(MUNGE_KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(descriptor, "wb") as key:
        key.write(os.urandom(1024))
    os.chown(MUNGE_KEY, munge.pw_uid, munge.pw_gid)


def node_memory_mb() -> int:
    """RealMemory a little under what slurmd measures: a node with less than its configured memory
    is drained."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 * 9 // 10
    raise RuntimeError("/proc/meminfo has no MemTotal line")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_config(folder: Path, munge_socket: Path, cpus: int, nodes: tuple[str, ...] = NODES) -> Path:
    """slurm.conf (and gres.conf) for `nodes`, all on this host, with every path inside `folder`."""
    (folder / "gres.conf").write_text(
        "".join(f"NodeName={node} Name=gpu File={device}\n" for node in nodes for device in FAKE_GPU_DEVICES))
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=vlbert-test",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={free_port()}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # A requeued job waits cred_expire seconds (120 by default) before it may start again.
        f"AuthInfo=socket={munge_socket},cred_expire=10",
        f"StateSaveLocation={folder / 'state'}",
        # %n: the node's name, so that the slurmd of each node keeps to its own files
        f"SlurmdSpoolDir={folder / 'spool-%n'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        # A job that becomes eligible with time (a requeued one) starts within seconds, not a minute.
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        "ReturnToService=2",
        "JobRequeue=1",
        # A finished job stays in squeue this long (slurmctld purges about once a minute).
        "MinJobAge=30",
        # SIGTERM to SIGKILL at a cancel or a time limit (30 s by default).
        "KillWait=5",
        "MailProg=/bin/true",
        "GresTypes=gpu",
        *(f"NodeName={node} NodeHostname=localhost NodeAddr={NODE_ADDRESS} Port={free_port()} CPUs={cpus} "
          f"RealMemory={node_memory_mb()} Gres=gpu:{len(FAKE_GPU_DEVICES)} State=UNKNOWN" for node in nodes),
        # Preemption as on a shared cluster: a job of the urgent partition that needs the node sends
        # SIGCONT and SIGTERM to the default partition's jobs (not their --signal: that needs
        # SlurmctldParameters=preempt_send_user_signal), kills them GraceTime later, and requeues them.
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
        "GraceTime=3",
        f"PartitionName={URGENT_PARTITION} Nodes={nodes[0]} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
        "",
    ]))
    return conf


@contextlib.contextmanager
def running_slurm(nodes: tuple[str, ...] = NODES):
    """Starts a Slurm of `nodes` from a private folder and yields its `SlurmCluster`; at the end
    cancels what is still queued and stops the daemons by pid."""
    slurm_commands_or_skip()
    ensure_munge_key()
    folder = Path(tempfile.mkdtemp(prefix="vlbert-slurm-"))
    munge = pwd.getpwnam("munge")
    munge_folder = folder / "munge"
    munge_folder.mkdir()
    os.chown(munge_folder, munge.pw_uid, munge.pw_gid)
    # munged wants its socket's folder, and the folders above, searchable by all
    for path in (folder, munge_folder):
        path.chmod(0o755)
    munge_socket = munge_folder / "munge.socket"
    cpus = len(os.sched_getaffinity(0))
    conf = write_config(folder, munge_socket, cpus, nodes)
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": os.environ.get("PATH", "") + ":" + SBIN_PATH}
    daemons: list[Daemon] = []
    previous_conf = os.environ.get("SLURM_CONF")
    try:
        daemons.append(_start("munged", [
            "munged", "--foreground", f"--socket={munge_socket}", f"--key-file={MUNGE_KEY}",
            f"--pid-file={munge_folder / 'munged.pid'}", f"--log-file={munge_folder / 'munged.log'}",
            f"--seed-file={munge_folder / 'munged.seed'}"], folder, env, munge_folder / "munged.log", munge))
        wait_for_daemons(munge_socket.exists, "munged's socket", daemons)
        daemons.append(_start("slurmctld", ["slurmctld", "-D", "-f", str(conf)], folder, env,
                              folder / "slurmctld.log"))
        for node in nodes:
            daemons.append(_start(f"slurmd-{node}", ["slurmd", "-D", "-f", str(conf), "-N", node], folder, env,
                                  folder / f"slurmd-{node}.log"))
        wait_for_daemons(lambda: _node_states(env) == {"idle"}, "every node to be idle in sinfo", daemons)
        os.environ["SLURM_CONF"] = str(conf)
        yield SlurmCluster(folder=folder, conf=conf, nodes=nodes, partition=PARTITION,
                           urgent_partition=URGENT_PARTITION, cpus=cpus, gpus=len(FAKE_GPU_DEVICES))
    finally:
        if previous_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous_conf
        if len(daemons) == 2 + len(nodes):
            _cancel_all_jobs(env)
        for daemon in reversed(daemons):
            daemon.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _start(name: str, argv: list[str], folder: Path, env: dict, log: Path,
           user: pwd.struct_passwd | None = None) -> Daemon:
    """The daemon in the foreground of its own process, so that its pid is the daemon's."""
    out = folder / f"{name}.out"
    with out.open("wb") as stream:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=stream, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, preexec_fn=_end_with_parent,
            user=user.pw_uid if user else None, group=user.pw_gid if user else None,
            extra_groups=[] if user else None)
    return Daemon(name, process, (log, out))


def _end_with_parent() -> None:
    """In the daemon before exec: a test session killed outright takes its daemons with it."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def wait_for_daemons(ready, what: str, daemons: list[Daemon]) -> None:
    """Until `ready()`; a daemon that exits meanwhile, or the time running out, is an error carrying
    the daemons' log tails."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        for daemon in daemons:
            if daemon.process.poll() is not None:
                raise RuntimeError(f"{daemon.name} exited with status {daemon.process.returncode} while "
                                   f"waiting for {what}:\n{daemon.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {START_TIMEOUT_S} s for {what}:\n"
                               + "\n".join(daemon.tail() for daemon in daemons))
        time.sleep(0.2)


def _node_states(env: dict) -> set[str]:
    """The nodes' states in each partition."""
    listing = _run(["sinfo", "--noheader", "--Node", "--format=%T"], env)
    return set(listing.stdout.split()) if listing.returncode == 0 else set()


def _cancel_all_jobs(env: dict) -> None:
    """Cancels what tests left queued or running, so that no job outlives its slurmd."""
    for partition in (PARTITION, URGENT_PARTITION):
        _run(["scancel", f"--partition={partition}"], env)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        queue = _run(["squeue", "--noheader", "--states=PENDING,RUNNING,COMPLETING,CONFIGURING"], env)
        if queue.returncode != 0 or not queue.stdout.strip():
            return
        time.sleep(0.5)


def _run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def _checked(argv: list[str], env: dict) -> None:
    done = _run(argv, env)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-LOG_TAIL_LINES:])
        raise RuntimeError(f"`{' '.join(argv)}` failed with status {done.returncode}:\n{tail}")
