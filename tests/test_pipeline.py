"""Pipeline files: steps chain, up-to-date steps are skipped, interrupted ones resume, reports are written."""

import json

import pytest
import torch
import yaml

from pipelines.runner import PipelineError, run_pipeline
from training_world import TINY_MODEL

COMMON = {"store": "${cache}", "train_annotations": "${world}/train.jsonl", "eval_annotations": "${world}/val.jsonl",
          "vocabulary": "${vocabulary}", "corpus": "${world}/corpus.txt", "images": "${world}", "max_length": 40,
          "model": TINY_MODEL}


def pipeline_file(tmp_path, vqa_steps=3):
    steps = [
        {"name": "world", "kind": "world", "images": 16, "seed": 5},
        {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "mask_variants": 1,
         "batch_size": 4, "progress": False},
        {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
        {"name": "pretrain", "kind": "train", **COMMON,
         "stages": [{"name": "pretrain", "task": "pretrain", "steps": 2, "batch_size": 4}]},
        {"name": "vqa-frozen", "kind": "train", "detector": "frozen", **COMMON,
         "init_from": "${pretrain}/stages/0-pretrain/final",
         "stages": [{"name": "vqa", "task": "vqa", "steps": vqa_steps, "batch_size": 4}]},
        {"name": "vqa-tuned", "kind": "train", "detector": "tuned", **COMMON,
         "init_from": "${pretrain}/stages/0-pretrain/final",
         "stages": [{"name": "vqa", "task": "vqa", "steps": 2, "batch_size": 4, "checkpoint_every": 1},
                    {"name": "vqa-e2e", "task": "vqa", "steps": 1, "batch_size": 2, "visual": "end2end"}]},
        {"name": "report", "kind": "report", "runs": ["${vqa-frozen}", "${vqa-tuned}"]},
    ]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "test", "out": str(tmp_path / "out"), "steps": steps}))
    return path


def test_pipeline_runs_skips_resumes_and_reports(tmp_path, monkeypatch):
    path = pipeline_file(tmp_path)
    original_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def crash_in_tuned_run(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2 + 3 + 2:  # pretrain 2, vqa-frozen 3, then the tuned run's second step
            raise RuntimeError("simulated crash")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", crash_in_tuned_run)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_pipeline(path, log=lambda _: None)
    monkeypatch.setattr(torch.optim.AdamW, "step", original_step)

    messages = []
    out = run_pipeline(path, log=messages.append)
    assert "[world] up to date" in messages and "[vqa-frozen] up to date" in messages
    assert "[vqa-tuned] resuming an interrupted run" in messages
    report = json.loads((out / "report" / "report.json").read_text())
    assert [(r["name"], r["detector"], r["task"], r["metric"]) for r in report["runs"]] == [
        ("vqa-frozen", "frozen", "vqa", "vqa_accuracy"), ("vqa-tuned", "tuned", "vqa", "vqa_accuracy")]
    assert [r["init_from"] for r in report["runs"]] == ["pretrain/stages/0-pretrain/final"] * 2
    for row in report["runs"]:
        assert 0 <= row["value"] <= 1 and 0 < row["chance"] <= 1 and row["wall_s"] > 0 and row["samples_per_s"] > 0
    assert (out / "report" / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "| vqa-tuned | tuned | vqa |" in (out / "report" / "report.md").read_text()

    messages.clear()
    run_pipeline(path, log=messages.append)
    assert all(m.endswith("up to date") for m in messages if m.startswith("["))

    messages.clear()
    run_pipeline(pipeline_file(tmp_path, vqa_steps=4), log=messages.append)
    assert "[vqa-frozen] parameters or inputs changed: starting again" in messages
    assert "[vqa-tuned] up to date" in messages and "[report] parameters or inputs changed: starting again" in messages


@pytest.mark.parametrize("steps, message", [
    ([{"name": "a", "kind": "bake"}], "unknown kind 'bake'"),
    ([{"name": "a", "kind": "world", "x": "${b}"}], r"refers to \$\{b\}, not an earlier step"),
    ([{"kind": "world"}], "needs a `name` and a `kind`"),
])
def test_bad_pipelines_are_named(tmp_path, steps, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"steps": steps}))
    with pytest.raises(PipelineError, match=message):
        run_pipeline(path)


def test_train_command_runs_a_yaml_config_and_names_bad_ones(tmp_path):
    from click.testing import CliRunner

    from pipelines.cli import main
    from train.engine.config import StageConfig
    from training_world import make_world, run_config

    root = make_world(tmp_path, images=12)
    run = run_config(root, "cli-run", [StageConfig("refexp", "refexp", steps=2, batch_size=2)])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run.to_dict()))
    result = CliRunner().invoke(main, ["train", str(config)])
    assert result.exit_code == 0, result.output
    assert json.loads((root / "cli-run" / "stages" / "0-refexp" / "eval.json").read_text())["metric"] == "refexp_accuracy"
    again = CliRunner().invoke(main, ["train", str(config)])
    assert again.exit_code == 0  # a finished run has nothing left to do
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({**run.to_dict(), "stages": [{"name": "x", "task": "dance", "steps": 1}]}))
    result = CliRunner().invoke(main, ["train", str(broken)])
    assert result.exit_code != 0 and "task 'dance' is not one of" in result.output


@pytest.mark.parametrize("name", ["demo", "pretrain_finetune", "ablation"])
def test_shipped_pipelines_are_well_formed(name):
    from pathlib import Path

    from pipelines.runner import load_pipeline
    from train.engine.config import RunConfig

    pipeline = load_pipeline(Path(__file__).parents[1] / "pipelines" / "configs" / f"{name}.yaml")
    trains = [s for s in pipeline["steps"] if s["kind"] == "train"]
    assert trains
    for step in trains:
        values = {k: v for k, v in step.items() if k not in ("name", "kind", "detector")}
        RunConfig.from_dict({**values, "out": "unused"})  # every field known, every stage valid
    report = [s for s in pipeline["steps"] if s["kind"] == "report"]
    assert len(report) == 1 and len(report[0]["runs"]) >= 2
