"""A stage's evaluation: its task's metric on a split, next to the chance level measured on the same
split, and the split's predictions in the benchmark's format.

In a run of several processes every rank evaluates a contiguous slice of the split and rank 0
merges the evaluators (`Evaluator.merge`), in rank order, so predictions come in the order of a
single process's; no rank waits idle on another's whole evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import Dataset, Subset

from train.data.collate import model_inputs, pixel_entries, to_device
from train.end2end import with_appearance
from train.engine.batches import Batch, evaluation_batches
from train.engine.distributed import World, gathered
from train.evaluation.item_scores import ItemScores
from train.tasks.base import Evaluator
from vlbert.utils.atomic import made_folder
from vlbert.utils.precision import Precision
from vlbert.utils.progress import progress_bar


@dataclass(frozen=True)
class EvaluationSetting:
    """How a stage evaluates, the same on each of its splits: `batch_size` items a batch, on `device` in
    `precision`, text padded with `pad_token_id`, `workers` DataLoader processes, sliced over `world`."""

    batch_size: int
    device: torch.device
    pad_token_id: int
    precision: Precision
    workers: int = 0
    world: World = field(default_factory=World)


@torch.no_grad()
def evaluate(evaluator: Evaluator, model, visual, dataset: Dataset, setting: EvaluationSetting,
             check_damaged: Callable[[Batch], None], *, predictions: Path | None = None, items: Path | None = None,
             desc: str = "evaluation") -> dict | None:
    """{"metric", "value", "chance", "samples", "precision", ...} of `evaluator` over `dataset` on
    rank 0 (None on the others); the predictions are written to `predictions` and each item's
    score to `items` (train/evaluation/item_scores.py; with its group where the task has groups) when
    given. `check_damaged` applies the damaged-record policy to each batch. With the end-to-end
    `visual` side, the setting's workers decode the images. Rank 0 shows its items' progress as
    `desc` (the console, and `vlbert pipeline status` through the step's progress file)."""
    device, precision, world = setting.device, setting.precision, setting.world
    if visual is not None:
        dataset = visual.with_images(dataset)
    part = shard(dataset, world)
    with progress_bar(len(part), desc, "item", enabled=world.rank == 0) as bar:
        for batch in evaluation_batches(part, setting.batch_size, setting.workers, setting.pad_token_id,
                                        device.type == "cuda"):
            check_damaged(batch)
            if batch.inputs is not None:
                inputs = to_device(batch.inputs, device)
                with precision.applied(device):
                    inputs = with_appearance(visual, inputs, pixel_entries(batch.inputs))
                    output = model(**model_inputs(model, inputs, training=False))
                evaluator.add(batch.samples, inputs, output)
            bar.update(batch.usable + len(batch.damaged))
    shards = gathered(evaluator.state(), world)
    if shards is None:
        return None
    evaluator.merge(shards)
    if predictions is not None:
        made_folder(predictions.parent)
        evaluator.write(predictions)
    result = {**evaluator.result(), "precision": precision.name}
    scores = evaluator.item_scores()
    if items is not None and scores:
        ItemScores(result["metric"], scores, evaluator.item_groups()).write(items)
    return result


def shard(dataset: Dataset, world: World) -> Dataset:
    """Rank r's contiguous r-th of `dataset` (sizes differ by one at most)."""
    if not world.distributed:
        return dataset
    size = len(dataset)
    return Subset(dataset, range(world.rank * size // world.size, (world.rank + 1) * size // world.size))
