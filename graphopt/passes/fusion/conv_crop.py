"""ConvCropPads: a Slice that crops a Conv's output within the Conv's own padding becomes less
padding (FuseConvBatchNorm).

    Slice(Conv(x, pads = [b, e]), start s, end L - t)  →  Conv(x, pads = [b - s, e - t])

A temporal convolutional network pads each causal Conv1d on both sides and chomps the right
side off again (`conv(x)[..., :-p]`): one copy of every activation, and a Slice between the
conv and its activation that keeps them apart. At stride 1 an output column j reads the input
window starting at j - b, so dropping s leading outputs is padding s columns less in front,
and dropping t trailing ones t columns less behind. A 4-block TCN (Conv1d, chomp, ReLU) ran
0.75x the export's time with the crops folded, where the .om had run 1.00x.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir.pattern import Optional, Var
from graphopt.passes.rules import Rule

_OPEN_END = 2 ** 31 - 1  # ends at or past this run to the end, as exporters write "x[s:]"


class ConvCropPads(Rule):
    """Conv → Slice of spatial axes within its pads → Conv padded less."""

    def pattern(self, op, w, starts, ends):
        conv = op.Conv(Var("x"), w, Optional(Var("b")), _name="node")
        return op.Slice(conv, starts, ends, Optional(Var("axes")), Optional(Var("steps")))

    def check(self, node, starts, ends, axes=None, steps=None, **_):
        pads = _cropped(node, starts, ends, axes, steps)
        return pads if isinstance(pads, str) else None

    def rewrite(self, op, node, x, w, starts, ends, b=None, axes=None, steps=None, **_):
        pads = _cropped(node, starts, ends, axes, steps)
        return op.Conv(x, w, *([b] if b is not None else []), **{**node.attrs, "pads": pads})


def _cropped(node, starts, ends, axes=None, steps=None) -> list[int] | str:
    """The Conv's pads less what the Slice crops, or why the crop does not fold."""
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return "the Conv pads by auto_pad"
    if any(v is not None and v.constant() is None for v in (starts, ends, axes, steps)):
        return "the Slice's bounds are not constants"
    out, w = node.outputs[0], node.input(1)
    if out.shape is None or w.shape is None or not all(isinstance(d, int) for d in w.shape[2:]):
        return "the Conv's rank or kernel is unknown"
    rank, spatial = len(out.shape), len(out.shape) - 2
    pads = [int(p) for p in node.attr("pads") or [0] * (2 * spatial)]
    strides = [int(s) for s in node.attr("strides") or [1] * spatial]
    dilations = [int(d) for d in node.attr("dilations") or [1] * spatial]
    begins = [int(v) for v in np.ravel(starts.constant())]
    finals = [int(v) for v in np.ravel(ends.constant())]
    cut = [int(v) for v in np.ravel(axes.constant())] if axes is not None \
        else list(range(len(begins)))
    step = [int(v) for v in np.ravel(steps.constant())] if steps is not None else [1] * len(begins)
    if not len(begins) == len(finals) == len(cut) == len(step) \
            or len({a % rank for a in cut}) != len(cut):
        return "the Slice's bounds do not name each axis once"
    for axis, begin, final, stride in zip(cut, begins, finals, step):
        axis %= rank
        if axis < 2 or stride != 1:
            return "the Slice cuts the batch or the channels, or steps"
        k = axis - 2
        if strides[k] != 1:
            return "the Conv strides along a cropped axis"
        length = out.shape[axis] if isinstance(out.shape[axis], int) else None
        if begin < 0:
            return "the Slice starts from the end"
        if final < 0:
            tail = -final
        elif final >= _OPEN_END or length is not None and final >= length:
            tail = 0
        elif length is not None:
            tail = length - final
        else:
            return "the Conv's output length along the cropped axis is unknown"
        if begin > pads[k] or tail > pads[k + spatial]:
            return "the Slice crops past the Conv's padding"
        pads[k] -= begin
        pads[k + spatial] -= tail
        # An input too short for the padding left would make the Conv fail where the Slice
        # returns an empty tensor: fold only where the output stays non-empty, at a static
        # length, or keeps the input's length at least (a causal TCN's) at an open one.
        span = dilations[k] * (w.shape[2 + k] - 1)
        if length is not None and length - begin - tail < 1 \
                or length is None and pads[k] + pads[k + spatial] < span:
            return "the Conv padded less could fail where the Slice returns nothing"
    return pads
