"""Dependency parses of captions, for the syntactic grounding analysis: read as CoNLL-U (from any
parser, one sentence per caption in the captions' order) or made by spaCy where it and an English
model are installed. `PARSERS` maps a `--parser` name to its reader.

A parse is trusted only where its tokens are the caption's own text: `align` finds each surface
token at the caption's next non-space character, and a sentence where one is not there (a parser
that rewrote quotes or brackets, a parse of another caption) is skipped and named, never aligned by
guesswork. A multiword token (`3-4`) gives its words its characters; empty nodes (`3.1`) carry no
text and are left out. A parse must also be a tree: every word reaches the root (head 0) through its
heads; a head outside the sentence, a word that is its own head, or a cycle of heads makes the
sentence skipped and named (`ParsedSentence.problem`, with the word's file and line), never scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import conllu
from conllu.exceptions import ParseException
from conllu.parser import DEFAULT_FIELD_PARSERS

from train.analysis.phrases import Caption
from train.data.files import DataError, read_text, shown


@dataclass(frozen=True)
class Word:
    index: int  # the word's id in the sentence, from 1
    form: str
    head: int  # 0: the root
    relation: str


@dataclass(frozen=True)
class ParsedSentence:
    words: list[Word]  # word i has index i + 1
    tokens: list[tuple[str, tuple[int, ...]]]  # surface tokens in order: (form, the ids of its words)
    where: str  # the sentence's place, for messages
    problem: str | None = None  # why its words are not a tree (`tree_problem`): the sentence is skipped


def read_conllu(path: str | Path) -> list[ParsedSentence]:
    """The sentences of a CoNLL-U file, each with its tree problem if any; DataError naming the file
    and line of the first sentence that is not CoNLL-U, or whose word lacks a head or relation."""
    path = Path(path)
    sentences, block, first = [], [], 1
    for number, line in enumerate([*read_text(path).splitlines(), ""], 1):
        if line.strip():
            block.append((number, line))
            continue
        rows = [(row_number, row) for row_number, row in block if not row.startswith("#")]
        if rows:
            text = "\n".join(row for _, row in block) + "\n\n"
            where = f"{path}:{first} (sentence {len(sentences) + 1})"
            sentences.append(_sentence(text, where, [row_number for row_number, _ in rows]))
        block, first = [], number + 1
    return sentences


HEAD_DIGITS = 18
TOO_LONG_HEAD = 10 ** HEAD_DIGITS  # stands for a HEAD of more digits: past any sentence's words


def _head(fields: list[str], index: int) -> int | None:
    """A row's HEAD as conllu reads it, except one of more than HEAD_DIGITS digits (int() refuses one
    of thousands: a traceback), read as TOO_LONG_HEAD."""
    if len(fields[index]) > HEAD_DIGITS and fields[index].isdigit():
        return TOO_LONG_HEAD
    return DEFAULT_FIELD_PARSERS["head"](fields, index)


_FIELD_PARSERS = {"head": _head}


def _sentence(text: str, where: str, lines: list[int]) -> ParsedSentence:
    """The sentence of `text` (a CoNLL-U block whose token rows are on `lines` of the file)."""
    try:
        (tokens,) = conllu.parse(text, field_parsers=_FIELD_PARSERS)
    except ParseException as exc:
        raise DataError(f"{where}: not CoNLL-U ({exc})") from None
    words, surface, covered, word_lines = [], [], set(), {}
    for token, line in zip(tokens, lines):
        index = token["id"]
        if isinstance(index, tuple) and index[1] == "-":  # a multiword token: its form is the text
            surface.append((token["form"], tuple(range(index[0], index[2] + 1))))
            covered.update(range(index[0], index[2] + 1))
        elif isinstance(index, int):
            words.append(_word(token, where))
            word_lines[index] = line
            if index not in covered:
                surface.append((token["form"], (index,)))
        # an empty node (a decimal id) has no text and no basic head
    if [word.index for word in words] != list(range(1, len(words) + 1)):
        raise DataError(f"{where}: word ids {shown([word.index for word in words])} are not 1, 2, 3, ... in order")
    if any(index > len(words) for _, ids in surface for index in ids):
        raise DataError(f"{where}: a multiword token covers ids past the last word ({len(words)})")
    return ParsedSentence(words, surface, where, tree_problem(words, lambda word: f" (line {word_lines[word]})"))


def tree_problem(words: list[Word], place: Callable[[int], str] = lambda word: "") -> str | None:
    """Why `words` (word i has index i + 1) are not a dependency tree, naming the first word at fault
    (`place`: where word i is, for the message), or None."""
    for word in words:
        if not 0 <= word.head <= len(words):
            head = f"of more than {HEAD_DIGITS} digits" if word.head >= TOO_LONG_HEAD else word.head
            return (f"word {word.index} {word.form!r}{place(word.index)} has head {head}, not a word of the "
                    f"sentence (0 to {len(words)})")
        if word.head == word.index:
            return f"word {word.index} {word.form!r}{place(word.index)} is its own head: not a tree"
    reaches_root: set[int] = {0}
    for word in words:
        path = [word.index]
        while path[-1] not in reaches_root:
            head = words[path[-1] - 1].head
            if head in path:
                cycle = path[path.index(head):] + [head]
                chain = " → ".join(f"{i} {words[i - 1].form!r}" for i in cycle)
                return f"the heads of words {chain}{place(cycle[0])} form a cycle: not a tree"
            path.append(head)
        reaches_root.update(path)
    return None


def _word(token: dict, where: str) -> Word:
    head, relation = token.get("head"), token.get("deprel")
    if not isinstance(head, int) or not isinstance(relation, str) or relation in ("", "_"):
        raise DataError(f"{where}: word {token['id']} {token.get('form')!r} has no head or relation (HEAD "
                        f"{shown(head)}, DEPREL {shown(relation)}); CoNLL-U has 10 tab-separated columns")
    return Word(token["id"], token["form"], head, relation)


def align(sentence: ParsedSentence, text: str) -> list[tuple[int, int]] | str:
    """Each word's characters in `text` (in word order), or why the sentence's tokens are not `text`."""
    spans: list[tuple[int, int] | None] = [None] * len(sentence.words)
    position = 0
    for form, ids in sentence.tokens:
        while position < len(text) and text[position].isspace():
            position += 1
        if not text.startswith(form, position):
            return (f"token {ids[0]} {form!r} is not the caption's text at character {position} "
                    f"({text[position:position + len(form) + 8]!r})")
        for index in ids:
            spans[index - 1] = (position, position + len(form))
        position += len(form)
    if text[position:].strip():
        return f"the caption goes on after the last token: {text[position:].strip()!r}"
    return spans  # every word is in a token: CoNLL-U words outside a range are tokens themselves


def conllu_parses(captions: list[Caption], parses: Path | None) -> list[ParsedSentence]:
    """The parses of a CoNLL-U file, one sentence per caption."""
    if parses is None:
        raise DataError("--parser conllu reads the parses from a CoNLL-U file: give it with --parses FILE")
    sentences = read_conllu(parses)
    if len(sentences) != len(captions):
        raise DataError(f"{parses}: {len(sentences)} sentences, but the split's Sentences files hold "
                        f"{len(captions)} captions; give one parse per caption, in the order of the split "
                        "file's images and of their Sentences lines")
    return sentences


SPACY_HINT = ("pip install 'vlbert-pipeline[syntax]' and an English model (python -m spacy download "
              "en_core_web_sm), or give CoNLL-U parses with --parses FILE")


def spacy_parses(captions: list[Caption], parses: Path | None) -> list[ParsedSentence]:
    """The captions parsed by the first installed English spaCy model (en_core_web_*; nothing is
    downloaded). Its labels are ClearNLP's, mostly the Stanford names of VisualBERT's table."""
    if parses is not None:
        raise DataError(f"--parses {parses}: --parser spacy parses the captions itself; give one of the two")
    try:
        import spacy
    except ImportError:
        raise DataError(f"--parser spacy: spaCy is not installed; {SPACY_HINT}") from None
    models = sorted(name for name in spacy.util.get_installed_models() if name.startswith("en_"))
    if not models:
        raise DataError(f"--parser spacy: spaCy {spacy.__version__} has no English model installed; {SPACY_HINT}")
    nlp = spacy.load(models[0], exclude=["ner"])
    sentences = []
    for number, doc in enumerate(nlp.pipe(caption.text for caption in captions)):
        words = [Word(token.i + 1, token.text, 0 if token.head.i == token.i else token.head.i + 1,
                      "root" if token.dep_ == "ROOT" else token.dep_) for token in doc]
        sentences.append(ParsedSentence(words, [(word.form, (word.index,)) for word in words],
                                        f"{models[0]} parse {number + 1}", tree_problem(words)))
    return sentences


@dataclass(frozen=True)
class Parser:
    parse: Callable[[list[Caption], Path | None], list[ParsedSentence]]
    labels: str  # the label set it writes (relations.LABEL_SETS), unless the user names another


PARSERS = {
    "conllu": Parser(conllu_parses, "ud"),
    "spacy": Parser(spacy_parses, "clearnlp"),
}
