"""What a killed writer leaves (temporaries of whole-file writes, half-written checkpoints, final
models and shards) is swept by the next writer, under the lock that every writer of those files
holds, so none of them can still be in use; what other writers own stays."""

import multiprocessing
import os
from pathlib import Path

import pytest

from extract.store.writer import FeatureStoreWriter
from tests.helpers.stores import meta, synthetic_record
from tests.helpers.worlds import copy_world, interrupt_optimiser_step, run_config
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer

VQA = StageConfig("vqa", "vqa", steps=3, batch_size=2, base_lr=5e-4, checkpoint_every=1)
DEAD = 4_000_000  # above any pid Linux gives (pid_max is at most 2**22)


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("leftovers"))


def plant(path: Path, folder: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"half")
    else:
        path.write_text("half")
    return path


def interrupted(world: Path, out: str, monkeypatch, call: int) -> RunFolder:
    """The run `out`, interrupted before its `call`-th optimiser step (checkpoints every step)."""
    interrupt_optimiser_step(monkeypatch, call=call)
    with pytest.raises(KeyboardInterrupt):
        Trainer(run_config(world, out, [VQA])).fit()
    monkeypatch.undo()
    return RunFolder(world / out)


def test_a_resumed_run_sweeps_what_killed_writes_left_and_keeps_what_others_wrote(world, monkeypatch):
    folder = interrupted(world, "killed", monkeypatch, call=2)
    stage = folder.stage(0, "vqa")
    left = [plant(folder.root / f".run.json.{DEAD}.tmp"), plant(folder.root / f".metrics.jsonl.{DEAD}.tmp"),
            plant(stage.path / "checkpoint-2.tmp", folder=True), plant(stage.final_staging, folder=True),
            plant(stage.path / f".eval.json.{DEAD}.tmp"), plant(stage.path / "item_scores" / f".val.json.{DEAD}.tmp"),
            plant(stage.predictions_folder / f".val.json.{DEAD}.tmp")]
    others = [plant(folder.root / "step.json.tmp"), plant(folder.root / f".notes.txt.{DEAD}.tmp")]
    assert sorted(folder.temporaries()) == sorted(left)

    messages = []
    Trainer(run_config(world, "killed", [VQA]), log=messages.append).fit(resume=True)
    assert not any(path.exists() for path in left) and all(path.exists() for path in others)
    assert messages[0].startswith(f"removed what an interrupted write left in {folder.root}: ")
    assert stage.done and [path.name for path in stage.checkpoints()] == ["checkpoint-2", "checkpoint-3"]


def test_a_temporary_of_a_live_process_is_swept_too_under_the_lock(world):
    """Only the lock's holder writes these files: whatever process id a temporary names, it is stale."""
    Trainer(run_config(world, "live", [VQA])).fit()
    folder = RunFolder(world / "live")
    live = plant(folder.root / f".run.json.{os.getpid()}.tmp")
    Trainer(run_config(world, "live", [VQA])).fit()
    assert not live.exists()


def test_a_store_writer_sweeps_its_shard_meta_and_failures_temporaries_and_not_another_shards(tmp_path):
    root = tmp_path / "store"
    with FeatureStoreWriter(root, meta(), shard=(0, 2)) as writer:
        writer.commit({"a": synthetic_record("a")})
    ours = [plant(root / f".meta.json.{DEAD}.tmp"), plant(root / f".failures.jsonl.{DEAD}.tmp"),
            plant(root / "shards" / f".shard-00000-of-00002.{DEAD}.tmp", folder=True)]
    another_shards = plant(root / "shards" / f".shard-00001-of-00002.{DEAD}.tmp", folder=True)
    with FeatureStoreWriter(root, meta(), shard=(0, 2)) as writer:
        writer.commit({"b": synthetic_record("b")})
    assert not any(path.exists() for path in ours) and another_shards.exists()


def test_a_failed_shard_creation_leaves_no_temporary(tmp_path, monkeypatch):
    import extract.store.writer as writer_module

    def failing(path, **kwargs):
        path.mkdir()
        raise OSError(28, "No space left on device", str(path / "data.mdb"))

    monkeypatch.setattr(writer_module, "open_shard", failing)
    with pytest.raises(OSError):
        FeatureStoreWriter(tmp_path / "store", meta())
    assert [path.name for path in (tmp_path / "store" / "shards").iterdir()] == ["shard-00000-of-00001.writer.lock"]


def test_a_metrics_line_cut_short_by_a_full_disk_or_a_kill_is_dropped_on_resume(world, monkeypatch):
    folder = interrupted(world, "torn", monkeypatch, call=3)
    with folder.metrics_file.open("a") as metrics:
        metrics.write('{"stage": "vqa", "step": 3, "lr"')
    Trainer(run_config(world, "torn", [VQA])).fit(resume=True)
    assert [record.get("step") for record in folder.metrics()] == [1, 2, 3, None]  # None: the evaluation


def test_an_interrupted_stage_leaves_no_data_loader_worker_running(world, monkeypatch):
    """Its exception's traceback keeps the stage's frames; the batches' DataLoader is closed anyway."""
    stage = StageConfig("vqa", "vqa", steps=3, batch_size=2, base_lr=5e-4, num_workers=2)
    interrupt_optimiser_step(monkeypatch, call=2)
    with pytest.raises(KeyboardInterrupt) as interrupted:
        Trainer(run_config(world, "stopped-with-workers", [stage])).fit()
    assert interrupted.traceback  # held, with every frame of the stage
    assert multiprocessing.active_children() == []
