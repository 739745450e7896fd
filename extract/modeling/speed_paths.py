"""Speed paths of the detector: ways of running it faster, each switched on by name, all off by default.

Like a res5 layout (extract/modeling/res5_layouts.py), a speed path is a way of running, not a model:
no config field and no checkpoint key. A job records its paths in meta.json (`detector.speed_paths`),
and a store resumes only with the paths it was started with: some change the numbers' last bits.
The parts act on the names (`Detector.speed_paths` hands them to the RPN and the RoI head):
- folded-res5-norms: each of res5's frozen norms folded into its conv's weight and bias, where no
  gradient is needed (extract/modeling/resnet.py, `ConvNorm`);
- cudnn-benchmark: cuDNN's algorithm search on around res5, whose shapes are fixed per chunk
  (extract/modeling/roi_heads.py);
- bf16-roi-pooling: the pooled RoIs cast to bfloat16 once, as they leave the pooler (roi_heads.py);
- batched-rpn: the RPN's selection over a batch's images at once (extract/modeling/rpn.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlbert.utils.errors import UserError


class SpeedPathError(UserError):
    """A speed path that does not exist, or that does not apply to the detector's precision."""


FOLDED_RES5_NORMS = "folded-res5-norms"
CUDNN_BENCHMARK = "cudnn-benchmark"
BF16_ROI_POOLING = "bf16-roi-pooling"
BATCHED_RPN = "batched-rpn"


@dataclass(frozen=True)
class DetectorSpeedPath:
    name: str
    summary: str
    numbers: str  # what it changes in the numbers, against the detector without it
    precisions: tuple[str, ...] | None = None  # the detector precisions it applies to; None: every one

    def applies(self, precision: str) -> bool:
        return self.precisions is None or precision in self.precisions


SPEED_PATHS: dict[str, DetectorSpeedPath] = {path.name: path for path in (
    DetectorSpeedPath(FOLDED_RES5_NORMS, "res5's convs with their frozen norms folded into weight and bias, where "
                      "no gradient is needed: one conv, not a conv and two passes over its output",
                      "res5's features up to float rounding; the trunk and the proposals bit for bit"),
    DetectorSpeedPath(CUDNN_BENCHMARK, "cuDNN's algorithm search on while res5 runs (its shapes are fixed per chunk), "
                      "restored after; nothing on the CPU",
                      "on CUDA cuDNN's choice of algorithm, which may round otherwise from run to run; none on "
                      "the CPU"),
    DetectorSpeedPath(BF16_ROI_POOLING, "the pooled RoIs cast to bfloat16 as they leave the pooler, rather than by "
                      "res5's first convs: half the bytes of the pooled tensor",
                      "none: the same rounding, done once earlier", precisions=("bf16",)),
    DetectorSpeedPath(BATCHED_RPN, "the RPN's top-k, decoding and box tests over a batch's images at once, the host "
                      "waiting once for all of them rather than four times an image; one NMS per image",
                      "none: the same proposals in the same order"),
)}


def speed_paths(names, precision: str) -> tuple[str, ...]:
    """`names` sorted, each once; SpeedPathError in one line where one does not exist or does not apply
    to `precision` (refused rather than ignored: a no-op would hide that nothing changed)."""
    for name in names:
        if name not in SPEED_PATHS:
            raise SpeedPathError(f"speed path {name!r}: expected one of {', '.join(SPEED_PATHS)}")
        path = SPEED_PATHS[name]
        if not path.applies(precision):
            raise SpeedPathError(f"speed path {name} applies under precision {', '.join(path.precisions)} only, "
                                 f"not {precision}")
    return tuple(sorted(set(names)))
