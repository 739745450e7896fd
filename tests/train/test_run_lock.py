"""One process trains in a run folder at a time: a second is refused in one line naming the holder's
pid and host, and a holder killed with SIGKILL leaves the folder to the next (a requeued job)."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from pipelines.cli import main
from tests.helpers.worlds import copy_world, run_config
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from vlbert.utils.locks import holding, lock_holder, take_lock

VQA = StageConfig("vqa", "vqa", steps=2, batch_size=2, base_lr=5e-4)


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("lock"))


def hold_lock(path: Path) -> subprocess.Popen:
    """Another process that holds the lock at `path` until it is killed."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from vlbert.utils.locks import take_lock; lock = take_lock(Path(sys.argv[1])); "
                               "print('held' if lock else 'busy', flush=True); time.sleep(600)", str(path)],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(Path.cwd())))
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_trainer_is_refused_naming_the_holder_until_the_holder_is_killed(world, tmp_path):
    out = world / "locked"
    out.mkdir()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(world, "locked", [VQA]).to_dict()))
    holder = hold_lock(RunFolder(out).lock_file)
    try:
        refused = CliRunner().invoke(main, ["train", str(config)])
        assert refused.exit_code == 2 and refused.output.strip().splitlines() == [
            f"Error: {out}: another process is training this run (pid {holder.pid} on host {socket.gethostname()}); "
            "it must end (or be stopped) before another can train here"]
        assert not RunFolder(out).is_run and not (out / "stages").exists()  # nothing was done
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    trained = CliRunner().invoke(main, ["train", str(config)])  # the kernel released the dead holder's lock
    assert trained.exit_code == 0, trained.output
    assert RunFolder(out).stage(0, "vqa").done


def test_the_trainer_holds_the_lock_while_it_trains_and_releases_it_after(world, monkeypatch):
    folder = RunFolder(world / "held")
    seen = []
    step = torch.optim.AdamW.step

    def checking_step(self, *args, **kwargs):
        seen.append(take_lock(folder.lock_file))  # a lock is per open file: refused in this process too
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", checking_step)
    Trainer(run_config(world, "held", [VQA])).fit()
    assert seen == [None, None]
    assert lock_holder(folder.lock_file) == f"pid {os.getpid()} on host {socket.gethostname()}"
    again = take_lock(folder.lock_file)
    assert again is not None
    again.close()


def test_a_failed_run_releases_the_lock(world, monkeypatch):
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.optim.AdamW, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Trainer(run_config(world, "interrupted", [replace(VQA, steps=1)])).fit()
    lock = take_lock(RunFolder(world / "interrupted").lock_file)
    assert lock is not None
    lock.close()


@pytest.mark.parametrize("kind", ["a writer's lock", "a section's lock"])
def test_a_forked_worker_does_not_keep_a_lock_after_its_parent_lets_it_go(tmp_path, kind):
    """A lock belongs to the open file, which a fork shares: a worker forked while its parent held
    one (a DataLoader worker alive after a failed stage, a decoding worker started while the store's
    failures were rendered) would otherwise hold it on, and the parent's next wait would never end."""
    path = tmp_path / "train.lock"
    with ExitStack() as held:
        if kind == "a writer's lock":
            held.callback(take_lock(path).close)
        else:
            held.enter_context(holding(path))
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:  # the worker: lives on after its parent released the lock
            os.close(reader)
            os.write(writer, b"x")
            time.sleep(30)
            os._exit(0)
        os.close(writer)
        os.read(reader, 1)
    try:
        again = take_lock(path)
        assert again is not None
        again.close()
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_a_fork_never_falls_between_opening_a_lock_file_and_noting_it_held(tmp_path, monkeypatch):
    """A thread opening a section's lock file when another thread forks (a decoding worker restarted
    while the commit thread renders failures): the fork waits until the file is noted as held, so the
    child closes its copy and the lock the parent then takes is the parent's alone."""
    path, opened, go_on = tmp_path / ".failures.lock", threading.Event(), threading.Event()
    original_open = Path.open

    def slow_open(self, *args, **kwargs):
        file = original_open(self, *args, **kwargs)
        if self == path:
            opened.set()
            go_on.wait(5)
        return file

    monkeypatch.setattr(Path, "open", slow_open)
    sections = ExitStack()
    opener = threading.Thread(target=lambda: sections.enter_context(holding(path)))
    opener.start()
    opened.wait(5)
    threading.Timer(0.5, go_on.set).start()  # the fork below waits for the opening to end
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        held = [fd for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == str(path)]
        os.write(writer, b"1" if held else b"0")
        os._exit(0)
    os.close(writer)
    opener.join()
    try:
        assert os.read(reader, 1) == b"0"  # the child kept no copy of the lock file
    finally:
        os.waitpid(child, 0)
        sections.close()



def test_a_probe_of_the_lock_never_makes_a_starting_writer_believe_that_another_holds_it(tmp_path):
    """`is_held` (what `pipeline status` and `cancel` ask) takes the lock shared for an instant: a writer
    taking it meanwhile (`pipeline run`, a trainer, a shard's writer) waits that instant out instead of
    being refused (before, 281 refusals in 15,303 tries)."""
    path, stop = tmp_path / "run.lock", tmp_path / "stop"
    prober = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from vlbert.utils.locks import is_held; path, stop = map(Path, sys.argv[1:]); "
                               "print(is_held(path), flush=True); "
                               "print(sum(1 for _ in iter(lambda: (is_held(path), stop.exists())[1], True)))",
                               str(path), str(stop)],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(Path.cwd())))
    try:
        assert prober.stdout.readline().strip() == "False"  # probing from now on
        refused = 0
        for _ in range(3000):
            lock = take_lock(path)
            refused += lock is None
            if lock is not None:
                lock.close()
    finally:
        stop.touch()
        probes = int(prober.communicate(timeout=30)[0])
    assert refused == 0 and probes > 0
