"""Dependency relation names: the Stanford dependencies that VisualBERT's Table 2 reports (its
parses came from AllenNLP's Stanford-style parser) and the Universal Dependencies names that most
parsers write today, so that a table of either can be read against the paper's.

`LABEL_MAP` pairs each Stanford name with the UD name(s) of the arc joining the same two words.
Where UD joins other words, the record says so: UD hangs a prepositional phrase's noun on the word
it modifies (obl, nmod) and the preposition on the noun (case), where Stanford chains word →
preposition (prep) → noun (pobj). So `case` joins pobj's two words (head and dependent swapped),
while obl/nmod join the modified word to the noun, not to the preposition as prep does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LabelMapping:
    stanford: str
    ud: tuple[str, ...]
    note: str = ""  # where the UD arc joins other words than the Stanford one


LABEL_MAP = (
    LabelMapping("det", ("det",)),
    LabelMapping("pobj", ("case",), "UD's case arc joins the same words, from the noun to the preposition"),
    LabelMapping("amod", ("amod",)),
    LabelMapping("nsubj", ("nsubj",)),
    LabelMapping("prep", ("obl", "nmod"), "UD joins the modified word to the phrase's noun, not to the preposition"),
    LabelMapping("dobj", ("obj",)),
    LabelMapping("punct", ("punct",)),
    LabelMapping("partmod", ("acl",), "acl also covers Stanford's infmod"),
    LabelMapping("nn", ("compound",)),
    LabelMapping("num", ("nummod",)),
    LabelMapping("nsubjpass", ("nsubj:pass",)),
    LabelMapping("auxpass", ("aux:pass",)),
    LabelMapping("iobj", ("iobj",)),
    LabelMapping("poss", ("nmod:poss",)),
    LabelMapping("possessive", ("case",), "UD's case also marks prepositions"),
    LabelMapping("rcmod", ("acl:relcl",)),
    LabelMapping("infmod", ("acl",)),
    LabelMapping("prt", ("compound:prt",)),
    LabelMapping("predet", ("det:predet",)),
    LabelMapping("preconj", ("cc:preconj",)),
    LabelMapping("tmod", ("obl:tmod",)),
    LabelMapping("npadvmod", ("obl:npmod",)),
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


def ud_names(stanford: str) -> tuple[str, ...]:
    """The UD names of a Stanford relation (empty for a name the map does not hold)."""
    return next((mapping.ud for mapping in LABEL_MAP if mapping.stanford == stanford), ())


def stanford_names(label: str) -> tuple[str, ...]:
    """The Stanford names a parser's label stands for: the label itself when it is a Stanford name
    (spaCy's English models write pobj, prep, dobj), else those whose UD names hold it (a subtype
    such as obl:agent falls back to its base, obl, where the map lacks it)."""
    if label in STANFORD_NAMES:
        return (label,)
    found = tuple(mapping.stanford for mapping in LABEL_MAP if label in mapping.ud)
    if not found and ":" in label:
        return stanford_names(label.split(":")[0])
    return found


def paper_name(label: str) -> str | None:
    """The relation of VisualBERT's Table 2 that a parser's label corresponds to, or None."""
    return next((name for name in stanford_names(label) if name in PAPER_TABLE_2), None)


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
