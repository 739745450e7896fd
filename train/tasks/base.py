"""What every task is made of: the `Task` record (its hooks, which the engine calls), the data its
hooks draw on (`TaskData`), and the `Evaluator` base that scores a task's outputs."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset

from train.data.annotations import AnnotationFile
from train.data.collate import model_inputs
from train.data.datasets import AnnotatedDataset, Sample
from train.data.regions import RegionBank
from train.evaluation.item_scores import ItemGroups
from vlbert.modeling import VLBertPreTrainedModel

T = TypeVar("T")

# The model config fields a task's heads may set (`Task.model_config`), and their values elsewhere;
# a stage starting from another task's model sets them all, as the saved ones are the other task's.
HEAD_DEFAULTS = {"num_answers": 1, "with_relationship_head": False, "label_names": None}


@dataclass
class TaskData:
    """What every task's datasets draw on: the store, the tokenizer and the training annotations; and
    what a task builds from them or from its options once for the whole run (`shared`)."""

    regions: RegionBank
    tokenizer: Any
    max_length: int
    train: AnnotationFile
    built: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False)

    def shared(self, key: Hashable, build: Callable[[], T]) -> T:
        """`build()`, called once per `key` in a run: a task's inputs (an answer vocabulary, a text
        corpus), shared by its stages and evaluations."""
        if key not in self.built:
            self.built[key] = build()
        return self.built[key]


@dataclass
class NoOptions:
    """The `options:` of a task that has none."""

    SETTINGS: ClassVar[str] = "task options"


def model_loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor], options: Any) -> dict[str, torch.Tensor]:
    """The loss of a model whose forward computes it from the batch's targets."""
    return {"loss": model(**model_inputs(model, inputs)).loss}


@dataclass(frozen=True)
class Task:
    name: str
    model: type[VLBertPreTrainedModel]
    # (data, the stage's options, annotations, seed, training) → the dataset of a stage or of its evaluation
    dataset: Callable[[TaskData, Any, AnnotationFile, int, bool], AnnotatedDataset]
    evaluator: Callable[[TaskData, AnnotatedDataset], Evaluator]
    about: str
    prediction_suffix: str | None = None  # the predictions file's, where the task writes one
    options: type = NoOptions  # the dataclass that a stage's `options:` mapping is checked against
    # (data, options) → the VLBertConfig fields this task's heads need (HEAD_DEFAULTS' or others)
    model_config: Callable[[TaskData, Any], dict[str, Any]] = lambda data, options: {}
    # (the store's regions, options) → why the store cannot feed the task, or None
    store_problem: Callable[[RegionBank, Any], str | None] = lambda regions, options: None
    # (data, options) → anything (unused): reads the task's own input files (its options' paths) into
    # `data.shared` before anything trains, so that one that cannot be used stops the run at once
    read_inputs: Callable[[TaskData, Any], object] = lambda data, options: None
    # (data, options, seed) → datasets whose batches join each of the task's (text-only samples)
    extra_streams: Callable[[TaskData, Any, int], list[Dataset]] = lambda data, options, seed: []
    # options → {state-dict prefix of a head that the stage must find trained in the checkpoint it starts
    # from (a VL-BERT one, never BERT or random weights): why}; the trainer refuses a start without it
    pretrained_heads: Callable[[Any], dict[str, str]] = lambda options: {}
    # (model, a batch's inputs on the device, options) → {"loss": ..., other logged losses}
    loss: Callable[[torch.nn.Module, dict[str, torch.Tensor], Any], dict[str, torch.Tensor]] = model_loss
    # options that a stage leaves unset (None) and takes from the run's previous stage of the task that set
    # them, as run.json then records: the head it continues was built for them (VQA's answers)
    carried_options: tuple[str, ...] = ()

    def model_overrides(self, data: TaskData, options: Any) -> dict[str, Any]:
        """Every HEAD_DEFAULTS field and the task's own model config fields, as this task's stage sets them."""
        return {**HEAD_DEFAULTS, **self.model_config(data, options)}


# ---- evaluation: one Evaluator per task, fed batch by batch -----------------------------------


def union(first: dict, second: dict) -> dict:
    return {**first, **second}


def filled(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Two shards' score matrices, each NaN where the other scored."""
    return np.where(np.isnan(first), second, first)


class Evaluator:
    """Scores a task's outputs batch by batch; `result()` gives {"metric", "value", "chance"} (value
    None where the split has no labels), `write(path)` the predictions file, and `item_scores()`
    each scored item's score (id → 0–1), whose mean is `value`: what paired comparisons and
    bootstrap intervals resample without running the model again.

    `merged` names what `add` accumulates and how two shards' values combine: ranks evaluate
    slices of a split, and rank 0 merges their `state()`s in rank order."""

    metric = ""
    merged: ClassVar[dict[str, Callable[[Any, Any], Any]]] = {}

    def add(self, samples: list[Sample], inputs: dict[str, torch.Tensor], output) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.merged}

    def merge(self, states: list[dict[str, Any]]) -> None:
        """Takes the combined accumulations of every shard's `state()` (this one's among them)."""
        for name, combine in self.merged.items():
            setattr(self, name, reduce(combine, [state[name] for state in states]))

    def result(self) -> dict[str, Any]:
        raise NotImplementedError

    def write(self, path: Path) -> None:
        """The predictions in the benchmark's format (tasks without one write nothing)."""

    def item_scores(self) -> dict[str, float]:
        return {}

    def item_groups(self) -> ItemGroups | None:
        """The scored items' groups, where the task sorts its items into some (VQA: answer types), for
        paired comparisons within each group; None where it does not."""
        return None


def scored(metric: str, correct: float, chance: float, count: int) -> dict[str, Any]:
    return {"metric": metric, "value": round(correct / max(count, 1), 4), "chance": round(chance / max(count, 1), 4),
            "samples": count}


def unscored(metric: str, count: int) -> dict[str, Any]:
    """A split without labels (a test split): predictions only."""
    return {"metric": metric, "value": None, "chance": None, "samples": count}

