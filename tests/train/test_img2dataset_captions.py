"""Captions from img2dataset's output: its webdataset tar shards or its files, with the per-shard
status parquet; and CC and SBU read with their images in tar shards."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.helpers.shards import write_tar
from tests.train.test_captions import NOT_AN_IMAGE, read_jsonl
from tests.train.test_sbu import url, write_sbu
from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources import img2dataset
from train.data.sources.captions import CONCEPTUAL_CAPTIONS
from train.data.sources.img2dataset import SOURCE
from train.data.sources.sbu import SOURCE as SBU

pq = pytest.importorskip("pyarrow.parquet")


def write_output(folder: Path, rows: dict[int, tuple[str, bytes | None]], shards: bool,
                 extension: str = "jpg") -> None:
    """img2dataset's output for `rows` (row → (status or "success", caption bytes)): per shard of
    10,000 rows a tar (`shards`) or a folder of files, and the status parquet beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in sorted({row // 10_000 for row in rows}):
        keys = [row for row in sorted(rows) if row // 10_000 == shard]
        members = []
        for row in keys:
            status, caption = rows[row]
            key = f"{row:09d}"
            if status == "success":
                members.append((f"{key}.{extension}", NOT_AN_IMAGE))
            if caption is not None:
                members.append((f"{key}.txt", caption))
            members.append((f"{key}.json", json.dumps({"key": key, "status": status}).encode()))
        if shards:
            write_tar(folder / f"{shard:05d}.tar", members)
        else:
            for name, data in members:
                (folder / f"{shard:05d}").mkdir(exist_ok=True)
                (folder / f"{shard:05d}" / name).write_bytes(data)
        pq.write_table(_status_table(keys, rows), folder / f"{shard:05d}.parquet")


def _status_table(keys: list[int], rows: dict[int, tuple[str, bytes | None]]):
    import pyarrow

    statuses = [rows[row][0] for row in keys]
    return pyarrow.table({
        "key": [f"{row:09d}" for row in keys], "status": statuses,
        "error_message": [None if status == "success" else "HTTP Error 404: Not Found" for status in statuses],
        "caption": [(rows[row][1] or b"").decode("utf-8", "replace") for row in keys],
        "url": [url(row).decode() for row in keys]})


ROWS = {0: ("success", b"A dog on grass."), 1: ("failed_to_download", b"A cat."), 2: ("success", b"  "),
        3: ("success", b"caf\xe9"), 4: ("success", None), 10_000: ("success", b" Two birds.\n")}


@pytest.mark.parametrize("shards", [True, False], ids=["webdataset", "files"])
def test_captions_from_img2dataset_output_with_failures_from_its_parquet(tmp_path: Path, shards: bool) -> None:
    images = tmp_path / "images"
    write_output(images / "sbu", ROWS, shards)

    summary = prepare_dataset(SOURCE, images / "sbu", tmp_path / "out", images, log=lambda _: None)

    assert read_jsonl(tmp_path / "out" / "training.jsonl") == [
        {"file": "sbu/00000/000000000.jpg", "captions": ["A dog on grass."]},
        {"file": "sbu/00001/000010000.jpg", "captions": ["Two birds."]}]
    assert summary["splits"] == {"training": {"items": 2, "skipped": 4, "missing_images": 1,
                                              "statuses": {"failed_to_download": 1, "success": 5}}}
    parquet = images / "sbu" / "00000.parquet"
    assert read_jsonl(tmp_path / "out" / "skipped.jsonl") == [
        {"split": "training", "id": "sbu/00000/000000002", "reason": "sbu/00000/000000002: empty or whitespace-only caption"},
        {"split": "training", "id": "sbu/00000/000000003", "reason": "sbu/00000/000000003: the caption is not UTF-8 text"},
        {"split": "training", "id": "sbu/00000/000000004", "reason": "sbu/00000/000000004: no caption (.txt) saved"},
        {"split": "training", "id": "sbu/00000/000000001",
         "reason": f"{parquet}: 000000001: img2dataset status failed_to_download: HTTP Error 404: Not Found"}]


def test_img2dataset_success_without_an_image_in_the_shard_is_a_missing_image(tmp_path: Path) -> None:
    images = tmp_path / "images"
    write_output(images, {0: ("success", b"a dog"), 1: ("success", b"a cat")}, shards=True)
    pq.write_table(_status_table([0, 1, 2], {0: ("success", None), 1: ("success", None), 2: ("success", None)}),
                   images / "00000.parquet")  # row 2 reported downloaded, but the shard lacks it

    summary = prepare_dataset(SOURCE, images, tmp_path / "out", log=lambda _: None, split="validation")

    assert summary["splits"]["validation"]["missing_images"] == 1
    assert read_jsonl(tmp_path / "out" / "skipped.jsonl")[0]["reason"].endswith(
        "000000002: downloaded, but no image in the shard")
    with pytest.raises(DataError, match=r"1 of 3 items \(33\.3%\) have no image .*more than --max-missing 10\.0%"):
        prepare_dataset(SOURCE, images, tmp_path / "out2", max_missing=0.1, log=lambda _: None)


def test_img2dataset_root_outside_images_and_a_parquet_without_status_are_refused(tmp_path: Path) -> None:
    images, other = tmp_path / "images", tmp_path / "other"
    write_output(other, {0: ("success", b"a dog")}, shards=True)
    images.mkdir()
    with pytest.raises(DataError, match="img2dataset's output folder must be --images .* or lie inside it"):
        prepare_dataset(SOURCE, other, tmp_path / "out", images, log=lambda _: None)
    pq.write_table(pq.read_table(other / "00000.parquet").drop_columns(["status"]), other / "00000.parquet")
    with pytest.raises(DataError, match=r"00000\.parquet: not img2dataset's status table: no column status"):
        prepare_dataset(SOURCE, other, tmp_path / "out", log=lambda _: None)


def test_missing_pyarrow_is_one_line_saying_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(img2dataset.UserError, match=r"needs pyarrow, a dependency of vlbert-pipeline that is not installed here: pip install 'pyarrow>=14'$"):
        img2dataset.pyarrow_parquet()


def test_cc_and_sbu_find_their_images_in_tar_shards_as_in_files(tmp_path: Path) -> None:
    """The same rows prepare to the same records from img2dataset's webdataset and files output."""
    root = tmp_path / "published"
    write_sbu(root, [url(row) for row in range(10_001)], [f"photo {row}".encode() for row in range(10_001)])
    (root / "Train_GCC-training.tsv").write_bytes(b"".join(f"caption {row}\t{url(row).decode()}\n".encode()
                                                          for row in range(10_001)))
    downloaded = {0: ("success", b"x"), 2: ("success", b"x"), 10_000: ("success", b"x")}
    records = {}
    for shards in (True, False):
        images = tmp_path / ("shards" if shards else "files")
        write_output(images / "sbu", downloaded, shards, extension="png" if shards else "jpg")
        write_output(images / "training", downloaded, shards)
        for source in (SBU, CONCEPTUAL_CAPTIONS):
            out = tmp_path / f"{source.name}-{shards}"
            summary = prepare_dataset(source, root, out, images, log=lambda _: None)
            assert summary["splits"]["training"]["items"] == 3
            assert summary["splits"]["training"]["missing_images"] == 10_001 - 3
            records[source.name, shards] = read_jsonl(out / "training.jsonl")
    assert records["sbu", True] == [{"file": f"sbu/{stem}.png", "captions": [f"photo {row}"]}
                                    for row, stem in ((0, "00000/000000000"), (2, "00000/000000002"),
                                                      (10_000, "00001/000010000"))]
    assert [record["file"].replace(".jpg", ".png") for record in records["sbu", False]] == \
        [record["file"] for record in records["sbu", True]]
    assert records["cc", True] == records["cc", False] == [
        {"file": f"training/{stem}.jpg", "captions": [f"caption {row}"]}
        for row, stem in ((0, "00000/000000000"), (2, "00000/000000002"), (10_000, "00001/000010000"))]


def test_the_command_line_prepares_img2dataset_output_and_joins_sbu_files(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pipelines.cli import main

    images = tmp_path / "images"
    write_output(images / "cc3m", {0: ("success", b"a dog"), 1: ("failed_to_resize", None)}, shards=True)
    result = CliRunner().invoke(main, ["data", "prepare", "img2dataset", "--root", str(images / "cc3m"), "--images",
                                       str(images), "--out", str(tmp_path / "out"), "--split", "validation"])
    assert result.exit_code == 0, result.output
    assert read_jsonl(tmp_path / "out" / "validation.jsonl") == [{"file": "cc3m/00000/000000000.jpg",
                                                                  "captions": ["a dog"]}]
    refused = CliRunner().invoke(main, ["data", "prepare", "img2dataset", "--root", str(images / "cc3m"), "--images",
                                        str(images), "--out", str(tmp_path / "out2"), "--split", "../up"])
    assert refused.exit_code != 0 and "--split '../up': expected a name" in refused.output
    write_sbu(tmp_path / "sbu", [url(0), url(1)], [b"a dog", b"a cat"])
    joined = CliRunner().invoke(main, ["data", "sbu-urls", "--root", str(tmp_path / "sbu"),
                                       "--out", str(tmp_path / "sbu.parquet")])
    assert joined.exit_code == 0, joined.output
    assert pq.read_table(tmp_path / "sbu.parquet").to_pydict() == {"url": [url(0).decode(), url(1).decode()],
                                                                   "caption": ["a dog", "a cat"]}


def test_a_truncated_shard_gives_its_whole_samples_and_names_the_damage(tmp_path: Path) -> None:
    """prepare finds the images before a shard's damage; the rows after it are missing images."""
    images = tmp_path / "images"
    write_sbu(tmp_path / "sbu", [url(row) for row in range(4)], [f"photo {row}".encode() for row in range(4)])
    write_output(images / "sbu", {row: ("success", b"x") for row in range(4)}, shards=True)
    tar = images / "sbu" / "00000.tar"
    with tarfile.open(tar) as archive:
        cut = next(member for member in archive.getmembers() if member.name == "000000002.jpg").offset_data + 3
    tar.write_bytes(tar.read_bytes()[:cut])  # truncated inside row 2's image
    logged: list[str] = []

    summary = prepare_dataset(SBU, tmp_path / "sbu", tmp_path / "out", images, log=logged.append)

    assert [record["file"] for record in read_jsonl(tmp_path / "out" / "training.jsonl")] == [
        "sbu/00000/000000000.jpg", "sbu/00000/000000001.jpg"]
    assert summary["splits"]["training"]["missing_images"] == 2
    assert any(message.startswith(f"{tar}: truncated in member 000000002.jpg") for message in logged), logged
