"""Round trips through npz, TSV and HDF5, the original six-field TSV, and the `vlbert cache` commands."""

import base64
import json
import shutil
import warnings

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store import FeatureStore, FeatureStoreWriter
from extract.store.interop import MEAN_IMAGE_FEATURE, export_store, import_store, spatial_features
from extract.synthetic import write_synthetic_images
from pipelines.cli import main
from pipelines.commands.cache import cache_group
from tests.helpers.stores import QUIET_LOSSES, assert_same_records

# What a format drops is warned about; tested once, in the last test.
# What each format carries besides boxes, features and the image size.
CARRIED = {
    "npz": None,  # everything
    "tsv": ("objects_id", "objects_conf", "attrs_id", "attrs_conf"),
    "h5": ("image_feature",),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("interop")
    write_synthetic_images(root / "images", 5)
    run_extraction(ExtractionConfig(root / "images", "tiny", mask_variants=2, top_k_classes=3, progress=False),
                   root / "store")
    return root / "store"


@QUIET_LOSSES
@pytest.mark.parametrize("fmt", ["npz", "tsv", "h5"])
def test_round_trip(store, tmp_path, fmt):
    exported, imported = tmp_path / f"out.{fmt}", tmp_path / "imported"
    assert export_store(store, fmt, exported) == 5
    assert import_store(exported, fmt, imported) == 5
    with FeatureStore(store) as a, FeatureStore(imported) as b:
        if CARRIED[fmt] is None:
            assert_same_records(a, b)
            assert b.meta["detector"] == a.meta["detector"] and b.meta["mask_variants"]["count"] == 2
            return
        assert a.keys() == b.keys()
        for key in a:
            ra, rb = a[key], b[key]
            for name in ("boxes", "features", "image_h", "image_w", *CARRIED[fmt]):
                assert np.array_equal(ra[name], rb[name]), (key, name)
            if "image_feature" not in CARRIED[fmt]:
                mean = ra["features"].astype(np.float32).mean(axis=0).astype(np.float16)
                assert np.array_equal(rb["image_feature"], mean)
        assert b.meta["features"]["image_feature"] == ("imported" if fmt == "h5" else MEAN_IMAGE_FEATURE)


@QUIET_LOSSES
def test_h5_layout_and_size_from_spatial_features(store, tmp_path):
    export_store(store, "h5", tmp_path / "f.h5")
    with FeatureStore(store) as a, h5py.File(tmp_path / "f.h5", "r+") as f:
        ids = [i.decode() for i in f["image_ids"][:]]
        assert ids == a.keys()
        record = a[ids[2]]
        n = len(record["boxes"])
        assert f["image_features"].shape[1:] == (max(f["num_boxes"][:]), 256)
        np.testing.assert_allclose(f["spatial_features"][2, :n],
                                   spatial_features(record["boxes"], record["image_h"], record["image_w"]))
        x1, y1, x2, y2 = record["boxes"][0]
        assert f["spatial_features"][2, 0, 4] == pytest.approx((x2 - x1) / record["image_w"])
        del f["image_h"], f["image_w"], f["whole_image_features"]  # as the VQA ports write it
    import_store(tmp_path / "f.h5", "h5", tmp_path / "imported")
    with FeatureStore(store) as a, FeatureStore(tmp_path / "imported") as b:
        for key in a:
            assert (b[key]["image_h"], b[key]["image_w"]) == (a[key]["image_h"], a[key]["image_w"])


@QUIET_LOSSES
def test_original_six_field_tsv(tmp_path):
    boxes = np.array([[0, 0, 10, 20], [5, 5, 30, 40]], dtype=np.float32)
    features = np.arange(2 * 8, dtype=np.float32).reshape(2, 8)
    row = ["COCO_1", "64", "48", "2", base64.b64encode(boxes.tobytes()).decode(),
           base64.b64encode(features.tobytes()).decode()]
    (tmp_path / "f.tsv").write_text("\t".join(row) + "\n")
    import_store(tmp_path / "f.tsv", "tsv", tmp_path / "store", feature_dtype="float32")
    with FeatureStore(tmp_path / "store") as store:
        record = store["COCO_1"]
        assert (record["image_w"], record["image_h"]) == (64, 48)
        assert np.array_equal(record["boxes"], boxes) and np.array_equal(record["features"], features)
        assert "objects_id" not in record and store.meta["objects"] is False


def test_malformed_tsv_names_the_line(tmp_path):
    (tmp_path / "f.tsv").write_text("a\tb\tc\n")
    with pytest.raises(ValueError, match=r"f.tsv line 1: 3 tab-separated fields"):
        import_store(tmp_path / "f.tsv", "tsv", tmp_path / "store")


@QUIET_LOSSES
def test_cache_commands(store, tmp_path):
    runner = CliRunner()
    info = runner.invoke(cache_group, ["info", str(store), "--json"])
    assert info.exit_code == 0, info.output
    data = json.loads(info.output)
    assert data["records"] == 5 and data["failures"] == 0 and data["bytes"] > 0
    assert data["meta"]["detector"]["config"]["name"] == "tiny"
    assert runner.invoke(cache_group, ["verify", str(store)]).exit_code == 0

    exported = runner.invoke(cache_group, ["export", str(store), "--format", "tsv", "--out", str(tmp_path / "x.tsv")])
    assert exported.exit_code == 0 and "5 records" in exported.output
    imported = runner.invoke(cache_group, ["import", str(tmp_path / "x.tsv"), "--format", "tsv",
                                           "--out", str(tmp_path / "copy")])
    assert imported.exit_code == 0, imported.output

    # A record with a NaN makes verify fail and say where.
    with FeatureStore(tmp_path / "copy") as copy:
        record, meta = copy["image0000"], copy.meta
    record["features"][0, 0] = np.inf
    with FeatureStoreWriter(tmp_path / "copy", meta) as writer:
        writer.commit({"image0000": record})
    failed = runner.invoke(cache_group, ["verify", str(tmp_path / "copy")])
    assert failed.exit_code == 1 and "image0000: features: 1 NaN or Inf value(s)" in failed.output


def test_export_and_import_warn_field_by_field_what_the_format_cannot_carry(store, tmp_path):
    with pytest.warns(UserWarning) as exported:
        export_store(store, "tsv", tmp_path / "x.tsv")
    assert sorted(str(w.message).split(": not exported: ")[1] for w in exported) == [
        f"the {what}; the tsv format does not carry it"
        for what in ("class distributions", "detector config", "masked-pixel variants", "whole-image feature")]
    with pytest.warns(UserWarning) as imported:
        import_store(tmp_path / "x.tsv", "tsv", tmp_path / "from-tsv")
    assert len(imported) == 4 and all(str(w.message).endswith("the tsv format does not carry it") for w in imported)

    with pytest.warns(UserWarning, match="the h5 format does not carry it"):
        export_store(store, "h5", tmp_path / "x.h5")
    result = CliRunner().invoke(main, ["cache", "import", str(tmp_path / "x.h5"), "--format", "h5",
                                       "--out", str(tmp_path / "from-h5")])
    shown = [line for line in result.output.splitlines() if line.startswith("Warning:")]
    assert result.exit_code == 0 and len(shown) == 5, result.output
    assert (f"Warning: {tmp_path / 'x.h5'}: imported without objects_id/objects_conf (no detected classes per box); "
            "the h5 format does not carry it") in shown
    with warnings.catch_warnings(record=True) as none:  # an npz export carries everything: nothing to warn about
        warnings.simplefilter("always")
        export_store(store, "npz", tmp_path / "npz")
        import_store(tmp_path / "npz", "npz", tmp_path / "from-npz")
    assert [str(w.message) for w in none] == []


@QUIET_LOSSES
def test_tsv_round_trip_of_ids_with_a_newline_a_tab_and_backslashes(tmp_path):
    """Legal file names that a TSV field cannot hold as they are: escaped on export, unescaped on import."""
    images = tmp_path / "images"
    write_synthetic_images(images, 1, subdir_every=0)
    for name in ("new\nline", "tab\there", "back\\slash", "back\\nslash"):  # the last: a backslash, then n
        shutil.copyfile(images / "image0000.png", images / f"{name}.png")
    run_extraction(ExtractionConfig(images, "tiny", progress=False), tmp_path / "store")
    runner = CliRunner()
    exported = runner.invoke(main, ["cache", "export", str(tmp_path / "store"), "--format", "tsv",
                                    "--out", str(tmp_path / "x.tsv")])
    assert exported.exit_code == 0, exported.output
    assert (f"Warning: {tmp_path / 'x.tsv'}: 4 image id(s) hold a tab, line break or backslash "
            "(e.g. 'back\\\\nslash'); written with the escapes \\t \\n \\r \\\\, which `vlbert cache import` "
            "reverses and other readers keep as they are") in exported.output
    lines = (tmp_path / "x.tsv").read_text().split("\n")
    assert len(lines) == 6 and lines[-1] == "" and all(len(line.split("\t")) == 10 for line in lines[:-1])
    assert sorted(line.split("\t")[0] for line in lines[:-1]) == [
        "back\\\\nslash", "back\\\\slash", "image0000", "new\\nline", "tab\\there"]

    imported = runner.invoke(main, ["cache", "import", str(tmp_path / "x.tsv"), "--format", "tsv",
                                    "--out", str(tmp_path / "copy")])
    assert imported.exit_code == 0 and "5 records" in imported.output, imported.output
    with FeatureStore(tmp_path / "store") as a, FeatureStore(tmp_path / "copy") as b:
        assert b.keys() == a.keys() and "new\nline" in b and "tab\there" in b
        for key in a:
            assert np.array_equal(a[key]["features"], b[key]["features"]), key
    verified = runner.invoke(main, ["cache", "verify", str(tmp_path / "copy")])
    assert verified.exit_code == 0 and "OK (5 records, 5 checksums match)" in verified.output
