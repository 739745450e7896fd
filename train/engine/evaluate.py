"""A stage's evaluation: its task's metric on a split, next to the chance level measured on the same
split, and the split's predictions in the benchmark's format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import DataLoader

from train.data.collate import collate
from train.data.files import write_atomically
from train.end2end import PIXELS
from train.tasks import Evaluator, model_inputs


@torch.no_grad()
def evaluate(evaluator: Evaluator, model, visual, dataset, batch_size: int, device: torch.device, pad_token_id: int,
             usable: Callable[[list], list], predictions: Path | None = None, items: Path | None = None,
             workers: int = 0) -> dict:
    """{"metric", "value", "chance", "samples", ...} of `evaluator` over `dataset`; the predictions
    are written to `predictions` and each item's score to `items` ({"metric", "items": {id: score}})
    when given. `usable` takes each batch's samples and returns those to evaluate (the
    damaged-record policy). With the end-to-end `visual` side, `workers` DataLoader processes
    decode the images."""
    if visual is not None:
        dataset = visual.with_images(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=list, num_workers=workers)
    for samples in loader:
        samples = usable(samples)
        if not samples:
            continue
        batch = collate(samples, pad_token_id)
        inputs = {k: v.to(device) for k, v in batch.items() if torch.is_tensor(v)}
        if visual is not None:
            inputs["appearance"] = visual({**inputs, **{k: batch[k] for k in PIXELS}})
        # The masked-RoI token is a training-time corruption: the model sees every RoI as itself.
        given = {k: v for k, v in model_inputs(model, inputs, targets=False).items() if k != "masked_regions"}
        evaluator.add(samples, inputs, model(**given))
    if predictions is not None:
        predictions.parent.mkdir(parents=True, exist_ok=True)
        evaluator.write(predictions)
    result = evaluator.result()
    scores = evaluator.item_scores()
    if items is not None and scores:
        items.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(items, json.dumps({"metric": result["metric"], "items": scores}))
    return result
