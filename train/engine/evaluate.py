"""Each task's metric on the evaluation split, next to the chance level measured on the same split."""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
from torch.utils.data import DataLoader

from train.data.collate import collate


@torch.no_grad()
def evaluate(task: str, model, visual, dataset, batch_size: int, device: torch.device, pad_token_id: int,
             usable: Callable[[list], list]) -> dict:
    """{"metric", "value", "chance", "samples"}: VQA accuracy (soft score of the top answer) against
    the majority answer; multiple-choice accuracy against always picking the most frequent right
    position; referring-expression accuracy (top RoI with IoU ≥ 0.5) against a uniformly random RoI;
    pre-training: masked-word accuracy against always predicting the most common word.
    `usable` takes each batch's samples and returns those to evaluate (the damaged-record policy)."""
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=list)
    correct, chance, count = 0.0, 0.0, 0
    answer_scores = None
    words, positions = Counter(), Counter()
    for samples in loader:
        batch = collate(usable(samples), pad_token_id)
        inputs = {k: v.to(device) for k, v in batch.items() if torch.is_tensor(v)}
        if visual is not None:
            inputs["appearance"] = visual({**inputs, "image_files": batch["image_files"]})
        labels = inputs.pop("labels", None)
        iou = inputs.pop("iou", None)
        mlm_labels = inputs.pop("mlm_labels")
        inputs.pop("masked_regions", None)
        if task == "pretrain":
            inputs.pop("region_labels", None)
            inputs.pop("relationship_labels", None)
            logits = model(**inputs).mlm_logits
            chosen = mlm_labels != -100
            correct += float((logits.argmax(-1)[chosen] == mlm_labels[chosen]).sum())
            words.update(mlm_labels[chosen].tolist())
            count += int(chosen.sum())
        elif task == "choice":
            logits = model(**inputs).logits
            correct += float((logits.argmax(1) == labels).sum())
            positions.update(labels.tolist())
            count += len(labels)
        elif task == "vqa":
            logits = model(**inputs).logits
            correct += float(labels.gather(1, logits.argmax(1, keepdim=True)).sum())
            answer_scores = labels.sum(0) if answer_scores is None else answer_scores + labels.sum(0)
            count += len(labels)
        else:
            logits = model(**inputs).logits
            candidates = inputs["box_mask"].clone()
            candidates[:, 0] = False  # the whole-image box is not a candidate
            top = logits.masked_fill(~candidates, float("-inf")).argmax(1)
            correct += float((iou.gather(1, top[:, None]) >= 0.5).sum())
            positives = ((iou >= 0.5) & candidates).sum(1).float()
            chance += float((positives / candidates.sum(1).clamp(min=1)).sum())
            count += len(iou)
    if task == "vqa" and answer_scores is not None:
        chance = float(answer_scores.max())
    if task == "pretrain":
        chance = float(words.most_common(1)[0][1]) if words else 0.0
    if task == "choice":
        chance = float(positions.most_common(1)[0][1]) if positions else 0.0
    metric = {"pretrain": "masked_word_accuracy", "vqa": "vqa_accuracy", "choice": "choice_accuracy",
              "refexp": "refexp_accuracy"}[task]
    return {"metric": metric, "value": round(correct / max(count, 1), 4), "chance": round(chance / max(count, 1), 4),
            "samples": count}
