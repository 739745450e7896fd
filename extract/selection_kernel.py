"""The rank-by-rank NMS of box selection (`extract.selection._nms_by_rank`) as one Triton kernel.

The torch version launches about nine small kernels per rank from the host (up to 300 ranks a
batch): on a GPU the host's launches, not the device, bound it. Here one program per column (an
(image, class) pair) walks its ranks in order with its suppression bits in registers, and the
whole selection is one launch. Same decisions, bit for bit: a box is kept when no kept box before
it suppresses it, from the same packed suppression words. Used on CUDA where Triton is installed;
`TRITON_INTERPRET=1` runs it on the CPU (tests/extract/test_selection_kernel.py).
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch version serves
    triton = None

# Words of suppression bits a program holds: 64 per word, so 4096 proposals an image. A larger
# selection takes the torch version.
MAX_WORDS = 64


def kernel_serves(device: torch.device, words: int) -> bool:
    """Whether the kernel runs the selection's NMS on `device` for `words` words of bits per box."""
    if triton is None or words > MAX_WORDS:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def kept_by_rank(order: torch.Tensor, depth: torch.Tensor, images: torch.Tensor,
                 suppresses: torch.Tensor) -> torch.Tensor:
    """(K, R) bool: whether column k's greedy NMS keeps its rank-r box, for ranks below `depth[k]`
    (False beyond). `order` (K, R): each column's boxes by rank; `images` (K,): each column's image;
    `suppresses` (B, N, W) int64: bit j of word j // 64 of row i says that box i suppresses box j."""
    count, ranks = order.shape
    kept = torch.zeros(count, ranks, dtype=torch.int8, device=order.device)
    if count == 0 or ranks == 0:
        return kept.bool()
    _, rows, words = suppresses.shape
    _greedy[(count,)](order.contiguous(), depth.contiguous(), images.contiguous(), suppresses.contiguous(), kept,
                      ranks, rows, words, WORDS=triton.next_power_of_2(words), num_warps=1)
    return kept.bool()


if triton is not None:
    # Sizes not specialised on: one compilation for every batch (per power of two of words).
    @triton.jit(do_not_specialize=["ranks", "rows", "words"])
    def _greedy(order, depth, images, suppresses, kept, ranks, rows, words, WORDS: tl.constexpr):
        column = tl.program_id(0).to(tl.int64)
        needed = tl.load(depth + column)
        image = tl.load(images + column)
        lanes = tl.arange(0, WORDS)
        suppressed = tl.zeros([WORDS], dtype=tl.int64)
        for rank in range(0, needed):
            box = tl.load(order + column * ranks + rank)
            word = tl.sum(tl.where(lanes == (box >> 6), suppressed, 0))
            alive = ((word >> (box & 63)) & 1) == 0
            tl.store(kept + column * ranks + rank, alive.to(tl.int8))
            # A suppressed box suppresses nothing: its row is read as zeros.
            row = tl.load(suppresses + (image * rows + box) * words + lanes, mask=(lanes < words) & alive, other=0)
            suppressed = suppressed | row
