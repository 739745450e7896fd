"""Dependency parses of captions, for the syntactic grounding analysis: read as CoNLL-U (from any
parser, one sentence per caption in the captions' order) or made by spaCy where it and an English
model are installed. `PARSERS` maps a `--parser` name to its reader.

A parse is trusted only where its tokens are the caption's own text: `align` finds each surface
token at the caption's next non-space character, and a sentence where one is not there (a parser
that rewrote quotes or brackets, a parse of another caption) is skipped and named, never aligned by
guesswork. A multiword token (`3-4`) gives its words its characters; empty nodes (`3.1`) carry no
text and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import conllu
from conllu.exceptions import ParseException

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


def read_conllu(path: str | Path) -> list[ParsedSentence]:
    """The sentences of a CoNLL-U file; DataError naming the file and line of the first sentence that
    is not CoNLL-U, or whose word lacks a head or relation or names a head outside the sentence."""
    path = Path(path)
    sentences, block, first = [], [], 1
    for number, line in enumerate([*read_text(path).splitlines(), ""], 1):
        if line.strip():
            block.append(line)
            continue
        if any(not row.startswith("#") for row in block):
            sentences.append(_sentence("\n".join(block) + "\n\n", f"{path}:{first} (sentence {len(sentences) + 1})"))
        block, first = [], number + 1
    return sentences


def _sentence(text: str, where: str) -> ParsedSentence:
    try:
        (tokens,) = conllu.parse(text)
    except ParseException as exc:
        raise DataError(f"{where}: not CoNLL-U ({exc})") from None
    words, surface, covered = [], [], set()
    for token in tokens:
        index = token["id"]
        if isinstance(index, tuple) and index[1] == "-":  # a multiword token: its form is the text
            surface.append((token["form"], tuple(range(index[0], index[2] + 1))))
            covered.update(range(index[0], index[2] + 1))
        elif isinstance(index, int):
            words.append(_word(token, where))
            if index not in covered:
                surface.append((token["form"], (index,)))
        # an empty node (a decimal id) has no text and no basic head
    if [word.index for word in words] != list(range(1, len(words) + 1)):
        raise DataError(f"{where}: word ids {shown([word.index for word in words])} are not 1, 2, 3, ... in order")
    if any(index > len(words) for _, ids in surface for index in ids):
        raise DataError(f"{where}: a multiword token covers ids past the last word ({len(words)})")
    for word in words:
        if not 0 <= word.head <= len(words):
            raise DataError(f"{where}: word {word.index} {word.form!r} has head {word.head}, not a word of the "
                            f"sentence (0 to {len(words)})")
    return ParsedSentence(words, surface, where)


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
                                        f"{models[0]} parse {number + 1}"))
    return sentences


@dataclass(frozen=True)
class Parser:
    parse: Callable[[list[Caption], Path | None], list[ParsedSentence]]
    labels: str  # the label set it writes (relations.LABEL_SETS), unless the user names another


PARSERS = {
    "conllu": Parser(conllu_parses, "ud"),
    "spacy": Parser(spacy_parses, "clearnlp"),
}
