"""The official VQA evaluation's answer processing (GT-Vision-Lab/VQA, vqaEval.py) and the soft
score of each answer: what the evaluation compares (`train.evaluation.vqa2`), and what the answer
vocabulary of `vlbert data prepare vqa2` and the training targets use, so that training and
evaluation agree."""

from __future__ import annotations

import re
from functools import lru_cache

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
