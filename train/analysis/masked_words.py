"""Which words a pre-trained model predicts from the image: every word of every caption is masked
alone (all its pieces [MASK]) and predicted twice, with the caption's own image and with another
image's regions, so the two conditions differ in the image only. The difference, paired over the
masked words, is the image's part in the predictions: the cross-modal influence that Frank et al.
(2021, "Vision-and-Language or Vision-for-Language?") measure by taking the visual input away. A
word predicted no better with its own image than with another is predicted from the text alone.

"Another image" is the next image of the annotation file (in file order, the last one's the first
one), whose regions are real RoIs of the same store (in distribution, unlike zeroed features), cut to
leave the caption the same pieces. A word is predicted right when each of its pieces is. Groups of
words (e.g. the colour words) get the same figures over their words' masked occurrences.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from train.analysis.common import could_not_start, load_model, open_model
from train.analysis.verdicts import rounded_interval
from train.analysis.word_results import WordFigures, WordGroup, WordsResult
from train.analysis.word_groups import check_groups
from train.data.annotations import AnnotationFile
from train.data.collate import collate, model_inputs, to_device
from train.data.datasets import Sample
from train.data.files import DataError
from train.data.regions import RegionBank, Regions
from train.evaluation.markdown import markdown_row
from train.evaluation.statistics import paired_comparison
from vlbert.losses import IGNORE_INDEX
from vlbert.modeling import VLBertForPreTraining
from vlbert.tokenization import build_caption_sequence
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.device import check_device

CONDITIONS = ("own image", "another image")
BY_WORD = 100  # the most frequent words get a row of their own (each a bootstrap); others count in all and groups
SPECIAL_TOKENS = 3  # [CLS], [SEP], [END]: a caption sample's elements besides its pieces and regions


@dataclass(frozen=True)
class MaskedWord:
    """One word of one caption, masked: its id (caption, word position), its text, and the two
    samples (own image, another image)."""

    item_id: str
    word: str
    samples: tuple[Sample, Sample]


def caption_words(encoding, text: str, pieces: int) -> list[tuple[str, list[int]]]:
    """(word, its piece positions) for each word of `text` (its tokenizer `encoding`, with offsets)
    whose pieces are all among the first `pieces` (those the length cap keeps), lower-cased."""
    positions: dict[int, list[int]] = defaultdict(list)
    for piece, owner in enumerate(encoding.word_ids()):
        positions[owner].append(piece)
    offsets, words = encoding["offset_mapping"], []
    for word_pieces in positions.values():
        if word_pieces[-1] < pieces:
            start, end = offsets[word_pieces[0]][0], offsets[word_pieces[-1]][1]
            words.append((text[start:end].lower(), word_pieces))
    return words


def masked_words(text: str, item_id: str, own: Regions, other: Regions, tokenizer, max_length: int) -> list[MaskedWord]:
    """Each word of `text` masked alone, as a caption sample with the `own` image's regions and one
    with the `other` image's, both with the same text pieces (the own image decides the cut)."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoding["input_ids"])
    kept = build_caption_sequence(tokenizer, ids, len(own), max_length)
    pieces = len(kept) - 2  # [CLS] and [SEP]
    own = own.truncated(kept.num_regions)
    other = other.truncated(max(1, min(len(other), max_length - pieces - SPECIAL_TOKENS)))
    result = []
    for position, (word, word_pieces) in enumerate(caption_words(encoding, text, pieces)):
        masked, labels = ids[:pieces], [IGNORE_INDEX] * pieces
        for piece in word_pieces:
            masked[piece], labels[piece] = tokenizer.mask_token_id, ids[piece]
        samples = []
        for regions in (own, other):
            sequence = build_caption_sequence(tokenizer, masked, len(regions), max_length, labels)
            samples.append(Sample(sequence, regions.truncated(sequence.num_regions), item_id=f"{item_id}/{position}"))
        result.append(MaskedWord(f"{item_id}/{position}", word, tuple(samples)))
    return result


def load_pretraining_model(model_dir: Path, device: torch.device, fresh_weights: bool = False) -> VLBertForPreTraining:
    """`load_model` with the masked-word head; DataError when the saved model has none (a fine-tuned
    task's)."""
    model = load_model(model_dir, device, fresh_weights, VLBertForPreTraining)
    missing = [name for name in getattr(model, "fresh_weights", ()) if name.startswith("mlm_head.")]
    if missing:
        raise DataError(f"{model_dir}: the saved model has no masked-word head ({missing[0]} is not in it): "
                        "analyse a pre-training stage's model")
    return model


def read_captions(annotations: Path, regions: RegionBank, max_items: int | None) -> list[tuple[str, str, str]]:
    """(item id, caption, image id) of the first `max_items` captions whose images the store holds;
    DataError unless they come from at least two images (another image is needed)."""
    file = AnnotationFile(annotations)
    captions = []
    for number, position in enumerate(file.items("captions")):
        annotation, caption = file.item(position, "captions")
        if annotation.image_id in regions:
            captions.append((str(number), caption, annotation.image_id))
    captions = captions[:max_items]
    images = len({image for _, _, image in captions})
    if images < 2:
        raise DataError(f"{annotations}: {len(captions)} captions on images of the store {regions.root}, from "
                        f"{images} image(s): the analysis needs captions of at least two stored images (each word "
                        "is also predicted with another image)")
    return captions


def next_images(images: list[str]) -> dict[str, str]:
    """Each image → the next different image in the order given (the last → the first)."""
    order = list(dict.fromkeys(images))
    return {image: order[(index + 1) % len(order)] for index, image in enumerate(order)}


@dataclass
class WordTally:
    """Per masked word: its text and whether it was predicted right in each condition."""

    words: list[str]
    right: dict[str, list[float]]  # condition → 1.0 / 0.0 per masked word
    ids: list[str]

    def summary(self, keep: np.ndarray | None = None) -> WordFigures:
        """Accuracy in each condition and the paired difference own − another, over the masked words
        `keep` selects (default all)."""
        keep = np.ones(len(self.ids), bool) if keep is None else keep
        ids = [item for item, kept in zip(self.ids, keep) if kept]
        if not ids:
            return WordFigures(0)
        scores = {condition: dict(zip(ids, np.asarray(values)[keep])) for condition, values in self.right.items()}
        own, other = (scores[condition] for condition in CONDITIONS)
        own_image, another_image = (round(float(np.mean(list(scores[condition].values()))), 4)
                                    for condition in CONDITIONS)
        if len(ids) < 2:
            return WordFigures(len(ids), own_image, another_image)
        comparison = paired_comparison(other, own, ("another image", "own image"))
        return WordFigures(len(ids), own_image, another_image, round(comparison.difference, 4) + 0.0,
                           rounded_interval(comparison.interval), comparison.p_value, comparison.verdict())


@torch.no_grad()
def predict_words(model: VLBertForPreTraining, words: list[MaskedWord], batch_size: int, pad_token_id: int,
                  device: torch.device) -> dict[str, list[float]]:
    """condition → per masked word, 1.0 where the model predicts each of its pieces right."""
    right: dict[str, list[float]] = {condition: [] for condition in CONDITIONS}
    for index, condition in enumerate(CONDITIONS):
        for start in range(0, len(words), batch_size):
            batch = collate([word.samples[index] for word in words[start:start + batch_size]], pad_token_id)
            labels = batch["mlm_labels"]
            inputs = to_device(batch, device)
            output = model(**model_inputs(model, inputs, training=False))
            predicted = output.mlm_logits.argmax(-1).cpu()
            chosen = labels != IGNORE_INDEX
            right[condition] += (((predicted == labels) | ~chosen).all(1) & chosen.any(1)).float().tolist()
    return right


def analyze_masked_words(model_dir: str | Path, store: str | Path, annotations: str | Path, vocabulary: str | Path,
                         out: str | Path, groups: dict[str, list[str]] | None = None, max_items: int | None = None,
                         batch_size: int = 16, device: str = "cpu", max_length: int | None = None,
                         fresh_weights: bool = False) -> WordsResult:
    """Masked-word accuracy with each caption's own image and with another image's regions over the
    captions of `annotations` (the first `max_items`), in all, per group of `groups` (name → words)
    and for each of the `BY_WORD` most frequent words: writes OUT/words.json (the returned result) and
    OUT/words.md (the tables).
    Every input is checked, and OUT made, before the model runs."""
    torch_device = check_device(device)
    out = Path(out)
    with could_not_start():
        model, tokenizer, regions = open_model(Path(model_dir), Path(store), Path(vocabulary), torch_device,
                                               fresh_weights, load_pretraining_model)
        captions = read_captions(Path(annotations), regions, max_items)
        groups = check_groups(groups or {})
        made_folder(out)
    max_length = max_length or model.config.max_position_embeddings
    others = next_images([image for _, _, image in captions])
    read = {image: regions[image] for image in others}  # once each: an image serves its captions and its neighbour's
    words = [word for item_id, caption, image in captions
             for word in masked_words(caption, item_id, read[image], read[others[image]], tokenizer, max_length)]
    if not words:
        raise DataError(f"{annotations}: no caption keeps a whole word under max_length {max_length}")
    tally = WordTally([word.word for word in words],
                      predict_words(model, words, batch_size, tokenizer.pad_token_id, torch_device),
                      [word.item_id for word in words])
    texts = np.array(tally.words)
    frequent = sorted(Counter(tally.words).items(), key=lambda item: (-item[1], item[0]))[:BY_WORD]
    result = WordsResult(str(model_dir), str(annotations), len(captions), list(CONDITIONS), tally.summary(),
                         {name: WordGroup(members, tally.summary(np.isin(texts, members)))
                          for name, members in groups.items()},
                         {word: tally.summary(texts == word) for word, _ in frequent})
    write_atomically(out / "words.json", json.dumps(result.to_json(), indent=2))
    write_atomically(out / "words.md", words_table(result))
    return result


def _row(name: str, figures: WordFigures) -> str:
    if not figures.masked_words:
        return markdown_row([name, 0, "", "", ""])
    interval = figures.interval
    difference = "" if interval is None else f"{figures.difference:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}]"
    return markdown_row([name, figures.masked_words, f"{figures.own_image:.3f}", f"{figures.another_image:.3f}",
                         difference])


def words_table(result: WordsResult) -> str:
    header = ["| words | masked | own image | another image | own − another [95%] |", "|---|---|---|---|---|"]
    lines = ["# Masked words with their own image and with another image", "",
             f"{result.model} on {result.captions} captions of {result.annotations}.", "", *header,
             _row("all", result.figures)]
    lines += [_row(name, group.figures) for name, group in result.groups.items()]
    lines += ["", "## By word", "", *header, *(_row(word, figures) for word, figures in result.by_word.items())]
    return "\n".join(lines) + "\n"
