"""Bottom-up-attention box selection: which proposals of each image are kept, and in what order.

The images of a batch are selected in one pass: their proposals are padded into a batch
dimension and each (image, class) pair is one column of the per-class NMS, so images never
interact and the host waits for the device three times a batch, whatever its number of images.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence
from torchvision.ops import nms

from extract.selection_kernel import kept_by_rank, kernel_serves

# Score of the padding rows: below every probability, so a padding row never tops a class, never
# beats a box's floor and sorts after every real box (whose confidence is at least 0).
PADDING_SCORE = -1.0


def select_boxes(boxes: torch.Tensor, class_probs: torch.Tensor, score_thresh: float, nms_thresh: float,
                 min_boxes: int, max_boxes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's kept box indices, sorted by confidence (descending), and their confidences
    (`select_boxes_batch` for one image)."""
    return select_boxes_batch([boxes], [class_probs], score_thresh, nms_thresh, min_boxes, max_boxes)[0]


def select_boxes_batch(boxes: Sequence[torch.Tensor], class_probs: Sequence[torch.Tensor], score_thresh: float,
                       nms_thresh: float, min_boxes: int, max_boxes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per image, the indices of its kept boxes sorted by confidence (descending), and their confidences.

    A box's confidence is its highest foreground probability among the classes in which it
    survives per-class NMS; boxes at or above `score_thresh` are kept, topped up to `min_boxes`
    by confidence and cut to `max_boxes`. `class_probs[i]` is image i's (N_i, C + 1) probabilities
    with background last, `boxes[i]` its (N_i, 4) boxes. Each image's result is what it gets alone.
    """
    if not boxes:
        return []
    counts = [len(b) for b in boxes]
    num_fg = class_probs[0].shape[1] - 1
    scores = _padded([p[:, :num_fg].float() for p in class_probs], PADDING_SCORE)
    # One pass instead of isfinite's four: a NaN or infinity carries into the sum, and float32 values
    # summed in float64 cannot overflow.
    if not torch.isfinite(scores.sum(dtype=torch.float64)):
        raise ValueError("box selection: the box head's class probabilities are not finite (broken weights?)")
    if max(counts) == 0:
        return [(torch.zeros(0, dtype=torch.long, device=scores.device), scores.new_zeros(0)) for _ in boxes]
    with _one_thread_on_cpu(scores.device):
        max_conf = surviving_confidence(_padded([b.float() for b in boxes], 0.0), scores, nms_thresh)
        confidences, order = max_conf.sort(dim=1, descending=True, stable=True)
        confident = (max_conf >= score_thresh).sum(dim=1).tolist()
    kept = [min(max(c, min_boxes), max_boxes, n) for c, n in zip(confident, counts)]
    return [(order[i, :k], confidences[i, :k]) for i, k in enumerate(kept)]


def _padded(tensors: list[torch.Tensor], value: float) -> torch.Tensor:
    """(B, max N_i, ...) of (N_i, ...) tensors, short ones padded with `value`; one is only viewed so."""
    return tensors[0][None] if len(tensors) == 1 else pad_sequence(tensors, batch_first=True, padding_value=value)


def surviving_confidence(boxes: torch.Tensor, scores: torch.Tensor, nms_thresh: float) -> torch.Tensor:
    """(B, N) each box's highest score (B, N, C) among the classes whose NMS keeps it; 0 if none does.

    Image b's rows are its boxes; rows scoring below every probability pad shorter images. The
    numbers of one torchvision NMS per image and class over all its boxes, from far less NMS:
    - A class's top box always survives that class's NMS, so a box's confidence is at least its
      score in the classes it alone tops: its floor.
    - A class can raise a box's confidence only where its score beats the box's floor (a
      candidate); classes without candidates need no NMS.
    - Greedy NMS decides a box from the higher-scoring boxes alone, so a class's NMS needs only
      its boxes scoring at least its lowest candidate: a prefix of its score order, which
      torchvision's stable sort orders as in the full run (ties by index).
    """
    count, rows, num_classes = scores.shape
    top, top_box = scores.max(dim=1)
    alone = (scores == top[:, None]).sum(dim=1) == 1
    # A class topped by several boxes gives 0, which cannot raise a floor.
    floor = scores.new_zeros(count, rows).scatter_reduce(1, top_box, torch.where(alone, top, 0.0), "amax")
    lowest = torch.where(scores > floor[:, :, None], scores, torch.inf).min(dim=1).values
    depth = (scores >= lowest[:, None]).sum(dim=1).view(-1)  # per (image, class) column, its prefix length
    depth, columns = depth.sort(descending=True, stable=True)
    # active[r]: how many columns still need rank r decided (the first ones, deepest first), counted
    # in the ascending depths without an output sized by the data (bincount's would wait for it).
    ranks = torch.arange(rows, device=depth.device)
    active = (len(depth) - torch.searchsorted(depth.flip(0), ranks, right=True)).tolist()
    active = [a for a in active if a > 0]
    if not active:
        return floor
    columns = columns[: active[0]]
    images = columns // num_classes
    column_scores = scores[images, :, columns % num_classes]  # (K, N)
    # Whichever loop is shorter: one NMS per column (few classes), or all columns' NMS at once, one
    # step per rank (the 1600 classes of Visual Genome). The first waits for the device in every
    # NMS (torchvision's CUDA NMS copies its mask to the host), so CUDA always takes the second.
    if not scores.is_cuda and len(columns) <= len(active):
        lowest = lowest.view(-1)[columns]
        kept_rows, kept_scores = _nms_per_column(boxes, column_scores, images, lowest, nms_thresh)
    else:
        kept_rows, kept_scores = _nms_by_rank(boxes, column_scores, images, active, depth[: active[0]], nms_thresh)
    return floor.view(-1).scatter_reduce(0, kept_rows, kept_scores, "amax").view(count, rows)


def _nms_per_column(boxes: torch.Tensor, column_scores: torch.Tensor, images: torch.Tensor, lowest: torch.Tensor,
                    nms_thresh: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in the flattened (B * N) boxes, score) of every survivor of each column's NMS over its
    image's boxes scoring >= `lowest`."""
    rows = boxes.shape[1]
    kept_rows, kept_scores = [], []
    for column, low, image in zip(column_scores, lowest.tolist(), images.tolist()):
        members = (column >= low).nonzero().squeeze(1)
        kept = members[nms(boxes[image].index_select(0, members), column[members], nms_thresh)]
        kept_rows.append(kept + image * rows)
        kept_scores.append(column[kept])
    return torch.cat(kept_rows), torch.cat(kept_scores)


def _nms_by_rank(boxes: torch.Tensor, column_scores: torch.Tensor, images: torch.Tensor, active: list[int],
                 depth: torch.Tensor, nms_thresh: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in the flattened (B * N) boxes, score or 0) of each column's first `depth` ranks, the
    score where NMS keeps the box: greedy NMS of all columns together, rank by rank, suppression
    held as 64-box bit words. Columns come deepest first; `active[r]` of them need rank r (the
    columns whose `depth` exceeds r). On CUDA one Triton kernel walks the ranks (extract/selection_kernel.py)."""
    rows = boxes.shape[1]
    # rank → box per column; ties in index order, as torchvision's stable sort orders them.
    order = column_scores.sort(dim=1, descending=True, stable=True).indices[:, : len(active)].t()
    flat_rows = order + images * rows
    packed = _packed(_suppresses(boxes, nms_thresh))
    if kernel_serves(boxes.device, packed.shape[-1]) and _kernel_checked(boxes.device):
        kept = kept_by_rank(order.t(), depth, images, packed).t()
    else:
        kept = _kept_rank_by_rank(order, flat_rows, packed.flatten(0, 1), active)
    # Ranks a column does not need, and suppressed boxes, give 0: no confidence is below it.
    scores = torch.where(kept, column_scores.gather(1, order.t()).t(), 0.0)
    return flat_rows.reshape(-1), scores.reshape(-1)


def _kept_rank_by_rank(order: torch.Tensor, flat_rows: torch.Tensor, suppresses: torch.Tensor,
                       active: list[int]) -> torch.Tensor:
    """(R, K) bool: the greedy NMS's decisions, a few tensor ops per rank for all columns at once."""
    word, bit = order >> 6, order & 63
    suppressed = torch.zeros(order.shape[1], suppresses.shape[1], dtype=torch.long, device=order.device)
    kept = torch.zeros(order.shape, dtype=torch.bool, device=order.device)
    # index_select and gather rather than advanced indexing: the latter's row gather runs an OpenMP
    # region per call, which costs milliseconds whenever another process holds a core.
    for rank, count in enumerate(active):
        words = suppressed[:count].gather(1, word[rank, :count, None]).squeeze(1)
        alive = (words >> bit[rank, :count]) & 1 == 0
        kept[rank, :count] = alive
        suppressed[:count] |= torch.where(alive[:, None], suppresses.index_select(0, flat_rows[rank, :count]), 0)
    return kept


_KERNEL_CHECKS: dict[torch.device, bool] = {}
_KERNEL_CHECK_LOCK = threading.Lock()


def _kernel_checked(device: torch.device) -> bool:
    """Whether the Triton kernel decides as `_kept_rank_by_rank` does on `device`, checked once per
    process on a small random selection. Where it cannot be compiled or disagrees, a warning says
    so and the torch version runs."""
    with _KERNEL_CHECK_LOCK:
        if device not in _KERNEL_CHECKS:
            # Two images of 70 boxes (two words of bits), six columns of varied depths.
            gen = torch.Generator().manual_seed(0)
            xy = torch.rand(2, 70, 2, generator=gen) * 200
            boxes = torch.cat((xy, xy + 10 + torch.rand(2, 70, 2, generator=gen) * 90), dim=2).to(device)
            packed = _packed(_suppresses(boxes, 0.3))
            order = torch.rand(6, 70, generator=gen).argsort(dim=1).to(device)
            images = torch.arange(6, device=device) // 3
            depth = torch.tensor([70, 66, 40, 9, 2, 1], device=device)
            active = [int((depth > rank).sum()) for rank in range(70)]
            expected = _kept_rank_by_rank(order.t(), (order + images[:, None] * 70).t(), packed.flatten(0, 1), active)
            try:
                agrees = torch.equal(kept_by_rank(order, depth, images, packed).t(), expected)
                why = "it decides otherwise than the torch version"
            except Exception as exc:  # noqa: BLE001 - any compile or launch failure: said below, torch runs
                agrees, why = False, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
            if not agrees:
                warnings.warn(f"box selection on {device}: the Triton kernel is not used ({why}); the torch version, "
                              "slower on a GPU, runs instead", stacklevel=2)
            _KERNEL_CHECKS[device] = agrees
        return _KERNEL_CHECKS[device]


def _packed(bits: torch.Tensor) -> torch.Tensor:
    """(..., M) bool → (..., ceil(M / 64)) int64 words, bit b of word w holding column 64 w + b."""
    words = -(-bits.shape[-1] // 64)
    padded = torch.nn.functional.pad(bits, (0, 64 * words - bits.shape[-1])).unflatten(-1, (words, 64))
    weights = torch.ones(64, dtype=torch.long, device=bits.device) << torch.arange(64, device=bits.device)
    return (padded.long() * weights).sum(dim=-1)


def _suppresses(boxes: torch.Tensor, nms_thresh: float) -> torch.Tensor:
    """(..., N, N) bool: box i suppresses box j of the same image (..., N, 4) in NMS (IoU > threshold),
    computed as torchvision's NMS kernels compute it (float32 IoU; the CPU kernel compares it with
    the threshold in double). Padding boxes (all zeros) have IoU NaN, which suppresses nothing."""
    x1, y1, x2, y2 = boxes.unbind(dim=-1)
    areas = (x2 - x1) * (y2 - y1)
    width = (torch.minimum(x2[..., :, None], x2[..., None, :])
             - torch.maximum(x1[..., :, None], x1[..., None, :])).clamp(min=0)
    height = (torch.minimum(y2[..., :, None], y2[..., None, :])
              - torch.maximum(y1[..., :, None], y1[..., None, :])).clamp(min=0)
    inter = width * height
    iou = inter / (areas[..., :, None] + areas[..., None, :] - inter)
    if iou.is_cuda:
        return iou > torch.tensor(nms_thresh, dtype=torch.float32)
    return iou.double() > nms_thresh


@contextmanager
def _one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    """Selection is hundreds of small tensor ops: on the CPU each would open a parallel region,
    and one region waits for every thread, so a core busy elsewhere stalls each op for a time
    slice (a 300 x 1600 selection while another process held a core: 0.69 s on 2 threads, 0.18 s
    on 1). The thread count is restored afterwards."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def per_class_nms_selection(boxes: torch.Tensor, class_probs: torch.Tensor, score_thresh: float, nms_thresh: float,
                            min_boxes: int, max_boxes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The straightforward procedure, one torchvision NMS per class over every box: the reference that
    `select_boxes` must equal bitwise (tests) and is timed against (bench/bench_detector.py)."""
    scores = class_probs[:, :-1].float()
    max_conf = scores.new_zeros(len(boxes))
    for c in range(scores.shape[1]):
        kept = nms(boxes, scores[:, c], nms_thresh)
        max_conf[kept] = torch.maximum(max_conf[kept], scores[kept, c])
    order = torch.sort(max_conf, descending=True, stable=True).indices
    count = min(max(int((max_conf >= score_thresh).sum()), min_boxes), max_boxes, len(boxes))
    return order[:count], max_conf[order[:count]]
