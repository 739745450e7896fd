"""What keeps the device busy without changing a number: masks drawn on the device, one device→host
copy of a batch's regions, constants built once, boxes moved in one copy, records' top classes
without sorting whole rows."""

import numpy as np
import pytest
import torch

from extract import mask_pixels
from extract.detector import REGION_ARRAYS, RegionFeatures, checked_boxes, regions_numpy
from extract.preprocess import filled, prepare_image, transferred
from extract.store.schema import MASKED_REGION_ARRAYS, top_classes
from extract.synthetic import synthetic_image
from tests.helpers.detection import loop_masked

EDGE_BOXES = [
    [2.7, 1.2, 5.9, 3.99],  # fractions truncate
    [-0.5, -0.9, 0.2, 0.99],  # int() truncates towards zero: -0.5 → 0, not -1
    [-30.0, -7.0, -1.0, 5.0],  # wholly left of the image
    [4.0, 4.0, 4.0, 4.0],  # one pixel
    [10.0, 3.0, 2.0, 6.0],  # inverted: nothing
    [11.0, 8.0, 500.0, 900.0],  # clamped to the last row and column
    [11.99, 9.99, 12.0, 10.0],  # on the last row and column
    [12.0, 10.0, 20.0, 20.0],  # just outside
]


@pytest.mark.parametrize("seed", range(5))
def test_masks_drawn_on_the_device_zero_exactly_the_pixels_of_the_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    image = torch.randn(3, 10, 12, generator=gen)
    xy = torch.rand(20, 2, generator=gen) * 40 - 15
    random = torch.cat((xy, xy + torch.rand(20, 2, generator=gen) * 12 - 1), dim=1)
    boxes = torch.cat((torch.tensor(EDGE_BOXES), random))
    selected = torch.rand(len(boxes), generator=gen) < 0.5
    assert torch.equal(mask_pixels(image, boxes), loop_masked(image, boxes))
    assert torch.equal(mask_pixels(image, boxes, selected), loop_masked(image, boxes[selected]))
    assert torch.equal(mask_pixels(image, boxes[:0]), image)
    assert torch.equal(mask_pixels(image, boxes, torch.zeros(len(boxes), dtype=torch.bool)), image)


def test_masked_zeros_are_positive_zeros_and_the_input_is_untouched():
    image, box = -torch.ones(3, 6, 6), torch.tensor([[1.0, 1.0, 2.0, 2.0]])
    assert torch.equal(mask_pixels(image, box).view(torch.int32), loop_masked(image, box).view(torch.int32))
    assert torch.equal(image, -torch.ones(3, 6, 6))


def regions(num_boxes, attributes=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(num_boxes, 7, generator=gen).softmax(dim=1)
    conf, ids = probs[:, :-1].max(dim=1)
    attrs = torch.rand(num_boxes, 5, generator=gen).softmax(dim=1)[:, :-1].max(dim=1) if attributes else (None, None)
    return RegionFeatures(
        boxes=torch.rand(num_boxes, 4, generator=gen) * 100, features=torch.randn(num_boxes, 9, generator=gen),
        class_probs=probs, objects_id=ids, objects_conf=conf, attrs_id=attrs[1], attrs_conf=attrs[0],
        image_feature=torch.randn(9, generator=gen), image_height=30 + seed, image_width=40, box_source="given")


def per_field(region, names):
    return {name: None if getattr(region, name) is None else getattr(region, name).cpu().numpy() for name in names}


def test_one_copy_of_many_region_sets_equals_a_copy_per_field():
    sets = [regions(5), regions(0, seed=1), regions(3, attributes=False, seed=2), regions(7, seed=3)]
    arrays = [REGION_ARRAYS, REGION_ARRAYS, MASKED_REGION_ARRAYS, REGION_ARRAYS]
    for region, names, got in zip(sets, arrays, regions_numpy(sets, arrays)):
        assert set(got) == set(names) | {"image_height", "image_width", "box_source"}
        for name, expected in per_field(region, names).items():
            if expected is None:
                assert got[name] is None
            else:
                assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
                assert got[name].tobytes() == expected.tobytes() and got[name].flags.aligned, name
        assert (got["image_height"], got["image_width"], got["box_source"]) == (region.image_height, 40, "given")
    assert regions_numpy([]) == []


def test_region_numpy_is_every_field(tiny_detector):
    image = tiny_detector.prepare(synthetic_image(96, 140))
    region = tiny_detector.detect([image])[0]
    got = region.numpy()
    for name, expected in per_field(region, REGION_ARRAYS).items():
        assert np.array_equal(got[name], expected), name


def test_prepared_constants_equal_tensors_made_from_the_host(tiny_detector):
    image = prepare_image(synthetic_image(77, 150), tiny_detector.cfg)
    sx, sy = image.input_width / image.width, image.input_height / image.height
    assert torch.equal(image.scale, torch.tensor([sx, sy, sx, sy], dtype=torch.float32))
    assert torch.equal(image.whole_image_box(), torch.tensor([[0.0, 0.0, 150, 77]]))
    assert torch.equal(filled((102.9801, 115.9465, 122.7717), torch.device("cpu")),
                       torch.tensor([102.9801, 115.9465, 122.7717]))


def test_tensors_move_in_one_copy_and_keep_their_shapes():
    tensors = [torch.arange(8.0).view(2, 4), torch.zeros(0, 4), torch.ones(3, 4)]
    moved = transferred(tensors, torch.device("meta"))
    assert [t.device.type for t in moved] == ["meta"] * 3 and [t.shape for t in moved] == [t.shape for t in tensors]
    assert moved[0]._base is moved[2]._base is not None  # views of one moved tensor
    assert all(a is b for a, b in zip(transferred(tensors, torch.device("cpu")), tensors))


def test_boxes_on_the_host_and_on_the_images_device_are_checked_alike(tiny_detector):
    image = tiny_detector.prepare(synthetic_image(80, 120))
    boxes = [np.array([[-5, 0, 50, 90], [10, 10, 20, 20]], np.float32), torch.tensor([[0.0, 0.0, 130.0, 10.0]])]
    clamped = checked_boxes(boxes, [image, image])
    assert [b.tolist() for b in clamped] == [[[0, 0, 50, 80], [10, 10, 20, 20]], [[0, 0, 120, 10]]]


@pytest.mark.parametrize("classes, k", [(1601, 10), (7, 3), (5, 5), (40, 1)])
def test_top_classes_are_those_of_a_stable_sort_of_whole_rows(classes, k):
    """Ties included: within the k (class order), and across the k-th place (rows sorted whole)."""
    rng = np.random.default_rng(classes + k)
    for probs in (rng.random((30, classes)), (rng.random((30, classes)) * 4).round() / 4, np.zeros((3, classes)),
                  rng.random((0, classes))):
        probs = probs.astype(np.float32)
        assert np.array_equal(top_classes(probs, k), np.argsort(-probs, axis=1, kind="stable")[:, :k])
