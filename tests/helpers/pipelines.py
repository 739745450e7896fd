"""Running the shipped pipeline files in tests: images for their tiny published-format datasets, the
starting checkpoints they take as inputs, and a run through the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np
import yaml
from click.testing import CliRunner
from PIL import Image

from extract.presets import load_config
from pipelines.cli import main
from pipelines.world.tiny import TINY_MODEL
from train.data.vocabulary import write_vocabulary
from vlbert import VLBertConfig
from vlbert.modeling import VLBertForPreTraining

DETECTOR = Path(__file__).resolve().parents[2] / "pipelines" / "data" / "demo_detector.yaml"

# A world, a step that fails (the text file it reads is missing), one that reads it and one that does not.
STEPS_WITH_A_FAILURE = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
                        {"name": "bad", "kind": "vocabulary", "texts": ["${world}/missing.jsonl"]},
                        {"name": "after-bad", "kind": "vocabulary", "texts": ["${bad}/vocab.txt"]},
                        {"name": "fine", "kind": "vocabulary", "world": "${world}"}]


def write_pipeline(folder: Path, steps: list[dict], file: str = "pipeline.yaml", **top) -> Path:
    """A pipeline file of `steps` (and top-level `top` keys) in `folder`, writing under folder/out."""
    path = folder / file
    path.write_text(yaml.safe_dump({"name": "test", "out": str(folder / "out"), "steps": steps, **top}))
    return path


def train_step_on(world: Path, name: str, task: str = "vqa", steps: int = 2, **fields) -> dict:
    """A tiny train step on the tiny world's store, annotations and vocabulary (tests/conftest.py)."""
    return {"name": name, "kind": "train", "store": str(world / "cache"),
            "train_annotations": str(world / "world" / "train.jsonl"),
            "eval_annotations": str(world / "world" / "val.jsonl"), "vocabulary": str(world / "vocab"),
            "max_length": 40, "model": dict(TINY_MODEL),
            "stages": [{"name": task, "task": task, "steps": steps, "batch_size": 4, "num_workers": 0}], **fields}


def step_record(out: Path, step: str) -> dict:
    """The step.json of `step` in the run folder `out`."""
    return json.loads((out / step / "step.json").read_text())


def write_image(path: Path, seed: int) -> None:
    """A 96×128 image with a few coloured rectangles (the demo detector finds boxes in anything)."""
    rng = np.random.default_rng(seed)
    pixels = np.full((96, 128, 3), 200, np.uint8)
    for _ in range(3):
        x, y = rng.integers(0, 90), rng.integers(0, 60)
        pixels[y: y + 30, x: x + 36] = rng.integers(0, 255, 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def tiny_checkpoints(tmp_path: Path, words: Iterable[str]) -> dict[str, str]:
    """--set values for the detector and the starting models: the demo detector with its weights, a
    vocabulary of `words`, and a tiny VL-BERT saved as `vlbert convert-official` saves one."""
    bert = write_vocabulary([" ".join(words)], tmp_path / "bert")
    detector = load_config(str(DETECTOR))
    config = VLBertConfig(**TINY_MODEL, vocab_size=len((bert / "vocab.txt").read_text().split()),
                          visual_feature_size=detector.feature_dim, num_detector_classes=detector.num_classes + 1)
    VLBertForPreTraining(config).save_pretrained(tmp_path / "vlbert")
    return {"detector": str(DETECTOR), "detector_weights": str(DETECTOR.with_suffix(".safetensors")),
            "bert": str(bert), "vlbert": str(tmp_path / "vlbert")}


def run_pipeline_file(pipeline: Path, out: Path, settings: dict[str, str]):
    """`vlbert pipeline run PIPELINE --jobs 1 --set out=OUT --set NAME=VALUE...`, which must succeed (steps
    in this process: what these tests check is the shipped files, not how their steps are scheduled)."""
    arguments = ["pipeline", "run", str(pipeline), "--jobs", "1", "--set", f"out={out}"]
    for name, value in settings.items():
        arguments += ["--set", f"{name}={value}"]
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0, result.output
    return result
