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

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from extract.images import is_utf8
from train.data.files import DataError, read_json, shown
from train.data.prepare import ANSWERS, Preparation, Source, SourceOption, SplitWriter

SPLITS = ("train2014", "val2014", "test2015", "test-dev2015")
QUESTIONS = "v2_OpenEnded_mscoco_{split}_questions.json"
ANNOTATIONS = "v2_mscoco_{split}_annotations.json"
ANNOTATED = ("train2014", "val2014")  # the test splits' answers stay on the evaluation server
IMAGE_FOLDERS = {"test-dev2015": "test2015"}  # a split's image folder where it is not the split's name
MIN_ANSWER_COUNT = 9  # with train2014 + val2014 this keeps the usual 3,129 answers

# The official evaluation's answer processing, as data. Marks replaced or dropped (the period has its
# own rule; the apostrophe, colon and others are kept).
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
               "?", "!")
# The official code compiles str patterns under Python 2, where \d is ASCII only.
DIGIT_COMMA_DIGIT = re.compile(r"\d,\d", re.ASCII)
# The official period pattern is "(?!<=\d)(\.)(?!\d)": its first group, meant as a look-behind, is a
# look-ahead for "<=" that never holds at a period, so every period not followed by a digit goes:
# "3.5" keeps its period, "3." and "mr. smith" lose theirs.
PERIOD_NOT_BEFORE_DIGIT = re.compile(r"\.(?!\d)", re.ASCII)
# The official call passes re.UNICODE (32) where sub() takes its count: at most 32 periods go.
PERIODS_REMOVED = 32
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = frozenset(("a", "an", "the"))
# Looked up after lower-casing, so the official keys with capitals ("Im", "Ive", "Id've", "I'dve") never
# apply; "somebody'd" -> "somebodyd" runs the wrong way round in the official table too.
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've", "hes": "he's", "howd": "how'd",
    "howll": "how'll", "hows": "how's", "Id've": "I'd've", "I'dve": "I'd've", "Im": "I'm", "Ive": "I've",
    "isnt": "isn't", "itd": "it'd", "itd've": "it'd've", "it'dve": "it'd've", "itll": "it'll", "let's": "let's",
    "maam": "ma'am", "mightnt": "mightn't", "mightnt've": "mightn't've", "mightn'tve": "mightn't've",
    "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's",
    "shouldve": "should've", "shouldnt": "shouldn't", "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd", "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've", "somebodyll": "somebody'll", "somebodys": "somebody's",
    "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've", "somethingll": "something'll",
    "thats": "that's", "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've",
    "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've", "twas": "'twas",
    "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've", "werent": "weren't",
    "whatll": "what'll", "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's",
    "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd", "whod've": "who'd've",
    "who'dve": "who'd've", "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll",
    "whyre": "why're", "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll",
    "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've",
    "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're",
    "youve": "you've"}


@dataclass(frozen=True, slots=True)
class VqaAnnotation:
    """One annotation of a published annotations file, less the per-answer dicts."""

    image_id: int
    answers: list[str]  # the raw answers as published, in their order
    multiple_choice_answer: str
    answer_type: str
    question_type: str


def clean_answer(answer: str) -> str:
    """The official first step, applied to every answer: tabs and newlines become spaces, the ends
    lose their whitespace."""
    return answer.replace("\n", " ").replace("\t", " ").strip()


def process_punctuation(text: str) -> str:
    """The official processPunctuation: a mark next to a space is dropped, one inside a word becomes a
    space ("black/white" -> "black white"); periods not followed by a digit are dropped (32 at most)."""
    # Official quirk: one digit-comma-digit anywhere ("1,000") makes every mark vanish instead.
    drop_all = DIGIT_COMMA_DIGIT.search(text) is not None
    processed = text
    for mark in PUNCTUATION:
        # the official test looks at the text as given, not as changed by the marks before
        dropped = drop_all or f"{mark} " in text or f" {mark}" in text
        processed = processed.replace(mark, "" if dropped else " ")
    return PERIOD_NOT_BEFORE_DIGIT.sub("", processed, count=PERIODS_REMOVED)


def process_digit_article(text: str) -> str:
    """The official processDigitArticle: lower case, number words as digits ("none" too becomes
    "0"), articles dropped, contractions given their apostrophe, words joined by single spaces."""
    words = [NUMBER_WORDS.get(word, word) for word in text.lower().split()]
    return " ".join(CONTRACTIONS.get(word, word) for word in words if word not in ARTICLES)


@lru_cache(maxsize=1 << 16)  # a few answers ("yes", "no", "2", ...) are most of them
def process_answer(answer: str) -> str:
    """An answer through the official processing (after `clean_answer`)."""
    return process_digit_article(process_punctuation(answer))


def normalize_answer(answer: str) -> str:
    """An answer as the official evaluation compares it when annotators disagree; the answer
    vocabulary and training targets use it so that training and evaluation agree."""
    return process_answer(clean_answer(answer))


def leave_one_out_accuracy(answers: list[str], candidate: str) -> float:
    """The official accuracy of `candidate` against human `answers`: the mean, over the answers
    left out one at a time, of min(1, matches among the others / 3). (The official code leaves out an
    answer's dict, which its answer_id makes unique: one answer at a time, as here.)"""
    matches = answers.count(candidate)
    total = 0.0
    for answer in answers:  # summed left to right like the official Python 2 sum(); 3.12's sum() compensates
        total += min(1.0, (matches - (answer == candidate)) / 3)
    return total / len(answers)


def answer_scores(answers: list[str]) -> dict[str, float]:
    """The soft score of each normalised answer among the raw `answers` (VQA v2: ten of them): its
    official accuracy; one answer alone (the demo world's case) scores 1.0."""
    normalized = [normalize_answer(answer) for answer in answers]
    if len(normalized) == 1:
        return {normalized[0]: 1.0}
    return {answer: leave_one_out_accuracy(normalized, answer) for answer in dict.fromkeys(normalized)}


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
