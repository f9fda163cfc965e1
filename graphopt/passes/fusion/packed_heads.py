r"""FuseAttention's packed projection: Q, K and V cut from one x·W + b whose columns hold them side
by side, as timm's ViT (and BEiT, DeiT, DINOv2, CLIP's vision tower) computes them with one
`qkv` Linear, into one com.microsoft::Attention.

The export splits heads out of the packed projection y [B, N, K·C] (K = 3 pieces, C = H·D):

    y ─ Reshape [B, N, K, H, D] ─ Transpose (2, 0, 3, 1, 4) ─ piece i on axis 0 ─ [B, H, N, D]
      (Gather i; Slice i:i+1 then Squeeze; or Split's output i then Squeeze)

and ScaledDotProductAttention merges the heads again for MultiHeadAttention: Transpose
(0, 2, 1, 3), Reshape [B, N, C]. Together that is y's columns i·C … (i+1)·C, in order:

    PackedHeadSlice:             Reshape(Transpose(piece i of …)) → Slice(y, i·C : (i+1)·C, axis 2)
    PackedProjectionAttention:   MultiHeadAttention(Slice(y), Slice(y), Slice(y) [, bias]),
                                 y = x·W (+ b), W and b constants, read by those Slices alone
                                 (the rule machinery refuses a match whose inner values are
                                 read outside it) → Attention(x, W's Q, K and V columns, b's)

nn.MultiheadAttention projects sequence-first and swaps each piece back to batch-first (a
Transpose (1, 0, 2), or at batch 1 a Reshape): a Slice of the last axis commutes with that
swap, so Attention reads x batch-first (the input before its own swap, or x swapped once).
"""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import DType, Node, Value
from graphopt.ir.pattern import Match, Miss
from graphopt.passes.fusion.slicing import slice_1d
from graphopt.passes.rules import HandMatchedRule
from graphopt.passes.symbolic_dims import as_entry, dim, reshaped, value_dims

MS = "com.microsoft"
SPLIT_HEADS = [2, 0, 3, 1, 4]   # [B, N, K, H, D] → [K, B, H, N, D]
MERGE_HEADS = [0, 2, 1, 3]      # [B, H, N, D] → [B, N, H, D]


def _constant_ints(value: Value | None) -> list[int] | None:
    if value is None or not value.is_constant or value.constant() is None:
        return None
    return [int(v) for v in np.asarray(value.constant()).reshape(-1)]


def reshaped_dims(node: Node, source: list | None = None) -> list | None:
    """The output dims of a Reshape as shape entries (ints, names): the value's inferred shape
    when known, else what its target makes of the input's dims (symbolic_dims.reshaped), or of
    `source` when given (an input the fusions left untyped); None when they are not all known."""
    out = node.outputs[0]
    if out.shape is not None and None not in out.shape:
        return list(out.shape)
    dims = [dim(d) for d in source] if source is not None else value_dims(node.inputs[0])
    found = reshaped(node, None if dims is None or None in dims else dims, value_dims)
    entries = [as_entry(d) if d is not None else None for d in found or [None]]
    return None if None in entries else entries


def _piece(node: Node | None) -> tuple[Value, int, list[Node]] | str:
    """(the tensor cut on axis 0, the index of the piece taken, the nodes doing it that take
    this piece alone) when `node` takes one piece of axis 0 without keeping that axis, else
    why not."""
    if node is None or not node.is_onnx:
        return "not an ONNX op"
    if node.op_type == "Gather":
        index = _constant_ints(node.input(1))
        if node.attr("axis", 0) != 0 or index is None \
                or np.asarray(node.input(1).constant()).ndim != 0:
            return "a Gather of other than one scalar index on axis 0"
        return node.inputs[0], index[0], [node]
    if node.op_type != "Squeeze":
        return f"a {node.op_type}, not the Gather, Slice or Split of one piece"
    axes = _constant_ints(node.input(1)) if node.input(1) is not None else node.attr("axes")
    cut = node.inputs[0].producer
    if list(axes or ()) != [0] or cut is None or not cut.is_onnx:
        return "a Squeeze of other than axis 0 of a Slice or Split"
    if cut.op_type == "Slice":
        got = slice_1d(cut)
        if isinstance(got, str) or got[2] != 0 or got[1] != got[0] + 1:
            return "a Slice of other than one piece of axis 0"
        return cut.inputs[0], got[0], [node, cut]
    if cut.op_type == "Split":
        sizes = _constant_ints(cut.input(1)) if cut.input(1) is not None else cut.attr("split")
        if cut.attr("axis", 0) != 0 or (sizes is not None and set(sizes) != {1}):
            return "a Split of other than single pieces of axis 0"
        index = next(i for i, v in enumerate(cut.outputs) if v is node.inputs[0])
        return cut.inputs[0], index, [node]  # the Split goes once no piece is read
    return f"a Squeeze of a {cut.op_type}"


class PackedHeadSlice(HandMatchedRule):
    """Heads split from a packed projection and merged again → a Slice of its columns."""

    root_op = "Reshape"

    def match(self, node):
        merge = node.inputs[0].producer
        if not node.is_onnx or merge is None or merge.op_type != "Transpose" \
                or list(merge.attr("perm") or ()) != MERGE_HEADS:
            return Miss(node, 0, "the Reshape does not merge heads of a Transpose (0, 2, 1, 3)")
        found = _piece(merge.inputs[0].producer)
        if isinstance(found, str):
            return Miss(node, 1, f"the heads do not come from one piece of a tensor: {found}")
        split, index, taking = found
        heads = split.producer
        if heads is None or heads.op_type != "Transpose" \
                or list(heads.attr("perm") or ()) != SPLIT_HEADS:
            return Miss(node, 2 + len(taking), "the pieces are not cut from a Transpose "
                                               "(2, 0, 3, 1, 4)")
        packed = heads.inputs[0].producer
        if packed is None or packed.op_type != "Reshape" or not packed.is_onnx:
            return Miss(node, 3 + len(taking), "the Transpose does not read a Reshape")
        bindings = {"y": packed.inputs[0], "index": index, "packed": packed, "root": node}
        # The Transpose and Reshape every piece reads go once none is read (EliminateDeadNodes).
        return Match(node, bindings, [node, merge, *taking])

    def check(self, y, index, packed, root):
        width = _piece_width(y, packed)
        if isinstance(width, str):
            return width
        pieces = y.shape[2] // width
        if not -pieces <= index < pieces:
            return f"piece {index} of {pieces}"
        b, n, _, h, d = reshaped_dims(packed)
        merged = reshaped_dims(root, [b, n, h, d])  # the piece [B, H, N, D], transposed
        if merged is None:
            # A product of names (the dynamo exporter's 16*batch, frames folded into the
            # batch) is no shape entry: compared as Dims.
            found = reshaped(root, [dim(v) for v in (b, n, h, d)], value_dims)
            if found is not None and None not in found \
                    and found == [dim(y.shape[0]), dim(y.shape[1]), dim(width)]:
                return None
            return f"the heads merge to dims not known, not [{y.shape[0]}, {y.shape[1]}, {width}]"
        if len(merged) != 3 or merged[:2] != list(y.shape[:2]) or merged[2] != width:
            return f"the heads merge to {merged}, not [{y.shape[0]}, {y.shape[1]}, {width}]"
        return None

    def rewrite(self, op, y, index, packed, root):
        width = _piece_width(y, packed)
        index %= y.shape[2] // width  # qkv[-1] is V
        bounds = (index * width, (index + 1) * width, 2)
        if (op.model.opset("") or 1) < 10:
            return op.Slice(y, starts=[bounds[0]], ends=[bounds[1]], axes=[2])
        return op.Slice(y, *(op.const(np.array([v], dtype=np.int64)) for v in bounds))


def _piece_width(y: Value, packed: Node) -> int | str:
    """C, when `packed` reshapes y [B, N, K·C] to [B, N, K, H, D] with C = H·D; else why not."""
    if y.shape is None or len(y.shape) != 3 or not isinstance(y.shape[2], int):
        return f"%{y.name} is not [B, N, K·C] with its last dim known"
    dims = reshaped_dims(packed)
    if dims is None or len(dims) != 5 or dims[:2] != list(y.shape[:2]) \
            or not all(isinstance(d, int) and d > 0 for d in dims[2:]) \
            or math.prod(dims[2:]) != y.shape[2]:
        return f"the Reshape of %{y.name} makes {dims}, not [B, N, K, H, D] of its columns"
    return dims[3] * dims[4]


class PackedProjectionAttention(HandMatchedRule):
    """MultiHeadAttention over column Slices of one x·W (+ b) → Attention, W's columns packed."""

    root_op = "MultiHeadAttention"
    emits = ((MS, "Attention"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def match(self, node):
        extra = [i for i, v in enumerate(node.inputs) if v is not None and i >= 3]
        if node.domain != MS or any(v is None for v in node.inputs[:3]) or set(extra) - {5}:
            return Miss(node, 0, "not a MultiHeadAttention of Q, K and V (and an attention "
                                 "bias) alone")
        peeled = [_sequence_first(v) for v in node.inputs[:3]]
        if len({swap is not None for _, swap in peeled}) != 1:
            return Miss(node, 1, "Q, K and V are not all in one layout")
        swaps = [swap for _, swap in peeled if swap is not None]
        slices = [v.producer for v, _ in peeled]
        if any(s is None or s.op_type != "Slice" or not s.is_onnx for s in slices):
            return Miss(node, 1, "Q, K and V are not all Slices")
        y = slices[0].inputs[0]
        if any(s.inputs[0] is not y for s in slices):
            return Miss(node, 1, "Q, K and V are Slices of different tensors")
        projection = _projection(y)
        if isinstance(projection, str):
            return Miss(node, 4, projection)
        x, weight, bias, nodes = projection
        swap_x = False
        if swaps:  # nn.MultiheadAttention: x·W + b sequence-first, each piece swapped back
            inner, swap = _sequence_first(x)
            if swap is not None:  # batch-first x, swapped for the projection
                x, nodes = inner, [*nodes, swap]
            else:  # sequence-first x: Attention reads it swapped
                swap_x = True
            nodes = [*swaps, *nodes]
        bindings = {"x": x, "w": weight, "b": bias, "slices": slices, "y": y, "root": node,
                    "attention_bias": node.input(5), "swap_x": swap_x}
        return Match(node, bindings, [node, *dict.fromkeys(slices), *nodes])

    def check(self, x, w, slices, root):
        if x.shape is None or len(x.shape) != 3:
            return f"%{x.name} is not of rank 3"
        columns = [_columns(s, w.shape[1]) for s in slices]
        for s, found in zip(slices, columns):
            if isinstance(found, str):
                return f"Slice '{s.name}': {found}"
        (q0, q1), (k0, k1), _ = columns
        if q1 - q0 != k1 - k0:
            return f"Q is {q1 - q0} columns wide, K {k1 - k0}"
        if root.attr("mask_filter_value") is not None:
            return "a mask filter value, which Attention has not"
        return None

    def rewrite(self, op, x, w, b, slices, root, attention_bias=None, swap_x=False):
        width, dtype = w.shape[1], w.dtype.numpy
        if swap_x:
            x = op.Transpose(x, perm=[1, 0, 2])
        columns = [_columns(s, width) for s in slices]
        # Q, K and V in the weight's own order, all of it (timm's fused qkv): the weight is
        # the packed one already, shared rather than copied (a ViT-H of 2.5 GB had held every
        # layer's qkv weight in memory, 1.3 GB peak against 0.75).
        if [bound for span in columns for bound in span] == \
                [0, *(bound for _, hi in columns[:-1] for bound in (hi, hi)), width]:
            weights = w
        else:
            weights = op.const(np.concatenate([w.constant()[:, lo:hi] for lo, hi in columns],
                                              axis=1).astype(dtype, copy=False))
        biases = np.concatenate([np.zeros(hi - lo, dtype) if b is None
                                 else b.constant().reshape(-1)[lo:hi] for lo, hi in columns])
        widths = [hi - lo for lo, hi in columns]
        heads = root.attr("num_heads")
        scale = root.attr("scale")
        if scale is None:  # MultiHeadAttention's default, 1/√(Q's head size), made explicit
            scale = float(1.0 / np.sqrt(np.float32(widths[0] // heads)))
        sizes = {"qkv_hidden_sizes": widths} if widths[2] != widths[0] else {}
        # Attention's inputs 3 and 4 (mask_index, past) stay empty; 5 is the attention bias.
        extra = [None, None, attention_bias] if attention_bias is not None else []
        return op.Attention(x, weights, op.const(biases.astype(dtype)), *extra, _domain=MS,
                            num_heads=heads, scale=scale,
                            unidirectional=root.attr("unidirectional", 0), **sizes)


def _sequence_first(value: Value) -> tuple[Value, Node | None]:
    """(v, the node) where `value` is v with its two leading axes swapped, by a Transpose
    (1, 0, 2) or by a Reshape that moves a size-1 axis ([S, 1, E] ↔ [1, S, E]); (value, None)
    otherwise. nn.MultiheadAttention projects sequence-first: x [B, S, D] is swapped before
    its packed in-projection and each of Q, K and V swapped back, and a Slice of the last
    axis commutes with the swap."""
    node = value.producer
    if node is None or not node.is_onnx or len(value.uses) != 1 or value.is_graph_output:
        return value, None
    source = node.inputs[0] if node.inputs else None
    if node.op_type == "Transpose" and list(node.attr("perm") or []) == [1, 0, 2]:
        return source, node
    if node.op_type == "Reshape" and source is not None and source.shape is not None \
            and len(source.shape) == 3 and 1 in source.shape[:2] \
            and all(isinstance(d, int) for d in source.shape):
        # A rewrite's new Reshape has no inferred shape yet: its constant target says it.
        target = value.shape or _constant_ints(node.input(1))
        swapped = [source.shape[1], source.shape[0], source.shape[2]]
        if target is not None and list(target) == swapped:
            return source, node
    return value, None


def _projection(y: Value) -> tuple[Value, Value, Value | None, list[Node]] | str:
    """(x, W, b, the nodes) when y = x·W + b or x·W, W a constant matrix and b a constant
    vector of its width; else why not."""
    node, bias, nodes = y.producer, None, []
    if node is not None and node.is_onnx and node.op_type == "Add":
        consts = [v for v in node.inputs if v is not None and v.is_constant]
        rest = [v for v in node.inputs if v is not None and not v.is_constant]
        if len(consts) != 1 or len(rest) != 1:
            return "the sliced tensor is an Add of other than a product and a constant"
        bias, nodes, node = consts[0], [node], rest[0].producer
    if node is None or not node.is_onnx or node.op_type != "MatMul":
        return "the sliced tensor is no projection x·W (+ b)"
    x, w = node.inputs
    if not w.is_constant or w.shape is None or len(w.shape) != 2:
        return "the projection's weight is not a constant matrix"
    if bias is not None and tuple(bias.shape or ()) != (w.shape[1],):
        return f"the projection's bias is not a constant of shape [{w.shape[1]}]"
    return x, w, bias, [*nodes, node]


def _columns(node: Node, width: int) -> tuple[int, int] | str:
    """(start, end) of a Slice of the last axis of a [B, N, width] tensor, step 1."""
    got = slice_1d(node)
    if isinstance(got, str):
        return got
    start, end, axis = got
    if axis not in (2, -1):
        return "not a Slice of the last axis"
    picked = range(width)[start:end]  # clamped as ONNX Slice clamps with step 1
    return (picked.start, picked.stop) if picked else "an empty Slice"


__all__ = ["PackedHeadSlice", "PackedProjectionAttention"]
