"""The `q8` feature encoding: each row as 8-bit codes of its square roots between the row's extremes.

A row x of D values is companded to y = sign(x)·√|x|, and y is quantised linearly to 0..255
between the row's minimum and maximum (kept as two float32), so a row takes D + 8 bytes instead of
float16's 2·D. Decoding squares back, x = y·|y|, in float32.

Why the square root: RoI features are means of ReLU outputs, heavy-tailed rows with many small
values and a few large ones. Linear 8-bit levels spread over [min, max] lose 1 − cos up to
D / (24·255²) (1.3e-3 at D = 2048) on a row with one large value, and measured 1e-3 on BUTD-like
rows. With square-root levels an error e in y is 2·√x·e in x, so small values get fine steps, and
for any non-negative row the expected loss is at most (1 + √D) / (12·255²): 5.9e-5 at D = 2048,
cosine ≥ 0.9999 with margin (`bench/bench_feature_encoding.py` measures it). A row's zeros stay
exact zeros (its minimum is 0); a zero row decodes exactly, a constant row to float32 precision.

Signed rows take the same path with a range spanning both signs. Rows whose largest values have
both signs lose up to four times as much (measured 1.4e-4 with two outliers of opposite signs):
such features are better kept in float16. A row holding NaN or Inf decodes as all NaN, which
`vlbert cache verify` reports as it reports non-finite float16 values.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

LEVELS = 255


def row_bytes(dim: int) -> int:
    return dim + 2 * np.dtype(np.float32).itemsize


def encode(values: np.ndarray) -> dict[str, np.ndarray]:
    """values (..., D) → codes (..., D) uint8, low and step (...) float32."""
    x = np.asarray(values, dtype=np.float32)
    y = np.sqrt(np.abs(x))
    np.copysign(y, x, out=y)
    low = y.min(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        step = (y.max(axis=-1, keepdims=True) - low) / LEVELS
        unusable = ~np.isfinite(step)  # the row holds NaN or Inf
        y -= low
        y *= np.divide(1, step, out=np.zeros_like(step), where=step > 0)
        np.rint(y, out=y)
        codes = y.astype(np.uint8)
    codes[np.broadcast_to(unusable, codes.shape)] = 0
    low[unusable] = step[unusable] = np.nan
    return {"codes": codes, "low": low[..., 0], "step": step[..., 0]}


def decode(parts: Mapping[str, Any]) -> Any:
    """The float32 values (..., D) of `encode`'s parts: NumPy arrays, or torch tensors, decoded where
    they are (training decodes on its device) by the same float32 operations, one rounding each, so
    any device gives the host's bits. Parts of zeros decode to zeros (padding rows)."""
    codes = parts["codes"]
    y = codes.astype(np.float32) if isinstance(codes, np.ndarray) else codes.float()
    y *= parts["step"][..., None]
    y += parts["low"][..., None]
    y *= abs(y)
    return y
