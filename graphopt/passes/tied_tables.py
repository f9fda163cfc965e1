"""A token table folded from the transpose of an output head it is tied to: the head reads the
table through transB, so that the artifact stores one copy of the weights, not two.

onnxruntime-genai's float exports tie a language model's embedding to its output head so:

    logits = MatMul(h, W)             W [hidden, vocab], the head's weight
    table  = Transpose(W)             [vocab, hidden], read by the embedding's Gather alone

Folding the Transpose stores the table beside W (a Qwen2-0.5B-like float32 artifact took
1.33 GB for 0.78 GB of weights). Once it is folded, the head reads the table instead:

    logits = MatMul(h, Transpose(table))

W is then dead, and the Transpose of a weight that a Gather reads too stays unfolded
(FoldConstants' shared-weight rule) for FuseMatMul, which makes it FusedMatMul(h, table,
transB=1): the head runs from the same prepacked weights as before.
"""

from __future__ import annotations

from graphopt.ir import Graph, Node, Value
from graphopt.passes.base import PassContext
from graphopt.passes.fusion.matmul import TransposeIntoMatMulB

RULE = "TiedTableTranspose"
_GATHERS = frozenset({"Gather", "GatherElements", "GatherND"})


def tied_head(node: Node, limit: int, sizes) -> Value | None:
    """W when `node` is a 2-D Transpose of an initializer W over `limit` bytes whose output
    Gathers alone read (as their data), while MatMuls read W as their B alone: the tie."""
    if not (node.is_onnx and node.op_type == "Transpose" and node.output is not None):
        return None
    weight = node.input(0)
    if weight is None or weight.producer is not None or weight.shape is None \
            or len(weight.shape) != 2 or tuple(node.attr("perm") or (1, 0)) != (1, 0) \
            or (sizes.nbytes(weight) or 0) <= limit or node.output.is_graph_output:
        return None
    readers = node.output.consumers()
    if not readers or not all(r.is_onnx and r.op_type in _GATHERS
                              and r.input(0) is node.output
                              and node.output not in r.inputs[1:] for r in readers):
        return None
    heads = [r for r in weight.consumers() if r is not node]
    if not heads or not all(_reads_as_b(r, weight) for r in heads):
        return None
    return weight


def _reads_as_b(node: Node, weight: Value) -> bool:
    a = node.input(0)
    return node.is_onnx and node.op_type == "MatMul" and node.input(1) is weight \
        and a is not weight and a is not None and a.shape is not None and len(a.shape) >= 2


def read_through_table(graph: Graph, weight: Value, table: Value, ctx: PassContext) -> int:
    """Point the MatMuls reading `weight` at Transpose(`table`), the table folded from it, where
    FuseMatMul will read it through transB; the number of heads changed."""
    disabled = ctx.options.disabled_passes
    if "FuseMatMul" in disabled or TransposeIntoMatMulB.name in disabled:
        return 0  # a head left reading a Transpose would transpose the table at every run
    changed = 0
    for head in [r for r in weight.consumers() if _reads_as_b(r, weight)]:
        if TransposeIntoMatMulB().unsupported(head.output, ctx.target) is not None \
                or not ctx.allows(RULE, head):
            continue
        flipped = graph.make_node("Transpose", [table], {"perm": [1, 0]}, before=head,
                                  name=graph.fresh_node_name(f"{head.name or 'MatMul'}/{RULE}"),
                                  dtype=weight.dtype, shape=weight.shape)
        head.set_input(1, flipped.output)
        changed += 1
    return changed
