"""The text-only corpus: long sentences in the world's vocabulary, one per line."""

from __future__ import annotations

import numpy as np

from pipelines.world.vocabulary import CLASS_NAMES, COLOURS, NUMBER_WORDS, PLURALS

CORNERS = {"square": "four corners", "circle": "no corners at all", "triangle": "three corners",
           "diamond": "four corners", "star": "five sharp points", "cross": "four short arms"}
PLACES = ("near the top edge", "close to the bottom", "in the middle of the picture", "on the left side",
          "on the right side", "in a corner")
RELATIONS = ("to the left of", "to the right of", "above", "below", "next to", "far away from")
SIZES = ("small", "large", "medium sized")


def _pick(rng: np.random.Generator, options) -> str:
    return str(options[int(rng.integers(len(options)))])


def _thing(rng: np.random.Generator) -> str:
    return f"{_pick(rng, SIZES)} {_pick(rng, list(COLOURS))} {_pick(rng, CLASS_NAMES)}"


def _clause(rng: np.random.Generator) -> str:
    kind = rng.integers(5)
    if kind == 0:
        return f"a {_thing(rng)} sits {_pick(rng, PLACES)}, {_pick(rng, RELATIONS)} a {_thing(rng)}"
    if kind == 1:
        shape = _pick(rng, CLASS_NAMES)
        return f"every {shape} has {CORNERS[shape]}, which is how one tells it apart from a {_pick(rng, CLASS_NAMES)}"
    if kind == 2:
        n = int(rng.integers(2, 6))
        return (f"{NUMBER_WORDS[n]} {_pick(rng, list(COLOURS))} {PLURALS[_pick(rng, CLASS_NAMES)]} are scattered "
                f"over a background that is never as bright as the shapes themselves")
    if kind == 3:
        return (f"someone asked which shape was {_pick(rng, RELATIONS)} the {_pick(rng, list(COLOURS))} one, "
                f"and the answer was a {_thing(rng)}")
    return (f"the {_pick(rng, list(COLOURS))} paint of the {_pick(rng, CLASS_NAMES)} stands out against "
            f"the {_pick(rng, ('striped', 'checkered', 'noisy', 'shaded'))} background")


def corpus_sentences(rng: np.random.Generator, count: int) -> list[str]:
    """`count` sentences of three to four clauses each (roughly 30 to 60 words)."""
    connectors = ("; meanwhile", ", and", ", while", ", although", "; later")
    sentences = []
    for _ in range(count):
        clauses = [_clause(rng) for _ in range(int(rng.integers(3, 5)))]
        text = clauses[0]
        for clause in clauses[1:]:
            text += f"{_pick(rng, connectors)} {clause}"
        sentences.append(text[0].upper() + text[1:] + ".")
    return sentences
