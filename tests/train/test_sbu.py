"""SBU Captions: the two published files, line-aligned, with images where img2dataset writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train.test_captions import ANY_IMAGE, read_jsonl, touch
from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources.sbu import CAPTIONS, SOURCE, URLS, write_sbu_url_table


def write_sbu(root: Path, urls: list[bytes], captions: list[bytes]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / URLS).write_bytes(b"".join(url + b"\n" for url in urls))
    (root / CAPTIONS).write_bytes(b"".join(caption + b"\n" for caption in captions))


def url(row: int) -> bytes:
    return f"http://static.flickr.com/{row}/{row}_0.jpg".encode()


ROWS = 10_002  # rows 10,000 and 10,001 fall in img2dataset's second shard


@pytest.fixture()
def sbu(tmp_path: Path) -> tuple[Path, Path]:
    root, images = tmp_path / "sbu", tmp_path / "images"
    captions = [f"photo {row} of a dog".encode() for row in range(ROWS)]
    captions[2] = b"   "  # blank
    captions[3] = b"caf\xe9 latte"  # Latin-1, not UTF-8
    urls = [url(row) for row in range(ROWS)]
    urls[4] = b""
    captions[10_001] = b"  Man with a hat.\r"  # a CRLF file's line end and spaces are not the caption's
    write_sbu(root, urls, captions)
    # Rows 0, 1 (png), 2, 3, 4 and 10,001 downloaded; row 5 (and every other) failed.
    touch(images, "sbu/00000/000000000.jpg", "sbu/00000/000000001.png", "sbu/00000/000000002.jpg",
          "sbu/00000/000000003.jpg", "sbu/00000/000000004.jpg", "sbu/00001/000010001.jpg")
    return root, images


def test_sbu_rows_name_images_as_img2dataset_and_skip_with_line_numbers(sbu, tmp_path: Path) -> None:
    root, images = sbu
    out = tmp_path / "out"

    summary = prepare_dataset(SOURCE, root, out, images, log=lambda _: None)

    assert read_jsonl(out / "training.jsonl") == [
        {"file": "sbu/00000/000000000.jpg", "captions": ["photo 0 of a dog"]},
        {"file": "sbu/00000/000000001.png", "captions": ["photo 1 of a dog"]},
        {"file": "sbu/00001/000010001.jpg", "captions": ["Man with a hat."]}]
    assert (out / "images.txt").read_text().split() == [
        "sbu/00000/000000000.jpg", "sbu/00000/000000001.png", "sbu/00001/000010001.jpg"]
    missing = ROWS - 6
    assert summary["splits"] == {"training": {"items": 3, "skipped": 3 + missing, "missing_images": missing}}
    skipped = read_jsonl(out / "skipped.jsonl")
    assert skipped[:4] == [
        {"split": "training", "id": 2, "reason": f"{root / CAPTIONS}:3: empty or whitespace-only caption"},
        {"split": "training", "id": 3, "reason": f"{root / CAPTIONS}:4: the caption is not UTF-8 text"},
        {"split": "training", "id": 4, "reason": f"{root / CAPTIONS}:5: blank URL"},
        {"split": "training", "id": 5, "reason": f"no image found as {images}/sbu/00000/000000005.{ANY_IMAGE}"}]
    assert [entry["id"] for entry in skipped[3:]] == [row for row in range(5, ROWS) if row != 10_001]


def test_sbu_missing_share_above_max_missing_fails_naming_the_first(sbu, tmp_path: Path) -> None:
    root, images = sbu
    with pytest.raises(DataError, match=r"sbu training: 9996 of 10002 items \(99\.9%\) have no image .*"
                                        r"more than --max-missing 50\.0%; the first: no image found as "
                                        r".*sbu/00000/000000005"):
        prepare_dataset(SOURCE, root, tmp_path / "out", images, max_missing=0.5, log=lambda _: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("longer", ["urls", "captions"])
def test_sbu_files_of_different_lengths_are_refused_at_the_line_where_one_ends(tmp_path: Path, longer: str) -> None:
    root, images, out = tmp_path / "sbu", tmp_path / "images", tmp_path / "out"
    urls, captions = [url(row) for row in range(3)], [b"a dog", b"a cat", b"a bird"]
    if longer == "urls":
        write_sbu(root, urls, captions[:2])
        expected = rf"{root / URLS}:3: {root / CAPTIONS} ends at line 2"
    else:
        write_sbu(root, urls[:2], captions)
        expected = rf"{root / CAPTIONS}:3: {root / URLS} ends at line 2"
    touch(images, "sbu/00000/000000000.jpg")
    out.mkdir()
    (out / "training.jsonl").write_text("an earlier preparation's\n")

    with pytest.raises(DataError, match=expected.replace(".", r"\.") + ": the two SBU files must have a line each"):
        prepare_dataset(SOURCE, root, out, images, log=lambda _: None)
    assert sorted(path.name for path in out.iterdir()) == ["training.jsonl"]  # left as it was
    assert (out / "training.jsonl").read_text() == "an earlier preparation's\n"


def test_sbu_captions_without_urls_file_are_named(tmp_path: Path) -> None:
    root = tmp_path / "sbu"
    write_sbu(root, [url(0)], [b"a dog"])
    (root / URLS).unlink()
    with pytest.raises(DataError, match=f"holds {CAPTIONS} but not {URLS}"):
        prepare_dataset(SOURCE, root, tmp_path / "out", root, log=lambda _: None)


def test_sbu_url_table_has_a_row_per_line_in_order(sbu, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    root, _ = sbu
    rows = write_sbu_url_table(root, tmp_path / "sbu.parquet")

    table = pq.read_table(tmp_path / "sbu.parquet").to_pydict()
    assert rows == ROWS == len(table["url"]) == len(table["caption"])
    lines = (root / URLS).read_bytes().split(b"\n")
    assert [u.encode() for u in table["url"]] == lines[:ROWS]
    assert table["caption"][:5] == ["photo 0 of a dog", "photo 1 of a dog", "   ", "caf\ufffd latte", "photo 4 of a dog"]
    assert table["caption"][10_001] == "  Man with a hat."  # the line end dropped; the reader strips the spaces
    assert not list(tmp_path.glob(".sbu.parquet.*"))


def test_sbu_url_table_refuses_files_of_different_lengths_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "sbu"
    write_sbu(root, [url(0), url(1)], [b"a dog"])
    with pytest.raises(DataError, match="ends at line 1"):
        write_sbu_url_table(root, tmp_path / "sbu.parquet")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["sbu"]


def test_sbu_summary_json_names_the_source(sbu, tmp_path: Path) -> None:
    root, images = sbu
    prepare_dataset(SOURCE, root, tmp_path / "out", images, log=lambda _: None)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["source"] == "sbu"
