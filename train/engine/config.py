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
from typing import Any, Callable, ClassVar, Iterator, Literal, Mapping

from train.engine.compiled import COMPILE_MODES
from train.engine.errors import RunConfigError, RunMismatchError  # noqa: F401 - the config's errors, named here too
from train.engine.optimization import OPTIMIZERS
from train.tasks import TASKS
from vlbert import VLBertConfig
from vlbert.config import MODEL_SIZES
from vlbert.utils.paths import output_folder
from vlbert.utils.precision import AUTO, TRAINING_PRECISIONS
from vlbert.utils.typed_config import (EXISTING_PATH, EXISTING_PATHS, SEEDS, above, at_least, checked_fields, describe,
                                 did_you_mean, from_mapping, join_key, load_with_bases, located, under_key,
                                 with_setting)

# The shortest sequence every task can build (vlbert.tokenization.fit_lengths): [CLS], one word piece
# of each of two text segments (VQA's question and [MASK], VCR's context and candidate) with their
# [SEP]s, the whole-image box, one RoI and [END].
SHORTEST_SEQUENCE = 8

# Fields that do not change what a run computes: a rerun in the same run folder may change them
# (and the run folder's recorded config then takes the new values), any other difference is refused. They say where
# outputs go, evaluation batching, data-loading workers, prefetching, where q8 features are decoded (the
# same bits either way), whether an unread pooler is skipped (the same bits too), checkpointing, logging
# intervals, and whether damaged records are skipped (switching to "skip" after a failure is the point of
# the option), and where the curves are tracked.
# `stages[]` stands for every stage, and a field's own fields are as neutral as it is. The device counts
# by its type only (`COMPARED_AS`): another GPU computes the same, a CPU does not.
RESULT_NEUTRAL_FIELDS = frozenset({
    "out", "eval_batch_size", "damaged_records", "stages[].num_workers", "stages[].checkpoint_every",
    "stages[].checkpoint_minutes", "stages[].keep_checkpoints", "stages[].log_every", "stages[].prefetch",
    "stages[].decode_on_device", "stages[].skip_unread_pooler", "tracking",
})
COMPARED_AS: dict[str, Callable[[Any], Any]] = {"device": lambda name: str(name).split(":")[0]}


@dataclass
class StageConfig:
    SETTINGS: ClassVar[str] = "stage settings"

    name: str
    task: str  # a name in train.tasks.TASKS
    # 0: evaluation only: the stage scores the model it starts from (init_from or the previous stage's)
    # as it is, with no optimiser step; every weight of its task's model must be in that checkpoint
    steps: int = field(metadata=at_least(0))
    # per process; a task's extra streams (text-only samples) add as many each
    batch_size: int = field(default=16, metadata=at_least(1))
    # per sample: the learning rate is base_lr × total batch, as in the reference code
    base_lr: float = field(default=1e-5, metadata=above(0))
    warmup_steps: int = field(default=0, metadata=at_least(0))
    optimizer: Literal[tuple(OPTIMIZERS)] = "adamw"  # or "sgd" (momentum 0.9)
    # steps dividing the LR by 10; none: linear decay
    lr_milestones: list[int] = field(default_factory=list, metadata=at_least(1))
    weight_decay: float = field(default=1e-4, metadata=at_least(0))
    grad_accumulation: int = field(default=1, metadata=at_least(1))
    clip_grad_norm: float = field(default=1.0, metadata=at_least(0))  # 0: no clipping
    # "end2end": the detector's trunk and res5 run on the cached boxes, with gradients
    visual: Literal["cached", "end2end"] = "cached"
    # The task's own settings, checked against its `Task.options` type (e.g. pre-training's losses).
    options: Any = field(default_factory=dict, metadata={"checked_by": lambda value, where: value})
    # A checkpoint is written when either trigger fires, and at the stage's end.
    checkpoint_every: int = field(default=0, metadata=at_least(0))  # steps; 0: no step trigger
    # wall time since the last checkpoint; 0: no time trigger
    checkpoint_minutes: float = field(default=10.0, metadata=at_least(0))
    keep_checkpoints: int = field(default=2, metadata=at_least(0))  # the newest ones kept per stage; 0: all
    # DataLoader processes that read, make and collate samples (0: the training process does); none (the
    # default): the cores this process may use, shared by the node's ranks, less one. run.json records it
    num_workers: int | None = field(default=None, metadata=at_least(0))
    # Steps between the losses' trips to the host, where they are logged and checked finite (a
    # checkpoint and the stage's end bring them too): a trip every step would keep the GPU waiting
    log_every: int = field(default=10, metadata=at_least(1))
    # Speed paths (docs/training.md, "Training fast"), each recorded in run.json under "speed":
    # batches of samples of similar lengths (the image's regions), so that little of a batch is padding
    length_buckets: bool = False
    # torch.compile of the model's forward and the task's losses as one graph, sequence lengths rounded
    # up to a multiple of 16; refused where torch cannot compile
    compile: bool = False
    # torch.compile's mode; "reduce-overhead" replays the compiled forward and backward as CUDA graphs
    compile_mode: Literal[COMPILE_MODES] = "default"
    # AdamW's and SGD's fused kernels on CUDA, their multi-tensor (foreach) ones elsewhere; false: one
    # parameter at a time
    fused_optimizer: bool = True
    # on CUDA: the next batch copied to the device on a side stream while the step computes
    prefetch: bool = True
    # q8 stores: features travel to the device as their 8-bit codes (and two float32 a row) and are
    # decoded there, to the host's values bitwise; false: the training batches' decoded by the DataLoader's
    # workers (float32)
    decode_on_device: bool = True
    # the pooled [CLS] (a dense layer and a tanh) not computed where no head of the task reads it (VQA,
    # referring expressions, pre-training without the relationship head): the same losses bit for bit
    skip_unread_pooler: bool = False
    # the encoder's layers as this library writes them, the query, key and value projections one GEMM
    # instead of three (vlbert.modeling.FusedBertLayers): the same weights and checkpoints, the outputs
    # to float rounding; false: transformers' BertEncoder
    fused_encoder_layers: bool = False
    # fp32 (TF32 off on CUDA: the reference numbers), tf32 (CUDA), bf16, or fp16 (CUDA, loss scaled).
    # auto: bf16 where the device computes it natively (CUDA, Ampere or later), else fp32; run.json records
    # what it resolved to
    precision: Literal[(*TRAINING_PRECISIONS, AUTO)] = "fp32"

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise RunConfigError(f"stage {self.name!r}: {problem}")

    def _problem(self) -> str | None:
        if self.task not in TASKS:
            return f"task {self.task!r} is not one of {', '.join(TASKS)}"
        if self.compile_mode != "default" and not self.compile:
            return f"compile_mode {self.compile_mode!r} does nothing without compile: true"
        options = TASKS[self.task].options
        if not isinstance(self.options, options):
            try:
                self.options = from_mapping(options, self.options, "options")
            except ValueError as exc:  # RunConfigError, or the options' own check
                return str(exc)
        return None

    @staticmethod
    def unknown_field_hint(name: str, values: Mapping[str, Any]) -> str | None:
        """A task's option given on its stage (as run files did before `options:`) is named as such."""
        tasks = _tasks_with_option(name)
        if not tasks:
            return None
        task = values.get("task") if values.get("task") in tasks else tasks[0]
        return f": an option of the task {task!r}, which goes under the stage's `options:`"


@dataclass
class TrackingConfig:
    """Where the run's curves go beside metrics.jsonl (train.engine.tracking): each step's losses, learning
    rate and gradient norm, each logging interval's samples/s, data wait and peak device memory, and the
    run config as its hyper-parameters. Each switch is a backend's name in `BACKENDS`."""

    SETTINGS: ClassVar[str] = "tracking settings"

    tensorboard: bool = True  # OUT/tensorboard/<i>-<stage>/
    wandb: bool = False  # Weights & Biases: the `wandb` extra; WANDB_MODE, WANDB_DIR and the rest as W&B reads them
    mlflow: bool = False  # MLflow: the `mlflow` extra
    project: str = "vlbert"  # the W&B project and the MLflow experiment
    name: str | None = None  # the tracked run's name; none: the run folder's name
    mlflow_uri: str | None = None  # MLflow's tracking URI; none: MLflow's own (MLFLOW_TRACKING_URI)


def model_settings(value: Any, where: str = "model") -> dict[str, Any]:
    """A run's `model:` as a mapping: a size's name becomes {"size": name}; the fields are checked as
    VLBertConfig checks them (a misspelt `matching_loss` fails here, not when its stage starts)."""
    if isinstance(value, str):
        value = {"size": value}
    if not isinstance(value, Mapping):
        raise RunConfigError(f"{where}: expected a model size ({', '.join(MODEL_SIZES)}) or a mapping of "
                             f"VL-BERT config fields, found {describe(value)}")
    size = value.get("size", "base")
    if not isinstance(size, str) or size not in MODEL_SIZES:
        raise RunConfigError(f"{where}.size: {describe(size)} is not one of {', '.join(MODEL_SIZES)}"
                             + did_you_mean(str(size), list(MODEL_SIZES)))
    fields = checked_fields(VLBertConfig, {k: v for k, v in value.items() if k != "size"}, where, RunConfigError)
    try:
        VLBertConfig.sized(size, **fields)
    except ValueError as exc:
        raise RunConfigError(f"{where}: {exc}") from None
    return {"size": size, **fields} if "size" in value else fields



def annotation_files(value: Any, where: str) -> str | list[str]:
    """`train_annotations`: one file, or a list of two or more different files."""
    if isinstance(value, str):
        return value
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(item, str) for item in value):
        raise RunConfigError(f"{where}: expected an annotation file or a list of them, found {describe(value)}")
    repeated = sorted({item for item in value if list(value).count(item) > 1})
    if repeated:
        raise RunConfigError(f"{where}: {repeated[0]} is listed twice (a file's weight is its number of items)")
    return value[0] if len(value) == 1 else list(value)


@dataclass
class RunConfig:
    SETTINGS: ClassVar[str] = "run settings"

    out: str
    store: str = field(metadata=EXISTING_PATH)  # FeatureStore directory
    # A file, or a list of files (corpora) that every stage mixes in proportion to their items; run.json
    # records the mixture.
    train_annotations: str | list[str] = field(metadata={**EXISTING_PATH, "checked_by": annotation_files})
    eval_annotations: str = field(metadata=EXISTING_PATH)
    vocabulary: str = field(metadata=EXISTING_PATH)  # directory with the tokenizer's vocab.txt
    stages: list[StageConfig]
    # Further annotation files (test splits) whose predictions each stage writes.
    predict: list[str] = field(default_factory=list, metadata=EXISTING_PATHS)
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
    seed: int = field(default=0, metadata=SEEDS)
    max_length: int = field(default=64, metadata=at_least(SHORTEST_SEQUENCE))  # text + RoIs + [END]
    max_regions: int = field(default=100, metadata=at_least(1))  # RoIs per image, the whole-image box not counted
    eval_batch_size: int = field(default=64, metadata=at_least(1))
    device: str = "cpu"
    # "skip": train and evaluate without samples whose record is damaged
    damaged_records: Literal["fail", "skip"] = "fail"
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        if not self.stages:
            raise RunConfigError("stages: a run needs at least one stage")
        if "size" in self.model and self.start is not None:
            raise RunConfigError(f"model.size: {self.start[0]} sets the model's sizes; give a size only to start "
                                 "from random weights")
        names = [stage.name for stage in self.stages]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:  # the metrics file tells stages apart by name
            raise RunConfigError(f"stages: every stage needs its own name; repeated: {', '.join(repeated)}")
        if self.stages[0].steps == 0 and not self.init_from:
            raise RunConfigError(f"stages[0].steps: 0 evaluates the model the run starts from without training it, "
                                 f"and this run starts from {'BERT' if self.bert else 'random weights'}: give "
                                 "init_from (a VL-BERT checkpoint with the task's heads), or steps ≥ 1")
        self._carry_options()

    def _carry_options(self) -> None:
        """Each stage's `Task.carried_options` that it leaves unset, from the run's previous stage of its
        task that set them (a stage appended with `+=` continues that stage's head)."""
        given: dict[tuple[str, str], Any] = {}
        stages = []  # new objects where an option is carried: the caller's stay as given
        for stage in self.stages:
            carried = {name: given.get((stage.task, name)) for name in TASKS[stage.task].carried_options
                       if getattr(stage.options, name) is None}
            if any(value is not None for value in carried.values()):
                stage = dataclasses.replace(stage, options=dataclasses.replace(stage.options, **carried))
            given.update({(stage.task, name): getattr(stage.options, name)
                          for name in TASKS[stage.task].carried_options})
            stages.append(stage)
        self.stages = stages

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        """A run from a mapping (a YAML file's, a pipeline step's), checked field by field."""
        return from_mapping(cls, values, error=RunConfigError)

    @staticmethod
    def unknown_field_hint(name: str, values: Mapping[str, Any]) -> str | None:
        """A run-level key that is a task's option (`corpus` and `answers` were run fields before they
        moved into the options of the tasks that read them) is named with where it goes."""
        tasks = _tasks_with_option(name)
        if not tasks:
            return None
        return (f": an option of the task {' and '.join(tasks)} now: give it in the options of each {tasks[0]} "
                f"stage (options: {{{name}: ...}})")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def input_paths(self) -> list[tuple[str, str]]:
        """(key, path) of every input path given: the run's fields and its stages' task options that
        are EXISTING_PATH."""
        return [*_input_paths(self, ""), *(pair for index, stage in enumerate(self.stages)
                                           for pair in _input_paths(stage.options, f"stages[{index}].options"))]

    def check_paths(self) -> None:
        """RunConfigError naming the first input path that does not exist; OutputOverlapError when
        `out` is, lies inside or holds one of them (a --restart empties `out`)."""
        for key, path in self.input_paths():
            if not Path(path).exists():
                raise RunConfigError(f"{key}: {path} does not exist")
        output_folder(self.out, self.input_paths(), "out")

    @property
    def out_dir(self) -> Path:
        return Path(self.out)

    @property
    def start(self) -> tuple[str, str] | None:
        """(field, folder) of the checkpoint the model starts from: init_from, else bert; None for
        random weights."""
        return ("init_from", self.init_from) if self.init_from else ("bert", self.bert) if self.bert else None

    def start_config(self) -> dict[str, Any] | None:
        """The config.json of the VL-BERT (save_pretrained) or BERT (transformers) checkpoint the model
        starts from (`start`; None: random weights); RunConfigError naming the field when it cannot be read."""
        from vlbert.modeling import CONFIG_NAME

        if self.start is None:
            return None
        field_name, folder = self.start
        path = Path(folder) / CONFIG_NAME
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise RunConfigError(f"{field_name}: {folder} holds no {CONFIG_NAME}; expected a checkpoint "
                                 "folder") from None
        except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError among them
            raise RunConfigError(f"{field_name}: {path} is not readable JSON ({exc})") from None
        if not isinstance(config, dict):
            raise RunConfigError(f"{field_name}: {path} is not a JSON object")
        return config


_RUN_FIELDS = frozenset(spec.name for spec in dataclasses.fields(RunConfig))


def _input_paths(config: Any, where: str) -> list[tuple[str, str]]:
    """(key, path) of each path given in the EXISTING_PATH fields of dataclass `config`."""
    return [(join_key(where, spec.name), path) for spec in dataclasses.fields(config) if spec.metadata.get("must_exist")
            for path in _listed(getattr(config, spec.name)) if path is not None]


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _tasks_with_option(name: str) -> list[str]:
    """The tasks whose `options:` have a field `name`."""
    return [task.name for task in TASKS.values() if name in {spec.name for spec in dataclasses.fields(task.options)}]


def load_run_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The run a YAML file describes, over the run files its `base:` names (vlbert.utils.typed_config's
    `load_with_bases`), `overrides` (command-line options and `--set` values: key path → value, such as
    `stages[0].base_lr`, `KEY+` appending) replacing its values in order; every problem is a RunConfigError
    starting with the file's name (a base's, where the key comes from one), and the line where it has one."""
    values, lines = load_with_bases(path, RunConfigError, expected="a run config file")
    overrides = overrides or {}
    try:
        if isinstance(values, Mapping):
            for key, value in overrides.items():
                values = with_setting(values, key, value, RunConfigError)
            lines = {line_key: line for line_key, line in lines.items()  # not the file's values
                     if not any(under_key(line_key, key.removesuffix("+")) for key in overrides)}
        return RunConfig.from_dict(values)
    except RunConfigError as exc:
        raise RunConfigError(located(str(path), lines, exc)) from None


# ---- comparing a run with the one a run folder holds -----------------------------------------

_ABSENT = object()  # a field or stage one side of a comparison does not have


def run_differences(recorded: Mapping[str, Any], run: RunConfig) -> list[str]:
    """Every way `run` differs from the run a run folder recorded (`RunFolder.config`), one line each,
    leaving out RESULT_NEUTRAL_FIELDS."""
    found = []
    older = _with_task_inputs(_with_options(_with_precision(_with_later_stage_fields(recorded))))
    for path, old, new in _differences(older, run.to_dict(), ""):
        field_name = re.sub(r"\[\d+\]", "[]", path)
        compared = COMPARED_AS.get(field_name, lambda value: value)
        neutral = any(under_key(field_name, key) for key in RESULT_NEUTRAL_FIELDS)
        if not neutral and compared(old) != compared(new):
            found.append(f"{path}: the run folder has {_shown(old)}, this config has {_shown(new)}")
    return found


# Stage fields that change what a stage computes, added after run folders were recorded without them:
# the value those runs had.
STAGE_FIELDS_ADDED_LATER = {"fused_encoder_layers": False}


def _with_later_stage_fields(recorded: Mapping[str, Any]) -> Mapping[str, Any]:
    """A recorded run config from before a stage field of STAGE_FIELDS_ADDED_LATER, with the value its stages had."""
    stages = recorded.get("stages")
    if not isinstance(stages, list):
        return recorded
    return {**recorded, "stages": [{**STAGE_FIELDS_ADDED_LATER, **s} if isinstance(s, dict) else s for s in stages]}


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


def _with_task_inputs(recorded: Mapping[str, Any]) -> Mapping[str, Any]:
    """A recorded run config from before `corpus` and `answers` moved into the options of the tasks that
    read them: each run-level one moved into the options of every stage whose task has it."""
    moved = {key: value for key, value in recorded.items() if key not in _RUN_FIELDS and _tasks_with_option(key)}
    if not moved or not isinstance(recorded.get("stages"), list):
        return recorded

    def migrated(stage: Any) -> Any:
        if not isinstance(stage, dict) or not isinstance(stage.get("options"), dict):
            return stage
        own = {key: value for key, value in moved.items() if stage.get("task") in _tasks_with_option(key)}
        return {**stage, "options": {**own, **stage["options"]}}

    kept = {key: value for key, value in recorded.items() if key not in moved}
    return {**kept, "stages": [migrated(stage) for stage in recorded["stages"]]}


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
