"""FoldShapes: Shape and Size of values whose needed dims are static become int64 initializers.

    %s = Shape(%x<f32[N,64,128]>) {start=1}     →   %s = initializer i64[2] [64, 128]
    %n = Size(%x<f32[2,64]>)                    →   %n = initializer i64[] 128
    %d = Gather(Shape(%x<f32[N,64]>), 1)        →   %d = initializer i64[] 64   (N stays symbolic)
    %t = Slice(Shape(%x<f32[N,64,8]>), [1], [3]) →  %t = initializer i64[2] [64, 8]
    %y = Reshape(%x, Concat(Shape(%x)[0], [12, 64])) → %y = Reshape(%x, [0, 12, 64])
                                                       (see reshape_own_dims)
    %y = Reshape(%x, Concat(Shape(%k<f32[B,4,64]>)[0], [16])) → %y = Reshape(%x, [-1, 16])
                                                       (see reshape_one_unknown)
    %s = Concat(Shape(%x)[0], Shape(%x)[1])     →   %s = Shape(%x)   (x of rank 2)

FoldConstants then finishes Shape → Gather → Unsqueeze → Concat → Reshape chains. Values must
have shapes (run InferShapes first). A main-graph output becomes an initializer of its name (as
FoldConstants' do); a nested graph's output keeps its node.
"""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir import Graph, Model, Node, Tensor
from graphopt.ir.value import Shape
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import replace_value
from graphopt.passes.fold_constants import become_initializer, fits_output, pinned_outputs
from graphopt.passes.reshape_one_unknown import one_unknown_shape
from graphopt.passes.reshape_own_dims import own_dims_shape
from graphopt.passes.shape_pieces import (dims_read, ints, known_rank, slice_bounds,
                                          slice_indices)


def _shape_dims(node: Node) -> Shape | None:
    """The dims a Shape node returns (after opset-15 start/end slicing), static or not."""
    x = node.input(0)
    if x is None or x.type_proto is not None or x.shape is None:
        return None
    rank = len(x.shape)
    start, end = node.attr("start", 0), node.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return x.shape[start:end]


def _static(dims) -> bool:
    return all(isinstance(d, int) and d >= 0 for d in dims)


def _gathered(node: Node, dims: Shape) -> np.ndarray | None:
    """Dims picked by Gather(Shape(x), indices) when all of them are static."""
    indices = ints(node.input(1))
    if indices is None or node.attr("axis", 0) not in (0, -1):
        return None
    rank = len(dims)
    if np.any(indices < -rank) or np.any(indices >= rank):
        return None
    picked = [dims[int(i)] for i in indices.ravel()]
    if not _static(picked):
        return None
    return np.array(picked, dtype=np.int64).reshape(indices.shape)


def _sliced(node: Node, dims: Shape, opset: int) -> np.ndarray | None:
    """Dims picked by Slice(Shape(x), ...) when all of them are static."""
    bounds = slice_bounds(node, opset)
    if bounds is None:
        return None
    picked = [dims[i] for i in slice_indices(len(dims), *bounds)]
    if not _static(picked):
        return None
    return np.array(picked, dtype=np.int64)


def _replace(graph: Graph, node: Node, array: np.ndarray, pinned: set[int], ctx: PassContext,
             rule: str) -> bool:
    """Swap `node`'s single output for an initializer of the same name and drop the node."""
    out, tensor = node.output, Tensor(array)
    if id(out) in pinned or any(v is not None and v is not out for v in node.outputs):
        return False
    if out.is_graph_output and not fits_output(out, tensor):
        return False
    if not ctx.allows(rule, node):
        return False
    become_initializer(graph, out, tensor)
    graph.remove(node)
    return True


@register
class FoldShapes(Pass):
    name = "FoldShapes"
    description = "replace Shape/Size (and Gather/Slice of static dims) with int64 initializers; " \
                  "a Reshape shape built from its input's own dims, or with one entry unknown at " \
                  "compile time, becomes a constant; a Concat of consecutive dims of one Shape " \
                  "becomes that Shape"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        graphs = list(model.graph.all_graphs())
        pinned = pinned_outputs(model)
        opset = model.opset("") or 1
        for graph in graphs:
            for node in graph:
                if not node.is_onnx:
                    continue
                if node.op_type == "Size":
                    x = node.input(0)
                    if x is not None and x.type_proto is None and x.static_shape is not None:
                        array = np.array(math.prod(x.static_shape), dtype=np.int64)
                        if _replace(graph, node, array, pinned, ctx, "Size"):
                            result.count("Size")
                elif node.op_type == "Shape":
                    self._shape(graph, node, pinned, opset, result, ctx)
                elif node.op_type == "Concat":
                    self._concat_of_dims(graph, node, opset, result, ctx)
                elif node.op_type == "Reshape":
                    self._reshape(graph, node, opset, result, ctx)
        return result

    @staticmethod
    def _reshape(graph: Graph, node: Node, opset: int, result: PassResult,
                 ctx: PassContext) -> None:
        """A target computed at run time becomes a constant: one that reads the input's own dims,
        or one with a single entry unknown at compile time (a -1 there)."""
        for rule, shape in (("ReshapeOwnDims", own_dims_shape(node, opset)),
                            ("ReshapeOneUnknown", one_unknown_shape(node, opset))):
            if shape is not None and ctx.allows(rule, node):
                node.set_input(1, graph.make_initializer("shape", shape))
                result.count(rule)
                return

    @staticmethod
    def _concat_of_dims(graph: Graph, concat: Node, opset: int, result: PassResult,
                        ctx: PassContext) -> None:
        """Concat of pieces that read x's dims a, a+1, …, b-1 in order → Shape(x) {a, b}."""
        if concat.attr("axis") not in (0, -1) or len(concat.inputs) < 2:
            return
        x, dims = None, []
        for piece in concat.inputs:
            read = dims_read(piece, opset) if piece is not None else None
            if read is None or (x is not None and read[0] is not x):
                return
            x = read[0]
            dims += read[1]
        if not dims or dims != list(range(dims[0], dims[0] + len(dims))):
            return
        start, end = dims[0], dims[-1] + 1
        whole = (start, end) == (0, known_rank(x))
        if (not whole and opset < 15) or not ctx.allows("ConcatOfShapeDims", concat):
            return  # start and end came with opset 15
        attrs = {} if whole else {"start": start, "end": end}
        shape = graph.make_node("Shape", [x], attrs, before=concat, dtype=concat.output.dtype,
                                shape=(len(dims),), name=graph.fresh_node_name("shape"))
        if replace_value(concat.output, shape.output):
            result.count("ConcatOfShapeDims")
        else:
            graph.remove(shape)

    @staticmethod
    def _shape(graph: Graph, node: Node, pinned: set[int], opset: int, result: PassResult,
               ctx: PassContext) -> None:
        dims = _shape_dims(node)
        if dims is None:
            return
        if _static(dims):
            if _replace(graph, node, np.array(dims, dtype=np.int64), pinned, ctx, "Shape"):
                result.count("Shape")
            return
        # Some dims are symbolic: fold the readers that only pick static ones.
        for consumer in node.output.consumers():
            if not consumer.is_onnx or consumer.input(0) is not node.output:
                continue
            if consumer.op_type == "Gather":
                array = _gathered(consumer, dims)
                rule = "ShapeGather"
            elif consumer.op_type == "Slice":
                array = _sliced(consumer, dims, opset)
                rule = "ShapeSlice"
            else:
                continue
            if array is not None and _replace(graph, consumer, array, pinned, ctx, rule):
                result.count(rule)
