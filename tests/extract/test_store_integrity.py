"""Damage a user can cause, caught: flipped bits in records and keys, truncated and byte-damaged shard
files, an edited or incomplete meta.json, and stores written before records had checksums."""

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from extract.store import SCHEMA_VERSION, DamagedRecordError, FeatureStore, FeatureStoreWriter, StoreError
from extract.store.audit import verify_store
from extract.store.lmdb_file import P_BRANCH, P_LEAF
from pipelines.cli import main
from tests.helpers.stores import data_file, flip_bit_in, meta, synthetic_record
from train.data.regions import RegionBank

TESTS = Path(__file__).parents[1]
PAGE = 4096
OVERFLOW = 0x04


def write_store(root: Path, count: int = 24) -> dict[str, dict]:
    """Records of 3 to 40 boxes, so that some values sit in leaf pages and some on overflow pages."""
    records = {f"img{i:03d}": synthetic_record(f"img{i:03d}", num_boxes=3 + (7 * i) % 38, variants=2)
               for i in range(count)}
    with FeatureStoreWriter(root, meta(variants=2)) as writer:
        for start in range(0, count, 8):
            writer.commit({k: records[k] for k in list(records)[start : start + 8]})
    return records


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("Error:")]


def test_a_flipped_bit_in_a_stored_feature_is_caught_and_named(tmp_path):
    records = write_store(tmp_path / "store")
    flip_bit_in(data_file(tmp_path / "store"), records["img005"]["features"].tobytes())
    with FeatureStore(tmp_path / "store") as store:
        assert np.array_equal(store["img004"]["features"], records["img004"]["features"])
        with pytest.raises(DamagedRecordError, match="record 'img005' is damaged: checksum mismatch") as caught:
            store["img005"]
    assert caught.value.image_id == "img005"
    assert verify_store(tmp_path / "store").problems == [
        "img005: damaged: checksum mismatch: its bytes changed after it was written"]

    verified = cli("cache", "verify", str(tmp_path / "store"))
    assert verified.exit_code == 1 and "img005: damaged: checksum mismatch" in verified.output
    exported = cli("cache", "export", str(tmp_path / "store"), "--format", "tsv", "--out", str(tmp_path / "x.tsv"))
    assert exported.exit_code == 1 and len(error_lines(exported)) == 1 and "'img005' is damaged" in exported.output
    assert not (tmp_path / "x.tsv").exists() and list(tmp_path.glob(".x.tsv*")) == []  # nothing half-written


def test_a_damaged_record_read_without_its_variants_is_still_refused(tmp_path):
    """Fine-tuning does not decode the masked variants; the checksum over every byte still guards them."""
    records = write_store(tmp_path / "store")
    flip_bit_in(data_file(tmp_path / "store"), records["img005"]["masked_features"][0, 1].tobytes())  # a stored row
    bank = RegionBank(str(tmp_path / "store"))
    assert np.array_equal(bank.get("img004").appearance[1:], records["img004"]["features"])
    with pytest.raises(DamagedRecordError, match="record 'img005' is damaged: checksum mismatch"):
        bank.get("img005")
    with pytest.raises(DamagedRecordError, match="checksum mismatch"):
        bank.store.decoded("img005", fields=("boxes",))


def test_a_record_read_under_a_damaged_key_is_caught(tmp_path):
    write_store(tmp_path / "store")
    # "img023" becomes "img123": still the last key, so LMDB finds it, and only the checksum, which
    # covers the key, tells that this record was not written under it.
    flip_bit_in(data_file(tmp_path / "store"), b"img023", bit=0)
    with FeatureStore(tmp_path / "store") as store:
        assert "img023" not in store and "img123" in store
        with pytest.raises(DamagedRecordError, match="'img123' is damaged: checksum mismatch"):
            store["img123"]
    assert verify_store(tmp_path / "store").problems == [
        "img123: damaged: checksum mismatch: its bytes changed after it was written"]


def test_stores_written_before_checksums_stay_readable_and_take_checksummed_records(tmp_path):
    """tests/data/store-v1 was written by the code before records had checksums (schema 1)."""
    root = tmp_path / "store-v1"
    shutil.copytree(TESTS / "data" / "store-v1", root)
    with FeatureStore(root) as store:
        assert store.keys() == ["img0", "img1", "img2"]
        for image_id in store:
            expected = synthetic_record(image_id, num_boxes=4 + int(image_id[-1]), variants=2)
            assert all(np.array_equal(store[image_id][k], v) for k, v in expected.items() if isinstance(v, np.ndarray))
    result = verify_store(root)
    assert (result.records, result.unchecked, result.problems) == (3, 3, [])
    assert "3 records, 0 checksums match, 3 written before records had checksums" in cli("cache", "verify", str(root)).output

    with FeatureStoreWriter(root, meta(variants=2)) as writer:  # resuming an old store
        writer.commit({"img3": synthetic_record("img3", variants=2)})
    assert json.loads((root / "meta.json").read_text())["schema_version"] == SCHEMA_VERSION
    result = verify_store(root)
    assert (result.records, result.unchecked, result.problems) == (4, 3, [])


def test_truncated_and_damaged_shard_files_give_one_line_errors(tmp_path):
    clean = tmp_path / "clean"
    write_store(clean)
    size = data_file(clean).stat().st_size
    truncated, header = tmp_path / "truncated", tmp_path / "header"
    for root in (truncated, header):
        shutil.copytree(clean, root)
    with data_file(truncated).open("r+b") as f:
        f.truncate(size // 2)
    data = bytearray(data_file(header).read_bytes())
    data[16:20] = b"\0\0\0\0"  # meta page 0's magic
    data_file(header).write_bytes(bytes(data))

    for root, why in ((truncated, f"truncated: {size // 2} bytes"), (header, "meta page 0 is damaged")):
        with pytest.raises(StoreError, match=why):
            FeatureStore(root)
        for command in (["cache", "export", str(root), "--format", "npz", "--out", str(tmp_path / "npz")],
                        ["cache", "verify", str(root)]):
            result = cli(*command)
            assert result.exit_code == 1 and why in result.output, result.output
        info = cli("cache", "info", str(root))
        assert info.exit_code == 0 and f"{data_file(root)}: damaged: {why}" in info.output


def test_verify_reports_a_damaged_shard_and_still_checks_the_others(tmp_path):
    root = tmp_path / "store"
    records = {f"s{shard}-{i}": synthetic_record(f"s{shard}-{i}", num_boxes=30) for shard in range(2) for i in range(4)}
    for shard in range(2):
        with FeatureStoreWriter(root, meta(), shard=(shard, 2)) as writer:
            writer.commit({k: v for k, v in records.items() if k.startswith(f"s{shard}-")})
    first, second = (root / "shards" / f"shard-0000{i}-of-00002" / "data.mdb" for i in range(2))
    with first.open("r+b") as f:
        f.truncate(first.stat().st_size // 2)
    flip_bit_in(second, records["s1-2"]["features"].tobytes())
    result = verify_store(root)
    assert result.records == 4 and len(result.problems) == 2
    assert result.problems[0].startswith(f"{first}: damaged: truncated")
    assert result.problems[1] == "s1-2: damaged: checksum mismatch: its bytes changed after it was written"


def damage_plan(data: bytes, rng: np.random.Generator, tree: int, overflow: int) -> list:
    """Truncations at several points, and byte damage in the meta pages, in branch and leaf pages
    (what LMDB follows) and in overflow pages (the record bytes)."""
    pages = len(data) // PAGE
    flags = [struct.unpack_from("<H", data, p * PAGE + 10)[0] for p in range(pages)]
    tree_pages = [p for p in range(2, pages) if flags[p] & (P_BRANCH | P_LEAF)]
    overflow_pages = [p for p in range(2, pages) if flags[p] & OVERFLOW]
    assert tree_pages and overflow_pages

    def xor(page_choices, count):
        return [["xor", int(rng.choice(page_choices)) * PAGE + int(rng.integers(0, PAGE)), int(rng.integers(1, 256))]
                for _ in range(count)]

    plan = [["truncate", int(n), 0] for n in np.linspace(0, len(data) - 1, 8).astype(int)]
    plan += [["xor", int(rng.integers(0, 2 * PAGE)), int(1 << rng.integers(0, 8))] for _ in range(tree // 2)]
    return plan + xor(tree_pages, tree) + xor(overflow_pages, overflow)


def run_damage(tmp_path: Path, seed: int, tree: int, overflow: int) -> list[dict]:
    clean = tmp_path / "clean"
    write_store(clean)
    plan = damage_plan(data_file(clean).read_bytes(), np.random.default_rng(seed), tree, overflow)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    work = tmp_path / "work"
    work.mkdir()
    job = subprocess.run([sys.executable, "-m", "tests.helpers.store_damage", str(clean), str(work),
                          str(tmp_path / "plan.json")], capture_output=True, text=True, timeout=900,
                         cwd=TESTS.parent)
    outcomes = [json.loads(line) for line in job.stdout.splitlines()]
    where = plan[len(outcomes)] if len(outcomes) < len(plan) else None
    assert job.returncode == 0, f"died ({job.returncode}) on {where}: {job.stderr[-2000:]}"
    assert len(outcomes) == len(plan)
    for outcome, mutation in zip(outcomes, plan):
        assert all("\n" not in message for message in outcome["messages"]), (mutation, outcome)
        if not outcome["detected"]:  # harmless damage (free space, an unused field): nothing may change
            assert outcome["same"] and not outcome["messages"], (mutation, outcome)
    return outcomes


def test_damaged_shard_files_are_reported_or_harmless_never_a_signal(tmp_path):
    outcomes = run_damage(tmp_path, seed=0, tree=40, overflow=16)
    assert all(o["detected"] for o in outcomes[:8])  # the truncations
    assert any(o["detected"] for o in outcomes[8:])  # the byte damage reached pages in use


@pytest.mark.slow
def test_many_damaged_shard_files(tmp_path):
    run_damage(tmp_path, seed=1, tree=600, overflow=300)


def edit_meta(root: Path, edit) -> None:
    meta_path = root / "meta.json"
    values = json.loads(meta_path.read_text())
    edit(values)
    meta_path.write_text(json.dumps(values))


@pytest.mark.parametrize("edit, problem", [
    (lambda m: m["features"].update(dtype="float32"), "features: float16 values, expected float32"),
    (lambda m: m["features"].update(dim=64), "features: 32 features per row, expected 64 (meta.json features.dim)"),
])
def test_an_edited_meta_json_is_one_line_in_verify_and_refused_by_export(tmp_path, edit, problem):
    write_store(tmp_path / "store")
    edit_meta(tmp_path / "store", edit)
    problems = verify_store(tmp_path / "store").problems
    assert any(p.startswith(f"24 of 24 records: {problem}") for p in problems), problems
    assert len(problems) <= 5, problems  # one line per field in the feature dtype, not one per record
    with pytest.raises(StoreError, match="records disagree with meta.json"):
        FeatureStore(tmp_path / "store").check_agreement()
    exported = cli("cache", "export", str(tmp_path / "store"), "--format", "npz", "--out", str(tmp_path / "npz"))
    assert exported.exit_code == 1 and problem in exported.output and not (tmp_path / "npz").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("features"), "`features` is missing"),
    (lambda m: m["mask_variants"].update(count="two"), "`mask_variants.count` is 'two', expected a non-negative"),
    (lambda m: m.update(schema_version=7), "schema version 7, this code reads 1, 2, 3"),
])
def test_an_incomplete_meta_json_is_refused_in_one_line(tmp_path, edit, message):
    write_store(tmp_path / "store", count=2)
    edit_meta(tmp_path / "store", edit)
    for command in ("info", "verify"):
        result = cli("cache", command, str(tmp_path / "store"))
        assert result.exit_code == 1 and error_lines(result) and message in error_lines(result)[0], result.output


def test_verify_says_that_a_store_without_records_is_empty(tmp_path):
    with FeatureStoreWriter(tmp_path / "store", meta()):
        pass
    result = cli("cache", "verify", str(tmp_path / "store"))
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {tmp_path / 'store'}: empty store (0 records): nothing to verify"
