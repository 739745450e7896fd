"""Text about a scene: captions, VQA items and referring expressions, all true of its pixels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.world.scene import Scene, SceneObject
from pipelines.world.vocabulary import CLASS_NAMES, COLOURS, NAMED_SIZES, NUMBER_WORDS, PLURALS

ANSWER_TYPES = ("colour", "shape", "count", "position")
# Centres must be this far apart along an axis before one object is "left of" or "above" another.
POSITION_MARGIN = 10.0
BACKGROUND_WORDS = {"noise": "noisy", "stripes": "striped", "checks": "checkered", "gradient": "shaded"}


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    answer_type: str


@dataclass(frozen=True)
class ReferringExpression:
    text: str
    target: int  # index into the scene's objects


def object_name(obj: SceneObject, with_size: bool = True) -> str:
    size = f"{obj.size} " if with_size and obj.size in NAMED_SIZES else ""
    return f"{size}{obj.colour} {obj.shape}"


def with_article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def spatial_relation(a: SceneObject, b: SceneObject) -> str | None:
    """How `a` lies relative to `b`, along the axis where they are clearly apart (x first)."""
    dx, dy = a.centre[0] - b.centre[0], a.centre[1] - b.centre[1]
    if abs(dx) >= POSITION_MARGIN:
        return "to the left of" if dx < 0 else "to the right of"
    if abs(dy) >= POSITION_MARGIN:
        return "above" if dy < 0 else "below"
    return None


def _unique_names(scene: Scene) -> dict[int, str]:
    """Objects that "the <colour> <shape>" picks out alone, with that phrase."""
    names = [object_name(o, with_size=False) for o in scene.objects]
    return {i: n for i, n in enumerate(names) if names.count(n) == 1}


def captions(scene: Scene, rng: np.random.Generator) -> list[str]:
    objs = scene.objects
    listed = _join([with_article(object_name(o)) for o in objs])
    result = [f"{listed} on a {BACKGROUND_WORDS[scene.background]} background."]
    count = len(objs)
    result.append(f"there {'is' if count == 1 else 'are'} {NUMBER_WORDS[count]} "
                  f"{'shape' if count == 1 else 'shapes'} in the picture.")
    pairs = [(i, j) for i in range(count) for j in range(count) if i != j and spatial_relation(objs[i], objs[j])]
    if pairs:
        i, j = pairs[int(rng.integers(len(pairs)))]
        first, second = (with_article(object_name(obj)) for obj in (objs[i], objs[j]))
        result.append(f"{first} {spatial_relation(objs[i], objs[j])} {second}.")
    else:
        result.append(f"a picture with {with_article(object_name(objs[0]))} and nothing else.")
    return result


def _colour_questions(scene: Scene) -> list[Question]:
    shapes = [o.shape for o in scene.objects]
    return [Question(f"what colour is the {o.shape}?", o.colour, "colour")
            for o in scene.objects if shapes.count(o.shape) == 1]


def _shape_questions(scene: Scene) -> list[Question]:
    colours = [o.colour for o in scene.objects]
    return [Question(f"what shape is the {o.colour} object?", o.shape, "shape")
            for o in scene.objects if colours.count(o.colour) == 1]


def _count_question(scene: Scene, rng: np.random.Generator) -> Question:
    kind = rng.integers(3)
    if kind == 0:
        return Question("how many shapes are there?", str(len(scene.objects)), "count")
    # Mostly ask about what is there, sometimes about what is not (answer 0), so no answer dominates.
    present = rng.random() < 0.75
    if kind == 1:
        pool = sorted({o.shape for o in scene.objects}) if present else list(CLASS_NAMES)
        shape = str(rng.choice(pool))
        answer = sum(o.shape == shape for o in scene.objects)
        return Question(f"how many {PLURALS[shape]} are there?", str(answer), "count")
    pool = sorted({o.colour for o in scene.objects}) if present else list(COLOURS)
    colour = str(rng.choice(pool))
    answer = sum(o.colour == colour for o in scene.objects)
    return Question(f"how many {colour} objects are there?", str(answer), "count")


_OPPOSITE = {"to the left of": "to the right of", "to the right of": "to the left of", "above": "below",
             "below": "above"}


def _position_questions(scene: Scene, rng: np.random.Generator) -> list[Question]:
    names = _unique_names(scene)
    questions = []
    for i in names:
        for j in names:
            relation = spatial_relation(scene.objects[i], scene.objects[j]) if i != j else None
            if relation is None:
                continue
            truthful = rng.random() < 0.5
            asked = relation if truthful else _OPPOSITE[relation]
            questions.append(Question(f"is the {names[i]} {asked} the {names[j]}?", "yes" if truthful else "no",
                                      "position"))
    return questions


def questions(scene: Scene, rng: np.random.Generator, count: int) -> list[Question]:
    """Up to `count` distinct questions, answer types taken in turn so each type is about as common."""
    pools = {"colour": _colour_questions(scene), "shape": _shape_questions(scene),
             "position": _position_questions(scene, rng)}
    chosen: list[Question] = []
    start = int(rng.integers(len(ANSWER_TYPES)))
    for step in range(4 * count):
        if len(chosen) == count:
            break
        kind = ANSWER_TYPES[(start + step) % len(ANSWER_TYPES)]
        if kind == "count":
            candidate = _count_question(scene, rng)
        elif pools[kind]:
            candidate = pools[kind].pop(int(rng.integers(len(pools[kind]))))
        else:
            continue
        if all(candidate.question != q.question for q in chosen):
            chosen.append(candidate)
    return chosen


def referring_expressions(scene: Scene, rng: np.random.Generator) -> list[ReferringExpression]:
    """One expression per object that a description or a position picks out alone."""
    objs = scene.objects
    names = _unique_names(scene)
    shapes = [o.shape for o in objs]
    result = []
    for i, obj in enumerate(objs):
        if shapes.count(obj.shape) == 1 and rng.random() < 0.5:
            text = f"the {obj.shape}"
        elif i in names:
            text = f"the {object_name(obj)}"
        else:
            # Identical twins: tell them apart by which is leftmost or rightmost, when clearly so.
            twins = [o for o in objs if object_name(o, with_size=False) == object_name(obj, with_size=False)]
            xs = sorted(o.centre[0] for o in twins)
            if obj.centre[0] == xs[0] and xs[1] - xs[0] >= POSITION_MARGIN:
                text = f"the leftmost {object_name(obj, with_size=False)}"
            elif obj.centre[0] == xs[-1] and xs[-1] - xs[-2] >= POSITION_MARGIN:
                text = f"the rightmost {object_name(obj, with_size=False)}"
            else:
                continue
        result.append(ReferringExpression(text, i))
    return result
