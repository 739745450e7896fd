"""Syntactic grounding by attention heads, as VisualBERT measures it (§3.1, Table 2, Figure 4): for a
dependency arc between w1 and w2, where w1 is an entity aligned to an image region, how often does
each head attend from w2 to w1's region?

Captions, entities and boxes are Flickr30K Entities' (`phrases.flickr30k_entities_captions`), the
parses any parser's (`parses.PARSERS`), each a tree (else the caption is skipped and named), with
Stanford's prep and pobj arcs rebuilt where its label set is UD's (`relations.LABEL_SETS`). w1 is an
entity's word: the syntactic head of a boxed entity phrase (its word whose head lies outside the
phrase; the rightmost of several, as English noun phrases end in theirs). Every arc with an entity
word at one end gives a pair, w1 that end and w2 the other, under the arc's relation: det, amod, nn,
num arcs inside the phrase (w2 the determiner or modifier), and arcs out of it (nsubj: w2 the verb;
prep, pobj: w2 the preposition). An arc joining two entity words gives a pair each way. The scoring is the
entity analysis's (`grounding.GroundingTally`): w2's most-attended RoI (its pieces' attention
averaged, among the RoIs only) is right when its IoU with w1's box (the union of the entity's boxes)
is ≥ 0.5; the baselines are a uniformly random RoI and the most confident one (the paper's), the
intervals bootstrap ones over the arcs.

The paper reports, per relation, the best of the heads that give on average more than 20% of the
attention from the source words to the image regions (`min_region_attention=0.2`): a head's share
is averaged over every arc's w2, of every relation.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Container

import numpy as np
import torch

from train.analysis.common import (batch_text_attention, box_problem, caption_sample, could_not_start, left_out,
                                   open_model, piece_masks, pieces_mean, span_pieces)
from train.analysis.figures import draw_layer_plot, draw_relation_heat_map
from train.analysis.grounding import IOU_THRESHOLD, GroundingTally
from train.analysis.grounding_results import AgainstConfidence
from train.analysis.parses import PARSERS, ParsedSentence, Word, align
from train.analysis.phrases import Caption, Phrase, flickr30k_entities_captions
from train.analysis.relations import LABEL_SETS, PAPER_FIGURE_4, PAPER_TABLE_2, paper_name, stanford_names
from train.analysis.syntax_results import PaperFigures, RelationScores, SyntaxResult
from train.analysis.verdicts import syntax_verdicts
from train.data.collate import collate
from train.data.files import DataError
from train.evaluation.markdown import markdown_row
from train.evaluation.refer import box_ious
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.device import check_device
from vlbert.utils.paths import path_inside

TOP_RELATIONS = 10  # the paper's table shows the 10 most common


@dataclass(frozen=True)
class Arc:
    """One (w1, w2) pair: the analysis attends from `source` (w2's characters) to `box` (w1's)."""

    relation: str
    entity_word: str  # w1
    other_word: str  # w2
    source: tuple[int, int]
    box: list[float]


@dataclass
class ParsedCaption:
    caption: Caption
    arcs: list[Arc]

    @property
    def item_id(self) -> str:
        return f"{self.caption.image_id}/{self.caption.number}"


def entity_words(caption: Caption, words: list[Word], spans: list[tuple[int, int]]) -> dict[int, list[float]]:
    """Word id → the box of the boxed entity phrase whose head word it is (module docstring)."""
    found = {}
    for (start, end), box in caption.entities:
        if box is None or box_problem(box) is not None:
            continue
        inside = {word.index for word, (first, last) in zip(words, spans) if first < end and last > start}
        heads = [word.index for word in words if word.index in inside and word.head not in inside]
        if heads:
            found[max(heads)] = box
    return found


def caption_arcs(caption: Caption, words: list[Word], spans: list[tuple[int, int]]) -> list[Arc]:
    """The (w1, w2) pairs of a caption's parse (its words, a tree), in word order."""
    entities = entity_words(caption, words, spans)
    arcs = []
    for word in words:
        if word.head == 0:
            continue
        head = words[word.head - 1]
        for w1, w2 in ((head, word), (word, head)):
            if w1.index in entities:
                arcs.append(Arc(word.relation, w1.form, w2.form, spans[w2.index - 1], entities[w1.index]))
    return arcs


def parsed_captions(captions: list[Caption], sentences: list[ParsedSentence], labels: str
                    ) -> tuple[list[ParsedCaption], list[dict[str, str]]]:
    """The captions whose parse is a tree that aligns with their text, with their arcs (Stanford's
    structure rebuilt where the parses' label set `labels` has another); and the others, named (image
    id, caption index, the sentence's place in the parses, why)."""
    parsed, skipped = [], []
    for caption, sentence in zip(captions, sentences):
        spans = sentence.problem or align(sentence, caption.text)
        if isinstance(spans, str):
            skipped.append({"image_id": caption.image_id, "caption": caption.number, "parse": sentence.where,
                            "text": caption.text, "reason": spans})
        else:
            words = LABEL_SETS[labels].as_stanford(sentence.words)
            parsed.append(ParsedCaption(caption, caption_arcs(caption, words, spans)))
    return parsed, skipped


@dataclass
class SyntaxInputs:
    """The captions to analyse with their arcs, and what was left out, all read before any model runs."""

    captions: list[ParsedCaption]
    skipped: list[dict[str, str]]
    left_out: list[dict[str, str]]
    relations: list[str]  # the arcs' relations, the most common first
    parser: str
    labels: str  # the parses' label set (relations.LABEL_SETS)


def read_syntax_inputs(annotations: Path, parser: str, parses: Path | None, images: Container[str] | None,
                       max_items: int | None, labels: str | None = None) -> SyntaxInputs:
    """The split's captions (those on `images`, the store's keys; the first `max_items`), their
    parses aligned and their arcs; DataError when none has an arc to score."""
    if parser not in PARSERS:
        raise DataError(f"parser {parser!r}: expected one of {', '.join(PARSERS)}")
    if labels is not None and labels not in LABEL_SETS:
        raise DataError(f"labels {labels!r}: expected one of {', '.join(LABEL_SETS)}")
    captions = flickr30k_entities_captions(annotations)
    sentences = PARSERS[parser].parse(captions, parses)
    on_store = [(caption, sentence) for caption, sentence in zip(captions, sentences)
                if images is None or caption.store_key in images][:max_items]
    if not on_store:
        raise DataError(f"{annotations}: no caption on an image of the store")
    labels = labels or PARSERS[parser].labels
    parsed, skipped = parsed_captions(*map(list, zip(*on_store)), labels)
    entities = [Phrase(f"{c.image_id}/{c.number}/{k}", c.store_key, c.file, c.text, span, box)
                for c, _ in on_store for k, (span, box) in enumerate(c.entities) if box is not None]
    counts: dict[str, int] = {}
    for item in parsed:
        for arc in item.arcs:
            counts[arc.relation] = counts.get(arc.relation, 0) + 1
    if not counts:
        why = (f"{len(skipped)} of {len(on_store)} parses are skipped (not a tree, or not their caption)"
               if skipped else "no parse word is the head of a boxed entity phrase")
        raise DataError(f"{annotations}: no dependency arc to score ({why})")
    relations = sorted(counts, key=lambda relation: (-counts[relation], relation))
    return SyntaxInputs([item for item in parsed if item.arcs], skipped, left_out(entities), relations, parser, labels)


def plotted_relations(chosen: list[str] | None, relations: list[str], labels: str) -> list[str]:
    """The relations to draw as Figure 4: `chosen` (each a parse label or a Stanford name of the
    paper, found through the label map), or by default those of the paper's Figure 4 that occur."""
    if chosen is None:
        return [relation for name in PAPER_FIGURE_4 for relation in relations if name in stanford_names(relation, labels)]
    found = []
    for name in chosen:
        matches = [relation for relation in relations if relation == name] or \
                  [relation for relation in relations if name in stanford_names(relation, labels)]
        if not matches:
            raise DataError(f"--plot {name}: no arc of the parses has this relation (nor a UD relation the "
                            f"Stanford name maps to); the relations found: {', '.join(relations)}")
        found += [relation for relation in matches if relation not in found]
    return found


class SyntaxTally:
    """A `GroundingTally` per relation, and each head's attention share to the regions over all arcs."""

    def __init__(self, relations: list[str], layers: int, heads: int) -> None:
        self.tallies = {relation: GroundingTally(layers, heads) for relation in relations}

    def add(self, text_attention: torch.Tensor, box_mask: torch.Tensor, captions: list[ParsedCaption],
            boxes: list[np.ndarray], offsets: list[list[tuple[int, int]]]) -> None:
        """Adds the arcs of a batch of captions: text_attention (B, layers, heads, T, N) from
        `batch_text_attention`, box_mask (B, N) the batch's, each caption's region boxes (the
        whole-image box first, never a candidate) and its kept pieces' character offsets (piece k at
        position k + 1, `caption_sample`)."""
        candidates = box_mask.clone()
        candidates[:, 0] = False  # the whole-image box
        text_length = text_attention.shape[3]
        for relation, tally in self.tallies.items():
            rows, masks, ious = [], [], []
            for row, item in enumerate(captions):
                arcs = [arc for arc in item.arcs if arc.relation == relation]
                if not arcs:
                    continue
                rows += [row] * len(arcs)
                masks += [span_pieces(offsets[row], arc.source, len(offsets[row]) + 2) for arc in arcs]
                iou = np.zeros((len(arcs), candidates.shape[1]), np.float32)  # padding: no match
                iou[:, :len(boxes[row])] = box_ious(boxes[row], [arc.box for arc in arcs]).T
                ious.append(iou)
            if rows:
                index = torch.tensor(rows)
                attention = pieces_mean(text_attention[index], piece_masks(tuple(masks), text_length))
                tally.add(attention, candidates[index], torch.from_numpy(np.concatenate(ious)))

    def region_share(self) -> np.ndarray:
        """(layers, heads): each head's attention share to the RoIs, averaged over every arc's w2."""
        arcs = sum(tally.count for tally in self.tallies.values())
        return sum(tally.region_share for tally in self.tallies.values()) / max(arcs, 1)


@torch.no_grad()
def analyze_syntax(model_dir: str | Path, store: str | Path, annotations: str | Path, vocabulary: str | Path,
                   out: str | Path, parses: str | Path | None = None, parser: str = "conllu",
                   plot: list[str] | None = None, min_region_attention: float | None = None,
                   max_items: int | None = None, batch_size: int = 16, device: str = "cpu",
                   max_length: int | None = None, fresh_weights: bool = False,
                   labels: str | None = None) -> SyntaxResult:
    """Syntactic grounding accuracy of every layer and head, per dependency relation, over the
    captions of a Flickr30K Entities split file (`annotations`; the first `max_items` captions on
    the store's images), parsed by `parser` (`parses`: its CoNLL-U file). Writes OUT/syntax.json
    (the returned result), OUT/syntax.md (a table like VisualBERT's Table 2, the paper's numbers
    beside ours), OUT/relations.png (relations × heads) and OUT/layers/<relation>.png (Figure 4)
    for the `plot` relations (default: the paper's pobj, nsubj and amod, under their own or their
    UD names). `min_region_attention` (the paper: 0.2) chooses the best heads among those giving
    more than that share of their attention to the RoIs. Captions whose parse does not align are
    skipped and listed (`skipped`). Every input is checked, and OUT made, before the first caption
    is analysed."""
    torch_device = check_device(device)
    out = Path(out)
    with could_not_start():
        model, tokenizer, regions = open_model(Path(model_dir), Path(store), Path(vocabulary), torch_device,
                                               fresh_weights)
        inputs = read_syntax_inputs(Path(annotations), parser, None if parses is None else Path(parses), regions,
                                    max_items, labels)
        figures = {relation: path_inside(out / "layers", f"{relation}.png", "relation")
                   for relation in plotted_relations(plot, inputs.relations, inputs.labels)}
        made_folder(out)
    max_length = max_length or model.config.max_position_embeddings
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads

    tally = SyntaxTally(inputs.relations, layers, heads)
    for start in range(0, len(inputs.captions), batch_size):
        chunk = inputs.captions[start:start + batch_size]
        samples, offsets = zip(*(caption_sample(item.caption.text, item.caption.store_key, item.caption.file,
                                                item.item_id, regions, tokenizer, max_length) for item in chunk))
        batch = collate(list(samples), tokenizer.pad_token_id)
        tally.add(batch_text_attention(model, batch, torch_device), batch["box_mask"], chunk,
                  [sample.regions.boxes for sample in samples], list(offsets))

    result = syntax_result(tally, inputs, min_region_attention)
    accuracy = np.stack([tally.tallies[relation].accuracy() for relation in inputs.relations])
    drawn = {"relations": str(draw_relation_heat_map(
        accuracy, inputs.relations, out / "relations.png",
        f"syntactic grounding accuracy per relation (most common on top), {result.arcs} arcs"))}
    for relation, path in figures.items():
        row = next(row for row in result.relations if row.relation == relation)
        paper = f" (the paper's {row.paper.relation})" if row.paper else ""
        drawn[relation] = str(draw_layer_plot(
            accuracy[inputs.relations.index(relation)],
            {"most confident RoI": row.figures.confidence_baseline, "random RoI": row.figures.random_baseline},
            f"{relation}{paper}: each head's accuracy by layer, {row.arcs} arcs", path))
    result = replace(result, model=str(model_dir), annotations=str(annotations),
                     parses=None if parses is None else str(parses), figures=drawn)
    write_atomically(out / "syntax.md", markdown_table(result))
    write_atomically(out / "syntax.json", json.dumps(result.to_json(), indent=2))
    return result


def syntax_result(tally: SyntaxTally, inputs: SyntaxInputs, min_region_attention: float | None) -> SyntaxResult:
    """The figures of every relation (the most common first) with the paper's beside them (no inputs or
    figures drawn yet)."""
    share = tally.region_share()
    active = None if min_region_attention is None else share > min_region_attention
    relations = []
    for rank, relation in enumerate(inputs.relations):
        scores = tally.tallies[relation].result(active, unit="arcs")  # layers, heads, ...: given once for all
        paper = paper_name(relation, inputs.labels)
        relations.append(RelationScores(relation, list(stanford_names(relation, inputs.labels)), rank < TOP_RELATIONS,
                                        scores.count, scores.accuracy, scores.figures,
                                        None if paper is None else PaperFigures(paper, **asdict(PAPER_TABLE_2[paper]))))
    layers, heads = share.shape
    return SyntaxResult(
        inputs.parser, inputs.labels, len(inputs.captions), sum(row.arcs for row in relations), layers, heads,
        IOU_THRESHOLD, np.round(share, 4).tolist(), min_region_attention,
        None if active is None else [[int(l) + 1, int(h) + 1] for l, h in np.argwhere(active)],
        relations, inputs.skipped, inputs.left_out)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def _interval(values: list[float] | None) -> str:
    return "" if values is None else f" [{_percent(values[0])}, {_percent(values[1])}]"


def _row(row: RelationScores) -> str:
    figures, paper = row.figures, row.paper
    intervals, best, held_out = figures.intervals, figures.best, figures.held_out_best
    cells = [
        row.relation, ", ".join(row.stanford) or "–", str(row.arcs), _percent(figures.random_baseline),
        _percent(figures.confidence_baseline) + _interval(intervals and intervals.confidence_baseline),
        "–" if best is None else f"{best.layer}-{best.head}",
        "–" if best is None else _percent(best.accuracy) + _interval(intervals and intervals.best),
        "–" if held_out is None else f"{_percent(held_out.accuracy)} ({held_out.layer}-{held_out.head}, "
                                     f"{held_out.count} arcs)",
        "–" if held_out is None else _against(held_out.against_confidence),
        "–" if paper is None else f"{paper.relation}: {paper.baseline:.2f} → {paper.best:.2f} "
                                  f"({paper.layer}-{paper.head})",
    ]
    return markdown_row(cells)


def _against(side: AgainstConfidence) -> str:
    low, high = side.difference_interval
    return f"{100 * side.difference:+.2f} [{100 * low:+.2f}, {100 * high:+.2f}]: {side.outcome}"


HEADER = ("| relation | Stanford name | arcs | random RoI | most confident RoI [95%] | best head | accuracy [95%] "
          "| held-out best head | held-out head − most confident RoI [95%] "
          "| the paper's Table 2: most confident → best head |\n"
          "|---|---|---|---|---|---|---|---|---|---|\n")


def markdown_table(result: SyntaxResult) -> str:
    """A table like VisualBERT's Table 2 (accuracies in %), the paper's figures beside ours."""
    rows = result.relations
    heads = ("every head" if result.min_region_attention is None else
             f"the heads giving more than {result.min_region_attention:.0%} of their attention to the RoIs "
             f"({len(result.active_heads)} of {result.layers * result.heads})")
    lines = [
        "# Syntactic grounding (VisualBERT §3.1, Table 2)", "",
        f"Model `{result.model}`, captions `{result.annotations}`, parses: "
        f"{result.parses or result.parser}. {result.captions} captions, {result.arcs} arcs; "
        f"{len(result.skipped)} captions skipped (their parse is not a tree, or not their text: `skipped` in "
        "syntax.json). "
        f"Best head (layer-head, from 1) among {heads}; accuracy: the share of arcs whose w2 attends most to a "
        f"RoI with IoU ≥ {result.iou_threshold} with w1's box. The held-out best head is chosen on half the "
        "arcs and scored on the other half.", "",
        f"## The {min(TOP_RELATIONS, len(rows))} most common relations", "",
        HEADER + "\n".join(_row(row) for row in rows if row.top),
    ]
    if any(not row.top for row in rows):
        lines += ["", "## The other relations", "", HEADER + "\n".join(_row(row) for row in rows if not row.top)]
    verdicts = syntax_verdicts(result.held_out())
    if verdicts:
        lines += ["", "## Does any head beat the most confident RoI?", "",
                  "Each relation's best head is chosen on half its arcs and compared with the most confident RoI, "
                  "paired, on the other half (a head chosen and scored on the same arcs would be favoured by the "
                  f"maximum over heads). In short: {verdicts[0]}.", "",
                  *(f"- {line}" for line in verdicts[1:])]
    lines += ["", "The last column is the paper's, not measured here: VisualBERT (Li et al., 2019) Table 2, "
              "Flickr30K validation captions parsed by AllenNLP (Stanford dependencies), the best of the heads "
              "giving more than 20% of their attention to regions; a parser's label is read as the Stanford "
              f"relation joining the same words, through the map of its label set ({result.labels}; "
              "train/analysis/relations.py), UD's prepositional phrases rebuilt as Stanford's prep and pobj arcs."]
    return "\n".join(lines) + "\n"
