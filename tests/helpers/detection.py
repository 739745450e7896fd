"""Random detector weights and inputs: checkpoint-like states, detections to select from, image folders."""

import numpy as np
import torch

from extract.synthetic import write_synthetic_images


def randomized_state(model: torch.nn.Module, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with non-trivial batch-norm statistics, as NumPy arrays (like a .pkl holds)."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, value in model.state_dict().items():
        shape = tuple(value.shape)
        if key.endswith("norm.running_var"):
            array = rng.uniform(0.5, 2.0, shape)
        elif key.endswith(("norm.running_mean", "norm.bias", ".bias")):
            array = rng.normal(0, 0.1, shape)
        elif key.endswith("norm.weight"):
            array = rng.uniform(0.2 if ".conv3." in key else 0.6, 1.2, shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            array = rng.normal(0, (1.0 / fan_in) ** 0.5, shape)
        state[key] = array.astype(np.float32)
    return state


def image_folder(root, count: int):
    """`root` with `count` synthetic images and one file named like an image that is not one."""
    write_synthetic_images(root, count)
    (root / "notes.jpg").write_text("not an image")
    return root


def random_norm_state(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every frozen norm's buffers drawn anew, as a checkpoint would bring them."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in module.state_dict().items():
        if name.endswith(("norm.weight", "norm.bias", "norm.running_mean")):
            state[name] = torch.randn(tensor.shape, generator=g) * 0.5 + (1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("norm.running_var"):
            state[name] = torch.rand(tensor.shape, generator=g) + 0.5
    return state


def trunk_input(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(seed))


def random_detections(seed, num_boxes, num_classes, sharpness, quantised):
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(num_boxes, 2, generator=gen) * torch.tensor([600.0, 400.0])
    boxes = torch.cat((xy, xy + 8 + torch.rand(num_boxes, 2, generator=gen) * 250), dim=1)
    boxes[1::7] = boxes[::7][: len(boxes[1::7])]  # duplicates: IoU 1
    probs = (torch.randn(num_boxes, num_classes + 1, generator=gen) * sharpness).softmax(dim=1)
    if quantised:  # many exact ties, within and across classes
        probs = (probs * 64).round() / 64
    return boxes, probs


def loop_masked(image, boxes):
    """The masking as it was written first: one slice per box, its corners from the host."""
    out = image.clone()
    _, h, w = out.shape
    for x1, y1, x2, y2 in boxes.tolist():
        c1, c2 = max(int(x1), 0), min(int(x2), w - 1)
        r1, r2 = max(int(y1), 0), min(int(y2), h - 1)
        if c1 <= c2 and r1 <= r2:
            out[:, r1 : r2 + 1, c1 : c2 + 1] = 0
    return out


def jpeg_folder(root, count: int = 6):
    """`count` baseline JPEGs of varied sizes (what the device decodes), and one each of what Pillow
    decodes instead: progressive, grayscale, rotated by EXIF, PNG, and a JPEG cut short (a failure).
    Smooth pictures, as photographs are: on pixel noise decoders' chroma upsampling differs by up to
    100 levels (nvJPEG against libjpeg, measured on an H200), which says nothing of photographs."""
    from PIL import Image, ImageFilter

    from extract.synthetic import synthetic_image

    def smooth(height, width, seed):
        return Image.fromarray(synthetic_image(height, width, seed=seed)).filter(ImageFilter.GaussianBlur(3))

    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        smooth(70 + 9 * i, 110 - 5 * i, i).save(root / f"photo{i}.jpg", quality=90)
    picture = smooth(80, 100, 50)
    picture.save(root / "progressive.jpg", quality=90, progressive=True)
    picture.convert("L").save(root / "gray.jpg", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: Pillow turns it upright
    picture.save(root / "rotated.jpg", quality=90, exif=exif)
    picture.save(root / "lossless.png")
    (root / "cut.jpg").write_bytes((root / "photo0.jpg").read_bytes()[:600])
    return root
