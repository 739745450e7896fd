"""The one annotation schema: indexing, lazy reading, and malformed lines named by file and line."""

import json

import pytest
import torch

from train.data.annotations import ITEM_KINDS, AnnotationFile, ItemKind, annotation_texts
from train.data.collate import model_inputs
from train.data.files import DataError
from train.tasks import TASKS
from vlbert import VLBertConfig
from vlbert.modeling import VLBertForQuestionAnswering

RECORDS = [
    {"file": "a/1.jpg", "captions": ["one", "two"], "vqa": [{"question_id": 7, "question": "what?", "answers": ["x"]}]},
    {"file": "a/2.jpg", "refs": [{"sent_id": 3, "text": "left", "box": [0, 0, 4, 4]}]},
    {"file": "b/3.jpg", "objects": ["person", "dog"],
     "vcr": [{"annot_id": "val-0", "question": ["is", ["Casey", 0], "near", ["dog", 1], "?"],
              "answer_choices": [["yes"]] * 4, "rationale_choices": [["no"]] * 4, "answer_label": 1,
              "rationale_label": 2}]},
    {"file": "b/4.jpg", "captions": ["three"]},
]


def write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_items_are_indexed_by_line_and_position_and_read_lazily(tmp_path):
    annotations = AnnotationFile(write(tmp_path / "train.jsonl", RECORDS), keep=lambda key: key != "a/2")
    assert len(annotations) == 3 and annotations.dropped == 1
    assert annotations.items("captions").tolist() == [[0, 0], [0, 1], [2, 0]]
    assert annotations.items("refs").tolist() == []
    image, caption = annotations.item(annotations.items("captions")[2], "captions")
    assert (image.image_id, image.file, caption) == ("b/4", "b/4.jpg", "three")
    commonsense = annotations[1].vcr[0]
    assert commonsense.question == ["is", ("Casey", 0), "near", ("dog", 1), "?"] and commonsense.answer_label == 1
    assert annotations[0].questions[0].question_id == 7


def test_every_kind_of_the_registry_is_indexed_and_parsed(tmp_path, monkeypatch):
    monkeypatch.setattr("train.data.annotations.ITEM_KINDS",
                        {**ITEM_KINDS, "pairs": ItemKind(lambda value, record: (value["a"], len(record.get("captions", []))))})
    records = [{"file": "a/1.jpg", "captions": ["one"], "pairs": [{"a": 1}, {"a": 2}]}, {"file": "a/2.jpg"}]
    annotations = AnnotationFile(write(tmp_path / "train.jsonl", records))
    assert annotations.items("pairs").tolist() == [[0, 0], [0, 1]]
    assert annotations.item(annotations.items("pairs")[1], "pairs")[1] == (2, 1)
    assert annotations.items("captions").tolist() == [[0, 0]]


def test_each_kind_gives_its_texts_vcr_tokens_as_the_words_the_model_reads(tmp_path):
    pair = {"pair_id": "p1", "hypothesis": "a dog sleeps", "label": "neutral"}
    annotations = AnnotationFile(write(tmp_path / "train.jsonl", [*RECORDS[1:3], {"file": "c/5.jpg", "snli_ve": [pair]}]))
    assert annotation_texts(annotations) == ["left", "is Casey near dog ?", "yes", "yes", "yes", "yes",
                                             "no", "no", "no", "no", "a dog sleeps"]


@pytest.mark.parametrize("line, problem", [
    ('{"file": "x.jpg", "captions": [', "invalid JSON at column"),
    ('{"captions": []}', "not an annotation record (missing key 'file')"),
    ('{"file": "x.jpg", "refs": [{"text": "a", "box": [1, 2]}]}', "a box is [x1, y1, x2, y2]"),
    ('{"file": "x.jpg", "objects": ["dog"], "vcr": [{"annot_id": "v", "question": [["dog", 3]], '
     '"answer_choices": [], "rationale_choices": []}]}', "token ['dog', 3] names object 3, but the image has 1"),
])
def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path, line, problem):
    path = write(tmp_path / "val.jsonl", [RECORDS[0], line])
    with pytest.raises(DataError) as caught:
        AnnotationFile(path)
    assert str(caught.value).startswith(f"{path}:2: ") and problem in str(caught.value)


def test_a_model_is_given_only_the_batch_entries_its_forward_takes():
    model = VLBertForQuestionAnswering(VLBertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32,
                                                    visual_feature_size=8, geometry_frequencies=4, num_answers=3))
    batch = {"input_ids": torch.zeros(1, 3), "answer_positions": torch.zeros(1), "labels": torch.zeros(1, 3),
             "mlm_labels": torch.zeros(1, 3), "iou": torch.zeros(1, 2), "boxes": torch.zeros(1, 2, 4)}
    assert set(model_inputs(model, batch)) == {"input_ids", "answer_positions", "labels", "boxes"}
    assert set(model_inputs(model, batch, training=False)) == {"input_ids", "answer_positions", "boxes"}


def test_every_task_names_a_model_dataset_and_evaluation():
    assert set(TASKS) == {"pretrain", "vqa", "choice", "vcr_q2a", "vcr_qa2r", "refexp", "retrieval",
                          "snli_ve", "nlvr2"}
    for task in TASKS.values():
        assert callable(task.dataset) and callable(task.evaluator) and task.about


def test_forked_dataloader_workers_each_read_their_own_lines(tmp_path):
    records = [{"file": f"img/{i}.jpg", "captions": [f"caption {i} " + "word " * (i % 7)]} for i in range(200)]
    annotations = AnnotationFile(write(tmp_path / "train.jsonl", records))
    assert annotations[0].image_id == "img/0"  # the parent opens its handle before the fork
    loader = torch.utils.data.DataLoader(annotations, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", collate_fn=lambda a: a.image_id)
    assert list(loader) == [f"img/{i}" for i in range(200)]
