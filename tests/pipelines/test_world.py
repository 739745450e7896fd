"""The demo world generator: determinism, pixels that match the annotations, answerable text."""

import collections
import json
import re

import numpy as np
import pytest

from extract import PRESETS
from pipelines.world import ATTRIBUTE_NAMES, CLASS_NAMES, generate_world, load_split, load_world_image
from pipelines.world.vocabulary import COLOURS, PLURALS, SIZE_EXTENTS

NUM_IMAGES = 40


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world")
    generate_world(out, NUM_IMAGES, seed=7)
    return out


def records(world):
    return load_split(world, "train") + load_split(world, "val")


def test_vocabulary_fits_the_tiny_detector():
    assert len(CLASS_NAMES) == PRESETS["tiny"].num_classes == 6
    assert len(ATTRIBUTE_NAMES) == PRESETS["tiny"].num_attributes == 8


def test_same_seed_same_world_other_seed_other_world(world, tmp_path):
    generate_world(tmp_path / "again", NUM_IMAGES, seed=7)
    generate_world(tmp_path / "other", NUM_IMAGES, seed=8)
    for name in ("train.jsonl", "val.jsonl", "corpus.txt", "images/val/000035.png"):
        assert (world / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
        assert (world / name).read_bytes() != (tmp_path / "other" / name).read_bytes()


def test_splits_and_image_sizes_suit_the_tiny_preset(world):
    train, val = load_split(world, "train"), load_split(world, "val")
    assert (len(train), len(val)) == (32, 8)
    for record in train + val:
        image = load_world_image(world, record)
        assert image.shape == (record["height"], record["width"], 3)
        assert min(image.shape[:2]) == PRESETS["tiny"].min_size and max(image.shape[:2]) <= PRESETS["tiny"].max_size


def _colour_fraction(pixels: np.ndarray, colour: str) -> float:
    distance = np.abs(pixels.astype(int) - np.array(COLOURS[colour])).max(axis=-1)
    return float((distance <= 12).mean()) if distance.size else 0.0


def test_boxes_are_tight_around_their_objects_colour(world):
    for record in records(world):
        image = load_world_image(world, record)
        for obj in record["objects"]:
            x1, y1, x2, y2 = obj["box"]
            colour = obj["attributes"][0]
            assert obj["class"] in CLASS_NAMES and colour in COLOURS
            assert 0 <= x1 < x2 <= record["width"] and 0 <= y1 < y2 <= record["height"]
            # A star covers the least of its box (about 35%).
            assert _colour_fraction(image[y1:y2, x1:x2], colour) > 0.3
            # Every edge row and column of the box touches the shape; the ring just outside does not.
            inside = image[y1:y2, x1:x2]
            for edge in (inside[0], inside[-1], inside[:, 0], inside[:, -1]):
                assert _colour_fraction(edge, colour) > 0
            for outside in (image[y1:y2, x1 - 1] if x1 > 0 else None, image[y1:y2, x2] if x2 < record["width"] else None,
                            image[y1 - 1, x1:x2] if y1 > 0 else None, image[y2, x1:x2] if y2 < record["height"] else None):
                assert outside is None or _colour_fraction(outside, colour) == 0


def test_size_attributes_follow_the_box_size(world):
    for record in records(world):
        for obj in record["objects"]:
            extent = max(obj["box"][2] - obj["box"][0], obj["box"][3] - obj["box"][1])
            sizes = [a for a in obj["attributes"] if a in SIZE_EXTENTS]
            size = sizes[0] if sizes else "medium"
            low, high = SIZE_EXTENTS[size]
            assert low - 2 <= extent <= high


def _centre(obj):
    x1, y1, x2, y2 = obj["box"]
    return (x1 + x2) / 2, (y1 + y2) / 2


def _find(objects, colour, shape):
    found = [o for o in objects if o["class"] == shape and o["attributes"][0] == colour]
    assert len(found) == 1, f"'{colour} {shape}' does not name one object"
    return found[0]


def test_vqa_answers_are_true_of_the_objects(world):
    singular = {plural: shape for shape, plural in PLURALS.items()}
    for record in records(world):
        objects = record["objects"]
        colours, shapes = [o["attributes"][0] for o in objects], [o["class"] for o in objects]
        for item in record["vqa"]:
            q, a = item["question"], item["answer"]
            if m := re.fullmatch(r"what colour is the (\w+)\?", q):
                assert shapes.count(m[1]) == 1 and colours[shapes.index(m[1])] == a
            elif m := re.fullmatch(r"what shape is the (\w+) object\?", q):
                assert colours.count(m[1]) == 1 and shapes[colours.index(m[1])] == a
            elif q == "how many shapes are there?":
                assert a == str(len(objects))
            elif m := re.fullmatch(r"how many (\w+) objects are there\?", q):
                assert a == str(colours.count(m[1]))
            elif m := re.fullmatch(r"how many (\w+) are there\?", q):
                assert a == str(shapes.count(singular[m[1]]))
            else:
                m = re.fullmatch(r"is the (\w+) (\w+) (to the left of|to the right of|above|below) the (\w+) (\w+)\?", q)
                assert m, q
                (ax, ay), (bx, by) = _centre(_find(objects, m[1], m[2])), _centre(_find(objects, m[4], m[5]))
                truth = {"to the left of": bx - ax >= 10, "to the right of": ax - bx >= 10,
                         "above": by - ay >= 10, "below": ay - by >= 10}[m[3]]
                assert a == ("yes" if truth else "no"), q


def test_vqa_is_balanced_across_types_and_answers(world):
    items = [item for record in records(world) for item in record["vqa"]]
    types = collections.Counter(item["answer_type"] for item in items)
    assert set(types) == {"colour", "shape", "count", "position"} and min(types.values()) > len(items) / 8
    majority = collections.Counter(item["answer"] for item in items).most_common(1)[0][1]
    assert majority / len(items) < 0.3


def test_referring_expressions_name_their_target(world):
    for record in records(world):
        for ref in record["refs"]:
            target = record["objects"][ref["object"]]
            assert ref["box"] == target["box"]
            words = ref["text"].split()
            assert words[0] == "the" and words[-1] == target["class"]
            if len(words) > 2 and words[1] not in ("leftmost", "rightmost"):
                assert set(words[1:-1]) <= set(target["attributes"])


def test_captions_and_corpus(world):
    record = records(world)[0]
    assert len(record["captions"]) == 3
    assert all(f"{o['attributes'][0]} {o['class']}" in record["captions"][0] for o in record["objects"])
    lines = (world / "corpus.txt").read_text().splitlines()
    assert len(lines) == 2000 and len(set(lines)) > 1900
    assert np.mean([len(line.split()) for line in lines]) > 25


def test_annotated_fraction_keeps_pixels_and_captions_and_thins_the_training_tasks(world, tmp_path):
    from pipelines.world import WorldConfig

    generate_world(tmp_path, NUM_IMAGES, seed=7, config=WorldConfig(annotated_fraction=0.25))
    for name in ("val.jsonl", "corpus.txt", "images/train/000003.png"):
        assert (world / name).read_bytes() == (tmp_path / name).read_bytes()
    full, thinned = load_split(world, "train"), load_split(tmp_path, "train")
    kept = [record["vqa"] != [] for record in thinned]
    assert 0 < sum(kept) < len(thinned) // 2
    for before, after, keeps in zip(full, thinned, kept):
        assert {k: v for k, v in after.items() if k not in ("vqa", "refs")} == \
            {k: v for k, v in before.items() if k not in ("vqa", "refs")}
        expected = (before["vqa"], before["refs"]) if keeps else ([], [])
        assert (after["vqa"], after["refs"]) == expected


def test_world_step_refuses_an_annotated_fraction_outside_0_to_1():
    from pipelines.steps.world import KIND
    from train.engine.config import RunConfigError

    for wrong in (0, 1.5):
        with pytest.raises(RunConfigError, match=f"annotated_fraction: expected more than 0 and at most 1, found {wrong}"):
            KIND.check({"annotated_fraction": wrong})


def test_max_objects_bounds_every_scene_and_the_world_step_passes_it_on(tmp_path):
    from pipelines.steps.world import world as world_step

    world_step({"images": NUM_IMAGES, "seed": 7, "max_objects": 2}, tmp_path, resume=False, log=print)
    counts = collections.Counter(len(record["objects"]) for record in records(tmp_path))
    assert set(counts) == {1, 2} and min(counts.values()) >= NUM_IMAGES // 4
    assert json.loads((tmp_path / "world.json").read_text())["config"]["max_objects"] == 2
    # Captions and questions stay true of the fewer objects: the counting caption counts them.
    for record in records(tmp_path):
        number = ("one", "two")[len(record["objects"]) - 1]
        assert f"there {'is' if number == 'one' else 'are'} {number} " in " ".join(record["captions"])


def test_world_step_and_command_refuse_max_objects_outside_1_to_5(tmp_path):
    from click.testing import CliRunner

    from pipelines.cli import main
    from pipelines.steps.world import KIND
    from train.engine.config import RunConfigError

    for wrong in (0, 6):
        with pytest.raises(RunConfigError, match=f"max_objects: expected .*, found {wrong}"):
            KIND.check({"max_objects": wrong})
        result = CliRunner().invoke(main, ["world", "generate", "--out", str(tmp_path / "w"),
                                           "--max-objects", str(wrong)])
        assert result.exit_code == 2 and "--max-objects" in result.output
    assert not (tmp_path / "w").exists()


def test_val_images_adds_evaluation_images_and_leaves_the_training_split_as_it_was(world, tmp_path):
    from pipelines.steps.world import world as world_step

    # The fixture's 40 images hold 32 training ones; 32 + 20 with 20 in val keeps those 32.
    world_step({"images": 52, "seed": 7, "val_images": 20}, tmp_path, resume=False, log=print)
    assert (tmp_path / "train.jsonl").read_bytes() == (world / "train.jsonl").read_bytes()
    assert (tmp_path / "images/train/000031.png").read_bytes() == (world / "images/train/000031.png").read_bytes()
    val, before = load_split(tmp_path, "val"), load_split(world, "val")
    assert len(val) == 20 and val[:len(before)] == before
    meta = json.loads((tmp_path / "world.json").read_text())
    assert meta["splits"] == {"train": 32, "val": 20} and meta["config"]["val_images"] == 20


def test_world_step_and_command_refuse_val_images_that_leave_nothing_to_train_on(tmp_path):
    from click.testing import CliRunner

    from pipelines.cli import main
    from pipelines.steps.world import KIND
    from pipelines.world import WorldConfig
    from train.engine.config import RunConfigError

    with pytest.raises(RunConfigError, match="val_images: 40 of 40 images leaves none to train on"):
        KIND.check({"images": 40, "val_images": 40})
    with pytest.raises(RunConfigError, match="val_images: expected at least 0, found -1"):
        KIND.check({"val_images": -1})
    result = CliRunner().invoke(main, ["world", "generate", "--out", str(tmp_path / "w"), "--images", "5",
                                       "--val-images", "5"])
    assert result.exit_code == 2 and "--val-images" in result.output and "leaves none to train on" in result.output
    assert not (tmp_path / "w").exists()
    with pytest.raises(ValueError, match="val_images: 6 of 5 images"):
        generate_world(tmp_path / "w", 5, config=WorldConfig(val_images=6))
