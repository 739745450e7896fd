"""FeatureStore writer and reader: round trips, map growth, shards as one store, concurrent readers."""

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import extract.store.writer
from extract.store import FeatureStore, FeatureStoreWriter, StoreError, decode_record, encode_record
from extract.store.audit import verify_store
from extract.store.layout import writer_active
from extract.store.records import widened
from extract.store.schema import (
    REQUIRED_FIELDS, SCALAR_FIELDS, VARIANT_FIELDS, DamagedRecordError, dense_class_probs, sparse_class_probs,
)
from tests.helpers.stores import DIM, data_file, flip_bit_in, meta, synthetic_record


def test_record_round_trip_is_exact_and_unchanged_variant_rows_are_not_stored_twice():
    record = synthetic_record("a", num_boxes=6, variants=3)
    encoded = encode_record(record, "a")
    decoded = decode_record(encoded, "a")
    for name, value in record.items():
        if isinstance(value, np.ndarray):
            assert decoded[name].dtype == value.dtype and np.array_equal(decoded[name], value), name
        else:
            assert decoded[name] == value
    full = encode_record({k: v for k, v in record.items() if k not in ("mask_boxes", "masked_features",
                                                                       "masked_image_feature")}, "a")
    variant_bytes = len(encoded) - len(full)
    assert variant_bytes < 3 * 6 * DIM * 2  # only the 3 changed rows of 6 per variant, plus masks
    wide = widened(decoded)
    assert wide["features"].dtype == np.float32 and wide["objects_id"].dtype == np.int64
    with pytest.raises(StoreError, match="magic"):
        decode_record(b"XXXX" + encoded[4:], "a")


@pytest.mark.parametrize("owned", [False, True], ids=["bytes", "bytearray"])
def test_variants_whose_every_row_changed_decode_exactly_from_any_buffer(owned):
    """BUTD's masked variants change every RoI's features: the stored rows are then the variants whole."""
    record = synthetic_record("a", num_boxes=6, variants=3)
    record["masked_features"] = np.random.default_rng(1).random(record["masked_features"].shape).astype(np.float16)
    data = encode_record(record, "a")
    decoded = decode_record(bytearray(data) if owned else data, "a")
    masked = decoded["masked_features"]
    assert masked.tobytes() == record["masked_features"].tobytes()
    assert masked.shape == record["masked_features"].shape and masked.flags.writeable


def test_a_read_of_some_fields_decodes_those_alone_with_the_same_bits(tmp_path):
    record = synthetic_record("a", num_boxes=6, variants=3)
    encoded = encode_record(record, "a")
    full = decode_record(encoded, "a")
    for fields in (REQUIRED_FIELDS, ("boxes", "class_probs", "class_topk_id"), ("masked_features",), VARIANT_FIELDS):
        part = decode_record(encoded, "a", fields=fields)
        assert part.keys() == {*fields, *SCALAR_FIELDS} & full.keys()
        for name, value in part.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == full[name].dtype and value.tobytes() == full[name].tobytes(), name
            else:
                assert value == full[name], name
    with FeatureStoreWriter(tmp_path, meta(variants=3)) as writer:
        writer.commit({"a": record})
    with FeatureStore(tmp_path, check_layout=True) as store:  # fields left out are not missing ones
        assert store.decoded("a", fields=REQUIRED_FIELDS).keys() == {*REQUIRED_FIELDS, *SCALAR_FIELDS}


@pytest.mark.parametrize("every_row_changed", [False, True], ids=["some-rows", "every-row"])
@pytest.mark.parametrize("owned", [False, True], ids=["bytes", "bytearray"])
def test_a_read_of_one_masked_variant_gives_the_bits_of_the_full_decodes_slice(every_row_changed, owned):
    """Pre-training reads one variant a sample: its mask row, whole-image feature and rows alone, rebuilt
    from the features where only the changed rows are stored, and checked as a whole record still."""
    record = synthetic_record("a", num_boxes=6, variants=3)
    if every_row_changed:
        record["masked_features"] = np.random.default_rng(1).random(record["masked_features"].shape).astype(np.float16)
    data = encode_record(record, "a")
    full = decode_record(data, "a")
    for variant in range(3):
        one = decode_record(bytearray(data) if owned else data, "a", fields=REQUIRED_FIELDS + VARIANT_FIELDS,
                            variant=variant, variant_count=3)
        assert one.keys() == {*REQUIRED_FIELDS, *VARIANT_FIELDS, *SCALAR_FIELDS}
        for name in REQUIRED_FIELDS + VARIANT_FIELDS:
            expected = full[name][variant : variant + 1] if name in VARIANT_FIELDS else full[name]
            assert one[name].dtype == expected.dtype and one[name].shape == expected.shape, (variant, name)
            assert one[name].tobytes() == expected.tobytes(), (variant, name)
    with pytest.raises(StoreError, match="holds 3 masked-pixel variants, the store 2"):
        decode_record(data, "a", variant=0, variant_count=2)
    with pytest.raises(StoreError, match="variant 3 asked for, of the 3 it holds"):
        decode_record(data, "a", variant=3)


def test_a_one_variant_read_refuses_damage_in_another_variants_bytes_and_a_variant_count_off_meta(tmp_path):
    record = synthetic_record("a", num_boxes=6, variants=3)
    with FeatureStoreWriter(tmp_path / "store", meta(variants=3)) as writer:
        writer.commit({"a": record, "b": synthetic_record("b", num_boxes=4, variants=2)})
    with FeatureStore(tmp_path / "store", check_layout=True) as store:
        one = store.decoded("a", fields=VARIANT_FIELDS, variant=1)  # the layout checks one variant
        assert one["masked_image_feature"].tobytes() == record["masked_image_feature"][1:2].tobytes()
        with pytest.raises(DamagedRecordError, match="'b' is damaged: it holds 2 masked-pixel variants, the store 3"):
            store.decoded("b", fields=VARIANT_FIELDS, variant=0)
    flip_bit_in(data_file(tmp_path / "store"), record["masked_image_feature"][2].tobytes())
    with FeatureStore(tmp_path / "store") as store:
        with pytest.raises(DamagedRecordError, match="'a' is damaged: checksum mismatch"):
            store.decoded("a", fields=VARIANT_FIELDS, variant=0)  # variant 2's bytes changed


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_sparse_class_distributions_densify_to_the_dense_ones_bits_on_host_and_device(device):
    """Top-k class distributions travel to the device as ids and probabilities; scattered there, they
    must be `dense_class_probs`'s float32 bits, duplicates in a row (imported stores) included."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 9, (40, 4)).astype(np.int32)  # 9 classes, 4 a row: many rows name one twice
    record = {"class_topk_id": ids, "class_topk_prob": rng.random((40, 4)).astype(np.float16)}
    assert any(len(set(row)) < 4 for row in ids.tolist())
    dense = dense_class_probs(record, 9)
    sparse = sparse_class_probs(record, 9)
    for row, probs in zip(ids, sparse.parts["probs"]):  # one value per class named, whatever the scatter's order
        assert all(len(set(probs[row == name].tolist())) == 1 for name in row)
    for parts in (sparse.parts, {k: torch.from_numpy(v).to(device) for k, v in sparse.parts.items()}):
        values = sparse.with_parts(parts).decoded()
        values = values if isinstance(values, np.ndarray) else values.cpu().numpy()
        assert values.dtype == np.float32 and values.tobytes() == dense.tobytes()
    with pytest.raises(ValueError, match="class_topk_id holds 9, outside the 9 classes"):
        sparse_class_probs({**record, "class_topk_id": ids + 1}, 9)


def test_map_grows_and_shards_read_as_one_store(tmp_path):
    for shard in range(2):
        with FeatureStoreWriter(tmp_path, meta(), shard=(shard, 2), initial_map_size=64 * 1024) as writer:
            for start in range(0, 60, 10):  # ~30 KiB per commit: the 64 KiB map must grow
                writer.commit({f"s{shard}/{i:03d}": synthetic_record(f"s{shard}/{i:03d}", 40) for i in range(start, start + 10)})
    with FeatureStore(tmp_path, float32=True, as_torch=True) as store:
        assert len(store) == 120 and len(store.shards) == 2
        assert store.keys()[:2] == ["s0/000", "s0/001"] and "s1/059" in store and "s2/000" not in store
        record = store["s1/059"]
        assert isinstance(record["features"], torch.Tensor) and record["features"].dtype == torch.float32
        assert torch.equal(record["features"], torch.from_numpy(synthetic_record("s1/059", 40)["features"].astype(np.float32)))
        with pytest.raises(KeyError):
            store["nope"]
        with FeatureStore(tmp_path) as second:  # two readers of the same shards in one process
            assert np.array_equal(second["s0/000"]["boxes"], store["s0/000"]["boxes"].numpy())
    assert verify_store(tmp_path).problems == []


def test_second_writer_of_a_shard_is_refused(tmp_path):
    with FeatureStoreWriter(tmp_path, meta()):
        with pytest.raises(StoreError, match="another process is writing"):
            FeatureStoreWriter(tmp_path, meta())


def test_verify_lists_what_is_wrong(tmp_path, monkeypatch):
    # A writer that stores features as it is handed them (as code before the writer encoded them did).
    monkeypatch.setattr(extract.store.writer, "as_stored", lambda record, dtype: record)
    bad = synthetic_record("bad")
    bad["features"][1, 3] = np.nan
    wrong = synthetic_record("wrong")
    wrong["image_feature"] = wrong["image_feature"].astype(np.float32)
    del wrong["class_probs"]
    with FeatureStoreWriter(tmp_path, meta()) as writer:
        writer.commit({"good": synthetic_record("good"), "bad": bad, "wrong": wrong})
    problems = verify_store(tmp_path).problems
    assert problems == [
        "bad: features: 1 NaN or Inf value(s)",
        "wrong: missing field class_probs",
        "wrong: image_feature: float32 values, expected float16 (meta.json features.dtype)",
    ]


WRITER = textwrap.dedent("""
    import sys
    from extract.store import FeatureStoreWriter
    from tests.helpers.stores import meta, synthetic_record
    with FeatureStoreWriter(sys.argv[1], meta(), initial_map_size=128 * 1024) as writer:
        for start in range(40, 120, 10):
            writer.commit({f"{i:04d}": synthetic_record(f"{i:04d}", 30) for i in range(start, start + 10)})
""")


class Checksums(torch.utils.data.Dataset):
    def __init__(self, store, keys):
        self.store, self.keys = store, keys

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        record = self.store[self.keys[i]]
        return i, float(record["features"].astype(np.float64).sum() + record["boxes"].sum())


def test_dataloader_workers_read_while_a_writer_commits_and_grows_the_map(tmp_path):
    with FeatureStoreWriter(tmp_path, meta(), initial_map_size=128 * 1024) as writer:
        writer.commit({f"{i:04d}": synthetic_record(f"{i:04d}", 30) for i in range(40)})
    store = FeatureStore(tmp_path)
    keys = store.keys()
    expected = {i: float(r["features"].astype(np.float64).sum() + r["boxes"].sum())
                for i, r in ((i, synthetic_record(k, 30)) for i, k in enumerate(keys))}
    root = str(__import__("pathlib").Path(__file__).parents[2])  # where `tests` imports from
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=root)
    loader = torch.utils.data.DataLoader(Checksums(store, keys * 5), batch_size=8, num_workers=2, shuffle=True,
                                         persistent_workers=True)
    epochs = 0
    try:
        while not writer_active(store.shards[0]) and writer.poll() is None:
            time.sleep(0.01)
        while writer.poll() is None or epochs < 2:
            for indices, sums in loader:
                for i, s in zip(indices.tolist(), sums.tolist()):
                    assert s == pytest.approx(expected[i % len(keys)], rel=1e-12)
            epochs += 1
    finally:
        assert writer.wait(timeout=120) == 0
    store.refresh()
    assert len(store) == 120
    env, _ = store.shard_env(0)
    assert env.info()["map_size"] > 128 * 1024
    assert verify_store(tmp_path).problems == []


class BothStores(torch.utils.data.Dataset):
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __len__(self):
        return len(self.a)

    def __getitem__(self, i):
        key = self.a.keys()[i]
        return bool(np.array_equal(self.a[key]["features"], self.b[key]["features"]))


def test_two_readers_of_one_store_work_in_forked_workers(tmp_path):
    """LMDB refuses a second handle on an environment in one process; readers share one, and a
    forked worker drops the parent's before opening its own."""
    with FeatureStoreWriter(tmp_path, meta()) as writer:
        writer.commit({f"{i}": synthetic_record(f"{i}") for i in range(8)})
    a, b = FeatureStore(tmp_path), FeatureStore(tmp_path)
    a["0"], b["0"]  # both open in the parent before the fork
    loader = torch.utils.data.DataLoader(BothStores(a, b), batch_size=None, num_workers=1,
                                         multiprocessing_context="fork")
    assert list(loader) == [True] * 8
    a.close()
    assert b["7"]["boxes"].shape == (5, 4)
