"""The extraction job's Python API and `vlbert extract`: records, failures, resume, refusal, shards, masks."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from extract import Detector
from extract.backends import build_extractor
from extract.extraction_config import ExtractionConfig
from extract.job import JobError, run_extraction
from extract.masking import draw_masks
from extract.modeling.res5_layouts import Res5LayoutError
from extract.store import FeatureStore, StoreMismatchError
from extract.store.audit import verify_store
from extract.synthetic import write_synthetic_images
from pipelines.cli import main
from tests.helpers.detection import image_folder
from tests.helpers.stores import assert_same_records
from vlbert.utils.precision import PrecisionError
from vlbert.utils.threads import MAX_DEFAULT_LANES, configured_threads

MASKED = dict(mask_variants=2, mask_prob=0.3, mask_seed=7)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = image_folder(tmp_path_factory.mktemp("images"), 10)
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)  # truncated
    return root


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory):
    """One uninterrupted masked-variant run: batch size 4, a single shard."""
    out = tmp_path_factory.mktemp("reference") / "store"
    summary = run_extraction(ExtractionConfig(images, "tiny", batch_size=4, progress=False, **MASKED), out)
    return out, summary


def test_run_writes_every_image_and_records_bad_files(images, reference):
    out, summary = reference
    assert (summary.images, summary.written, summary.failed, summary.skipped) == (12, 10, 2, 0)
    with FeatureStore(out) as store:
        assert len(store) == 10 and "nested/image0003" in store
        record = store["image0000"]
        n = len(record["boxes"])
        assert record["features"].shape == (n, 256) and record["features"].dtype == np.float16
        assert record["image_feature"].shape == (256,)
        assert record["masked_features"].shape == (2, n, 256) and record["mask_boxes"].shape == (2, n)
        assert record["mask_boxes"].any(axis=1).all()
        assert record["class_probs"].shape == (n, 7)  # tiny: 6 classes + background, fewer than k=10
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert sorted(f["image"] for f in failures) == ["broken.png", "notes.jpg"]
    assert all("not an image" in f["error"] or "truncated" in f["error"] for f in failures)
    assert verify_store(out).problems == []


def test_stored_numbers_are_the_detectors(images, reference, tiny_detector):
    """The record holds exactly what detect() and describe() with the stored masks return, computed
    as the job computes on the CPU: single-threaded ops (a thread count changes the last bits)."""
    from extract import load_image

    out, _ = reference
    with configured_threads(1):
        prepared = tiny_detector.prepare(load_image(images / "image0001.png"))
        regions = tiny_detector.detect([prepared])[0].numpy()
        masks = draw_masks("image0001", len(regions["boxes"]), 2, 0.3, 7)
        masked = tiny_detector.describe([prepared], [regions["boxes"]], [masks[1]])[0].numpy()
    with FeatureStore(out) as store:
        record = store["image0001"]
    np.testing.assert_array_equal(record["boxes"], regions["boxes"])
    np.testing.assert_array_equal(record["features"], regions["features"].astype(np.float16))
    np.testing.assert_array_equal(record["mask_boxes"], masks)
    np.testing.assert_array_equal(record["masked_features"][1], masked["features"].astype(np.float16))
    np.testing.assert_array_equal(record["masked_image_feature"][1], masked["image_feature"].astype(np.float16))


def test_masked_variants_do_not_depend_on_batch_order_or_shard(images, reference, tmp_path):
    out = tmp_path / "sharded"
    for index in (1, 0):  # the shards in the other order, other batch sizes
        run_extraction(ExtractionConfig(images, "tiny", batch_size=3 - index, shard=(index, 2), progress=False,
                                        **MASKED), out)
    with FeatureStore(reference[0]) as a, FeatureStore(out) as b:
        assert len(b.shards) == 2
        assert_same_records(a, b)


def test_rerun_skips_stored_images_and_retries_failures(images, reference, tmp_path):
    out, moved = tmp_path / "store", tmp_path / "images"
    shutil.copytree(reference[0], out)
    shutil.copytree(images, moved)  # the store does not depend on where the images root is
    (moved / "notes.jpg").rename(moved / "fixed.jpg")
    write_synthetic_images(tmp_path / "extra", 1, seed=5)[0].rename(moved / "notes.png")
    summary = run_extraction(ExtractionConfig(moved, "tiny", batch_size=4, progress=False, **MASKED), out)
    assert (summary.skipped, summary.written, summary.failed) == (10, 1, 2)  # notes.png; broken.png, fixed.jpg
    failures = [json.loads(line)["image"] for line in (out / "failures.jsonl").read_text().splitlines()]
    assert failures == ["broken.png", "fixed.jpg"]


def test_resume_with_other_settings_is_refused(images, reference, tmp_path):
    out = tmp_path / "store"
    shutil.copytree(reference[0], out)
    with pytest.raises(StoreMismatchError, match="score_thresh"):
        run_extraction(ExtractionConfig(images, "tiny", overrides={"score_thresh": 0.5}, progress=False, **MASKED), out)
    checkpoint = tmp_path / "tiny.pth"
    import torch

    torch.save(Detector.build("tiny").state_dict(), checkpoint)
    with pytest.raises(StoreMismatchError, match="checkpoint_sha256"):
        run_extraction(ExtractionConfig(images, "tiny", weights=checkpoint, progress=False, **MASKED), out)
    with FeatureStore(out) as store:
        assert len(store) == 10  # nothing lost


def test_masked_variants_of_regressed_boxes_are_refused_before_writing(images, tmp_path):
    with pytest.raises(JobError, match="box_source=proposals"):
        run_extraction(ExtractionConfig(images, "tiny", overrides={"box_source": "regressed"}, mask_variants=1,
                                        progress=False), tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_given_boxes_keep_their_order(images, tmp_path):
    boxes = {"image0000.png": [[40, 5, 60, 30], [0, 0, 20, 20], [10, 10, 50, 50]],
             "image0002.png": [[5, 5, 30, 30]],
             "image0004.png": [[30, 30, 10, 10]],  # inverted: this image fails, the others go on
             "missing.png": [[0, 0, 5, 5]]}
    (tmp_path / "boxes.json").write_text(json.dumps(boxes))
    summary = run_extraction(ExtractionConfig(images, "tiny", boxes=tmp_path / "boxes.json", progress=False,
                                              top_k_classes=3), tmp_path / "store")
    assert (summary.written, summary.failed) == (2, 2)
    with FeatureStore(tmp_path / "store") as store:
        record = store["image0000"]
        assert store.meta["mode"] == "given" and record["box_source"] == "given"
        np.testing.assert_array_equal(record["boxes"], np.array(boxes["image0000.png"], dtype=np.float32))
        assert record["class_topk_id"].shape == (3, 3) and record["class_topk_prob"].dtype == np.float16
    errors = {f["image"]: f["error"] for f in map(json.loads, (tmp_path / "store/failures.jsonl").open())}
    assert "inverted" in errors["image0004.png"] and "no such file" in errors["missing.png"]


def test_torchrun_environment_picks_the_shard(images, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    summary = run_extraction(ExtractionConfig(images, "tiny", progress=False), tmp_path / "store")
    assert summary.shard == (1, 3) and 0 < summary.images < 12
    assert [p.name for p in (tmp_path / "store/shards").iterdir() if p.is_dir()] == ["shard-00001-of-00003"]


def test_cli_extracts_and_refuses_mismatch(images, tmp_path):
    out = tmp_path / "store"
    args = ["--images", str(images), "--out", str(out), "--detector", "tiny", "--quiet",
            "--feature-dtype", "float32", "--top-k-classes", "all", "--batch-size", "5"]
    result = CliRunner().invoke(main, ["extract", *args])
    assert result.exit_code == 0, result.output
    assert "10 written, 2 failed" in result.output
    with FeatureStore(out) as store:
        record = store["image0000"]
        assert record["features"].dtype == np.float32 and record["class_probs"].shape[1] == 7
    strict = CliRunner().invoke(main, ["extract", *args, "--strict"])
    assert strict.exit_code == 1 and "2 image(s) failed" in strict.output
    refused = CliRunner().invoke(main, ["extract", *args, "--set", "max_boxes=5"])
    assert refused.exit_code == 2 and "max_boxes: store has 20, this run has 5" in refused.output
    assert "Traceback" not in refused.output


def test_boxes_file_keys_outside_the_images_folder_are_refused_per_image(images, tmp_path):
    write_synthetic_images(tmp_path / "outside", 1)
    secret = tmp_path / "outside" / "image0000.png"
    # A `..` step is refused wherever it is (through a symlinked folder it leads elsewhere); `.` steps are not.
    boxes = {"../outside/image0000.png": [[0, 0, 5, 5]], str(secret): [[0, 0, 5, 5]],
             "image0000.png": [[0, 0, 20, 20]], "nested/../image0001.png": [[0, 0, 5, 5]],
             "./image0001.png": [[0, 0, 20, 20]]}
    (tmp_path / "boxes.json").write_text(json.dumps(boxes))
    config = ExtractionConfig(images, "tiny", boxes=tmp_path / "boxes.json", progress=False)
    summary = run_extraction(config, tmp_path / "store")
    assert (summary.written, summary.failed) == (2, 3)
    with FeatureStore(tmp_path / "store") as store:
        assert store.keys() == ["image0000", "image0001"]
    errors = {f["image"]: f["error"] for f in map(json.loads, (tmp_path / "store/failures.jsonl").open())}
    assert sorted(errors) == sorted(["../outside/image0000.png", str(secret), "nested/../image0001.png"])
    assert all("would make a path outside" in error for error in errors.values())


def test_an_empty_images_folder_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    result = CliRunner().invoke(main, ["extract", "--images", str(tmp_path / "empty"), "--out",
                                       str(tmp_path / "store"), "--detector", "tiny"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Error: {tmp_path / 'empty'}: no image files (looked for .jpg, .jpeg, .png" in result.output
    assert not (tmp_path / "store").exists()


def test_an_image_list_extracts_only_the_images_it_names_once_each(images, tmp_path):
    (tmp_path / "images.txt").write_text("image0001.png\nimage0000.png\n\nimage0001.png\n../outside.png\n")
    result = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(tmp_path / "store"),
                                       "--detector", "tiny", "--list", str(tmp_path / "images.txt"), "--quiet"])
    assert result.exit_code == 0, result.output
    with FeatureStore(tmp_path / "store") as store:
        assert store.keys() == ["image0000", "image0001"]
    errors = [json.loads(line) for line in (tmp_path / "store" / "failures.jsonl").open()]
    assert [(e["image"], "would make a path outside" in e["error"]) for e in errors] == [("../outside.png", True)]
    (tmp_path / "empty.txt").write_text("\n")
    empty = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(tmp_path / "store2"),
                                      "--detector", "tiny", "--list", str(tmp_path / "empty.txt")])
    assert empty.exit_code == 2 and f"Error: image list {tmp_path / 'empty.txt'}: lists no images" in empty.output


@pytest.mark.parametrize("option, default, other", [("precision", "fp32", "bf16"),
                                                     ("res5_layout", "dilated", "polyphase"),
                                                     ("speed_paths", [], ["batched-rpn"])])
def test_an_option_is_recorded_and_a_store_from_before_it_was_resumes_with_its_default(
        option, default, other, images, reference, tmp_path):
    out = tmp_path / "store"
    shutil.copytree(reference[0], out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["detector"][option] == default
    del meta["detector"][option]  # as written before the option existed
    (out / "meta.json").write_text(json.dumps(meta))
    assert run_extraction(ExtractionConfig(images, "tiny", progress=False, **MASKED), out).skipped == 10
    with pytest.raises(StoreMismatchError) as refused:
        run_extraction(ExtractionConfig(images, "tiny", progress=False, **MASKED,
                                        **{option: tuple(other) if isinstance(other, list) else other}), out)
    mismatches = str(refused.value).splitlines()[1:]  # under a line that says the store was written otherwise
    assert mismatches == [f"  detector.{option}: store has {default!r}, this run has {other!r} (the store is older "
                          "than this entry: taken to have had it so)"]


def test_a_polyphase_res5_is_recorded_and_stores_the_dilated_numbers_up_to_rounding(images, tmp_path):
    (tmp_path / "three.txt").write_text("image0000.png\nimage0001.png\nnested/image0003.png\n")
    stores = {layout: tmp_path / layout for layout in ("dilated", "polyphase")}
    for layout, out in stores.items():
        run_extraction(ExtractionConfig(images, "tiny", res5_layout=layout, feature_dtype="float32",
                                        image_list=tmp_path / "three.txt", progress=False, **MASKED), out)
        assert json.loads((out / "meta.json").read_text())["detector"]["res5_layout"] == layout
    with FeatureStore(stores["dilated"]) as dilated, FeatureStore(stores["polyphase"]) as polyphase:
        assert len(dilated) == 3 and dilated.keys() == polyphase.keys()
        for key in dilated:
            a, b = dilated[key], polyphase[key]
            np.testing.assert_array_equal(b["boxes"], a["boxes"])
            for name in ("features", "image_feature", "masked_features", "masked_image_feature"):
                assert a[name].dtype == np.float32
                np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-5, err_msg=f"{key} {name}")


@pytest.mark.parametrize("arguments, error", [
    (["--res5-layout", "polyphase", "--set", "res5_stride=2", "--set", "res5_dilation=1"],
     "Error: res5 layout polyphase does not apply to detector tiny: res5 has stride 2 and dilation 1; it needs "
     "stride 1 and dilation 2 or more (the BUTD layout)"),
    (["--res5-layout", "strided"], "Error: Invalid value for '--res5-layout': 'strided' is not one of "),
])
def test_a_res5_layout_that_does_not_apply_is_refused_in_one_line_before_anything_is_written(
        arguments, error, images, tmp_path):
    result = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(tmp_path / "store"),
                                       "--detector", "tiny", *arguments])
    assert result.exit_code == 2 and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and errors[0].startswith(error), result.output
    assert not (tmp_path / "store").exists()
    with pytest.raises(JobError, match="res5_layout 'strided': expected one of dilated, polyphase"):
        run_extraction(ExtractionConfig(images, "tiny", res5_layout="strided", progress=False), tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_a_store_from_before_resnext_groups_resumes_as_one_group(images, reference, tmp_path):
    out = tmp_path / "store"
    shutil.copytree(reference[0], out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["detector"]["config"]["num_groups"] == 1
    del meta["detector"]["config"]["num_groups"]  # as written before the config had groups
    (out / "meta.json").write_text(json.dumps(meta))
    assert run_extraction(ExtractionConfig(images, "tiny", progress=False, **MASKED), out).skipped == 10
    with pytest.raises(StoreMismatchError, match="detector.config.num_groups: store has 1, this run has 2"):
        run_extraction(ExtractionConfig(images, "tiny", overrides={"num_groups": 2}, progress=False, **MASKED), out)


def test_the_cpu_kernel_families_that_wrote_a_store_are_recorded_and_a_store_from_before_gets_none(
        images, reference, tmp_path, monkeypatch):
    out = tmp_path / "store"
    shutil.copytree(reference[0], out)
    meta_file = out / "meta.json"
    native = torch.backends.cpu.get_cpu_capability()
    assert json.loads(meta_file.read_text())["cpu_capabilities"] == [native]
    other = "AVX2" if native != "AVX2" else "DEFAULT"
    monkeypatch.setattr("extract.job.cpu_capability", lambda: other)  # a resume on a CPU of another family
    for _ in range(2):
        assert run_extraction(ExtractionConfig(images, "tiny", progress=False, **MASKED), out).skipped == 10
        assert json.loads(meta_file.read_text())["cpu_capabilities"] == [native, other]
    meta = json.loads(meta_file.read_text())
    del meta["cpu_capabilities"]  # as written before the record: its records' families are unknown
    meta_file.write_text(json.dumps(meta))
    assert run_extraction(ExtractionConfig(images, "tiny", progress=False, **MASKED), out).skipped == 10
    assert "cpu_capabilities" not in json.loads(meta_file.read_text())


def test_a_precision_the_device_cannot_run_is_refused_before_anything_is_written(images, tmp_path):
    result = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(tmp_path / "store"),
                                       "--detector", "tiny", "--precision", "tf32", "--device", "cpu"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Error: precision tf32: TensorFloat-32 exists on CUDA devices only" in result.output
    assert not (tmp_path / "store").exists()


def test_the_detectron2_backend_refuses_other_precisions_whether_or_not_it_is_installed():
    with pytest.raises(PrecisionError, match="--detector d2:model.yaml: the detectron2 backend runs in fp32 only, not bf16"):
        build_extractor("d2:model.yaml", precision="bf16")
    with pytest.raises(Res5LayoutError, match=r"--detector d2:model.yaml: the detectron2 backend runs res5 as built "
                                              r"\(dilated\) only, not polyphase"):
        build_extractor("d2:model.yaml", res5_layout="polyphase")


def test_stored_numbers_do_not_depend_on_the_number_of_compute_lanes(images, reference, tmp_path):
    out = tmp_path / "lanes"
    summary = run_extraction(ExtractionConfig(images, "tiny", batch_size=2, threads=3, progress=False, **MASKED), out)
    assert summary.threads == 3
    with FeatureStore(reference[0]) as a, FeatureStore(out) as b:
        assert_same_records(a, b)


def test_a_lane_per_core_unless_the_user_sets_a_count_and_the_callers_count_is_restored(images, tmp_path,
                                                                                        monkeypatch):
    (tmp_path / "one.txt").write_text("image0000.png\n")
    before = torch.get_num_threads()

    def extract(out, *options):
        return CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(tmp_path / out),
                                         "--detector", "tiny", "--list", str(tmp_path / "one.txt"), "--quiet",
                                         "--workers", "0", *options])

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = min(len(os.sched_getaffinity(0)), MAX_DEFAULT_LANES)
    assert f"{cores} CPU thread(s)" in extract("default").output
    assert "3 CPU thread(s)" in extract("option", "--threads", "3").output
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert "2 CPU thread(s)" in extract("variable").output
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    refused = extract("refused")
    assert refused.exit_code == 2
    assert refused.output.strip() == "Error: OMP_NUM_THREADS='many': expected a positive number of threads"
    assert torch.get_num_threads() == before
