"""The run folder's claim, without a trainer (`RunFolder.locked`, `RunFolder.claim`): one holder of
the lock at a time; a folder of another run refused unless restarting, which removes its outputs; the
run recorded, and what interrupted writes left swept."""

import pytest
import torch

from tests.helpers.worlds import run_config
from train.engine.config import StageConfig
from train.engine.distributed import World
from train.engine.errors import RunMismatchError
from train.engine.run_folder import RunFolder, RunFolderBusyError

VQA = StageConfig("vqa", "vqa", steps=2, batch_size=2)


def claim(folder: RunFolder, run, restart: bool = False) -> list[str]:
    """What claiming `folder` for `run` logged."""
    logged = []
    folder.claim(run, World(), restart, logged.append, precisions={"vqa": "fp32"}, device=torch.device("cpu"),
                 mixture=None, speed={"vqa": {"workers": 0}})
    return logged


def test_a_second_holder_of_the_run_folders_lock_is_refused_in_one_line(tmp_path):
    folder = RunFolder(tmp_path / "run")
    with folder.locked(World()):
        with pytest.raises(RunFolderBusyError, match=f"{folder.root}: another process is training this run"):
            with folder.locked(World()):
                pass
    with folder.locked(World()):  # released when the block ends
        pass


def test_a_claim_records_the_run_refuses_another_and_a_restart_removes_its_outputs(tmp_path):
    folder = RunFolder(tmp_path / "run")
    run = run_config(tmp_path, "run", [VQA])
    assert claim(folder, run) == []
    assert folder.config()["seed"] == 0 and folder.world()["size"] == 1 and folder.speed() == {"vqa": {"workers": 0}}
    (folder.root / ".metrics.jsonl.123.tmp").write_text("")  # what an interrupted write left
    assert claim(folder, run) == [f"removed what an interrupted write left in {folder.root}: .metrics.jsonl.123.tmp"]
    other = run_config(tmp_path, "run", [VQA], seed=1)
    with pytest.raises(RunMismatchError, match="seed"):
        claim(folder, other)
    folder.metrics_file.write_text("")
    assert claim(folder, other, restart=True) == [
        f"restart: removed the previous run's metrics.jsonl, run.json from {folder.root}"]
    assert folder.config()["seed"] == 1 and not folder.metrics_file.exists()
