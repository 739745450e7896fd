"""The Triton kernel of box selection's rank-by-rank NMS (extract/selection_kernel.py), run on the
CPU by Triton's interpreter: a batch selects exactly the boxes and confidences of one torchvision
NMS per class, ties, duplicate boxes and the min/max box rules included. On CUDA it is the path
taken (tests/extract/test_extract_cuda.py compares it with the CPU's selection)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

CHECK = """
import json, sys
import torch
import extract.selection as selection
from extract.selection import per_class_nms_selection, select_boxes_batch
from tests.helpers.detection import random_detections

launches = []
kernel = selection.kept_by_rank
selection.kept_by_rank = lambda *args: launches.append(1) or kernel(*args)
detections = [random_detections(7 * i + n, n, 60, 3.0, True) for i, n in enumerate([24, 0, 11])]
boxes, probs = map(list, zip(*detections))
same = []
for thresholds in ((0.2, 0.3, 10, 100), (0.0, 0.5, 3, 5)):
    for (b, p), (keep, conf) in zip(detections, select_boxes_batch(boxes, probs, *thresholds)):
        expected_keep, expected_conf = per_class_nms_selection(b, p, *thresholds)
        same.append(torch.equal(keep, expected_keep) and torch.equal(conf, expected_conf))
print(json.dumps({"launches": len(launches), "same": same}))
"""


def test_the_kernel_selects_as_one_nms_per_class():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["launches"] == 3 and result["same"] == [True] * 6  # its check once, then each selection


def test_a_kernel_that_fails_its_check_is_said_and_left_for_the_torch_version(monkeypatch):
    import torch

    import extract.selection as selection

    def failing(*args):
        raise RuntimeError("PassManager::run failed")
    monkeypatch.setattr(selection, "kept_by_rank", failing)
    monkeypatch.setattr(selection, "_KERNEL_CHECKS", {})
    with pytest.warns(UserWarning, match=r"box selection on cpu: the Triton kernel is not used \(RuntimeError: "
                                         r"PassManager::run failed\); the torch version"):
        assert not selection._kernel_checked(torch.device("cpu"))
    assert not selection._kernel_checked(torch.device("cpu"))  # checked once
