"""Dims as products of a constant and named sizes, and shape tensors evaluated into them.

    %s = Shape(%x<f32[seq,batch,64]>)
    %t = Concat(Unsqueeze(Gather(%s, 0)), Unsqueeze(Mul(Gather(%s, 1), 4)), [16])
                                              →   [seq, 4·batch, 16]

A dim is (c, (a, b, …)), the number c · a · b · …, its names sorted. Two dims that print alike
are equal at run time: a name stands for one size wherever the model uses it (as ONNX's shape
inference, and the attention fusion, read the names), and a dim no one named is named after its
value and position, so it equals only itself. Shape tensors built from Shape, Gather, Slice,
Concat, Unsqueeze, Squeeze, Reshape, Mul and exact Div evaluate to lists of such dims, which
lets a pass prove that a Reshape whose target is computed at run time splits or merges axes.
"""

from __future__ import annotations

import math
from typing import Callable

from graphopt.ir import Value
from graphopt.passes.shape_pieces import ints, slice_bounds, slice_indices

Dim = tuple[int, tuple[str, ...]]
ONE: Dim = (1, ())
# Names of dims nobody named start with this, so no name a model writes can equal one.
_UNNAMED = "\0"


def dim(entry, value: Value | None = None, axis: int = 0) -> Dim | None:
    """A shape entry (an int, a name or None) as a Dim; None, the unknown, is named after
    `value` and `axis` when given."""
    if isinstance(entry, int):
        return (entry, ())
    if isinstance(entry, str):
        return (1, (entry,))
    return None if value is None else (1, (f"{_UNNAMED}{value.name}[{axis}]",))


def value_dims(value: Value) -> list[Dim] | None:
    """The dims of `value`'s shape, or None when its rank is unknown."""
    if value.shape is None or value.type_proto is not None:
        return None
    return [dim(d, value, i) for i, d in enumerate(value.shape)]


def as_entry(d: Dim) -> int | str | None:
    """A Dim as a shape entry: an int, a name, or None for a product of names."""
    c, names = d
    if not names:
        return c
    return names[0] if c == 1 and len(names) == 1 and not names[0].startswith(_UNNAMED) \
        else None


def times(a: Dim, b: Dim) -> Dim:
    return (a[0] * b[0], tuple(sorted(a[1] + b[1])))


def product(dims) -> Dim:
    out = ONE
    for d in dims:
        out = times(out, d)
    return out


def over(a: Dim, b: Dim) -> Dim | None:
    """a / b when b divides a exactly (its constant divides a's, its names are among a's)."""
    if b[0] == 0 or a[0] % b[0]:
        return None
    rest = list(a[1])
    for name in b[1]:
        if name not in rest:
            return None
        rest.remove(name)
    return (a[0] // b[0], tuple(rest))


def solved(a: Dim, b: Dim) -> tuple[str, int] | None:
    """(name, size) when a = b, with nonzero factors they share cancelled, leaves one name equal
    to a number: seq·batch·64 = 10·batch·64 gives seq = 10."""
    common = math.gcd(a[0], b[0])
    if common == 0:
        return None
    left, right = list(a[1]), list(b[1])
    for name in list(left):
        if name in right:
            left.remove(name)
            right.remove(name)
    (lc, left), (rc, right) = (a[0] // common, left), (b[0] // common, right)
    if len(left) == 1 and not right and lc == 1:
        return left[0], rc
    if len(right) == 1 and not left and rc == 1:
        return right[0], lc
    return None


def substituted(d: Dim, known: dict[str, int]) -> Dim:
    """d with each name `known` gives a size for replaced by that size."""
    if not known or not any(name in known for name in d[1]):
        return d
    c, names = d[0], []
    for name in d[1]:
        if name in known:
            c *= known[name]
        else:
            names.append(name)
    return (c, tuple(names))


Dims = Callable[[Value], "list[Dim] | None"]


def shape_tensor(value: Value, dims_of: Dims, depth: int = 12) -> tuple[list[Dim], bool] | None:
    """(the entries of the int64 tensor `value`, whether it is a scalar), evaluated as dims, or
    None when it is computed some other way. `dims_of(v)` gives the dims Shape(v) reads."""
    data = ints(value)
    if data is not None:
        return ([(int(v), ()) for v in data.reshape(-1)], data.ndim == 0) if data.ndim <= 1 \
            else None
    node = value.producer
    if depth == 0 or node is None or not node.is_onnx:
        return None

    def arg(i: int):
        x = node.input(i)
        return None if x is None else shape_tensor(x, dims_of, depth - 1)

    op = node.op_type
    if op == "Shape":
        x = node.input(0)
        found = dims_of(x) if x is not None else None
        if found is None:
            return None
        rank = len(found)
        start, end = node.attr("start", 0), node.attr("end", rank)
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        return found[start:end], False
    if op in ("Identity", "Cast"):
        return arg(0)
    if op == "Gather":
        got, index = arg(0), ints(node.input(1))
        if got is None or got[1] or index is None or index.ndim > 1 \
                or node.attr("axis", 0) not in (0, -1):
            return None
        entries = got[0]
        if any(not -len(entries) <= int(i) < len(entries) for i in index.reshape(-1)):
            return None
        return [entries[int(i)] for i in index.reshape(-1)], index.ndim == 0
    if op == "Slice":
        # Its bounds are attributes before opset 10, inputs from 10 on.
        got, bounds = arg(0), slice_bounds(node, 10 if len(node.inputs) > 1 else 1)
        if got is None or got[1] or bounds is None:
            return None
        return [got[0][i] for i in slice_indices(len(got[0]), *bounds)], False
    if op == "Concat":
        if node.attr("axis") not in (0, -1):
            return None
        parts = [arg(i) for i in range(len(node.inputs))]
        if any(p is None or p[1] for p in parts):
            return None
        return [d for p in parts for d in p[0]], False
    if op in ("Unsqueeze", "Squeeze", "Reshape"):
        got = arg(0)
        if got is None or len(got[0]) != 1:
            return None
        if op == "Reshape":
            shape = ints(node.input(1))
            if shape is None or shape.size > 1:
                return None
            return got[0], shape.size == 0
        return got[0], op == "Squeeze"
    if op in ("Mul", "Div"):
        a, b = arg(0), arg(1)
        if a is None or b is None:
            return None
        if len(a[0]) != len(b[0]) and 1 not in (len(a[0]), len(b[0])):
            return None
        n = max(len(a[0]), len(b[0]))
        pairs = [(a[0][i if len(a[0]) > 1 else 0], b[0][i if len(b[0]) > 1 else 0])
                 for i in range(n)]
        if op == "Mul":
            return [times(x, y) for x, y in pairs], a[1] and b[1]
        # Integer Div truncates: exact only where the divisor divides the dividend as a dim.
        quotients = [over(x, y) for x, y in pairs]
        return (None if any(q is None for q in quotients) else (quotients, a[1] and b[1]))
    return None
