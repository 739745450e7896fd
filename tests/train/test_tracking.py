"""Tracking with a switch (run config `tracking:`): TensorBoard on unless switched off, W&B and MLflow when
switched on; every logging interval's scalars and the hyper-parameters reach each backend switched on, read
back from the files each writes (W&B offline, MLflow's file store: no network), and a resumed run
continues the same tracked run."""

import json
import struct
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.worlds import copy_world, run_config
from train.engine.config import RunConfig, RunConfigError, StageConfig, TrackingConfig, run_differences
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer

# Two logging intervals (steps 2 and 4), a checkpoint at step 2 for a resume to start from.
VQA = StageConfig("vqa", "vqa", steps=4, batch_size=2, base_lr=5e-4, log_every=2, checkpoint_every=2)
STEP_SCALARS = ("loss", "lr", "grad_norm")
INTERVAL_SCALARS = ("samples_per_s", "data_wait_share")


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("tracking"))


def tracked(world, out: str, **tracking) -> RunConfig:
    return run_config(world, out, [VQA], tracking=TrackingConfig(**tracking))


def crash_at_step_3_then_resume(config: RunConfig, monkeypatch, between=lambda: None) -> None:
    """The run crashes in its third optimiser step (after step 2's checkpoint), then resumes."""
    original, calls = torch.optim.AdamW.step, {"n": 0}

    def step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    with pytest.raises(RuntimeError, match="simulated crash"):
        Trainer(config).fit()
    monkeypatch.setattr(torch.optim.AdamW, "step", original)
    between()
    Trainer(config).fit(resume=True)


def logged(out) -> dict[int, dict]:
    """metrics.jsonl's step records by step."""
    return {record["step"]: record for record in RunFolder(out).metrics() if "step" in record}


# ---- the config -------------------------------------------------------------------------------


def run_document(**tracking) -> dict:
    return {"out": "runs/x", "store": "s", "train_annotations": "t", "eval_annotations": "e", "vocabulary": "v",
            "stages": [{"name": "vqa", "task": "vqa", "steps": 2}], "tracking": tracking}


def test_tracking_is_checked_as_every_section_and_tensorboard_alone_is_on_by_default():
    assert RunConfig.from_dict(run_document()).tracking == TrackingConfig(tensorboard=True, wandb=False, mlflow=False)
    with pytest.raises(RunConfigError, match=r"tracking: unknown field 'mlfow' \(did you mean 'mlflow'\?\)"):
        RunConfig.from_dict(run_document(mlfow=True))
    with pytest.raises(RunConfigError, match=r"tracking\.tensorboard: expected true or false, found"):
        RunConfig.from_dict(run_document(tensorboard="no"))


def test_where_a_run_is_tracked_is_result_neutral():
    run = RunConfig.from_dict(run_document(wandb=True, project="other"))
    before_tracking = {key: value for key, value in run.to_dict().items() if key != "tracking"}
    assert run_differences(before_tracking, run) == []
    assert run_differences(RunConfig.from_dict(run_document()).to_dict(), run) == []


def test_a_backend_switched_on_but_not_installed_is_one_line_before_anything_trains(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # importlib finds no such package
    with pytest.raises(RunConfigError) as refused:
        Trainer(tracked(world, "uninstalled", wandb=True))
    assert str(refused.value) == ("tracking.wandb: true, but the wandb package is not installed "
                                  "(pip install 'vlbert-pipeline[wandb]'), or set tracking.wandb: false")
    assert not (world / "uninstalled").exists()


# ---- TensorBoard ------------------------------------------------------------------------------


def test_tensorboard_switched_off_writes_no_event_files(world):
    Trainer(tracked(world, "untracked", tensorboard=False)).fit()
    out = world / "untracked"
    assert not (out / "tensorboard").exists() and not list(out.rglob("events.out.tfevents.*"))
    assert sorted(logged(out)) == [1, 2, 3, 4]  # metrics.jsonl, always written, with the gradient norm
    assert all(record["grad_norm"] > 0 for record in logged(out).values())


def test_tensorboard_holds_each_step_s_and_interval_s_scalars_and_the_hyperparameters(world):
    Trainer(tracked(world, "board")).fit()
    run = RunFolder(world / "board")
    events = EventAccumulator(str(run.tensorboard(run.stage(0, "vqa"))))
    events.Reload()
    steps = logged(world / "board")
    for name in STEP_SCALARS:
        board = events.Scalars(f"vqa/{name}")
        assert [(e.step, e.value) for e in board] == [(s, pytest.approx(steps[s][name], rel=1e-6)) for s in steps]
    for name in INTERVAL_SCALARS:
        assert [e.step for e in events.Scalars(f"vqa/{name}")] == [2, 4]
    assert all(e.value > 0 for e in events.Scalars("vqa/samples_per_s"))
    assert "vqa/peak_memory_mb" not in events.Tags()["scalars"]  # CPU: none
    text = events.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads("\n".join(line[4:] for line in text.splitlines()))["stages"][0]["base_lr"] == 5e-4


# ---- W&B (offline) ----------------------------------------------------------------------------


def wandb_records(path) -> list:
    """The records of a .wandb file: W&B's LevelDB-style log (a 7-byte header, then 32 KiB blocks of
    chunks, each a 7-byte header of CRC, length and type: full, first, middle, last) of protobuf Records."""
    from wandb.proto.wandb_internal_pb2 import Record

    block, header = 32768, 7
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, offset = [], b"", header
    while offset + header <= len(data):
        if block - offset % block < header:  # a block's tail too short for a chunk header: padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + header])
        if kind == 0:  # zeros past the last chunk
            break
        pending += data[offset + header:offset + header + length]
        offset += header + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_attempt(folder) -> tuple[str, dict, list[dict]]:
    """(the run id, its config, its history rows) of the one offline run under WANDB_DIR `folder`."""
    [path] = folder.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(path)
    [run] = [record.run for record in records if record.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    history = [{"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
               for record in records if record.WhichOneof("record_type") == "history"]
    return run.run_id, config, history


def test_wandb_offline_holds_every_interval_s_values_and_a_resume_continues_its_run(world, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="W&B is the `wandb` extra (and the `test` extra's)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "first"))
    (tmp_path / "first").mkdir()
    config = tracked(world, "wandb", tensorboard=False, wandb=True, project="tiny")

    def second_attempt_elsewhere():  # its offline files apart from the first's, whatever second it starts in
        wandb.teardown()  # the next session reads the environment again
        (tmp_path / "second").mkdir()
        monkeypatch.setenv("WANDB_DIR", str(tmp_path / "second"))

    crash_at_step_3_then_resume(config, monkeypatch, second_attempt_elsewhere)
    first_id, config_logged, first = wandb_attempt(tmp_path / "first")
    second_id, _, second = wandb_attempt(tmp_path / "second")
    assert first_id == second_id == json.loads(RunFolder(world / "wandb").tracking_file.read_text())["wandb"]
    assert config_logged["stages"][0]["base_lr"] == 5e-4 and config_logged["tracking"]["wandb"] is True
    rows = [row for row in first + second if "vqa/loss" in row]
    steps = logged(world / "wandb")
    assert [row["vqa/step"] for row in rows] == [1, 2, 3, 4]  # each step once: 1 and 2, then 3 and 4
    assert [[row[f"vqa/{name}"] for name in STEP_SCALARS] for row in rows] \
        == [[steps[step][name] for name in STEP_SCALARS] for step in steps]
    intervals = [row for row in first + second if "vqa/samples_per_s" in row]
    assert [row["vqa/step"] for row in intervals] == [2, 4]
    assert all(row["vqa/samples_per_s"] > 0 and row["vqa/data_wait_share"] >= 0 for row in intervals)
    assert any("vqa/eval_vqa_accuracy" in row for row in second)


# ---- MLflow (file store) ----------------------------------------------------------------------


def test_mlflow_file_store_holds_every_interval_s_values_and_a_resume_continues_its_run(world, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow is the `mlflow` extra (and the `test` extra's)")
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    with pytest.raises(RunConfigError, match=rf"^tracking\.mlflow_uri: {uri}: The filesystem tracking backend"):
        Trainer(tracked(world, "mlflow-refused", mlflow=True, mlflow_uri=uri)).fit()  # MLflow 3 refuses file stores
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # unless told
    crash_at_step_3_then_resume(tracked(world, "mlflow", mlflow=True, project="tiny", mlflow_uri=uri), monkeypatch)
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.run_id == json.loads(RunFolder(world / "mlflow").tracking_file.read_text())["mlflow"]
    assert run.info.run_name == "mlflow" and run.info.status == "FINISHED"
    assert run.data.params["stages.0.base_lr"] == "0.0005" and run.data.params["tracking.mlflow"] == "True"
    steps = logged(world / "mlflow")
    for name in STEP_SCALARS:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, f"vqa/{name}"))
        assert history == [(step, pytest.approx(steps[step][name])) for step in steps]  # each step once
    for name in INTERVAL_SCALARS:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, f"vqa/{name}")) == [2, 4]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "vqa/eval_vqa_accuracy")] == [4]
