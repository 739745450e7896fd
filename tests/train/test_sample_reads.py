"""Samples made cheaply, bit for bit those made the plain way. Datasets read only the record fields
their task reads (fine-tuning never decodes the masked variants, pre-training the one variant it uses),
tokenize each text once, compute IoU targets and pad text through NumPy, and a top-k store's class
distributions travel sparse to the device; the plain way decodes every field, picks the variant from
all of them, tokenizes every text at each use, takes torchvision's IoU and padded lists, and densifies
the class distributions on the host. Every tensor of every batch on the device must be the same."""

import random

import pytest
import torch
from torchvision.ops import box_iou

import train.data.collate
import train.tasks.refexp
from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store.reader import FeatureStore
from extract.store.schema import VARIANT_FIELDS
from tests.helpers.models import padded_by_lists
from train.data.annotations import AnnotationFile
from train.data.collate import collate, to_device
from train.data.regions import RegionBank
from train.tasks import TASKS
from train.tasks.base import TaskData
from vlbert.tokenization import load_tokenizer, word_pieces

PRETRAIN = {"roi_masking": "pixel", "relationship": True}
# case → (task, store, options): pre-training with the cached pixel-masked variants, mismatched captions and
# text-only samples, from the tiny world's store (every class probability) and from one of top-3 classes
CASES = {"vqa": ("vqa", "cache", {}), "refexp": ("refexp", "cache", {}), "choice": ("choice", "cache", {}),
         "pretrain": ("pretrain", "cache", PRETRAIN), "pretrain-top-3-classes": ("pretrain", "top-3", PRETRAIN)}
BATCH = 6


@pytest.fixture(scope="module")
def stores(tiny_world, tmp_path_factory) -> dict:
    top = tmp_path_factory.mktemp("top-3") / "cache"
    run_extraction(ExtractionConfig(tiny_world / "world", "tiny", mask_variants=2, top_k_classes=3, batch_size=8,
                                    progress=False), top)
    return {"cache": tiny_world / "cache", "top-3": top}


def task_data(tiny_world, store, encoded: bool) -> TaskData:
    """As training reads (`encoded`: sparse class distributions), or the plain way."""
    bank = RegionBank(str(store), encoded=encoded)
    annotations = AnnotationFile(tiny_world / "world" / "train.jsonl", keep=bank.__contains__)
    return TaskData(bank, load_tokenizer(tiny_world / "vocab"), 48, annotations)


def batches(data: TaskData, task: str, options: dict, corpus: str, plain: bool) -> list[tuple[dict, dict]]:
    """Two epochs of the task's batches in a shuffled order, each as collated and on the device (the
    CPU); with text-only samples where the task has them."""
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
            batch = collate(samples, data.tokenizer.pad_token_id)
            made.append((batch, to_device(batch, torch.device("cpu"))))
    return made


@pytest.mark.parametrize("case", CASES)
def test_batches_are_bit_for_bit_those_of_the_plain_way(stores, tiny_world, monkeypatch, case):
    task, store, options = CASES[case]
    corpus = str(tiny_world / "world" / "corpus.txt")
    cheap = batches(task_data(tiny_world, stores[store], encoded=True), task, options, corpus, plain=False)
    decoded = FeatureStore.decoded

    def every_field(store, image_id, float32=False, fields=None, variant=None):
        record = decoded(store, image_id, float32)  # every field, every masked variant rebuilt
        if variant is not None:  # and the one drawn picked from them
            record.update({name: record[name][variant : variant + 1] for name in VARIANT_FIELDS})
        return record

    monkeypatch.setattr(FeatureStore, "decoded", every_field)
    monkeypatch.setattr(train.tasks.refexp, "box_ious", lambda boxes, targets: box_iou(
        torch.from_numpy(boxes), torch.tensor(targets, dtype=torch.float32)).numpy())
    monkeypatch.setattr(train.data.collate, "pad_text", padded_by_lists)
    plain = batches(task_data(tiny_world, stores[store], encoded=False), task, options, corpus, plain=True)
    assert len(cheap) == len(plain) > 2
    for number, ((collated, ours), (collated_plain, theirs)) in enumerate(zip(cheap, plain)):
        assert ours.keys() == theirs.keys(), number
        for name, value in ours.items():
            assert value.dtype == theirs[name].dtype and value.shape == theirs[name].shape, (number, name)
            assert value.numpy().tobytes() == theirs[name].numpy().tobytes(), (number, name)
        lists = {name: value for name, value in collated.items() if isinstance(value, list)}
        assert lists == {name: collated_plain[name] for name in lists}, number
    if task == "pretrain":  # the variants were read and used (masked RoIs come from them), text-only rows joined
        assert any(batch["masked_regions"].any() for _, batch in cheap)
        assert all(None in batch["image_files"] for batch, _ in cheap)
        assert all(batch["region_labels"].shape[-1] == 7 for _, batch in cheap)  # 6 classes + background
    if store == "top-3":  # the class distributions travelled sparse: 3 of the 7 classes a RoI
        assert all(batch["region_labels"].parts["probs"].shape[-1] == 3 for batch, _ in cheap)
