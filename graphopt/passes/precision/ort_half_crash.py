"""A float16 pattern that crashes onnxruntime's CPU provider, rewritten into an equal one.

onnxruntime 1.32 dies with SIGSEGV when it loads, at ORT_ENABLE_ALL, a float16
Transpose(perm=[1, 0, 2]) that feeds a float16 MatMul with a constant 2-D weight (its
MatmulTransposeFusion and NchwcTransformer meet over the Casts its InsertCastTransformer adds;
disabling either avoids it, ORT_ENABLE_EXTENDED loads it, float32 does not crash). Mixed
precision writes the pattern wherever a sequence-first activation reaches a projection
(Longformer's attention output). A MatMul with a 2-D weight works on the last axis alone, so
the Transpose of the two leading axes commutes with it:

    MatMul(Transpose(x, [1, 0, 2]), W)   ==   Transpose(MatMul(x, W), [1, 0, 2])

the same dot products, bit for bit, in a form onnxruntime loads.
"""

from __future__ import annotations

from graphopt.ir import DType, Graph, Node

_BATCH_SWAP = [1, 0, 2]


def _swapped_input(matmul: Node) -> Node | None:
    """The Transpose(perm=[1, 0, 2]) that `matmul` reads as its first input, when the MatMul
    is float16 with a constant 2-D weight; else None. The Transpose may have other readers
    (a bidirectional RNN's two projections): each such MatMul moves, and the Transpose goes
    with the last of them."""
    if matmul.op_type != "MatMul" or not matmul.is_onnx or matmul.output.dtype != DType.FLOAT16:
        return None
    a, w = matmul.inputs
    if w is None or w.const is None or w.shape is None or len(w.shape) != 2:
        return None
    transpose = a.producer if a is not None else None
    # A Transpose of an enclosing graph (a body's MatMul reading it) stays where it is.
    if transpose is None or transpose.graph is not matmul.graph \
            or transpose.op_type != "Transpose" or not transpose.is_onnx \
            or list(transpose.attr("perm") or []) != _BATCH_SWAP:
        return None
    return transpose


def move_batch_swaps_after_half_matmuls(graph: Graph) -> int:
    """Rewrite every float16 MatMul(Transpose(x, [1, 0, 2]), W) of `graph` as
    Transpose(MatMul(x, W), [1, 0, 2]); returns how many. The MatMul node becomes the
    Transpose, so its output keeps its name and readers."""
    moved = 0
    for matmul in list(graph.nodes()):
        transpose = _swapped_input(matmul)
        if transpose is None:
            continue
        x, w = transpose.input(0), matmul.input(1)
        shape = (*x.shape[:2], w.shape[1]) if x.shape is not None and len(x.shape) == 3 \
            else None
        product = graph.make_node("MatMul", [x, w], name=graph.fresh_node_name(
            matmul.name or "MatMul"), before=matmul, dtype=DType.FLOAT16, shape=shape)
        matmul.op_type, matmul.attrs = "Transpose", {}
        matmul.set_attr("perm", list(_BATCH_SWAP))
        matmul.set_inputs([product.output])
        if not transpose.output.uses and not transpose.output.is_graph_output:
            graph.remove(transpose)
        moved += 1
    return moved
