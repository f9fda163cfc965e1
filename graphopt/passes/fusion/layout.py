"""SimplifyLayout: cancel and merge chains of pure layout ops (Transpose, Squeeze, Unsqueeze,
Reshape of Flatten/Squeeze/Unsqueeze); none of them changes an element, so neither do the rewrites.

    Transpose(Transpose(x, p1), p2) = Transpose(x, q),  q[j] = p1[p2[j]]   (x if q = identity)
        y = T(x, p1) has y.dim[i] = x.dim[p1[i]]; z = T(y, p2) has z.dim[j] = y.dim[p2[j]]

        x ──Transpose p1──▶ y ──Transpose p2──▶ z     ⇒     x ──Transpose p1∘p2──▶ z

    Unsqueeze(Squeeze(x, A), A) = x    when every dim of x in A is 1 (x's shape is known)
    Squeeze(Unsqueeze(x, A), A) = x    (A normalized against the same rank on both sides)
    Unsqueeze(Unsqueeze(x, A), B) = Unsqueeze(x, C)    e.g. A = [1], B = [2]: C = [1, 2]
    Squeeze(Squeeze(x, A), B) = Squeeze(x, C)          e.g. A = [0], B = [1]: C = [0, 2]

        x[2,1,5] ──Squeeze [1]──▶ [2,5] ──Unsqueeze [1]──▶ [2,1,5]    ⇒    x

    Reshape(F(x), s) = Reshape(x, s)   F ∈ {Flatten, Squeeze, Unsqueeze}: F keeps the element order
        and count, so only s matters, unless s has a 0 (copy that dim of F(x)) without allowzero.
    (Reshape(Reshape(x)), identity Transposes and same-shape Reshapes are EliminateNoOps' job.)

Longer chains of Reshapes and Transposes that only split and merge axes (ReshapeChain,
TransposeChain) are shortened in layout_chain. Attention over merged heads ([batch·heads, seq,
dim], torch.bmm's form) is unmerged before, by UnmergeHeads (batched_heads).

Axes come from the `axes` attribute before opset 13 and from a constant input from opset 13 on.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Node, Value
from graphopt.ir.pattern import Attr, Optional, Var
from graphopt.passes.base import register
from graphopt.passes.edit import can_take_over
from graphopt.passes.fusion.layout_chain import ReshapeChain, TransposeChain
from graphopt.passes.rules import Rule, RulePass


def cannot_stand_in(x: Value, root: Node) -> str | None:
    """Why x cannot replace the root's output (None when it can): a graph output keeps its name,
    so x must be able to take it over."""
    out = root.output
    if out.is_graph_output and not can_take_over(x, out):
        return f"%{out.name} is a graph output and %{x.name} cannot take over its name"
    return None


def _axes(value: Value | None, attr) -> list[int] | None:
    """The axes from the attribute (opset < 13) or the constant input (opset ≥ 13)."""
    if attr is not None:
        return [int(a) for a in attr]
    data = value.constant() if value is not None else None
    return None if data is None else [int(a) for a in data.reshape(-1)]


def _normalized(axes: list[int], rank: int | None) -> set[int] | None:
    if rank is None:
        return set(axes) if all(a >= 0 for a in axes) else None
    return {a % rank for a in axes} if all(-rank <= a < rank for a in axes) else None


class TransposeOfTranspose(Rule):
    """Transpose(Transpose(x, p1), p2) → Transpose(x, p1∘p2), or x when that is the identity."""

    def pattern(self, op, x):
        return op.Transpose(op.Transpose(x, perm=Attr("p1")), perm=Attr("p2"), _name="root")

    def check(self, x, p1, p2):
        if p1 is None and p2 is None and x.shape is None:
            return "Transposes without perm reverse the axes, and the rank of x is unknown"
        if p1 is not None and p2 is not None and len(p1) != len(p2):
            return f"perms {list(p1)} and {list(p2)} have different ranks"
        return None

    def rewrite(self, op, x, p1, p2, root):
        rank = len(p1 if p1 is not None else p2 if p2 is not None else x.shape)
        p1 = list(p1) if p1 is not None else list(range(rank))[::-1]
        p2 = list(p2) if p2 is not None else list(range(rank))[::-1]
        perm = [p1[j] for j in p2]
        if perm == list(range(rank)) and cannot_stand_in(x, root) is None:
            return x
        return op.Transpose(x, perm=perm)


class UnsqueezeOfSqueeze(Rule):
    """Unsqueeze(Squeeze(x, A), A) → x when x's dims at A are known to be 1."""

    def pattern(self, op, x, sq_axes, unsq_axes):
        squeezed = op.Squeeze(x, Optional(sq_axes), axes=Attr("sq_attr"))
        return op.Unsqueeze(squeezed, Optional(unsq_axes), axes=Attr("unsq_attr"), _name="root")

    def check(self, x, root, sq_attr, unsq_attr, sq_axes=None, unsq_axes=None):
        if x.shape is None:
            return "the rank of x is unknown"
        rank = len(x.shape)
        if sq_axes is None and sq_attr is None:
            if not all(isinstance(d, int) for d in x.shape):
                return "Squeeze has no axes (drops every 1-dim) and x's shape is not static"
            squeezed = {i for i, d in enumerate(x.shape) if d == 1}
        else:
            given = _axes(sq_axes, sq_attr)
            squeezed = None if given is None else _normalized(given, rank)
        given = _axes(unsq_axes, unsq_attr)
        restored = None if given is None else _normalized(given, rank)
        if squeezed is None or restored is None:
            return "the axes are not constant (or out of range)"
        if squeezed != restored:
            return f"Unsqueeze axes {sorted(restored)} are not the squeezed axes {sorted(squeezed)}"
        for a in sorted(squeezed):
            if x.shape[a] != 1:
                return f"dim {a} of x is {x.shape[a]}, not known to be 1"
        return cannot_stand_in(x, root)

    def rewrite(self, op, x):
        return x


class SqueezeOfUnsqueeze(Rule):
    """Squeeze(Unsqueeze(x, A), A) → x."""

    def pattern(self, op, x, unsq_axes, sq_axes):
        inserted = op.Unsqueeze(x, Optional(unsq_axes), axes=Attr("unsq_attr"))
        return op.Squeeze(inserted, Optional(sq_axes), axes=Attr("sq_attr"), _name="root")

    def check(self, x, root, sq_attr, unsq_attr, sq_axes=None, unsq_axes=None):
        if sq_axes is None and sq_attr is None:
            return "Squeeze has no axes: it would also drop x's own 1-dims"
        inserted, dropped = _axes(unsq_axes, unsq_attr), _axes(sq_axes, sq_attr)
        if inserted is None or dropped is None:
            return "the axes are not constant"
        rank = None if x.shape is None else len(x.shape) + len(inserted)
        inserted, dropped = _normalized(inserted, rank), _normalized(dropped, rank)
        if inserted is None or dropped is None:
            return "negative axes, and the rank of x is unknown"
        if inserted != dropped:
            return f"Squeeze axes {sorted(dropped)} are not the inserted axes {sorted(inserted)}"
        return cannot_stand_in(x, root)

    def rewrite(self, op, x):
        return x


class _TwoInOne(Rule):
    """Op(Op(x, A), B) → Op(x, C) for `op_type` (Squeeze or Unsqueeze), C as `merged` works it
    out from A and B; `unknown` says why it cannot. Each rule takes `both` as its pattern (a
    base with a pattern of its own would register as a rule)."""

    op_type: str
    unknown: str

    def both(self, op, x, inner_axes, outer_axes):
        make = getattr(op, self.op_type)
        inner = make(x, Optional(inner_axes), axes=Attr("inner_attr"))
        return make(inner, Optional(outer_axes), axes=Attr("outer_attr"), _name="root")

    def merged(self, x: Value, inner: list[int] | None,
               outer: list[int] | None) -> list[int] | None:
        raise NotImplementedError

    def check(self, x, inner_attr, outer_attr, inner_axes=None, outer_axes=None):
        axes = self.merged(x, _axes(inner_axes, inner_attr), _axes(outer_axes, outer_attr))
        return None if axes is not None else self.unknown

    def rewrite(self, op, x, inner_attr, outer_attr, inner_axes=None, outer_axes=None):
        axes = self.merged(x, _axes(inner_axes, inner_attr), _axes(outer_axes, outer_attr))
        make = getattr(op, self.op_type)
        if (op.model.opset("") or 1) >= 13:
            return make(x, op.const(np.array(axes, np.int64)))
        return make(x, axes=axes)


class UnsqueezeOfUnsqueeze(_TwoInOne):
    """Unsqueeze(Unsqueeze(x, A), B) → Unsqueeze(x, C): B's axes, and A's placed among the
    axes B leaves (A counts in the middle rank, B in the final one)."""

    op_type = "Unsqueeze"
    pattern = _TwoInOne.both
    unknown = "the axes are not constant, repeat, are empty, or are negative with x's rank " \
              "unknown"

    def merged(self, x, inner, outer):
        return _merged_unsqueeze(x, inner, outer)


class SqueezeOfSqueeze(_TwoInOne):
    """Squeeze(Squeeze(x, A), B) → Squeeze(x, C): A, and B's axes (counted in the middle
    rank) taken back to the axes of x they were."""

    op_type = "Squeeze"
    pattern = _TwoInOne.both
    unknown = "the axes are not constant, repeat, are empty (every 1-dim), or are negative " \
              "with x's rank unknown"

    def merged(self, x, inner, outer):
        return _merged_squeeze(x, inner, outer)


def _merged_squeeze(x: Value, inner: list[int] | None,
                    outer: list[int] | None) -> list[int] | None:
    """The axes of x one Squeeze doing both drops, sorted, or None when they cannot be known."""
    if not inner or not outer:  # unknown, or every 1-dim (which depends on the shapes)
        return None
    rank = None if x.shape is None else len(x.shape)
    first = _normalized(inner, rank)
    second = _normalized(outer, None if rank is None else rank - len(inner))
    if not first or not second or len(first) != len(inner) or len(second) != len(outer):
        return None
    # The middle's axis j is the j-th axis of x that the first Squeeze kept.
    kept = (axis for axis in range(max(first) + max(second) + 2) if axis not in first)
    middle = dict(zip(range(max(second) + 1), kept))
    return sorted(first | {middle[j] for j in second})


def _merged_unsqueeze(x: Value, inner: list[int] | None,
                      outer: list[int] | None) -> list[int] | None:
    """The axes of one Unsqueeze doing both, sorted, or None when they cannot be known."""
    if inner is None or outer is None:
        return None
    rank = None if x.shape is None else len(x.shape)
    middle = _normalized(inner, None if rank is None else rank + len(inner))
    final = _normalized(outer, None if rank is None else rank + len(inner) + len(outer))
    if not middle or not final or len(middle) != len(inner) or len(final) != len(outer):
        return None  # unknown, repeated, or none at all (a no-op: EliminateNoOps' job)
    # The middle's axes land, in order, on the final positions B does not take.
    free = (position for position in range(len(middle) + len(final) + max(middle | final) + 1)
            if position not in final)
    placed = dict(zip(range(max(middle) + 1), free))
    return sorted(final | {placed[a] for a in middle})


def _reshape_of(op, inner: str, x, shape):
    source = getattr(op, inner)(x, Optional(Var("inner_axes")))
    return op.Reshape(source, shape, allowzero=Attr("allowzero", 0))


class _ReshapeOfElementOrderKeeper(Rule):
    def check(self, shape, allowzero):
        data = shape.constant()
        if data is None:
            return "the target shape is not a constant"
        if not allowzero and (data == 0).any():
            return "the target shape copies a dim (0) of the input, which the inner op changes"
        return None

    def rewrite(self, op, x, shape, allowzero):
        return op.Reshape(x, shape, **({"allowzero": 1} if allowzero else {}))


class ReshapeOfFlatten(_ReshapeOfElementOrderKeeper):
    """Reshape(Flatten(x), s) → Reshape(x, s)."""

    def pattern(self, op, x, shape):
        return _reshape_of(op, "Flatten", x, shape)


class ReshapeOfSqueeze(_ReshapeOfElementOrderKeeper):
    """Reshape(Squeeze(x), s) → Reshape(x, s)."""

    def pattern(self, op, x, shape):
        return _reshape_of(op, "Squeeze", x, shape)


class ReshapeOfUnsqueeze(_ReshapeOfElementOrderKeeper):
    """Reshape(Unsqueeze(x), s) → Reshape(x, s)."""

    def pattern(self, op, x, shape):
        return _reshape_of(op, "Unsqueeze", x, shape)


@register
class SimplifyLayout(RulePass):
    name = "SimplifyLayout"
    description = "compose Transpose chains, cancel Squeeze/Unsqueeze pairs, merge Unsqueezes " \
                  "and Squeezes, skip layout ops feeding a Reshape, shorten Reshape/Transpose " \
                  "chains that split and merge axes"
    rules = (TransposeOfTranspose, UnsqueezeOfSqueeze, SqueezeOfUnsqueeze, UnsqueezeOfUnsqueeze,
             SqueezeOfSqueeze, ReshapeOfFlatten, ReshapeOfSqueeze, ReshapeOfUnsqueeze, ReshapeChain, TransposeChain)


__all__ = ["SimplifyLayout"]
