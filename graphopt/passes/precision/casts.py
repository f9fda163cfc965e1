"""Dtype boundaries: shared Casts where a float32 and a half region meet, constants converted
offline, and Cast pairs that cancel (a widening Cast undone by the next one) removed.

One Cast per (value, dtype), shared by every consumer that needs that dtype; a graph output
that became half gets a Cast back to float32 that takes over its name, so the model's
signature never changes.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Graph, Node, Tensor, Value
from graphopt.ir.value import NO_METADATA
from graphopt.passes.edit import replace_value
from graphopt.passes.facts import constant_node_tensor

# Widening casts that a Cast back undoes exactly: every value of the narrow type is a float32.
_EXACT_WIDENING = {(DType.FLOAT16, DType.FLOAT), (DType.BFLOAT16, DType.FLOAT)}


def constant_data(value: Value) -> np.ndarray | None:
    """The data of a weight (an initializer no caller can override, or a Constant node's
    output), else None."""
    if value.is_constant:
        return value.constant()
    node = value.producer
    if node is not None and node.op_type == "Constant" and node.is_onnx:
        tensor = constant_node_tensor(node)
        return None if tensor is None else tensor.numpy()
    return None


def to_half_array(array: np.ndarray, dtype: DType) -> tuple[np.ndarray, int]:
    """`array` in `dtype`, finite values beyond its range clipped to its largest finite value
    (float16 overflows at 65504: a -3.4e38 attention mask must stay a large negative number, not
    become -inf). Returns the array and how many elements were clipped."""
    target = dtype.numpy
    limit = float(np.finfo(np.float16).max) if dtype == DType.FLOAT16 else None
    clipped = 0
    if limit is not None:
        finite = np.isfinite(array)
        over = finite & (np.abs(array) > limit)
        clipped = int(np.count_nonzero(over))
        if clipped:
            array = np.where(over, np.sign(array) * limit, array)
    return np.asarray(array).astype(target), clipped


def _flushed_to_zero(data: np.ndarray, half: np.ndarray) -> tuple[int, int]:
    """How many nonzero elements of `data` its half copy holds as zero (float16's smallest
    step is 6e-8), and how many are nonzero."""
    if data.dtype.kind != "f" or not data.size:
        return 0, 0
    nonzero = data != 0
    return int(np.count_nonzero((half == 0) & nonzero)), int(np.count_nonzero(nonzero))


class Boundaries:
    """Casts and converted constants for one graph, each made once and shared. `constants`
    may be shared with the Boundaries of other graphs of the model: a weight that a nested
    graph reads is converted once, in the graph that holds it."""

    def __init__(self, graph: Graph, half: DType, constants: dict[object, Value] | None = None):
        self.graph, self.half = graph, half
        self._casts: dict[tuple[int, DType], Value] = {}
        self._consts: dict[object, Value] = {} if constants is None else constants
        self.casts_inserted = 0
        self.constants_converted = 0
        self.constants_clipped: list[tuple[str, int]] = []  # (name, elements clipped)
        # Weights that lost over 1% of their nonzero elements below the half range (now
        # zeros): (name, elements lost, nonzero elements). A few tiny values in a trained
        # weight matter little; a weight initialized at 1e-10 vanishes whole.
        self.weights_flushed: list[tuple[str, int, int]] = []

    def half_constant(self, value: Value, data: np.ndarray, clip: bool = True) -> Value:
        """A half-dtype initializer holding `value`'s data, beside `value`. With `clip` off,
        values beyond the half range become infinities, as the model's own Cast to half makes
        them (a Cast that converts with its input leaves that input's rounding to this copy)."""
        key = id(value) if clip else (id(value), "unclipped")
        if key not in self._consts:
            if clip:
                array, clipped = to_half_array(data, self.half)
            else:
                with np.errstate(over="ignore"):
                    array, clipped = np.asarray(data).astype(self.half.numpy), 0
            if clipped:
                self.constants_clipped.append((value.name, clipped))
            flushed, nonzero = _flushed_to_zero(data, array)
            if flushed > nonzero // 100:
                self.weights_flushed.append((value.name, flushed, nonzero))
            owner = value.graph or self.graph
            converted = owner.make_initializer(f"{value.name}_{self.half.short}", Tensor(array))
            self._consts[key] = converted
            self.constants_converted += 1
        return self._consts[key]

    def cast(self, value: Value, dtype: DType) -> Value:
        """`value` cast to `dtype`, by a Cast placed right after its producer (first in the graph
        for a graph input). A graph output cast back to float32 hands its name to the Cast."""
        key = (id(value), dtype)
        if key in self._casts:
            return self._casts[key]
        graph = self.graph
        takes_name = value.is_graph_output and dtype == DType.FLOAT
        if takes_name:
            name = value.name
            value.name = graph.fresh_name(f"{name}_{value.dtype.short}")
            out = Value(name, dtype, value.shape)
            # The output's declaration is the model's interface: its doc and metadata go along.
            out.doc_string, out.metadata_props = value.doc_string, value.metadata_props
            value.doc_string, value.metadata_props = "", NO_METADATA
        else:
            out = Value(graph.fresh_name(f"{value.name}_{dtype.short}"), dtype, value.shape)
        node = Node("Cast", [value], {"to": int(dtype)}, outputs=[out],
                    name=graph.fresh_node_name(f"{out.name}_cast"))
        producer = value.producer if value.producer is not None and value.producer.graph is graph \
            else None
        if producer is not None:
            graph.insert_after(producer, node)
        else:
            first = graph.nodes()[0] if len(graph) else None
            graph.insert_before(first, node) if first is not None else graph.append(node)
        if takes_name:
            graph.outputs = [out if o is value else o for o in graph.outputs]
        self._casts[key] = out
        self.casts_inserted += 1
        return out


def collapse_cast_pairs(graph: Graph) -> int:
    """Remove Cast(B→A) of Cast(A→B) when A→B widens exactly (f16→f32→f16): its output is
    the first Cast's input; and Casts to their input's own dtype. Returns the Casts removed."""
    removed = 0
    for node in graph:
        if node.op_type != "Cast" or not node.is_onnx:
            continue
        if node.input(0).dtype == node.output.dtype and replace_value(node.output, node.input(0)):
            graph.remove(node)  # a Cast whose `to` became its input's dtype
            removed += 1
            continue
        inner = node.input(0).producer
        if inner is None or inner.op_type != "Cast" or not inner.is_onnx or inner.graph is not graph:
            continue
        source = inner.input(0)
        widening = (source.dtype, inner.output.dtype)
        if widening not in _EXACT_WIDENING or DType(node.attr("to")) != source.dtype:
            continue
        if not replace_value(node.output, source):
            continue
        graph.remove(node)
        removed += 1
        if not inner.output.uses and not inner.output.is_graph_output:
            graph.remove(inner)
            removed += 1
    return removed
