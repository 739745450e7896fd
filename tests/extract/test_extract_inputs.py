"""What users feed `vlbert extract`: file names that are not UTF-8 and images that declare too many
pixels are per-file failures; the other images are extracted."""

import json
import os
import shutil

from click.testing import CliRunner
from PIL import Image

from extract.store import FeatureStore
from extract.synthetic import write_synthetic_images
from pipelines.cli import main

NOT_UTF8 = "file name is not valid UTF-8 (its undecodable bytes are shown as \\xNN): rename the file"


def extract(images, out, *options):
    result = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(out), "--detector", "tiny",
                                       "--quiet", "--workers", "0", *options])
    assert "Traceback" not in result.output, result.output
    return result


def failures(store) -> dict[str, str]:
    return {entry["image"]: entry["error"] for entry in map(json.loads, (store / "failures.jsonl").open())}


def stored(store) -> list[str]:
    with FeatureStore(store) as opened:
        return opened.keys()


def images_with_a_name_that_is_not_utf8(tmp_path):
    images = tmp_path / "images"
    write_synthetic_images(images, 2, subdir_every=0)
    shutil.copyfile(images / "image0000.png", os.fsencode(images) + b"/bad\xff.png")
    return images


def test_a_file_name_that_is_not_utf8_is_a_failure_and_the_other_images_are_extracted(tmp_path):
    images = images_with_a_name_that_is_not_utf8(tmp_path)
    result = extract(images, tmp_path / "store")
    assert result.exit_code == 0, result.output
    assert "3 images, 0 already stored, 2 written, 1 failed" in result.output
    assert stored(tmp_path / "store") == ["image0000", "image0001"]
    assert failures(tmp_path / "store") == {"bad\\xff.png": NOT_UTF8}
    strict = extract(images, tmp_path / "store", "--strict")
    assert strict.exit_code == 1 and "Error: 1 image(s) failed (--strict)" in strict.output


def test_a_listed_name_that_is_not_utf8_is_a_failure_of_that_name_only(tmp_path):
    images = images_with_a_name_that_is_not_utf8(tmp_path)
    (tmp_path / "images.txt").write_bytes(b"image0001.png\nbad\xff.png\n")
    result = extract(images, tmp_path / "store", "--list", str(tmp_path / "images.txt"))
    assert result.exit_code == 0, result.output
    assert stored(tmp_path / "store") == ["image0001"]
    assert failures(tmp_path / "store") == {"bad\\xff.png": NOT_UTF8}


def test_an_image_declaring_too_many_pixels_is_refused_before_decoding(tmp_path):
    """An 8000x8000 PNG of a few KB is over the default limit; with a small --max-pixels, so is a
    100x100 image. Each is a failure naming its size and the option."""
    images = tmp_path / "images"
    write_synthetic_images(images, 1, subdir_every=0)
    Image.new("1", (8000, 8000)).save(images / "bomb.png")
    Image.new("RGB", (100, 100), "red").save(images / "square.png")
    assert (images / "bomb.png").stat().st_size < 100_000
    result = extract(images, tmp_path / "store")
    assert result.exit_code == 0, result.output
    assert stored(tmp_path / "store") == ["image0000", "square"]
    assert failures(tmp_path / "store") == {"bomb.png": f"{images / 'bomb.png'}: 8000x8000 is 64000000 pixels, more "
                                                        "than the limit of 40000000 (vlbert extract --max-pixels); "
                                                        "refused before decoding"}

    small = extract(images, tmp_path / "small", "--max-pixels", "9999")
    assert small.exit_code == 0, small.output
    assert "failed: square.png: " + f"{images / 'square.png'}: 100x100 is 10000 pixels, more than the limit of 9999 " \
           "(vlbert extract --max-pixels)" in small.output
    assert sorted(failures(tmp_path / "small")) == ["bomb.png", "image0000.png", "square.png"]


def test_a_pixel_limit_above_pillows_is_refused_before_anything_is_written(tmp_path):
    write_synthetic_images(tmp_path / "images", 1)
    result = extract(tmp_path / "images", tmp_path / "store", "--max-pixels", str(Image.MAX_IMAGE_PIXELS + 1))
    assert result.exit_code == 2
    assert result.output.strip() == (f"Error: max_pixels {Image.MAX_IMAGE_PIXELS + 1}: expected 1 to "
                                     f"{Image.MAX_IMAGE_PIXELS} (Pillow's decompression-bomb limit, "
                                     "PIL.Image.MAX_IMAGE_PIXELS)")
    assert not (tmp_path / "store").exists()
