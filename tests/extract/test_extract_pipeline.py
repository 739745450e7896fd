"""The extraction job's pipeline: decoding workers (order, bounded read-ahead, crashes), the commit
thread (errors surface, counts stay right), and out-of-memory batches retried in halves."""

import faulthandler
import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import extract.job
from extract.extraction_config import ExtractionConfig
from extract.job import WorkItem, _isolating_failures, run_extraction
from extract.loader import DecodingPipeline
from extract.store import FeatureStore
from extract.store.audit import verify_store
from extract.store.writer import FeatureStoreWriter
from tests.helpers.detection import image_folder
from tests.helpers.stores import assert_same_records

MASKED = dict(mask_variants=1, mask_prob=0.3, mask_seed=3)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("images"), 9)


@pytest.fixture(scope="module")
def in_process(images, tmp_path_factory):
    """Decoded in the job's process, one batch size: what every other run must store."""
    out = tmp_path_factory.mktemp("in-process") / "store"
    summary = run_extraction(ExtractionConfig(images, "tiny", batch_size=3, decode_workers=0, progress=False,
                                              **MASKED), out)
    assert (summary.written, summary.failed) == (9, 1)
    return out


def failures(store) -> dict[str, str]:
    return {f["image"]: f["error"] for f in map(json.loads, (store / "failures.jsonl").open())}


def test_workers_store_what_the_job_process_stores(images, in_process, tmp_path):
    summary = run_extraction(ExtractionConfig(images, "tiny", batch_size=4, decode_workers=3, progress=False,
                                              **MASKED), tmp_path / "store")
    assert (summary.written, summary.failed) == (9, 1)
    with FeatureStore(in_process) as a, FeatureStore(tmp_path / "store") as b:
        assert_same_records(a, b)
    assert failures(tmp_path / "store") == failures(in_process)


def test_a_worker_that_dies_on_a_file_fails_that_file_only(images, in_process, tmp_path, monkeypatch):
    """A decoder that kills its process (os._exit, a signal) on two files: each file is a failure
    naming the crash, a fresh worker decodes the rest, and every other record is stored as usual."""
    decode = extract.job.load_image

    def crashing(path, max_pixels=None):
        if path.name == "image0002.png":
            os._exit(3)
        if path.name == "image0005.png":
            faulthandler.disable()  # pytest's handler would print the worker's stack: the crash is meant
            os.kill(os.getpid(), signal.SIGSEGV)
        return decode(path, max_pixels)

    monkeypatch.setattr(extract.job, "load_image", crashing)  # forked workers inherit it
    summary = run_extraction(ExtractionConfig(images, "tiny", batch_size=3, decode_workers=2, progress=False,
                                              **MASKED), tmp_path / "store")
    assert (summary.written, summary.failed) == (7, 3)
    errors = failures(tmp_path / "store")
    assert errors["image0002.png"] == f"worker crashed while decoding: {images / 'image0002.png'} (exit status 3)"
    assert errors["image0005.png"] == (f"worker crashed while decoding: {images / 'image0005.png'} "
                                       "(killed by signal SIGSEGV)")
    assert "not an image" in errors["notes.jpg"]
    with FeatureStore(in_process) as a, FeatureStore(tmp_path / "store") as b:
        assert b.keys() == [k for k in a.keys() if k not in ("image0002", "image0005")]
        for key in b:
            assert all(np.array_equal(a[key][f], b[key][f]) for f in ("boxes", "features", "masked_features"))
    assert verify_store(tmp_path / "store").problems == []


def test_results_come_in_order_and_read_ahead_is_bounded(tmp_path):
    """Later items finish first (they decode faster), yet come out in order; with nothing taken,
    the workers decode only `depth` items ahead."""
    items = [WorkItem(f"{i}", f"{i}", tmp_path / f"{i}") for i in range(12)]

    def decode(item):
        (tmp_path / f"decoded-{item.path}").touch()
        time.sleep(0.02 * (12 - int(item.path)) if int(item.path) < 4 else 0)
        return int(item.path) ** 2

    with DecodingPipeline(decode, items, 3, depth=4) as pipeline:
        results = iter(pipeline)
        first = next(results)
        time.sleep(0.5)
        assert len(list(tmp_path.glob("decoded-*"))) <= 4  # item 4 is sent when the next item is asked for
        rest = list(results)
    assert [first, *rest] == [(item, int(item.path) ** 2, None) for item in items]


def test_a_failing_commit_stops_the_job_with_its_error_and_a_rerun_completes(images, in_process, tmp_path,
                                                                            monkeypatch):
    commit, calls = FeatureStoreWriter.commit, []

    def failing(self, records, failures=None):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return commit(self, records, failures or {})

    monkeypatch.setattr(FeatureStoreWriter, "commit", failing)
    with pytest.raises(OSError, match="disk full"):
        run_extraction(ExtractionConfig(images, "tiny", batch_size=3, progress=False, **MASKED), tmp_path / "store")
    assert calls[0] != threading.main_thread().name  # commits run beside the computation
    with FeatureStore(tmp_path / "store") as store:
        assert len(store) == 3  # the first batch; the failed one and those after it are not there
    monkeypatch.setattr(FeatureStoreWriter, "commit", commit)
    summary = run_extraction(ExtractionConfig(images, "tiny", batch_size=3, progress=False, **MASKED),
                             tmp_path / "store")
    assert (summary.skipped, summary.written, summary.failed) == (3, 6, 1)
    with FeatureStore(in_process) as a, FeatureStore(tmp_path / "store") as b:
        assert_same_records(a, b)


def out_of_memory_above(limit: int, always: set[str], sizes: list[int]):
    """A compute that runs out of memory on batches larger than `limit` and on any batch holding
    an image of `always`, recording the batch sizes it was called with."""
    def compute(batch):
        sizes.append(len(batch))
        if len(batch) > limit or any(item.image_id in always for item, _ in batch):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [f"record of {item.image_id}" for item, _ in batch]
    return compute


def test_an_out_of_memory_batch_runs_again_in_halves_down_to_the_image_at_fault():
    batch = [(WorkItem(f"{i}.png", str(i)), None) for i in range(8)]
    sizes = []
    records, failed = _isolating_failures(out_of_memory_above(2, {"5"}, sizes), batch)
    assert sizes == [8, 4, 2, 2, 4, 2, 1, 1, 2]  # halves; the pair holding image 5 image by image
    assert sorted(records) == ["0", "1", "2", "3", "4", "6", "7"]
    assert [(item.image_id, error) for item, error in failed] == [
        ("5", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")]


def test_other_errors_still_run_each_image_alone():
    batch = [(WorkItem(f"{i}.png", str(i)), None) for i in range(4)]
    calls = []

    def compute(batch):
        calls.append(len(batch))
        if any(item.image_id == "2" for item, _ in batch):
            raise ValueError("image 2: bad boxes")
        return [item.image_id for item, _ in batch]

    records, failed = _isolating_failures(compute, batch)
    assert calls == [4, 1, 1, 1, 1] and sorted(records) == ["0", "1", "3"]
    assert [(item.image_id, error) for item, error in failed] == [("2", "image 2: bad boxes")]


def test_a_job_whose_batches_run_out_of_memory_stores_every_image(images, in_process, tmp_path, monkeypatch):
    region_computer = extract.job._region_computer

    def limited(*args, **kwargs):
        compute = region_computer(*args, **kwargs)

        def within_memory(batch):
            if len(batch) > 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return compute(batch)
        return within_memory

    monkeypatch.setattr(extract.job, "_region_computer", limited)
    summary = run_extraction(ExtractionConfig(images, "tiny", batch_size=4, progress=False, **MASKED),
                             tmp_path / "store")
    assert (summary.written, summary.failed) == (9, 1)
    with FeatureStore(in_process) as a, FeatureStore(tmp_path / "store") as b:
        assert_same_records(a, b)
