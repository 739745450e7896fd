"""Training on several annotation files (corpora): one stage mixes them by their numbers of items,
and run.json records the mixture."""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.worlds import run_config
from train.data.annotations import AnnotationFile, MixedAnnotations
from train.engine.config import RunConfig, RunConfigError, StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer

PRETRAIN = StageConfig("pretrain", "pretrain", steps=2, batch_size=2, base_lr=5e-4)


def split_file(source: Path, first: Path, second: Path, lines: int) -> None:
    records = source.read_text().splitlines(keepends=True)
    first.write_text("".join(records[:lines]))
    second.write_text("".join(records[lines:]))


def captions(path: Path) -> list[tuple[int, int]]:
    """(line, position) of every caption, counted from the JSON itself."""
    return [(line, position) for line, text in enumerate(path.read_text().splitlines())
            for position in range(len(json.loads(text).get("captions", [])))]


def test_mixed_annotations_read_the_files_one_after_the_other(tiny_world, tmp_path: Path) -> None:
    first, second = tmp_path / "cc.jsonl", tmp_path / "sbu.jsonl"
    split_file(tiny_world / "world" / "train.jsonl", first, second, lines=3)
    mixed = MixedAnnotations([AnnotationFile(first), AnnotationFile(second)])

    ones, twos = captions(first), captions(second)
    assert len(mixed) == 3 + len(second.read_text().splitlines())
    assert mixed.items("captions").tolist() == [list(item) for item in ones] + [[3 + line, position]
                                                                               for line, position in twos]
    assert [annotation.file for annotation in mixed] == [json.loads(line)["file"] for path in (first, second)
                                                         for line in path.read_text().splitlines()]
    line, position = twos[-1]
    annotation, caption = mixed.item(np.array([3 + line, position]), "captions")
    assert caption == json.loads(second.read_text().splitlines()[line])["captions"][position]
    shares = {part["file"]: (part["items"]["captions"], part["share"]["captions"]) for part in mixed.mixture()}
    total = len(ones) + len(twos)
    assert shares == {str(first): (len(ones), round(len(ones) / total, 6)),
                      str(second): (len(twos), round(len(twos) / total, 6))}


def test_a_run_on_two_corpora_records_the_mixture_and_reruns_as_the_same_run(tiny_world_copy: Path) -> None:
    world = tiny_world_copy / "world"
    first, second = world / "cc.jsonl", world / "sbu.jsonl"
    split_file(world / "train.jsonl", first, second, lines=4)
    messages = []
    run = run_config(tiny_world_copy, "mixed", [PRETRAIN], train_annotations=[str(first), str(second)])

    Trainer(run, log=messages.append).fit()

    folder = RunFolder(tiny_world_copy / "mixed")
    ones, twos = len(captions(first)), len(captions(second))
    mixture = folder.mixture()
    assert [(part["file"], part["images"], part["items"]["captions"], part["share"]["captions"]) for part in mixture] \
        == [(str(first), 4, ones, round(ones / (ones + twos), 6)), (str(second), len(second.read_text().splitlines()),
                                                                    twos, round(twos / (ones + twos), 6))]
    assert folder.config()["train_annotations"] == [str(first), str(second)]
    assert any(message.startswith(f"training mixture: {first}: 4 images, {ones} captions ({ones / (ones + twos):.1%})")
               for message in messages)
    rerun = []
    Trainer(run, log=rerun.append).fit()  # the same config: nothing to train
    assert any("nothing to train" in message for message in rerun)


@pytest.mark.parametrize("value, problem", [
    ([], "expected an annotation file or a list of them, found"),
    (["a.jsonl", 3], "expected an annotation file or a list of them, found"),
    (["a.jsonl", "b.jsonl", "a.jsonl"], "a.jsonl is listed twice"),
])
def test_train_annotations_lists_are_checked_at_load(tiny_world, tmp_path: Path, value, problem) -> None:
    values = run_config(tiny_world, str(tmp_path / "out"), [PRETRAIN]).to_dict()
    with pytest.raises(RunConfigError, match=f"train_annotations: {problem}"):
        RunConfig.from_dict({**values, "train_annotations": value})
