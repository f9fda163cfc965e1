"""ReadShapesUpstream: a dim read from a value's Shape is read where that dim comes from.

    %d = Gather(Shape(Transpose(Reshape(%q, [0, -1, 12, 64]), [0, 2, 1, 3])), 2)
                                               →   %d = Gather(Shape(%q), 1)
    %e = Gather(Shape(Add(MatMul(%x, W), b)), 0) →  %e = Gather(Shape(%x), 0)

TorchScript exports read sequence lengths off the split heads or the projections (to build a
mask, or the context's merge). Once attention is fused, those reads are all that keeps the
head split and the separate Q/K/V projections alive, and they stop the projections from being
packed into one GEMM. The dim is followed back through Transposes (which permute dims),
Reshapes whose target proves it a dim of their input (a 0, a dim read from the input's Shape,
or a -1 that can only be it: symbolic_dims), MatMuls by a matrix (all but the last dim),
Slices (the dims they do not cut: nn.MultiheadAttention's pieces of its packed projection),
elementwise ops with a constant that broadcasts along none of the dims read (a bias), those of
two computed inputs through one proven to have the dims read (a residual Add), ops whose output
has their input's shape (LayerNormalization, activations, onnxruntime's BiasGelu; Attention's
batch and sequence) and Gather (to its data or its indices). A BERT export builds each layer's
attention mask from Shape(the layer's input)[1]: read back to the token ids, the sequence is
one dim, and the layers' mask Expands become one (onnxruntime ran twelve). It runs
among the fusions, not with FoldShapes: a Reshape whose target reads its own input's dims must
first become a constant target (ReshapeOwnDims), which a read moved upstream would prevent.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Graph, Model, Node, Value
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.shape_pieces import ints, known_rank
from graphopt.passes.symbolic_dims import Equalities, proven_dims, reshaped

_BROADCAST = ("Add", "Sub", "Mul", "Div")
# Ops whose output has their first input's shape.
_SAME_SHAPE = frozenset({"LayerNormalization", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf",
                         "Gelu", "Softmax", "LogSoftmax", "Cast", "Neg", "Sqrt", "Exp",
                         "Identity", "Dropout", "Clip", "HardSigmoid", "HardSwish", "Softplus",
                         "Elu", "Selu", "Celu", "Mish", "Abs"})
# onnxruntime's ops whose output has their first input's shape (None), or its leading n dims
# (Attention: [batch, sequence] of its input, its own hidden size).
_CONTRIB_SHAPED = {("com.microsoft", "BiasGelu"): None, ("com.microsoft", "FastGelu"): None,
                   ("com.microsoft", "Gelu"): None, ("com.microsoft", "QuickGelu"): None,
                   ("com.microsoft", "SkipLayerNormalization"): None,
                   ("com.microsoft", "Attention"): 2}


def _beside_constant(node: Node) -> tuple[Value | None, Value | None]:
    """(the computed input, the constant one) of a binary op with one constant input of known
    shape, or (None, None)."""
    a, b = node.input(0), node.input(1)
    if a is None or b is None or a.is_constant == b.is_constant:
        return None, None
    computed, constant = (a, b) if b.is_constant else (b, a)
    return (computed, constant) if constant.shape is not None else (None, None)


def _reshaped_from(node: Node, source: Value, indices: list[int],
                   equal: Equalities) -> list[int] | None:
    """The dims of the Reshape's input that its output's dims `indices` are proven to equal."""
    before = proven_dims(source, equal)
    after = reshaped(node, before, lambda v: proven_dims(v, equal))
    if before is None or after is None:
        return None
    found = [next((j for j, d in enumerate(before)
                   if after[i] is not None and equal.same(d, after[i])), None) for i in indices]
    return None if None in found else found


def source_dims(x: Value, indices: list[int]) -> tuple[Value, list[int]]:
    """The value upstream of x, and the indices of its dims, that x's dims `indices` equal."""
    equal = Equalities()
    while (node := x.producer) is not None and node.input(0) is not None \
            and (node.is_onnx or (node.domain, node.op_type) in _CONTRIB_SHAPED):
        rank, source = known_rank(x), node.input(0)
        if rank is None or not all(-rank <= i < rank for i in indices) \
                or x is not node.outputs[0]:  # (a LayerNormalization's Mean: 1s from its axis)
            break
        indices = [i % rank for i in indices]
        if not node.is_onnx:  # a contrib op whose output has its first input's leading dims
            kept = _CONTRIB_SHAPED[(node.domain, node.op_type)]
            moved = indices if known_rank(source) == rank and (
                kept is None or all(i < kept for i in indices)) else None
        elif node.op_type in _SAME_SHAPE:
            moved = indices if known_rank(source) == rank else None
        elif node.op_type == "Gather":
            source, moved = _gathered_from(node, indices, rank)
        elif node.op_type == "Transpose":
            perm = node.attr("perm")
            if perm is None:
                break
            moved = [int(perm[i]) for i in indices]
        elif node.op_type == "Reshape":
            moved = _reshaped_from(node, source, indices, equal)
        elif node.op_type == "Slice":  # the dims it does not slice are its input's
            sliced = _sliced_axes(node, rank)
            moved = indices if sliced is not None and known_rank(source) == rank \
                and not set(sliced) & set(indices) else None
        elif node.op_type == "MatMul":  # by a matrix: x's leading dims and rows are source's
            other = node.input(1)
            moved = indices if other is not None and known_rank(other) == 2 \
                and known_rank(source) == rank and rank - 1 not in indices else None
        elif node.op_type in _BROADCAST:
            source, other = _beside_constant(node)
            if source is None:  # two computed inputs (a residual Add): one that shows the dims
                source = _showing(node, x, indices, equal)
                moved = indices if source is not None else None
            else:
                moved = indices if known_rank(source) == rank and all(
                    other.shape[i - rank + len(other.shape)] == 1 for i in indices
                    if i - rank + len(other.shape) >= 0) else None
        else:
            moved = None
        if moved is None:
            break
        x, indices = source, moved
    return x, indices


def _sliced_axes(node: Node, rank: int) -> list[int] | None:
    """The axes a Slice (opset 10 on) cuts, when its starts and axes are constants."""
    starts = ints(node.input(1)) if len(node.inputs) > 1 and node.input(1) is not None else None
    if node.attr("starts") is not None or starts is None:
        return None
    given = node.input(3) if len(node.inputs) > 3 else None
    axes = list(range(starts.size)) if given is None else ints(given)
    if axes is None or any(not -rank <= int(a) < rank for a in np.ravel(axes)):
        return None
    return [int(a) % rank for a in np.ravel(axes)]


def _showing(node: Node, x: Value, indices: list[int], equal: Equalities) -> Value | None:
    """The input of an elementwise op of two computed inputs whose dims `indices` are proven
    to be its output's (not a 1 the other input broadcasts), or None."""
    out = proven_dims(x, equal)
    for candidate in node.inputs[:2]:
        dims = None if candidate is None else proven_dims(candidate, equal)
        if out is not None and dims is not None and len(dims) == len(out) and all(
                out[i] is not None and dims[i] is not None and equal.same(out[i], dims[i])
                for i in indices):
            return candidate
    return None


def _gathered_from(node: Node, indices: list[int], rank: int
                   ) -> tuple[Value | None, list[int] | None]:
    """Gather's output dims come from its data (before and after the axis) or from its
    indices (at the axis): the input all of `indices` come from, and their dims there."""
    data, picked = node.input(0), node.input(1)
    data_rank, picked_rank = known_rank(data), None if picked is None else known_rank(picked)
    if data_rank is None or picked_rank is None or data_rank + picked_rank - 1 != rank:
        return None, None
    axis = int(node.attr("axis", 0)) % data_rank
    if all(axis <= i < axis + picked_rank for i in indices):
        return picked, [i - axis for i in indices]
    if all(i < axis or i >= axis + picked_rank for i in indices):
        return data, [i if i < axis else i - picked_rank + 1 for i in indices]
    return None, None


def _moved(graph: Graph, shape: Node, gather: Node, ctx: PassContext) -> bool:
    """Gather(Shape(x), i) → Gather(Shape(y), j) where dims i of x equal dims j of y upstream."""
    indices = ints(gather.input(1))
    if indices is None or gather.input(0) is not shape.output \
            or gather.attr("axis", 0) not in (0, -1) or shape.attr("start", 0) \
            or shape.attr("end") is not None:
        return False
    source, moved = source_dims(shape.input(0), [int(i) for i in indices.ravel()])
    if source is shape.input(0) or not ctx.allows("ReadShapesUpstream", gather):
        return False
    reread = graph.make_node("Shape", [source], before=gather, dtype=shape.output.dtype,
                             shape=(known_rank(source),), name=graph.fresh_node_name("shape"))
    gather.set_input(0, reread.output)
    gather.set_input(1, graph.make_initializer(
        "dims", np.array(moved, dtype=np.int64).reshape(indices.shape)))
    return True


@register
class ReadShapesUpstream(Pass):
    name = "ReadShapesUpstream"
    description = "a dim picked from a value's Shape is read from the value it comes from " \
                  "(through Transposes, Reshapes, projections, normalizations, activations, " \
                  "residual Adds and Gathers), so the value can go"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        for graph in list(model.graph.all_graphs()):
            for node in list(graph):
                if node.is_onnx and node.op_type == "Shape" and node.input(0) is not None \
                        and node.input(0).type_proto is None:
                    for reader in node.output.consumers():
                        if reader.is_onnx and reader.op_type == "Gather" \
                                and _moved(graph, node, reader, ctx):
                            result.count("Gather")
        return result


__all__ = ["ReadShapesUpstream", "source_dims"]
