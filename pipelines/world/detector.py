"""The demo detector: the `tiny` preset trained on a world's train split, evaluated on its val split."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import yaml
from safetensors.torch import save_file

from extract import Detector
from extract.training.config import TrainConfig
from extract.training.data import DetectionExample
from extract.training.evaluate import evaluate_detector
from extract.training.loop import train_detector
from pipelines.world.generate import load_split, load_world_image
from pipelines.world.vocabulary import ATTRIBUTE_NAMES, CLASS_NAMES
from vlbert.utils.atomic import write_atomically

# Field overrides of the `tiny` preset, written into the detector's YAML next to its vocabulary.
DEMO_OVERRIDES: dict[str, Any] = {
    # Inputs scaled to about unit variance: the trunk trains from scratch, its frozen norms hold no statistics.
    "pixel_std": [57.375, 57.12, 58.395],
    # 7x7 RoI pooling instead of 14x14: res5 on every RoI dominates CPU time, 4x less of it.
    "pooler_resolution": 7,
}


def check_attribute_names(names: Sequence[str]) -> None:
    """A detector's attributes: the world's, each once, at least one."""
    unknown = [name for name in names if name not in ATTRIBUTE_NAMES]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"attributes {','.join(names)!r}: expected one or more distinct names of "
                         f"{', '.join(ATTRIBUTE_NAMES)}" + (f" ({', '.join(unknown)} is not one)" if unknown else ""))


def detection_examples(world_dir: str | Path, split: str,
                       attribute_names: Sequence[str] = ATTRIBUTE_NAMES) -> list[DetectionExample]:
    """The split's objects as detector targets; attributes not in `attribute_names` are left unlabelled."""
    classes = {name: i for i, name in enumerate(CLASS_NAMES)}
    attributes = {name: i for i, name in enumerate(attribute_names)}
    return [
        DetectionExample(
            image=load_world_image(world_dir, record),
            boxes=np.array([o["box"] for o in record["objects"]], dtype=np.float32).reshape(-1, 4),
            classes=np.array([classes[o["class"]] for o in record["objects"]], dtype=np.int64),
            attributes=[[attributes[a] for a in o["attributes"] if a in attributes] for o in record["objects"]],
        )
        for record in load_split(world_dir, split)
    ]


def demo_detector_config(attribute_names: Sequence[str] = ATTRIBUTE_NAMES) -> dict[str, Any]:
    return {"base": "tiny", "class_names": list(CLASS_NAMES), "attribute_names": list(attribute_names),
            "num_attributes": len(attribute_names), **DEMO_OVERRIDES}


def train_world_detector(world_dir: str | Path, weights_path: str | Path, config: TrainConfig = TrainConfig(),
                         log: Callable[[str], None] = print,
                         attribute_names: Sequence[str] = ATTRIBUTE_NAMES) -> dict[str, Any]:
    """Trains, writes WEIGHTS (.safetensors), its .yaml and .metrics.json; returns the metrics.

    `attribute_names`: the world's attributes the detector learns; it is not trained to separate the
    others (e.g. sizes only: a detector never taught the colours that its images show)."""
    check_attribute_names(attribute_names)
    weights_path = Path(weights_path)
    config_path = weights_path.with_suffix(".yaml")
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(config_path, yaml.safe_dump(demo_detector_config(attribute_names), sort_keys=False))
    det = Detector.build(str(config_path), init_seed=config.seed)
    train_examples, val_examples = (detection_examples(world_dir, split, attribute_names)
                                    for split in ("train", "val"))
    started = time.monotonic()
    history = train_detector(det, train_examples, config, log=log)
    seconds = time.monotonic() - started
    save_file({k: v.detach().contiguous() for k, v in det.state_dict().items()}, str(weights_path))
    quality = evaluate_detector(det, val_examples)
    metrics = {"train_images": len(train_examples), "steps": config.steps, "seed": config.seed,
               "attributes": list(attribute_names),
               "train_seconds": round(seconds, 1), "final_losses": history[-1] if history else {},
               "val": quality.to_dict()}
    write_atomically(weights_path.with_suffix(".metrics.json"), json.dumps(metrics, indent=2) + "\n")
    return metrics
