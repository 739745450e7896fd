"""Pre-training: masked language modelling with visual clues and masked RoI classification with
linguistic clues on captions, optionally the sentence–image relationship, and the text-only corpus
beside them (`options.corpus`)."""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from train.data.annotations import AnnotationFile
from train.data.datasets import AnnotatedDataset, Sample, SeededDataset
from train.data.regions import RegionBank, Regions, predicted_rows
from train.data.sources.text import TextCorpus
from train.tasks.base import Evaluator, Task, TaskData, scored
from vlbert.modeling import VLBertForPreTraining
from vlbert.tokenization import build_caption_sequence, choose_masked_regions, mask_whole_words, word_pieces
from vlbert.utils.typed_config import EXISTING_PATH

ROI_MASKING_MODES = ("pixel", "feature")


@dataclass
class PretrainOptions:
    """A pre-training stage's losses and inputs; the paper's Table 4 ablations switch them."""

    SETTINGS: ClassVar[str] = "pre-training options"

    masked_lm: bool = True
    masked_roi: bool = True
    roi_masking: str = "pixel"  # "pixel": cached masked-pixel variants; "feature": appearance zeroed
    relationship: bool = False
    text_only: bool = True  # as many text-only samples as caption ones in each batch, from `corpus`
    # The text-only corpus: a text file or a folder of them, one sentence or paragraph a line, documents
    # separated by blank lines (BookCorpus, Wikipedia after extraction).
    corpus: str | None = field(default=None, metadata=EXISTING_PATH)

    def __post_init__(self) -> None:
        if self.roi_masking not in ROI_MASKING_MODES:
            raise ValueError(f"roi_masking {self.roi_masking!r} is not one of {ROI_MASKING_MODES}")
        if not (self.masked_lm or self.masked_roi or self.relationship):
            raise ValueError("pre-training needs at least one of masked_lm, masked_roi, relationship")


class CaptionPretraining(AnnotatedDataset):
    """Masked language modelling with visual clues and masked RoI classification with linguistic clues.

    `roi_masking="pixel"`: one cached masked-pixel variant per sample and epoch; its masked RoIs are
    the targets and every RoI feature comes from it. `"feature"`: RoIs drawn here have their
    appearance replaced inside the model (the reference code's mode without pixels).
    `relationship`: half the samples get another image's caption (label 0), never one word for word
    equal to one of the image's own, masked as the others but without MLM or RoI targets, as in the
    paper's ablation (c).
    Words are masked only for `masked_lm` and RoIs only for `masked_roi`: a corruption that no loss
    predicts only hides evidence from the others (the relationship head, trained alone on captions
    with 15% of their words and RoIs hidden, then scores whole ones).
    """

    KIND = "captions"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 roi_masking: str = "pixel", relationship: bool = False, seed: int = 0, masked_lm: bool = True,
                 masked_roi: bool = True) -> None:
        if roi_masking not in ROI_MASKING_MODES:
            raise ValueError(f"roi_masking={roi_masking!r}: expected one of {ROI_MASKING_MODES}")
        problem = self.store_problem(regions, roi_masking, masked_roi)
        if problem is not None:
            raise ValueError(problem)
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.roi_masking, self.relationship = roi_masking, relationship
        self.masked_lm, self.masked_roi = masked_lm, masked_roi

    @staticmethod
    def store_problem(regions: RegionBank, roi_masking: str, masked_roi: bool = True) -> str | None:
        """Why `regions` cannot feed pre-training with `roi_masking`, or None."""
        if not masked_roi:
            return None
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
            caption, matched = self.other_caption(rng, annotation), 0
        pieces = self.word_pieces(caption)
        # Another image's caption is masked as a matching one is, so that [MASK]s do not tell the
        # relationship head which it is (unmasked, they did: it learnt that instead of matching, and
        # ranked unmasked retrieval pairs at chance); its words are not predicted.
        masked = mask_whole_words(self.tokenizer, pieces, rng) if self.masked_lm else None
        pixel_variants = self.masked_roi and self.roi_masking == "pixel"
        # The variant is drawn before the read, at the same point of the draws as after it (neither the
        # read nor the sequence draws), so that only that variant is read.
        variant = rng.randrange(self.regions.num_variants) if pixel_variants else None
        regions = self.regions.get(annotation.image_id, class_probs=self.masked_roi, variant=variant)
        sequence = build_caption_sequence(self.tokenizer, pieces.ids if masked is None else masked.ids, len(regions),
                                          self.max_length, masked.labels if masked is not None and matched else None)
        regions = regions.truncated(sequence.num_regions)
        targets = {"relationship_labels": matched} if self.relationship else {}
        if not self.masked_roi:
            return Sample(sequence, regions, annotation.file, np.zeros(len(regions), bool), targets)
        if pixel_variants:
            predicted = replaced = regions.variant_masks[0]
            regions = Regions(regions.variant_appearance[0], regions.boxes, regions.image_size,
                              regions.class_probs, None, None)
        else:
            replaced, predicted = (np.array(m, bool) for m in choose_masked_regions(len(regions), rng))
        if not matched:
            predicted = np.zeros(len(regions), bool)
        return Sample(sequence, regions, annotation.file, np.asarray(replaced, bool), targets,
                      region_targets={"region_labels": predicted_rows(regions.class_probs, predicted)})


class TextOnlyCorpus(SeededDataset):
    """Masked language modelling on text without an image: the paper's text-only corpus. Each
    sample is a line of the corpus and the lines after it in its document, up to `max_length` words.
    Its texts are tokenized at every use: a memo of a corpus (BookCorpus, Wikipedia) would hold gigabytes."""

    def __init__(self, corpus: TextCorpus, tokenizer, max_length: int, seed: int = 0) -> None:
        super().__init__(seed)
        self.corpus, self.tokenizer, self.max_length = corpus, tokenizer, max_length

    def __len__(self) -> int:
        return len(self.corpus)

    def sample(self, index: int) -> Sample:
        pieces = word_pieces(self.tokenizer, self.corpus.text(index, self.max_length))
        masked = mask_whole_words(self.tokenizer, pieces, self.rng(index))
        return Sample(build_caption_sequence(self.tokenizer, masked.ids, 0, self.max_length, masked.labels))


class MaskedWordAccuracy(Evaluator):
    """Pre-training: masked words predicted right, against always predicting the most common word."""

    metric = "masked_word_accuracy"
    merged = {"correct": operator.add, "count": operator.add, "words": operator.add}

    def __init__(self, data: TaskData, dataset: AnnotatedDataset) -> None:
        self.correct, self.count, self.words = 0, 0, Counter()

    def add(self, samples, inputs, output) -> None:
        labels = inputs["mlm_labels"]
        chosen = labels != -100
        self.correct += int((output.mlm_logits.argmax(-1)[chosen] == labels[chosen]).sum())
        self.words.update(labels[chosen].tolist())
        self.count += int(chosen.sum())

    def result(self) -> dict[str, Any]:
        chance = self.words.most_common(1)[0][1] if self.words else 0
        return scored(self.metric, self.correct, chance, self.count)


def _dataset(data: TaskData, options: PretrainOptions, annotations: AnnotationFile, seed: int, training: bool):
    return CaptionPretraining(annotations, data.regions, data.tokenizer, data.max_length,
                              roi_masking=options.roi_masking, relationship=options.relationship, seed=seed,
                              masked_lm=options.masked_lm, masked_roi=options.masked_roi)


def _corpus(data: TaskData, options: PretrainOptions) -> TextCorpus | None:
    """The text-only corpus, indexed once for the run; None where the stage reads none."""
    if not (options.text_only and options.masked_lm and options.corpus is not None):
        return None
    return data.shared(("corpus", options.corpus), lambda: TextCorpus(options.corpus))


def _text_only(data: TaskData, options: PretrainOptions, seed: int) -> list[TextOnlyCorpus]:
    corpus = _corpus(data, options)
    return [] if corpus is None else [TextOnlyCorpus(corpus, data.tokenizer, data.max_length, seed)]


def _loss(model, inputs: dict[str, Any], options: PretrainOptions) -> dict[str, Any]:
    """The losses the options switch on; "feature" masking replaces masked RoIs inside the model."""
    if not options.masked_lm:
        inputs.pop("mlm_labels")
        inputs.pop("mlm_positions")
    if not options.masked_roi:
        inputs.pop("region_labels", None)
        inputs.pop("masked_regions", None)
    output = model(feature_masking=options.masked_roi and options.roi_masking == "feature", **inputs)
    return {name: getattr(output, name) for name in ("loss", "mlm_loss", "region_loss", "relationship_loss")
            if getattr(output, name) is not None}


TASK = Task(
    "pretrain", VLBertForPreTraining, _dataset, MaskedWordAccuracy,
    "masked language modelling with visual clues and masked RoI classification on captions",
    options=PretrainOptions,
    model_config=lambda data, options: {"with_relationship_head": options.relationship},
    store_problem=lambda regions, options: CaptionPretraining.store_problem(regions, options.roi_masking,
                                                                            options.masked_roi),
    read_inputs=_corpus, extra_streams=_text_only, loss=_loss)
