"""SinkTransposes: move a Transpose below the elementwise ops that read it, so that it meets the
Transpose that undoes it (SimplifyLayout then cancels the pair) and the per-channel constants
between two convs reach the conv they belong to (FuseConvBatchNorm).

Exporters from NHWC frameworks (tf2onnx, jax2onnx) wrap every conv in a Transpose pair and keep
the BatchNorm arithmetic, the bias and the activation in NHWC between them:

    Conv ─▶ Transpose(0,2,3,1) ─▶ Add(b) ─▶ Mul(s) ─▶ Relu ─▶ Transpose(0,3,1,2) ─▶ Conv

An elementwise op commutes with a Transpose when its constant operands are permuted with it:

    Op(Transpose(x, p), c) = Transpose(Op(x, c'), p),   c' = Transpose(c, p⁻¹)
        c brought to rank(x) with leading 1s first, as broadcasting would

which changes no element, only where the permutation happens. Applied until no Transpose can go
further, the pair meets:

    Conv ─▶ Add(b') ─▶ Mul(s') ─▶ Relu ─▶ Transpose(0,2,3,1) ─▶ Transpose(0,3,1,2) ─▶ Conv

A Transpose moves only when the op is its one reader (a second reader would need the transposed
tensor too); an op with several transposed inputs moves them only when all have the same perm
(a residual Add of two NHWC branches). And it moves only when it would go on to meet readers
that undo it, or when it takes a conv's output to NHWC (past the bias and the activation, those
fold and fuse into the conv): elsewhere a move gains nothing, and would reshape what other
fusions look for (an attention's scaled Q). Where every reader of a Transpose undoes it (an
NHWC activation that two convs read), the readers read its input instead, which
SimplifyLayout, pairing one Transpose with one reader, does not do.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Model, Node
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import replace_value

_UNARY = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Neg", "Abs", "Sqrt", "Exp", "Log",
                    "Erf", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus",
                    "Softsign", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Cast", "Clip"})
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"})
_MAX_STEPS = 64  # ops a Transpose is followed past before it is judged not to meet its inverse


@register
class SinkTransposes(Pass):
    name = "SinkTransposes"
    description = ("move a Transpose below the elementwise ops reading it (constants permuted "
                   "to match), where it meets the Transpose that undoes it")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        for graph in list(model.graph.all_graphs()):
            moved = True
            while moved:  # each move may bring a Transpose to the next op
                moved = False
                for node in list(graph.nodes()):
                    perm = _movable(node) if node.graph is graph else None
                    if perm is not None and ctx.allows(self.name, node):
                        _sink(graph, node, perm)
                        result.count("Transpose")
                        moved = True
            result.count("fanned-out pair", _cancel_fanned_out(graph))
        return result


def _movable(node: Node) -> list[int] | None:
    """The perm of the Transposes feeding `node` that can move below it, or None."""
    perms = {tuple(value.producer.attr("perm") or ()) for value in node.inputs
             if value is not None and value.producer is not None
             and value.producer.op_type == "Transpose"}
    if len(perms) != 1:
        return None
    perm = list(perms.pop())
    if not perm or perm == list(range(len(perm))) or not _carries(node, None, perm):
        return None
    if _channels_last(perm) and all(_per_channel(v, len(perm)) for v in node.inputs):
        return perm
    return perm if _meets_inverse(node, perm) else None


def _channels_last(perm: list[int]) -> bool:
    """NCHW → NHWC (any rank): an NHWC export's way out of a conv."""
    return len(perm) >= 3 and perm == [0, *range(2, len(perm)), 1]


def _per_channel(value, rank: int) -> bool:
    """Whether an input of the op is no constant, or one that varies along the channel axis
    alone (a bias, a BatchNorm's scale): past those, and past activations, a Transpose out of
    a conv moves even where it will not meet its inverse, since they then fold and fuse into
    the conv (a Relu behind the Transpose does not). A constant over the other axes (a
    position embedding) keeps the Add where it is, next to the LayerNorm it may fuse with."""
    data = None if value is None else value.constant()
    if data is None:
        return True
    shape = (1,) * (rank - data.ndim) + data.shape
    return all(d == 1 for d in shape[:-1])


def _meets_inverse(node: Node, perm: list[int]) -> bool:
    """Whether a Transpose moved below `node` would go on, op by op, to readers that undo it:
    otherwise it is left where it is, since moving it gains nothing and would reshape what
    other fusions look for (the scaled Q of an attention)."""
    inverse = _inverse(perm)
    value = node.output
    for _ in range(_MAX_STEPS):
        uses = [use for use, _ in value.uses]
        if value.is_graph_output or not uses:
            return False
        if all(_is_transpose(use, inverse) for use in uses):
            return True
        if len(uses) != 1 or not _carries(uses[0], value, perm):
            return False
        value = uses[0].output
    return False


def _carries(node: Node, moving, perm: list[int]) -> bool:
    """Whether Transposes by `perm` could move past `node`: it is elementwise, and its inputs
    (but `moving`, on which one arrives) are constants or such Transposes' outputs that only
    it reads."""
    if not node.is_onnx or len(node.outputs) != 1 or node.output is None \
            or node.op_type not in _UNARY | _BINARY:
        return False
    for value in node.inputs:
        if value is None or value is moving:
            continue
        source = value.producer
        if value.constant() is not None:
            if value.constant().ndim > len(perm):
                return False
        elif not (source is not None and _is_transpose(source, perm) and len(value.uses) == 1
                  and not value.is_graph_output):
            return False
    return True


def _is_transpose(node: Node, perm: list[int]) -> bool:
    return node.op_type == "Transpose" and node.is_onnx and node.attr("perm") is not None \
        and list(node.attr("perm")) == perm


def _inverse(perm: list[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def _cancel_fanned_out(graph) -> int:
    """A Transpose every reader of which is its inverse Transpose (an activation that two
    convs read, in NHWC between them): the readers read its input instead. (SimplifyLayout
    cancels a pair only where the first Transpose has one reader.) Returns how many went."""
    cancelled = 0
    for node in list(graph.nodes()):
        if node.graph is not graph or node.op_type != "Transpose" or not node.is_onnx \
                or node.attr("perm") is None or node.output.is_graph_output:
            continue
        readers = [use for use, _ in node.output.uses]
        inverse = _inverse(list(node.attr("perm")))
        if len(readers) < 2 or not all(_is_transpose(r, inverse) for r in readers):
            continue
        source = node.input(0)
        for reader in readers:
            if replace_value(reader.output, source):
                graph.remove(reader)
                cancelled += 1
        if not node.output.uses:
            graph.remove(node)
    return cancelled


def _sink(graph, node: Node, perm: list[int]) -> None:
    """node(Transpose(x, perm), c) → Transpose(node(x, c'), perm)."""
    rank = len(perm)
    inverse = _inverse(perm)
    sources = []
    for index, value in enumerate(node.inputs):
        if value is None:
            continue
        data = value.constant()
        if data is None:  # a Transpose's output
            sources.append(value.producer)
            node.set_input(index, value.producer.input(0))
        elif data.ndim > 0 and not (node.op_type == "Clip" and index > 0):
            # (Clip's bounds are single values, which its kernel wants as they are: [1] too.)
            full = data.reshape((1,) * (rank - data.ndim) + data.shape)
            permuted = np.ascontiguousarray(np.transpose(full, inverse))
            node.set_input(index, graph.make_initializer(value.name + "_sunk", permuted))
    out = node.output
    moved = Node("Transpose", (), {"perm": perm}, name=graph.fresh_node_name("SinkTransposes"))
    graph.insert_after(node, moved)
    moved.output.dtype, moved.output.shape = out.dtype, out.shape
    moved.output.name = graph.fresh_name(out.name + "_t")
    replace_value(out, moved.output)  # a graph output: the Transpose takes over its name
    moved.set_inputs([out])
    if out.shape is not None and len(out.shape) == rank:
        out.shape = tuple(out.shape[inverse[k]] for k in range(rank))
    for source in sources:
        if not any(v is not None and (v.uses or v.is_graph_output) for v in source.outputs):
            graph.remove(source)
