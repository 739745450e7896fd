"""`vlbert cache show`: the stored boxes drawn over their images, checked pixel by pixel."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store.interop import export_store, import_store
from extract.store.labels import Naming
from extract.store.reader import FeatureStore
from pipelines.cli import main
from pipelines.report.cache_show import LINE, _scaled, kept_rows, show_records
from tests.helpers.pipelines import DETECTOR
from tests.helpers.shards import write_tar

IDS = ["images/train/000000", "images/train/000001", "images/val/000010"]


def image_of(world, image_id):
    return np.asarray(Image.open(next((world / "world").glob(f"{image_id}.*"))).convert("RGB"))


def check_picture(path, pixels, record, rows, labels, variant=None):
    """The PNG at `path` is the image enlarged, under its band, changed only on the drawn boxes'
    outlines (each of which differs from the image all along), their labels, the whole-image frame
    and, with `variant`, inside the boxes it masked."""
    picture = np.asarray(Image.open(path).convert("RGB")).astype(int)
    height, width = pixels.shape[:2]
    scale = picture.shape[1] // width
    top = picture.shape[0] - height * scale
    assert picture.shape[1] == width * scale and top > 0 and scale >= 1
    expected = np.repeat(np.repeat(pixels, scale, 0), scale, 1).astype(int)
    changed = np.zeros(picture.shape[:2], bool)
    changed[top:] = (picture[top:] != expected).any(-1)
    allowed = np.zeros_like(changed)
    allowed[top:top + LINE], allowed[-LINE:], allowed[top:, :LINE], allowed[top:, -LINE:] = True, True, True, True
    for x1, y1, x2, y2 in labels:
        allowed[y1:y2 + 1, x1:x2 + 1] = True
    hidden = np.flatnonzero(record["mask_boxes"][variant]) if variant is not None else []
    for row in hidden:
        x1, y1, x2, y2 = _scaled(record["boxes"][row], scale, top)
        allowed[y1:y2 + 1, x1:x2 + 1] = True
        inside = changed[y1 + LINE:y2 + 1 - LINE, x1 + LINE:x2 + 1 - LINE]
        assert inside.mean() > 0.3, "a masked box is hatched"
    for row in rows:
        x1, y1, x2, y2 = _scaled(record["boxes"][row], scale, top)
        outline = np.zeros_like(changed)
        outline[y1:y2 + 1, x1:x2 + 1] = True
        outline[y1 + LINE:y2 + 1 - LINE, x1 + LINE:x2 + 1 - LINE] = False
        assert changed[outline].mean() > 0.95, f"box {row} is outlined"
        allowed |= outline
    assert not changed[~allowed].any(), "nothing outside the boxes, labels and frame changed"
    return picture


def test_each_box_is_outlined_and_nothing_else_of_the_image_changes(tiny_world, tmp_path):
    result = show_records(tiny_world / "cache", IDS[:2], tmp_path / "show", tiny_world / "world", top=6, variant=1)
    assert [path.relative_to(tmp_path / "show").as_posix() for path in result.written] == [f"{i}.png" for i in IDS[:2]]
    store = FeatureStore(tiny_world / "cache")
    for image_id in IDS[:2]:
        record, pixels, picture = store[image_id], image_of(tiny_world, image_id), result.pictures[image_id]
        assert picture.boxes == [0, 1, 2, 3, 4, 5] and picture.scale == 640 // max(pixels.shape[:2])
        assert record["mask_boxes"][1].any()
        check_picture(tmp_path / "show" / f"{image_id}.png", pixels, record, picture.boxes, picture.labels, variant=1)
    assert result.note == "the store has no class or attribute names: indices shown"
    assert result.problems == []


def test_min_score_and_top_choose_the_boxes_drawn(tiny_world):
    record = FeatureStore(tiny_world / "cache")[IDS[0]]
    scores = record["objects_conf"]
    threshold = float(np.median(scores))
    assert kept_rows(record, None, threshold) == [row for row in range(len(scores)) if scores[row] >= threshold]
    assert kept_rows(record, 3, threshold) == kept_rows(record, None, threshold)[:3]


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, tiny_world):
    """Three images of the tiny world extracted by the demo detector (its class and attribute names)."""
    root = tmp_path_factory.mktemp("demo-store")
    images = root / "images"
    for image_id in IDS:
        source = next((tiny_world / "world").glob(f"{image_id}.*"))
        (images / image_id).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, images / f"{image_id}.png")
    run_extraction(ExtractionConfig(images, str(DETECTOR), weights=str(DETECTOR.with_suffix(".safetensors")),
                                    mask_variants=1, batch_size=3, progress=False), root / "cache")
    return root


def test_the_demo_store_is_labelled_with_its_detector_names(demo_store, tmp_path):
    result = CliRunner().invoke(main, ["cache", "show", str(demo_store / "cache"), *IDS, "--images",
                                       str(demo_store / "images"), "--out", str(tmp_path / "show"), "--sheet"])
    assert result.exit_code == 0, result.output
    assert "Note" not in result.output
    store = FeatureStore(demo_store / "cache")
    naming = Naming.of(store.meta)
    classes, attributes = set(naming.classes), set(naming.attributes)
    assert "square" in classes and "red" in attributes
    for image_id in IDS:
        record = store[image_id]
        words = naming.label(record, 0).split()
        assert words[0] in attributes and words[2] in classes and float(words[3]) == pytest.approx(
            record["objects_conf"][0], abs=0.005)
    sheet = Image.open(tmp_path / "show" / "sheet.png")
    assert sheet.size == (3 * 480, 480)


def test_unknown_ids_missing_images_and_bad_ids_are_named_and_the_rest_drawn(tiny_world, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(tiny_world / "world" / "images", images / "images")
    (images / f"{IDS[1]}.png").unlink()
    result = CliRunner().invoke(main, ["cache", "show", str(tiny_world / "cache"), IDS[0], IDS[1],
                                                       "no/such/id", "../escape", "--images", str(images),
                                                       "--out", str(tmp_path / "show")])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"not drawn: no/such/id: not in the store {tiny_world / 'cache'}",
        f"not drawn: ../escape: image id '../escape.png' has a '..' component: it would make a path outside "
        f"{tmp_path / 'show'}",
        f"not drawn: {IDS[1]}: no image {IDS[1]}.* under {images}"]
    assert [p.relative_to(tmp_path / "show").as_posix() for p in (tmp_path / "show").rglob("*.png")] == \
        [f"{IDS[0]}.png"]


@pytest.mark.parametrize("arguments, message", [
    (["--variant", "2"], "--variant 2: the store {store} holds variants 0 to 1"),
    (["--sheet", "sheet"], "image id 'sheet': its picture would be {out}/sheet.png, where --sheet writes the "
                           "contact sheet; draw it without --sheet"),
])
def test_options_no_picture_can_be_drawn_with_stop_in_one_line(tiny_world, tmp_path, arguments, message):
    result = CliRunner().invoke(main, ["cache", "show", str(tiny_world / "cache"), IDS[0], *arguments,
                                       "--out", str(tmp_path / "show")])
    assert result.exit_code == 2
    assert result.output == "Error: " + message.format(store=tiny_world / "cache", out=tmp_path / "show") + "\n"
    assert not (tmp_path / "show").exists()


def test_images_in_tar_shards_are_found_as_extraction_finds_them(tiny_world, tmp_path):
    """The key images/train/000001 is member 000001.png of the shard images/train.tar."""
    root = tmp_path / "shards"
    files = [path for path in sorted((tiny_world / "world" / "images" / "train").glob("*.png"))
             if path.stem != "000002"]
    write_tar(root / "images" / "train.tar", [(path.name, path.read_bytes()) for path in files])
    result = show_records(tiny_world / "cache", [IDS[1], IDS[2], "images/train/000002"], tmp_path / "show", root)
    assert [path.relative_to(tmp_path / "show").as_posix() for path in result.written] == [f"{IDS[1]}.png"]
    assert result.problems == [f"{IDS[2]}: no image: no tar shard images/val.tar under {root}",
                               f"images/train/000002: no image: {root / 'images' / 'train.tar'} holds no sample 000002"]
    from_files = show_records(tiny_world / "cache", [IDS[1]], tmp_path / "files", tiny_world / "world")
    assert Image.open(result.written[0]).tobytes() == Image.open(from_files.written[0]).tobytes()


def test_q8_and_imported_stores_are_drawn_given_the_images(tiny_world, tmp_path):
    """A bottom-up-attention TSV imported as q8: no meta.json of a detector, no names, no images root."""
    with pytest.warns(UserWarning, match="the tsv format does not carry it"):
        export_store(tiny_world / "cache", "tsv", tmp_path / "features.tsv")
        import_store(tmp_path / "features.tsv", "tsv", tmp_path / "q8", feature_dtype="q8")
    meta = json.loads((tmp_path / "q8" / "meta.json").read_text())
    assert meta["mode"] == "imported" and meta["features"]["dtype"] == "q8" and meta["images_root"] is None
    result = CliRunner().invoke(main, ["cache", "show", str(tmp_path / "q8"), IDS[0], "--out", str(tmp_path / "a")])
    assert result.exit_code == 2 and result.output == (
        f"Error: {tmp_path / 'q8'}: its meta.json records no images root (an imported store?): give --images\n")
    drawn = show_records(tmp_path / "q8", [IDS[0]], tmp_path / "b", tiny_world / "world")
    original = show_records(tiny_world / "cache", [IDS[0]], tmp_path / "c", tiny_world / "world")
    assert Image.open(drawn.written[0]).size == Image.open(original.written[0]).size
