"""Bottom-up-attention box selection: which proposals of an image are kept, and in what order."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torchvision.ops import nms


def select_boxes(boxes: torch.Tensor, class_probs: torch.Tensor, score_thresh: float, nms_thresh: float,
                 min_boxes: int, max_boxes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the kept boxes, sorted by confidence (descending), and their confidences.

    A box's confidence is its highest foreground probability among the classes in which it
    survives per-class NMS; boxes at or above `score_thresh` are kept, topped up to `min_boxes`
    by confidence and cut to `max_boxes`. `class_probs` is (N, C + 1) with background last.
    """
    num_boxes, num_fg = class_probs.shape[0], class_probs.shape[1] - 1
    if num_boxes == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device), class_probs.new_zeros(0)
    scores = class_probs[:, :num_fg].float()
    if not torch.isfinite(scores).all():
        raise ValueError("box selection: the box head's class probabilities are not finite (broken weights?)")
    with _one_thread_on_cpu(scores.device):
        max_conf = surviving_confidence(boxes.float(), scores, nms_thresh)

    order = torch.sort(max_conf, descending=True, stable=True).indices
    num_confident = int((max_conf >= score_thresh).sum())
    num_kept = min(max(num_confident, min_boxes), max_boxes, num_boxes)
    keep = order[:num_kept]
    return keep, max_conf[keep]


def surviving_confidence(boxes: torch.Tensor, scores: torch.Tensor, nms_thresh: float) -> torch.Tensor:
    """(N,) each box's highest score (N, C) among the classes whose NMS keeps it; 0 if none does.

    The numbers of one torchvision NMS per class over all boxes, from far less NMS:
    - A class's top box always survives that class's NMS, so a box's confidence is at least its
      score in the classes it alone tops: its floor.
    - A class can raise a box's confidence only where its score beats the box's floor (a
      candidate); classes without candidates need no NMS.
    - Greedy NMS decides a box from the higher-scoring boxes alone, so a class's NMS needs only
      its boxes scoring at least its lowest candidate: a prefix of its score order, which
      torchvision's stable sort orders as in the full run (ties by index).
    """
    top, top_box = scores.max(dim=0)
    alone = (scores == top).sum(dim=0) == 1
    floor = scores.new_zeros(len(scores)).scatter_reduce(0, top_box[alone], top[alone], "amax")
    lowest = torch.where(scores > floor[:, None], scores, torch.inf).min(dim=0).values
    depth = (scores >= lowest).sum(dim=0)  # per class, the length of its prefix
    depth, classes = depth.sort(descending=True, stable=True)
    depth, classes = depth[depth > 0], classes[depth > 0]
    if len(classes) == 0:
        return floor
    # Whichever loop is shorter: one NMS per class that needs one (few classes), or all those
    # classes' NMS at once, one step per rank (the 1600 classes of Visual Genome).
    if len(classes) <= int(depth[0]):
        boxes_kept, scores_kept = _nms_per_class(boxes, scores.index_select(1, classes), lowest[classes], nms_thresh)
    else:
        boxes_kept, scores_kept = _nms_by_rank(boxes, scores.index_select(1, classes), depth, nms_thresh)
    return floor.scatter_reduce(0, boxes_kept, scores_kept, "amax")


def _nms_per_class(boxes: torch.Tensor, scores: torch.Tensor, lowest: torch.Tensor,
                   nms_thresh: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(box, score) of every survivor of each class's NMS over its boxes scoring >= `lowest`."""
    boxes_kept, scores_kept = [], []
    for column, low in zip(scores.t(), lowest.tolist()):
        members = (column >= low).nonzero().squeeze(1)
        kept = members[nms(boxes.index_select(0, members), column[members], nms_thresh)]
        boxes_kept.append(kept)
        scores_kept.append(column[kept])
    return torch.cat(boxes_kept), torch.cat(scores_kept)


def _nms_by_rank(boxes: torch.Tensor, scores: torch.Tensor, depth: torch.Tensor,
                 nms_thresh: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(box, score) of every survivor within each class's first `depth` ranks (classes sorted by
    depth, deepest first): greedy NMS of all classes together, rank by rank, suppression held
    as 64-box bit words."""
    max_depth = int(depth[0])
    # rank → box per class; ties in index order, as torchvision's stable sort orders them.
    order = scores.t().sort(dim=1, descending=True, stable=True).indices[:, :max_depth].t()
    # The first active[r] classes still need rank r decided.
    active = (depth[None, :] > torch.arange(max_depth, device=depth.device)[:, None]).sum(dim=1).tolist()
    suppresses = _packed(_suppresses(boxes, nms_thresh))
    word, bit = order >> 6, order & 63
    suppressed = torch.zeros(scores.shape[1], suppresses.shape[1], dtype=torch.long, device=scores.device)
    kept = torch.zeros(max_depth, scores.shape[1], dtype=torch.bool, device=scores.device)
    # index_select and gather rather than advanced indexing: the latter's row gather runs an OpenMP
    # region per call, which costs milliseconds whenever another process holds a core.
    for rank, count in enumerate(active):
        words = suppressed[:count].gather(1, word[rank, :count, None]).squeeze(1)
        alive = (words >> bit[rank, :count]) & 1 == 0
        kept[rank, :count] = alive
        suppressed[:count] |= torch.where(alive[:, None], suppresses.index_select(0, order[rank, :count]), 0)
    return order[kept], scores.gather(0, order)[kept]


def _packed(bits: torch.Tensor) -> torch.Tensor:
    """(N, M) bool → (N, ceil(M / 64)) int64 words, bit b of word w holding column 64 w + b."""
    words = -(-bits.shape[1] // 64)
    padded = torch.nn.functional.pad(bits, (0, 64 * words - bits.shape[1])).view(len(bits), words, 64)
    weights = torch.ones(64, dtype=torch.long, device=bits.device) << torch.arange(64, device=bits.device)
    return (padded.long() * weights).sum(dim=2)


def _suppresses(boxes: torch.Tensor, nms_thresh: float) -> torch.Tensor:
    """(N, N) bool: box i suppresses box j in NMS (IoU > threshold), computed as torchvision's NMS
    kernels compute it (float32 IoU; the CPU kernel compares it with the threshold in double)."""
    x1, y1, x2, y2 = boxes.unbind(dim=1)
    areas = (x2 - x1) * (y2 - y1)
    width = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)
    height = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)
    inter = width * height
    iou = inter / (areas[:, None] + areas[None, :] - inter)
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
