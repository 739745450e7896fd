"""Devices in the extraction job: sticky CUDA errors stop it (and a rerun resumes), torchrun ranks get
their own GPU, and devices or precisions this machine lacks are refused before any work."""

import json
import shutil
import threading

import pytest
import torch
from click.testing import CliRunner

import extract.job
from extract.extraction_config import ExtractionConfig
from extract.job import WorkItem, _isolating_failures, run_extraction
from extract.store import FeatureStore
from extract.store.audit import verify_store
from extract.store.writer import FeatureStoreWriter
from pipelines.cli import main
from tests.helpers.detection import image_folder
from tests.helpers.stores import assert_same_records
from vlbert.utils.device import StickyDeviceError, is_sticky_cuda_error
from vlbert.utils.device import DeviceError, rank_device, use_device

ASYNC_NOTE = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
              "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")
STICKY = [
    RuntimeError("CUDA error: device-side assert triggered" + ASYNC_NOTE),
    RuntimeError("CUDA error: an illegal memory access was encountered" + ASYNC_NOTE),
    RuntimeError("CUDA error: unspecified launch failure" + ASYNC_NOTE),
    RuntimeError("CUDA error: misaligned address" + ASYNC_NOTE),
    RuntimeError("CUDA error: uncorrectable ECC error encountered" + ASYNC_NOTE),
    RuntimeError("CUDA error: an illegal instruction was encountered"),
    RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, ...)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"),
    RuntimeError("HIP error: an illegal memory access was encountered"),
    RuntimeError("Triton Error [CUDA]: CUDA_ERROR_ILLEGAL_ADDRESS"),
    torch.AcceleratorError("CUDA error: operation not permitted when stream is capturing"),
]
NOT_STICKY = [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    torch.AcceleratorError("CUDA error: out of memory" + ASYNC_NOTE),
    RuntimeError("CUDA error: out of memory"),
    RuntimeError("The size of tensor a (4) must match the size of tensor b (5) at non-singleton dimension 1"),
    ValueError("box 2 [1.0, 2.0, 0.0, 3.0]: inverted (an illegal memory access was encountered in a file name)"),
    OSError("disk full"),
    KeyError("features"),
]


@pytest.mark.parametrize("exc", STICKY, ids=lambda e: str(e).splitlines()[0][:40])
def test_errors_that_poison_the_cuda_context_are_sticky(exc):
    assert is_sticky_cuda_error(exc)


@pytest.mark.parametrize("exc", NOT_STICKY, ids=lambda e: str(e).splitlines()[0][:40])
def test_out_of_memory_and_ordinary_errors_are_not_sticky(exc):
    assert not is_sticky_cuda_error(exc)


def test_an_error_raised_from_or_while_handling_a_sticky_one_is_sticky():
    try:
        try:
            raise STICKY[1]
        except RuntimeError as cause:
            raise ValueError("stage failed") from cause
    except ValueError as exc:
        assert is_sticky_cuda_error(exc)
    try:
        try:
            raise STICKY[0]
        except RuntimeError:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory while reporting")  # noqa: B904
    except RuntimeError as exc:
        assert is_sticky_cuda_error(exc)


def test_a_sticky_error_is_not_retried_in_pieces():
    batch = [(WorkItem(f"{i}.png", str(i)), None) for i in range(4)]
    calls = []

    def compute(pieces):
        calls.append(len(pieces))
        raise STICKY[0]

    with pytest.raises(RuntimeError, match="device-side assert"):
        _isolating_failures(compute, batch)
    assert calls == [4]


# ---- the job ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("images"), 9)


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "store"
    run_extraction(ExtractionConfig(images, "tiny", batch_size=3, mask_variants=1, progress=False), out)
    return out


def failing_on_second_batch(monkeypatch, error):
    """The job's compute fails with `error` on its second batch, while the first batch's commit
    is still waiting for that moment (so the error meets a submitted, uncommitted batch).
    Returns the ids of the batches computed."""
    region_computer, commit = extract.job._region_computer, FeatureStoreWriter.commit
    second_batch_failing, batches = threading.Event(), []

    def computer(*args, **kwargs):
        compute = region_computer(*args, **kwargs)

        def failing(batch):
            batches.append([item.image_id for item, _ in batch])
            if len(batches) == 2:
                second_batch_failing.set()
                raise error
            return compute(batch)
        return failing

    def held_commit(self, records, failures=None):
        second_batch_failing.wait(timeout=60)
        return commit(self, records, failures or {})

    monkeypatch.setattr(extract.job, "_region_computer", computer)
    monkeypatch.setattr(FeatureStoreWriter, "commit", held_commit)
    return batches


def stored_failures(store):
    path = store / "failures.jsonl"
    return [json.loads(line)["image"] for line in path.open()] if path.exists() else []


@pytest.mark.parametrize("error", STICKY[1:2] + STICKY[-1:], ids=["RuntimeError", "AcceleratorError"])
def test_a_sticky_cuda_error_stops_the_job_keeps_what_was_committed_and_a_rerun_completes(
        images, reference, tmp_path, monkeypatch, error):
    out = tmp_path / "store"
    # One lane: with two, the lanes may call the compute in either order on a loaded machine, and the
    # batch that fails would then be the first one submitted, which nothing may commit.
    args = ["extract", "--images", str(images), "--out", str(out), "--detector", "tiny", "--batch-size", "3",
            "--mask-variants", "1", "--threads", "1", "--quiet"]
    batches = failing_on_second_batch(monkeypatch, error)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    first_line = str(error).splitlines()[0]
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"Error: device cpu: {type(error).__name__}: {first_line}; the job stopped" in errors[0]
    with FeatureStore(out) as store:
        assert sorted(store.keys()) == sorted(batches[0])  # the first batch, committed after the error
    assert not any(i in failure for i in batches[1] for failure in stored_failures(out))
    assert verify_store(out).problems == []

    monkeypatch.undo()
    rerun = CliRunner().invoke(main, args)
    assert rerun.exit_code == 0, rerun.output
    assert f"{len(batches[0])} already stored" in rerun.output
    with FeatureStore(reference) as a, FeatureStore(out) as b:
        assert_same_records(a, b)
    assert stored_failures(out) == stored_failures(reference) == ["notes.jpg"]


def test_the_python_api_raises_the_sticky_error_with_its_cause(images, tmp_path, monkeypatch):
    failing_on_second_batch(monkeypatch, STICKY[0])
    with pytest.raises(StickyDeviceError, match="device cpu: RuntimeError: CUDA error: device-side assert "
                                                "triggered; the job stopped") as raised:
        run_extraction(ExtractionConfig(images, "tiny", batch_size=3, progress=False), tmp_path / "store")
    assert raised.value.__cause__ is STICKY[0] and "\n" not in str(raised.value)


def test_debug_shows_the_cuda_errors_traceback(images, tmp_path, monkeypatch):
    failing_on_second_batch(monkeypatch, STICKY[0])
    result = CliRunner().invoke(main, ["--debug", "extract", "--images", str(images), "--out", str(tmp_path / "s"),
                                       "--detector", "tiny", "--batch-size", "3", "--quiet"])
    assert isinstance(result.exception, StickyDeviceError)


# ---- devices under torchrun ------------------------------------------------------------------

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}


@pytest.mark.parametrize("device, env, expected", [
    ("cuda", TORCHRUN, "cuda:1"),
    ("cpu", TORCHRUN, "cpu"),
    ("cuda", {}, "cuda"),
    ("cuda:3", {}, "cuda:3"),
    ("cuda:0", {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, "cuda:0"),  # one process on this node
    ("cuda:0", {"LOCAL_RANK": "0"}, "cuda:0"),  # a launcher that does not say how many: rank 0 may be alone
    ("nonsense", TORCHRUN, "nonsense"),  # left to check_device's message
])
def test_rank_device(device, env, expected):
    assert rank_device(device, env) == expected


@pytest.mark.parametrize("device, made_current", [("cuda:1", [1]), ("cuda", []), ("cpu", [])])
def test_an_indexed_gpu_is_made_current_and_a_bare_cuda_is_the_current_one_already(device, made_current, monkeypatch):
    """torch.cuda.set_device refuses a device without an index (a bare 'cuda' failed every GPU run)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda chosen: calls.append(chosen.index))
    assert use_device(torch.device(device)) == torch.device(device) and calls == made_current


@pytest.mark.parametrize("env", [TORCHRUN, {"LOCAL_RANK": "2"}])
def test_an_explicit_gpu_under_torchrun_with_several_local_ranks_is_refused(env):
    with pytest.raises(DeviceError, match=r"device 'cuda:0' under a launcher with \d processes on this node "
                                          rf"\(LOCAL_RANK={env['LOCAL_RANK']}\): every rank would run on cuda:0; "
                                          "use device cuda"):
        rank_device("cuda:0", env)


def test_launcher_variables_that_are_not_numbers_are_named():
    with pytest.raises(DeviceError, match="LOCAL_RANK='one': expected an integer"):
        rank_device("cuda", {"LOCAL_RANK": "one"})


# ---- devices and precisions this machine lacks, refused through the CLI ---------------------

def fake_cuda(monkeypatch, count=1, bf16=True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0) if bf16 else (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")


def store_state(store):
    with FeatureStore(store) as opened:
        keys = opened.keys()
    return keys, (store / "meta.json").read_text(), (store / "failures.jsonl").read_text()


@pytest.mark.parametrize("options, setup, message", [
    (["--device", "cuda"], lambda mp: mp.setattr(torch.cuda, "is_available", lambda: False),
     "Error: device 'cuda': CUDA is not available on this machine"),
    (["--device", "cuda:2"], lambda mp: fake_cuda(mp, count=2),
     "Error: device 'cuda:2': this machine has 2 CUDA device(s)"),
    (["--device", "cuda:0", "--precision", "bf16"], lambda mp: fake_cuda(mp, bf16=False),
     "Error: precision bf16: Tesla V100-SXM2-16GB (compute capability 7.0) has no native bfloat16"),
    (["--device", "cuda:0"], lambda mp: [mp.setenv(k, v) for k, v in TORCHRUN.items()],
     "Error: device 'cuda:0' under a launcher with 4 processes on this node (LOCAL_RANK=1)"),
], ids=["no-cuda", "no-such-gpu", "no-bf16", "torchrun-explicit-gpu"])
def test_unusable_devices_are_one_line_before_any_work_and_the_store_keeps_everything(
        images, reference, tmp_path, monkeypatch, options, setup, message):
    out = tmp_path / "store"
    shutil.copytree(reference, out)
    before = store_state(out)
    setup(monkeypatch)
    result = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(out), "--detector", "tiny",
                                       "--batch-size", "3", "--mask-variants", "1", "--quiet", *options])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    monkeypatch.undo()
    assert store_state(out) == before
