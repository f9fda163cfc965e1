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
fusions look for (an attention's scaled Q). A reader of a Transpose that undoes it reads its
input instead, also where the Transpose has other readers (an NHWC activation that a conv and
a residual Add read), which SimplifyLayout, pairing a Transpose with its one reader, does not
do; the Transpose then left with one reader may move on. An elementwise op that reads a
Transpose and, as it is, a value another reader brings back with the inverse Transpose (a
residual Add whose NHWC skip a conv reads in NCHW) reads that value as a Transpose of the NCHW
copy, so that its inputs move below it as one. A Pad moves too, its amounts permuted (BlazeFace
pads the channels of its skip path in NHWC), and a Concat of Transposes alike, joining on the
permuted axis. A Transpose that several ops read is copied for each where every one of them
would take its copy on to the inverse (an NHWC max pool's output that two residual Adds read).
A reduction reads the Transpose's input over the permuted axes: the Transpose goes where the
result is the same in either layout (an NHWC global average pool: [N, C] both ways), and
otherwise moves below the reduction where it would meet its inverse.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import Model, Node
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import replace_value
from graphopt.passes.reduce_axes import REDUCTIONS

_UNARY = frozenset({"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Neg", "Abs", "Sqrt", "Exp", "Log",
                    "Erf", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus",
                    "Softsign", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Cast", "Clip"})
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"})
_MAX_STEPS = 64  # ops a Transpose is followed past before it is judged not to meet its inverse


@register
class SinkTransposes(Pass):
    name = "SinkTransposes"
    description = ("move a Transpose below the elementwise ops, Pads, Concats and reductions "
                   "reading it (constants, amounts and axes permuted to match), where it meets "
                   "the Transpose that undoes it")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()

        def allows(node: Node) -> bool:
            return ctx.allows(self.name, node)

        for graph in list(model.graph.all_graphs()):
            result.count("Pad axes written out", pads_for_every_axis(graph, allows))
            changed = True
            while changed:  # a move brings a Transpose to the next op; a bypass frees one
                changed = False
                for node in list(graph.nodes()):
                    if node.graph is not graph:
                        continue
                    perm = _movable(node)
                    reduced = _reduction_move(node) if perm is None else None
                    if perm is not None and allows(node):
                        _sink(graph, node, perm)
                    elif reduced is not None and allows(node):
                        _sink_reduction(graph, node, *reduced)
                    else:
                        continue
                    result.count("Transpose")
                    changed = True
                split = _split_fanouts(graph, allows)
                result.count("Transpose copied for a reader", split)
                bypassed = _bypass_inverses(graph)
                result.count("inverse bypassed", bypassed)
                borrowed = _borrow_inverses(graph, allows)
                result.count("inverse borrowed", borrowed)
                changed = changed or bool(split) or bool(bypassed) or bool(borrowed)
                if borrowed:
                    graph.sort()  # a borrowed NCHW copy may be computed after the op reading it
        return result


def _movable(node: Node) -> list[int] | None:
    """The perm of the Transposes feeding `node` that can move below it, or None."""
    perm = _fed_perm(node)
    if not perm or perm == list(range(len(perm))) or not _carries(node, None, perm):
        return None
    data = node.inputs[:1] if node.op_type == "Pad" else node.inputs
    if node.op_type not in ("MatMul", "Slice") and _channels_last(perm) \
            and all(_per_channel(v, len(perm)) for v in data) and _out_of_a_conv(node, perm):
        return perm
    if _scales_a_linear_layer(node, perm):
        return perm
    return perm if _meets_inverse(node, perm) else None


_CONVS = frozenset({"Conv", "ConvTranspose", "FusedConv", "ConvInteger", "QLinearConv"})


def _out_of_a_conv(node: Node, perm: list[int]) -> bool:
    """Whether the Transposes by `perm` feeding `node` take a conv's output (through the
    elementwise ops they already passed) to channels last. An attention's Kᵀ, split from a
    projection and permuted by (0,2,3,1) too, stays in front of its scale: moved past it, the
    attention no longer read as one (transformers 5's TorchScript BERT fused none)."""
    for value in node.inputs:
        source = value.producer if value is not None else None
        if source is None or source.op_type != "Transpose" or list(source.attr("perm")) != perm:
            continue
        current = source.inputs[0].producer
        for _ in range(_MAX_STEPS):
            if current is None:
                return False
            if current.op_type in _CONVS:
                return True
            if current.op_type not in _UNARY | _BINARY | {"BatchNormalization", "Pad"}:
                return False
            data = [v for v in current.inputs if v is not None and v.constant() is None]
            if len(data) != 1:
                return False
            current = data[0].producer
    return False


def _scales_a_linear_layer(node: Node, perm: list[int]) -> bool:
    """Whether `node` is a Mul by a constant that varies along the channels alone, reading a
    Transpose to channels first of a linear layer's output (a MatMul by a 2-D constant, and
    any constant bias over its columns): below the Transpose, the scale varies along the
    layer's columns and FuseConvBatchNorm folds it into the weights. torchvision's and timm's
    ConvNeXt blocks apply their LayerScale γ so, `γ[C, 1, 1] · permute(Linear(x), 0, 3, 1, 2)`,
    a Mul over the whole activation a block."""
    rank = len(perm)
    if node.op_type != "Mul" or rank < 3 or perm != [0, rank - 1, *range(1, rank - 1)]:
        return False
    moving = [v for v in node.inputs if v is not None and v.constant() is None]
    scale = next((v.constant() for v in node.inputs if v is not None
                  and v.constant() is not None), None)
    if len(moving) != 1 or scale is None or scale.ndim > rank:
        return False
    shape = (1,) * (rank - scale.ndim) + scale.shape
    if shape[1] == 1 or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return False  # (a scalar stays where FuseMatMul takes it)
    source = moving[0].producer
    if source is None or not _is_transpose(source, perm):
        return False
    layer = source.inputs[0].producer
    if layer is not None and layer.op_type == "Add" and layer.is_onnx:
        bias = [v for v in layer.inputs if v is not None and v.constant() is not None]
        if len(bias) != 1 or not _per_channel(bias[0], rank):
            return False
        layer = next((v.producer for v in layer.inputs if v is not None
                      and v.constant() is None), None)
    weight = layer.input(1) if layer is not None and layer.op_type == "MatMul" else None
    return weight is not None and weight.constant() is not None \
        and weight.constant().ndim == 2


def _fed_perm(node: Node) -> list[int] | None:
    """The perm of the Transposes among `node`'s inputs when they all have one, else None."""
    perms = {tuple(value.producer.attr("perm") or ()) for value in node.inputs
             if value is not None and value.producer is not None
             and value.producer.op_type == "Transpose" and value.producer.graph is node.graph}
    return list(perms.pop()) if len(perms) == 1 else None


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


def _meets_inverse(node: Node, perm: list[int], allows=None) -> bool:
    """Whether a Transpose moved below `node` would go on, op by op, to a reader that undoes it:
    otherwise it is left where it is, since moving it gains nothing and would reshape what
    other fusions look for (the scaled Q of an attention). Where several ops read the way on,
    each must lead to an inverse (a packed key-value projection's two Slices, each read by a
    Transpose that undoes it): the moved Transpose is copied for each (_split_fanouts). With
    `allows`, only past ops it lets the Transpose move below (the rewrite gate)."""
    budget = [_MAX_STEPS]
    return _reaches_inverse(node.output, node.graph, perm, _inverse(perm), allows, budget)


def _reaches_inverse(value, graph, perm: list[int], inverse: list[int], allows,
                     budget: list[int]) -> bool:
    budget[0] -= 1
    uses = list(dict.fromkeys(use for use, _ in value.uses))
    if budget[0] < 0 or value.is_graph_output or not uses \
            or any(use.graph is not graph for use in uses):
        return False  # (a branch's reader: the pass works within one graph)
    if any(_is_transpose(use, inverse) for use in uses):
        return True  # that reader reads x then (_bypass_inverses)
    return all(_carries(use, value, perm) and (allows is None or allows(use))
               and _reaches_inverse(use.output, graph, perm, inverse, allows, budget)
               for use in uses)


def _carries(node: Node, moving, perm: list[int]) -> bool:
    """Whether Transposes by `perm` could move past `node`: it is elementwise, and its inputs
    (but `moving`, on which one arrives) are constants or such Transposes' outputs that only
    it reads; or it moves its data input alone (a Pad, a Slice, a MatMul by a constant
    matrix, whose rows the Transpose may reorder when it leaves the last axis alone)."""
    if not node.is_onnx or len(node.outputs) != 1 or node.output is None \
            or node.op_type not in _UNARY | _BINARY | {"Pad", "Concat", "MatMul", "Slice"}:
        return False
    if node.op_type in ("MatMul", "Slice", "Pad"):
        if not _arriving(node, moving, perm):
            return False
        if node.op_type == "MatMul":
            weight = node.input(1)
            return _keeps_last_axis(perm) and weight is not None \
                and weight.constant() is not None and weight.constant().ndim == 2
        if node.op_type == "Slice":
            return _slice_axes(node, len(perm)) is not None
        return _pads_movable(node, len(perm))
    if node.op_type == "Concat" and node.attr("axis") is None:
        return False
    for value in node.inputs:
        if value is None or value is moving:
            continue
        source = value.producer
        if value.constant() is not None:
            if value.constant().ndim > len(perm):
                return False
        elif not (source is not None and _is_transpose(source, perm)
                  and source.graph is node.graph and len(value.uses) == 1
                  and not value.is_graph_output):
            return False
    return True


def _arriving(node: Node, moving, perm: list[int]) -> bool:
    """Whether the Transpose comes in on `node`'s data input (its first), the one that moves."""
    data = node.input(0)
    if moving is not None:
        return data is moving
    return data is not None and data.producer is not None \
        and _is_transpose(data.producer, perm) and data.producer.graph is node.graph \
        and len(data.uses) == 1 and not data.is_graph_output


def _slice_axes(node: Node, rank: int) -> list[int] | None:
    """A Slice's axes (0, 1, … for as many as its starts when it names none), non-negative,
    when its starts, ends, axes and steps are constants given as inputs (opset 10 on)."""
    if node.attr("starts") is not None or len(node.inputs) < 3 \
            or any(v is not None and v.constant() is None for v in node.inputs[1:]):
        return None
    starts = node.input(1).constant()
    given = node.input(3) if len(node.inputs) > 3 else None
    axes = list(range(starts.size)) if given is None else [int(a) for a in given.constant()]
    if any(not -rank <= a < rank for a in axes):
        return None
    return [a % rank for a in axes]


def pads_for_every_axis(graph, allows=lambda node: True) -> int:
    """Give each Pad that names its axes (opset 18's `axes` input, constant) amounts for every
    axis instead, 0 on the others: it then moves with a Transpose like any Pad, and
    onnxruntime's transpose optimizer, which misreads an `axes` input (a Transpose, Pad over
    axis -1, Transpose failed in a Gather at run time, on the original too), meets none. The
    compile of an .om does this at every level (compiler._partition). Returns how many were
    rewritten."""
    rewritten = 0
    for node in list(graph.nodes()):
        if node.op_type != "Pad" or not node.is_onnx or len(node.inputs) < 4 \
                or node.inputs[3] is None or not allows(node):
            continue
        x, axes = node.inputs[0], node.inputs[3].constant()
        pads = _pads(node)
        # The rank from the input's shape, else the output's (a Transpose's input may not
        # have been inferred, its output has).
        shape = next((v.shape for v in (x, node.outputs[0]) if v is not None
                      and v.shape is not None), None)
        rank = len(shape) if shape is not None else None
        source = x.producer if x is not None else None
        if rank is None and source is not None and source.op_type == "Transpose" \
                and source.attr("perm") is not None:  # what the rank is, shapes unknown
            rank = len(source.attr("perm"))
        if axes is None or pads is None or rank is None or len(pads) != 2 * axes.size:
            continue
        axes = [int(a) + rank if int(a) < 0 else int(a) for a in axes.reshape(-1)]
        if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
            continue
        full = [0] * (2 * rank)
        for i, axis in enumerate(axes):
            full[axis], full[rank + axis] = pads[i], pads[len(axes) + i]
        node.set_input(1, graph.make_initializer(node.input(1).name + "_all_axes",
                                                 np.array(full, np.int64)))
        node.set_inputs(node.inputs[:3])
        rewritten += 1
    return rewritten


def _pads_movable(node: Node, rank: int) -> bool:
    """A Pad whose amounts are known (the attribute before opset 11, a constant input after)
    for every axis (no `axes` input), and whose fill value is a constant: its amounts can be
    permuted with the Transpose."""
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return False
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is not None and value.constant() is None:
        return False
    pads = _pads(node)
    return pads is not None and len(pads) == 2 * rank


def _pads(node: Node) -> list[int] | None:
    if node.attr("pads") is not None:
        return [int(p) for p in node.attr("pads")]
    given = node.inputs[1] if len(node.inputs) > 1 else None
    data = None if given is None else given.constant()
    return None if data is None or data.ndim != 1 else [int(p) for p in data]


def _keeps_last_axis(perm: list[int]) -> bool:
    """Whether `perm` moves rows only: the last axis, a row's elements, stays last."""
    return len(perm) >= 2 and perm[-1] == len(perm) - 1


def _is_transpose(node: Node, perm: list[int]) -> bool:
    return node.op_type == "Transpose" and node.is_onnx and node.attr("perm") is not None \
        and list(node.attr("perm")) == perm


def _inverse(perm: list[int]) -> list[int]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return inverse


def _borrow_inverses(graph, allows) -> int:
    """An elementwise op reading a Transpose(·, p) and, as it is, a value that another reader
    brings back with the inverse Transpose (a residual Add in NHWC, whose skip input a conv
    reads in NCHW): the op reads that value as Transpose(the NCHW copy, p) instead, the same
    tensor, so that both of its inputs arrive by Transposes alike and move below it as one;
    only where `allows(op)` lets it move (else the next bypass would undo the rewiring and the
    next borrow redo it, for ever). Returns how many inputs were rewired."""
    rewired = 0
    for node in list(graph.nodes()):
        if node.graph is not graph or not node.is_onnx or node.op_type not in _BINARY:
            continue
        perm = _fed_perm(node)
        if not perm:
            continue
        inverse = _inverse(perm)
        for index, value in enumerate(node.inputs):
            if value is None or value.constant() is not None or (
                    value.producer is not None and value.producer.op_type == "Transpose"):
                continue
            back = next((use for use, _ in value.uses
                         if _is_transpose(use, inverse) and use.graph is graph), None)
            if back is None:
                continue
            again = Node("Transpose", [back.output], {"perm": perm},
                         name=graph.fresh_node_name("SinkTransposes"))
            graph.insert_before(node, again)
            again.output.name = graph.fresh_name(value.name + "_t")
            again.output.dtype, again.output.shape = value.dtype, value.shape
            node.set_input(index, again.output)
            if _movable(node) is None or not allows(node):  # worth it where the op moves
                node.set_input(index, value)
                graph.remove(again)
                continue
            rewired += 1
    return rewired


def _bypass_inverses(graph) -> int:
    """Readers of a Transpose that undo it read its input instead; the Transpose stays for its
    other readers, if any. An NHWC activation a conv and a residual Add both read keeps one
    Transpose, for the Add, and the conv reads NCHW (SimplifyLayout pairs a Transpose with its
    inverse only where that is its one reader). Returns how many readers went."""
    bypassed = 0
    for node in list(graph.nodes()):
        if node.graph is not graph or node.op_type != "Transpose" or not node.is_onnx \
                or node.attr("perm") is None:
            continue
        inverse = _inverse(list(node.attr("perm")))
        source = node.input(0)
        for reader in [use for use, _ in node.output.uses
                       if _is_transpose(use, inverse) and use.graph is graph]:
            if replace_value(reader.output, source):
                graph.remove(reader)
                bypassed += 1
        if not node.output.uses and not node.output.is_graph_output:
            graph.remove(node)
    return bypassed


def _sink(graph, node: Node, perm: list[int]) -> None:
    """node(Transpose(x, perm), c) → Transpose(node(x, c'), perm)."""
    rank = len(perm)
    inverse = _inverse(perm)
    sources = []
    if node.op_type == "Pad":  # its amounts per axis follow the axes: begins, then ends
        pads = _pads(node)
        moved_pads = [pads[inverse[k]] for k in range(rank)] + \
            [pads[rank + inverse[k]] for k in range(rank)]
        source = node.input(0).producer
        sources.append(source)
        node.set_input(0, source.input(0))
        if node.attr("pads") is not None:
            node.set_attr("pads", moved_pads)
        else:
            node.set_input(1, graph.make_initializer(node.input(1).name + "_sunk",
                                                     np.array(moved_pads, np.int64)))
    if node.op_type == "Slice":  # its axes follow the data's; starts, ends, steps stay
        axes = _slice_axes(node, rank)
        source = node.input(0).producer
        sources.append(source)
        node.set_input(0, source.input(0))
        moved_axes = np.array([perm[a] for a in axes], np.int64)
        name = node.input(3).name if len(node.inputs) > 3 and node.input(3) is not None \
            else node.input(1).name + "_axes"
        axes_value = graph.make_initializer(name + "_sunk", moved_axes)
        if len(node.inputs) > 3:
            node.set_input(3, axes_value)
        else:
            node.set_inputs([*node.inputs[:3], axes_value])
    for index, value in enumerate(node.inputs if node.op_type not in ("Pad", "Slice") else ()):
        if value is None or node.op_type == "MatMul" and index == 1:  # the weight stays
            continue
        data = value.constant()
        if data is None:  # a Transpose's output
            sources.append(value.producer)
            node.set_input(index, value.producer.input(0))
        elif data.ndim > 0 and not (node.op_type == "Clip" and index > 0):
            # (Clip's bounds are single values, which its kernel wants as they are: [1] too.)
            full = data.reshape((1,) * (rank - data.ndim) + data.shape)
            permuted = np.ascontiguousarray(np.transpose(full, inverse))
            if _same_broadcast(permuted, data):
                continue  # a bias [N] stays [N]: onnxruntime fuses it into a Gemm only so
            node.set_input(index, graph.make_initializer(value.name + "_sunk", permuted))
    if node.op_type == "Concat":  # the axis it joins on, in the untransposed layout
        node.set_attr("axis", perm[int(node.attr("axis")) % rank])
    _transpose_output(graph, node, perm)
    _remove_unread(graph, sources)


def _same_broadcast(permuted: np.ndarray, data: np.ndarray) -> bool:
    """Whether the constant `data`, brought to the Transpose's rank and permuted, broadcasts
    as `data` does: the axes the Transpose moves were all 1s in it."""
    lead = permuted.ndim - data.ndim
    return all(d == 1 for d in permuted.shape[:lead]) and permuted.shape[lead:] == data.shape \
        and np.array_equal(permuted.reshape(data.shape), data)


def _transpose_output(graph, node: Node, perm: list[int]) -> None:
    """`node`, now computing its output untransposed, hands it to its readers through a
    Transpose by `perm`, whose output takes the name (what the name held before, it holds
    still: compare pairs values by name, and square dims would hide a layout change)."""
    out = node.output
    inverse = _inverse(perm)
    moved = Node("Transpose", (), {"perm": perm}, name=graph.fresh_node_name("SinkTransposes"))
    graph.insert_after(node, moved)
    moved.output.dtype, moved.output.shape = out.dtype, out.shape
    moved.output.name = graph.fresh_name(out.name + "_t")
    if replace_value(out, moved.output) and not moved.output.is_graph_output:
        name, out.name = out.name, graph.fresh_name(out.name + "_sunk")
        moved.output.name = name
    moved.set_inputs([out])
    if out.shape is not None and len(out.shape) == len(perm):
        out.shape = tuple(out.shape[inverse[k]] for k in range(len(perm)))


def _remove_unread(graph, nodes) -> None:
    for node in nodes:
        if not any(v is not None and (v.uses or v.is_graph_output) for v in node.outputs):
            graph.remove(node)


def _reduction_move(node: Node) -> tuple[list[int], list[int]] | None:
    """For a reduction over known axes of a Transpose that only it reads: the axes of the
    Transpose's input to reduce instead, and the perm left for its output, empty or the
    identity where the Transpose goes altogether (an NHWC global average pool, whose
    [N, C] result is the same in either layout); None where the Transpose stays, which is
    unless it goes or would meet its inverse."""
    if node.op_type not in REDUCTIONS or not node.is_onnx or len(node.outputs) != 1 \
            or node.output is None or node.input(0) is None:
        return None
    value = node.input(0)
    source = value.producer
    if source is None or source.op_type != "Transpose" or not source.is_onnx \
            or source.attr("perm") is None or len(value.uses) != 1 or value.is_graph_output \
            or source.graph is not node.graph:
        return None
    perm = list(source.attr("perm"))
    axes = _reduced_axes(node, len(perm))
    if not axes:
        return None
    reduced = sorted(perm[a] for a in axes)
    if node.attr("keepdims") is None or int(node.attr("keepdims")):
        left = perm
    else:  # the axes kept, in their order after the Transpose, among those kept before it
        kept = [axis for axis in range(len(perm)) if axis not in reduced]
        left = [kept.index(perm[a]) for a in range(len(perm)) if a not in axes]
    if left == list(range(len(left))) or _meets_inverse(node, left):
        return reduced, left
    return None


def _reduced_axes(node: Node, rank: int) -> list[int] | None:
    """The axes a reduction reduces (all of them when it names none), or None when they are
    not known or it reduces none (`noop_with_empty_axes`)."""
    given = node.attr("axes")
    if given is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        data = node.inputs[1].constant()
        if data is None or data.ndim != 1:
            return None
        given = data.tolist()
    if not given:
        return None if node.attr("noop_with_empty_axes") else list(range(rank))
    return sorted({int(a) % rank for a in given})


def _sink_reduction(graph, node: Node, reduced: list[int], left: list[int]) -> None:
    """Reduce(Transpose(x, p), axes) → Transpose(Reduce(x, p[axes]), left), the Transpose
    dropped where `left` keeps every axis in place."""
    source = node.input(0).producer
    node.set_input(0, source.input(0))
    if node.attr("axes") is not None:
        node.set_attr("axes", reduced)
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        node.set_input(1, graph.make_initializer(node.input(1).name + "_sunk",
                                                 np.array(reduced, np.int64)))
    if left != list(range(len(left))):
        _transpose_output(graph, node, left)
    _remove_unread(graph, [source])


def _split_fanouts(graph, allows) -> int:
    """A Transpose that several ops read, each of which would take it on to its inverse (an
    NHWC max pool's output that two residual Adds read): each reader gets a Transpose of its
    own, which then moves below it. Where one reader would not, the readers keep sharing it,
    so that no copy is made that would not cancel. Returns how many copies were made."""
    copies = 0
    for node in list(graph.nodes()):
        if node.graph is not graph or node.op_type != "Transpose" or not node.is_onnx \
                or node.attr("perm") is None or node.output.is_graph_output:
            continue
        out, perm = node.output, list(node.attr("perm"))
        readers = list(dict.fromkeys(use for use, _ in out.uses))
        if len(readers) < 2 or any(reader.graph is not graph for reader in readers):
            continue
        made = []
        for reader in readers[1:]:
            copy = Node("Transpose", [node.input(0)], {"perm": perm},
                        name=graph.fresh_node_name("SinkTransposes"))
            graph.insert_after(node, copy)
            copy.output.name = graph.fresh_name(out.name + "_c")
            copy.output.dtype, copy.output.shape = out.dtype, out.shape
            for index, value in enumerate(reader.inputs):
                if value is out:
                    reader.set_input(index, copy.output)
            made.append((reader, copy))
        if all(_cancels_below(reader, perm, allows, readers) for reader in readers):
            copies += len(made)
            continue
        for reader, copy in made:
            for index, value in enumerate(reader.inputs):
                if value is copy.output:
                    reader.set_input(index, out)
            graph.remove(copy)
    return copies


def _cancels_below(reader: Node, perm: list[int], allows, siblings=()) -> bool:
    """Whether a Transpose by `perm` that `reader` alone reads would move below it and go on
    to meet its inverse, or go in a reduction, past ops `allows` lets it move below. An
    elementwise reader whose other inputs are outputs of `siblings` (the other readers of the
    Transpose, which move theirs first) counts too: a swish, x · Sigmoid(x), of an NHWC
    Transpose (tf2onnx), whose Mul gets its second Transpose once the Sigmoid's has moved."""
    if not allows(reader):
        return False
    if _movable(reader) is not None:
        return _meets_inverse(reader, perm, allows)
    if reader.is_onnx and reader.op_type in _BINARY and _fed_perm(reader) == perm and all(
            v is None or v.constant() is not None
            or v.producer is not None and _is_transpose(v.producer, perm)
            or v.producer in siblings and v.producer is not reader
            and len(v.uses) == 1 and _movable(v.producer) is not None
            for v in reader.inputs):
        return _meets_inverse(reader, perm, allows)
    moved = _reduction_move(reader)
    if moved is None:
        return False
    left = moved[1]
    return left == list(range(len(left))) or _meets_inverse(reader, left, allows)
