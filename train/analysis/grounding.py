"""Entity grounding by attention heads, as the VisualBERT analysis ("What does BERT with vision look
at?") measures it: each head is a classifier that predicts, for a phrase, the region its word pieces
attend to most (averaged over the pieces; compared among the image's regions only, other words
ignored); the prediction is right when that region's box has IoU ≥ 0.5 with the annotated box. A
head attending equally to several regions (as an untrained model does) picks among them at random,
scored in expectation. `region_attention` is the share of the phrase's attention that goes to the
regions at all (the paper calls heads above 0.2 "actively attending to the image").

Regions are the detector's RoIs: VL-BERT's whole-image box is left out, as VisualBERT has none and
the referring-expression task never answers with it. Two baselines: a uniformly drawn RoI (its
expected accuracy) and the paper's rule, the most confident RoI (the store keeps boxes best first).

A phrase whose annotated box is no box (a coordinate NaN or infinite, or x2 <= x1 or y2 <= y1: no
IoU with it can reach the threshold) cannot be scored: it is left out of every figure, and the
result names it (`left_out`: its id, text, box and problem), rather than counting it as a miss.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from train.analysis.common import (batch_text_attention, box_problem, caption_sample, could_not_start, left_out,
                                   open_model, piece_masks, pieces_mean, span_pieces)
from train.analysis.figures import Example, draw_example, draw_heat_map
from train.analysis.grounding_results import Best, GroundingResult, HeadFigures, HeadScores, HeldOutBest, Intervals
from train.analysis.phrases import PHRASE_READERS, Phrase
from train.analysis.verdicts import against, rounded_interval
from train.data.collate import collate
from train.data.datasets import Sample
from train.data.files import DataError
from train.data.regions import RegionBank
from train.evaluation.refer import box_ious
from train.evaluation.statistics import LEVEL, bootstrap_interval, paired_comparison
from vlbert.modeling import VLBertModel
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.device import check_device

IOU_THRESHOLD = 0.5
TIE_TOLERANCE = 1e-6  # relative


def most_attended(region_attention: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """(B, layers, heads, N) bool: the candidate regions (candidates: (B, N) bool) each head attends to
    most; several where it attends to them equally (up to float noise), as an untrained model does,
    whose RoI embeddings are all alike while the visual gains are still 0."""
    scores = region_attention.masked_fill(~candidates[:, None, None], float("-inf"))
    top = scores.amax(-1, keepdim=True)
    return candidates[:, None, None] & (scores >= top - TIE_TOLERANCE * top.abs())


def matching_share(chosen: torch.Tensor, matches: torch.Tensor) -> torch.Tensor:
    """The share of the chosen regions (…, N) that match the box: a pick among them made at random
    grounds the phrase with this probability (0 where none is chosen)."""
    return (chosen & matches).sum(-1) / chosen.sum(-1).clamp(min=1)


@dataclass
class GroundingTally:
    """Per phrase and per layer and head, whether the phrase was grounded (ties broken at random, in
    expectation), with the baselines' scores and the attention shares alongside, so that `result()`
    gives means over every phrase added and bootstrap intervals over the phrases."""

    layers: int
    heads: int
    grounded: list[np.ndarray] = field(default_factory=list)  # (B, layers, heads) per `add`
    random: list[np.ndarray] = field(default_factory=list)  # (B,) the random RoI's expected score
    confident: list[np.ndarray] = field(default_factory=list)  # (B,) the most confident RoI's score
    region_share: np.ndarray = field(init=False)  # attention mass the phrase gives to all candidates

    def __post_init__(self) -> None:
        self.region_share = np.zeros((self.layers, self.heads))

    def add(self, region_attention: torch.Tensor, candidates: torch.Tensor, iou: torch.Tensor) -> torch.Tensor:
        """Adds B phrases: region_attention (B, layers, heads, N), candidates (B, N) bool, iou (B, N)
        of each region with the phrase's box. Returns (B, layers, heads): 1 where the head grounds the
        phrase, 0 where not; a head torn between regions scores the share of them that match."""
        matches = iou >= IOU_THRESHOLD
        grounded = matching_share(most_attended(region_attention, candidates), matches[:, None, None])
        most_confident = candidates & (candidates.cumsum(1) == 1)  # the store keeps boxes best first
        self.grounded.append(grounded.cpu().numpy())
        self.region_share += (region_attention * candidates[:, None, None]).sum((0, -1)).cpu().numpy()
        self.random.append(matching_share(candidates, matches).cpu().numpy())
        self.confident.append(matching_share(most_confident, matches).cpu().numpy())
        return grounded

    @property
    def count(self) -> int:
        return sum(len(rows) for rows in self.random)

    def scores(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(phrases, layers, heads) head scores, (phrases,) random and most-confident baseline scores."""
        if not self.grounded:
            return np.zeros((0, self.layers, self.heads)), np.zeros(0), np.zeros(0)
        return tuple(np.concatenate(parts).astype(np.float64) for parts in (self.grounded, self.random, self.confident))

    def accuracy(self) -> np.ndarray:
        grounded = self.scores()[0]
        return grounded.mean(0) if len(grounded) else np.zeros((self.layers, self.heads))

    def result(self, allowed: np.ndarray | None = None, unit: str = "phrases") -> HeadScores:
        """Layers and heads are numbered from 1 in `best` (row i of the tables is layer i + 1); the
        best head is chosen among the `allowed` ones ((layers, heads) bool; default all).

        The best head's accuracy is the maximum of layers × heads estimates, biased upwards on few
        phrases; `held_out_best` removes that bias: the head is chosen on the even-numbered phrases
        (or arcs: `unit`) and scored on the odd-numbered ones, and compared there with both baselines,
        item by item."""
        grounded, random, confident = self.scores()
        accuracy = self.accuracy()
        chosen = best_head(accuracy, allowed)
        intervals, held_out = None, None
        if self.count >= 2:
            best = None if chosen is None else rounded_interval(bootstrap_interval(grounded[:, chosen[0], chosen[1]]))
            intervals = Intervals(LEVEL, best, rounded_interval(bootstrap_interval(random)),
                                  rounded_interval(bootstrap_interval(confident)))
            if chosen is not None:
                held_out = held_out_best(grounded, random, confident, allowed, unit)
        figures = HeadFigures(
            None if chosen is None else Best(chosen[0] + 1, chosen[1] + 1, round(float(accuracy[chosen]), 4)),
            round(float(accuracy.mean()), 4), round(float(random.mean()) if len(random) else 0.0, 4),
            round(float(confident.mean()) if len(confident) else 0.0, 4), intervals, held_out)
        return HeadScores(unit, self.count, self.layers, self.heads, IOU_THRESHOLD, np.round(accuracy, 4).tolist(),
                          np.round(self.region_share / max(self.count, 1), 4).tolist(), figures)


def best_head(accuracy: np.ndarray, allowed: np.ndarray | None = None) -> tuple[int, int] | None:
    """(layer, head), from 0, of the most accurate head among the `allowed` ones (default all); None
    when none is allowed."""
    if allowed is not None:
        if not allowed.any():
            return None
        accuracy = np.where(allowed, accuracy, -np.inf)
    layer, head = np.unravel_index(int(accuracy.argmax()), accuracy.shape)
    return int(layer), int(head)


def held_out_best(grounded: np.ndarray, random: np.ndarray, confident: np.ndarray, allowed: np.ndarray | None = None,
                  unit: str = "phrases") -> HeldOutBest:
    """The best (`allowed`) head on the even-numbered `unit` (phrases or arcs), scored on the
    odd-numbered ones, with its 95% interval and paired comparisons with the random RoI and (under
    `against_confidence`, with a verdict in words) the most confident RoI on those items."""
    choose, score = grounded[0::2], grounded[1::2]
    layer, head = best_head(choose.mean(0), allowed)
    hits = score[:, layer, head]
    ids = [str(i) for i in range(len(hits))]
    by_id = dict(zip(ids, hits))
    comparison = paired_comparison(dict(zip(ids, random[1::2])), by_id, ("random RoI", "head"))
    against_confidence = paired_comparison(dict(zip(ids, confident[1::2])), by_id, ("most confident RoI", "head"))
    return HeldOutBest(int(layer) + 1, int(head) + 1, unit, len(hits), round(float(hits.mean()), 4),
                       rounded_interval(bootstrap_interval(hits)), round(float(random[1::2].mean()), 4),
                       round(comparison.difference, 4), rounded_interval(comparison.interval), comparison.p_value,
                       comparison.verdict(), round(float(confident[1::2].mean()), 4),
                       against(against_confidence, int(layer) + 1, int(head) + 1, unit))


def phrase_sample(phrase: Phrase, regions: RegionBank, tokenizer, max_length: int) -> tuple[Sample, np.ndarray]:
    """The phrase's caption sample (`caption_sample`), each region's IoU with the phrase's box as the
    `iou` region target, and (sequence length,) bool: the phrase's pieces (`span_pieces`)."""
    sample, offsets = caption_sample(phrase.text, phrase.image_id, phrase.file, phrase.item_id, regions, tokenizer,
                                     max_length)
    sample.region_targets["iou"] = box_ious(sample.regions.boxes, [phrase.box])[:, 0]
    return sample, span_pieces(offsets, phrase.span, len(sample.sequence))


def read_phrases(annotations: str | Path, phrase_format: str, regions: RegionBank) -> list[Phrase]:
    """The phrases of `annotations` whose images the store holds."""
    if phrase_format not in PHRASE_READERS:
        raise DataError(f"phrase format {phrase_format!r}: expected one of {', '.join(PHRASE_READERS)}")
    phrases = [phrase for phrase in PHRASE_READERS[phrase_format](annotations) if phrase.image_id in regions]
    if not phrases:
        raise DataError(f"{annotations}: no {phrase_format} phrases on images of the store {regions.root}")
    return phrases


def batch_attention(model: VLBertModel, batch: dict[str, Any], inside: tuple[np.ndarray, ...],
                    device: torch.device) -> torch.Tensor:
    """(B, layers, heads, N) on the CPU: the model's attention from each sample's phrase pieces
    (`inside`, one mask per sample) to its regions, as the model sees them at evaluation."""
    text_attention = batch_text_attention(model, batch, device)
    return pieces_mean(text_attention, piece_masks(inside, text_attention.shape[3]))


@dataclass
class GroundingInputs:
    """What an analysis reads, each checked against the others before any phrase is analysed."""

    model: VLBertModel
    tokenizer: PreTrainedTokenizerFast
    regions: RegionBank
    phrases: list[Phrase]  # those with a box to score against
    left_out: list[dict[str, str]]  # the others (`left_out`)


def open_inputs(model_dir: Path, store: Path, annotations: Path, vocabulary: Path, phrase_format: str,
                device: torch.device, fresh_weights: bool, max_items: int | None) -> GroundingInputs:
    """The model, its tokenizer, the store (`open_model`) and the phrases."""
    model, tokenizer, regions = open_model(model_dir, store, vocabulary, device, fresh_weights)
    phrases = read_phrases(annotations, phrase_format, regions)[:max_items]
    usable, unusable = [phrase for phrase in phrases if box_problem(phrase.box) is None], left_out(phrases)
    if not usable:
        first = unusable[0]
        raise DataError(f"{annotations}: no phrase has a box to score against (item {first['item_id']}: "
                        f"{first['problem']}, {first['box']})")
    return GroundingInputs(model, tokenizer, regions, usable, unusable)


@torch.no_grad()
def analyze_grounding(model_dir: str | Path, store: str | Path, annotations: str | Path, vocabulary: str | Path,
                      out: str | Path, phrase_format: str = "refs", images: str | Path | None = None,
                      examples: int = 0, max_items: int | None = None, batch_size: int = 16, device: str = "cpu",
                      max_length: int | None = None, fresh_weights: bool = False) -> GroundingResult:
    """Grounding accuracy of every layer and head over the phrases of `annotations` (a format of
    `PHRASE_READERS`; the first `max_items`): writes OUT/grounding.json (the returned result),
    OUT/grounding.png (the heat map) and, for the first `examples` phrases, OUT/examples/*.png (the
    best head's attention over the image's boxes, drawn on the image from `images` when given).
    Phrases whose box is no box are left out of every figure and listed under `left_out`.
    `max_length` (default: the model's position count; at least phrases.MIN_LENGTH) caps text + RoIs.
    `fresh_weights` analyses the model's config with fresh weights (the before-training reference).
    Every input is checked, and OUT made, before the first phrase is analysed."""
    torch_device = check_device(device)
    out = Path(out)
    with could_not_start():
        inputs = open_inputs(Path(model_dir), Path(store), Path(annotations), Path(vocabulary), phrase_format,
                             torch_device, fresh_weights, max_items)
        made_folder(out)
    model, tokenizer, regions, phrases = inputs.model, inputs.tokenizer, inputs.regions, inputs.phrases
    max_length = max_length or model.config.max_position_embeddings

    tally = GroundingTally(model.config.num_hidden_layers, model.config.num_attention_heads)
    kept: list[Example] = []
    for start in range(0, len(phrases), batch_size):
        chunk = phrases[start:start + batch_size]
        samples, inside = zip(*(phrase_sample(phrase, regions, tokenizer, max_length) for phrase in chunk))
        batch = collate(list(samples), tokenizer.pad_token_id)
        attention = batch_attention(model, batch, inside, torch_device)
        candidates = batch["box_mask"].clone()
        candidates[:, 0] = False  # the whole-image box
        tally.add(attention, candidates, batch["iou"])
        for phrase, sample, boxes, row, chosen in list(zip(chunk, samples, batch["boxes"], attention,
                                                           candidates))[:max(examples - len(kept), 0)]:
            kept.append(Example(phrase, sample.regions.image_size, boxes[chosen].numpy(), row[..., chosen].numpy()))

    scores = tally.result()
    draw_heat_map(tally.accuracy(), scores, out / "grounding.png")
    best = (scores.figures.best.layer - 1, scores.figures.best.head - 1)
    examples = [
        {"item_id": example.phrase.item_id, "phrase": example.phrase.phrase, "text": example.phrase.text,
         "file": example.phrase.file, "layer": best[0] + 1, "head": best[1] + 1,
         "image": str(draw_example(example, best, images, out / "examples" / f"{k:03d}.png"))}
        for k, example in enumerate(kept)]
    result = GroundingResult(str(model_dir), str(annotations), phrase_format, scores, inputs.left_out, examples)
    write_atomically(out / "grounding.json", json.dumps(result.to_json(), indent=2))
    return result
