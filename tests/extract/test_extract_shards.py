"""Extraction from img2dataset's tar shards: the same store as from its files output, sharding by tar
shard, resume, damage, image lists, the CLI and the pipeline step; and the demo world's shard writer."""

import json
import shutil
import tarfile

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from extract.extraction_config import ExtractionConfig
from extract.job import images_not_in_store, run_extraction
from extract.shard_source import LEDGER
from extract.store import FeatureStore
from extract.store.audit import verify_store
from pipelines.cli import main
from pipelines.world import generate_world
from pipelines.world.shards import PARQUET_SCHEMA, URL_PREFIX, write_img2dataset
from tests.helpers.shards import write_tar

RUN = dict(batch_size=3, progress=False, decode_workers=0)
IGNORED_META = ("created", "images_root", "source")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A world of 8 images as img2dataset's webdataset and files outputs, 3 samples a shard; the
    second row is a failed download."""
    root = tmp_path_factory.mktemp("img2dataset")
    generate_world(root / "world", 8, seed=3)
    failed = {URL_PREFIX + "images/train/000001.png"}
    rows = write_img2dataset(root / "world", root / "webdataset", "webdataset", 3, failed)
    assert write_img2dataset(root / "world", root / "files", "files", 3, failed) == rows
    return root, rows


@pytest.fixture(scope="module")
def from_files(outputs, tmp_path_factory):
    root, _ = outputs
    out = tmp_path_factory.mktemp("from-files") / "store"
    summary = run_extraction(ExtractionConfig(root / "files", "tiny", **RUN), out)
    assert (summary.written, summary.failed) == (7, 0)
    return out


def records(store_path):
    with FeatureStore(store_path) as store:
        return {key: bytes(store.raw(key)) for key in store.keys()}


def meta(store_path):
    data = json.loads((store_path / "meta.json").read_text())
    return {k: v for k, v in data.items() if k not in IGNORED_META}


def failures(store_path):
    return {f["id"]: f for f in map(json.loads, (store_path / "failures.jsonl").read_text().splitlines())}


def test_world_writes_what_img2dataset_writes(outputs):
    root, rows = outputs
    assert sorted(p.name for p in (root / "webdataset").iterdir()) == [
        f"0000{n}{suffix}" for n in range(3) for suffix in (".parquet", ".tar", "_stats.json")]
    table = pq.read_table(root / "webdataset/00000.parquet")
    assert table.schema.names == PARQUET_SCHEMA.names
    assert table.column("key").to_pylist() == ["000000", "000001", "000002"]  # ceil(log10(3)) + 5 digits
    assert table.column("status").to_pylist() == ["success", "failed_to_download", "success"]
    stats = json.loads((root / "webdataset/00000_stats.json").read_text())
    assert (stats["count"], stats["successes"], stats["failed_to_download"]) == (3, 2, 1)
    with tarfile.open(root / "webdataset/00000.tar") as archive:
        assert archive.getnames() == ["000000.jpg", "000000.json", "000000.txt",
                                      "000002.jpg", "000002.json", "000002.txt"]
        caption = archive.extractfile("000002.txt").read().decode()
        info = json.loads(archive.extractfile("000002.json").read())
        jpeg = archive.extractfile("000002.jpg").read()
    assert caption == rows[2]["caption"] and info["key"] == "000002" and info["url"] == rows[2]["url"]
    assert (root / "files/00000/000002.jpg").read_bytes() == jpeg
    assert (root / "files/00000/000002.txt").read_text() == caption
    assert not (root / "files/00000/000001.jpg").exists()
    assert [r["key"] for r in rows] == ["000000", "000001", "000002", "000003", "000004", "000005", "000006",
                                        "000007"]


def test_shards_and_files_give_bitwise_equal_stores(outputs, from_files, tmp_path):
    root, _ = outputs
    out = tmp_path / "store"
    summary = run_extraction(ExtractionConfig(f"{root}/webdataset/{{00000..00002}}.tar", "tiny",
                                              **(RUN | {"decode_workers": 2})), out)
    assert (summary.tar_shards, summary.tar_shards_done, summary.written, summary.failed, summary.damaged) == \
        (3, 0, 7, 0, 0)
    reference = records(from_files)
    assert list(reference) == ["00000/000000", "00000/000002", "00001/000003", "00001/000004", "00001/000005",
                               "00002/000006", "00002/000007"]
    assert records(out) == reference
    assert meta(out) == meta(from_files)
    assert json.loads((out / "meta.json").read_text())["source"].startswith("tar shards ")
    assert verify_store(out).problems == []


def test_every_nth_tar_shard_per_task_and_resume_reads_nothing_again(outputs, from_files, tmp_path, monkeypatch):
    root, _ = outputs
    out = tmp_path / "store"
    first = run_extraction(ExtractionConfig(root / "webdataset", "tiny", shard=(0, 2), **RUN), out)
    assert (first.tar_shards, first.written) == (2, 4)  # tar shards 00000 and 00002
    assert images_not_in_store(root / "webdataset", out) == ["00001.tar"]
    second = run_extraction(ExtractionConfig(root / "webdataset", "tiny", shard=(1, 2), **RUN), out)
    assert (second.tar_shards, second.written) == (1, 3)
    assert images_not_in_store(root / "webdataset", out) == []
    assert records(out) == records(from_files)
    ledger = [json.loads(line) for line in (out / LEDGER / "shard-00000-of-00002.jsonl").read_text().splitlines()]
    assert [(entry["shard"], entry["samples"]) for entry in ledger] == [("00000", 2), ("00002", 2)]

    import extract.shard_source
    monkeypatch.setattr(extract.shard_source, "read_shard", pytest.fail)  # a committed shard is not read
    again = run_extraction(ExtractionConfig(root / "webdataset", "tiny", shard=(0, 2), **RUN), out)
    assert (again.tar_shards, again.tar_shards_done, again.written, again.failed) == (2, 2, 0, 0)


def test_a_shard_killed_midway_is_read_again_and_adds_nothing_twice(outputs, from_files, tmp_path):
    root, _ = outputs
    out = tmp_path / "store"
    run_extraction(ExtractionConfig(root / "webdataset", "tiny", **RUN), out)
    shutil.rmtree(out / LEDGER)  # as if killed after its last commit, before the ledger line
    again = run_extraction(ExtractionConfig(root / "webdataset", "tiny", **RUN), out)
    assert (again.tar_shards_done, again.skipped, again.written, again.failed) == (0, 7, 0, 0)
    assert records(out) == records(from_files)


def copy_with(source, target, change):
    """The tar shard `source` rewritten to `target` with its members as `change(list of (name, bytes))` returns them."""
    with tarfile.open(source) as archive:
        members = [(m.name, archive.extractfile(m).read()) for m in archive.getmembers()]
    return write_tar(target, change(members))


def test_damage_is_named_the_rest_extracted_and_a_rerun_adds_nothing(outputs, from_files, tmp_path):
    root, _ = outputs
    shards = tmp_path / "shards"
    shards.mkdir()
    # 00000: 000000's JPEG is corrupt; 00001: 000004 lost its image; 00002: truncated inside 000007's image
    copy_with(root / "webdataset/00000.tar", shards / "00000.tar",
              lambda ms: [(n, b"\xff\xd8garbage" if n == "000000.jpg" else d) for n, d in ms])
    copy_with(root / "webdataset/00001.tar", shards / "00001.tar",
              lambda ms: [(n, d) for n, d in ms if n != "000004.jpg"])
    shutil.copy(root / "webdataset/00002.tar", shards / "00002.tar")
    with tarfile.open(shards / "00002.tar") as archive:
        cut = archive.getmember("000007.jpg").offset_data + 100
    with open(shards / "00002.tar", "r+b") as handle:
        handle.truncate(cut)

    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["extract", "--images", f"{shards}/*.tar", "--out", str(out), "--detector",
                                       "tiny", "--batch-size", "3", "--workers", "0", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "tar shards: 3 in this shard, 0 complete before (skipped), 3 read; 1 damage(s) met" in result.output
    expected = {k: v for k, v in records(from_files).items()
                if k not in ("00000/000000", "00001/000004", "00002/000007")}
    assert records(out) == expected
    failed = failures(out)
    assert sorted(failed) == ["00000/000000", "00001/000004", "00002.tar#1"]
    assert "not an image file" in failed["00000/000000"]["error"]
    assert failed["00000/000000"]["image"] == "00000.tar:000000.jpg"
    assert failed["00001/000004"]["error"] == "00001.tar: sample 000004 has no image member (its members: json, txt)"
    assert "truncated in member 000007.jpg (100 of" in failed["00002.tar#1"]["error"]
    assert failed["00002.tar#1"]["image"] == "00002.tar"

    strict = CliRunner().invoke(main, ["extract", "--images", f"{shards}/*.tar", "--out", str(out), "--detector",
                                       "tiny", "--workers", "0", "--quiet", "--strict"])
    assert strict.exit_code == 0, strict.output  # every shard complete: nothing read, nothing failed this time
    assert "3 complete before (skipped), 0 read" in strict.output and "0 written, 0 failed" in strict.output
    assert records(out) == expected and sorted(failures(out)) == sorted(failed)
    shutil.rmtree(out / LEDGER)
    rerun = run_extraction(ExtractionConfig(f"{shards}/*.tar", "tiny", **RUN), out)
    assert (rerun.skipped, rerun.written, rerun.failed, rerun.damaged) == (4, 0, 3, 1)
    assert records(out) == expected and sorted(failures(out)) == sorted(failed)
    strict = CliRunner().invoke(main, ["extract", "--images", f"{shards}/*.tar", "--out", str(tmp_path / "other"),
                                       "--detector", "tiny", "--workers", "0", "--quiet", "--strict"])
    assert strict.exit_code == 1 and "3 image(s) failed (--strict)" in strict.output


def test_image_list_picks_samples_of_shards(outputs, from_files, tmp_path):
    root, _ = outputs
    image_list = tmp_path / "images.txt"
    image_list.write_text("00000/000002.jpg\n00001/000005.jpg\n00001/000009.jpg\n00009/000001.jpg\n")
    out = tmp_path / "store"
    summary = run_extraction(ExtractionConfig(root / "webdataset", "tiny", image_list=image_list, **RUN), out)
    assert (summary.written, summary.failed) == (2, 2)
    assert records(out) == {k: v for k, v in records(from_files).items() if k in ("00000/000002", "00001/000005")}
    failed = failures(out)
    assert failed["00001/000009"]["error"].startswith("listed, but the tar shard ")
    assert failed["00009/000001"]["error"].startswith("listed, but no tar shard of ")


def test_boxes_and_missing_shards_are_refused(outputs, tmp_path):
    root, _ = outputs
    (tmp_path / "boxes.json").write_text("{}")
    result = CliRunner().invoke(main, ["extract", "--images", str(root / "webdataset"), "--out", str(tmp_path / "s"),
                                       "--detector", "tiny", "--boxes", str(tmp_path / "boxes.json")])
    assert result.exit_code == 2 and "--boxes with tar shards" in result.output
    result = CliRunner().invoke(main, ["extract", "--images", f"{root}/webdataset/{{00000..00005}}.tar", "--out",
                                       str(tmp_path / "s"), "--detector", "tiny"])
    assert result.exit_code == 2 and "3 of the shards it names do not exist" in result.output


def test_pipeline_extracts_the_world_shards_in_processes_each_taking_whole_tar_shards(tmp_path):
    from pipelines.runner import run_pipeline
    from tests.helpers.pipelines import write_pipeline

    steps = [{"name": "world", "kind": "world", "images": 5, "seed": 2, "img2dataset": True, "samples_per_shard": 2},
             {"name": "tars", "kind": "extract", "images": "${world}/img2dataset/webdataset/{00000..00002}.tar",
              "shards": 2, "detector": "tiny", "batch_size": 2, "progress": False, "decode_workers": 0}]
    out = run_pipeline(write_pipeline(tmp_path, steps), log=lambda _: None, jobs=None, threads=1)
    assert list(records(out / "tars")) == ["00000/000000", "00000/000001", "00001/000002", "00001/000003",
                                           "00002/000004"]
    assert "every shard complete" in (out / "tars" / "log.txt").read_text()
    assert sorted(p.name for p in (out / "tars" / LEDGER).iterdir()) == ["shard-00000-of-00002.jsonl",
                                                                         "shard-00001-of-00002.jsonl"]
    assert (out / "world/img2dataset/files/00002/000004.jpg").read_bytes()  # the files output beside it
