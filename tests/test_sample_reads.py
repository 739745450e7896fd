"""Samples made cheaply, bit for bit those made the plain way. Datasets read only the record fields
their task reads (fine-tuning never decodes the masked variants), tokenize each text once, compute IoU
targets and pad text through NumPy; the plain way decodes every field, tokenizes every text at each
use, and takes torchvision's IoU and padded lists. Every tensor of every batch must be the same."""

import random

import pytest
import torch
from torchvision.ops import box_iou

import train.data.collate
import train.tasks.refexp
from extract.store.reader import FeatureStore
from train.data.annotations import AnnotationFile
from train.data.collate import collate
from train.data.regions import RegionBank
from train.tasks import TASKS
from train.tasks.base import TaskData
from tests.helpers.models import padded_by_lists
from vlbert.tokenization import load_tokenizer, word_pieces

# task → its options: pre-training with the cached pixel-masked variants, mismatched captions and text-only samples
CASES = {"vqa": {}, "refexp": {}, "choice": {}, "pretrain": {"roi_masking": "pixel", "relationship": True}}
BATCH = 6


@pytest.fixture(scope="module")
def data(tiny_world):
    bank = RegionBank(str(tiny_world / "cache"))
    annotations = AnnotationFile(tiny_world / "world" / "train.jsonl", keep=bank.__contains__)
    return TaskData(bank, load_tokenizer(tiny_world / "vocab"), 48, annotations)


def batches(data: TaskData, task: str, options: dict, corpus: str, plain: bool) -> list[dict]:
    """Two epochs of the task's batches in a shuffled order; with text-only samples where the task has them."""
    if task == "pretrain":
        options = {**options, "corpus": corpus}
    options = TASKS[task].options(**options)
    dataset = TASKS[task].dataset(data, options, data.train, 3, True)
    streams = [dataset, *TASKS[task].extra_streams(data, options, 3)]
    if plain:
        dataset.word_pieces = lambda text: word_pieces(data.tokenizer, text)
    made = []
    for epoch in range(2):
        for stream in streams:
            stream.set_epoch(epoch)
        order = random.Random(epoch).sample(range(len(dataset)), len(dataset))
        for start in range(0, len(order), BATCH):
            samples = [dataset[index] for index in order[start : start + BATCH]]
            samples += [stream[index % len(stream)] for stream in streams[1:] for index in order[start : start + 2]]
            made.append(collate(samples, data.tokenizer.pad_token_id))
    return made


@pytest.mark.parametrize("task", CASES)
def test_batches_are_bit_for_bit_those_of_the_plain_way(data, tiny_world, monkeypatch, task):
    corpus = str(tiny_world / "world" / "corpus.txt")
    cheap = batches(data, task, CASES[task], corpus, plain=False)
    decoded = FeatureStore.decoded
    monkeypatch.setattr(FeatureStore, "decoded", lambda store, image_id, float32=False, fields=None:
                        decoded(store, image_id, float32))  # every field, the masked variants rebuilt
    monkeypatch.setattr(train.tasks.refexp, "box_ious", lambda boxes, targets: box_iou(
        torch.from_numpy(boxes), torch.tensor(targets, dtype=torch.float32)).numpy())
    monkeypatch.setattr(train.data.collate, "pad_text", padded_by_lists)
    plain = batches(data, task, CASES[task], corpus, plain=True)
    assert len(cheap) == len(plain) > 2
    for number, (ours, theirs) in enumerate(zip(cheap, plain)):
        assert ours.keys() == theirs.keys(), number
        for name, value in ours.items():
            if torch.is_tensor(value):
                assert value.dtype == theirs[name].dtype and value.shape == theirs[name].shape, (number, name)
                assert value.numpy().tobytes() == theirs[name].numpy().tobytes(), (number, name)
            else:
                assert value == theirs[name], (number, name)
    if task == "pretrain":  # the variants were read and used (masked RoIs come from them), text-only rows joined
        assert any(batch["masked_regions"].any() for batch in cheap)
        assert all(None in batch["image_files"] for batch in cheap)
