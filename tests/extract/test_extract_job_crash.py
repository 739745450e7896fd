"""`kill -9` in the middle of `vlbert extract`, then the same command again: every image exactly once,
and the records equal those of an uninterrupted run."""

import signal
import subprocess
import sys
import time

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store import FeatureStore
from extract.store.audit import verify_store
from extract.synthetic import write_synthetic_images
from tests.helpers.stores import assert_same_records

BATCH = 2
COUNT = 24


def committed(store_dir) -> int:
    if not (store_dir / "shards").is_dir():
        return 0
    with FeatureStore(store_dir) as store:
        return len(store)


def test_sigkill_then_rerun_equals_an_uninterrupted_run(tmp_path):
    images = tmp_path / "images"
    write_synthetic_images(images, COUNT)
    out = tmp_path / "killed"
    command = [sys.executable, "-c", "from pipelines.cli import main; main()", "extract", "--images", str(images),
               "--out", str(out), "--detector", "tiny", "--batch-size", str(BATCH), "--mask-variants", "2",
               "--quiet"]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while committed(out) < 2 * BATCH and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    job.send_signal(signal.SIGKILL)
    job.wait()
    assert job.returncode == -signal.SIGKILL, "the job ended before it could be killed"

    survived = committed(out)
    assert 0 < survived < COUNT and survived % BATCH == 0  # whole batches only
    assert verify_store(out).problems == []

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"{survived} already stored, {COUNT - survived} written, 0 failed" in rerun.stdout

    reference = tmp_path / "reference"
    run_extraction(ExtractionConfig(images, "tiny", batch_size=BATCH, mask_variants=2, progress=False), reference)
    with FeatureStore(out) as resumed, FeatureStore(reference) as uninterrupted:
        assert len(resumed) == COUNT and resumed.duplicates == []
        assert_same_records(resumed, uninterrupted)
    assert verify_store(out).problems == []
