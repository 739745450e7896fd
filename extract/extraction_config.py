"""What an extraction job does: one frozen record of `run_extraction`'s settings (extract/job.py), each
field's default, bounds or choices and meaning given once, where the job, the pipeline's extract step
(its YAML fields) and `vlbert extract` (its options' defaults) read them."""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from extract.images import DEFAULT_MAX_PIXELS
from extract.jpeg import DEFAULT_JPEG_DECODING, JPEG_DECODING
from extract.modeling.res5_layouts import DEFAULT_RES5_LAYOUT, RES5_LAYOUTS
from extract.modeling.speed_paths import SPEED_PATHS
from extract.store.schema import FEATURE_ENCODINGS
from extract.store.writer import DEFAULT_MAP_SIZE
from vlbert.utils.errors import UserError


class JobError(UserError):
    """Job arguments that cannot be used (shard spec, boxes file, ...); nothing has been written."""


@dataclass(frozen=True)
class Bounds:
    least: float
    most: float | None = None  # None: no bound
    why: str = ""  # what sets the bound, for the message

    def holds(self, value: float) -> bool:
        return self.least <= value and (self.most is None or value <= self.most)  # NaN: neither

    def __str__(self) -> str:
        return (f"{self.least} to {self.most}" if self.most is not None else f"at least {self.least}") + self.why


def _setting(default: Any, meaning: str, bounds: Bounds | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A field of ExtractionConfig: its default, what it means, and the numbers (`bounds`; None is a
    value of its own where the default is None) or names (`choices`; of a tuple, each item) it takes."""
    return field(default=default, metadata={"help": meaning, "bounds": bounds, "choices": choices})


@dataclass(frozen=True)
class ExtractionConfig:
    """An extraction job's settings; a value the job cannot take is a JobError naming it, as the record
    is built. `out` (the FeatureStore) is `run_extraction`'s other argument: a pipeline step's folder."""

    images: str | Path = field(metadata={"help": (
        "a folder of images, or tar shards (img2dataset's webdataset output; extract.shards.names_shards): "
        "their images get the ids of img2dataset's files output, `shard` takes whole tar shards, and a tar "
        "shard committed whole is not read again (extract/shard_source.py)")})
    detector: str = _setting("butd-vg", "a preset, a detector YAML file, or d2:CONFIG.yaml (extract/backends)")
    _: KW_ONLY
    weights: str | Path | None = _setting(None, "the detector's checkpoint; None: seeded random weights")
    overrides: dict[str, Any] | None = _setting(None, "detector config fields over the detector's")
    boxes: str | Path | None = _setting(None, "a JSON file of each image's boxes (given-box mode)")
    image_list: str | Path | None = _setting(None, "a text file of the image paths to extract, one a line")
    batch_size: int = _setting(8, "images computed in one batch", Bounds(1))
    device: str = _setting("cpu", "cpu, cuda or cuda:N")
    precision: str = _setting("fp32", "the detector's arithmetic (fp32, tf32, bf16), recorded in meta.json")
    res5_layout: str = _setting(DEFAULT_RES5_LAYOUT, "how the detector runs res5 (extract/modeling/res5_layouts.py), "
                                "recorded in meta.json", choices=RES5_LAYOUTS)
    speed_paths: tuple[str, ...] = _setting((), "ways of running the detector faster "
                                            "(extract/modeling/speed_paths.py), recorded in meta.json; none: the "
                                            "reference numbers", choices=SPEED_PATHS)
    feature_dtype: str = _setting("float16", "the stored features' encoding", choices=FEATURE_ENCODINGS)
    top_k_classes: int | None = _setting(10, "class probabilities kept per box; None: the full distributions",
                                         Bounds(1))
    mask_variants: int = _setting(0, "masked-pixel variants per image", Bounds(0))
    mask_prob: float = _setting(0.15, "probability of masking each box in a variant", Bounds(0.0, 1.0))
    mask_seed: int = _setting(0, "seed of the masks drawn", Bounds(0))
    shard: tuple[int, int] | None = _setting(None, "(i, n): slice i of n; None: RANK/WORLD_SIZE of a launcher, "
                                                   "else everything")
    decode_workers: int | None = _setting(None, "processes that read and decode the image files (0: the job's "
                                                "process); None: extract/resources.py decides", Bounds(0))
    progress: bool = _setting(True, "a progress bar")
    max_pixels: int = _setting(DEFAULT_MAX_PIXELS, "an image of more pixels is a failure, refused from its header "
                               "before decoding",
                               Bounds(1, Image.MAX_IMAGE_PIXELS,
                                      " (Pillow's decompression-bomb limit, PIL.Image.MAX_IMAGE_PIXELS)"))
    threads: int | None = _setting(None, "batches computed at once on the CPU, each with single-threaded ops "
                                         "(None: one per core, at most 4, unless OMP_NUM_THREADS is set), or "
                                         "torch's host-side threads on a GPU", Bounds(1))
    streams: int | None = _setting(None, "batches computed at once on a GPU, each on a CUDA stream of its own "
                                         "(None: 2)", Bounds(1))
    jpeg_decoding: str = _setting(DEFAULT_JPEG_DECODING, "where JPEGs are decoded: workers (Pillow, bitwise the "
                                  "CPU's pixels), auto (on a CUDA device that can: extract/jpeg.py) or device",
                                  choices=JPEG_DECODING)
    initial_map_size: int = _setting(DEFAULT_MAP_SIZE, "bytes of the LMDB map a new shard starts with", Bounds(1))

    def __post_init__(self) -> None:
        _check(self)


def _check(config: ExtractionConfig) -> None:
    """JobError naming the first setting of `config` it cannot take: a number out of its bounds, a shard
    that is not (i, n) with 0 <= i < n, a name not among its choices."""
    specs = dataclasses.fields(config)
    for spec in specs:
        value, bounds = getattr(config, spec.name), spec.metadata.get("bounds")
        if bounds is not None and value is not None and not bounds.holds(value):
            raise JobError(f"{spec.name} {value}: expected {bounds}")
    shard = config.shard
    if shard is not None and not (len(shard) == 2 and 0 <= shard[0] < shard[1]):
        raise JobError(f"shard {list(shard)}: expected [i, n] with 0 <= i < n")
    for spec in specs:
        value, choices = getattr(config, spec.name), spec.metadata.get("choices")
        for name in value if isinstance(value, tuple) else (value,):
            if choices and name not in choices:
                raise JobError(f"{spec.name} {name!r}: expected one of {', '.join(choices)}")


def default_of(name: str) -> Any:
    """The default of ExtractionConfig's field `name` (`vlbert extract` shows it as its option's)."""
    return next(spec.default for spec in dataclasses.fields(ExtractionConfig) if spec.name == name)
