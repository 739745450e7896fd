"""Training runs that never drift or double-log: a run folder holds one config, a resumed stage
logs every step once and says where it started, checkpoints come by wall time and are pruned,
damaged records fail cleanly or are skipped and counted, and ordinary config mistakes are one
line before anything trains."""

import functools
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import yaml
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.summary.writer import event_file_writer

import train.engine.checkpoint
from extract.images import ImageError
from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store.interop import export_store, import_store
from extract.store.reader import FeatureStore
from extract.store.schema import DamagedRecordError, StoreError
from pipelines.cli import main
from tests.helpers.stores import data_file, flip_bit_in
from tests.helpers.worlds import copy_world, interrupt_optimiser_step, run_config
from train.data.annotations import read_annotations
from train.data.datasets import DamagedSample
from train.end2end import EndToEndVisual
from train.engine.config import RunConfig, RunConfigError, RunMismatchError, StageConfig, load_run_config
from train.engine.damaged import DamagedRecords
from train.engine.run_folder import RunFolder
from train.engine.stopping import STOP_SIGNALS, TrainingInterrupted, spared_from_stops
from train.engine.trainer import Trainer

PRETRAIN = StageConfig("pretrain", "pretrain", steps=4, batch_size=2, base_lr=5e-4)
VQA = StageConfig("vqa", "vqa", steps=3, batch_size=2, base_lr=5e-4)
TWO_STAGES = [PRETRAIN, VQA]


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def straight(world):
    """The two-stage run, uninterrupted: what every interrupted and resumed run must reproduce."""
    Trainer(run_config(world, "straight", TWO_STAGES)).fit()
    return world / "straight"


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in RunFolder(out).metrics_file.read_text().splitlines()]


def logged_steps(out) -> list[tuple[str, int]]:
    return [(r["stage"], r["step"]) for r in metrics(out) if "step" in r]


def logged_evaluations(out) -> list[str]:
    return [r["stage"] for r in metrics(out) if "eval" in r]


def board_steps(out, index: int, stage: str, tag: str) -> list[int]:
    run = RunFolder(out)
    events = EventAccumulator(str(run.tensorboard(run.stage(index, stage))))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def final_weights(out, index: int, stage: str) -> bytes:
    return (RunFolder(out).stage(index, stage).final / "model.safetensors").read_bytes()


def resume_an_hour_later(monkeypatch) -> None:
    """TensorBoard reads a log directory's event files in name order: the second each was opened,
    then process id and a counter. A resume opens its file seconds after the interruption; a test
    resumes within the same second, so its event files are stamped an hour later instead."""
    monkeypatch.setattr(event_file_writer, "time", SimpleNamespace(time=lambda: time.time() + 3600))


EVERY_STEP_ONCE = [("pretrain", step) for step in range(1, 5)] + [("vqa", step) for step in range(1, 4)]


# ---- run-folder identity ---------------------------------------------------------------------


def test_a_changed_config_is_refused_with_every_difference_until_restarted(world):
    stage = replace(VQA, steps=2)
    Trainer(run_config(world, "changed", [stage])).fit()
    recorded = RunFolder(world / "changed").config_file.read_text()
    changed = run_config(world, "changed", [replace(stage, steps=3, base_lr=1e-3)], max_length=40)

    with pytest.raises(RunMismatchError) as refused:
        Trainer(changed).fit()
    assert str(refused.value).splitlines()[1:] == [
        "  stages[0].steps: the run folder has 2, this config has 3",
        "  stages[0].base_lr: the run folder has 0.0005, this config has 0.001",
        "  max_length: the run folder has 48, this config has 40",
    ]
    assert RunFolder(world / "changed").config_file.read_text() == recorded

    messages = []
    Trainer(changed, log=messages.append).fit(restart=True)
    assert json.loads(RunFolder(world / "changed").config_file.read_text())["stages"][0]["steps"] == 3
    assert logged_steps(world / "changed") == [("vqa", 1), ("vqa", 2), ("vqa", 3)]
    assert any(m.startswith("restart: removed the previous run's stages, metrics.jsonl, tensorboard, run.json")
               for m in messages)


def test_a_finished_run_reruns_without_training_and_takes_result_neutral_changes(straight, monkeypatch):
    logged_before = RunFolder(straight).metrics_file.read_text()
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda *a, **k: pytest.fail("a finished run trained again"))
    neutral = [replace(PRETRAIN, num_workers=1, checkpoint_every=1, checkpoint_minutes=0.5, keep_checkpoints=0), VQA]
    run = run_config(straight.parent, "straight", neutral, eval_batch_size=3, damaged_records="skip")
    messages = []
    results = Trainer(run, log=messages.append).fit()

    assert messages == [f"stage pretrain: done ({RunFolder(straight).stage(0, 'pretrain').final}), nothing to train",
                        f"stage vqa: done ({RunFolder(straight).stage(1, 'vqa').final}), nothing to train"]
    assert [r["stage"] for r in results] == ["pretrain", "vqa"]
    assert RunFolder(straight).metrics_file.read_text() == logged_before
    recorded = json.loads(RunFolder(straight).config_file.read_text())
    assert recorded["eval_batch_size"] == 3 and recorded["damaged_records"] == "skip"
    assert recorded["stages"][0]["checkpoint_minutes"] == 0.5


def test_the_train_command_refuses_a_changed_config_and_restarts_on_request(world, tmp_path):
    config = tmp_path / "run.yaml"
    run = run_config(world, "cli-restart", [replace(VQA, steps=2)])
    config.write_text(yaml.safe_dump(run.to_dict()))
    assert CliRunner().invoke(main, ["train", str(config)]).exit_code == 0

    config.write_text(yaml.safe_dump(run_config(world, "cli-restart", [replace(VQA, steps=3)]).to_dict()))
    refused = CliRunner().invoke(main, ["train", str(config)])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert "  stages[0].steps: the run folder has 2, this config has 3" in refused.output.splitlines()

    restarted = CliRunner().invoke(main, ["train", str(config), "--restart"])
    assert restarted.exit_code == 0, restarted.output
    assert logged_steps(world / "cli-restart") == [("vqa", 1), ("vqa", 2), ("vqa", 3)]


# ---- honest resumes ---------------------------------------------------------------------------


def test_an_interrupt_without_checkpoints_restarts_the_stage_and_logs_each_step_once(world, straight, monkeypatch):
    interrupt_optimiser_step(monkeypatch, call=6)  # vqa's second step: pre-training is done
    with pytest.raises(KeyboardInterrupt):
        Trainer(run_config(world, "interrupted", TWO_STAGES)).fit()
    assert not RunFolder(world / "interrupted").stage(1, "vqa").checkpoints()
    monkeypatch.undo()
    resume_an_hour_later(monkeypatch)

    messages = []
    Trainer(run_config(world, "interrupted", TWO_STAGES), log=messages.append).fit(resume=True)
    assert "stage vqa: no checkpoint, starting again at step 0" in messages
    out = world / "interrupted"
    assert logged_steps(out) == EVERY_STEP_ONCE and logged_evaluations(out) == ["pretrain", "vqa"]
    assert board_steps(out, 1, "vqa", "vqa/loss") == [1, 2, 3]
    for index, stage in enumerate(("pretrain", "vqa")):
        assert final_weights(out, index, stage) == final_weights(straight, index, stage)


def test_an_interrupt_after_a_step_checkpoint_resumes_from_it(world, straight, monkeypatch):
    stages = [replace(PRETRAIN, checkpoint_every=2), VQA]
    interrupt_optimiser_step(monkeypatch, call=4)  # pre-training's step 4: step 3 is logged past step 2's checkpoint
    with pytest.raises(KeyboardInterrupt):
        Trainer(run_config(world, "checkpointed", stages)).fit()
    monkeypatch.undo()
    resume_an_hour_later(monkeypatch)

    messages = []
    Trainer(run_config(world, "checkpointed", stages), log=messages.append).fit(resume=True)
    out = world / "checkpointed"
    assert f"stage pretrain: resuming from {RunFolder(out).stage(0, 'pretrain').checkpoint(2)} (step 2)" in messages
    assert logged_steps(out) == EVERY_STEP_ONCE
    assert board_steps(out, 0, "pretrain", "pretrain/loss") == [1, 2, 3, 4]
    for index, stage in enumerate(("pretrain", "vqa")):
        assert final_weights(out, index, stage) == final_weights(straight, index, stage)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2])
def test_a_stop_signal_checkpoints_the_step_in_progress_and_the_resume_ends_as_an_uninterrupted_run(
        world, straight, monkeypatch, signum):
    """SIGTERM (a scheduler's stop, Slurm's preemption) or SIGUSR2 (submitit's warning) during pre-training's
    third step: the step completes, is checkpointed, and training stops; resumed, nothing differs."""
    original, calls = torch.optim.AdamW.step, {"n": 0}

    def signalled_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signum)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", signalled_step)
    out = world / f"stopped-{signum}"
    with pytest.raises(TrainingInterrupted) as stopped:
        Trainer(run_config(world, out.name, TWO_STAGES)).fit()
    assert stopped.value.exit_status == 128 + signum and stopped.value.signum == signum
    checkpoint = RunFolder(out).stage(0, "pretrain").checkpoint(3)
    assert str(stopped.value) == (f"{out}: stage pretrain, step 3 (checkpoint-3 written): stopped by "
                                  f"{signal.Signals(signum).name}; rerun to resume from there (`vlbert train` needs "
                                  "--resume)")
    assert RunFolder(out).stage(0, "pretrain").checkpoints() == [checkpoint]
    assert signal.getsignal(signum) == signal.SIG_DFL  # the handler before fit is back
    monkeypatch.undo()

    messages = []
    Trainer(run_config(world, out.name, TWO_STAGES), log=messages.append).fit(resume=True)
    assert f"stage pretrain: resuming from {checkpoint} (step 3)" in messages
    assert logged_steps(out) == EVERY_STEP_ONCE
    for index, stage in enumerate(("pretrain", "vqa")):
        assert final_weights(out, index, stage) == final_weights(straight, index, stage)


class WorkerPids(torch.utils.data.Dataset):
    """Each item: the pid of the DataLoader worker that made it."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> int:
        return os.getpid()


def test_a_loaders_workers_leave_stop_signals_to_the_training_process_and_end_with_their_loader():
    """Ctrl-C on a terminal, a scheduler's SIGTERM to a step's process group or Slurm's to a job's
    processes reach the DataLoader workers too: they serve on (the step still needs them for its
    checkpoint) and end when their loader does."""
    batches = spared_from_stops(torch.utils.data.DataLoader(WorkerPids(), batch_size=None, num_workers=2))
    pids = {next(batches) for _ in range(8)}
    assert len(pids) == 2 and os.getpid() not in pids
    for signum in STOP_SIGNALS:  # sent by another process, as they are
        subprocess.run(["kill", f"-{signum.name.removeprefix('SIG')}", *map(str, pids)], check=True)
    assert {next(batches) for _ in range(40)} == pids  # a worker that died would have raised here
    del batches
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_a_loaders_own_worker_init_fn_still_runs_in_spared_workers(tmp_path):
    loader = torch.utils.data.DataLoader(WorkerPids(), batch_size=None, num_workers=1,
                                         worker_init_fn=functools.partial(_touch, tmp_path))
    next(spared_from_stops(loader))
    assert (tmp_path / "worker-0").is_file()


def _touch(folder, worker_id: int) -> None:
    (folder / f"worker-{worker_id}").touch()


@pytest.mark.parametrize("keep, kept", [(2, [6, 8]), (0, [3, 6, 8])])
def test_checkpoints_come_by_wall_time_and_only_the_newest_are_kept(world, monkeypatch, keep, kept):
    original, calls = torch.optim.AdamW.step, {"n": 0}

    def counted_step(self, *args, **kwargs):
        calls["n"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counted_step)
    # Four minutes pass per optimiser step: a 10-minute checkpoint falls due after steps 3 and 6.
    monkeypatch.setattr(train.engine.checkpoint, "monotonic", lambda: calls["n"] * 240.0)
    stage = replace(VQA, steps=8, checkpoint_minutes=10, keep_checkpoints=keep)
    Trainer(run_config(world, f"wall-time-{keep}", [stage])).fit()
    stage_dir = RunFolder(world / f"wall-time-{keep}").stage(0, "vqa")
    assert stage_dir.checkpoints() == [stage_dir.checkpoint(step) for step in kept]


# ---- damaged records --------------------------------------------------------------------------


def damage(monkeypatch, image_ids: set[str]) -> Counter:
    """Makes the store's records of `image_ids` fail as a damaged record does when read; counts the failures."""
    original, failures = FeatureStore.decoded, Counter()

    def read(self, image_id, *args, **kwargs):  # every read of a record, whole or some fields
        if image_id in image_ids:
            failures[image_id] += 1
            raise DamagedRecordError(f"{self.root}: record {image_id!r}: checksum mismatch", image_id)
        return original(self, image_id, *args, **kwargs)

    monkeypatch.setattr(FeatureStore, "decoded", read)
    return failures


def test_a_damaged_record_fails_the_run_in_one_line_from_a_worker(world, tmp_path, monkeypatch):
    damaged = read_annotations(world / "world" / "train.jsonl")[0].image_id
    damage(monkeypatch, {damaged})
    config = tmp_path / "run.yaml"
    stage = replace(VQA, steps=50, num_workers=1)  # enough steps to meet the damaged record
    config.write_text(yaml.safe_dump(run_config(world, "damaged-fail", [stage]).to_dict()))
    result = CliRunner().invoke(main, ["train", str(config)])
    assert_one_error_line(result, 1, f"record {damaged!r}: checksum mismatch (--skip-damaged")


def test_skipped_damaged_records_are_counted_and_the_run_completes(world, monkeypatch):
    train_images = [a.image_id for a in read_annotations(world / "world" / "train.jsonl")]
    eval_annotations = read_annotations(world / "world" / "val.jsonl")
    damaged = {*train_images[:2], eval_annotations[0].image_id}
    failures = damage(monkeypatch, damaged)
    messages = []
    # Read in this process (no workers), where `damage` counts the reads.
    stage = replace(VQA, steps=6, batch_size=4, num_workers=0)
    run = run_config(world, "damaged-skip", [stage], damaged_records="skip")
    result = Trainer(run, log=messages.append).fit()[0]

    skipped_per_step = [r.get("damaged_skipped", 0) for r in metrics(world / "damaged-skip") if "step" in r]
    skipped_in_evaluation = failures[eval_annotations[0].image_id]
    assert len(skipped_per_step) == 6 and 0 < sum(skipped_per_step) == sum(failures[i] for i in train_images[:2])
    assert skipped_in_evaluation == len(eval_annotations[0].questions)
    assert result["damaged_skipped"] == sum(failures.values())
    assert result["samples"] == sum(len(a.questions) for a in eval_annotations) - skipped_in_evaluation
    summary = messages[-1]
    skipped = sum(failures.values())
    assert summary.startswith(f"stage vqa: skipped {skipped} sample(s) of {len(failures)} damaged record(s): ")
    assert set(summary.split(": ")[-1].split(", ")) == set(failures)


def test_a_bit_flipped_in_a_stored_record_stops_training_or_is_skipped(world, tmp_path):
    """The whole path, without stand-ins: one bit of a training image's features flipped in the shard file."""
    store = tmp_path / "cache"
    shutil.copytree(world / "cache", store)
    damaged = read_annotations(world / "world" / "train.jsonl")[0].image_id
    with FeatureStore(store) as reader:
        flip_bit_in(data_file(store), reader[damaged]["features"].tobytes())
    config = tmp_path / "run.yaml"
    stage = replace(VQA, steps=20, batch_size=4)  # 20 batches of 4 from 12 images' questions: every image is met
    config.write_text(yaml.safe_dump(run_config(world, "flipped", [stage], store=str(store)).to_dict()))
    failed = CliRunner().invoke(main, ["train", str(config)])
    assert_one_error_line(failed, 1, f"record {damaged!r} is damaged: checksum mismatch")
    skipped = CliRunner().invoke(main, ["train", str(config), "--skip-damaged", "--restart"])
    assert skipped.exit_code == 0, skipped.output
    assert f"damaged record(s): {damaged}" in skipped.output


def test_a_batch_of_only_damaged_records_is_an_error():
    markers = [DamagedSample("a", "damaged"), DamagedSample("b", "damaged")]
    with pytest.raises(StoreError, match="too damaged to skip around"):
        DamagedRecords(skip=True).check(markers, with_images=len(markers))


# ---- one-line errors for ordinary mistakes ----------------------------------------------------


@pytest.fixture(scope="module")
def plain_store(world):
    """A store of the same world without masked-pixel variants."""
    run_extraction(ExtractionConfig(world / "world", "tiny", batch_size=4, progress=False), world / "plain")
    return world / "plain"


def yaml_run(world, **changes) -> str:
    values = run_config(world, "cli-mistakes", [PRETRAIN]).to_dict()
    return yaml.safe_dump({**values, **changes})


MISTAKES = {
    "malformed YAML": (lambda world: "out: runs/x\nstages: [{name: a, task: vqa\nseed: 1\n", [],
                       2, ": invalid YAML, line 3, column 5: "),
    "a list": (lambda world: "- out\n- store\n", [], 2, ": expected a mapping of run settings, found a list"),
    "a misspelled stage key": (
        lambda world: yaml_run(world, stages=[{"name": "pretrain", "task": "pretrain", "stpes": 4}]), [], 2,
        ": stages[0] ('pretrain'): unknown field 'stpes' (did you mean 'steps'?); missing required field 'steps'"),
    "a mistyped field": (lambda world: yaml_run(world, stages=[{"name": "p", "task": "vqa", "steps": "six"}]), [], 2,
                         ": stages[0].steps: expected an integer, found 'six'"),
    "a missing input": (lambda world: yaml_run(world, vocabulary=str(world / "nowhere")), [], 2,
                        ": vocabulary: {world}/nowhere does not exist"),
    "a store that is none": (lambda world: yaml_run(world, store=str(world / "world")), [], 1,
                             "not a FeatureStore (no meta.json)"),
    "a store without masked-pixel variants": (
        lambda world: yaml_run(world, store=str(world / "plain")), [], 2,
        "Error: stage 'pretrain': {world}/plain holds no masked-pixel variants"),
    "--resume with --restart": (lambda world: yaml_run(world), ["--resume", "--restart"], 2,
                                "--resume continues the run in the out folder and --restart discards it"),
}


def test_a_store_whose_records_disagree_with_its_meta_json_is_refused(world, tmp_path):
    shutil.copytree(world / "cache", tmp_path / "edited")
    meta = json.loads((tmp_path / "edited" / "meta.json").read_text())
    meta["features"]["dtype"] = "float32"
    (tmp_path / "edited" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="the records disagree with meta.json .features: float16 values, expected float32"):
        Trainer(run_config(world, "edited-meta", [VQA], store=str(tmp_path / "edited")))
    assert not (world / "edited-meta").exists()


def test_an_exponent_yaml_reads_as_text_is_the_number_it_spells(world, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml_run(world).replace("base_lr: 0.0005", "base_lr: 5e-4"))
    assert "base_lr: 5e-4" in config.read_text()
    assert load_run_config(config).stages[0].base_lr == 5e-4


@pytest.mark.parametrize("mistake", MISTAKES)
def test_an_ordinary_mistake_is_one_error_line(world, plain_store, tmp_path, mistake):
    text, options, status, expected = MISTAKES[mistake]
    config = tmp_path / "run.yaml"
    config.write_text(text(world))
    result = CliRunner().invoke(main, ["train", str(config), *options])
    assert_one_error_line(result, status, expected.format(world=world))
    assert not (world / "cli-mistakes").exists()  # refused before anything ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_without_cuda_is_one_error_line(world, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml_run(world))
    result = CliRunner().invoke(main, ["train", str(config), "--device", "cuda"])
    assert_one_error_line(result, 2, "device 'cuda': CUDA is not available on this machine")


def assert_one_error_line(result, status: int, expected: str) -> None:
    assert result.exit_code == status, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and expected in errors[0], result.output


@pytest.fixture(scope="module")
def imported_like_store(world, tmp_path_factory):
    """The store through a TSV export and import: no detector config, no class distributions."""
    folder = tmp_path_factory.mktemp("imported")
    with pytest.warns(UserWarning, match="the tsv format does not carry it"):
        export_store(world / "cache", "tsv", folder / "features.tsv")
        import_store(folder / "features.tsv", "tsv", folder / "store")
    return folder / "store"


@pytest.mark.parametrize("stage, problem", [
    (StageConfig("e2e", "vqa", steps=1, batch_size=2, visual="end2end"),
     "stage 'e2e': the FeatureStore records no detector config"),
    (StageConfig("pretrain", "pretrain", steps=1, batch_size=2, options={"roi_masking": "feature"}),
     "stage 'pretrain': {store} stores no class distributions"),
])
def test_a_stage_the_store_cannot_feed_is_named_before_anything_trains(world, imported_like_store, stage, problem):
    run = run_config(world, "unfed", [VQA, stage], store=str(imported_like_store))
    with pytest.raises(RunConfigError) as refused:
        Trainer(run)
    assert str(refused.value).startswith(problem.format(store=imported_like_store))
    assert not (world / "unfed").exists()


def test_a_store_of_the_detectron2_backend_cannot_feed_an_end_to_end_stage(world):
    with FeatureStore(world / "cache") as store:
        meta = json.loads(json.dumps(store.meta))
    assert EndToEndVisual.store_problem(meta, None) is None
    meta["detector"]["source"] = "d2:configs/faster_rcnn_R_101_FPN.yaml"
    problem = EndToEndVisual.store_problem(meta, None)
    assert problem.startswith("the FeatureStore was extracted by the detectron2 backend (d2:configs/")


# ---- config checks through the Python API -----------------------------------------------------


def run_values(world, **changes) -> dict:
    return {**run_config(world, "api", [VQA]).to_dict(), **changes}


@pytest.mark.parametrize("changes, message", [
    ({"sotre": "x"}, "unknown field 'sotre' (did you mean 'store'?)"),
    ({"model": {"hidden_sise": 32}}, "model: unknown field 'hidden_sise' (did you mean 'hidden_size'?)"),
    ({"model": {"hidden_size": "wide"}}, "model.hidden_size: expected an integer, found 'wide'"),
    ({"seed": True}, "seed: expected an integer, found True"),
    ({"corpus": "books.txt"}, "unknown field 'corpus': an option of the task pretrain now: give it in the options of each "
                              "pretrain stage (options: {corpus: ...})"),
    ({"stages": [{"name": "a", "task": "pretrain", "steps": 1, "options": {"corpus": 3}}]},
     "stage 'a': options.corpus: expected a string, found 3"),
    ({"stages": {"name": "vqa"}}, "stages: expected a list, found a mapping"),
    ({"stages": ["vqa"]}, "stages[0]: expected a mapping of stage settings, found 'vqa'"),
    ({"stages": [{"name": "a", "task": "pretrain", "steps": 1, "options": {"masked_lm": "no"}}]},
     "stage 'a': options.masked_lm: expected true or false, found 'no'"),
    ({"stages": [{"name": "a", "task": "pretrain", "steps": 1, "options": {"masked_rio": False}}]},
     "stage 'a': options: unknown field 'masked_rio' (did you mean 'masked_roi'?)"),
    ({"stages": [{"name": "a", "task": "vqa", "steps": 1, "options": {"num_choices": 3}}]},
     "stage 'a': options: unknown field 'num_choices'"),
    ({"stages": [{"name": "a", "task": "pretrain", "steps": 1, "options": {"roi_masking": "pixels"}}]},
     "stage 'a': roi_masking 'pixels' is not one of ('pixel', 'feature')"),
    ({"stages": [{"name": "a", "task": "pretrain", "steps": 1, "options": "fast"}]},
     "stage 'a': options: expected a mapping of pre-training options, found 'fast'"),
    ({"stages": [{"name": "a", "task": "dance", "steps": 1}]}, "stage 'a': task 'dance' is not one of"),
    ({"stages": [{"name": "a", "task": "vqa", "steps": 1}, {"name": "a", "task": "vqa", "steps": 1}]},
     "stages: every stage needs its own name; repeated: a"),
    ({"damaged_records": "ignore"}, "damaged_records: 'ignore' is not one of fail, skip"),
])
def test_from_dict_names_the_field_at_fault(world, changes, message):
    with pytest.raises(RunConfigError) as refused:
        RunConfig.from_dict(run_values(world, **changes))
    assert message in str(refused.value)


def test_from_dict_widens_integers_where_numbers_are_expected_and_accepts_none(world):
    values = run_values(world, images=None, stages=[
        {"name": "a", "task": "vqa", "steps": 1, "base_lr": 1, "options": {"answers": None}}])
    run = RunConfig.from_dict(values)
    assert run.stages[0].base_lr == 1.0 and isinstance(run.stages[0].base_lr, float)
    assert run.images is None and run.stages[0].options.answers is None
    missing = {k: v for k, v in values.items() if k != "store"}
    with pytest.raises(RunConfigError, match="missing required field 'store'"):
        RunConfig.from_dict(missing)


def test_load_run_config_applies_overrides_and_names_the_file(world, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_values(world)))
    run = load_run_config(config, {"device": "cpu", "damaged_records": "skip", "out": str(tmp_path / "elsewhere")})
    assert run.damaged_records == "skip" and run.out == str(tmp_path / "elsewhere")
    with pytest.raises(RunConfigError, match=f"^{config}: damaged_records: 'never' is not one of fail, skip$"):
        load_run_config(config, {"damaged_records": "never"})


# ---- the end-to-end stage's images ---------------------------------------------------------------


def reading_processes(monkeypatch, log) -> None:
    """Appends the id of every process that decodes an end-to-end image to the file `log`."""
    import train.end2end

    decode = train.end2end.load_image

    def logged(path):
        with open(log, "a") as out:
            out.write(f"{os.getpid()}\n")
        return decode(path)

    monkeypatch.setattr(train.end2end, "load_image", logged)  # forked DataLoader workers inherit it


def test_end_to_end_images_are_decoded_by_the_workers_and_train_as_in_one_process(world, tmp_path, monkeypatch):
    stage = replace(VQA, steps=2, visual="end2end", num_workers=0)
    reading_processes(monkeypatch, tmp_path / "readers")
    Trainer(run_config(world, "e2e-in-process", [stage])).fit()
    assert set((tmp_path / "readers").read_text().split()) == {str(os.getpid())}
    (tmp_path / "readers").unlink()
    Trainer(run_config(world, "e2e-workers", [replace(stage, num_workers=1)])).fit()
    readers = (tmp_path / "readers").read_text().split()
    assert readers and str(os.getpid()) not in readers  # the forward pass read no image itself
    for name in ("model.safetensors", "detector.safetensors"):
        assert ((RunFolder(world / "e2e-in-process").stage(0, "vqa").final / name).read_bytes()
                == (RunFolder(world / "e2e-workers").stage(0, "vqa").final / name).read_bytes())


def test_an_unreadable_image_stops_an_end_to_end_stage_with_one_line_naming_it(world, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(world / "world", images)
    broken = images / read_annotations(world / "world" / "train.jsonl")[0].file
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    stage = replace(VQA, steps=30, visual="end2end", num_workers=1)  # enough steps to meet every image
    with pytest.raises(ImageError) as stopped:
        Trainer(run_config(world, "e2e-broken", [stage], images=str(images))).fit()
    assert str(stopped.value) == f"{broken}: not an image file (or a format Pillow cannot read)"
