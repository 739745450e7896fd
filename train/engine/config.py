"""A training run: data paths, model size, and a list of stages, each with its own schedule."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASKS = ("pretrain", "vqa", "choice", "refexp")
VISUAL_MODES = ("cached", "end2end")


@dataclass
class StageConfig:
    name: str
    task: str  # "pretrain", "vqa", "choice" (multiple choice, VCR-style Q→A) or "refexp"
    steps: int
    batch_size: int = 16  # per process; pre-training adds as many text-only samples when `text_only`
    base_lr: float = 1e-5  # per sample: the learning rate is base_lr × total batch, as in the reference code
    warmup_steps: int = 0
    weight_decay: float = 1e-4
    grad_accumulation: int = 1
    clip_grad_norm: float = 1.0
    visual: str = "cached"  # "end2end": the detector's trunk and res5 run on the cached boxes, with gradients
    # Pre-training losses (the paper's Table 4 ablations switch them).
    masked_lm: bool = True
    masked_roi: bool = True
    roi_masking: str = "pixel"  # "pixel": cached masked-pixel variants; "feature": appearance zeroed
    relationship: bool = False
    text_only: bool = True
    num_choices: int = 4  # candidates per question in "choice" stages
    checkpoint_every: int = 0  # steps; 0: only at the stage's end
    num_workers: int = 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"stage {self.name!r}: task {self.task!r} is not one of {TASKS}")
        if self.visual not in VISUAL_MODES:
            raise ValueError(f"stage {self.name!r}: visual {self.visual!r} is not one of {VISUAL_MODES}")
        if self.task == "pretrain" and not (self.masked_lm or self.masked_roi or self.relationship):
            raise ValueError(f"stage {self.name!r}: pre-training needs at least one of masked_lm, masked_roi, relationship")
        if self.steps < 1 or self.batch_size < 1 or self.grad_accumulation < 1:
            raise ValueError(f"stage {self.name!r}: steps, batch_size and grad_accumulation must be positive")


@dataclass
class RunConfig:
    out: str
    store: str  # FeatureStore directory
    train_annotations: str
    eval_annotations: str
    vocabulary: str  # directory with the tokenizer's vocab.txt
    stages: list[StageConfig]
    corpus: str | None = None  # text-only corpus, one sentence per line
    images: str | None = None  # images root, for end-to-end stages (default: the store's images_root)
    detector_weights: str | None = None  # for end-to-end stages (default: the store's checkpoint)
    model: dict[str, Any] = field(default_factory=dict)  # VLBertConfig fields
    init_from: str | None = None  # a save_pretrained directory (e.g. converted official weights)
    bert: str | None = None  # or a BERT checkpoint directory saved by transformers (text side, sizes)
    seed: int = 0
    max_length: int = 64  # text + RoIs + [END]
    max_regions: int = 100
    eval_batch_size: int = 64
    device: str = "cpu"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        values = dict(values)
        values["stages"] = [StageConfig(**stage) for stage in values.get("stages", [])]
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown run config field(s): {', '.join(unknown)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @property
    def out_dir(self) -> Path:
        return Path(self.out)
