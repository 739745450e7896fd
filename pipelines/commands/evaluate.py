"""`vlbert evaluate BENCHMARK`: a predictions file scored as the benchmark's own tool scores it;
one JSON object on stdout and nothing else."""

import json
from pathlib import Path

import click

from train.data.sources.refer import DATASETS as REFER_DATASETS
from train.evaluation.refer import evaluate_refer
from train.evaluation.vcr import evaluate_vcr
from train.evaluation.vqa2 import evaluate_vqa2

_file = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group("evaluate")
def evaluate_group() -> None:
    """Score predictions with the benchmarks' official metrics (percentages, 2 decimals)."""


@evaluate_group.command("vqa2")
@click.option("--questions", required=True, type=_file, help="v2_OpenEnded_mscoco_<split>_questions.json")
@click.option("--annotations", required=True, type=_file, help="v2_mscoco_<split>_annotations.json")
@click.option("--predictions", required=True, type=_file, help='[{"question_id": int, "answer": str}]')
def vqa2_command(questions: Path, annotations: Path, predictions: Path) -> None:
    """{"overall", "perAnswerType", "perQuestionType"}, as the official VQA evaluation."""
    click.echo(json.dumps(evaluate_vqa2(questions, annotations, predictions)))


@evaluate_group.command("vcr")
@click.option("--annotations", required=True, type=_file, help="val.jsonl as published")
@click.option("--predictions", required=True, type=_file, multiple=True,
              help="The leaderboard CSV; or the Q→A and QA→R runs' files, given twice, merged by annot_id.")
def vcr_command(annotations: Path, predictions: tuple[Path, ...]) -> None:
    """{"q2a", "qa2r", "q2ar"}: Q→AR counts an annotation right when its answer and the rationale
    chosen given that answer are both right."""
    click.echo(json.dumps(evaluate_vcr(annotations, list(predictions))))


def _refer_command(dataset: str) -> click.Command:
    @click.command(dataset)
    @click.option("--data", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
                  help="The refer toolkit's DATA folder.")
    @click.option("--split", required=True, help="A split of the refs file (val, testA, testB, test).")
    @click.option("--split-by", help="The refs file's split provider (default: unc; refcocog: umd).")
    @click.option("--predictions", required=True, type=_file, help='[{"sent_id": int, "box": [x1, y1, x2, y2]}]')
    def command(data: Path, split: str, split_by: str | None, predictions: Path) -> None:
        """{"accuracy", "count"}: the share of expressions whose box has IoU ≥ 0.5 with the referred object's."""
        click.echo(json.dumps(evaluate_refer(data, dataset, split, predictions, split_by)))
    return command


for _dataset in REFER_DATASETS:
    evaluate_group.add_command(_refer_command(_dataset))


@evaluate_group.command("snli-ve")
@click.option("--annotations", required=True, type=_file, help="snli_ve_<split>.jsonl as published")
@click.option("--predictions", required=True, type=_file, help='[{"pair_id": str, "label": str}]')
def snli_ve_command(annotations: Path, predictions: Path) -> None:
    """{"accuracy", "count", "per_label"}: the share of pairs given their gold label."""
    from train.evaluation.snli_ve import evaluate_snli_ve

    click.echo(json.dumps(evaluate_snli_ve(annotations, predictions)))


COMMANDS = [evaluate_group]
