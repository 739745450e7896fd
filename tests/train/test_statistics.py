"""Bootstrap intervals, seed spreads and paired comparisons against hand-computed cases, and the report
built from run folders' item scores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipelines.report.summary import run_folders, write_report
from train.data.files import DataError
from train.engine.run_folder import RunFolder
from train.evaluation import statistics
from train.evaluation.statistics import (Interval, average_over_seeds, bootstrap_interval, paired_comparison,
                                         resampled_means, seed_spread)


def scores(values) -> dict[str, float]:
    return {f"q{i}": float(v) for i, v in enumerate(values)}


def test_the_interval_of_a_constant_is_that_constant():
    interval = bootstrap_interval([0.7] * 50)
    assert interval.low == pytest.approx(0.7, abs=1e-12) and interval.high == pytest.approx(0.7, abs=1e-12)


def test_a_bernoulli_interval_agrees_with_the_normal_approximation():
    sample = [1.0] * 120 + [0.0] * 280  # p̂ = 0.3, n = 400
    half = 1.96 * math.sqrt(0.3 * 0.7 / 400)  # 0.0449
    interval = bootstrap_interval(sample)
    assert interval.low == pytest.approx(0.3 - half, abs=0.006)
    assert interval.high == pytest.approx(0.3 + half, abs=0.006)


def test_bernoulli_intervals_cover_the_true_mean_about_95_percent_of_the_time():
    generator = np.random.default_rng(1)
    samples = generator.random((200, 100)) < 0.3
    covered = [bootstrap_interval(sample, resamples=2000, seed=i).contains(0.3) for i, sample in enumerate(samples)]
    assert 0.88 <= np.mean(covered) <= 0.99  # loose: the percentile interval runs a little short at n = 100


def test_resampling_is_seeded_and_chunked_without_changing_the_draws(monkeypatch):
    monkeypatch.setattr(statistics, "_DRAWN", {})
    means = resampled_means(np.arange(100), resamples=1234, seed=3)
    monkeypatch.setattr(statistics, "_DRAWN", {})
    monkeypatch.setattr(statistics, "CHUNK_ELEMENTS", 1000)  # 10 resamples of 100 items at a time
    chunked = resampled_means(np.arange(100), resamples=1234, seed=3)
    assert means.shape == (1234,) and chunked is not means and np.array_equal(means, chunked)
    assert 40 < means.mean() < 59  # the mean of 0..99 is 49.5
    assert not np.array_equal(means, resampled_means(np.arange(100), resamples=1234, seed=4))


def test_the_same_scores_are_resampled_once_and_the_latest_draws_kept(monkeypatch):
    monkeypatch.setattr(statistics, "_DRAWN", {})
    monkeypatch.setattr(statistics, "KEPT_DRAWS", 2)
    scores_a = np.random.default_rng(0).random(50)
    first = resampled_means(scores_a, resamples=200)
    assert resampled_means(list(scores_a), resamples=200) is first and not first.flags.writeable
    with pytest.raises(ValueError):
        first[0] = 0.0  # a caller cannot change what the next one reads
    assert resampled_means(scores_a + 1e-9, resamples=200) is not first  # other scores, other draws
    resampled_means(scores_a, resamples=300)
    again = resampled_means(scores_a, resamples=200)  # the oldest was let go: drawn anew, equal
    assert again is not first and np.array_equal(again, first) and len(statistics._DRAWN) == 2


def test_identical_runs_are_not_distinguishable():
    a = scores(np.random.default_rng(0).random(100))
    comparison = paired_comparison(a, dict(a), ("frozen", "tuned"))
    assert comparison.difference == 0 and comparison.interval == Interval(0.0, 0.0) and comparison.p_value == 1.0
    assert comparison.verdict() == "not distinguishable from zero: the interval [0.000, 0.000] contains 0"


def test_a_fixed_shift_is_distinguishable():
    a = scores(np.random.default_rng(0).random(100) * 0.8)
    comparison = paired_comparison(a, {item: value + 0.1 for item, value in a.items()}, ("a", "b"))
    assert comparison.difference == pytest.approx(0.1)
    assert comparison.interval.low == pytest.approx(0.1) and comparison.interval.high == pytest.approx(0.1)
    assert comparison.p_value == 0 and comparison.p_text() == "< 1e-04"
    assert comparison.verdict() == "b scores above a at 95%: the interval lies above 0"
    lower = paired_comparison(a, {item: value - 0.1 for item, value in a.items()}, ("frozen", "tuned"))
    assert lower.verdict() == "tuned scores below frozen at 95%: the interval lies below 0"


def test_right_on_60_more_of_100_items():
    a = scores([1] * 20 + [0] * 80)
    b = scores([1] * 80 + [0] * 20)  # right on a's 20 and on 60 more
    comparison = paired_comparison(a, b)
    half = 1.96 * math.sqrt(0.6 * 0.4 / 100)  # the differences are 60 ones and 40 zeros
    assert comparison.difference == pytest.approx(0.6) and comparison.items == 100
    assert comparison.interval.low == pytest.approx(0.6 - half, abs=0.02)
    assert comparison.interval.high == pytest.approx(0.6 + half, abs=0.02)
    assert comparison.p_value == 0 and comparison.distinguishable


def test_a_small_mixed_difference_is_not_distinguishable_and_p_matches_the_normal_approximation():
    a = scores([1] * 4 + [0] * 6 + [1] * 45 + [0] * 45)
    b = scores([0] * 4 + [1] * 6 + [1] * 45 + [0] * 45)  # better on 6 items, worse on 4
    comparison = paired_comparison(a, b)
    standard_error = math.sqrt((10 / 100 - 0.02 ** 2) / 100)
    normal_p = math.erfc(0.02 / standard_error / math.sqrt(2))  # two-sided, 0.53
    assert comparison.difference == pytest.approx(0.02)
    assert comparison.p_value == pytest.approx(normal_p, abs=0.1) and not comparison.distinguishable
    low, high = comparison.interval.low, comparison.interval.high
    assert comparison.verdict() == f"not distinguishable from zero: the interval [{low:.3f}, {high:.3f}] contains 0"


def test_the_p_value_and_the_interval_agree():
    generator = np.random.default_rng(7)
    for shift in np.linspace(0, 0.3, 13):
        a = scores(generator.random(60) < 0.5)
        b = {item: float(value or generator.random() < shift) for item, value in a.items()}
        comparison = paired_comparison(a, b, resamples=4000)
        if abs(comparison.p_value - 0.05) > 0.01:  # near the boundary the quantile's interpolation decides
            assert (comparison.p_value < 0.05) == comparison.distinguishable


def test_only_shared_items_are_paired_and_runs_without_any_are_named():
    comparison = paired_comparison({"x": 0.0, "y": 1.0, "z": 0.0}, {"y": 1.0, "z": 1.0, "w": 0.0})
    assert comparison.items == 2 and comparison.difference == pytest.approx(0.5)
    with pytest.raises(DataError, match="runs vqa-frozen and refexp-tuned share no evaluation item"):
        paired_comparison({"x": 1.0}, {"y": 1.0}, ("vqa-frozen", "refexp-tuned"))


def test_seed_spread_and_items_averaged_over_seeds():
    spread = seed_spread([0.5, 0.6, 0.7])
    assert spread.mean == pytest.approx(0.6) and spread.std == pytest.approx(0.1) and spread.values == (0.5, 0.6, 0.7)
    assert seed_spread([0.4]).std is None
    assert average_over_seeds([{"a": 1.0, "b": 0.0, "c": 1.0}, {"a": 0.0, "b": 0.0}]) == {"a": 0.5, "b": 0.0}


# ---- the report, from run folders ----------------------------------------------------------------

def fake_run(folder: Path, items: dict[str, float], seed: int = 0, groups: dict[str, str] | None = None) -> Path:
    """A finished one-stage VQA run folder as the trainer leaves it, evaluated on val.jsonl; with each
    item's answer type where `groups` gives them."""
    run = RunFolder(folder)
    stage = run.stage(0, "vqa")
    stage.item_scores("val").parent.mkdir(parents=True)
    run.write_config({"stages": [{"name": "vqa"}], "eval_annotations": "/w/val.jsonl", "seed": seed})
    value = sum(items.values()) / len(items)
    stage.write_evaluation({"stage": "vqa", "task": "vqa", "metric": "vqa_accuracy",
                                                 "value": value, "chance": 0.25, "visual": "cached",
                            "wall_s": 2.0, "samples_per_s": 10.0})
    grouped = {"groups": {"name": "answer type", "items": groups}} if groups is not None else {}
    stage.item_scores("val").write_text(json.dumps({"metric": "vqa_accuracy", "items": items, **grouped}))
    run.metrics_file.write_text("".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in (1, 2, 3)))
    return folder


def test_report_gives_seed_spreads_item_intervals_and_comparisons(tmp_path):
    frozen = fake_run(tmp_path / "vqa-frozen", scores([1] * 20 + [0] * 80))
    tuned = tmp_path / "vqa-tuned"
    seeds = [RunFolder(tuned).seed_run(seed) for seed in (0, 1)]
    fake_run(seeds[0].root, scores([1] * 80 + [0] * 20), seed=0)
    fake_run(seeds[1].root, scores([1] * 70 + [0] * 30), seed=1)
    assert run_folders(tuned) == seeds and run_folders(frozen) == [RunFolder(frozen)]

    write_report([str(frozen), str(tuned)], tmp_path / "report", [(str(frozen), str(tuned))], resamples=2000)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    first, second = report["runs"]
    assert first["value"] == pytest.approx(0.2) and first["std"] is None and first["seeds"] is None
    assert second["seeds"] == [0, 1] and second["seed_values"] == pytest.approx([0.8, 0.7])
    assert second["value"] == pytest.approx(0.75) and second["std"] == pytest.approx(math.sqrt(0.005))
    # items averaged over seeds: 70 at 1, 10 at 0.5, 20 at 0 → mean 0.75
    assert second["items"] == 100 and second["interval"][0] < 0.75 < second["interval"][1]
    assert first["interval"][0] == pytest.approx(0.2 - 1.96 * math.sqrt(0.16 / 100), abs=0.02)
    (comparison,) = report["comparisons"]
    assert (comparison["a"], comparison["b"], comparison["items"]) == ("vqa-frozen", "vqa-tuned", 100)
    assert comparison["difference"] == pytest.approx(0.55) and comparison["p_value"] == 0
    assert comparison["verdict"] == "vqa-tuned scores above vqa-frozen at 95%: the interval lies above 0"
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| vqa-tuned | frozen | vqa | vqa_accuracy | 0.750 ± 0.071 (2 seeds) | [" in text
    assert "| vqa-frozen | vqa-tuned | 100 | +0.550 | [" in text
    assert "| vqa-tuned scores above vqa-frozen at 95%: the interval lies above 0 |" in text
    assert (tmp_path / "report" / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_report_names_runs_it_cannot_compare(tmp_path):
    old = fake_run(tmp_path / "old", scores([1, 0]))
    RunFolder(old).stage(0, "vqa").item_scores("val").unlink()  # trained before item scores existed
    new = fake_run(tmp_path / "new", scores([1, 1]))
    report = write_report([str(old), str(new)], tmp_path / "report")  # rows without an interval are fine
    assert json.loads(report[0].read_text())["runs"][0]["interval"] is None
    with pytest.raises(DataError, match=f"{old}: no item scores to compare"):
        write_report([str(old), str(new)], tmp_path / "report", [(str(old), str(new))])
    with pytest.raises(DataError, match=f"{tmp_path / 'nothing'}: not a training run"):
        write_report([str(tmp_path / "nothing")], tmp_path / "report")


def test_report_compares_the_runs_within_each_answer_type(tmp_path):
    generator = np.random.default_rng(5)
    types = {f"q{i}": kind for i, kind in enumerate(["shape"] * 30 + ["colour"] * 40 + ["count"] * 29)}  # q99: none
    a = scores(generator.random(100) < 0.4)
    frozen = fake_run(tmp_path / "vqa-frozen", a, groups=types)
    tuned = tmp_path / "vqa-tuned"
    seeds = [{item: float(value or (types.get(item) == "colour" and generator.random() < 0.6)) for item, value in
              a.items()} for _ in range(2)]  # colour questions lifted, the others as in A
    for seed, items in enumerate(seeds):
        fake_run(RunFolder(tuned).seed_run(seed).root, items, seed=seed, groups=types)

    write_report([str(frozen), str(tuned)], tmp_path / "report", [(str(frozen), str(tuned))], resamples=2000)
    (comparison,) = json.loads((tmp_path / "report" / "report.json").read_text())["comparisons"]
    by_group = comparison["by_group"]
    assert by_group["name"] == "answer type"
    assert [group["group"] for group in by_group["groups"]] == ["colour", "count", "shape"]
    for group in by_group["groups"]:
        members = [item for item, kind in types.items() if kind == group["group"]]
        by_hand = np.mean([(seeds[0][item] + seeds[1][item]) / 2 - a[item] for item in members])
        assert group["items"] == len(members) and group["difference"] == pytest.approx(by_hand)
        alone = paired_comparison({item: a[item] for item in members},
                                  {item: (seeds[0][item] + seeds[1][item]) / 2 for item in members},
                                  ("vqa-frozen", "vqa-tuned"), resamples=2000)
        assert (group["interval"], group["p_value"], group["verdict"]) == (alone.interval.to_list(), alone.p_value,
                                                                           alone.verdict())
    colour, count, _ = by_group["groups"]
    assert colour["difference"] > 0.1 and colour["verdict"].startswith("vqa-tuned scores above vqa-frozen")
    assert count["difference"] == 0 and count["interval"] == [0.0, 0.0]
    text = (tmp_path / "report" / "report.md").read_text()
    table = text[text.index("## Comparisons by answer type"):]
    assert table.startswith("## Comparisons by answer type\n\n| A | B | answer type | items | B − A |")
    rows = [line for line in table.splitlines() if line.startswith("| vqa-frozen | vqa-tuned |")]
    assert [row.split(" | ")[2:4] for row in rows] == [["colour", "40"], ["count", "29"], ["shape", "30"]]
    assert rows[0].startswith(f"| vqa-frozen | vqa-tuned | colour | 40 | {colour['difference']:+.3f} | [")
    assert "not corrected for multiple\ncomparisons" in table


def test_report_has_no_comparisons_by_group_when_a_run_has_no_groups(tmp_path):
    types = {"q0": "colour", "q1": "count", "q2": "colour"}
    grouped = fake_run(tmp_path / "grouped", scores([1, 0, 0]), groups=types)
    older = fake_run(tmp_path / "older", scores([1, 1, 1]))  # written before item scores carried groups
    other = fake_run(tmp_path / "other", scores([0, 1, 1]), groups=types)
    pairs = [(str(grouped), str(older)), (str(grouped), str(other))]
    write_report([str(grouped), str(older), str(other)], tmp_path / "report", pairs, resamples=200)
    first, second = json.loads((tmp_path / "report" / "report.json").read_text())["comparisons"]
    assert "by_group" not in first and [g["group"] for g in second["by_group"]["groups"]] == ["colour", "count"]
    text = (tmp_path / "report" / "report.md").read_text()
    assert text.count("| grouped | other | ") == 3 and "| grouped | older | " in text  # whole split + 2 groups
    write_report([str(grouped), str(older)], tmp_path / "alone", pairs[:1], resamples=200)
    assert "by answer type" not in (tmp_path / "alone" / "report.md").read_text()
