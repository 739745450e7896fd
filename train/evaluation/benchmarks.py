"""The benchmarks that `vlbert evaluate BENCHMARK` and the pipeline's `evaluate` step score, one
record each: its inputs, and its scorer. Both the command's options and the step's parameters are
made from the record, so a benchmark is added here once.

The scorers import their metric modules when they run, so that listing the benchmarks (a command's
`--help`) stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from train.data.sources.refer import DATASETS as REFER_DATASETS

INPUT_KINDS = ("file", "folder", "text")


@dataclass(frozen=True)
class Input:
    """One input of a benchmark: `--NAME` on the command line, `NAME` in an evaluate step."""

    name: str
    kind: str  # one of INPUT_KINDS: an existing file, an existing folder, or a value
    help: str
    required: bool = True
    multiple: bool = False  # a list of files (given more than once on the command line)


# What a scorer is given: each input's value (a Path for a file or folder, a list of them when
# `multiple`, None for an optional one not given), and a folder for what it merged (None: keep nothing).
Scorer = Callable[[Mapping[str, Any], "Path | None"], dict[str, Any]]


@dataclass(frozen=True)
class Benchmark:
    name: str
    about: str  # the command's help: what the scores are
    inputs: tuple[Input, ...]
    score: Scorer


def _score_vqa2(values: Mapping[str, Any], keep: Path | None) -> dict[str, Any]:
    from train.evaluation.vqa2 import evaluate_vqa2

    return evaluate_vqa2(values["questions"], values["annotations"], values["predictions"])


def _score_vcr(values: Mapping[str, Any], keep: Path | None) -> dict[str, Any]:
    from train.evaluation.vcr import evaluate_vcr, merge_vcr_predictions, write_vcr_csv

    predictions = values["predictions"]
    if keep is not None:  # the merged runs as the leaderboard's CSV, beside the scores
        write_vcr_csv(keep / "predictions.csv", merge_vcr_predictions(predictions))
        predictions = keep / "predictions.csv"
    return evaluate_vcr(values["annotations"], predictions)


def _refer_scorer(dataset: str) -> Scorer:
    def score(values: Mapping[str, Any], keep: Path | None) -> dict[str, Any]:
        from train.evaluation.refer import evaluate_refer

        return evaluate_refer(values["data"], dataset, values["split"], values["predictions"], values["split_by"])
    return score


def _score_snli_ve(values: Mapping[str, Any], keep: Path | None) -> dict[str, Any]:
    from train.evaluation.snli_ve import evaluate_snli_ve

    return evaluate_snli_ve(values["annotations"], values["predictions"])


def _score_nlvr2(values: Mapping[str, Any], keep: Path | None) -> dict[str, Any]:
    from train.evaluation.nlvr2 import evaluate_nlvr2

    return evaluate_nlvr2(values["annotations"], values["predictions"])


def _refer(dataset: str) -> Benchmark:
    return Benchmark(dataset, "{\"accuracy\", \"count\"}: the share of expressions whose box has IoU ≥ 0.5 with the "
                              "referred object's.", (
        Input("data", "folder", "The refer toolkit's DATA folder."),
        Input("split", "text", "A split of the refs file (val, testA, testB, test)."),
        Input("split_by", "text", "The refs file's split provider (default: unc; refcocog: umd).", required=False),
        Input("predictions", "file", '[{"sent_id": int, "box": [x1, y1, x2, y2]}]'),
    ), _refer_scorer(dataset))


BENCHMARKS: dict[str, Benchmark] = {benchmark.name: benchmark for benchmark in (
    Benchmark("vqa2", '{"overall", "perAnswerType", "perQuestionType"}, as the official VQA evaluation.', (
        Input("questions", "file", "v2_OpenEnded_mscoco_<split>_questions.json"),
        Input("annotations", "file", "v2_mscoco_<split>_annotations.json"),
        Input("predictions", "file", '[{"question_id": int, "answer": str}]'),
    ), _score_vqa2),
    Benchmark("vcr", '{"q2a", "qa2r", "q2ar"}: Q→AR counts an annotation right when its answer and the rationale '
                     'chosen given that answer are both right.', (
        Input("annotations", "file", "val.jsonl as published"),
        Input("predictions", "file", "The leaderboard CSV; or the Q→A and QA→R runs' files, given twice, merged "
                                     "by annot_id.", multiple=True),
    ), _score_vcr),
    *(_refer(dataset) for dataset in REFER_DATASETS),
    Benchmark("snli-ve", '{"accuracy", "count", "per_label"}: the share of pairs given their gold label.', (
        Input("annotations", "file", "snli_ve_<split>.jsonl as published"),
        Input("predictions", "file", '[{"pair_id": str, "label": str}]'),
    ), _score_snli_ve),
    Benchmark("nlvr2", '{"accuracy", "consistency", "count", "statements"}: the share of statements given their '
                       'truth value, and of distinct statements (set, sentence) right on every image pair.', (
        Input("annotations", "file", "<split>.json as published (dev.json, test1.json)"),
        Input("predictions", "file", "The leaderboard's CSV: identifier,True|False per line"),
    ), _score_nlvr2),
)}
