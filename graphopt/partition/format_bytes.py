"""Bytes a tensor takes on the NPU in its device format, whose blocks pad what they hold.

    NC1HWC0     [N, C, H, W] as N · ⌈C/C0⌉ · H · W · C0        (a 1-D conv's [N, C, W]: H = 1)
    NDC1HWC0    [N, C, D, H, W] as N · D · ⌈C/C0⌉ · H · W · C0
    FRACTAL_NZ  [..., M, K] as ... · ⌈K/C0⌉ · ⌈M/16⌉ · 16 · C0     (16 × C0 fractals)
    FRACTAL_Z   conv weights [Co, Ci, kh, kw] as ⌈Ci/C0⌉ · kh · kw · ⌈Co/16⌉ · 16 · C0
    FRACTAL_Z_3D the same with kd: ⌈Ci/C0⌉ · kd · kh · kw · ⌈Co/16⌉ · 16 · C0

A grouped conv's weights are stored group-enlarged, as CANN's Conv2D packs them: e groups at a
time (tuner/tiling.group_enlargement) make one block-diagonal weight of e·Ci inputs and
e·Co/g outputs, ⌈g/e⌉ of them: ⌈g/e⌉ · ⌈e·Ci/C0⌉ · kh · kw · ⌈e·Co/g / 16⌉ · 16 · C0. A
depthwise conv's 144 channels are 9 packs of 16, a diagonal in each 16 × 16 fractal.

C0 is a block's 32 bytes: 16 elements of 2 bytes (float16), 32 of 1 byte (int8); 16 for wider
types, as CANN's float32 NC1HWC0 keeps (ATC's default precision runs them in float16 anyway).
The element size is the IR's dtype, as the rest of the memory plan counts it. A ⟨B, 24, 56, 56⟩
activation in NC1HWC0 holds 32 channels a pixel, a third more than its ND bytes, and a
FRACTAL_NZ vector of 768 is sixteen rows: the memory plan of an NPU partition sized its tensors
as ND and had live tensors overlapping on the device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from graphopt.ir.dtypes import DType, nbytes

FRACTAL = 16  # the cube's rows per fractal


def block(dtype: DType) -> int:
    """C0: the elements of one 32-byte block (16 for 2-byte and wider types)."""
    return 32 if dtype.bits == 8 else 16


def format_nbytes(fmt: str, shape: Sequence[int], dtype: DType, group: int = 1) -> int:
    """The bytes of a static tensor stored in device format `fmt` (its ND bytes for ND, an
    unknown format, or a rank the format does not take); `group`: a FRACTAL_Z weight's conv's."""
    plain = nbytes(dtype, math.prod(shape))
    c0, up = block(dtype), lambda n, m: -(-n // m) * m
    rank = len(shape)
    if fmt == "NC1HWC0" and rank in (3, 4):
        n, c, *spatial = shape
        elements = n * up(c, c0) * math.prod(spatial)
    elif fmt == "NDC1HWC0" and rank == 5:
        n, c, d, h, w = shape
        elements = n * d * up(c, c0) * h * w
    elif fmt == "FRACTAL_NZ" and rank >= 2:
        *batch, m, k = shape
        elements = math.prod(batch) * up(m, FRACTAL) * up(k, c0)
    elif fmt in ("FRACTAL_Z", "FRACTAL_Z_3D") and rank >= 3:
        from graphopt.tuner.tiling import group_enlargement

        co, ci, *kernel = shape
        group = group if group > 1 and co % group == 0 else 1
        packed = group_enlargement(group, ci, co // group, "int8" if c0 == 32 else "float16")
        elements = (-(-group // packed) * up(packed * ci, c0) * math.prod(kernel)
                    * up(packed * co // group, FRACTAL))
    else:
        return plain
    return nbytes(dtype, elements)


@dataclass(frozen=True)
class DeviceFormats:
    """What an NPU partition holds in device formats (partition/layouts.py's PartitionLayout),
    for a memory plan of the device: tensors by the format they are stored in, weights by the
    format they are converted to offline, and each TransData's copy (tensor, from, to, the
    readers it is for, by node name or op type as the layout names them)."""

    stored: Mapping[str, str] = field(default_factory=dict)
    weights: Mapping[str, str] = field(default_factory=dict)
    conversions: Sequence[tuple[str, str, str, tuple[str, ...]]] = ()

    @classmethod
    def of(cls, layout) -> "DeviceFormats":
        return cls(dict(layout.formats), dict(layout.weights),
                   tuple((c["tensor"], c["from"], c["to"], tuple(c["readers"]))
                         for c in layout.transdata))
