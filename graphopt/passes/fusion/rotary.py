"""FuseRotaryEmbedding: rotary position embedding as Llama-style exports write it, into one op.

    y = x·cos + rotate_half(x)·sin,  rotate_half(x) = Concat(-x[..., H/2:], x[..., :H/2])
      → com.microsoft::RotaryEmbedding(x, position_ids, cos_cache, sin_cache), interleaved=0

      x ─┬─────────────────────────────────────── Mul cos ─┐
         ├─ Slice H/2: ─ Neg ─┐                             Add ─ y    ⇒   x ─ RotaryEmbedding ─ y
         └─ Slice :H/2 ───────┴─ Concat ─ Mul sin ─────────┘

GPT-J's rotate_every_two pairs neighbours instead, the form interleaved=1 computes:

    y = x·cos + flatten(stack(-x[..., 1::2], x[..., ::2]), -2)·sin
      → RotaryEmbedding(…, interleaved=1), its tables repeat_interleave(freqs, 2)

x is [B, N, S, H] (heads split, what transformers rotates); cos and sin are constants of shape
[1 or B, 1, S, H] whose two halves are equal, as transformers builds them (cat(freqs, freqs)),
which a pinned sequence folds to constants. The op reads row p of each cache for position p:
the caches are the first halves of those rows, [S, H/2] with positions from 0 (position_ids an
offset of 0) or, per batch, [B·S, H/2] with positions b·S + s. The op computes x₁·cos − x₂·sin
and x₂·cos + x₁·sin, the same products as the decomposed form.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Attr, Optional, Var
from graphopt.option_names import option
from graphopt.passes.base import register
from graphopt.passes.rules import Rule, RulePass

MS = "com.microsoft"


def _half_slice(node, x: Value) -> tuple[int, int] | None:
    """(start, end) of a step-1 Slice of x's last axis, ends clamped to the axis (INT64_MAX is
    the exporters' "to the end"), or None."""
    taken = _last_axis_slice(node, x)
    return taken[:2] if taken is not None and taken[2] == 1 else None


def _last_axis_slice(node, x: Value) -> tuple[int, int, int] | None:
    """(start, end, step) of a forward Slice of x's last axis, start and end clamped to the
    axis, or None."""
    inputs = [node.input(i) for i in range(1, 5)]
    if any(v is not None and v.constant() is None for v in inputs[:4]) or inputs[0] is None \
            or inputs[1] is None:
        return None
    starts, ends = inputs[0].constant().ravel(), inputs[1].constant().ravel()
    axes = inputs[2].constant().ravel() if inputs[2] is not None else np.array([0])
    steps = inputs[3].constant().ravel() if inputs[3] is not None else np.array([1])
    rank, h = len(x.shape), x.shape[-1]
    if starts.size != 1 or ends.size != 1 or axes.size != 1 or steps.size != 1 \
            or int(axes[0]) % rank != rank - 1 or int(steps[0]) < 1:
        return None
    start, end = (int(np.clip(v if v >= 0 else v + h, 0, h)) for v in (starts[0], ends[0]))
    return start, end, int(steps[0])


def _table(value: Value, x: Value, interleaved: bool = False) -> np.ndarray | str:
    """The cos or sin constant as [1 or B, S, H] rows, or why it is not one: its halves
    (interleaved: its even and odd entries) must be equal."""
    data = value.constant()
    if data is None:
        read = _input_data_read(value)
        if read is not None:  # position_ids: no pin folds it
            where = "an input of the model" if read == value.name else \
                f"computed from input '{read}' at run time"
            return f"%{value.name} is {where} (the fused op takes constant tables here)"
        return f"%{value.name} is not a constant (pin the sequence with " \
               f"{option('input_shapes')})"
    b, n, s, h = x.shape
    shape = (1,) * (4 - data.ndim) + data.shape
    if data.ndim > 4 or shape[1] != 1 or shape[2:] != (s, h) or shape[0] not in (1, b):
        return f"%{value.name} of shape {list(data.shape)} is not [1 or {b}, 1, {s}, {h}]"
    rows = data.reshape(shape[0], s, h)
    if interleaved and not _same_halves(rows[..., 0::2], rows[..., 1::2]):
        return f"the even and odd entries of %{value.name} differ (not " \
               "repeat_interleave(freqs, 2))"
    if not interleaved and not _same_halves(rows[..., : h // 2], rows[..., h // 2:]):
        return f"the two halves of %{value.name} differ (not cat(freqs, freqs))"
    return rows


def _input_data_read(value: Value) -> str | None:
    """The graph input whose values (not only its shape, which a pin fixes) `value` is
    computed from, or None."""
    seen, todo = set(), [value]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen or current.is_constant:
            continue
        seen.add(id(current))
        node = current.producer
        if node is None:
            if current.is_input:
                return current.name
            continue
        if node.op_type not in ("Shape", "Size"):
            todo.extend(node.inputs)
    return None


# How far apart, in units in the last place, the halves of a table may be: folded tables are
# onnxruntime's Sin and Cos of cat(freqs, freqs), whose vector body and scalar tail round one
# angle differently (1 ulp, at a head size of 6). The op reads the first half for both.
_HALVES_ULP = 2


def _same_halves(first: np.ndarray, second: np.ndarray) -> bool:
    if first.dtype.kind != "f":
        return bool(np.array_equal(first, second))
    gap = np.spacing(np.maximum(np.abs(first), np.abs(second)))
    return bool(np.all(np.abs(first - second) <= _HALVES_ULP * gap))


class RotateHalf(Rule):
    """x·cos + Concat(-x[..., H/2:], x[..., :H/2])·sin with constant tables."""

    emits = ((MS, "RotaryEmbedding"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, x, cos, sin):
        second, first = (op.Slice(x, *(Optional(Var(f"{half}_{what}"))
                                       for what in ("starts", "ends", "axes", "steps")),
                                  _name=half) for half in ("second", "first"))
        rotated = op.Concat(op.Neg(second), first, axis=Attr("axis"))
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, x, cos, sin, first, second, axis):
        problem = _shape_problem(x)
        if problem:
            return problem
        h = x.shape[-1]
        if axis % 4 != 3:
            return "the halves are not joined along the last axis"
        if _half_slice(first, x) != (0, h // 2) or _half_slice(second, x) != (h // 2, h):
            return f"the Slices do not take x[..., :{h // 2}] and x[..., {h // 2}:]"
        return _tables_problem(x, cos, sin, interleaved=False)

    def rewrite(self, op, x, cos, sin, **_):
        return _rotary(op, x, cos, sin, interleaved=False)


class RotateEveryTwo(Rule):
    """x·cos + Reshape(Concat(Unsqueeze(-x[..., 1::2]), Unsqueeze(x[..., ::2])))·sin, the
    pairs stacked on a new last axis and flattened back (GPT-J), with constant tables."""

    emits = ((MS, "RotaryEmbedding"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, x, cos, sin, shape):
        odd, even = (op.Slice(x, *(Optional(Var(f"{which}_{what}"))
                                   for what in ("starts", "ends", "axes", "steps")),
                              _name=which) for which in ("odd", "even"))
        pairs = op.Concat(
            op.Unsqueeze(op.Neg(odd), Optional(Var("odd_new_axis")), axes=Attr("odd_attr"),
                         _name="odd_pair"),
            op.Unsqueeze(even, Optional(Var("even_new_axis")), axes=Attr("even_attr"),
                         _name="even_pair"),
            axis=Attr("axis"))
        return op.Add(op.Mul(x, cos), op.Mul(op.Reshape(pairs, shape, _name="flat"), sin))

    def check(self, x, cos, sin, odd, even, odd_pair, even_pair, flat, axis):
        problem = _shape_problem(x)
        if problem:
            return problem
        h = x.shape[-1]
        if _last_axis_slice(odd, x) != (1, h, 2) or _last_axis_slice(even, x) != (0, h, 2):
            return "the Slices do not take x[..., 1::2] and x[..., ::2]"
        for pair in (odd_pair, even_pair):
            if list(pair.outputs[0].shape or ()) != [*x.shape[:-1], h // 2, 1]:
                return f"%{pair.outputs[0].name} does not add a last axis to x's halves"
        if axis % 5 != 4:
            return "the pairs are not stacked along a new last axis"
        if list(flat.outputs[0].shape or ()) != list(x.shape):
            return f"%{flat.outputs[0].name} does not flatten the pairs back to x's shape"
        return _tables_problem(x, cos, sin, interleaved=True)

    def rewrite(self, op, x, cos, sin, **_):
        return _rotary(op, x, cos, sin, interleaved=True)


def _shape_problem(x: Value) -> str | None:
    if x.shape is None or len(x.shape) != 4 or not all(isinstance(d, int) for d in x.shape):
        return f"%{x.name} is not of a known shape [B, N, S, H]: the cos and sin tables " \
               f"follow the sequence (pin it with {option('input_shapes')})"
    if x.shape[-1] % 2:
        return f"the head size {x.shape[-1]} is odd"
    return None


def _tables_problem(x: Value, cos: Value, sin: Value, interleaved: bool) -> str | None:
    tables = [_table(table, x, interleaved) for table in (cos, sin)]
    for rows in tables:
        if isinstance(rows, str):
            return rows
    if tables[0].shape[0] != tables[1].shape[0]:
        return "cos and sin are not of one batch"
    return None


def _rotary(op, x: Value, cos: Value, sin: Value, interleaved: bool) -> Value:
    """RotaryEmbedding of x with the caches of constant tables cos and sin: their first halves,
    or their even entries when `interleaved`, one row per position (per batch, where the
    tables differ by batch)."""
    b, n, s, h = x.shape
    cos_rows, sin_rows = _table(cos, x, interleaved), _table(sin, x, interleaved)
    batches = cos_rows.shape[0]
    half = slice(0, None, 2) if interleaved else slice(0, h // 2)
    caches = [op.const(np.ascontiguousarray(rows.reshape(batches * s, h)[:, half]),
                       f"{x.name}_{what}_cache")
              for rows, what in ((cos_rows, "cos"), (sin_rows, "sin"))]
    # An offset of 0 reads rows 0 … S-1 for every batch; per-batch tables need ids.
    ids = np.array([0]) if batches == 1 else np.arange(b * s).reshape(b, s)
    out = op.RotaryEmbedding(x, op.const(ids.astype(np.int64), f"{x.name}_position_ids"),
                             *caches, _domain=MS, interleaved=int(interleaved))
    out.dtype, out.shape = x.dtype, x.shape
    return out


@register
class FuseRotaryEmbedding(RulePass):
    name = "FuseRotaryEmbedding"
    description = "rotary position embedding (x·cos + rotate_half(x)·sin, or GPT-J's " \
                  "rotate_every_two) into RotaryEmbedding"
    rules = (RotateHalf, RotateEveryTwo)


__all__ = ["FuseRotaryEmbedding"]
