"""Matrix products whose numbers for a row do not depend on how many rows share the call.

MKL and oneDNN pick a matrix product's kernel by its shape, and their kernels round differently:
with MKL 2024.2 on an AMD EPYC, a row of `torch.nn.functional.linear` from 2048 to 1601 features
got three different results alone, among 2–3 rows and among 5 or more; on an Intel Xeon's AVX-512
kernels the class head of `tiny` changed with the batch too. Rows that must not depend on their
neighbours therefore run in calls of exactly ROW_BLOCK rows, so that the kernel never depends on
the batch.
"""

from __future__ import annotations

import torch

# Rows per call: enough for MKL's large-matrix kernels, few enough that an image's padding is cheap
# beside res5 (a BUTD image's 301 RoIs are 320 rows).
ROW_BLOCK = 64


def row_blocks(rows: torch.Tensor) -> list[torch.Tensor]:
    """`rows` (N, ...) as blocks of exactly ROW_BLOCK rows (at least one block), the last padded with
    zeros; the blocks are views into one new tensor, so that equal rows give equal calls, alignment
    included."""
    padded = max(1, -(-len(rows) // ROW_BLOCK)) * ROW_BLOCK
    return list(torch.cat((rows, rows.new_zeros(padded - len(rows), *rows.shape[1:]))).split(ROW_BLOCK))
