"""Block-wise 4-bit weight quantization in onnxruntime's MatMulNBits layout, and its inverse.

A weight W [K, N] is cut along K into blocks of `block` rows (K zero-padded to a multiple);
column n's block b has one scale s and one zero point z (symmetric: z = 8, implicit):

    q = clip(round(w / s) + z, 0, 15)          w ≈ (q - z) · s
    asymmetric: s = r · (max(w, 0) - min(w, 0)) / 15,  z = round(-r · min(w, 0) / s), with the
                r ∈ [0.6, 1] of least squared error per block (r = 1 is min-max; r < 1 clips
                the block's extremes to resolve its bulk more finely)
    symmetric:  s = max|w| / 7  (q - 8 ∈ [-7, 7])

Layout (MatMulNBits, bits=4): B uint8 [N, n_blocks, block/2], the block's element 2i in the low
nibble of byte i and element 2i+1 in the high nibble; scales [N · n_blocks], column-major by
block (n, b) → n · n_blocks + b; zero points uint8 [N · ceil(n_blocks/2)], block 2j of a column in
the low nibble and block 2j+1 in the high nibble, each column starting on a fresh byte.
Scales take the activation's dtype; rounding uses the stored (rounded) scale, so dequantize()
is exactly what the kernel computes with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockQuant:
    packed: np.ndarray             # uint8 [N, n_blocks, block // 2]
    scales: np.ndarray             # [N * n_blocks], the activation's float dtype
    zero_points: np.ndarray | None  # uint8 [N * ceil(n_blocks / 2)]; None: symmetric (z = 8)
    k: int
    block: int

    @property
    def nbytes(self) -> int:
        zp = 0 if self.zero_points is None else self.zero_points.nbytes
        return self.packed.nbytes + self.scales.nbytes + zp


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """Pairs along the last axis (even length) into bytes: element 2i low, 2i+1 high."""
    values = values.astype(np.uint8)
    return (values[..., 0::2] & 0x0F) | ((values[..., 1::2] & 0x0F) << 4)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_nibbles: the last axis doubles."""
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


# Columns are quantized this many weights at a time: each block is quantized by itself, and a
# column's float64 copy and its temporaries take about 36 bytes a weight, which for a whole
# 2.3 GB embedding table had peaked at 19 GB.
_COLUMN_CHUNK_ELEMENTS = 1 << 22


def quantize(weight: np.ndarray, block: int, symmetric: bool = False,
             scale_dtype=np.float32) -> BlockQuant:
    """Quantize W [K, N] block-wise along K (see the module docstring)."""
    k, n = weight.shape
    columns = max(1, _COLUMN_CHUNK_ELEMENTS // max(1, k))
    if n > columns:  # every block lies within its column: the pieces join along N
        pieces = [_quantize_columns(weight[:, start:start + columns], block, symmetric,
                                    scale_dtype) for start in range(0, n, columns)]
        zeros = None if symmetric else np.concatenate([p.zero_points for p in pieces])
        return BlockQuant(np.concatenate([p.packed for p in pieces]),
                          np.concatenate([p.scales for p in pieces]), zeros, k, block)
    return _quantize_columns(weight, block, symmetric, scale_dtype)


def _quantize_columns(weight: np.ndarray, block: int, symmetric: bool,
                      scale_dtype) -> BlockQuant:
    k, n = weight.shape
    n_blocks = -(-k // block)
    w = np.zeros((n_blocks * block, n), dtype=np.float64)
    w[:k] = weight
    blocks = w.T.reshape(n, n_blocks, block)
    if symmetric:
        scale = stored_scale(np.abs(blocks).max(axis=-1) / 7.0, scale_dtype)
        zero = np.full(scale.shape, 8.0)
    else:
        scale, zero = fit_range(blocks, scale_dtype)
    return pack(levels(blocks, scale, zero), scale, None if symmetric else zero, k, block,
                scale_dtype)


def pack(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, k: int, block: int,
         scale_dtype) -> BlockQuant:
    """The MatMulNBits tensors of levels `q` [N, n_blocks, block] with their per-block `scale`
    and `zero` [N, n_blocks] (None: symmetric)."""
    n, n_blocks = scale.shape
    zero_points = None
    if zero is not None:
        z = zero.astype(np.uint8)
        if n_blocks % 2:
            z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
        zero_points = pack_nibbles(z).reshape(-1)
    return BlockQuant(pack_nibbles(q.astype(np.uint8)), scale.astype(scale_dtype).reshape(-1),
                      zero_points, k, block)


# Ranges tried per block, as fractions of its min-max range: clipping the few extreme weights
# of a block spends its 16 levels on the many in between. The best of these cuts the squared
# error of gpt2_small's weights by 6% (blocks of 32) to 11% (blocks of 128) against min-max.
_SHRINK = np.linspace(1.0, 0.6, 17)
_SEARCH_ELEMENTS = 1 << 16


def stored_scale(scale: np.ndarray, scale_dtype) -> np.ndarray:
    """`scale` as the kernel reads it, back in float64: an all-zero block takes 1, and a
    block whose scale rounds to 0 in `scale_dtype` (float16's smallest step is 6e-8) the
    smallest it holds, which rounds its weights coarsely rather than dividing them by 0."""
    stored = scale.astype(scale_dtype)
    smallest = np.finfo(scale_dtype).smallest_subnormal
    stored = np.where(scale == 0.0, 1.0, np.where(stored == 0, smallest, stored))
    return stored.astype(scale_dtype).astype(np.float64)


def levels(blocks: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """The 4-bit levels of `blocks` [..., block] under per-block `scale` and `zero` [...]."""
    return np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, 15)


def fit_range(blocks: np.ndarray, scale_dtype) -> tuple[np.ndarray, np.ndarray]:
    """Per block, the scale and zero point of the least squared error among the ranges
    _SHRINK cuts from [min(w, 0), max(w, 0)]; min-max itself is the first candidate."""
    low = np.minimum(blocks.min(axis=-1), 0.0)
    high = np.maximum(blocks.max(axis=-1), 0.0)
    scales = [stored_scale((high - low) * ratio / 15.0, scale_dtype) for ratio in _SHRINK]
    zeros = [np.clip(np.round(-low * ratio / scale), 0, 15)
             for ratio, scale in zip(_SHRINK, scales)]
    best = np.zeros(low.shape, dtype=np.intp)
    # The search runs in float32 on slices that stay in cache: it only ranks the candidates,
    # and a weight matrix of a large language model holds tens of millions of weights.
    rows = max(1, _SEARCH_ELEMENTS // max(1, blocks[0].size))
    for start in range(0, blocks.shape[0], rows):
        part = slice(start, start + rows)
        w = blocks[part].astype(np.float32)
        least = None
        for index, (scale, zero) in enumerate(zip(scales, zeros)):
            s = scale[part, :, None].astype(np.float32)
            z = zero[part, :, None].astype(np.float32)
            t = np.divide(w, s)
            np.round(t, out=t)
            t += z
            np.clip(t, 0, 15, out=t)
            t -= z
            t *= s
            t -= w
            error = np.einsum("ijk,ijk->ij", t, t)
            if least is None:
                least = error
                continue
            better = error < least
            least = np.where(better, error, least)
            best[part] = np.where(better, index, best[part])
    pick = best[None]
    return (np.take_along_axis(np.stack(scales), pick, 0)[0],
            np.take_along_axis(np.stack(zeros), pick, 0)[0])


def dequantize(quant: BlockQuant) -> np.ndarray:
    """W [K, N] as MatMulNBits reads it from `quant`, in float64."""
    n, n_blocks, _ = quant.packed.shape
    q = unpack_nibbles(quant.packed).astype(np.float64)            # [N, n_blocks, block]
    if quant.zero_points is None:
        zero = np.full((n, n_blocks), 8.0)
    else:
        zero = unpack_nibbles(quant.zero_points.reshape(n, -1))[:, :n_blocks].astype(np.float64)
    scale = quant.scales.astype(np.float64).reshape(n, n_blocks)
    w = (q - zero[..., None]) * scale[..., None]
    return w.reshape(n, -1)[:, :quant.k].T
