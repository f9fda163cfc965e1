"""Dims as products of a constant and named sizes, and shape tensors evaluated into them.

    %s = Shape(%x<f32[seq,batch,64]>)
    %t = Concat(Unsqueeze(Gather(%s, 0)), Unsqueeze(Mul(Gather(%s, 1), 4)), [16])
                                              →   [seq, 4·batch, 16]

A dim is (c, (a, b, …)), the number c · a · b · …, its names sorted. Two dims that print alike
are equal at run time: a name stands for one size wherever the model uses it (as ONNX's shape
inference, and the attention fusion, read the names), and a dim no one named is named after its
value and position, so it equals only itself. Shape tensors built from Shape, Gather, Slice,
Concat, Unsqueeze, Squeeze, Reshape, Mul and exact Div evaluate to lists of such dims, which
lets a pass prove that a Reshape whose target is computed at run time splits or merges axes,
and what a Reshape's -1 is where ONNX's inference names it afresh (`proven_dims`):

    %q<f32[B,S,64]> → Reshape(%q, Concat([B], [-1], [4], [16]))  inferred [B, unk__14, 4, 16]
                                                                 proven   [B, S, 4, 16]
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
        return _named(entry)
    return None if value is None else (1, (f"{_UNNAMED}{value.name}[{axis}]",))


def _named(entry: str) -> Dim:
    """A named dim; a product such as `4*B` or `s0*s1`, as the dynamo exporter names the dims it
    derives, is that product of its numbers and names, so that it meets B where the ops show it
    (a Reshape [-1, 4, 64, 16] of [4*B, 64, 16] is [B, 4, 64, 16])."""
    parts = entry.split("*")
    number = [p.isascii() and p.isdigit() for p in parts]  # "²" is a digit int() refuses
    if len(parts) == 1 or not all(n or p.isidentifier() for n, p in zip(number, parts)):
        return (1, (entry,))
    c, names = 1, []
    for p, n in zip(parts, number):
        if n:
            c *= int(p)
        else:
            names.append(p)
    if not names:  # "2*3" names a size the model leaves free, not the number 6
        return (1, (entry,))
    return (c, tuple(sorted(names)))


def value_dims(value: Value) -> list[Dim] | None:
    """The dims of `value`'s shape, or None when its rank is unknown."""
    if value.shape is None or value.type_proto is not None:
        return None
    return [dim(d, value, i) for i, d in enumerate(value.shape)]


def describe(d: Dim) -> str:
    """A Dim as a reader would write it: 16, seq, 4·seq, or ? for a dim nobody named."""
    c, names = d
    if any(name.startswith(_UNNAMED) for name in names):
        return "?"
    return "·".join(([str(c)] if c != 1 or not names else []) + list(names))


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
    if op == "Identity" or (op == "Cast" and node.attr("to") in (7, 6)):  # INT64, INT32
        return arg(0)  # a Cast to a float or a narrower int could round or wrap a size
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


class Equalities:
    """Classes of dims proven equal (union-find). ONNX's inference names a dim afresh wherever
    its inputs do not tell it the size (a Reshape's -1, a broadcast of two names), so one size
    may carry several names; the ops that computed a value can show that they are one."""

    def __init__(self):
        self._parent: dict[Dim, Dim] = {}

    def find(self, d: Dim) -> Dim:
        while self._parent.get(d, d) != d:
            d = self._parent[d]
        return d

    def join(self, a: Dim, b: Dim) -> None:
        """Record a = b. The root of the class is a number where it has one, else a's root
        unless only b's is a name; two different numbers are not joined (the model cannot
        run where they meet, and nothing is learnt from it)."""
        a, b = self.find(a), self.find(b)
        if a == b or not a[1] and not b[1]:
            return
        if not b[1] or as_entry(a) is None and as_entry(b) is not None:
            a, b = b, a
        self._parent[b] = a

    def same(self, a: Dim, b: Dim) -> bool:
        return self.find(a) == self.find(b)

    def number(self, d: Dim) -> int | None:
        """The size of d's class when it is a number."""
        root = self.find(d)
        return None if root[1] else root[0]

    def entry(self, d: Dim) -> int | str | None:
        """A shape entry for d's class: its number, else a name one of its dims has."""
        root = self.find(d)
        found = as_entry(root)
        if found is not None:
            return found
        names = sorted(as_entry(m) for m in self._parent
                       if as_entry(m) is not None and self.find(m) == root)
        return names[0] if names else None


def proven_dims(value: Value, equal: Equalities, depth: int = 8) -> list[Dim] | None:
    """`value`'s dims as the ops that computed it prove them, None when its rank is unknown;
    each proven dim is joined in `equal` to the one inference found there. A Transpose's dims
    are its input's, permuted; a Reshape's are its target's, evaluated by shape_tensor (a 0
    copies the input's dim unless allowzero, a -1 is the input's element count over the other
    entries where that divides exactly, which is what the Reshape computes: x.view(B, -1, 4,
    16) of x [B, S, 64] is [B, S, 4, 16]); a Concat runs only where its inputs agree off its
    axis, so their dims there are joined. A number inference found stands, as does an inferred
    dim the producers prove nothing about. Dims of a tensor with no elements are not modelled
    (a 0 read from a shape would copy a dim there)."""
    inferred = value_dims(value)
    node = value.producer
    if depth == 0 or node is None or not node.is_onnx or node.input(0) is None:
        return inferred
    if node.op_type == "Transpose":
        x = proven_dims(node.input(0), equal, depth - 1)
        perm = node.attr("perm")
        if x is not None and perm is None:
            perm = list(range(len(x)))[::-1]
        found = [x[p] for p in perm] if x is not None and sorted(perm) == list(range(len(x))) \
            else None
    elif node.op_type == "Reshape":
        found = reshaped(node, proven_dims(node.input(0), equal, depth - 1),
                          lambda v: proven_dims(v, equal, depth - 1))
    elif node.op_type == "Concat":
        found = _concatenated(node, [None if v is None else proven_dims(v, equal, depth - 1)
                                     for v in node.inputs], equal)
    else:
        return inferred
    if found is None or inferred is not None and len(inferred) != len(found):
        return inferred
    if inferred is None:
        return [d if d is not None else dim(None, value, i) for i, d in enumerate(found)]
    for d, p in zip(inferred, found):
        if p is not None:  # the proven dim, which names its source's size, leads
            equal.join(p, d)
    return [d if not d[1] or p is None else p for d, p in zip(inferred, found)]


def _concatenated(node, parts: list, equal: Equalities) -> list[Dim | None] | None:
    """The output dims of Concat `node` over inputs of dims `parts`: off the axis, the first
    input's, joined to the others' (the Concat fails where they differ); on it, their sum
    where all are numbers. None when a rank is unknown or differs."""
    if not parts or any(p is None or len(p) != len(parts[0]) for p in parts):
        return None
    rank = len(parts[0])
    axis = node.attr("axis")
    if axis is None or not -rank <= axis < rank:
        return None
    axis %= rank
    out: list[Dim | None] = []
    for i in range(rank):
        column = [p[i] for p in parts]
        if i == axis:
            out.append((sum(d[0] for d in column), ()) if all(not d[1] for d in column)
                       else None)
            continue
        for d in column[1:]:
            equal.join(column[0], d)
        out.append(column[0])
    return out


def reshaped(node, x: list[Dim] | None, dims_of: Dims) -> list[Dim | None] | None:
    """The output dims of Reshape `node` whose input has dims `x` (None: unknown), each None
    where it is not proven; None when the target cannot be read or would be refused."""
    target = node.input(1)
    got = shape_tensor(target, dims_of) if target is not None else None
    if got is None or got[1]:
        return None
    out: list[Dim | None] = []
    infer = None
    for i, d in enumerate(got[0]):
        if d == (0, ()) and not node.attr("allowzero", 0):
            out.append(x[i] if x is not None and i < len(x) else None)
        elif d == (-1, ()) and infer is None:
            infer = i
            out.append(None)
        elif d[0] < 0:
            return None
        else:
            out.append(d)
    if infer is not None and x is not None and all(d is not None for d in out[:infer]
                                                   + out[infer + 1:]):
        out[infer] = over(product(x), product(d for i, d in enumerate(out) if i != infer))
    return out
