"""VQA v2 (Goyal et al., CVPR 2017) as published at visualqa.org, and its answers as the official
evaluation (GT-Vision-Lab/VQA, PythonEvaluationTools/vqaEvaluation/vqaEval.py) processes them.

Layout read:
    --root    v2_OpenEnded_mscoco_{train2014,val2014,test2015,test-dev2015}_questions.json:
                  {"questions": [{"image_id": int, "question": str, "question_id": int}, ...],
                   "info", "task_type", "data_type", "data_subtype", "license"}
              v2_mscoco_{train2014,val2014}_annotations.json:
                  {"annotations": [{"question_id", "image_id", "question_type", "answer_type",
                   "multiple_choice_answer", "answers": [{"answer", "answer_confidence",
                   "answer_id"}] x10}, ...], "info", "license", ...}
    --images  the COCO images: {split}/COCO_{split}_{image_id:012d}.jpg (or any other extension
              extraction reads: a user's own set converted to this layout may keep .png); test-dev2015
              is a subset of test2015 and has no folder of its own: its images are
              test2015/COCO_test2015_*.jpg.

Written: every split whose questions file is present, one record per image in image_id order
({"file", "image_id", "vqa": [...]}, questions by question_id; the ten raw answers, answer_type and
question_type on train2014 and val2014 only). Items are questions. A question without an annotation
is skipped (and counted); an annotation without a question is left out and counted in the split's
summary as `annotations_without_question`. Texts are kept as published, blank or not, as the official
evaluation scores every question; a lone surrogate (a JSON escape such as "\\ud800") stays an escape
in the written JSON. answers.txt: the normalised multiple_choice_answer of every annotated question
of train2014 and val2014 (whether or not its image is present, so the vocabulary does not depend on
the images downloaded) seen at least `min_answer_count` times (default 9), most frequent first; an
answer that is empty after normalisation, or not writable as UTF-8 text (a lone surrogate), cannot
be a line of it and is left out. summary.json's top level records `answers` (how many) and
`min_answer_count`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extract.images import is_utf8
from train.data.files import DataError, read_json, shown
from train.data.prepare import ANSWERS, Preparation, Source, SourceOption, SplitWriter
from train.evaluation.vqa_answers import normalize_answer

SPLITS = ("train2014", "val2014", "test2015", "test-dev2015")
QUESTIONS = "v2_OpenEnded_mscoco_{split}_questions.json"
ANNOTATIONS = "v2_mscoco_{split}_annotations.json"
ANNOTATED = ("train2014", "val2014")  # the test splits' answers stay on the evaluation server
IMAGE_FOLDERS = {"test-dev2015": "test2015"}  # a split's image folder where it is not the split's name
MIN_ANSWER_COUNT = 9  # with train2014 + val2014 this keeps the usual 3,129 answers

@dataclass(frozen=True, slots=True)
class VqaAnnotation:
    """One annotation of a published annotations file, less the per-answer dicts."""

    image_id: int
    answers: list[str]  # the raw answers as published, in their order
    multiple_choice_answer: str
    answer_type: str
    question_type: str


QUESTION_FIELDS = {"question_id": int, "image_id": int, "question": str}
ANNOTATION_FIELDS = {"question_id": int, "image_id": int, "question_type": str, "answer_type": str,
                     "multiple_choice_answer": str, "answers": list}


def read_questions(path: Path) -> list[dict[str, Any]]:
    """The "questions" list of a published questions file, each checked for its fields."""
    questions = _published_list(path, "questions", QUESTION_FIELDS)
    _check_unique_ids(questions, path)
    return questions


def read_annotations(path: Path) -> dict[int, VqaAnnotation]:
    """The annotations of a published annotations file by question_id, in the file's order."""
    annotations: dict[int, VqaAnnotation] = {}
    for index, item in enumerate(_published_list(path, "annotations", ANNOTATION_FIELDS)):
        answers = item["answers"]
        if not answers or not all(isinstance(a, dict) and isinstance(a.get("answer"), str) for a in answers):
            raise DataError(f"{path}: annotations[{index}] (question_id {item['question_id']}): 'answers' must be "
                            f"a non-empty list of {{\"answer\": str, ...}} objects")
        if item["question_id"] in annotations:
            raise DataError(f"{path}: annotations[{index}]: question_id {item['question_id']} is annotated twice")
        annotations[item["question_id"]] = VqaAnnotation(
            item["image_id"], [a["answer"] for a in answers], item["multiple_choice_answer"], item["answer_type"],
            item["question_type"])
    return annotations


def _published_list(path: Path, key: str, fields: dict[str, type]) -> list[dict[str, Any]]:
    """`path`'s top-level `key` list, every item an object with `fields` of their types."""
    value = read_json(path)
    items = value.get(key) if isinstance(value, dict) else None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON object with a {key!r} list")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise DataError(f"{path}: {key}[{index}]: expected an object, found {type(item).__name__}")
        for field, kind in fields.items():
            found = item.get(field)
            if not isinstance(found, kind) or isinstance(found, bool):
                raise DataError(f"{path}: {key}[{index}] (question_id {shown(item.get('question_id'))}): "
                                f"{field!r} must be {kind.__name__}, found {shown(found)}")
    return items


def _check_unique_ids(questions: list[dict[str, Any]], path: Path) -> None:
    seen: set[int] = set()
    for index, question in enumerate(questions):
        if question["question_id"] in seen:
            raise DataError(f"{path}: questions[{index}]: question_id {question['question_id']} appears twice")
        seen.add(question["question_id"])


def image_file(split: str, image_id: int) -> str:
    """A question's image relative to the images root (COCO's published names)."""
    folder = IMAGE_FOLDERS.get(split, split)
    return f"{folder}/COCO_{folder}_{image_id:012d}.jpg"


def prepare(preparation: Preparation) -> None:
    """Every split whose questions file is under --root, then answers.txt (see the module docstring)."""
    root = preparation.root
    found = preparation.present({split: root / QUESTIONS.format(split=split) for split in SPLITS})
    for split in found:  # fail before anything is written
        annotations = root / ANNOTATIONS.format(split=split)
        if split in ANNOTATED and not annotations.is_file():
            raise DataError(f"{root / QUESTIONS.format(split=split)}: questions without annotations: "
                            f"{annotations} is missing")
    min_count = _min_answer_count(preparation.options)
    chosen: Counter[str] = Counter()  # raw multiple_choice_answer -> questions
    for split in found:
        with preparation.split(split) as writer:
            _prepare_split(preparation, writer, chosen)
    if any(split in ANNOTATED for split in found):
        vocabulary = answer_vocabulary(chosen, min_count)
        preparation.write_lines(ANSWERS, vocabulary)
        preparation.summary.update(answers=len(vocabulary), min_answer_count=min_count)
        preparation.log(f"vqa2: {len(vocabulary)} answers seen at least {min_count} times in {ANSWERS}")


def _min_answer_count(options: dict[str, Any]) -> int:
    count = options.get("min_answer_count", MIN_ANSWER_COUNT)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise DataError(f"--min-answer-count {count!r}: expected a whole number of at least 1")
    return count


def answer_vocabulary(chosen: Counter[str], min_count: int) -> list[str]:
    """The normalised answers among `chosen` (raw answer -> questions) with at least `min_count`
    questions, most frequent first, ties in text order; only those that can be a line of UTF-8
    text."""
    counts: Counter[str] = Counter()
    for answer, questions in chosen.items():  # each distinct raw answer normalised once
        counts[normalize_answer(answer)] += questions
    kept = [(answer, n) for answer, n in counts.items() if n >= min_count and answer and is_utf8(answer)]
    return [answer for answer, _ in sorted(kept, key=lambda item: (-item[1], item[0]))]


def _prepare_split(preparation: Preparation, writer: SplitWriter, chosen: Counter[str]) -> None:
    """One split's questions into per-image records; adds its annotated answers to `chosen`."""
    split, root = writer.name, preparation.root
    questions_path = root / QUESTIONS.format(split=split)
    questions = read_questions(questions_path)
    annotations = read_annotations(root / ANNOTATIONS.format(split=split)) if split in ANNOTATED else None
    by_image: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
    for question in preparation.progress(questions, f"{split} questions", total=len(questions)):
        entry = {"question_id": question["question_id"], "question": question["question"]}
        if annotations is not None:
            annotation = annotations.pop(question["question_id"], None)  # what stays has no question
            if annotation is None:
                writer.skip(question["question_id"], "no annotation for this question")
                continue
            if annotation.image_id != question["image_id"]:
                raise DataError(f"{questions_path}: question_id {question['question_id']} is on image "
                                f"{question['image_id']}, its annotation on image {annotation.image_id}")
            entry.update(answers=annotation.answers, answer_type=annotation.answer_type,
                         question_type=annotation.question_type)
            chosen[annotation.multiple_choice_answer] += 1
        by_image[question["image_id"]].append(entry)
    if annotations is not None:
        writer.extra["annotations_without_question"] = len(annotations)
        if annotations:
            preparation.log(f"vqa2 {split}: {len(annotations)} annotations have no question in "
                            f"{questions_path.name}; left out")
    for image_id in preparation.progress(sorted(by_image), f"{split} images", total=len(by_image)):
        entries = sorted(by_image.pop(image_id), key=lambda entry: entry["question_id"])
        file = writer.find_image([entry["question_id"] for entry in entries], image_file(split, image_id),
                                 len(entries))
        if file is not None:
            writer.add({"file": file, "image_id": image_id, "vqa": entries}, len(entries))


SOURCE = Source("vqa2", SPLITS, prepare, about=(
    "VQA v2: v2_OpenEnded_mscoco_*_questions.json and v2_mscoco_*_annotations.json under --root, COCO "
    "images (train2014/, val2014/, test2015/) under --images; also writes answers.txt"),
    options=(SourceOption("min_answer_count", int, f"answers kept in the vocabulary (default {MIN_ANSWER_COUNT}).",
                          minimum=1),),
    image_names="<split>/COCO_<split>_<image_id:012d>")
