"""Where a store's JPEGs were decoded is in its meta.json (`detector.jpeg_decoding`: the decoders'
pixels differ, and so do the features), so a resume with the other decoder is refused, naming both;
a store from before that record opens, and is taken to be Pillow's (the default then)."""

from __future__ import annotations

import json

import pytest

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store.reader import FeatureStore
from extract.store.schema import StoreMismatchError
from tests.helpers.detection import jpeg_folder


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return jpeg_folder(tmp_path_factory.mktemp("jpegs") / "images", count=2)


def extract(images, out, decoding: str):
    return run_extraction(ExtractionConfig(images, "tiny", batch_size=4, jpeg_decoding=decoding, progress=False), out)


def test_a_resume_with_the_other_decoder_is_refused_naming_both(jpegs, tmp_path):
    store = tmp_path / "store"
    extract(jpegs, store, "workers")
    meta = json.loads((store / "meta.json").read_text())
    assert meta["detector"]["jpeg_decoding"] == "workers"
    kept = (store / "meta.json").read_bytes()
    with pytest.raises(StoreMismatchError) as refused:
        extract(jpegs, store, "device")  # on the CPU: torchvision's decoder, in the compute lanes
    assert str(refused.value).splitlines()[1:] == [
        "  detector.jpeg_decoding: store has 'workers', this run has 'device'"]
    assert (store / "meta.json").read_bytes() == kept
    assert extract(jpegs, store, "auto").skipped == 6  # auto on the CPU: the workers, as recorded


def test_a_store_from_before_the_record_opens_and_is_taken_to_be_pillows(jpegs, tmp_path):
    store = tmp_path / "store"
    extract(jpegs, store, "device")
    meta = json.loads((store / "meta.json").read_text())
    assert meta["detector"].pop("jpeg_decoding") == "device"
    (store / "meta.json").write_text(json.dumps(meta))
    with FeatureStore(store) as reader:
        assert len(reader.keys()) == 6
    with pytest.raises(StoreMismatchError) as refused:
        extract(jpegs, store, "device")
    assert str(refused.value).splitlines()[1:] == [
        "  detector.jpeg_decoding: store has 'workers', this run has 'device' (the store is older than this entry: "
        "taken to have had it so)"]
    assert extract(jpegs, store, "workers").skipped == 6
