"""`vlbert extract`: run the detector over a directory of images into a FeatureStore."""

from pathlib import Path

import click

from extract.config import parse_override
from extract.extraction_config import ExtractionConfig, default_of
from extract.jpeg import JPEG_DECODING
from extract.modeling.res5_layouts import RES5_LAYOUTS
from extract.modeling.speed_paths import SPEED_PATHS
from extract.presets import PRESETS
from extract.store.schema import FEATURE_ENCODINGS, feature_dtype_help
from pipelines.commands.values import FiniteFloatRange
from vlbert.utils.precision import PRECISIONS


def _top_k(value: str) -> int | None:
    if value == "all":
        return None
    try:
        k = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a positive integer or 'all'") from None
    if k < 1:
        raise click.BadParameter(f"{value!r}: expected a positive integer or 'all'")
    return k


def _images(ctx: click.Context, param: click.Parameter, value: str) -> str | Path:
    """Tar shards as named (a pattern need not exist as a path), else an existing directory."""
    from extract.shards import names_shards

    if names_shards(value):
        return value
    return click.Path(exists=True, file_okay=False, path_type=Path).convert(value, param, ctx)


@click.command("extract")
@click.option("--images", required=True, callback=_images,
              help="Directory of images; an image's id is its path relative to it, without extension. Or "
                   "img2dataset's webdataset tar shards: a .tar file, a folder of them, a glob ('R/*.tar') or a "
                   "brace range ('R/{00000..00331}.tar'); the image of member KEY.jpg of R/00000.tar has the id "
                   "00000/KEY, as the file R/00000/KEY.jpg of img2dataset's files output.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="FeatureStore directory (created, or resumed when it exists).")
@click.option("--detector", required=True,
              help=f"Preset ({', '.join(PRESETS)}), a YAML config file, or d2:CONFIG.yaml: any detectron2 "
                   "Faster R-CNN (C4 or FPN) run by detectron2 itself, if installed (optional; --set then takes "
                   "score_thresh, nms_thresh, min_boxes, max_boxes or detectron2 keys such as MODEL.RPN.NMS_THRESH).")
@click.option("--weights", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Detector checkpoint (.pkl, .pth, .safetensors); without it, seeded random weights.")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE", help="Detector config override (repeatable).")
@click.option("--boxes", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON object: image path relative to --images → list of [x1, y1, x2, y2] in original pixels.")
@click.option("--list", "image_list", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Text file of image paths relative to --images, one a line (images.txt of `vlbert data "
                   "prepare`): only these are extracted.")
@click.option("--batch-size", default=default_of("batch_size"), show_default=True, type=click.IntRange(min=1))
@click.option("--device", default=default_of("device"), show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default=default_of("precision"), show_default=True,
              help="Detector arithmetic, recorded in the store's meta.json: fp32 (the reference numbers), tf32 "
                   "(CUDA only) or bf16 (for GPUs; slower on CPUs without bfloat16 instructions).")
@click.option("--res5-layout", type=click.Choice(list(RES5_LAYOUTS)), default=default_of("res5_layout"),
              show_default=True,
              help="How the RoI head runs res5, recorded in the store's meta.json: dilated (as built: the reference "
                   "numbers) or polyphase (BUTD's dilated res5 as standard convs on each RoI's sub-grids: the same "
                   "features up to float rounding; refused where res5 is not stride 1 with dilation 2 or more).")
@click.option("--speed-path", "speed_paths", type=click.Choice(list(SPEED_PATHS)), multiple=True,
              help="A way of running the detector faster, recorded in the store's meta.json (repeatable; none: the "
                   "reference numbers): folded-res5-norms, cudnn-benchmark, bf16-roi-pooling (with --precision bf16) "
                   "or batched-rpn; what each changes in the numbers: docs/extraction.md.")
@click.option("--feature-dtype", type=click.Choice(list(FEATURE_ENCODINGS)), default=default_of("feature_dtype"),
              show_default=True,
              help=feature_dtype_help())
@click.option("--top-k-classes", default=str(default_of("top_k_classes")), show_default=True,
              help="Class probabilities kept per box for masked-RoI targets; 'all' keeps the full distribution.")
@click.option("--mask-variants", default=default_of("mask_variants"), show_default=True, type=click.IntRange(min=0),
              help="Masked-pixel variants per image (K).")
@click.option("--mask-prob", default=default_of("mask_prob"), show_default=True, type=FiniteFloatRange(0, 1),
              help="Probability of masking each box in a variant (at least one box is masked).")
@click.option("--mask-seed", default=default_of("mask_seed"), show_default=True, type=int)
@click.option("--shard", default=None, metavar="i/n",
              help="Process slice i of n (default: RANK/WORLD_SIZE from a launcher, else everything); with tar "
                   "shards, every n-th tar shard from the i-th.")
@click.option("--workers", type=click.IntRange(min=0),
              help="Processes that read and decode the image files (0: the job's process) [default: 2 on the CPU; "
                   "on a GPU the cores this process may use less one per stream and one, from 2 to 8]. A worker "
                   "that crashes on a file makes that file a failure and is replaced.")
@click.option("--jpeg-decoding", type=click.Choice(JPEG_DECODING), default=default_of("jpeg_decoding"),
              show_default=True,
              help="Where JPEGs are decoded: workers (Pillow, the CPU's pixels bit for bit), auto (on a CUDA device, "
                   "in batches with nvJPEG, where torchvision can; faster, but its pixels differ from libjpeg's by a "
                   "level or so), or device (refused where it cannot). Other formats, and JPEGs the device cannot "
                   "decode as Pillow does, are always decoded by Pillow.")
@click.option("--threads", type=click.IntRange(min=1),
              help="CPU threads that compute [default: OMP_NUM_THREADS when set, else one per core, at most 4]. On "
                   "the CPU each computes whole batches with single-threaded torch ops, which copes with busy "
                   "neighbours and gives the same numbers for any count; on a GPU, torch's host-side threads "
                   "(default 1).")
@click.option("--streams", type=click.IntRange(min=1),
              help="On a GPU, batches computed at once, each on a CUDA stream of its own, so that the device "
                   "computes one while the host works on another [default: 2].")
@click.option("--max-pixels", default=default_of("max_pixels"), show_default=True, type=click.IntRange(min=1),
              help="Images with more pixels (width x height, read from the file's header) are failures, refused "
                   "before decoding: a small file can declare a huge image. At most Pillow's decompression-bomb "
                   "limit, PIL.Image.MAX_IMAGE_PIXELS (about 89 MP).")
@click.option("--strict", is_flag=True, help="Exit with status 1 when any image failed (or a tar shard was damaged).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def extract_command(images, out, detector, weights, overrides, boxes, image_list, batch_size, device, precision,
                    res5_layout, speed_paths, feature_dtype, top_k_classes, mask_variants, mask_prob, mask_seed, shard,
                    workers, jpeg_decoding, threads, streams, max_pixels, strict, quiet) -> None:
    """Extract RoI features for every image under --images into the FeatureStore --out.

    Rerunning the same command resumes: stored images are skipped, failed ones retried.
    """
    from extract.job import parse_shard, run_extraction

    config = ExtractionConfig(
        images, detector, weights=weights, overrides=dict(parse_override(o) for o in overrides),
        boxes=boxes, image_list=image_list, batch_size=batch_size, device=device, precision=precision,
        res5_layout=res5_layout, speed_paths=speed_paths, feature_dtype=feature_dtype,
        top_k_classes=_top_k(top_k_classes), mask_variants=mask_variants, mask_prob=mask_prob,
        mask_seed=mask_seed, shard=parse_shard(shard) if shard else None, decode_workers=workers,
        progress=not quiet, max_pixels=max_pixels, threads=threads, streams=streams, jpeg_decoding=jpeg_decoding,
    )
    summary = run_extraction(config, out)
    click.echo(summary.report())
    if strict and summary.failed:
        raise click.ClickException(f"{summary.failed} image(s) failed (--strict)")


COMMANDS = [extract_command]
