"""A full disk, or a file at the process's size limit, is one line naming the file wherever it
happens (run.json, a checkpoint, final/, metrics, a store's LMDB commit), and what was being
written is removed. The limit is the real one (`ulimit -f`, with SIGXFSZ ignored so that the write
fails with EFBIG instead of killing the process); a full tmpfs where this machine lets us mount one."""

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.helpers.worlds import copy_world, run_config
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from vlbert.utils.atomic import write_atomically, writing
from vlbert.utils.errors import error_line

VQA = StageConfig("vqa", "vqa", steps=2, batch_size=2, base_lr=5e-4, checkpoint_every=1)
TOO_LARGE = "the file is too large (for the file system, or for the file size limit of the process: ulimit -f)"


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("disk-full"))


def vlbert(*arguments: str, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """`vlbert ARGUMENTS` in a fresh process whose files may grow to `file_size_limit` bytes."""

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # inherited by the exec'd interpreter
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", "from pipelines.cli import main; main()", *arguments],
                          capture_output=True, text=True, env=env, timeout=600,
                          preexec_fn=limited if file_size_limit is not None else None)


def train_config(world: Path, tmp_path: Path, out: str) -> Path:
    config = tmp_path / f"{out}.yaml"
    config.write_text(yaml.safe_dump(run_config(world, out, [VQA]).to_dict()))
    return config


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("Error: ")]


def test_run_json_past_the_size_limit_is_one_line_naming_it(world, tmp_path):
    done = vlbert("train", str(train_config(world, tmp_path, "no-room-config")), file_size_limit=600)
    folder = RunFolder(world / "no-room-config")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert error_lines(done) == [f"Error: {folder.config_file}: {TOO_LARGE} (File too large)"]
    assert not folder.temporaries() and not folder.is_run


def test_a_checkpoint_past_the_size_limit_is_one_line_naming_it_and_leaves_nothing(world, tmp_path):
    """The tiny model's weights take 160 kB: run.json and the metrics fit below 100 kB, the first
    checkpoint does not."""
    config = train_config(world, tmp_path, "no-room-checkpoint")
    done = vlbert("train", str(config), file_size_limit=100_000)
    stage = RunFolder(world / "no-room-checkpoint").stage(0, "vqa")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert error_lines(done) == [f"Error: {stage.checkpoint(1)}: {TOO_LARGE} (File too large)"]
    assert stage.checkpoints() == [] and not stage.done and not stage.temporaries()
    resumed = vlbert("train", str(config), "--resume")  # with room again, the run completes
    assert resumed.returncode == 0, resumed.stderr
    assert stage.done and len(stage.checkpoints()) == 2


def test_a_store_commit_past_the_size_limit_is_one_line_naming_the_data_file(world, tmp_path):
    """LMDB reports a write that stopped part-way as an I/O error; that it is the size limit is named."""
    store = tmp_path / "store"
    done = vlbert("extract", "--images", str(world / "world" / "images"), "--out", str(store), "--detector", "tiny",
                  "--batch-size", "4", file_size_limit=30_000)
    data = store / "shards" / "shard-00000-of-00001" / "data.mdb"
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = error_lines(done)
    assert line == (f"Error: {data}: the file is too large: it reached the file size limit of this process "
                    "(ulimit -f), 30000 bytes (LMDB error: mdb_txn_commit: Input/output error)")
    resumed = vlbert("extract", "--images", str(world / "world" / "images"), "--out", str(store), "--detector", "tiny",
                     "--batch-size", "4")
    assert resumed.returncode == 0, resumed.stderr


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 400 kB tmpfs, where this machine lets us mount one (as root); skipped elsewhere."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_while_a_checkpoint_is_written_is_one_line_naming_it(world, tmp_path, small_tmpfs):
    out = small_tmpfs / "run"
    config = tmp_path / "full.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(train_config(world, tmp_path, "full").read_text()),
                                      "out": str(out)}))
    done = vlbert("train", str(config))
    stage = RunFolder(out).stage(0, "vqa")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert error_lines(done) == [f"Error: {stage.checkpoint(1)}: the disk is full (No space left on device)"]
    assert stage.checkpoints() == [] and not stage.temporaries()


def test_a_full_disk_while_a_store_commits_is_one_line_naming_the_data_file(world, small_tmpfs):
    """LMDB reports the write that stopped part-way as an I/O error; the disk's free space names it."""
    store = small_tmpfs / "store"
    done = vlbert("extract", "--images", str(world / "world" / "images"), "--out", str(store), "--detector", "tiny",
                  "--batch-size", "4", "--mask-variants", "2")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = error_lines(done)
    data = store / "shards" / "shard-00000-of-00001" / "data.mdb"
    assert line.startswith(f"Error: {data}: the disk is full: ") and line.endswith(
        " KiB free (LMDB error: mdb_txn_commit: Input/output error)"), line


# ---- the pieces, in process -------------------------------------------------------------------


def test_a_failed_atomic_write_removes_its_temporary_and_names_the_file(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    target = tmp_path / "eval.json"
    with pytest.raises(OSError) as failed:
        write_atomically(target, "{}")
    assert error_line(failed.value) == f"{target}: the disk is full (No space left on device)"
    assert list(tmp_path.iterdir()) == []


def test_errors_that_name_no_file_are_given_the_file_being_written(tmp_path):
    with pytest.raises(OSError) as failed, writing(tmp_path / "metrics.jsonl"):
        raise OSError(errno.EFBIG, "File too large")
    assert error_line(failed.value) == f"{tmp_path / 'metrics.jsonl'}: {TOO_LARGE} (File too large)"
    with pytest.raises(OSError) as failed, writing(tmp_path / "final.tmp"):  # safetensors' way of saying it
        raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert error_line(failed.value) == f"{tmp_path / 'final.tmp'}: the disk is full (No space left on device)"
    with pytest.raises(ValueError), writing(tmp_path / "x"):
        raise ValueError("not a write error")


def test_a_full_disk_while_the_final_model_is_written_stops_in_one_line_and_leaves_no_final(world, monkeypatch):
    from safetensors import torch as safetensors_torch

    from train.engine.trainer import Trainer

    original = safetensors_torch.save_file

    def full_on_the_final_model(tensors, filename, *args, **kwargs):
        if Path(filename).parent.name == "final.tmp":  # safetensors' error names no file
            raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")
        return original(tensors, filename, *args, **kwargs)

    monkeypatch.setattr("vlbert.modeling.save_file", full_on_the_final_model)
    trainer = Trainer(run_config(world, "no-room-final", [replace(VQA, checkpoint_every=0, checkpoint_minutes=0)]))
    with pytest.raises(OSError) as failed:
        trainer.fit()
    stage = RunFolder(world / "no-room-final").stage(0, "vqa")
    assert error_line(failed.value) == f"{stage.final}: the disk is full (No space left on device)"
    assert not stage.done and not stage.temporaries() and [p.name for p in stage.checkpoints()] == ["checkpoint-2"]
    shutil.rmtree(world / "no-room-final")
