"""`vlbert data prepare` (and the readers `vlbert evaluate` shares) against what users actually feed it:
header lines, BOMs, duplicates, blank text, outputs over inputs, amplifying and deep files, lone
surrogates, bad boxes, paths outside the images folder, and a user's own images. Each case runs the
command line on tiny files in the published layouts."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from train.data.sources import refer
from train.data.sources.text import TextCorpus

BOM = b"\xef\xbb\xbf"
ANY_IMAGE = "{jpg,jpeg,png,bmp,webp,tif,tiff,gif}"
OUTPUTS = {"images.txt", "skipped.jsonl", "summary.json"}  # besides the splits, in every prepared folder


def prepare(source: str, root: Path, out: Path, *options: str):
    return CliRunner().invoke(main, ["data", "prepare", source, "--root", str(root), "--out", str(out), *options])


def error_line(result) -> str:
    """The one line a refused command prints (stderr); fails when it printed more or exited 0."""
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    return line


def touch(root: Path, *files: str) -> None:
    for file in files:
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_bytes(b"preparation never decodes images")


def jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def files_in(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


# -- Conceptual Captions, COCO Captions --------------------------------------------------------------

@pytest.mark.parametrize("start", [b"", BOM], ids=["plain", "bom"])
def test_a_cc_header_line_is_skipped_and_rows_stay_on_their_images(tmp_path: Path, start: bytes) -> None:
    root, images = tmp_path / "cc", tmp_path / "images"
    root.mkdir()
    (root / "Validation_GCC-1.1.0-Validation.tsv").write_bytes(
        start + b"caption\turl\r\na cat\thttp://b/0.jpg\r\na dog\thttp://b/1.jpg\r\n")
    touch(images, "validation/00000/000000000.jpg", "validation/00000/000000001.jpg")
    result = prepare("cc", root, tmp_path / "out", "--images", str(images))
    assert result.exit_code == 0, result.output
    assert "is the header line 'caption<TAB>url'" in result.output
    # img2dataset does not count the header: row 0, "a cat", is image 000000000
    assert jsonl(tmp_path / "out" / "validation.jsonl") == [
        {"file": "validation/00000/000000000.jpg", "captions": ["a cat"]},
        {"file": "validation/00000/000000001.jpg", "captions": ["a dog"]}]


def test_blank_cc_lines_are_not_rows(tmp_path: Path) -> None:
    root, images = tmp_path / "cc", tmp_path / "images"
    root.mkdir()
    (root / "Validation_GCC-1.1.0-Validation.tsv").write_bytes(
        b"\na cat\thttp://b/0.jpg\n\n  \na dog\thttp://b/1.jpg\n")
    touch(images, "validation/00000/000000000.jpg", "validation/00000/000000001.jpg")
    result = prepare("cc", root, tmp_path / "out", "--images", str(images))
    assert result.exit_code == 0, result.output
    # img2dataset's CSV reader skips blank lines: "a dog" is row 1, image 000000001
    assert jsonl(tmp_path / "out" / "validation.jsonl") == [
        {"file": "validation/00000/000000000.jpg", "captions": ["a cat"]},
        {"file": "validation/00000/000000001.jpg", "captions": ["a dog"]}]


def test_a_bom_never_reaches_the_first_caption_or_field(tmp_path: Path) -> None:
    cc, coco, images = tmp_path / "cc", tmp_path / "coco", tmp_path / "images"
    cc.mkdir()
    (cc / "Validation_GCC-1.1.0-Validation.tsv").write_bytes(BOM + b"a cat\thttp://b/0.jpg\n")
    coco.mkdir()
    captions = {"images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
                "annotations": [{"id": 1, "image_id": 42, "caption": "A bus."}]}
    (coco / "captions_val2014.json").write_bytes(BOM + json.dumps(captions).encode())
    touch(images, "validation/00000/000000000.jpg", "val2014/COCO_val2014_000000000042.jpg")

    assert prepare("cc", cc, tmp_path / "out-cc", "--images", str(images)).exit_code == 0
    assert prepare("coco-captions", coco, tmp_path / "out-coco", "--images", str(images)).exit_code == 0
    assert jsonl(tmp_path / "out-cc" / "validation.jsonl")[0]["captions"] == ["a cat"]
    assert jsonl(tmp_path / "out-coco" / "val2014.jsonl")[0]["captions"] == ["A bus."]
    val = write_vcr(tmp_path / "vcr", [vcr_line("val-0")])  # JSON lines
    val.write_bytes(BOM + val.read_bytes())
    assert prepare("vcr", tmp_path / "vcr", tmp_path / "out-vcr").exit_code == 0
    assert jsonl(tmp_path / "out-vcr" / "val.jsonl")[0]["vcr"][0]["annot_id"] == "val-0"


def test_a_bom_is_not_part_of_a_text_corpus_first_line(tmp_path: Path) -> None:
    (tmp_path / "book.txt").write_bytes(BOM + b"First line.\nSecond line.\n")
    corpus = TextCorpus(tmp_path / "book.txt")
    assert corpus.text(0, max_words=2) == "First line."


def test_blank_coco_captions_are_skipped_with_their_reason(tmp_path: Path) -> None:
    root, images, out = tmp_path / "coco", tmp_path / "images", tmp_path / "out"
    root.mkdir()
    captions = {"images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
                "annotations": [{"id": 1, "image_id": 42, "caption": "A bus."},
                                {"id": 2, "image_id": 42, "caption": ""},
                                {"id": 3, "image_id": 42, "caption": " \n\t"}]}
    (root / "captions_val2014.json").write_text(json.dumps(captions))
    touch(images, "val2014/COCO_val2014_000000000042.jpg")
    result = prepare("coco-captions", root, out, "--images", str(images))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["splits"]["val2014"] == {
        "items": 1, "skipped": 2, "missing_images": 0, "images": 1}
    assert jsonl(out / "val2014.jsonl")[0]["captions"] == ["A bus."]
    assert jsonl(out / "skipped.jsonl") == [
        {"split": "val2014", "id": 42, "reason": "empty or whitespace-only caption"}]


# -- VCR ---------------------------------------------------------------------------------------------

SCENE = "lsmdc_1001_Movie/1001_Movie_00.01.00.000-00.01.02.000@0"
TEXT = [["It", "is", "."], ["No", "."], ["Yes", "."], ["Maybe", "."]]


def vcr_line(annot_id: str, **fields) -> dict:
    return {"annot_id": annot_id, "objects": ["person", "car"], "img_fn": f"{SCENE}.jpg",
            "metadata_fn": f"{SCENE}.json", "question": ["Is", [0], "ok", "?"], "answer_choices": TEXT,
            "rationale_choices": TEXT, "answer_label": 1, "rationale_label": 2, **fields}


def write_vcr(root: Path, lines: list[dict], boxes: list | None = None, split: str = "val") -> Path:
    """root/<split>.jsonl and root/vcr1images with the scene's image and metadata."""
    images = root / "vcr1images"
    touch(images, f"{SCENE}.jpg")
    metadata = {"boxes": boxes or [[1, 2, 30, 40, 0.9], [5, 5, 9, 9, 0.8]], "width": 64, "height": 48}
    (images / f"{SCENE}.json").write_text(json.dumps(metadata))
    (root / f"{split}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root / f"{split}.jsonl"


def test_a_repeated_vcr_annot_id_is_refused_naming_file_line_and_id(tmp_path: Path) -> None:
    path = write_vcr(tmp_path / "vcr", [vcr_line("val-0"), vcr_line("val-1"), vcr_line("val-0")])
    result = prepare("vcr", tmp_path / "vcr", tmp_path / "out")
    assert error_line(result) == (f"Error: {path}:3: annot_id 'val-0' appears again (first on line 1); "
                                  "`vlbert evaluate vcr` needs each once")
    assert not (tmp_path / "out").exists()  # not even an empty *.tmp, nor the folder made for them


def test_out_at_or_inside_an_input_folder_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    root = tmp_path / "vcr"
    val = write_vcr(root, [vcr_line("val-0")])
    published = val.read_bytes()
    before = sorted(root.rglob("*"))
    for out, option in ((root, "--root"), (root / "prepared", "--root"), (root / "vcr1images" / "x", "--images")):
        line = error_line(prepare("vcr", root, out))
        assert line.startswith(f"Error: --out {out}: ") and f"the input {option} " in line
    assert sorted(root.rglob("*")) == before and val.read_bytes() == published


def test_re_preparing_removes_the_stale_outputs_of_this_tool_only(tmp_path: Path) -> None:
    root, out = tmp_path / "vcr", tmp_path / "out"
    write_vcr(root, [vcr_line("test-0", answer_label=None, rationale_label=None)], split="test")
    write_vcr(root, [vcr_line("val-0")])
    assert prepare("vcr", root, out).exit_code == 0
    assert files_in(out) == OUTPUTS | {"val.jsonl", "test.jsonl", "boxes.json"}
    (out / "notes.txt").write_text("mine")
    (out / "answers.txt").write_text("from an earlier vqa2 run into this folder\n")
    (root / "test.jsonl").unlink()

    assert prepare("vcr", root, out).exit_code == 0
    assert json.loads((out / "summary.json").read_text())["absent"] == ["train", "test"]
    assert files_in(out) == OUTPUTS | {"val.jsonl", "boxes.json", "notes.txt"}


def test_a_failed_prepare_leaves_the_earlier_outputs_as_they_were(tmp_path: Path) -> None:
    root, out = tmp_path / "vcr", tmp_path / "out"
    val = write_vcr(root, [vcr_line("val-0")])
    assert prepare("vcr", root, out).exit_code == 0
    before = {name: (out / name).read_bytes() for name in files_in(out)}
    val.write_text(val.read_text() + "{not json\n")
    assert error_line(prepare("vcr", root, out)).startswith(f"Error: {val}:2: invalid JSON")
    assert {name: (out / name).read_bytes() for name in files_in(out)} == before


@pytest.mark.parametrize("box, problem", [
    ("[NaN, 2, 30, 40, 0.9]", "[nan, 2, 30, 40, 0.9]"), ("[30, 2, 1, 40, 0.9]", "[30, 2, 1, 40, 0.9]"),
    ("[1, 2, 30, Infinity, 0.9]", "[1, 2, 30, inf, 0.9]")], ids=["nan", "inverted", "infinite"])
def test_vcr_boxes_not_finite_or_inverted_skip_their_annotations(tmp_path: Path, box: str, problem: str) -> None:
    root, out = tmp_path / "vcr", tmp_path / "out"
    write_vcr(root, [vcr_line("val-0")])
    other = "lsmdc_1001_Movie/other"
    touch(root / "vcr1images", f"{other}.jpg")
    (root / "vcr1images" / f"{other}.json").write_text('{"boxes": [%s, [5, 5, 9, 9, 0.8]]}' % box)
    (root / "val.jsonl").write_text(json.dumps(vcr_line("val-0")) + "\n" + json.dumps(
        vcr_line("val-1", img_fn=f"{other}.jpg", metadata_fn=f"{other}.json")) + "\n")
    assert prepare("vcr", root, out).exit_code == 0
    [skipped] = jsonl(out / "skipped.jsonl")
    metadata = root / "vcr1images" / f"{other}.json"
    assert skipped == {"split": "val", "id": "val-1", "reason": f"metadata unusable: {metadata}: box 0 is {problem}, "
                                                                 "expected finite x1 <= x2 and y1 <= y2"}

    def refuse(token: str) -> None:
        raise AssertionError(f"boxes.json holds the non-standard token {token}")

    assert list(json.loads((out / "boxes.json").read_text(), parse_constant=refuse)) == [f"{SCENE}.jpg"]


@pytest.mark.parametrize("field", ["img_fn", "metadata_fn"])
def test_vcr_files_outside_the_images_folder_are_skipped(tmp_path: Path, field: str) -> None:
    root, out = tmp_path / "vcr", tmp_path / "out"
    write_vcr(root, [])
    touch(root, "outside.jpg", "vcr1images/other.jpg")
    (root / "outside.json").write_text((root / "vcr1images" / f"{SCENE}.json").read_text())
    outside = {"img_fn": ("../outside.jpg", str(root / "outside.jpg")),
               "metadata_fn": ("../outside.json", str(root / "outside.json"))}[field]
    # each on an image of its own: an image's metadata is read with its first annotation
    lines = [vcr_line("val-0"), *(vcr_line(f"val-{n + 1}", **{"img_fn": "other.jpg", field: name})
                                  for n, name in enumerate(outside))]
    (root / "val.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert prepare("vcr", root, out).exit_code == 0
    skipped = jsonl(out / "skipped.jsonl")
    assert [entry["id"] for entry in skipped] == ["val-1", "val-2"]
    assert all(f"lies outside the images folder {root / 'vcr1images'}" in entry["reason"] for entry in skipped)
    assert (out / "images.txt").read_text() == f"{SCENE}.jpg\n"


# -- RefCOCO+ ----------------------------------------------------------------------------------------

def write_refcoco(data: Path, refs_bytes: bytes) -> Path:
    folder = data / "refcoco+"
    folder.mkdir(parents=True)
    (folder / "refs(unc).p").write_bytes(refs_bytes)
    instances = {"images": [{"id": 1, "file_name": "COCO_train2014_000000000001.jpg"}],
                 "annotations": [{"id": 10, "image_id": 1, "bbox": [0, 0, 10, 10]}]}
    (folder / "instances.json").write_text(json.dumps(instances))
    return folder / "refs(unc).p"


def amplifying_refs(n: int) -> bytes:
    """n refs that all share one list of n sentences: O(n) bytes through the pickle's memo, n² sentences
    once expanded (the 384 KB file of the issue held n in the thousands)."""
    sentences = [{"sent_id": i, "sent": f"expression {i}", "raw": "", "tokens": []} for i in range(n)]
    return pickle.dumps([{"ref_id": i, "ann_id": 10, "image_id": 1, "split": "val", "sentences": sentences}
                         for i in range(n)], protocol=2)


def test_refs_sharing_their_sentences_are_refused_before_any_is_built(tmp_path: Path, monkeypatch) -> None:
    built = []

    class CountedSentence(refer.Sentence):
        def __init__(self, *args) -> None:
            built.append(args)
            super().__init__(*args)

    monkeypatch.setattr(refer, "Sentence", CountedSentence)
    n = 300
    path = write_refcoco(tmp_path / "DATA", amplifying_refs(n))
    assert len(amplifying_refs(2 * n)) < 2.1 * path.stat().st_size  # linear in n, the n² sentences are not
    expected = (f"Error: {path}: refs[1]'s sentence list is the same object as refs[0]'s sentence list (shared "
                "through the pickle's memo): each ref has its own sentences in a published refs file")
    assert error_line(prepare("refcoco+", tmp_path / "DATA", tmp_path / "out")) == expected
    assert built == []  # refused before a single sentence was built, let alone n²
    (tmp_path / "predictions.json").write_text("[]")  # evaluate reads the refs through the same reader
    evaluated = CliRunner().invoke(main, ["evaluate", "refcoco+", "--data", str(tmp_path / "DATA"), "--split", "val",
                                          "--predictions", str(tmp_path / "predictions.json")])
    assert error_line(evaluated) == expected


def test_an_empty_refs_list_says_so(tmp_path: Path) -> None:
    path = write_refcoco(tmp_path / "DATA", pickle.dumps([], protocol=2))
    assert error_line(prepare("refcoco+", tmp_path / "DATA", tmp_path / "out")) == \
        f"Error: {path}: holds an empty list of refs"


# -- bounds on parsing: prepare and evaluate inputs --------------------------------------------------

VQA_QUESTIONS = "v2_OpenEnded_mscoco_val2014_questions.json"
VQA_ANNOTATIONS = "v2_mscoco_val2014_annotations.json"


def write_vqa(root: Path, questions: list[dict], annotations: list[dict]) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    (root / VQA_QUESTIONS).write_text(json.dumps({"questions": questions}))
    (root / VQA_ANNOTATIONS).write_text(json.dumps({"annotations": annotations}))
    return root / VQA_QUESTIONS, root / VQA_ANNOTATIONS


def vqa_question(question_id: int, image_id: int, text: str = "what is it?") -> dict:
    return {"question_id": question_id, "image_id": image_id, "question": text}


def vqa_annotation(question_id: int, image_id: int, answer: str = "cat") -> dict:
    return {"question_id": question_id, "image_id": image_id, "question_type": "what", "answer_type": "other",
            "multiple_choice_answer": answer, "answers": [{"answer": answer, "answer_id": n + 1} for n in range(10)]}


DEEP_JSON = "[" * 100_000 + "]" * 100_000
LONG_INTEGER = "9" * 5_000


@pytest.mark.parametrize("text, problem", [(DEEP_JSON, "JSON nested too deeply to read"),
                                           (f'{{"questions": [{LONG_INTEGER}]}}',
                                            "holds an integer of more than 4300 digits")], ids=["deep", "long-int"])
def test_deep_or_long_json_ends_prepare_and_evaluate_in_one_line(tmp_path: Path, text: str, problem: str) -> None:
    questions, annotations = write_vqa(tmp_path / "vqa", [vqa_question(1, 1)], [vqa_annotation(1, 1)])
    questions.write_text(text)
    assert error_line(prepare("vqa2", tmp_path / "vqa", tmp_path / "out")) == f"Error: {questions}: {problem}"
    evaluated = CliRunner().invoke(main, ["evaluate", "vqa2", "--questions", str(questions), "--annotations",
                                          str(annotations), "--predictions", str(questions)])
    assert error_line(evaluated) == f"Error: {questions}: {problem}"


def test_a_deep_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "vcr"
    val = write_vcr(root, [vcr_line("val-0")])
    val.write_text(val.read_text() + DEEP_JSON + "\n")
    assert error_line(prepare("vcr", root, tmp_path / "out")) == f"Error: {val}:2: JSON nested too deeply to read"


@pytest.mark.parametrize("refs_bytes, problem", [
    # 100,000 nested lists: loads (the unpickler is iterative), and is shown cut short, not by repr()
    (b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b".", "refs[0]: expected an object, found [[[[[[[...]]]]]]]"),
    # a LONG4 integer of 2**20 bytes (2.5 million digits) as a ref id
    (b"\x80\x02]}U\x06ref_id\x8b" + (1 << 20).to_bytes(4, "little") + b"\x01" * (1 << 20) + b"s\x85.",
     "not a readable pickle (UnpicklingError: an integer of 1048576 bytes (at most 1024 are read))"),
], ids=["deep", "long-int"])
def test_deep_or_long_pickles_end_in_one_line(tmp_path: Path, refs_bytes: bytes, problem: str) -> None:
    path = write_refcoco(tmp_path / "DATA", refs_bytes)
    assert error_line(prepare("refcoco+", tmp_path / "DATA", tmp_path / "out")) == f"Error: {path}: {problem}"


# -- VQA v2: lone surrogates, a user's own images ----------------------------------------------------

def test_lone_surrogates_stay_json_escapes_and_leave_answers_txt_whole(tmp_path: Path) -> None:
    root, images, out = tmp_path / "vqa", tmp_path / "coco", tmp_path / "out"
    # "\ud800" in the published JSON: a lone surrogate once read, which UTF-8 cannot encode
    questions = [vqa_question(n, 1, "what is \ud800?") for n in range(1, 10)] + [vqa_question(10, 1)]
    write_vqa(root, questions, [vqa_annotation(n, 1, "odd \ud800") for n in range(1, 10)]
              + [vqa_annotation(10, 1)])
    touch(images, "val2014/COCO_val2014_000000000001.jpg")
    result = prepare("vqa2", root, out, "--images", str(images), "--min-answer-count", "1")
    assert result.exit_code == 0, result.output
    assert "\\ud800" in (out / "val2014.jsonl").read_text()  # as published: an escape
    [record] = jsonl(out / "val2014.jsonl")
    assert record["vqa"][0]["question"] == "what is \ud800?" and record["vqa"][0]["answers"][0] == "odd \ud800"
    assert (out / "answers.txt").read_text() == "cat\n"  # the other answer cannot be a line of UTF-8 text
    assert files_in(out) == OUTPUTS | {"val2014.jsonl", "answers.txt"}


def test_images_with_any_extraction_extension_are_found(tmp_path: Path) -> None:
    root, images, out = tmp_path / "vqa", tmp_path / "coco", tmp_path / "out"
    write_vqa(root, [vqa_question(1, 1), vqa_question(2, 2)], [vqa_annotation(1, 1), vqa_annotation(2, 2)])
    touch(images, "val2014/COCO_val2014_000000000001.png", "val2014/COCO_val2014_000000000002.JPEG")
    result = prepare("vqa2", root, out, "--images", str(images))
    assert result.exit_code == 0, result.output
    assert (out / "images.txt").read_text().splitlines() == [
        "val2014/COCO_val2014_000000000001.png", "val2014/COCO_val2014_000000000002.JPEG"]


def test_a_prepare_that_yields_no_item_fails_naming_the_file_pattern(tmp_path: Path) -> None:
    root, images, out = tmp_path / "vqa", tmp_path / "coco", tmp_path / "out"
    write_vqa(root, [vqa_question(1, 42)], [vqa_annotation(1, 42)])
    touch(images, "val2014/COCO_val2014_000000000042.txt")
    line = error_line(prepare("vqa2", root, out, "--images", str(images)))
    assert line == (f"Error: vqa2: no item prepared from {root} (1 skipped): images are looked for as "
                    f"{images}/<split>/COCO_<split>_<image_id:012d>.{ANY_IMAGE}; the first missing: "
                    f"{images}/val2014/COCO_val2014_000000000042.{ANY_IMAGE}")
    assert not out.exists()
