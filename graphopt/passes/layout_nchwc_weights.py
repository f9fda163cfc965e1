"""LayoutNchwc's blocked filter layouts, which onnxruntime's com.microsoft.nchwc::Conv reads (what
MLAS's MlasReorderFilter* write); the block size itself is graphopt.nchwc_block's.

With B the block size, O' = ⌈O/B⌉·B and I' = ⌈I/B⌉·B, padding is zeros:

    OIHWBiBo  W[O, I, kh, kw] → [O'/B][I'/B][kh][kw][Bi][Bo]   stored as a [O', I', kh, kw] tensor
              D[ob, ib, y, x, bi, bo] = W[ob·B + bo, ib·B + bi, y, x]
              (blocked input: regular convs, and grouped ones whose groups are block-aligned)
    OIHWBo    W[O, I, kh, kw] → [O'/B][I][kh][kw][Bo]          stored as a [O', I, kh, kw] tensor
              D[ob, i, y, x, bo] = W[ob·B + bo, i, y, x]
              (depthwise convs, and the first conv whose NCHW input has fewer than B channels)

Biases and BatchNorm's per-channel scale and shift are padded with zeros to O'. A padded output
channel therefore computes act(0) (0.5 after Sigmoid): consumers never read it as data, since
every blocked filter has zero input rows there and ReorderOutput drops it.
"""

from __future__ import annotations

import numpy as np


def padded(n: int, block: int) -> int:
    return -(-n // block) * block


def _zero_padded(w: np.ndarray, out: int, inp: int) -> np.ndarray:
    full = np.zeros((out, inp) + w.shape[2:], dtype=w.dtype)
    full[: w.shape[0], : w.shape[1]] = w
    return full


def filter_oihwbibo(w: np.ndarray, block: int) -> np.ndarray:
    """[O, I, kh, kw] → blocked [O', I', kh, kw] (OIHWBiBo byte order)."""
    o, i, kh, kw = w.shape
    full = _zero_padded(w, padded(o, block), padded(i, block))
    blocks = full.reshape(full.shape[0] // block, block, full.shape[1] // block, block, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 4, 5, 3, 1)).reshape(full.shape)


def filter_oihwbo(w: np.ndarray, block: int) -> np.ndarray:
    """[O, I, kh, kw] → blocked [O', I, kh, kw] (OIHWBo byte order)."""
    o, i, kh, kw = w.shape
    full = _zero_padded(w, padded(o, block), i)
    blocks = full.reshape(full.shape[0] // block, block, i, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 3, 4, 1)).reshape(full.shape)


def unblock_oihwbibo(d: np.ndarray, out: int, inp: int, block: int) -> np.ndarray:
    """The inverse of filter_oihwbibo (for tests and dumps)."""
    op, ip, kh, kw = d.shape
    blocks = d.reshape(op // block, ip // block, kh, kw, block, block).transpose(0, 5, 1, 4, 2, 3)
    return blocks.reshape(op, ip, kh, kw)[:out, :inp]


def unblock_oihwbo(d: np.ndarray, out: int, block: int) -> np.ndarray:
    """The inverse of filter_oihwbo (for tests and dumps)."""
    op, i, kh, kw = d.shape
    blocks = d.reshape(op // block, i, kh, kw, block).transpose(0, 4, 1, 2, 3)
    return blocks.reshape(op, i, kh, kw)[:out]


def padded_vector(v: np.ndarray, block: int) -> np.ndarray:
    out = np.zeros(padded(v.shape[0], block), dtype=v.dtype)
    out[: v.shape[0]] = v
    return out


def batchnorm_as_depthwise(scale, shift, mean, var, eps: float, block: int
                           ) -> tuple[np.ndarray, np.ndarray]:
    """BatchNormalization as a 1×1 depthwise conv over the padded channels: W [C', 1, 1, 1],
    b [C'] with W = γ/√(σ²+ε), b = β − μ·W (computed in float64). A 1×1 OIHWBo filter with one
    input channel is plain channel order, so W needs no reordering."""
    # A negative variance gives NaN, as onnxruntime's own; a variance and epsilon of 0 an
    # infinite scale (a channel the original divides by 0), whose mean of 0 then shifts by
    # nothing rather than by 0·∞ = NaN: no warning of numpy's for either.
    with np.errstate(all="ignore"):
        s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        b = shift.astype(np.float64) - np.where(mean == 0, 0.0, mean.astype(np.float64) * s)
    dtype = scale.dtype
    return (padded_vector(s.astype(dtype), block).reshape(-1, 1, 1, 1),
            padded_vector(b.astype(dtype), block))
