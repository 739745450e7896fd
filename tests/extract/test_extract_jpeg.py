"""JPEGs decoded where the detector runs (extract/jpeg.py) and the job's lanes and workers
(extract/resources.py), on the CPU: only the JPEGs the device decodes as Pillow does go there, a
batch's JPEGs decode in one call with Pillow's pixels, a JPEG the decoder refuses falls back to
Pillow (or fails with Pillow's reason), and a job decoding on the device stores what Pillow's stores.
On a GPU: tests/extract/test_extract_cuda.py."""

import os

import numpy as np
import pytest
import torch
import torchvision.io

import extract.resources as resources
from extract.images import ImageError, load_image
from extract.extraction_config import ExtractionConfig
from extract.job import JobError, run_extraction
from extract.jpeg import DEFAULT_JPEG_DECODING, EncodedJpeg, decode_batch, jpeg_for_device
from extract.resources import ResourceError, job_resources
from extract.store import FeatureStore
from extract.synthetic import synthetic_image
from tests.helpers.detection import jpeg_folder
from tests.helpers.stores import assert_same_records
from vlbert.utils.threads import lane_count

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return jpeg_folder(tmp_path_factory.mktemp("jpegs") / "images")


def test_only_complete_upright_baseline_jpegs_go_to_the_device(jpegs):
    for path in sorted(jpegs.iterdir()):
        assert (jpeg_for_device(path, None) is not None) == path.name.startswith("photo"), path.name
    encoded = jpeg_for_device(jpegs / "photo1.jpg", None)
    assert (encoded.height, encoded.width) == load_image(jpegs / "photo1.jpg").shape[:2]
    assert jpeg_for_device(jpegs / "photo1.jpg", max_pixels=encoded.height * encoded.width - 1) is None


def test_a_batch_decodes_in_one_call_with_pillows_pixels(jpegs, monkeypatch):
    calls = []
    decode = torchvision.io.decode_jpeg
    monkeypatch.setattr(torchvision.io, "decode_jpeg", lambda data, **kw: calls.append(len(data)) or decode(data, **kw))
    photos = sorted(jpegs.glob("photo*.jpg"))
    png = load_image(jpegs / "lossless.png")
    decoded = decode_batch([jpeg_for_device(p, None) for p in photos] + [png], CPU)
    assert calls == [len(photos)] and decoded[-1] is png
    for path, pixels in zip(photos, decoded):
        assert isinstance(pixels, torch.Tensor) and pixels.is_contiguous()
        assert np.array_equal(pixels.numpy(), load_image(path)), path.name  # libjpeg both, here


def test_a_jpeg_the_decoder_refuses_is_pillows_and_fails_with_pillows_reason(jpegs, monkeypatch):
    photos = [jpeg_for_device(p, None) for p in sorted(jpegs.glob("photo*.jpg"))[:3]]
    refused = photos[1]
    broken = EncodedJpeg("broken.jpg", refused.data[:400] + b"\xff\xd9", refused.height, refused.width)
    decode = torchvision.io.decode_jpeg

    def refusing(data, **kwargs):
        if any(len(d) in (len(refused.data), len(broken.data)) for d in data):
            raise RuntimeError("nvjpeg: unsupported")
        return decode(data, **kwargs)
    monkeypatch.setattr(torchvision.io, "decode_jpeg", refusing)
    first, second, third, fourth = decode_batch([photos[0], refused, photos[2], broken], CPU)
    assert isinstance(first, torch.Tensor) and isinstance(third, torch.Tensor)
    assert isinstance(second, np.ndarray) and np.array_equal(second, load_image(jpegs / "photo1.jpg"))
    assert isinstance(fourth, ImageError) and str(fourth).startswith("broken.jpg: ")


def test_pixels_on_the_device_prepare_as_the_same_pixels_from_the_host(tiny_detector):
    image = synthetic_image(90, 130, seed=3)
    from_host = tiny_detector.prepare(image)
    on_device = tiny_detector.prepare(torch.from_numpy(image.copy()))
    assert torch.equal(from_host.tensor, on_device.tensor)
    assert (from_host.input_height, from_host.input_width) == (on_device.input_height, on_device.input_width)


def test_a_job_decoding_jpegs_on_the_device_stores_what_pillows_stores(jpegs, tmp_path):
    notes = {}
    for decoding in ("workers", "device"):
        summary = run_extraction(ExtractionConfig(jpegs, "tiny", batch_size=4, jpeg_decoding=decoding,
                                                  feature_dtype="float32", progress=False), tmp_path / decoding)
        assert (summary.written, summary.failed) == (10, 1)
        assert summary.failures[0][0] == "cut.jpg" and "truncated" in summary.failures[0][1]
        notes[decoding] = summary.resources
    assert "JPEG decoded by Pillow" in notes["workers"] and "JPEG decoded on cpu" in notes["device"]
    with FeatureStore(tmp_path / "workers") as pillow, FeatureStore(tmp_path / "device") as device:
        assert_same_records(pillow, device)


def test_an_unknown_jpeg_decoding_is_refused_before_anything_runs(jpegs, tmp_path):
    with pytest.raises(JobError, match=r"^jpeg_decoding 'gpu': expected one of auto, device, workers$"):
        run_extraction(ExtractionConfig(jpegs, "tiny", jpeg_decoding="gpu", progress=False), tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_on_the_cpu_the_lanes_take_the_cores_and_pillow_decodes():
    chosen = job_resources(CPU, threads=None, streams=None, decode_workers=None, jpeg_decoding="auto")
    assert (chosen.lanes, chosen.decode_workers, chosen.jpeg_on_device) == (lane_count(None), 2, False)
    assert job_resources(CPU, threads=3, streams=5, decode_workers=0, jpeg_decoding="auto").lanes == 3


@pytest.mark.parametrize("cores, workers", [(2, 2), (7, 4), (16, 8), (128, 8)])
def test_on_a_gpu_the_workers_come_from_the_cores_and_jpegs_go_to_the_device(monkeypatch, cores, workers):
    monkeypatch.setattr(resources, "device_decodes_jpeg", lambda device: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    chosen = job_resources(GPU, threads=None, streams=None, decode_workers=None, jpeg_decoding="auto")
    assert (chosen.lanes, chosen.decode_workers, chosen.jpeg_on_device) == (2, workers, True)
    assert "2 CUDA stream(s)" in chosen.describe(GPU)
    chosen = job_resources(GPU, threads=None, streams=3, decode_workers=5, jpeg_decoding="workers")
    assert (chosen.lanes, chosen.decode_workers, chosen.jpeg_on_device) == (3, 5, False)
    # nvJPEG is opt-in: by default a GPU job decodes with Pillow, the CPU's pixels
    default = job_resources(GPU, threads=None, streams=None, decode_workers=None, jpeg_decoding=DEFAULT_JPEG_DECODING)
    assert (default.lanes, default.jpeg_on_device) == (2, False)


def test_device_decoding_where_the_device_cannot_is_refused_in_one_line_and_auto_falls_back(monkeypatch):
    monkeypatch.setattr(resources, "device_decodes_jpeg", lambda device: "RuntimeError: not compiled with nvjpeg")
    with pytest.raises(ResourceError, match=r"^jpeg_decoding device: cuda:0 cannot decode JPEG here \(RuntimeError: "
                                            r"not compiled with nvjpeg\); use auto or workers$"):
        job_resources(GPU, threads=None, streams=None, decode_workers=None, jpeg_decoding="device")
    chosen = job_resources(GPU, threads=None, streams=None, decode_workers=None, jpeg_decoding="auto")
    assert not chosen.jpeg_on_device and "cannot: RuntimeError: not compiled with nvjpeg" in chosen.jpeg_note


def test_the_cli_refuses_device_decoding_where_the_device_cannot_in_one_line(jpegs, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from pipelines.cli import main

    monkeypatch.setattr(resources, "device_decodes_jpeg", lambda device: "RuntimeError: no decoder")
    args = ["extract", "--images", str(jpegs), "--out", str(tmp_path / "store"), "--detector", "tiny", "--quiet"]
    refused = CliRunner().invoke(main, args + ["--jpeg-decoding", "device"])
    assert refused.exit_code == 2 and refused.output == ("Error: jpeg_decoding device: cpu cannot decode JPEG here "
                                                         "(RuntimeError: no decoder); use auto or workers\n")
    assert not (tmp_path / "store").exists()
    unknown = CliRunner().invoke(main, args + ["--jpeg-decoding", "gpu"])
    assert unknown.exit_code == 2 and "Invalid value for '--jpeg-decoding'" in unknown.output
