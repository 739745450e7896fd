"""A training run: data paths, model size, and a list of stages, each with its own schedule.

`load_run_config` reads a YAML file and `RunConfig.from_dict` a mapping; both check every field
(unknown or missing names, types from the annotations, values), so a mistake is one
RunConfigError naming the file and field before anything trains.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping

from extract.modeling.precision import TRAINING_PRECISIONS
from extract.paths import check_apart
from train.engine.optimization import OPTIMIZERS
from train.tasks import TASKS
from vlbert import VLBertConfig
from vlbert.config import MODEL_SIZES
from vlbert.errors import UserError
from vlbert.typed_config import checked_fields, describe, did_you_mean, from_mapping, join_key, load_yaml, located

VISUAL_MODES = ("cached", "end2end")
DAMAGED_RECORD_POLICIES = ("fail", "skip")

# Fields that do not change what a run computes: a rerun in the same run folder may change them
# (and the run folder's recorded config then takes the new values), any other difference is refused. They say where
# outputs go, evaluation batching, data-loading workers, checkpointing, and whether damaged
# records are skipped (switching to "skip" after a failure is the point of the option).
# `stages[]` stands for every stage. The device counts by its type only (`COMPARED_AS`): another
# GPU computes the same, a CPU does not.
RESULT_NEUTRAL_FIELDS = frozenset({
    "out", "eval_batch_size", "damaged_records", "stages[].num_workers", "stages[].checkpoint_every",
    "stages[].checkpoint_minutes", "stages[].keep_checkpoints",
})
COMPARED_AS: dict[str, Callable[[Any], Any]] = {"device": lambda name: str(name).split(":")[0]}

EXISTING_PATH = {"must_exist": True}  # field metadata: an input the Trainer checks before training


class RunConfigError(UserError):
    """A run config that cannot be used: YAML, unknown or mistyped fields, missing paths, a stage the
    store cannot feed. The message names the file or field."""


class RunMismatchError(RunConfigError):
    """A run folder that holds a run with another config; the message lists every difference."""


@dataclass
class StageConfig:
    SETTINGS: ClassVar[str] = "stage settings"

    name: str
    task: str  # a name in train.tasks.TASKS
    steps: int
    batch_size: int = 16  # per process; a task's extra streams (text-only samples) add as many each
    base_lr: float = 1e-5  # per sample: the learning rate is base_lr × total batch, as in the reference code
    warmup_steps: int = 0
    optimizer: str = "adamw"  # or "sgd" (momentum 0.9)
    lr_milestones: list[int] = field(default_factory=list)  # steps dividing the LR by 10; none: linear decay
    weight_decay: float = 1e-4
    grad_accumulation: int = 1
    clip_grad_norm: float = 1.0
    visual: str = "cached"  # "end2end": the detector's trunk and res5 run on the cached boxes, with gradients
    # The task's own settings, checked against its `Task.options` type (e.g. pre-training's losses).
    options: Any = field(default_factory=dict, metadata={"checked_by": lambda value, where: value})
    # A checkpoint is written when either trigger fires, and at the stage's end.
    checkpoint_every: int = 0  # steps; 0: no step trigger
    checkpoint_minutes: float = 10.0  # wall time since the last checkpoint; 0: no time trigger
    keep_checkpoints: int = 2  # the newest ones kept per stage; 0: all
    # DataLoader processes that read, make and collate samples (0: the training process does).
    num_workers: int = 2
    # fp32 (TF32 off on CUDA: the reference numbers), tf32 (CUDA), bf16, or fp16 (CUDA, loss scaled).
    precision: str = "fp32"

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise RunConfigError(f"stage {self.name!r}: {problem}")

    def _problem(self) -> str | None:
        if self.task not in TASKS:
            return f"task {self.task!r} is not one of {', '.join(TASKS)}"
        options = TASKS[self.task].options
        if not isinstance(self.options, options):
            try:
                self.options = from_mapping(options, self.options, "options")
            except ValueError as exc:  # RunConfigError, or the options' own check
                return str(exc)
        if self.visual not in VISUAL_MODES:
            return f"visual {self.visual!r} is not one of {VISUAL_MODES}"
        if self.optimizer not in tuple(OPTIMIZERS):
            return f"optimizer {self.optimizer!r} is not one of {tuple(OPTIMIZERS)}"
        if self.precision not in TRAINING_PRECISIONS:
            return f"precision {self.precision!r} is not one of {', '.join(TRAINING_PRECISIONS)}"
        if self.steps < 1 or self.batch_size < 1 or self.grad_accumulation < 1:
            return "steps, batch_size and grad_accumulation must be positive"
        if min(self.checkpoint_every, self.checkpoint_minutes, self.keep_checkpoints, self.num_workers) < 0:
            return "checkpoint_every, checkpoint_minutes, keep_checkpoints and num_workers must not be negative"
        return None


def model_settings(value: Any, where: str = "model") -> dict[str, Any]:
    """A run's `model:` as a mapping: a size's name becomes {"size": name}; the fields are checked as
    VLBertConfig checks them (a misspelt `matching_loss` fails here, not when its stage starts)."""
    if isinstance(value, str):
        value = {"size": value}
    if not isinstance(value, Mapping):
        raise RunConfigError(f"{where}: expected a model size ({', '.join(MODEL_SIZES)}) or a mapping of "
                             f"VL-BERT config fields, found {describe(value)}")
    size = value.get("size", "base")
    if size not in MODEL_SIZES:
        raise RunConfigError(f"{where}.size: {size!r} is not one of {', '.join(MODEL_SIZES)}"
                             + did_you_mean(str(size), list(MODEL_SIZES)))
    fields = checked_fields(VLBertConfig, {k: v for k, v in value.items() if k != "size"}, where, RunConfigError)
    try:
        VLBertConfig.sized(size, **fields)
    except ValueError as exc:
        raise RunConfigError(f"{where}: {exc}") from None
    return {"size": size, **fields} if "size" in value else fields



@dataclass
class RunConfig:
    SETTINGS: ClassVar[str] = "run settings"

    out: str
    store: str = field(metadata=EXISTING_PATH)  # FeatureStore directory
    train_annotations: str = field(metadata=EXISTING_PATH)
    eval_annotations: str = field(metadata=EXISTING_PATH)
    vocabulary: str = field(metadata=EXISTING_PATH)  # directory with the tokenizer's vocab.txt
    stages: list[StageConfig]
    # Text-only corpus: a text file or a folder of them, one sentence or paragraph a line, documents
    # separated by blank lines (BookCorpus, Wikipedia after extraction).
    corpus: str | None = field(default=None, metadata=EXISTING_PATH)
    # The answer vocabulary of answer-scoring heads (an answers.txt of `vlbert data prepare`); default:
    # every training answer.
    answers: str | None = field(default=None, metadata=EXISTING_PATH)
    # Further annotation files (test splits) whose predictions each stage writes.
    predict: list[str] = field(default_factory=list, metadata=EXISTING_PATH)
    # For end-to-end stages: the images root (default: the store's images_root) and detector
    # weights (default: the store's checkpoint).
    images: str | None = field(default=None, metadata=EXISTING_PATH)
    detector_weights: str | None = field(default=None, metadata=EXISTING_PATH)
    # A named size (base, large, tiny: vlbert.config.MODEL_SIZES) or VLBertConfig fields, with an
    # optional `size` they change; the tokenizer and store set the vocabulary and feature sizes.
    # Without init_from or bert, the model starts from random weights at this size (default: base).
    model: dict[str, Any] = field(default_factory=dict, metadata={"checked_by": model_settings})
    # A save_pretrained directory (e.g. converted official weights), or a BERT checkpoint
    # directory saved by transformers (text side, sizes).
    init_from: str | None = field(default=None, metadata=EXISTING_PATH)
    bert: str | None = field(default=None, metadata=EXISTING_PATH)
    seed: int = 0
    max_length: int = 64  # text + RoIs + [END]
    max_regions: int = 100
    eval_batch_size: int = 64
    device: str = "cpu"
    damaged_records: str = "fail"  # "skip": train and evaluate without samples whose record is damaged

    def __post_init__(self) -> None:
        if self.damaged_records not in DAMAGED_RECORD_POLICIES:
            raise RunConfigError(f"damaged_records {self.damaged_records!r} is not one of {DAMAGED_RECORD_POLICIES}")
        if not self.stages:
            raise RunConfigError("stages: a run needs at least one stage")
        if "size" in self.model and self.start is not None:
            raise RunConfigError(f"model.size: {self.start[0]} sets the model's sizes; give a size only to start "
                                 "from random weights")
        names = [stage.name for stage in self.stages]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:  # the metrics file tells stages apart by name
            raise RunConfigError(f"stages: every stage needs its own name; repeated: {', '.join(repeated)}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        """A run from a mapping (a YAML file's, a pipeline step's), checked field by field."""
        return from_mapping(cls, values, error=RunConfigError)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def check_paths(self) -> None:
        """RunConfigError naming the first input path that does not exist; OutputOverlapError when
        `out` is, lies inside or holds one of them (a --restart empties `out`)."""
        inputs = []
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            for path in value if isinstance(value, list) else [value]:
                if spec.metadata.get("must_exist") and path is not None:
                    if not Path(path).exists():
                        raise RunConfigError(f"{spec.name}: {path} does not exist")
                    inputs.append((spec.name, path))
        check_apart(self.out, inputs, "out")

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    @property
    def start(self) -> tuple[str, str] | None:
        """(field, folder) of the checkpoint the model starts from: init_from, else bert; None for
        random weights."""
        return ("init_from", self.init_from) if self.init_from else ("bert", self.bert) if self.bert else None


def load_run_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The run a YAML file describes, `overrides` (e.g. command-line options) replacing its values;
    every problem is a RunConfigError starting with the file's name, and the line where it has one."""
    values, lines = load_yaml(Path(path).read_text(), str(path), RunConfigError)
    if isinstance(values, Mapping):
        values = {**values, **(overrides or {})}
    try:
        return RunConfig.from_dict(values)
    except RunConfigError as exc:
        raise RunConfigError(located(str(path), lines, exc)) from None


# ---- comparing a run with the one a run folder holds -----------------------------------------

_ABSENT = object()  # a field or stage one side of a comparison does not have


def run_differences(recorded: Mapping[str, Any], run: RunConfig) -> list[str]:
    """Every way `run` differs from the run a run folder recorded (`RunFolder.config`), one line each,
    leaving out RESULT_NEUTRAL_FIELDS."""
    found = []
    for path, old, new in _differences(_with_options(_with_precision(recorded)), run.to_dict(), ""):
        field_name = re.sub(r"\[\d+\]", "[]", path)
        compared = COMPARED_AS.get(field_name, lambda value: value)
        if field_name not in RESULT_NEUTRAL_FIELDS and compared(old) != compared(new):
            found.append(f"{path}: the run folder has {_shown(old)}, this config has {_shown(new)}")
    return found


def _with_precision(recorded: Mapping[str, Any]) -> Mapping[str, Any]:
    """A recorded run config from before stages had a precision, with the one they ran in: bf16 autocast on
    CUDA, fp32 elsewhere."""
    stages = recorded.get("stages")
    if not isinstance(stages, list) or all(not isinstance(s, dict) or "precision" in s for s in stages):
        return recorded
    ran = "bf16" if COMPARED_AS["device"](recorded.get("device", "cpu")) == "cuda" else "fp32"
    return {**recorded, "stages": [{"precision": ran, **s} if isinstance(s, dict) else s for s in stages]}


def _with_options(recorded: Mapping[str, Any]) -> Mapping[str, Any]:
    """A recorded run config from before stages had `options`, where every stage recorded every task's settings
    flat: its task's moved into `options`, the other tasks' dropped."""
    stages = recorded.get("stages")
    if not isinstance(stages, list) or all(not isinstance(s, dict) or "options" in s for s in stages):
        return recorded
    stage_fields = {spec.name for spec in dataclasses.fields(StageConfig)}
    every_task_options = {spec.name for task in TASKS.values() for spec in dataclasses.fields(task.options)}

    def migrated(stage: Any) -> Any:
        if not isinstance(stage, dict) or "options" in stage or stage.get("task") not in TASKS:
            return stage
        own = {spec.name for spec in dataclasses.fields(TASKS[stage["task"]].options)}
        kept = {k: v for k, v in stage.items() if k in stage_fields or k not in every_task_options}
        return {**kept, "options": {k: v for k, v in stage.items() if k in own and k not in stage_fields}}

    return {**recorded, "stages": [migrated(stage) for stage in stages]}


def _differences(old: Any, new: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in dict.fromkeys([*old, *new]):
            yield from _differences(old.get(key, _ABSENT), new.get(key, _ABSENT), join_key(path, key))
    elif isinstance(old, list) and isinstance(new, list):
        for i in range(max(len(old), len(new))):
            yield from _differences(old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT,
                                    f"{path}[{i}]")
    elif old != new:
        yield path, old, new


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "nothing"
    if isinstance(value, dict) and "name" in value:  # a stage only one side has
        return f"the stage {value['name']!r}"
    return json.dumps(value)
