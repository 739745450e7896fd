"""Uncertainty of evaluation results: bootstrap intervals over items, spread over seeds, and paired
comparisons of two runs on the same items.

Items are resampled with replacement (percentile bootstrap, B = 10,000 by default, a seeded NumPy
generator, so a report is reproducible). When a run trained several seeds, each item's score is first
averaged over the seeds: the item intervals then describe how the result would move on other
evaluation items, while the per-seed values (mean ± sample standard deviation) describe how it moves
with the seed.

The p-value of a paired comparison is the share of resampled mean differences on the other side of
zero from the observed one, doubled (two-sided), capped at 1. It is chosen over the shift-to-null
method of Berg-Kirkpatrick et al. (2012) because it is the exact dual of the percentile interval
reported next to it: p < 0.05 exactly when the 95% interval leaves 0 out (up to the quantile's
interpolation), so the number and the verdict in words never contradict each other. With B
resamples, p = 0 reads "p < 1/B".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from train.data.files import DataError

RESAMPLES = 10_000
LEVEL = 0.95
# Resampled indices held at once: B × n integers would not fit for large evaluation splits.
CHUNK_ELEMENTS = 4_000_000
# A report resamples the same scores several times (a stage's row and its run's, report.md and report.html):
# the latest draws are kept, by the scores' bytes, the resamples and the seed. 64 × B means: 5 MB.
KEPT_DRAWS = 64
_DRAWN: dict[tuple, np.ndarray] = {}


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_list(self) -> list[float]:
        return [self.low, self.high]


@dataclass(frozen=True)
class SeedSpread:
    """A run's value over its seeds: their mean and sample standard deviation (None for one seed)."""

    mean: float
    std: float | None
    values: tuple[float, ...]


@dataclass(frozen=True)
class Comparison:
    """Run `b` against run `a` on the items both evaluated: the mean of b − a per item."""

    a: str
    b: str
    items: int
    difference: float
    interval: Interval
    p_value: float
    resamples: int

    @property
    def distinguishable(self) -> bool:
        return not self.interval.contains(0.0)

    def verdict(self) -> str:
        """In words, with its direction: a difference that leaves 0 out says which run scores higher."""
        if self.distinguishable:
            side = "above" if self.interval.low > 0 else "below"
            return f"{self.b} scores {side} {self.a} at {LEVEL:.0%}: the interval lies {side} 0"
        return (f"not distinguishable from zero: the interval [{self.interval.low:.3f}, "
                f"{self.interval.high:.3f}] contains 0")

    def p_text(self) -> str:
        return f"< {1 / self.resamples:.0e}" if self.p_value == 0 else f"{self.p_value:.3f}"


def seed_spread(values: Sequence[float]) -> SeedSpread:
    array = np.asarray(values, dtype=float)
    std = float(array.std(ddof=1)) if len(array) > 1 else None
    return SeedSpread(float(array.mean()), std, tuple(float(v) for v in array))


def resampled_means(scores: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """The means of `resamples` samples of `scores` drawn with replacement, each as large as `scores`
    (read-only: the same scores, resamples and seed give the same array again, drawn once)."""
    array = np.asarray(scores, dtype=float)
    if array.size == 0:
        raise ValueError("no scores to resample")
    key = (hashlib.blake2b(array.tobytes(), digest_size=16).digest(), array.size, resamples, seed)
    if key not in _DRAWN:
        _DRAWN[key] = _draw_means(array, resamples, seed)
        while len(_DRAWN) > KEPT_DRAWS:
            del _DRAWN[next(iter(_DRAWN))]
    return _DRAWN[key]


def _draw_means(array: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    generator = np.random.default_rng(seed)
    rows = max(1, CHUNK_ELEMENTS // array.size)
    means = np.concatenate([array[generator.integers(0, array.size, size=(min(rows, resamples - start), array.size))]
                            .mean(axis=1) for start in range(0, resamples, rows)])
    means.flags.writeable = False
    return means


def _percentile_interval(means: np.ndarray) -> Interval:
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(low), float(high))


def bootstrap_interval(scores: Sequence[float] | np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """The 95% percentile-bootstrap interval of the mean of `scores` (one per evaluation item)."""
    return _percentile_interval(resampled_means(scores, resamples, seed))


def grouped_bootstrap_interval(groups: Sequence[Sequence[float] | np.ndarray], resamples: int = RESAMPLES,
                               seed: int = 0) -> Interval:
    """The 95% percentile-bootstrap interval of the mean of the groups' means, each group resampled
    within itself (a stratified bootstrap: COCO 1K retrieval's mean over 5 folds); one group: the
    plain `bootstrap_interval`."""
    means = [resampled_means(group, resamples, seed + index) for index, group in enumerate(groups)]
    return _percentile_interval(np.mean(means, axis=0))


def average_over_seeds(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each item's score averaged over the seeds' item scores, on the items every seed evaluated."""
    shared = set(runs[0]).intersection(*runs[1:])
    return {item: sum(run[item] for run in runs) / len(runs) for item in runs[0] if item in shared}


def paired_comparison(a: Mapping[str, float], b: Mapping[str, float], names: tuple[str, str] = ("a", "b"),
                      resamples: int = RESAMPLES, seed: int = 0) -> Comparison:
    """Paired bootstrap of b − a over the items both runs scored (item id → score); DataError naming
    both runs when they share no item."""
    shared = [item for item in a if item in b]
    if not shared:
        raise DataError(f"runs {names[0]} and {names[1]} share no evaluation item: they cannot be compared "
                        "(were they evaluated on the same split of the same task?)")
    differences = np.array([b[item] - a[item] for item in shared], dtype=float)
    means = resampled_means(differences, resamples, seed)
    other_side = min(np.mean(means <= 0), np.mean(means >= 0))
    return Comparison(names[0], names[1], len(shared), float(differences.mean()), _percentile_interval(means),
                      float(min(1.0, 2 * other_side)), resamples)
