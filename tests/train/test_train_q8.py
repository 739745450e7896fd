"""A q8 store's features travel to the training device as their 8-bit codes (and two float32 a row)
and are decoded there (docs/training.md, "Training fast"): the model sees bitwise the values of the
host's decoding, a stage trains to the same losses either way, at about a quarter of float32's
bytes per batch (a third of float16's)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from extract.store import FeatureStore, FeatureStoreWriter
from extract.store.schema import Encoded
from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import copy_world, run_config
from train.data.annotations import AnnotationFile
from train.data.collate import to_device, transfer_bytes
from train.data.regions import RegionBank
from train.engine.batches import Batch, Collate
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from train.tasks import TASKS
from train.tasks.base import TaskData
from train.tasks.pretrain import PretrainOptions
from vlbert.tokenization import load_tokenizer

CPU = torch.device("cpu")
STAGES = {"pretrain": StageConfig("pretrain", "pretrain", steps=4, batch_size=3, num_workers=0, log_every=2),
          "vqa": StageConfig("vqa", "vqa", steps=4, batch_size=3, num_workers=0, log_every=2)}


def q8_copy(source: Path, out: Path) -> Path:
    """`source`'s records (masked-pixel variants included) in a store of q8 features."""
    store = FeatureStore(source)
    meta = {**store.meta, "features": {**store.meta["features"], "dtype": "q8"}}
    with FeatureStoreWriter(out, meta) as writer:
        writer.commit({image_id: store.decoded(image_id) for image_id in store.keys()})
    return out


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    root = copy_world(tiny_world, tmp_path_factory.mktemp("q8"))
    q8_copy(tiny_world / "cache", root / "q8-cache")
    return root


def batch(world: Path, task: str, encoded: bool, decode_on_host: bool = False) -> dict:
    """The first training batch of `task` (6 samples, pre-training's masked-pixel variants drawn);
    sequences of 32 elements leave their samples as many RoIs as their texts leave room for."""
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "q8-cache"), encoded=encoded)
    data = TaskData(bank, tokenizer, 32, AnnotationFile(world / "world" / "train.jsonl", keep=bank.__contains__))
    dataset = TASKS[task].dataset(data, STAGES[task].options, data.train, 7, True)
    return Collate(tokenizer.pad_token_id, decode_on_host=decode_on_host)([dataset[i] for i in range(6)]).inputs


@pytest.mark.parametrize("task", list(STAGES))
def test_the_model_sees_the_hosts_values_bitwise(world, task):
    today = batch(world, task, encoded=False)  # decoded by the store, float32 from the workers
    codes = batch(world, task, encoded=True)
    codes_decoded_on_host = batch(world, task, encoded=True, decode_on_host=True)
    appearance = codes["appearance"]
    assert isinstance(appearance, Encoded) and appearance.parts["codes"].dtype == torch.uint8
    assert appearance.parts["low"].dtype == appearance.parts["step"].dtype == torch.float32
    assert codes_decoded_on_host["appearance"].dtype == torch.float32  # the workers' decoding
    padding = ~codes["box_mask"]
    assert padding.any() and not appearance.parts["codes"][padding].any()
    on_device, expected = to_device(codes, CPU), to_device(today, CPU)
    assert today["appearance"].dtype == torch.float32 and on_device.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(on_device[name], value), name
        assert torch.equal(to_device(codes_decoded_on_host, CPU)[name], value), name
    assert not on_device["appearance"][padding].any()
    features = appearance.parts["codes"].numel()
    assert transfer_bytes(today) - transfer_bytes(codes) == 3 * features - 8 * features // today["appearance"].shape[-1]


def logged(world: Path, stage: StageConfig, out: str) -> list[dict]:
    run = run_config(world, out, [stage], store=str(world / "q8-cache"))
    run.model.update(NO_DROPOUT)
    Trainer(run).fit()
    folder = RunFolder(world / out)
    return [record for record in folder.metrics() if "step" in record], folder.speed()[stage.name]


@pytest.mark.parametrize("task", list(STAGES))
def test_a_stage_decoding_on_the_device_trains_as_one_decoding_in_its_workers(world, task):
    """The codes come from a DataLoader worker process (through its pipe), the decoded values from the
    training process's own collation: the same losses."""
    on_device, device_speed = logged(world, replace(STAGES[task], num_workers=1), f"{task}-device")
    on_host, host_speed = logged(world, replace(STAGES[task], decode_on_device=False), f"{task}-host")
    assert len(on_device) == 4 and [r["loss"] for r in on_device] == [r["loss"] for r in on_host]
    assert device_speed["features_sent_as"] == "q8 codes" and host_speed["features_sent_as"] == "float32"


def test_feature_masking_reads_q8_codes(world):
    """Pre-training without pixel variants masks the appearance inside the model: from decoded codes."""
    stage = replace(STAGES["pretrain"], options=PretrainOptions(roi_masking="feature"))
    on_device, _ = logged(world, stage, "feature-device")
    on_host, _ = logged(world, replace(stage, decode_on_device=False), "feature-host")
    assert [r["loss"] for r in on_device] == [r["loss"] for r in on_host]
    assert np.isfinite([r["loss"] for r in on_device]).all()


@pytest.mark.cuda
@pytest.mark.parametrize("task", list(STAGES))
def test_a_gpu_decodes_the_hosts_values_bitwise(world, task):
    today, codes = batch(world, task, encoded=False), batch(world, task, encoded=True)
    pinned = Batch(codes, [], 6, 6).pin_memory().inputs  # as the DataLoader's pinning thread does
    assert pinned["appearance"].parts["codes"].is_pinned()
    on_gpu = to_device(pinned, torch.device("cuda"))
    assert on_gpu["appearance"].device.type == "cuda"
    assert torch.equal(on_gpu["appearance"].cpu(), to_device(today, CPU)["appearance"])
