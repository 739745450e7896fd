"""Detector throughput: images/s and ms per image in detection and given-box modes, per precision.

    .venv/bin/python bench/bench_detector.py                      # tiny and butd-vg on CPU (and CUDA if present)
    .venv/bin/python bench/bench_detector.py --presets tiny --images 32
    .venv/bin/python bench/bench_detector.py --devices cuda --precisions fp32,tf32,bf16 --batch-size 8
    .venv/bin/python bench/bench_detector.py --parts res5 --presets butd-vg --devices cuda --precisions fp32,bf16

Random weights; synthetic 480x640 images (resized by each preset as at test time); 10 given boxes
per image. When detectron2 is importable, the same weights run in detectron2 side by side (backbone
+ RPN + RoI head for detection; for given boxes, backbone + `_shared_roi_transform` + box predictor
on the same boxes and the whole-image box, as ours pools) and the ratio ours / detectron2 is printed
(for butd-vg, with the caffe stem and dilated res5 patched in as the parity test does). The two
run in alternation, best of --repeat each, so that load changes on a shared machine hit both. Each precision other than fp32 is also compared with fp32 on the same images
(`extract.fidelity.compare_to_fp32`: feature cosine, argmax agreement, detected boxes). Last, the
bottom-up-attention box selection on the first image's real proposals and class probabilities,
timed against the straightforward one-NMS-per-class loop it replaced (the test's reference).

`--parts res5`: the RoI head's res5 alone on --res5-rois pooled RoIs (random, the pooler's output
at the preset's width: 300 x 1024 x 14 x 14 for butd-vg), run in its two layouts side by side
(extract/modeling/res5_layouts.py: dilated, polyphase) and with each speed path that acts on res5
(extract/modeling/speed_paths.py: folded-res5-norms, cudnn-benchmark, bf16-roi-pooling under bf16
only), each on the dilated layout, per precision: ms per call, the ratio to dilated and how far the
features are from dilated's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from extract import Detector, select_boxes  # noqa: E402
from extract.config import parse_override  # noqa: E402
from extract.fidelity import compare_to_fp32  # noqa: E402
from extract.modeling.res5_layouts import RES5_LAYOUTS  # noqa: E402
from extract.modeling.speed_paths import (BF16_ROI_POOLING, CUDNN_BENCHMARK, FOLDED_RES5_NORMS,  # noqa: E402
                                          SPEED_PATHS)
from extract.selection import per_class_nms_selection  # noqa: E402
from vlbert.utils.precision import precision as find_precision  # noqa: E402

RES5_SPEED_PATHS = (FOLDED_RES5_NORMS, CUDNN_BENCHMARK, BF16_ROI_POOLING)  # the speed paths that act on res5


def synthetic_images(count: int, height: int = 480, width: int = 640) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8) for _ in range(count)]


def given_boxes(height: int, width: int, count: int = 10) -> torch.Tensor:
    rng = np.random.default_rng(1)
    xy = rng.uniform(0, 0.6, size=(count, 2)) * [width, height]
    wh = rng.uniform(0.1, 0.4, size=(count, 2)) * [width, height]
    return torch.tensor(np.concatenate([xy, xy + wh], axis=1), dtype=torch.float32)


def timed(fn, device: str, repeat: int) -> float:
    """Seconds per call: one warm-up call, then the best of `repeat` timed calls."""
    return timed_side_by_side([fn], device, repeat)[0]


def timed_side_by_side(fns, device: str, repeat: int) -> list[float]:
    """Each callable's seconds per call, best of `repeat`: one warm-up call each, then rounds that
    call each in turn, so that a change of load on a shared machine falls on all of them alike."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def detectron2_runner(detector: Detector, device: str):
    """Callables running detectron2 with the same weights, or None where detectron2 is absent
    (or cannot build the architecture: its ResNets come in the standard depths only)."""
    try:
        from detectron2.structures import Boxes
        from extract.detectron2_reference import detectron2_model
    except ImportError:
        return None
    ours = detector.cfg
    if ours.res_blocks != (3, 4, 23, 3) or ours.stem_out_channels != 64:
        return None
    model = detectron2_model(ours, device)
    model.load_state_dict({k: v for k, v in detector.state_dict().items() if k in model.state_dict()}, strict=True)
    mean = torch.tensor(ours.pixel_mean, device=device).view(3, 1, 1)

    def inputs(prepared):
        # detectron2 gets the already resized BGR image, so both sides skip the same work.
        return [{"image": p.tensor[:, : p.input_height, : p.input_width] + mean} for p in prepared]

    @torch.no_grad()
    def detect(prepared):
        model.inference(inputs(prepared), do_postprocess=False)

    @torch.no_grad()
    def describe(prepared, boxes):
        images = model.preprocess_image(inputs(prepared))
        res4 = model.backbone(images.tensor)["res4"]
        # The whole-image box too, as every record holds its feature: both sides pool the same RoIs.
        scaled = [Boxes(p.to_input(torch.cat((p.whole_image_box(), b)))) for p, b in zip(prepared, boxes)]
        model.roi_heads.box_predictor(model.roi_heads._shared_roi_transform([res4], scaled).mean(dim=(2, 3)))

    return detect, describe


def bench(preset: str, device: str, count: int, batch_size: int, repeat: int, precisions: list[str],
          overrides: dict[str, str]) -> None:
    detector = Detector.build(preset, device=device, **overrides)
    arrays = synthetic_images(count)
    prepared = [detector.prepare(a) for a in arrays]
    boxes = [given_boxes(*a.shape[:2]) for a in arrays]
    batches = [range(i, min(i + batch_size, count)) for i in range(0, count, batch_size)]

    def run_detect(runner=detector.detect):
        for b in batches:
            runner([prepared[i] for i in b])

    def run_describe(runner=detector.describe):
        for b in batches:
            runner([prepared[i] for i in b], [boxes[i] for i in b])

    size = f"{prepared[0].input_width}x{prepared[0].input_height}"
    print(f"\n{preset} on {device}: {count} images at {size}, batch {batch_size}, best of {repeat}")
    d2 = detectron2_runner(detector, device)
    for precision in precisions:
        detector.precision = precision
        with_d2 = d2 is not None and precision == "fp32"
        ours, d2_times = {}, {}
        for mode, run, theirs in (("detection", run_detect, d2 and d2[0]), ("given boxes", run_describe, d2 and d2[1])):
            if with_d2:
                ours[mode], d2_times[mode] = timed_side_by_side([run, lambda: run(theirs)], device, repeat)
            else:
                ours[mode] = timed(run, device, repeat)
        for mode, seconds in ours.items():
            line = (f"  {mode:12s} {precision:5s} {count / seconds:8.2f} images/s"
                    f"  {1000 * seconds / count:9.1f} ms/image")
            if with_d2:
                theirs = d2_times[mode]
                line += (f"   detectron2 {count / theirs:8.2f} images/s {1000 * theirs / count:9.1f} ms/image"
                         f"   speed ours/detectron2 {theirs / seconds:5.2f}x")
            print(line)
        if precision != "fp32":
            a = compare_to_fp32(detector, prepared, precision)
            attributes = "" if a.attribute_agreement is None else f", attributes {a.attribute_agreement:.3f}"
            print(f"  {precision} vs fp32 over {a.rows} rows: feature cosine min {a.cosine_min:.6f} mean "
                  f"{a.cosine_mean:.6f}, relative L2 max {a.relative_l2_max:.2e}; argmax agreement: classes "
                  f"{a.class_agreement:.3f}{attributes}; detected boxes kept {a.detected_boxes:.3f}")
    detector.precision = "fp32"
    bench_selection(detector, prepared[0], device, repeat)


def bench_selection(detector: Detector, image, device: str, repeat: int) -> None:
    """The selection on one image's real inputs: its proposals and their class probabilities."""
    cfg = detector.cfg
    with torch.no_grad():
        features = detector.feature_maps([image])
        proposals, _ = detector.proposal_generator(features[0], (image.input_height, image.input_width))
        probs = detector.roi_heads(features, [proposals])[0].class_logits.float().softmax(dim=1)
    args = (proposals, probs, cfg.score_thresh, cfg.nms_thresh, cfg.min_boxes, cfg.max_boxes)
    fast = timed(lambda: select_boxes(*args), device, repeat)
    loop = timed(lambda: per_class_nms_selection(*args), device, repeat)
    same = all(torch.equal(a, b) for a, b in zip(select_boxes(*args), per_class_nms_selection(*args)))
    print(f"  selection of {len(proposals)} proposals x {cfg.num_classes} classes: {1000 * fast:.1f} ms, "
          f"one NMS per class {1000 * loop:.1f} ms ({loop / fast:.1f}x), same boxes and confidences: {same}")


def bench_res5_layouts(preset: str, device: str, rois: int, repeat: int, precisions: list[str],
                       overrides: dict[str, str]) -> None:
    """res5 over `rois` pooled RoIs in each layout and with each res5 speed path (on the dilated layout),
    side by side (module doc)."""
    detector = Detector.build(preset, device=device, **overrides)
    heads, cfg = detector.roi_heads, detector.cfg
    size = (rois, detector.backbone.output_shape.channels, cfg.pooler_resolution, cfg.pooler_resolution)
    pooled = torch.rand(size, generator=torch.Generator().manual_seed(2)).to(device)
    print(f"\n{preset} on {device}: res5 on {' x '.join(map(str, size))} pooled RoIs (stride {cfg.res5_stride}, "
          f"dilation {cfg.res5_dilation}), best of {repeat}")
    unfit = {name: layout.unfit(cfg) for name, layout in RES5_LAYOUTS.items() if layout.unfit(cfg)}
    if unfit:
        print("  " + "; ".join(f"{name} does not apply: {why}" for name, why in unfit.items()))
        return
    # (label, layout, speed paths): dilated first, the reference of the ratios and differences
    ways = [(name, name, ()) for name in RES5_LAYOUTS] + [(path, "dilated", (path,)) for path in RES5_SPEED_PATHS]

    @torch.no_grad()
    def run(layout: str, paths: tuple[str, ...], precision: str) -> torch.Tensor:
        heads.res5_layout, heads.speed_paths = layout, frozenset(paths)
        with find_precision(precision).applied(torch.device(device)):
            # the cast that `box_features` makes as the RoIs leave the pooler
            return heads.res5_features(pooled.bfloat16() if BF16_ROI_POOLING in paths else pooled)

    for precision in precisions:
        here = [way for way in ways if all(SPEED_PATHS[name].applies(precision) for name in way[2])]
        seconds = timed_side_by_side([lambda way=way: run(*way[1:], precision) for way in here], device, repeat)
        features = [run(*way[1:], precision) for way in here]
        for (label, _, _), s, f in zip(here, seconds, features):
            relative = ((f - features[0]).norm(dim=1) / features[0].norm(dim=1).clamp_min(1e-12)).max()
            print(f"  res5 {precision:5s} {label:17s} {1000 * s:9.2f} ms   /dilated {s / seconds[0]:5.2f}   "
                  f"features: relative L2 difference from dilated max {relative:.2e}")
    heads.res5_layout, heads.speed_paths = "dilated", frozenset()


PARTS = ("images", "res5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,butd-vg")
    parser.add_argument("--devices", default="cpu,cuda")
    parser.add_argument("--images", type=int, default=0, help="images per run (default: 16 tiny, 2 full size on CPU)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--precisions", default="fp32", help="comma-separated: fp32, tf32 (CUDA only), bf16")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="detector config override, e.g. rpn_post_nms_topk=50 (repeatable)")
    parser.add_argument("--parts", default="images",
                        help=f"comma-separated: {', '.join(PARTS)} (the res5 layouts side by side; module doc)")
    parser.add_argument("--res5-rois", type=int, default=300, help="pooled RoIs per res5 call (--parts res5)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if not set(parts) <= set(PARTS):
        parser.error(f"--parts {args.parts}: expected some of {', '.join(PARTS)}")
    torch.manual_seed(0)
    for device in args.devices.split(","):
        if device == "cuda" and not torch.cuda.is_available():
            print("\ncuda: not available, skipped")
            continue
        for preset in args.presets.split(","):
            count = args.images or (16 if preset == "tiny" or device == "cuda" else 2)
            precisions = [p for p in args.precisions.split(",") if device == "cuda" or p != "tf32"]
            if len(precisions) < len(args.precisions.split(",")):
                print(f"\n{device}: tf32 skipped (CUDA only)")
            overrides = dict(parse_override(o) for o in args.overrides)
            if "images" in parts:
                bench(preset, device, count, min(args.batch_size, count), args.repeat, precisions, overrides)
            if "res5" in parts:
                bench_res5_layouts(preset, device, args.res5_rois, args.repeat, precisions, overrides)


if __name__ == "__main__":
    main()
