"""Caption sources (COCO Captions, Conceptual Captions) and text-only corpora, on tiny files written
in the published layouts and names."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources import text
from train.data.sources.captions import COCO_CAPTIONS, CONCEPTUAL_CAPTIONS
from train.data.sources.img2dataset import img2dataset_stem
from train.data.sources.text import TextCorpus

NOT_AN_IMAGE = b"any bytes: preparation never decodes images"
ANY_IMAGE = "{jpg,jpeg,png,bmp,webp,tif,tiff,gif}"  # the extensions an image is looked for with


def touch(root: Path, *files: str) -> None:
    for file in files:
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_bytes(NOT_AN_IMAGE)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def coco_file(images: list[tuple[int, str]], captions: list[tuple[int, str]]) -> dict:
    return {"info": {}, "licenses": [],
            "images": [{"id": i, "file_name": name, "height": 480, "width": 640} for i, name in images],
            "annotations": [{"id": 100 + n, "image_id": i, "caption": c} for n, (i, c) in enumerate(captions)]}


def train2014(image_id: int) -> str:
    return f"COCO_train2014_{image_id:012d}.jpg"


TRAIN = coco_file([(9, train2014(9)), (25, train2014(25)), (30, train2014(30)), (31, train2014(31))],
                  [(25, "A giraffe eating leaves. \n"), (9, "Food on a tray."), (30, "A kite."), (9, "A lunch box."),
                   (25, "A tall giraffe."), (30, "Kites in the sky.")])  # 31: no caption
VAL = coco_file([(42, "COCO_val2014_000000000042.jpg")], [(42, "A bus."), (42, "A red bus.")])


@pytest.mark.parametrize("folder", ["", "annotations"])
def test_coco_captions_per_image_from_root_or_its_annotations_folder(tmp_path: Path, folder: str) -> None:
    root, images, out = tmp_path / "coco", tmp_path / "images", tmp_path / "out"
    (root / folder).mkdir(parents=True)
    (root / folder / "captions_train2014.json").write_text(json.dumps(TRAIN))
    (root / folder / "captions_val2014.json").write_text(json.dumps(VAL))
    touch(images, f"train2014/{train2014(9)}", f"train2014/{train2014(25)}", f"train2014/{train2014(31)}",
          "val2014/COCO_val2014_000000000042.jpg")  # 30's image is missing

    summary = prepare_dataset(COCO_CAPTIONS, root, out, images, log=lambda _: None)

    assert summary["splits"] == {"train2014": {"items": 4, "skipped": 2, "missing_images": 2, "images": 2},
                                 "val2014": {"items": 2, "skipped": 0, "missing_images": 0, "images": 1}}
    assert summary["absent"] == []
    assert read_jsonl(out / "train2014.jsonl") == [
        {"file": f"train2014/{train2014(9)}", "image_id": 9, "captions": ["Food on a tray.", "A lunch box."]},
        {"file": f"train2014/{train2014(25)}", "image_id": 25,
         "captions": ["A giraffe eating leaves.", "A tall giraffe."]}]
    assert read_jsonl(out / "val2014.jsonl") == [
        {"file": "val2014/COCO_val2014_000000000042.jpg", "image_id": 42, "captions": ["A bus.", "A red bus."]}]
    assert (out / "images.txt").read_text().splitlines() == [
        f"train2014/{train2014(9)}", f"train2014/{train2014(25)}", "val2014/COCO_val2014_000000000042.jpg"]
    assert read_jsonl(out / "skipped.jsonl") == [
        {"split": "train2014", "id": 30, "reason": f"no image found as {images / 'train2014' / train2014(30)[:-4]}"
                                                   f".{ANY_IMAGE}"}]
    assert (images / "train2014" / train2014(9)).read_bytes() == NOT_AN_IMAGE


def test_coco_captions_reads_the_splits_that_are_there(tmp_path: Path) -> None:
    root = tmp_path / "coco"
    touch(root, "val2014/COCO_val2014_000000000042.jpg")
    (root / "captions_val2014.json").write_text(json.dumps(VAL))
    logged: list[str] = []
    summary = prepare_dataset(COCO_CAPTIONS, root, tmp_path / "out", log=logged.append)
    assert list(summary["splits"]) == ["val2014"] and summary["absent"] == ["train2014"]
    assert logged[0] == "coco-captions: found val2014; not present: train2014"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["annotations"][1].update(caption=7), "annotations[1]: 'caption' should be str, found 7"),
    (lambda d: d["annotations"][0].update(image_id=5), "annotations[0]: image id 5 is not among 'images'"),
    (lambda d: d["images"][0].pop("file_name"), "images[0]: 'file_name' should be str, found None"),
    (lambda d: d.pop("annotations"), "not a COCO caption file"),
])
def test_coco_captions_malformed_file_is_a_data_error_naming_file_and_entry(tmp_path: Path, change, message) -> None:
    data = json.loads(json.dumps(VAL))
    change(data)
    path = tmp_path / "coco" / "annotations" / "captions_val2014.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    with pytest.raises(DataError) as error:
        prepare_dataset(COCO_CAPTIONS, tmp_path / "coco", tmp_path / "out", log=lambda _: None)
    assert str(error.value).startswith(f"{path}: {message}")
    assert not (tmp_path / "out" / "summary.json").exists()


def test_cc_image_path_is_img2dataset_files_layout() -> None:
    assert img2dataset_stem("training", 0) == "training/00000/000000000"
    assert img2dataset_stem("training", 12_345) == "training/00001/000012345"
    assert img2dataset_stem("validation", 3_318_332) == "validation/00331/003318332"


def test_cc_rows_with_images_missing_images_and_malformed_lines(tmp_path: Path) -> None:
    root, images, out = tmp_path / "cc", tmp_path / "images", tmp_path / "out"
    root.mkdir()
    (root / "Train_GCC-training.tsv").write_bytes(
        b"a dog runs on the beach\thttp://a/0.jpg\n"          # row 0: .jpg
        b"actor attends the premiere \thttp://a/1.png\r\n"    # row 1: .png, CRLF, trailing space
        b"a line without a url\n"                              # row 2 (line 3): malformed
        b"a red car\thttp://a/3.jpg\n"                         # row 3: no image downloaded
        b"caf\xe9 in paris\thttp://a/4.jpg\n"                  # row 4 (line 5): not UTF-8
        b"too\tmany\tfields\n"                                 # row 5 (line 6): malformed
        b"sunset over the sea\thttp://a/6.jpg")                # row 6: no final newline
    (root / "Validation_GCC-1.1.0-Validation.tsv").write_text("a cat\thttp://b/0.jpg\n")
    touch(images, "training/00000/000000000.jpg", "training/00000/000000001.png", "training/00000/000000004.jpg",
          "training/00000/000000006.jpeg", "validation/00000/000000000.webp")

    summary = prepare_dataset(CONCEPTUAL_CAPTIONS, root, out, images, log=lambda _: None)

    assert summary["splits"] == {"training": {"items": 3, "skipped": 4, "missing_images": 1},
                                 "validation": {"items": 1, "skipped": 0, "missing_images": 0}}
    assert read_jsonl(out / "training.jsonl") == [
        {"file": "training/00000/000000000.jpg", "captions": ["a dog runs on the beach"]},
        {"file": "training/00000/000000001.png", "captions": ["actor attends the premiere"]},
        {"file": "training/00000/000000006.jpeg", "captions": ["sunset over the sea"]}]
    assert read_jsonl(out / "validation.jsonl") == [
        {"file": "validation/00000/000000000.webp", "captions": ["a cat"]}]
    tsv = root / "Train_GCC-training.tsv"
    assert read_jsonl(out / "skipped.jsonl") == [
        {"split": "training", "id": 2, "reason": f"{tsv}:3: not a 'caption<TAB>url' line"},
        {"split": "training", "id": 3, "reason": f"no image found as {images}/training/00000/000000003.{ANY_IMAGE}"},
        {"split": "training", "id": 4, "reason": f"{tsv}:5: the caption is not UTF-8 text"},
        {"split": "training", "id": 5, "reason": f"{tsv}:6: not a 'caption<TAB>url' line"}]


def test_cc_max_missing_fails_the_split(tmp_path: Path) -> None:
    root = tmp_path / "cc"
    touch(root, "validation/00000/000000001.jpg")
    (root / "Validation_GCC-1.1.0-Validation.tsv").write_text("a cat\thttp://b/0.jpg\na dog\thttp://b/1.jpg\n")
    with pytest.raises(DataError, match=r"cc validation: 1 of 2 items \(50.0%\) have no image"):
        prepare_dataset(CONCEPTUAL_CAPTIONS, root, tmp_path / "out", max_missing=0.25, log=lambda _: None)
    assert not (tmp_path / "out").exists()


# Text corpora.

BOOK = ("The first sentence has five words.\n"  # document 0: lines 0-2
        "Second one.\n"
        "A third line here.\n"
        "\n"
        "   \t\n"
        "New document starts.\n"  # document 1: lines 3-4
        "  It ends here.\r\n"  # indented: not blank
        "\n"
        "Last.")  # document 2: line 5, no final newline


def test_text_corpus_documents_and_packing(tmp_path: Path) -> None:
    (tmp_path / "book.txt").write_text(BOOK)
    corpus = TextCorpus(tmp_path / "book.txt")
    assert (len(corpus), corpus.documents) == (6, 3)
    assert corpus.text(0, 8) == "The first sentence has five words. Second one."  # 6 + 2 words; + 4 > 8
    assert corpus.text(0, 12) == "The first sentence has five words. Second one. A third line here."
    assert corpus.text(0, 100) == corpus.text(0, 12)  # stops at the document's end
    assert corpus.text(0, 3) == "The first sentence has five words."  # line i even over max_words
    assert corpus.text(2, 100) == "A third line here."
    assert corpus.text(3, 100) == "New document starts. It ends here."
    assert corpus.text(5, 100) == "Last."
    with pytest.raises(IndexError):
        corpus.text(6, 10)


def test_text_corpus_index_does_not_depend_on_chunk_boundaries(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "book.txt").write_text(BOOK)
    whole = TextCorpus(tmp_path / "book.txt")
    for size in (1, 2, 5, 13):
        monkeypatch.setattr(text, "CHUNK_BYTES", size)
        chunked = TextCorpus(tmp_path / "book.txt")
        assert (len(chunked), chunked.documents) == (6, 3)
        assert [chunked.text(i, 100) for i in range(6)] == [whole.text(i, 100) for i in range(6)]


def test_text_corpus_folder_recursion_several_files_and_pickling(tmp_path: Path) -> None:
    (tmp_path / "wiki" / "AA").mkdir(parents=True)
    (tmp_path / "wiki" / "b.txt").write_text("Beta one.\nBeta two.\n\nBeta three.\n")
    (tmp_path / "wiki" / "AA" / "wiki_00.txt").write_text("Alpha one.\nAlpha two.\n")  # "AA/..." sorts first
    (tmp_path / "wiki" / "notes.md").write_text("Not part of the corpus.\n")
    corpus = TextCorpus(tmp_path / "wiki")
    assert corpus.files == [tmp_path / "wiki" / "AA" / "wiki_00.txt", tmp_path / "wiki" / "b.txt"]
    assert (len(corpus), corpus.documents) == (5, 3)  # a file starts a document
    assert corpus.text(0, 100) == "Alpha one. Alpha two."
    assert corpus.text(1, 100) == "Alpha two."
    assert corpus.text(2, 100) == "Beta one. Beta two."
    assert corpus.text(4, 100) == "Beta three."

    copy = pickle.loads(pickle.dumps(corpus))  # after reading: open files are not pickled
    assert [copy.text(i, 3) for i in range(5)] == [corpus.text(i, 3) for i in range(5)]
    assert copy.documents == 3


def test_text_corpus_one_sentence_a_line_without_blank_lines_is_one_document(tmp_path: Path) -> None:
    (tmp_path / "sentences.txt").write_text("".join(f"sentence number {n} .\n" for n in range(10)))
    corpus = TextCorpus(tmp_path / "sentences.txt")
    assert (len(corpus), corpus.documents) == (10, 1)
    assert corpus.text(7, 8) == "sentence number 7 . sentence number 8 ."
    assert corpus.text(9, 100) == "sentence number 9 ."


def test_text_corpus_bad_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "book.txt"
    path.write_bytes(b"fine\n\nalso fine\ncaf\xe9\n")
    with pytest.raises(DataError, match=r"book\.txt:4: not UTF-8 text \(invalid continuation byte\)"):
        TextCorpus(path)


def test_text_corpus_empty_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    with pytest.raises(DataError, match="an empty corpus"):
        TextCorpus(tmp_path)
    with pytest.raises(DataError, match="no such file or folder"):
        TextCorpus(tmp_path / "absent")
