"""`cache import` of the feature files other projects write, each written here as that project's
writer lays it out (field names, dtypes, compression, pickled parts): bottom-up-attention.pytorch's
npz, VL-BERT's JSON, hengyuan-hu's h5 with its imgid2idx.pkl, MMF's npy and LMDB, UNITER's img_db,
VinVL's TSV. Each import is compared value by value; each kind of bad file is named in one line."""

import base64
import io
import json
import pickle
import zipfile

import h5py
import lmdb
import msgpack
import numpy as np
import pytest

from extract.store import FeatureStore
from extract.store.formats.common import MEAN_IMAGE_FEATURE, NOMINAL_IMAGE_SIZE
from extract.store.interop import import_store, spatial_features
from extract.store.schema import StoreError
from tests.extract.test_untrusted_inputs import RunsAShellCommand, invoke
from tests.helpers.stores import QUIET_LOSSES
from tests.helpers.worlds import run_config
from train.engine.config import RunConfigError, StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from vlbert.utils.errors import USAGE

pytestmark = QUIET_LOSSES  # what each format lacks is warned about; tested in test_what_a_format_lacks_is_named

DIM, BOXES, CLASSES, ATTRIBUTES = 2048, 5, 11, 7
IDS = ("9", "25", "42")


def source_images(dim: int = DIM) -> list[dict]:
    """What a detector gave for three images: boxes in pixels, float32 features and probabilities."""
    rng = np.random.default_rng(0)
    images = []
    for i, image_id in enumerate(IDS):
        height, width = 60 + 10 * i, 80 + 20 * i
        x1, y1 = rng.uniform(0, width / 2, BOXES), rng.uniform(0, height / 2, BOXES)
        boxes = np.stack([x1, y1, x1 + rng.uniform(2, width / 2, BOXES), y1 + rng.uniform(2, height / 2, BOXES)], 1)
        probs = rng.dirichlet(np.ones(CLASSES), BOXES).astype(np.float32)
        attributes = rng.dirichlet(np.ones(ATTRIBUTES), BOXES).astype(np.float32)
        images.append(dict(id=image_id, h=height, w=width, boxes=boxes.astype(np.float32),
                           features=rng.random((BOXES, dim), dtype=np.float32), whole=rng.random(dim, dtype=np.float32),
                           probs=probs, attributes=attributes))
    return images


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode()


def imported(src, fmt, out, **files) -> dict[str, dict]:
    assert import_store(src, fmt, out, **files) == len(IDS)
    with FeatureStore(out) as store:
        return {"meta": store.meta, **{image_id: store[image_id] for image_id in store.keys()}}


def assert_fields(record: dict, expected: dict) -> None:
    for name, value in expected.items():
        assert np.array_equal(record[name], value), name
        if isinstance(value, np.ndarray):
            assert record[name].dtype == value.dtype, name


def basics(image: dict) -> dict:
    """What every format carries as the store keeps it: boxes, float16 features, the image size."""
    return {"boxes": image["boxes"], "features": image["features"].astype(np.float16), "image_h": image["h"],
            "image_w": image["w"]}


def mean_feature(image: dict) -> np.ndarray:
    return image["features"].mean(axis=0).astype(np.float16)


def refused(src, fmt, out, **files) -> str:
    """The one line an import of a bad file stops with; nothing is left at `out`."""
    with pytest.raises(StoreError) as error:
        import_store(src, fmt, out, **files)
    assert "\n" not in str(error.value) and not out.exists()
    return str(error.value)


# ---- bottom-up-attention.pytorch: per-image npz, `info` pickled ------------------------------------

def write_bua_npz(folder, images, info=lambda image: None):
    """As its utils/extract_utils.py `save_roi_features`: savez_compressed, the info dict pickled."""
    folder.mkdir(parents=True, exist_ok=True)
    for image in images:
        probs, attributes = image["probs"], image["attributes"]
        default = {"image_id": image["id"], "image_h": image["h"], "image_w": image["w"], "num_boxes": BOXES,
                   "objects_id": probs.argmax(1), "objects_conf": probs.max(1),
                   "attrs_id": attributes.argmax(1), "attrs_conf": attributes.max(1)}
        np.savez_compressed(folder / image["id"], x=image["features"], bbox=image["boxes"], num_bbox=BOXES,
                            image_h=image["h"], image_w=image["w"], info=info(image) or default)


def test_bua_npz_imports_value_by_value(tmp_path):
    images = source_images()
    write_bua_npz(tmp_path / "npz", images)
    store = imported(tmp_path / "npz", "bua-npz", tmp_path / "store")
    for image in images:
        probs, attributes = image["probs"], image["attributes"]
        assert_fields(store[image["id"]], {**basics(image), "image_feature": mean_feature(image),
                                           "objects_id": probs.argmax(1), "objects_conf": probs.max(1),
                                           "attrs_id": attributes.argmax(1), "attrs_conf": attributes.max(1)})
    meta = store["meta"]
    assert meta["objects"] and meta["attributes"] and meta["class_probs"] is None
    assert meta["features"]["image_feature"] == MEAN_IMAGE_FEATURE and meta["source"].startswith("bua-npz:")


def test_bua_npz_bad_files_are_named(tmp_path):
    images = source_images(dim=8)
    write_bua_npz(tmp_path / "ok", images)
    np.savez_compressed(tmp_path / "ok" / "25", bbox=images[1]["boxes"], image_h=70, image_w=100)
    assert refused(tmp_path / "ok", "bua-npz", tmp_path / "a") == (
        f"{tmp_path / 'ok' / '25.npz'}: no x array (the RoI features)")

    np.savez_compressed(tmp_path / "ok" / "25", x=images[1]["features"], bbox=np.zeros((BOXES, 5), np.float32),
                        image_h=70, image_w=100)
    assert refused(tmp_path / "ok", "bua-npz", tmp_path / "b") == (
        f"{tmp_path / 'ok' / '25.npz'}: bbox holds float32 values of shape (5, 5), expected numbers of shape (N, 4)")

    write_bua_npz(tmp_path / "ok", images)  # the last file without attributes, unlike the first
    write_bua_npz(tmp_path / "ok", images[:1], info=lambda image: {"objects_id": np.zeros(BOXES, np.int64),
                                                                   "objects_conf": np.ones(BOXES, np.float32)})
    assert refused(tmp_path / "ok", "bua-npz", tmp_path / "c") == (
        f"{tmp_path / 'ok'} file 9.npz: missing field attrs_id; missing field attrs_conf (every record of a store holds "
        "the fields and shapes that its meta.json names: here, those of the source's first record)")

    marker = tmp_path / "ran"
    write_bua_npz(tmp_path / "evil", images, info=lambda image: {"objects_id": RunsAShellCommand(marker)})
    message = refused(tmp_path / "evil", "bua-npz", tmp_path / "d")
    assert message.startswith(f"{tmp_path / 'evil' / '25.npz'} info.npy: refused to load posix.system")
    assert not marker.exists()


# ---- VL-BERT: per-image base64 JSON, a folder or a zip ---------------------------------------------

def vlbert_json(image: dict, whole: bool = True) -> str:
    """As the generate_tsv_v2.py of VL-BERT's bottom-up-attention fork writes one image."""
    data = {"image_id": int(image["id"]), "image_h": image["h"], "image_w": image["w"], "num_boxes": BOXES,
            "boxes": b64(image["boxes"]), "classes": b64(image["probs"]), "attrs": b64(image["attributes"]),
            "features": b64(image["features"])}
    if whole:
        data["image_box_feature"] = b64(image["whole"])
    return json.dumps(data)


def test_vlbert_json_folder_and_zip(tmp_path):
    images = source_images()
    (tmp_path / "folder").mkdir()
    for image in images:
        (tmp_path / "folder" / f"{image['id']}.json").write_text(vlbert_json(image, whole=False))
    with zipfile.ZipFile(tmp_path / "trainval.zip", "w") as archive:
        for image in images:
            archive.writestr(f"trainval/{image['id']}.json", vlbert_json(image))

    for src, whole in ((tmp_path / "folder", False), (tmp_path / "trainval.zip", True)):
        store = imported(src, "vlbert-json", tmp_path / f"{src.stem}.store")
        for image in images:
            expected_whole = image["whole"].astype(np.float16) if whole else mean_feature(image)
            assert_fields(store[image["id"]], {**basics(image), "image_feature": expected_whole,
                                               "class_probs": image["probs"].astype(np.float16)})
        meta = store["meta"]
        assert meta["class_probs"] == {"num_classes": CLASSES, "top_k": None} and not meta["objects"]
        assert meta["features"]["image_feature"] == ("imported" if whole else MEAN_IMAGE_FEATURE)


def test_vlbert_json_bad_files_are_named(tmp_path):
    images = source_images(dim=8)
    (tmp_path / "a").mkdir()
    data = json.loads(vlbert_json(images[0]))
    (tmp_path / "a" / "9.json").write_text(json.dumps({**data, "features": data["features"][:-7]}))
    assert refused(tmp_path / "a", "vlbert-json", tmp_path / "x").startswith(
        f"{tmp_path / 'a'} file 9.json: features is not base64 (")
    (tmp_path / "a" / "9.json").write_text(json.dumps({**data, "features": data["features"][:-8]}))
    assert refused(tmp_path / "a", "vlbert-json", tmp_path / "x") == (
        f"{tmp_path / 'a'} file 9.json: features holds 156 bytes, not 5 x D float32 values (truncated?)")
    del data["num_boxes"]
    (tmp_path / "a" / "9.json").write_text(json.dumps(data))
    assert refused(tmp_path / "a", "vlbert-json", tmp_path / "x") == f"{tmp_path / 'a'} file 9.json: no num_boxes"


# ---- hengyuan-hu's h5: rows only, the ids in imgid2idx.pkl -------------------------------------------

def write_vqa_h5(path, images, order):
    """As tools/detection_features_converter.py: fixed boxes per row, no ids, no image sizes."""
    with h5py.File(path, "w") as f:
        features = f.create_dataset("image_features", (len(images), BOXES, DIM), "f")
        boxes = f.create_dataset("image_bb", (len(images), BOXES, 4), "f")
        spatial = f.create_dataset("spatial_features", (len(images), BOXES, 6), "f")
        for row, image in zip(order, images):
            features[row], boxes[row] = image["features"], image["boxes"]
            spatial[row] = spatial_features(image["boxes"], image["h"], image["w"])


def test_h5_with_its_ids_in_a_pickle_or_json(tmp_path):
    images, order = source_images(), (2, 0, 1)
    write_vqa_h5(tmp_path / "train36.hdf5", images, order)
    index = {int(image["id"]): row for row, image in zip(order, images)}
    (tmp_path / "train36_imgid2idx.pkl").write_bytes(pickle.dumps(index, protocol=0))  # as Python 2's cPickle.dump
    (tmp_path / "ids.json").write_text(json.dumps({str(k): v for k, v in index.items()}))
    for ids in (tmp_path / "train36_imgid2idx.pkl", tmp_path / "ids.json"):
        store = imported(tmp_path / "train36.hdf5", "h5", tmp_path / ids.stem, ids=ids)
        for image in images:
            assert_fields(store[image["id"]], {**basics(image), "image_feature": mean_feature(image)})


def test_h5_ids_files_that_do_not_fit_are_named(tmp_path):
    images = source_images()
    write_vqa_h5(tmp_path / "f.hdf5", images, (0, 1, 2))
    message = refused(tmp_path / "f.hdf5", "h5", tmp_path / "a")
    assert message.startswith(f"{tmp_path / 'f.hdf5'}: missing dataset(s) image_ids (or give --ids FILE")
    (tmp_path / "two.pkl").write_bytes(pickle.dumps({9: 0, 25: 1}, protocol=0))
    assert refused(tmp_path / "f.hdf5", "h5", tmp_path / "b", ids=tmp_path / "two.pkl") == (
        f"{tmp_path / 'two.pkl'}: names 2 of the HDF5 file's 3 rows (row 2 has no image id)")
    marker = tmp_path / "ran"
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({9: RunsAShellCommand(marker)}))
    assert refused(tmp_path / "f.hdf5", "h5", tmp_path / "c", ids=tmp_path / "evil.pkl").startswith(
        f"{tmp_path / 'evil.pkl'}: refused to load posix.system")
    assert not marker.exists()


# ---- MMF: <id>.npy + <id>_info.npy, and its LMDB of pickled dicts --------------------------------------

def mmf_info(image: dict) -> dict:
    """The info dict of extract_features_vmb.py (without --background: no background column)."""
    return {"bbox": image["boxes"], "num_boxes": BOXES, "objects": image["probs"].argmax(1), "cls_prob": image["probs"],
            "image_width": image["w"], "image_height": image["h"]}


def mmf_expected(image: dict) -> dict:
    probs = image["probs"]
    return {**basics(image), "image_feature": mean_feature(image), "class_probs": probs.astype(np.float16),
            "objects_id": probs.argmax(1), "objects_conf": probs.max(1)}


def write_mmf_lmdb(path, items: dict[str, object]):
    """As lmdb_conversion.py --mode convert: each image's dict pickled, the key list under b"keys"."""
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, item in items.items():
            txn.put(key.encode(), pickle.dumps(item))
        txn.put(b"keys", pickle.dumps([key.encode() for key in items]))
    env.close()


def test_mmf_npy_and_lmdb(tmp_path):
    images = source_images()
    (tmp_path / "npy").mkdir()
    for image in images:
        np.save(tmp_path / "npy" / f"{image['id']}.npy", image["features"])
        np.save(tmp_path / "npy" / f"{image['id']}_info.npy", mmf_info(image))
    write_mmf_lmdb(tmp_path / "coco.lmdb", {image["id"]: {"feature_path": image["id"], "features": image["features"],
                                                          **mmf_info(image)} for image in images})
    for src, fmt in ((tmp_path / "npy", "mmf-npy"), (tmp_path / "coco.lmdb", "mmf-lmdb")):
        store = imported(src, fmt, tmp_path / fmt)
        for image in images:
            assert_fields(store[image["id"]], mmf_expected(image))
        assert store["meta"]["class_probs"]["num_classes"] == CLASSES and not store["meta"]["attributes"]


def test_mmf_bad_files_are_named(tmp_path):
    images = source_images(dim=8)
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "9.npy", images[0]["features"])
    assert refused(tmp_path / "npy", "mmf-npy", tmp_path / "a") == (
        f"{tmp_path / 'npy' / '9.npy'}: no 9_info.npy beside it (MMF keeps the boxes and the image size there)")
    info = mmf_info(images[0])
    del info["bbox"]
    np.save(tmp_path / "npy" / "9_info.npy", info)
    assert refused(tmp_path / "npy", "mmf-npy", tmp_path / "b") == (
        f"{tmp_path / 'npy' / '9.npy'} (with 9_info.npy): no bbox (MMF writes it from the image's _info.npy)")

    marker = tmp_path / "ran"
    write_mmf_lmdb(tmp_path / "evil.lmdb", {"9": {"features": RunsAShellCommand(marker)}})
    assert refused(tmp_path / "evil.lmdb", "mmf-lmdb", tmp_path / "c").startswith(
        f"{tmp_path / 'evil.lmdb'} key b'9': refused to load posix.system")
    assert not marker.exists()


# ---- UNITER: img_db LMDB of msgpack_numpy maps (or savez_compressed bytes) --------------------------------

def msgpack_numpy_array(array: np.ndarray) -> dict:
    """An array as msgpack_numpy's `encode` writes it."""
    return {b"nd": True, b"type": array.dtype.str, b"kind": b"", b"shape": list(array.shape), b"data": array.tobytes()}


def uniter_dump(image: dict) -> dict[str, np.ndarray]:
    """convert_imgdir.py's arrays of one image, float32 narrowed to float16."""
    fractions = spatial_features(image["boxes"], image["h"], image["w"])
    return {"features": image["features"], "norm_bb": fractions, "conf": image["probs"].max(1),
            "soft_labels": image["probs"]}


def write_uniter_lmdb(path, values: dict[str, bytes]):
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for name, value in values.items():
            txn.put(name.encode(), value)
        txn.put(b"__keys__", json.dumps(list(values)).encode())
    env.close()


def packed(dump: dict) -> bytes:
    narrowed = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in dump.items()}
    return msgpack.packb(narrowed, use_bin_type=True, default=msgpack_numpy_array)


def compressed(dump: dict) -> bytes:
    with io.BytesIO() as writer:
        np.savez_compressed(writer, **{k: v.astype(np.float16) for k, v in dump.items()})
        return writer.getvalue()


def test_uniter_lmdb_of_msgpack_or_compressed_arrays(tmp_path):
    images = source_images()
    for name, encode in (("feat_th0.2_max100_min10", packed), ("feat_th0.2_max100_min10_compressed", compressed)):
        write_uniter_lmdb(tmp_path / name, {f"coco_{image['id']}.npz": encode(uniter_dump(image)) for image in images})
        store = imported(tmp_path / name, "uniter-lmdb", tmp_path / f"{name}.store")
        for image in images:
            dump = {k: v.astype(np.float16) for k, v in uniter_dump(image).items()}
            nominal = (dump["norm_bb"][:, :4].astype(np.float64) * NOMINAL_IMAGE_SIZE).astype(np.float32)
            assert_fields(store[f"coco_{image['id']}"], {
                "boxes": nominal, "features": dump["features"], "class_probs": dump["soft_labels"],
                "image_h": NOMINAL_IMAGE_SIZE, "image_w": NOMINAL_IMAGE_SIZE,
                "image_feature": dump["features"].astype(np.float32).mean(0).astype(np.float16)})
            fractions = spatial_features(image["boxes"], image["h"], image["w"])[:, :4]
            np.testing.assert_allclose(store[f"coco_{image['id']}"]["boxes"] / NOMINAL_IMAGE_SIZE, fractions, atol=1e-3)
        assert store["meta"]["nominal_image_size"] == NOMINAL_IMAGE_SIZE


def test_uniter_bad_values_are_named(tmp_path):
    images = source_images(dim=8)
    dump = uniter_dump(images[0])
    write_uniter_lmdb(tmp_path / "a", {"x.npz": packed({**dump, "norm_bb": dump["norm_bb"][:, :4]})})
    assert refused(tmp_path / "a", "uniter-lmdb", tmp_path / "s") == (
        f"{tmp_path / 'a'} key b'x.npz': norm_bb holds float16 values of shape (5, 4), expected numbers of shape "
        "(N, 6)")
    objects = {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [BOXES], b"data": pickle.dumps([1] * BOXES)}
    write_uniter_lmdb(tmp_path / "b", {"x.npz": msgpack.packb({"features": objects}, use_bin_type=True)})
    assert refused(tmp_path / "b", "uniter-lmdb", tmp_path / "s") == (
        f"{tmp_path / 'b'} key b'x.npz': features is an array of kind b'O', which msgpack_numpy pickles: only arrays "
        "of numbers are read")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "data.mdb").write_bytes(b"not an lmdb" * 100)
    assert refused(tmp_path / "c", "uniter-lmdb", tmp_path / "s").startswith(
        f"{tmp_path / 'c' / 'data.mdb'}: not an intact LMDB data file (")


# ---- VinVL: features.tsv of (N, 2054) float32, .lineidx, predictions.tsv --------------------------------

def write_vinvl(folder, images, layout: str = "columns"):
    """Oscar's features.tsv (2048 features then the 6 normalized box values), its .lineidx, and
    scene_graph_benchmark's predictions.tsv."""
    folder.mkdir()
    lines, offsets, offset = [], [], 0
    for image in images:
        values = np.concatenate([image["features"], spatial_features(image["boxes"], image["h"], image["w"])], 1)
        if layout == "columns":
            line = f"{image['id']}\t{BOXES}\t{b64(values)}\n"
        else:
            line = f"{image['id']}\t{json.dumps({'num_boxes': BOXES, 'features': b64(values)})}\n"
        lines.append(line)
        offsets.append(offset)
        offset += len(line.encode())
    (folder / "features.tsv").write_text("".join(lines))
    (folder / "features.lineidx").write_text("".join(f"{o}\n" for o in offsets))
    (folder / "predictions.tsv").write_text("".join(
        f"{image['id']}\t" + json.dumps({"objects": [{"rect": image["boxes"][0].tolist(), "class": "cat", "conf": 0.9}],
                                        "image_h": image["h"], "image_w": image["w"]}) + "\n" for image in images))


def vinvl_boxes(image: dict, height: int, width: int) -> np.ndarray:
    fractions = spatial_features(image["boxes"], image["h"], image["w"])
    return (fractions[:, :4].astype(np.float64) * (width, height, width, height)).astype(np.float32)


def test_vinvl_tsv_with_and_without_its_predictions(tmp_path):
    images = source_images()
    write_vinvl(tmp_path / "columns", images)
    write_vinvl(tmp_path / "json", images, layout="json")
    store = imported(tmp_path / "columns" / "features.tsv", "vinvl-tsv", tmp_path / "sized",
                     labels=tmp_path / "columns" / "predictions.tsv")
    for image in images:
        assert_fields(store[image["id"]], {**basics(image), "boxes": vinvl_boxes(image, image["h"], image["w"]),
                                           "image_feature": mean_feature(image)})
        np.testing.assert_allclose(store[image["id"]]["boxes"], image["boxes"], rtol=1e-5)
    assert "nominal_image_size" not in store["meta"]

    store = imported(tmp_path / "json" / "features.tsv", "vinvl-tsv", tmp_path / "nominal")
    for image in images:
        assert_fields(store[image["id"]], {"boxes": vinvl_boxes(image, NOMINAL_IMAGE_SIZE, NOMINAL_IMAGE_SIZE),
                                           "features": image["features"].astype(np.float16),
                                           "image_h": NOMINAL_IMAGE_SIZE, "image_w": NOMINAL_IMAGE_SIZE})
    assert store["meta"]["nominal_image_size"] == NOMINAL_IMAGE_SIZE


def test_vinvl_bad_files_are_named(tmp_path):
    images = source_images(dim=8)
    write_vinvl(tmp_path / "a", images)
    tsv = tmp_path / "a" / "features.tsv"
    tsv.write_text("".join(tsv.read_text().splitlines(keepends=True)[:2]))  # the last line lost
    assert refused(tsv, "vinvl-tsv", tmp_path / "s") == (
        f"{tmp_path / 'a' / 'features.lineidx'}: lists 3 lines, {tsv} has 2; they differ from line 3 on "
        "(a truncated or edited file?)")
    tsv.write_text(tsv.read_text()[:-8] + "\n")  # 7 characters of base64 lost
    assert refused(tsv, "vinvl-tsv", tmp_path / "s").startswith(f"{tsv} line 2: features is not base64 (")
    (tmp_path / "a" / "predictions.tsv").write_text("9\t[]\n")
    assert refused(tsv, "vinvl-tsv", tmp_path / "s", labels=tmp_path / "a" / "predictions.tsv").startswith(
        f"{tmp_path / 'a' / 'predictions.tsv'} line 1: no image_h and image_w (a bare list of objects")


# ---- the command, what a format lacks, training from an imported store ------------------------------------

def test_the_command_takes_the_files_a_format_reads(tmp_path):
    images = source_images(dim=8)
    write_vinvl(tmp_path / "v", images)
    status, lines = invoke("cache", "import", tmp_path / "v" / "features.tsv", "--format", "vinvl-tsv",
                           "--labels", tmp_path / "v" / "predictions.tsv", "--out", tmp_path / "store")
    assert status == 0 and lines[-1] == f"3 records → {tmp_path / 'store'}", lines
    status, lines = invoke("cache", "import", tmp_path / "v" / "features.tsv", "--format", "tsv",
                           "--labels", tmp_path / "v" / "predictions.tsv", "--out", tmp_path / "other")
    assert (status, lines) == (USAGE, [f"Error: --labels {tmp_path / 'v' / 'predictions.tsv'}: the tsv format reads no "
                                        "such file (--labels: vinvl-tsv's predictions or label TSV)"])
    status, lines = invoke("cache", "export", tmp_path / "store", "--format", "vinvl-tsv", "--out", tmp_path / "x")
    assert status == 2 and "'vinvl-tsv' is not one of" in lines[-1], lines


def test_what_a_format_lacks_is_named_and_recorded(tmp_path):
    images = source_images(dim=8)
    write_uniter_lmdb(tmp_path / "db", {f"{image['id']}.npz": packed(uniter_dump(image)) for image in images})
    with pytest.warns(UserWarning) as warned:
        import_store(tmp_path / "db", "uniter-lmdb", tmp_path / "store")
    lacks = sorted(str(w.message).removeprefix(f"{tmp_path / 'db'}: imported without ") for w in warned)
    assert lacks == [
        "attrs_id/attrs_conf (no detected attributes per box); the uniter-lmdb format does not carry it",
        "objects_id/objects_conf (no detected classes per box); the uniter-lmdb format does not carry it",
        "the detector config (end-to-end stages cannot use it); the uniter-lmdb format does not carry it",
        f"the image sizes (boxes are fractions of a nominal {NOMINAL_IMAGE_SIZE}-pixel square (meta.json "
        "nominal_image_size): their geometry is kept, their pixels are not); the uniter-lmdb format does not carry it",
        "the masked-pixel variants (pre-training from it needs roi_masking: feature); the uniter-lmdb format does not "
        "carry it",
        "the whole-image feature (the mean of the box features stands in for it); the uniter-lmdb format does not "
        "carry it",
    ]


def write_world_as_vlbert_json(store_root, folder):
    """The tiny world's store as VL-BERT's JSON: everything a VQA stage reads, as float32 base64."""
    with FeatureStore(store_root) as store:
        for image_id in store.keys():
            record = store[image_id]
            path = folder / f"{image_id}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({
                "image_h": record["image_h"], "image_w": record["image_w"], "num_boxes": len(record["boxes"]),
                "boxes": b64(record["boxes"]), "features": b64(record["features"]),
                "classes": b64(record["class_probs"]), "image_box_feature": b64(record["image_feature"])}))


def test_an_imported_store_trains_as_the_extracted_one(tiny_world, tmp_path):
    write_world_as_vlbert_json(tiny_world / "cache", tmp_path / "json")
    import_store(tmp_path / "json", "vlbert-json", tmp_path / "store")
    with FeatureStore(tiny_world / "cache") as extracted, FeatureStore(tmp_path / "store") as store:
        assert store.keys() == extracted.keys()
        for image_id in store.keys():
            assert_fields(store[image_id], {name: extracted[image_id][name] for name in (
                "boxes", "features", "image_feature", "class_probs", "image_h", "image_w")})
    stage = StageConfig("vqa", "vqa", steps=1, batch_size=2, base_lr=5e-4)
    losses = {}
    for name, store in (("extracted", tiny_world / "cache"), ("imported", tmp_path / "store")):
        Trainer(run_config(tiny_world, tmp_path / name, [stage], store=str(store))).fit()  # out: tmp_path / name
        lines = RunFolder(tmp_path / name).metrics_file.read_text().splitlines()
        losses[name] = [record["loss"] for record in map(json.loads, lines) if "step" in record]
    assert len(losses["imported"]) == 1 and losses["imported"] == losses["extracted"]


def test_a_stage_that_needs_what_an_imported_store_lacks_is_refused(tiny_world, tmp_path):
    write_vinvl(tmp_path / "v", source_images(dim=8))
    import_store(tmp_path / "v" / "features.tsv", "vinvl-tsv", tmp_path / "store")
    stage = StageConfig("pretrain", "pretrain", steps=1, batch_size=2, options={"roi_masking": "feature"})
    with pytest.raises(RunConfigError) as refusal:
        Trainer(run_config(tiny_world, tmp_path / "run", [stage], store=str(tmp_path / "store")))
    assert str(refusal.value) == (f"stage 'pretrain': {tmp_path / 'store'} stores no class distributions: masked RoI "
                                  "classification needs them")
    assert not (tmp_path / "run").exists()
