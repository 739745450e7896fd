"""Losses of the VL-BERT heads, normalised as the reference code does; computed in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # label of text elements that are not predicted


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the labelled tokens' logits (M, vocab) against their word ids (M,), averaged
    over the batch's M labelled tokens; 0 when there are none, with zero gradients rather than NaN."""
    if labels.shape[0] == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), labels)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class distributions, averaged over rows whose target is a distribution.

    Rows with an all-zero target (RoIs that were not masked, padding) are not predicted: every row
    is scored and those weigh 0, so that no host sync picks the others (0 when there are none).
    """
    logits = logits.reshape(-1, logits.shape[-1]).float()
    targets = targets.reshape(-1, targets.shape[-1]).float()
    predicted = (targets.sum(-1) - 1.0).abs() < 0.1
    return _mean_over(-(targets * F.log_softmax(logits, -1)).sum(-1), predicted)


def _mean_over(values: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The mean of `values` where `kept` (0 where nowhere), with a shape that does not depend on
    `kept`: selecting the kept ones would wait for the device to count them."""
    return torch.where(kept, values, 0.0).sum() / kept.sum().clamp(min=1)


def answer_loss(logits: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """VQA: binary cross-entropy against soft answer scores, summed over answers, mean over questions."""
    return F.binary_cross_entropy_with_logits(logits.float(), scores.float()) * scores.shape[-1]


def multiple_choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """VCR: each candidate's score against 1 for the right one and 0 for the others (sigmoid, as the reference)."""
    targets = F.one_hot(labels.long(), logits.shape[-1]).to(torch.float32)
    return F.binary_cross_entropy_with_logits(logits.float(), targets)


def grounding_loss(logits: torch.Tensor, labels: torch.Tensor, box_mask: torch.Tensor) -> torch.Tensor:
    """RefCOCO+: binary cross-entropy of every real RoI's score against whether it is referred to."""
    scores = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
    return _mean_over(scores, box_mask.bool())


def binary_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Image–text matching: binary cross-entropy of the score against 1 (pair) or 0 (not a pair)."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def hardest_negative_triplet_loss(scores: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """Unicoder-VL's retrieval loss: (B, 1 + 2n) scores of groups ordered (positive, n negative
    captions, n negative images); per direction, max(0, margin − positive + hardest negative), summed
    over both directions (λ1 = λ2 = 1) and averaged over the groups."""
    scores = scores.float()
    negatives = (scores.shape[1] - 1) // 2
    positive = scores[:, 0]
    hardest_caption = scores[:, 1 : 1 + negatives].max(dim=1).values
    hardest_image = scores[:, 1 + negatives :].max(dim=1).values
    return (F.relu(margin - positive + hardest_caption) + F.relu(margin - positive + hardest_image)).mean()


def group_softmax_loss(scores: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """Cross-entropy of each group's positive (column 0) against all its negatives at once: every
    negative gets a gradient, not only the hardest (`margin` unused)."""
    return F.cross_entropy(scores.float(), torch.zeros(len(scores), dtype=torch.long, device=scores.device))


def group_binary_loss(scores: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """Each pair of the groups classified alone (`binary_loss`; `margin` unused)."""
    return binary_loss(scores, labels)


# `VLBertConfig.matching_loss` → the loss of grouped matching scores (scores, labels, margin).
MATCHING_LOSSES = {
    "triplet": hardest_negative_triplet_loss,
    "softmax": group_softmax_loss,
    "binary": group_binary_loss,
}
