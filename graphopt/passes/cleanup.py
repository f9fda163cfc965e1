"""Cleanup passes: Constant nodes to initializers, identity and Dropout removal, dead nodes,
common subexpressions, duplicate initializers."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from onnx import AttributeProto

from graphopt.ir import Graph, Model, Node, Value
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import bypass, replace_value
from graphopt.passes.facts import constant_node_tensor, random_functions, random_reason
from graphopt.passes.reduce_axes import REDUCTIONS, reduced_axes

# Constants up to this many elements are compared by value: axes, shapes, scalars. Exporters
# write a fresh initializer for each, so two equal reductions read two equal [2]s.
_SMALL_CONSTANT = 64

@register
class ConstantToInitializer(Pass):
    name = "ConstantToInitializer"
    description = "turn Constant nodes into initializers, so folding and dedup see them"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        for graph in list(model.graph.all_graphs()):
            for node in graph:
                if node.op_type != "Constant" or not node.is_onnx:
                    continue
                out = node.output
                tensor = constant_node_tensor(node)
                if tensor is None or out.is_graph_output or not ctx.allows("Constant", node):
                    continue
                init = Value(out.name, const=tensor)
                out.replace_all_uses_with(init)
                graph.remove(node)
                graph.add_initializer(init)
                init.doc_string = out.doc_string
                result.count("Constant")
        return result


def _dropout_is_identity(node: Node) -> bool:
    """Inference runtimes pass Dropout's input through unless training_mode is true; the mask
    output must be unused for the node to vanish."""
    mask = node.outputs[1] if len(node.outputs) > 1 else None
    if mask is not None and (mask.uses or mask.is_graph_output):
        return False
    training = node.input(2)
    if training is None:
        return True
    flag = training.constant()
    return flag is not None and not bool(np.asarray(flag).any())


@register
class EliminateIdentity(Pass):
    name = "EliminateIdentity"
    description = "remove Identity nodes and inference-mode Dropout"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        for node in list(model.graph.all_nodes()):
            if node.graph is None or not node.is_onnx or not node.inputs:
                continue
            source = node.inputs[0]
            if source is None:
                continue
            if node.op_type == "Identity" and source.is_tensor:
                if ctx.allows("Identity", node) and bypass(node, source):
                    result.count("Identity")
            elif node.op_type == "Dropout" and _dropout_is_identity(node):
                if ctx.allows("Dropout", node) and (bypass(node, source)
                                                    or _as_identity(node, source)):
                    result.count("Dropout")
        return result


def _as_identity(dropout: Node, source: Value) -> bool:
    """A Dropout whose output is a graph output copying a graph input or a weight, which no
    bypass can remove, as an Identity: onnxruntime's own Dropout elimination rewires such a
    node's readers to its one input computed by a node, which is the ratio once precision
    casts it (an fp16 compile returned the ratio 0.5 for the weight 2.0)."""
    graph = dropout.graph
    identity = graph.make_node("Identity", [source], name=dropout.name, before=dropout,
                               dtype=dropout.output.dtype, shape=dropout.output.shape)
    if not replace_value(dropout.output, identity.output):
        graph.remove(identity)
        return False
    graph.remove(dropout)
    return True


@register
class EliminateDeadNodes(Pass):
    name = "EliminateDeadNodes"
    description = "remove nodes and initializers nothing reads (graph outputs always stay)"

    # Asks no rewrite gate: removing what no output depends on can never change an output.
    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        # Inner graphs first: a dead node inside a branch may be the last reader of an outer value.
        for graph in reversed(list(model.graph.all_graphs())):
            for node in reversed(graph.nodes()):
                if not _is_live(node):
                    graph.remove(node)
                    result.count("node")
            for value in list(graph.initializers.values()):
                # A weight that a model before IR 4 lists among its inputs is no input a
                # caller may feed (nor one the export lists once folding adds initializers).
                feedable = value.is_input and value.overridable
                if not feedable and not value.uses and not value.is_graph_output:
                    graph.remove_initializer(value)
                    result.count("initializer")
        return result


def _is_live(node: Node) -> bool:
    return any(v is not None and (v.uses or v.is_graph_output) for v in node.outputs)


def _float_key(value):
    """Float attributes by their float32 bits: 0.0 == -0.0 in Python, yet LeakyRelu with
    alpha -0.0 writes -0.0 where alpha 0.0 writes 0.0."""
    return np.asarray(value, np.float32).tobytes()


def _input_key(value: Value | None):
    """A node input as CSE compares it: small constants by dtype, shape and bytes, anything
    else by identity."""
    if value is None:
        return None
    tensor = value.const
    if tensor is None or not value.is_constant or tensor.size > _SMALL_CONSTANT:
        return id(value)
    data = tensor.numpy()
    # The ONNX element type, not numpy's dtype: the float8 and 4-bit types all read as '<V1',
    # and an INT4 1 beside a UINT4 1 set two CastLikes' output types apart.
    return (int(tensor.dtype), data.shape, data.tobytes())


def _node_key(node: Node):
    """What makes two nodes compute the same thing, or None when they cannot be compared. A
    reduction is keyed by the axes it reduces, however spelled: [-1] and [2] at rank 3."""
    attrs = _attr_key(node)
    if attrs is None:
        return None
    inputs = tuple(_input_key(v) for v in node.inputs)
    if node.op_type in REDUCTIONS:
        axes = reduced_axes(node)
        if axes is not None:
            attrs = tuple(a for a in attrs if a[0] != "axes") + (("reduced", axes),)
            inputs = inputs[:1]
    return (node.domain, node.op_type, node.overload, attrs, len(node.outputs), inputs)


def _attr_key(node: Node):
    parts = []
    for name, attr in sorted(node.attrs.items()):
        value = attr.value
        if attr.type == AttributeProto.TENSOR:
            value = value.digest()
        elif attr.type == AttributeProto.TENSORS:
            value = tuple(t.digest() for t in value)
        elif attr.type in (AttributeProto.FLOAT, AttributeProto.FLOATS):
            value = _float_key(value)
        elif isinstance(value, list):
            value = tuple(value)
        elif attr.type not in (AttributeProto.INT, AttributeProto.STRING):
            return None  # sparse tensors, type protos: too rare to be worth keying
        parts.append((name, attr.type, attr.ref_attr_name, value))
    return tuple(parts)


@register
class EliminateCommonSubexpressions(Pass):
    name = "EliminateCommonSubexpressions"
    description = "merge nodes computing the same op with the same attributes on the same inputs"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        random_calls = random_functions(model)
        for graph in list(model.graph.all_graphs()):
            seen: dict[tuple, Node] = {}
            for node in graph:
                # Two random draws on equal inputs are two different draws.
                if node.subgraphs() or random_reason(node) \
                        or (node.domain, node.op_type) in random_calls:
                    continue
                key = _node_key(node)
                if key is None:
                    continue
                first = seen.get(key)
                if first is None:
                    seen[key] = node
                    continue
                if ctx.allows(node.op_type, node) and self._merge(node, first):
                    result.count(node.op_type)
        return result

    @staticmethod
    def _merge(dup: Node, first: Node) -> bool:
        pairs = [(d, f) for d, f in zip(dup.outputs, first.outputs) if d is not None]
        if any(f is None for _, f in pairs):
            return False
        if any(d.is_graph_output for d, _ in pairs) and len(pairs) > 1:
            return False
        for d, f in pairs:
            if not replace_value(d, f):
                return False
        if not _is_live(dup):
            dup.graph.remove(dup)
        return True


@register
class MergeDuplicateInitializers(Pass):
    name = "MergeDuplicateInitializers"
    description = "share one initializer among initializers with equal dtype, shape and data"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        for graph in list(model.graph.all_graphs()):
            result.count("initializer", self._merge_graph(graph, ctx))
        return result

    @staticmethod
    def _merge_graph(graph: Graph, ctx: PassContext) -> int:
        # Hash in full only tensors whose cheap fingerprints collide: hashing every weight of a
        # large model would cost more than the merge saves. A tensor of a dtype and shape no
        # other has is not even sampled: sampling maps its data, and a 2.2 GB table alone had
        # taken the compile's memory from 140 MB to 2.2 GB.
        alike: dict[tuple, list[Value]] = defaultdict(list)
        for value in graph.initializers.values():
            if value.is_constant and value.sparse_const is None and not value.is_graph_output \
                    and not value.is_input:  # inputs are part of the signature: never removed
                alike[(value.const.dtype, tuple(value.const.shape))].append(value)
        groups: dict[str, list[Value]] = defaultdict(list)
        for values in alike.values():
            for value in values if len(values) > 1 else ():
                groups[value.const.fingerprint()].append(value)
        merged = 0
        for members in groups.values():
            if len(members) < 2:
                continue
            by_digest: dict[str, Value] = {}
            for value in members:
                first = by_digest.setdefault(value.const.digest(), value)
                if first is value:
                    continue
                # The gate takes a node: the duplicate's first reader stands for the merge. One
                # nothing reads is dead, and dropping it cannot change an output.
                readers = value.consumers()
                if readers and not ctx.allows("initializer", readers[0]):
                    continue
                value.replace_all_uses_with(first)
                graph.remove_initializer(value)
                merged += 1
        return merged
