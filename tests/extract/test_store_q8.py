"""The q8 feature encoding: rows round-trip within their step, every row keeps cosine >= 0.9999 to
float16, a store the job writes with q8 reads back close to a float16 one at about half the bytes,
exports decode and imports encode, damage is caught, and q8 never mixes with another dtype."""

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store import (
    DamagedRecordError, FeatureStore, FeatureStoreWriter, StoreError, StoreMismatchError, build_meta, decode_record,
    encode_record, q8, schema,
)
from extract.store.audit import verify_store
from extract.store.interop import export_store, import_store
from extract.store.records import CHECKSUM, record_checksum
from extract.store.schema import FEATURE_ENCODINGS, Encoded, as_stored
from extract.synthetic import write_synthetic_images
from pipelines.cli import main
from tests.helpers.stores import QUIET_LOSSES, flip_bit_in

MASKED = dict(mask_variants=2, mask_prob=0.3, mask_seed=7)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row; 1 for two zero rows (a masked box can have an all-zero feature)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    both_zero = ~a.any(-1) & ~b.any(-1)
    return np.where(both_zero, 1.0, (a * b).sum(-1) / np.where(both_zero, 1.0, norms))


def butd_like(rng: np.random.Generator, rows: int, dim: int = 2048) -> np.ndarray:
    """Heavy-tailed non-negative rows (means of ReLU outputs): exact zeros, lognormal tails of
    varying width, channels strong in every row."""
    x = np.exp(rng.normal(-1, 1, (rows, dim)) * rng.uniform(0.5, 2.0, (rows, 1))) * np.exp(rng.normal(0, 0.7, dim))
    x[rng.random((rows, dim)) < rng.uniform(0, 0.6, (rows, 1))] = 0
    return x.astype(np.float32)


def rows_of_every_kind() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    huge = rng.random((20, 64), dtype=np.float32)
    huge[np.arange(20), rng.integers(0, 64, 20)] = 1e4
    return {
        "non-negative": rng.random((20, 64), dtype=np.float32) * 5,
        "signed": rng.normal(0, 3, (20, 64)).astype(np.float32),
        "signed, shifted": rng.normal(100, 1, (20, 64)).astype(np.float32),
        "zero": np.zeros((3, 64), np.float32),
        "constant": np.array([[2.5] * 64, [-1.25] * 64, [7e4] * 64], np.float32),
        "one huge value": huge,
        "variants (K, N, D)": butd_like(rng, 12, 64).reshape(3, 4, 64),
        "one row (D,)": rng.random(64, dtype=np.float32),
        "no rows": np.zeros((0, 64), np.float32),
    }


@pytest.mark.parametrize("name", list(rows_of_every_kind()))
def test_rows_round_trip_within_their_step(name):
    x = rows_of_every_kind()[name]
    parts = q8.encode(x)
    decoded = q8.decode(parts)
    assert parts["codes"].dtype == np.uint8 and parts["codes"].shape == x.shape
    assert parts["low"].shape == parts["step"].shape == x.shape[:-1]
    assert decoded.dtype == np.float32 and decoded.shape == x.shape
    # A rounding error e <= step/2 on sign(x)·sqrt|x| moves x by at most step·sqrt|x| + step²/4.
    step = parts["step"][..., None]
    bound = step * np.sqrt(np.abs(x)) + step ** 2 / 4 + 1e-6 * np.abs(x)
    assert (np.abs(decoded - x) <= bound).all()
    if (x >= 0).all():
        assert (decoded[x == 0] == 0).all()  # a ReLU feature's zeros stay exact zeros
    if x.size:
        np.testing.assert_allclose(decoded.max(-1), x.max(-1), rtol=1e-6)
        np.testing.assert_allclose(decoded.min(-1), x.min(-1), rtol=1e-6)


def test_zero_rows_are_exact_constant_rows_float32_close_and_non_finite_rows_decode_as_nan():
    x = np.array([[0, 0, 0], [3, 3, 3], [-0.5, -0.5, -0.5], [np.nan, 1, 2], [np.inf, 1, 2], [np.inf, np.inf, -np.inf],
                  [1, 4, 9]], np.float32)
    with np.errstate(all="raise"):
        decoded = q8.decode(q8.encode(x))
    np.testing.assert_array_equal(decoded[0], x[0])
    np.testing.assert_allclose(decoded[1:3], x[1:3], rtol=2 * np.finfo(np.float32).eps)
    assert np.isnan(decoded[3:6]).all()
    np.testing.assert_allclose(decoded[6], x[6], rtol=0.01)


def test_every_row_keeps_cosine_0_9999_to_float16():
    """Heavy-tailed non-negative rows at BUTD size, rows with one huge value (near the worst case of
    the (1 + sqrt D) / (12·255²) bound on 1 - cos) and signed Gaussian rows."""
    rng = np.random.default_rng(1)
    one_huge = rng.random((500, 2048), dtype=np.float32)
    one_huge[np.arange(500), rng.integers(0, 2048, 500)] = rng.uniform(1, 2000, 500)
    for x in (butd_like(rng, 2000), one_huge, rng.normal(0, 1, (500, 2048)).astype(np.float32)):
        reference = x.astype(np.float16)
        assert cosine(q8.decode(q8.encode(reference)), reference).min() >= 0.9999
        assert cosine(q8.decode(q8.encode(x)), reference).min() >= 0.9999


def record(rng: np.random.Generator, boxes: int, dim: int, variants: int) -> dict:
    """A record as the job builds it (float32 detector output), with variant rows 0, 2, ... unchanged."""
    features = butd_like(rng, boxes, dim)
    built = {"boxes": rng.random((boxes, 4), dtype=np.float32), "features": features,
             "image_feature": features.mean(axis=0), "class_topk_id": rng.integers(0, 1601, (boxes, 10)).astype(np.int32),
             "class_topk_prob": rng.random((boxes, 10), dtype=np.float32),
             "image_h": 480, "image_w": 640, "box_source": "proposals"}
    if variants:
        masked = np.repeat(features[None], variants, axis=0)
        masked[:, 1::2] = butd_like(rng, variants * len(masked[0, 1::2]), dim).reshape(variants, -1, dim)
        built.update(mask_boxes=rng.random((variants, boxes)) < 0.5, masked_features=masked,
                     masked_image_feature=butd_like(rng, variants, dim))
    return built


def test_q8_records_decode_transparently_at_half_the_bytes_of_float16():
    rng = np.random.default_rng(2)
    source = record(rng, 100, 2048, 3)
    stored = {name: as_stored(source, name) for name in ("float16", "q8")}
    assert isinstance(stored["q8"]["features"], Encoded) and stored["q8"]["class_topk_prob"].dtype == np.float16
    assert as_stored(stored["q8"], "q8")["features"] is stored["q8"]["features"]  # already stored: kept
    data = {name: encode_record(r, "a") for name, r in stored.items()}
    decoded = decode_record(data["q8"], "a")
    reference = decode_record(data["float16"], "a")
    for name in ("features", "image_feature", "masked_features", "masked_image_feature"):
        assert decoded[name].dtype == np.float32 and decoded[name].shape == reference[name].shape
        assert cosine(decoded[name], reference[name]).min() >= 0.9999, name
    for name in ("boxes", "class_topk_id", "class_topk_prob", "mask_boxes"):
        assert decoded[name].dtype == reference[name].dtype and np.array_equal(decoded[name], reference[name]), name
    # Unchanged variant rows are the unmasked rows' codes, stored once and decoded identically.
    np.testing.assert_array_equal(decoded["masked_features"][:, 0::2], np.repeat(decoded["features"][None, 0::2], 3, 0))

    rows = 100 + 1 + 3 * 50 + 3  # features, image feature, changed variant rows, variant image features
    feature_bytes = {name: rows * FEATURE_ENCODINGS[name].row_bytes(2048) for name in data}
    other = len(data["float16"]) - feature_bytes["float16"]  # boxes, classes, masks, header, checksum
    assert feature_bytes["q8"] / feature_bytes["float16"] == pytest.approx(0.502, abs=0.001)
    assert other < len(data["q8"]) - feature_bytes["q8"] < other + 1024  # the header lists the parts
    assert len(data["q8"]) / len(data["float16"]) < 0.52


def test_a_record_holding_an_unknown_encoding_is_refused_not_misread():
    data = bytearray(encode_record(as_stored(record(np.random.default_rng(3), 4, 16, 1), "q8"), "a"))
    at = data.find(b'"features":"q8"')
    data[at : at + 15] = b'"features":"q4"'
    data[-CHECKSUM.size:] = CHECKSUM.pack(record_checksum(b"a", data[: -CHECKSUM.size]))
    with pytest.raises(StoreError, match="feature encoding 'q4' is unknown to this code"):
        decode_record(data, "a")


def test_a_reader_that_does_not_know_q8_refuses_its_store(tmp_path, monkeypatch):
    meta = build_meta(feature_dim=16, feature_dtype="q8", mode="imported", num_classes=1601, top_k_classes=10)
    with FeatureStoreWriter(tmp_path / "store", meta) as writer:
        writer.commit({"a": as_stored(record(np.random.default_rng(4), 4, 16, 0), "q8")})
    stored = json.loads((tmp_path / "store" / "meta.json").read_text())
    assert stored["schema_version"] == 3 and stored["features"]["dtype"] == "q8"
    monkeypatch.setattr(schema, "READABLE_SCHEMA_VERSIONS", (1, 2))  # the code before q8
    with pytest.raises(StoreError, match="schema version 3, this code reads 1, 2"):
        FeatureStore(tmp_path / "store")
    monkeypatch.undo()
    stored["features"]["dtype"] = "q4"
    (tmp_path / "store" / "meta.json").write_text(json.dumps(stored))
    with pytest.raises(StoreError, match=r"`features.dtype` is 'q4', expected one of float16, float32, q8"):
        FeatureStore(tmp_path / "store")


@pytest.mark.parametrize("dtype", ["float16", "q8"])
def test_the_writer_encodes_features_as_computed_into_the_stores_dtype(tmp_path, dtype):
    meta = build_meta(feature_dim=16, feature_dtype=dtype, mode="imported", num_classes=1601, top_k_classes=10)
    computed = record(np.random.default_rng(5), 4, 16, 2)
    with FeatureStoreWriter(tmp_path / "store", meta) as writer:
        writer.commit({"raw": computed, "encoded": as_stored(computed, dtype)})
    with FeatureStore(tmp_path / "store") as store:
        raw, encoded = store["raw"], store["encoded"]
        assert raw["features"].dtype == encoded["features"].dtype
        for name in ("features", "image_feature", "masked_features"):
            np.testing.assert_array_equal(raw[name], encoded[name])
        assert len(store.raw("raw")) == len(store.raw("encoded"))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same synthetic images extracted by the tiny detector into a float16 and a q8 store."""
    root = tmp_path_factory.mktemp("q8")
    write_synthetic_images(root / "images", 4)
    summaries = {name: run_extraction(ExtractionConfig(root / "images", "tiny", feature_dtype=name, progress=False,
                                                       **MASKED), root / name)
                 for name in ("float16", "q8")}
    return root, summaries


def test_a_q8_store_from_the_job_reads_back_close_to_float16(stores):
    root, summaries = stores
    assert summaries["q8"].written == summaries["float16"].written == 4
    assert summaries["q8"].bytes_written < 0.6 * summaries["float16"].bytes_written  # 256-d rows: headers weigh more
    with FeatureStore(root / "q8") as coded, FeatureStore(root / "float16") as reference:
        assert coded.meta["features"]["dtype"] == "q8" and coded.keys() == reference.keys()
        for key in reference:
            a, b = coded[key], reference[key]
            assert a.keys() == b.keys()
            for name in ("features", "image_feature", "masked_features", "masked_image_feature"):
                assert a[name].dtype == np.float32 and cosine(a[name], b[name]).min() >= 0.9999, (key, name)
            for name in ("boxes", "objects_id", "objects_conf", "attrs_id", "class_probs", "mask_boxes"):
                assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), (key, name)
    with FeatureStore(root / "q8", float32=True, as_torch=True) as store:
        features = store["image0000"]["features"]
        assert isinstance(features, torch.Tensor) and features.dtype == torch.float32
    assert verify_store(root / "q8").problems == []


def test_regions_for_training_read_the_same_from_q8(stores):
    from train.data.regions import RegionBank

    root, _ = stores
    coded, reference = RegionBank(str(root / "q8")), RegionBank(str(root / "float16"))
    a = coded.get("image0001", class_probs=True, variants=True)
    b = reference.get("image0001", class_probs=True, variants=True)
    assert a.appearance.dtype == a.variant_appearance.dtype == np.float32
    assert cosine(a.appearance, b.appearance).min() >= 0.9999
    assert cosine(a.variant_appearance, b.variant_appearance).min() >= 0.9999
    assert np.array_equal(a.class_probs, b.class_probs) and np.array_equal(a.variant_masks, b.variant_masks)


def test_a_store_read_encoded_gives_the_parts_of_the_decoded_values(stores):
    """Training reads a q8 store's parts (decoded on its device): picking and joining rows of the
    parts, then decoding, gives bitwise the values a decoding reader picks."""
    from train.data.regions import RegionBank

    root, _ = stores
    with FeatureStore(root / "q8", encoded=True) as parts, FeatureStore(root / "q8") as values:
        for key in values:
            encoded, decoded = parts[key], values[key]
            for name in ("features", "image_feature", "masked_features", "masked_image_feature"):
                assert isinstance(encoded[name], Encoded) and encoded[name].parts["codes"].dtype == np.uint8
                assert np.array_equal(encoded[name].decoded(), decoded[name]), (key, name)
            assert np.array_equal(encoded["boxes"], decoded["boxes"])
    with pytest.raises(ValueError, match="check_layout"):
        FeatureStore(root / "q8", encoded=True, check_layout=True)
    bank, reference = RegionBank(str(root / "q8"), max_regions=3, encoded=True), RegionBank(str(root / "q8"), 3)
    a = bank.get("image0001", class_probs=True, variants=True).truncated(3)
    b = reference.get("image0001", class_probs=True, variants=True).truncated(3)
    assert np.array_equal(a.appearance.decoded(), b.appearance)
    assert np.array_equal(a.variant_appearance[1].decoded(), b.variant_appearance[1])


def test_q8_never_mixes_with_a_store_of_another_dtype(stores, tmp_path):
    root, _ = stores
    shutil.copytree(root / "float16", tmp_path / "store")
    with pytest.raises(StoreMismatchError, match="features.dtype: store has 'float16', this run has 'q8'"):
        run_extraction(ExtractionConfig(root / "images", "tiny", feature_dtype="q8", progress=False, **MASKED),
                       tmp_path / "store")


def test_a_damaged_q8_record_fails_its_checksum(stores, tmp_path):
    root, _ = stores
    shutil.copytree(root / "q8", tmp_path / "store")
    with FeatureStore(tmp_path / "store") as store:
        raw = store.raw("image0002")
    flip_bit_in(tmp_path / "store" / "shards" / "shard-00000-of-00001" / "data.mdb", bytes(raw[-200:-100]))
    with FeatureStore(tmp_path / "store") as store:
        assert store["image0001"]["features"].dtype == np.float32
        with pytest.raises(DamagedRecordError, match="'image0002' is damaged: checksum mismatch"):
            store["image0002"]
    assert verify_store(tmp_path / "store").problems == [
        "image0002: damaged: checksum mismatch: its bytes changed after it was written"]


@QUIET_LOSSES
def test_exports_decode_and_imports_encode_q8(stores, tmp_path):
    root, _ = stores
    export_store(root / "q8", "npz", tmp_path / "npz")
    import_store(tmp_path / "npz", "npz", tmp_path / "again", feature_dtype="q8")
    export_store(root / "q8", "tsv", tmp_path / "x.tsv")
    result = CliRunner().invoke(main, ["cache", "import", str(tmp_path / "x.tsv"), "--format", "tsv",
                                       "--out", str(tmp_path / "from-tsv"), "--feature-dtype", "q8"])
    assert result.exit_code == 0, result.output
    with FeatureStore(root / "q8") as store, FeatureStore(tmp_path / "again") as again, \
            FeatureStore(tmp_path / "from-tsv") as from_tsv:
        assert again.meta["features"]["dtype"] == from_tsv.meta["features"]["dtype"] == "q8"
        for key in store:
            original = store[key]
            with np.load(tmp_path / "npz" / f"{key}.npz") as exported:
                np.testing.assert_array_equal(exported["features"], original["features"])  # decoded values
                np.testing.assert_array_equal(exported["masked_features"], original["masked_features"])
            # Encoding decoded values again finds the same codes: a round trip changes nothing.
            for name in ("features", "masked_features", "image_feature"):
                np.testing.assert_allclose(again[key][name], original[name], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(from_tsv[key]["features"], original["features"], rtol=1e-6, atol=1e-7)
    assert verify_store(tmp_path / "again").problems == []


def test_the_cli_offers_the_schemas_dtypes():
    for command in (["extract", "--help"], ["cache", "import", "--help"]):
        shown = " ".join(CliRunner().invoke(main, command).output.split())
        assert "[float16|float32|q8]" in shown and FEATURE_ENCODINGS["q8"].summary in shown
