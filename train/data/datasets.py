"""Training samples: caption–image pre-training, text-only corpus, VQA, referring expressions.

Every random choice of a sample (masked words, masked RoIs, the cached pixel-masked variant, a
mismatched caption) is drawn from a generator seeded by (seed, epoch, index), so a sample is the
same in every worker, process and resumed run.

A sample whose FeatureStore record is damaged comes back as a DamagedSample marker instead of an
exception: an error raised in a DataLoader worker would reach the trainer as a multi-line
re-raise, and the trainer's policy decides whether the run fails or skips the sample.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.ops import box_iou

from extract.store.schema import DamagedRecordError
from train.data.annotations import AnswerVocabulary, ImageAnnotation
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


@dataclass
class DamagedSample:
    """In place of a sample whose FeatureStore record is damaged."""

    image_id: str
    message: str


class SeededDataset(Dataset):
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.epoch = 0

    def __getitem__(self, index: int) -> Sample | DamagedSample:
        try:
            return self.sample(index)
        except DamagedRecordError as exc:
            return DamagedSample(exc.image_id, str(exc))

    def sample(self, index: int) -> Sample:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def rng(self, index: int) -> random.Random:
        return random.Random(f"{self.seed}/{self.epoch}/{index}")


class CaptionPretraining(SeededDataset):
    """Masked language modelling with visual clues and masked RoI classification with linguistic clues.

    `roi_masking="pixel"`: one cached masked-pixel variant per sample and epoch; its masked RoIs are
    the targets and every RoI feature comes from it. `"feature"`: RoIs drawn here have their
    appearance replaced inside the model (the reference code's mode without pixels).
    `relationship`: half the samples get another image's caption (label 0), which then has no
    MLM or RoI targets, as in the paper's ablation (c).
    """

    def __init__(self, annotations: list[ImageAnnotation], regions: RegionBank, tokenizer, max_length: int,
                 roi_masking: str = "pixel", relationship: bool = False, seed: int = 0) -> None:
        super().__init__(seed)
        if roi_masking not in ROI_MASKING_MODES:
            raise ValueError(f"roi_masking={roi_masking!r}: expected one of {ROI_MASKING_MODES}")
        problem = self.store_problem(regions, roi_masking)
        if problem is not None:
            raise ValueError(problem)
        self.items = [(a.image_id, a.file, c) for a in annotations if a.image_id in regions for c in a.captions]
        self.regions, self.tokenizer, self.max_length = regions, tokenizer, max_length
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

    def __len__(self) -> int:
        return len(self.items)

    def sample(self, index: int) -> Sample:
        rng = self.rng(index)
        image_id, image_file, caption = self.items[index]
        matched = 1
        if self.relationship and rng.random() < 0.5:
            other = rng.randrange(len(self.items))
            if self.items[other][0] != image_id:
                caption, matched = self.items[other][2], 0
        pieces = word_pieces(self.tokenizer, caption)
        masked = mask_whole_words(self.tokenizer, pieces, rng) if matched else None
        regions = self.regions.get(image_id, class_probs=True, variants=self.roi_masking == "pixel")
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
        return Sample(sequence, regions, image_file, np.asarray(replaced, bool), targets,
                      region_targets={"region_labels": regions.class_probs * predicted[:, None]})


class TextOnlyCorpus(SeededDataset):
    """Masked language modelling on plain sentences (no image): the paper's text-only corpus."""

    def __init__(self, sentences: list[str], tokenizer, max_length: int, seed: int = 0) -> None:
        super().__init__(seed)
        self.sentences, self.tokenizer, self.max_length = sentences, tokenizer, max_length

    def __len__(self) -> int:
        return len(self.sentences)

    def sample(self, index: int) -> Sample:
        pieces = word_pieces(self.tokenizer, self.sentences[index])
        masked = mask_whole_words(self.tokenizer, pieces, self.rng(index))
        return Sample(build_caption_sequence(self.tokenizer, masked.ids, 0, self.max_length, masked.labels))


class QuestionAnswering(SeededDataset):
    """`[CLS] question [SEP] [MASK] [SEP]` with VQA soft scores over the answer vocabulary."""

    def __init__(self, annotations: list[ImageAnnotation], regions: RegionBank, tokenizer, max_length: int,
                 answers: AnswerVocabulary, seed: int = 0) -> None:
        super().__init__(seed)
        self.items = [(a.image_id, a.file, q, ans) for a in annotations if a.image_id in regions
                      for q, ans, _ in a.questions]
        self.regions, self.tokenizer, self.max_length, self.answers = regions, tokenizer, max_length, answers

    def __len__(self) -> int:
        return len(self.items)

    def sample(self, index: int) -> Sample:
        image_id, image_file, question, answers = self.items[index]
        regions = self.regions[image_id]
        sequence = build_vqa_sequence(self.tokenizer, word_pieces(self.tokenizer, question).ids, len(regions),
                                      self.max_length)
        return Sample(sequence, regions.truncated(sequence.num_regions), image_file,
                      targets={"labels": self.answers.scores(answers)})


class MultipleChoice(SeededDataset):
    """VCR-style Q→A: `[CLS] question [SEP] candidate [SEP]` for each candidate, one of them right.

    Candidates are the annotated answer and `num_choices - 1` other training answers of the same
    answer type (any type where too few), drawn once per item, so evaluation is stable.
    """

    def __init__(self, annotations: list[ImageAnnotation], regions: RegionBank, tokenizer, max_length: int,
                 answers_by_type: dict[str | None, list[str]], num_choices: int = 4, seed: int = 0) -> None:
        super().__init__(seed)
        self.items = [(a.image_id, a.file, q, answers[0], kind) for a in annotations if a.image_id in regions
                      for q, answers, kind in a.questions]
        self.regions, self.tokenizer, self.max_length = regions, tokenizer, max_length
        self.answers_by_type, self.num_choices = answers_by_type, num_choices

    def __len__(self) -> int:
        return len(self.items)

    def candidates(self, index: int) -> tuple[list[str], int]:
        _, _, _, answer, kind = self.items[index]
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
        image_id, image_file, question, _, _ = self.items[index]
        candidates, label = self.candidates(index)
        regions = self.regions[image_id]
        pieces = [word_pieces(self.tokenizer, text).ids for text in candidates]
        sequences = build_choice_sequences(self.tokenizer, Segment(word_pieces(self.tokenizer, question).ids),
                                           [Segment(ids) for ids in pieces], len(regions), self.max_length)
        return Sample(sequences[0], regions.truncated(sequences[0].num_regions), image_file,
                      targets={"labels": label}, choices=sequences)


class ReferringExpressions(SeededDataset):
    """An expression and every RoI scored; RoIs with IoU ≥ 0.5 to the referred box are positives."""

    def __init__(self, annotations: list[ImageAnnotation], regions: RegionBank, tokenizer, max_length: int,
                 seed: int = 0) -> None:
        super().__init__(seed)
        self.items = [(a.image_id, a.file, text, box) for a in annotations if a.image_id in regions
                      for text, box in a.refs]
        self.regions, self.tokenizer, self.max_length = regions, tokenizer, max_length

    def __len__(self) -> int:
        return len(self.items)

    def sample(self, index: int) -> Sample:
        image_id, image_file, text, box = self.items[index]
        regions = self.regions[image_id]
        sequence = build_caption_sequence(self.tokenizer, word_pieces(self.tokenizer, text).ids, len(regions),
                                          self.max_length)
        regions = regions.truncated(sequence.num_regions)
        iou = box_iou(torch.from_numpy(regions.boxes), torch.tensor([box], dtype=torch.float32))[:, 0].numpy()
        iou[0] = 0.0  # the whole-image box is never the answer
        return Sample(sequence, regions, image_file,
                      region_targets={"labels": (iou >= 0.5).astype(np.float32), "iou": iou})
