"""Dependency relation names: the Stanford dependencies that VisualBERT's Table 2 reports (its
parses came from AllenNLP's Stanford-style parser) and the Universal Dependencies names that most
parsers write today, so that a table of either can be read against the paper's.

`LABEL_MAP` pairs each Stanford name with the UD name(s) of the arc joining the same two words.
Where UD joins other words, the arcs are rebuilt from UD's structure, not renamed: UD hangs a
prepositional phrase's noun on the word it modifies (obl, nmod) and the preposition on the noun
(case), where Stanford chains word → preposition (prep) → noun (pobj). So where a noun attached by
obl/nmod has a `case` child, that preposition becomes the modified word's `prep` and the noun the
preposition's `pobj`; the `case` of a possessor (nmod:poss), the possessive 's, becomes `possessive`
(`ud_as_stanford`). The rebuilt arcs carry their Stanford names.

Parsers write one of two label sets (`LABEL_SETS`): UD's, or ClearNLP's (spaCy's English models),
which keeps most Stanford names and Stanford's structure (prep → pobj, dobj) but spells a few as UD
does and gives `case` and `nmod` other meanings than UD: `case` is the possessive 's, `nmod` a
modifier with no Stanford counterpart in the paper's table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from train.analysis.parses import Word


@dataclass(frozen=True)
class LabelMapping:
    stanford: str
    ud: tuple[str, ...]
    note: str = ""  # where the UD arc joins other words than the Stanford one


REBUILT = "rebuilt from UD's structure (ud_as_stanford)"
LABEL_MAP = (
    LabelMapping("det", ("det",)),
    LabelMapping("pobj", (), f"{REBUILT}: the case preposition of an obl/nmod noun → the noun"),
    LabelMapping("amod", ("amod",)),
    LabelMapping("nsubj", ("nsubj",)),
    LabelMapping("prep", (), f"{REBUILT}: the word an obl/nmod noun modifies → the noun's case preposition"),
    LabelMapping("dobj", ("obj",)),
    LabelMapping("punct", ("punct",)),
    LabelMapping("partmod", ("acl",), "acl also covers Stanford's infmod"),
    LabelMapping("nn", ("compound", "flat", "flat:name"),
                 "flat hangs a name's later words on its first, where nn hangs the earlier ones on the last"),
    LabelMapping("num", ("nummod",)),
    LabelMapping("nsubjpass", ("nsubj:pass",)),
    LabelMapping("auxpass", ("aux:pass",)),
    LabelMapping("iobj", ("iobj",)),
    LabelMapping("poss", ("nmod:poss",)),
    LabelMapping("possessive", (), f"{REBUILT}: the case of an nmod:poss noun (the possessive 's)"),
    LabelMapping("rcmod", ("acl:relcl",)),
    LabelMapping("infmod", ("acl",)),
    LabelMapping("prt", ("compound:prt",)),
    LabelMapping("predet", ("det:predet",)),
    LabelMapping("preconj", ("cc:preconj",)),
    # UD 2.14 writes both of the older tmod and npmod as unmarked: either Stanford name.
    LabelMapping("tmod", ("obl:tmod", "nmod:tmod", "obl:unmarked", "nmod:unmarked")),
    LabelMapping("npadvmod", ("obl:npmod", "nmod:npmod", "obl:unmarked", "nmod:unmarked")),
    LabelMapping("neg", ("advmod",), "UD's advmod also covers every other adverb"),
    LabelMapping("acomp", ("xcomp",)),
    LabelMapping("csubjpass", ("csubj:pass",)),
    LabelMapping("mwe", ("fixed",)),
    LabelMapping("quantmod", ("advmod",)),
    *(LabelMapping(name, (name,)) for name in ("advmod", "aux", "cc", "conj", "cop", "mark", "expl", "appos",
                                               "ccomp", "xcomp", "csubj", "parataxis", "discourse", "dep",
                                               "root", "advcl", "goeswith")),
)
STANFORD_NAMES = {mapping.stanford for mapping in LABEL_MAP}


def _ud_stanford_names(label: str) -> tuple[str, ...]:
    """Those whose UD names hold `label` (a subtype such as acl:x falls back to its base, acl, where
    the map lacks it)."""
    found = tuple(mapping.stanford for mapping in LABEL_MAP if label in mapping.ud)
    if not found and ":" in label:
        return _ud_stanford_names(label.split(":")[0])
    return found


PREPOSITIONAL = ("obl", "nmod")  # UD's relations of a noun that a `case` preposition introduces
POSSESSOR = "nmod:poss"
CASE = "case"


def ud_as_stanford(words: list[Word]) -> list[Word]:
    """`words` (a tree in UD) with Stanford's prep, pobj and possessive arcs rebuilt (module docstring);
    where a noun has several case children ("from under"), the first is the preposition."""
    rebuilt = list(words)
    for word in words:
        head = words[word.head - 1] if word.head else None
        if word.relation.split(":")[0] == CASE and head is not None and head.relation == POSSESSOR:
            rebuilt[word.index - 1] = replace(word, relation="possessive")
        if word.head == 0 or word.relation == POSSESSOR or word.relation.split(":")[0] not in PREPOSITIONAL:
            continue
        marker = next((other for other in words if other.head == word.index
                       and other.relation.split(":")[0] == CASE), None)
        if marker is not None:
            rebuilt[marker.index - 1] = replace(marker, head=word.head, relation="prep")
            rebuilt[word.index - 1] = replace(word, head=marker.index, relation="pobj")
    return rebuilt


@dataclass(frozen=True)
class LabelSet:
    """A parser's label set: the Stanford names of each of its labels, and its trees with the Stanford
    arcs rebuilt where the set's structure differs from Stanford's."""

    names: Callable[[str], tuple[str, ...]]
    as_stanford: Callable[[list[Word]], list[Word]]


# ClearNLP's labels that are not Stanford names, with the Stanford names of the same arcs; any other
# (nmod, attr, oprd, agent, pcomp, meta) has none.
CLEARNLP_NAMES = {"compound": ("nn",), "nummod": ("num",), "acl": ("partmod", "infmod"), "relcl": ("rcmod",),
                  "case": ("possessive",), "dative": ("iobj",), "intj": ("discourse",)}
LABEL_SETS = {
    "ud": LabelSet(_ud_stanford_names, ud_as_stanford),
    "clearnlp": LabelSet(lambda label: CLEARNLP_NAMES.get(label, ()), list),  # Stanford's structure already
}


def stanford_names(label: str, labels: str = "ud") -> tuple[str, ...]:
    """The Stanford names a parser's label stands for, in the parser's label set `labels`: the
    label itself when it is a Stanford name, else the set's mapping of it."""
    if label in STANFORD_NAMES:
        return (label,)
    return LABEL_SETS[labels].names(label)


def paper_name(label: str, labels: str = "ud") -> str | None:
    """The relation of VisualBERT's Table 2 that a parser's label corresponds to, or None."""
    return next((name for name in stanford_names(label, labels) if name in PAPER_TABLE_2), None)


@dataclass(frozen=True)
class PaperRow:
    """A row of VisualBERT's Table 2: the most-confident-region baseline, the best head's accuracy
    (%), and that head (layer, head, from 1), on Flickr30K validation captions."""

    baseline: float
    best: float
    layer: int
    head: int


PAPER_TABLE_2 = {
    "det": PaperRow(19.59, 54.01, 10, 1),
    "pobj": PaperRow(17.34, 32.82, 11, 11),
    "amod": PaperRow(18.67, 45.96, 10, 9),
    "nsubj": PaperRow(23.19, 44.64, 5, 1),
    "prep": PaperRow(20.61, 49.27, 9, 11),
    "dobj": PaperRow(9.82, 30.24, 11, 11),
    "punct": PaperRow(23.32, 48.80, 3, 6),
    "partmod": PaperRow(21.41, 38.15, 4, 9),
    "nn": PaperRow(16.33, 34.06, 10, 9),
    "num": PaperRow(23.15, 67.44, 9, 11),
}
PAPER_FIGURE_4 = ("pobj", "nsubj", "amod")  # the relations Figure 4 plots
