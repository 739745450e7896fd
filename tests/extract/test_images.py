"""Reading image files: every common mode becomes RGB uint8, and unusable files get a clear error."""

import numpy as np
import pytest
from PIL import Image

from extract import ImageError, load_image
from extract.images import image_id, list_images
from extract.synthetic import synthetic_image


def save(tmp_path, name, image, **kwargs):
    path = tmp_path / name
    image.save(path, **kwargs)
    return path


def test_rgb_jpeg_and_png(tmp_path):
    array = synthetic_image(40, 60)
    assert np.array_equal(load_image(save(tmp_path, "a.png", Image.fromarray(array))), array)
    jpeg = load_image(save(tmp_path, "a.jpg", Image.fromarray(array), quality=95))
    assert jpeg.shape == (40, 60, 3) and jpeg.dtype == np.uint8


@pytest.mark.parametrize("mode", ["L", "P", "CMYK", "RGBA", "LA", "1"])
def test_other_modes_become_rgb(tmp_path, mode):
    rgb = Image.fromarray(synthetic_image(30, 50))
    image = rgb.convert(mode)
    path = save(tmp_path, "x.jpg" if mode == "CMYK" else "x.png", image)
    array = load_image(path)
    assert array.shape == (30, 50, 3) and array.dtype == np.uint8
    if mode in ("RGBA",):
        assert np.array_equal(array, np.asarray(rgb))  # alpha dropped, colours kept
    if mode == "L":
        assert np.array_equal(array[..., 0], np.asarray(image)) and np.array_equal(array[..., 0], array[..., 2])


def test_sixteen_bit_images_are_scaled_to_eight_bits(tmp_path):
    values = np.array([[0, 257, 65535], [32896, 1000, 60000]], dtype=np.uint16)
    path = save(tmp_path, "deep.png", Image.fromarray(values))
    array = load_image(path)
    assert array.shape == (2, 3, 3)
    assert array[..., 1].tolist() == [[0, 1, 255], [128, 4, 233]]


def test_exif_orientation_is_applied(tmp_path):
    image = Image.fromarray(synthetic_image(20, 40))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = save(tmp_path, "rotated.jpg", image, exif=exif)
    assert load_image(path).shape == (40, 20, 3)


def test_unusable_files_name_the_file_and_the_reason(tmp_path):
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    with pytest.raises(ImageError, match=r"notes\.jpg: not an image file"):
        load_image(text)
    full = save(tmp_path, "full.jpg", Image.fromarray(synthetic_image(200, 200)))
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(full.read_bytes()[:2000])
    with pytest.raises(ImageError, match=r"truncated\.jpg: unreadable or truncated"):
        load_image(truncated)
    with pytest.raises(ImageError, match=r"absent\.png: no such file"):
        load_image(tmp_path / "absent.png")
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match=r"empty\.png"):
        load_image(empty)


def test_image_ids_are_relative_paths_without_extension(tmp_path):
    (tmp_path / "coco" / "val").mkdir(parents=True)
    for name in ("coco/val/1.jpg", "b.png", "coco/notes.txt"):
        (tmp_path / name).write_bytes(b"")
    found = list_images(tmp_path)
    assert [image_id(p, tmp_path) for p in found] == ["b", "coco/val/1"]


def test_symlinked_folders_are_followed_once_and_loops_skipped(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.jpg").write_bytes(b"")
    (elsewhere / "loop").symlink_to(elsewhere)  # a loop back to its own folder
    root = tmp_path / "images"
    root.mkdir()
    (root / "b.png").write_bytes(b"")
    (root / "again").symlink_to(elsewhere)
    (root / "linked").symlink_to(elsewhere)  # a second link to the same folder
    (root / "gone.jpg").symlink_to(tmp_path / "missing.jpg")  # dangling: listed, then fails as missing
    with pytest.warns(UserWarning) as caught:
        found = list_images(root)
    assert [image_id(p, root) for p in found] == ["again/a", "b", "gone"]
    assert sorted(str(w.message).split(":")[0] for w in caught) == [str(root / "again" / "loop"), str(root / "linked")]
