"""The analyses' results in words. Does any head beat the most confident RoI? The held-out best head
(chosen on half the phrases or arcs, scored on the other half: the maximum of layers × heads estimates
is biased upwards, so only a head chosen on other items may claim it) against the baseline on the same
items, paired, in words that name the outcome either way. The entity analysis (`grounding`) and the
syntactic one (`syntax`, one comparison per relation) both say it so; the step's log, the syntax table
and the pipeline's report read these sentences. And does the image help a pre-trained model predict
masked words (`words`)?"""

from __future__ import annotations

from train.analysis.grounding_results import AgainstConfidence, HeldOutBest
from train.analysis.word_results import WordsResult
from train.evaluation.statistics import Comparison, Interval

CONFIDENT = "the most confident RoI"

# The outcome of a paired comparison head − baseline, by where its 95% interval lies.
BEATS, NOT_DISTINGUISHABLE, WORSE = "beats", "not distinguishable", "worse"


def outcome(comparison: Comparison) -> str:
    if comparison.interval.low > 0:
        return BEATS
    return WORSE if comparison.interval.high < 0 else NOT_DISTINGUISHABLE


def _signed(value: float) -> str:
    return f"{value:+.3f}".replace("-", "−")


def held_out_sentence(layer: int, head: int, unit: str, comparison: Comparison) -> str:
    """E.g. "the best head (layer 2, head 3, chosen on half the phrases) does not beat the most
    confident RoI on the other half; it is worse: −0.098 [−0.140, −0.050]"."""
    found = outcome(comparison)
    said = {BEATS: "beats {}", NOT_DISTINGUISHABLE: "does not beat {} (no difference distinguishable from zero)",
            WORSE: "does not beat {}; it is worse"}[found].format(f"{CONFIDENT} on the other half")
    interval = comparison.interval
    return (f"the best head (layer {layer}, head {head}, chosen on half the {unit}) {said}: "
            f"{_signed(comparison.difference)} [{_signed(interval.low)}, {_signed(interval.high)}]")


def rounded_interval(interval: Interval) -> list[float]:
    return [round(value, 4) + 0.0 for value in interval.to_list()]  # + 0.0: no "-0.0" in the tables


def against(comparison: Comparison, layer: int, head: int, unit: str) -> AgainstConfidence:
    """The held-out head's paired comparison with the most confident RoI (layers and heads from 1)."""
    return AgainstConfidence(round(comparison.difference, 4) + 0.0, rounded_interval(comparison.interval),
                             comparison.p_value, outcome(comparison), held_out_sentence(layer, head, unit, comparison))


def grounding_verdicts(held_out: HeldOutBest | None) -> list[str]:
    """The entity analysis's verdict (grounding.json's held-out best head), or none where it has no
    held-out head (or was written before the comparison with the most confident RoI)."""
    side = held_out and held_out.against_confidence
    return [side.verdict] if side else []


def syntax_verdicts(held_out: dict[str, HeldOutBest | None]) -> list[str]:
    """The syntactic analysis's verdicts (syntax.json, each relation's held-out best head, the most
    common relation first): how many relations' held-out head beats the most confident RoI, then each
    relation's sentence."""
    compared = [(relation, side) for relation, head in held_out.items() if (side := head and head.against_confidence)]
    if not compared:
        return []
    counts = {found: sum(side.outcome == found for _, side in compared) for found in (BEATS, WORSE)}
    winners = [relation for relation, side in compared if side.outcome == BEATS]
    summary = (f"the held-out best head beats {CONFIDENT} in {counts[BEATS]} of {len(compared)} relations"
               + (f" ({', '.join(winners)})" if winners else "")
               + f"; it is worse in {counts[WORSE]}, not distinguishable in "
                 f"{len(compared) - counts[BEATS] - counts[WORSE]}")
    return [summary] + [f"{relation}: {side.verdict}" for relation, side in compared]


def words_verdicts(result: WordsResult) -> list[str]:
    """The masked-word analysis (words.json): a line for all the masked words, then one per group, the
    accuracy beside the own image and beside another, and their difference in words either way."""
    lines = []
    named = [("all words", result.figures), *((name, group.figures) for name, group in result.groups.items())]
    for name, figures in named:
        if not figures.masked_words:
            lines.append(f"{name}: no masked word")
            continue
        line = (f"{name}: {figures.masked_words} masked, right beside the own image {figures.own_image:.3f}, "
                f"beside another image {figures.another_image:.3f}")
        if figures.interval is not None:
            low, high = figures.interval
            said = "the image helps" if low > 0 else "the image hurts" if high < 0 else \
                "no difference distinguishable from zero"
            line += f"; own − another {figures.difference:+.3f} [{low:+.3f}, {high:+.3f}]: {said}"
        lines.append(line)
    return lines
