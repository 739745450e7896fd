"""Training samples: caption–image pre-training, text-only corpus, VQA, multiple choice (the demo
world's and VCR's), referring expressions, image–text retrieval.

Datasets hold an AnnotationFile's item index (NumPy arrays) and parse an annotation line when a
sample needs it, so forked DataLoader workers share the index instead of copying Python objects.

Every random choice of a sample (masked words, masked RoIs, the cached pixel-masked variant, a
mismatched caption) is drawn from a generator seeded by (seed, epoch, index), so a sample is the
same in every worker, process and resumed run.

A sample whose FeatureStore record is damaged comes back as a DamagedSample marker instead of an
exception: an error raised in a DataLoader worker would reach the trainer as a multi-line
re-raise, and the trainer's policy decides whether the run fails or skips the sample.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.ops import box_iou

from extract.store.schema import DamagedRecordError
from train.data.annotations import AnnotationFile, AnswerVocabulary, ImageAnnotation, Token
from train.data.files import DataError
from train.data.regions import RegionBank, Regions
from vlbert.tokenization import (
    Segment,
    TextSequence,
    build_caption_sequence,
    build_choice_sequences,
    build_vqa_sequence,
    choose_masked_regions,
    mask_whole_words,
    word_pieces,
)

if TYPE_CHECKING:
    from train.data.sources.text import TextCorpus

ROI_MASKING_MODES = ("pixel", "feature")


@dataclass
class Sample:
    sequence: TextSequence
    regions: Regions | None = None  # None: a text-only sample
    image_file: str | None = None  # relative to the images root: end-to-end stages load the pixels
    masked_regions: np.ndarray | None = None  # (N,) bool: [IMG] replaced by the masked-RoI embedding
    targets: dict[str, np.ndarray | int] = field(default_factory=dict)  # one value per sample
    region_targets: dict[str, np.ndarray] = field(default_factory=dict)  # (N, ...) per RoI
    choices: list[TextSequence] | None = None  # multiple choice: one sequence per candidate
    item_id: Any = None  # the annotation item's id (question_id, sent_id, ...) for prediction files
    image: np.ndarray | None = None  # end-to-end stages: the decoded pixels (train.end2end.WithImages)


@dataclass
class SampleGroup:
    """Samples scored together by one loss (a caption's positive pair and its negatives): a batch of
    B groups of G samples holds B × G model inputs and (B, G) targets."""

    samples: list[Sample]


@dataclass
class DamagedSample:
    """In place of a sample whose FeatureStore record is damaged."""

    image_id: str
    message: str


class SeededDataset(Dataset):
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.epoch = 0

    def __getitem__(self, index: int) -> Sample | SampleGroup | DamagedSample:
        try:
            return self.sample(index)
        except DamagedRecordError as exc:
            return DamagedSample(exc.image_id, str(exc))

    def sample(self, index: int) -> Sample | SampleGroup:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def rng(self, index: int) -> random.Random:
        return random.Random(f"{self.seed}/{self.epoch}/{index}")


class AnnotatedDataset(SeededDataset):
    """Samples from the items of one kind (`KIND`) of an annotation file, whose images the store holds."""

    KIND = ""

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 seed: int = 0) -> None:
        super().__init__(seed)
        self.annotations, self.regions, self.tokenizer, self.max_length = annotations, regions, tokenizer, max_length
        self.items = annotations.items(self.KIND)

    def __len__(self) -> int:
        return len(self.items)

    def item(self, index: int):
        """(the image's annotation, the item) of sample `index`."""
        return self.annotations.item(self.items[index], self.KIND)


class CaptionPretraining(AnnotatedDataset):
    """Masked language modelling with visual clues and masked RoI classification with linguistic clues.

    `roi_masking="pixel"`: one cached masked-pixel variant per sample and epoch; its masked RoIs are
    the targets and every RoI feature comes from it. `"feature"`: RoIs drawn here have their
    appearance replaced inside the model (the reference code's mode without pixels).
    `relationship`: half the samples get another image's caption (label 0), which then has no
    MLM or RoI targets, as in the paper's ablation (c).
    """

    KIND = "captions"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 roi_masking: str = "pixel", relationship: bool = False, seed: int = 0) -> None:
        if roi_masking not in ROI_MASKING_MODES:
            raise ValueError(f"roi_masking={roi_masking!r}: expected one of {ROI_MASKING_MODES}")
        problem = self.store_problem(regions, roi_masking)
        if problem is not None:
            raise ValueError(problem)
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.roi_masking, self.relationship = roi_masking, relationship

    @staticmethod
    def store_problem(regions: RegionBank, roi_masking: str) -> str | None:
        """Why `regions` cannot feed pre-training with `roi_masking`, or None."""
        if roi_masking == "pixel" and regions.num_variants == 0:
            return (f"{regions.root} holds no masked-pixel variants: extract with --mask-variants "
                    "or pre-train with roi_masking: feature")
        if regions.num_classes is None:
            return f"{regions.root} stores no class distributions: masked RoI classification needs them"
        return None

    def sample(self, index: int) -> Sample:
        rng = self.rng(index)
        annotation, caption = self.item(index)
        matched = 1
        if self.relationship and rng.random() < 0.5:
            other, other_caption = self.item(rng.randrange(len(self.items)))
            if other.image_id != annotation.image_id:
                caption, matched = other_caption, 0
        pieces = word_pieces(self.tokenizer, caption)
        masked = mask_whole_words(self.tokenizer, pieces, rng) if matched else None
        regions = self.regions.get(annotation.image_id, class_probs=True, variants=self.roi_masking == "pixel")
        sequence = build_caption_sequence(self.tokenizer, masked.ids if masked else pieces.ids, len(regions),
                                          self.max_length, masked.labels if masked else None)
        regions = regions.truncated(sequence.num_regions)
        if self.roi_masking == "pixel":
            variant = rng.randrange(len(regions.variant_masks))
            predicted = regions.variant_masks[variant]
            replaced = predicted
            regions = Regions(regions.variant_appearance[variant], regions.boxes, regions.image_size,
                              regions.class_probs, None, None)
        else:
            replaced, predicted = (np.array(m, bool) for m in choose_masked_regions(len(regions), rng))
        if not matched:
            predicted = np.zeros(len(regions), bool)
        targets = {"relationship_labels": matched} if self.relationship else {}
        return Sample(sequence, regions, annotation.file, np.asarray(replaced, bool), targets,
                      region_targets={"region_labels": regions.class_probs * predicted[:, None]})


class TextOnlyCorpus(SeededDataset):
    """Masked language modelling on text without an image: the paper's text-only corpus. Each
    sample is a line of the corpus and the lines after it in its document, up to `max_length` words."""

    def __init__(self, corpus: TextCorpus, tokenizer, max_length: int, seed: int = 0) -> None:
        super().__init__(seed)
        self.corpus, self.tokenizer, self.max_length = corpus, tokenizer, max_length

    def __len__(self) -> int:
        return len(self.corpus)

    def sample(self, index: int) -> Sample:
        pieces = word_pieces(self.tokenizer, self.corpus.text(index, self.max_length))
        masked = mask_whole_words(self.tokenizer, pieces, self.rng(index))
        return Sample(build_caption_sequence(self.tokenizer, masked.ids, 0, self.max_length, masked.labels))


class QuestionAnswering(AnnotatedDataset):
    """`[CLS] question [SEP] [MASK] [SEP]` with the official VQA soft scores over the answer vocabulary."""

    KIND = "vqa"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 answers: AnswerVocabulary, seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.answers = answers

    def sample(self, index: int) -> Sample:
        annotation, question = self.item(index)
        regions = self.regions[annotation.image_id]
        sequence = build_vqa_sequence(self.tokenizer, word_pieces(self.tokenizer, question.question).ids,
                                      len(regions), self.max_length)
        return Sample(sequence, regions.truncated(sequence.num_regions), annotation.file,
                      targets={"labels": self.answers.scores(question.answers)},
                      item_id=_item_id(question.question_id, index))


class MultipleChoice(AnnotatedDataset):
    """The demo world's Q→A: `[CLS] question [SEP] candidate [SEP]` for each candidate, one right.

    Candidates are the annotated answer and `num_choices - 1` other training answers of the same
    answer type (any type where too few), drawn once per item, so evaluation is stable.
    """

    KIND = "vqa"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 answers_by_type: dict[str | None, list[str]], num_choices: int = 4, seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.answers_by_type, self.num_choices = answers_by_type, num_choices

    def candidates(self, index: int) -> tuple[list[str], int]:
        _, question = self.item(index)
        answer, kind = question.answers[0], question.answer_type
        rng = random.Random(f"{self.seed}/choices/{index}")
        same_type = [a for a in self.answers_by_type.get(kind, []) if a != answer]
        others = [a for a in sorted({a for group in self.answers_by_type.values() for a in group})
                  if a != answer and a not in same_type]
        wanted = self.num_choices - 1
        distractors = rng.sample(same_type, min(wanted, len(same_type)))
        distractors += rng.sample(others, min(wanted - len(distractors), len(others)))
        candidates = distractors + [answer]
        rng.shuffle(candidates)
        return candidates, candidates.index(answer)

    def sample(self, index: int) -> Sample:
        annotation, question = self.item(index)
        candidates, label = self.candidates(index)
        regions = self.regions[annotation.image_id]
        pieces = [word_pieces(self.tokenizer, text).ids for text in candidates]
        sequences = build_choice_sequences(self.tokenizer, Segment(word_pieces(self.tokenizer, question.question).ids),
                                           [Segment(ids) for ids in pieces], len(regions), self.max_length)
        return Sample(sequences[0], regions.truncated(sequences[0].num_regions), annotation.file,
                      targets={"labels": label}, choices=sequences, item_id=_item_id(question.question_id, index))


class VisualCommonsense(AnnotatedDataset):
    """VCR, as VL-BERT fine-tunes it: Q→A scores `[CLS] question [SEP] answer [SEP]` for the four
    answers; QA→R scores `[CLS] question answer [SEP] rationale [SEP]` for the four rationales,
    the answer being the right one in training. Words tagged with an object take that object's RoI
    feature (its given box, after the whole-image box).

    `conditioned_on_every_answer` (QA→R evaluation): four samples per annotation, one per answer,
    as the leaderboard's Q→AR needs the rationale chosen given the predicted answer.
    """

    KIND = "vcr"
    STEPS = ("q2a", "qa2r")

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 step: str, conditioned_on_every_answer: bool = False, seed: int = 0) -> None:
        if step not in self.STEPS:
            raise ValueError(f"step={step!r}: expected one of {self.STEPS}")
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.step, self.every_answer = step, conditioned_on_every_answer and step == "qa2r"
        self.answers_per_item = 4 if self.every_answer else 1

    def __len__(self) -> int:
        return len(self.items) * self.answers_per_item

    def sample(self, index: int) -> Sample:
        annotation, item = self.item(index // self.answers_per_item)
        regions = self.regions[annotation.image_id]
        context = _tagged_pieces(self.tokenizer, item.question)
        if self.step == "q2a":
            conditioned, candidates, label = None, item.answer_choices, item.answer_label
        else:
            conditioned = index % 4 if self.every_answer else item.answer_label
            context = _joined(context, _tagged_pieces(self.tokenizer, item.answer_choices[conditioned]))
            candidates, label = item.rationale_choices, item.rationale_label
        sequences = build_choice_sequences(self.tokenizer, context,
                                           [_tagged_pieces(self.tokenizer, c) for c in candidates], len(regions),
                                           self.max_length)
        return Sample(sequences[0], regions.truncated(sequences[0].num_regions), annotation.file,
                      targets={"labels": -100 if label is None else label}, choices=sequences,
                      item_id=(item.annot_id, conditioned))


def _tagged_pieces(tokenizer, tokens: list[Token]) -> Segment:
    """Word pieces of tagged tokens; a tagged word's pieces point at its object's RoI (index + 1:
    the whole-image box comes first), other words at the whole image."""
    words = [token if isinstance(token, str) else token[0] for token in tokens]
    boxes = [0 if isinstance(token, str) else token[1] + 1 for token in tokens]
    encoding = tokenizer(words, is_split_into_words=True, add_special_tokens=False)
    return Segment(list(encoding["input_ids"]), box_index=[boxes[w] for w in encoding.word_ids()])


def _joined(first: Segment, second: Segment) -> Segment:
    return Segment(first.ids + second.ids, box_index=first.box_index + second.box_index)


class ReferringExpressions(AnnotatedDataset):
    """An expression and every RoI scored; RoIs with IoU ≥ 0.5 to the referred box are positives."""

    KIND = "refs"

    def sample(self, index: int) -> Sample:
        annotation, ref = self.item(index)
        regions = self.regions[annotation.image_id]
        sequence = build_caption_sequence(self.tokenizer, word_pieces(self.tokenizer, ref.text).ids, len(regions),
                                          self.max_length)
        regions = regions.truncated(sequence.num_regions)
        iou = box_iou(torch.from_numpy(regions.boxes), torch.tensor([ref.box], dtype=torch.float32))[:, 0].numpy()
        iou[0] = 0.0  # the whole-image box is never the answer
        return Sample(sequence, regions, annotation.file,
                      region_targets={"labels": (iou >= 0.5).astype(np.float32), "iou": iou},
                      item_id=_item_id(ref.sent_id, index))


def _item_id(published: int | None, index: int) -> int:
    """The item's published id; the demo world's items go by their position."""
    return index if published is None else published


# ---- image–text retrieval ----------------------------------------------------------------------


def caption_words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def caption_similarity(caption: str, image: ImageAnnotation) -> float:
    """How well `caption` describes `image` by words alone: the highest Jaccard overlap of its word
    set with one of the image's captions (what mines hard negatives without a model)."""
    words = caption_words(caption)
    return max((len(words & other) / max(len(words | other), 1) for other in map(caption_words, image.captions)),
               default=0.0)


class RetrievalPairs(AnnotatedDataset):
    """Image–text matching as ranking, as Unicoder-VL fine-tunes retrieval: sample i is caption i's
    group of `1 + 2 × negatives` pairs, scored together: the caption with its own image (label 1),
    then `negatives` captions of other images with its image (image→text), then the caption with
    `negatives` other images (text→image), all labelled 0. Unicoder-VL samples 3 negatives in each
    matching task and trains on the one the model scores highest (the matching head's triplet loss).

    Of each task's negatives the first `hard_negatives` are drawn hard: the most similar of
    `hard_pool` uniformly drawn candidates by `caption_similarity`, so that the model's hardest is
    chosen among more informative candidates than uniform draws give. A negative never shares its
    image with the positive, nor is a caption word for word equal to one of the positive image's
    captions (a duplicate caption would be a positive labelled 0).
    """

    KIND = "captions"
    MAX_DRAWS = 100  # redraws of a candidate that turns out to be a positive

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 negatives: int = 3, hard_negatives: int = 1, hard_pool: int = 16, seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        if negatives < 1:
            raise ValueError(f"negatives {negatives}: a ranking needs at least one per task")
        self.negatives, self.hard_negatives, self.hard_pool = negatives, hard_negatives, hard_pool
        self.lines = np.unique(self.items[:, 0])
        if len(self.lines) < 2:
            raise DataError(f"{annotations.path}: retrieval needs captions of at least two images, "
                            f"found {len(self.lines)}")

    @property
    def group_size(self) -> int:
        return 1 + 2 * self.negatives

    def sample(self, index: int) -> SampleGroup:
        rng = self.rng(index)
        image, caption = self.item(index)
        pairs = [(image, caption)]
        for rank in range(self.negatives):
            draws = self.hard_pool if rank < self.hard_negatives else 1
            pairs.append((image, self._negative(draws, lambda: self._other_caption(rng, image),
                                                lambda text: caption_similarity(text, image))))
        for rank in range(self.negatives):
            draws = self.hard_pool if rank < self.hard_negatives else 1
            pairs.append((self._negative(draws, lambda: self._other_image(rng, image, caption),
                                         lambda other: caption_similarity(caption, other)), caption))
        return SampleGroup([
            pair_sample(self.tokenizer, self.max_length, self.regions[pair_image.image_id], pair_image.file,
                        pair_caption, {"labels": int(slot == 0)}, (index, slot))
            for slot, (pair_image, pair_caption) in enumerate(pairs)])

    def _negative(self, draws: int, draw, similarity):
        """The most similar of `draws` candidates (the first on ties; one draw: a uniform negative)."""
        return max((draw() for _ in range(draws)), key=similarity) if draws > 1 else draw()

    def _other_caption(self, rng: random.Random, image: ImageAnnotation) -> str:
        for _ in range(self.MAX_DRAWS):
            other, caption = self.item(rng.randrange(len(self.items)))
            if other.image_id != image.image_id and caption not in image.captions:
                return caption
        raise DataError(f"{self.annotations.path}: found no caption of another image that differs from "
                        f"{image.image_id}'s captions in {self.MAX_DRAWS} draws")

    def _other_image(self, rng: random.Random, image: ImageAnnotation, caption: str) -> ImageAnnotation:
        for _ in range(self.MAX_DRAWS):
            other = self.annotations[int(self.lines[rng.randrange(len(self.lines))])]
            if other.image_id != image.image_id and caption not in other.captions:
                return other
        raise DataError(f"{self.annotations.path}: found no other image without the caption {caption!r} "
                        f"in {self.MAX_DRAWS} draws")


class RetrievalCandidates(AnnotatedDataset):
    """Every (image, caption) pair of a split, image by image: sample `i × C + c` pairs image `i`
    with caption `c` (item id `(i, c)`). Captions are tokenized once; with `cache_images` an image's
    regions are read from the store once for its C consecutive pairs instead of once per pair."""

    KIND = "captions"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 cache_images: bool = True, seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        lines = np.unique(self.items[:, 0])
        self.images = [annotations[int(line)] for line in lines]
        self.captions = [caption for image in self.images for caption in image.captions]
        self.caption_image = np.repeat(np.arange(len(self.images)), [len(image.captions) for image in self.images])
        self.pieces = [word_pieces(tokenizer, caption).ids for caption in self.captions]
        self.cache_images = cache_images
        self._cached: tuple[int, Regions] | None = None

    def __len__(self) -> int:
        return len(self.images) * len(self.captions)

    def caption_id(self, caption: int) -> str:
        """`<image_id>#<position among the image's captions>`."""
        image = int(self.caption_image[caption])
        first = int(np.searchsorted(self.caption_image, image))
        return f"{self.images[image].image_id}#{caption - first}"

    def _regions(self, image: int) -> Regions:
        if self._cached is None or self._cached[0] != image or not self.cache_images:
            self._cached = (image, self.regions[self.images[image].image_id])
        return self._cached[1]

    def sample(self, index: int) -> Sample:
        image, caption = divmod(index, len(self.captions))
        return pair_sample(self.tokenizer, self.max_length, self._regions(image), self.images[image].file,
                           self.pieces[caption], {"labels": int(self.caption_image[caption] == image)},
                           (image, caption))


def pair_sample(tokenizer, max_length: int, regions: Regions, file: str, caption: str | list[int],
                targets: dict[str, int], item_id: Any) -> Sample:
    """`[CLS] caption [SEP] [IMG]… [END]` for an image–text pair; `caption` as text or word pieces."""
    ids = word_pieces(tokenizer, caption).ids if isinstance(caption, str) else caption
    sequence = build_caption_sequence(tokenizer, ids, len(regions), max_length)
    return Sample(sequence, regions.truncated(sequence.num_regions), file, targets=targets, item_id=item_id)
