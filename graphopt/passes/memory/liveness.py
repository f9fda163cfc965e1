"""Liveness: where each tensor lives (arena, caller, weights), its byte size, and its lifetime —
the step that defines it and the last step that reads it — over a schedule.

Rules:
- A schedule is a topological order of the main graph's nodes (default: the graph's order);
  step i runs schedule[i]. A tensor defined at step d and last read at step u is live in [d, u];
  a tensor nothing reads is live at its own step only (the kernel still writes it).
- Graph inputs and outputs are caller-owned: counted in input/output bytes, never in the arena.
- Initializers are weight memory. So are the outputs of constant subgraphs (deterministic ONNX ops
  whose inputs are all weights, e.g. ConstantOfShape of a constant shape): constant folding
  computes them once, at compile or load time (`fold_constants=False` plans them as activations).
- A node holding subgraphs (If, Loop, Scan) is one step; the outer values its bodies read are
  read at that step. Values inside the bodies are the runtime's business, not the plan's.
- Every tensor the plan accounts for needs a static size. An unknown one (symbolic or unknown dim,
  unknown dtype, a sequence or string) raises `MemoryPlanError` naming the value and its producer:
  a fixed work buffer cannot be sized from it, so the caller must pin the input shapes first.
- On an NPU partition (given its `DeviceFormats`), a tensor the device stores in a blocked format
  (NC1HWC0, FRACTAL_NZ, …) takes that format's padded bytes, and so does a weight converted
  offline; each TransData's copy `T@FORMAT` is an arena tensor of its own, written at the step
  that produces T (from the first step, for a partition input) and live to its last reader.
  Caller-owned inputs and outputs stay ND: the host hands them over and takes them back so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.errors import GraphoptError
from graphopt.ir import Graph, Model, Node, Value
from graphopt.ir.dtypes import DType, nbytes
from graphopt.ir.graph import captured_values

if TYPE_CHECKING:
    from graphopt.partition.format_bytes import DeviceFormats

ARENA, INPUT, OUTPUT, WEIGHT = "arena", "input", "output", "weight"
ND = "ND"  # the plain layout: no device format
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                        "Multinomial", "Bernoulli"})
# Ops onnxruntime runs at every inference even on constant inputs. Its constant folding skips
# DequantizeLinear, so a QDQ model's int8 weight stays int8: the weight bytes are the int8
# initializer's. Its dequantized copy takes no memory when int8 layers read it (fused_dequantize),
# else it is a tensor of the arena.
UNFOLDED_OPS = RANDOM_OPS | {"DequantizeLinear"}
_INT8_LAYERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "FusedConv"})


def _read_by_int8_layers(node: Node, kind: dict, source: str) -> list | None:
    """The uses of what `node` dequantizes, when it is a DequantizeLinear of a `source` value
    (by `kind`) read by int8 layers (Conv/Gemm/MatMul) alone; else None."""
    if node.op_type != "DequantizeLinear" or not node.is_onnx \
            or kind.get(node.inputs[0]) != source:
        return None
    out = node.outputs[0]
    if out is None or out.is_graph_output or not out.uses:
        return None
    uses = list(out.uses)
    return uses if all(use.node.op_type in _INT8_LAYERS for use in uses) else None


def _dequantized(value: Value | None) -> bool:
    return value is not None and value.producer is not None \
        and value.producer.op_type == "DequantizeLinear"


def fused_dequantize(node: Node, kind: dict) -> bool:
    """Whether `node` dequantizes a weight (by `kind`) that only int8 layers read (Conv/Gemm/
    MatMul whose data input is dequantized too): onnxruntime fuses it into QLinearConv and its
    kin, AMCT into the NPU's int8 kernel, so its float result never exists."""
    uses = _read_by_int8_layers(node, kind, WEIGHT)
    return uses is not None and all(use.index != 0 and _dequantized(use.node.inputs[0])
                                    for use in uses)


def fused_activation_dequantize(node: Node, kind: dict) -> bool:
    """Whether `node` dequantizes an 8-bit activation that only int8 layers read, each with a
    dequantized other operand: the int8 kernel (QLinearConv and its kin, AMCT's NPU kernel)
    reads the 8-bit data itself, so the float copy never exists; the 8-bit input lives on
    until those layers have read it."""
    uses = _read_by_int8_layers(node, kind, ARENA)
    return uses is not None and all(use.index in (0, 1)
                                    and _dequantized(use.node.input(1 - use.index))
                                    for use in uses)


class MemoryPlanError(GraphoptError):
    """The graph cannot be planned (unknown size, bad schedule) or a plan is wrong."""


@dataclass(frozen=True)
class Lifetime:
    value: Value
    kind: str
    nbytes: int
    first: int
    last: int


def main_graph(model: Model | Graph) -> Graph:
    return model.graph if isinstance(model, Model) else model


def describe(value: Value) -> str:
    """'%x (output 0 of Conv 'conv1')' — enough for a user to find the value."""
    node = value.producer
    if node is None:
        where = ("graph input" if value.is_input
                 else "initializer" if value.const is not None else "value")
        return f"%{value.name} ({where})"
    label = f" '{node.name}'" if node.name else ""
    return f"%{value.name} (output {value.index} of {node.qualified_op}{label})"


def tensor_bytes(value: Value) -> int:
    """Static byte size of a tensor value, or MemoryPlanError naming it."""
    if value.const is not None:
        return value.const.nbytes
    reason, hint = None, ""
    if not value.is_tensor:
        reason = "is not a tensor (sequence, optional or map): its size is only known at run time"
    elif value.dtype == DType.STRING:
        reason = "holds strings, whose bytes are only known at run time"
    elif value.dtype is None or value.dtype == DType.UNDEFINED:
        reason = "has an unknown element type"
    elif value.static_shape is None:
        dims = "unknown rank" if value.shape is None else \
            "[" + ",".join("?" if d is None else str(d) for d in value.shape) + "]"
        reason = f"has shape {dims}"
        hint = _dynamic_shape_hint(value)
    if reason:
        raise MemoryPlanError(f"cannot plan memory: {describe(value)} {reason}{hint}")
    return nbytes(value.dtype, math.prod(value.static_shape))


def _dynamic_shape_hint(value: Value) -> str:
    """What would size `value`: pinning the model's open inputs, or nothing a caller can pin
    when every input is static already (a Resize to sizes read from an input's values). The
    .om stores the text, so it names the option both ways: an artifact compiled from Python
    and one compiled by the command line are the same bytes."""
    root = value.graph.root if value.graph is not None else None
    if root is not None and all(v.static_shape is not None or v.is_constant
                                for v in root.inputs):
        return ("; every input is static already: the shape depends on values the model "
                "computes at run time, which pinning the input shapes cannot fix (unless the "
                "compile left shapes unfolded: -O0/-O1, or FoldConstants off)")
    from graphopt.compile_checks import PIN_OPTIONS

    pin = ("give every dim of the inputs values (--dynamic-dims, or dynamic_dims in Python)"
           if "dynamic_dims" in PIN_OPTIONS.get() else  # a shape profile's compile
           "pin the input shapes (--input-shape, or input_shapes in Python)")
    # Said alike at every level: the .om keeps the text, not the level it was made at.
    return (f"; {pin}: the shape folding of -O2 and above then sizes it (a shape computed at "
            "run time stays unknown at -O0/-O1 or with FoldConstants off)")


def node_reads(node: Node) -> list[Value]:
    """Distinct values a node reads: its inputs, then outer values its subgraphs capture."""
    reads = [value for value in node._inputs if value is not None]
    subs = node.subgraphs() if node.attrs else ()
    if not subs and (len(reads) < 2 or len(reads) == 2 and reads[0] is not reads[1]):
        return reads  # most nodes: one or two distinct inputs, no subgraph (3 calls per node)
    seen: dict[int, Value] = {}
    for value in reads:
        seen.setdefault(id(value), value)
    for sub in subs:
        for value in captured_values(sub):
            seen.setdefault(id(value), value)
    return list(seen.values())


def classify(graph: Graph, *, fold_constants: bool = True) -> dict[Value, str]:
    """Storage class of every main-graph value: ARENA, INPUT, OUTPUT or WEIGHT."""
    kind: dict[Value, str] = {}
    for value in graph.initializers.values():
        kind[value] = WEIGHT
    for value in graph.inputs:
        kind.setdefault(value, INPUT)
    outputs = {id(v) for v in graph.outputs}
    for node in graph.nodes():
        constant = fused_dequantize(node, kind) or (
            fold_constants and node.is_onnx and node.op_type not in UNFOLDED_OPS
            and all(kind.get(v) == WEIGHT for v in node_reads(node)))
        for value in node.outputs:
            if value is None:
                continue
            kind[value] = OUTPUT if id(value) in outputs else WEIGHT if constant else ARENA
    return kind


def check_schedule(graph: Graph, schedule: Sequence[Node] | None) -> list[Node]:
    """The schedule as a list, checked to hold every node once, each after its producers."""
    nodes = graph.nodes()
    if schedule is None:
        order = nodes
    else:
        order = list(schedule)
        if len(order) != len(nodes) or {id(n) for n in order} != {id(n) for n in nodes}:
            raise MemoryPlanError(f"schedule has {len(order)} node(s) but graph '{graph.name}' has "
                                  f"{len(nodes)}: a schedule must hold each node exactly once")
    step = {id(n): i for i, n in enumerate(order)}
    for i, node in enumerate(order):
        for value in node_reads(node):
            producer = outer_producer(value, graph)
            if producer is not None and step[id(producer)] >= i:
                raise MemoryPlanError(
                    f"schedule runs {node.qualified_op} '{node.name}' at step {i} before "
                    f"{describe(value)} is computed at step {step[id(producer)]}")
    return order


def outer_producer(value: Value, graph: Graph) -> Node | None:
    """The node of `graph` computing `value`, directly or as the holder of its subgraph."""
    node = value.producer
    while node is not None and node.graph is not graph:
        node = node.graph.parent if node.graph is not None else None
    return node


@dataclass(frozen=True)
class Copy:
    """A TransData's copy of `original` in another device format (a value of no graph): the
    node that writes it (none: a partition input's, written as the partition starts) and the
    nodes that read it. An arena original read through copies dies once they are written."""

    original: Value
    writers: list[Node]
    readers: list[Node]


@dataclass
class Liveness:
    """Lifetimes of a graph's values over one schedule."""

    graph: Graph
    schedule: list[Node]
    kind: dict[Value, str]
    nbytes: dict[Value, int]      # every input, output, weight and node output
    first: dict[Value, int]       # node outputs only (and TransData copies)
    last: dict[Value, int]
    step: dict[Node, int]
    # TransData copies, values of no graph, by copy
    copies: dict[Value, Copy] = field(default_factory=dict)
    # The device format of each value stored in one (ND where absent): no view or in-place
    # handover joins two formats, whose bytes mean different elements
    device_format: dict[Value, str] = field(default_factory=dict)

    def lifetime(self, value: Value) -> Lifetime:
        return Lifetime(value, self.kind[value], self.nbytes[value], self.first[value],
                        self.last[value])

    def lifetimes(self, kind: str = ARENA) -> list[Lifetime]:
        """Node outputs of one storage class, in definition order."""
        return [self.lifetime(v) for v in self.first if self.kind[v] == kind]

    def bytes_of(self, kind: str) -> int:
        return sum(n for v, n in self.nbytes.items() if self.kind[v] == kind)


def liveness(model: Model | Graph, schedule: Sequence[Node] | None = None, *,
             fold_constants: bool = True, formats: DeviceFormats | None = None) -> Liveness:
    graph = main_graph(model)
    order = check_schedule(graph, schedule)
    kind = classify(graph, fold_constants=fold_constants)
    fused = {node.outputs[0] for node in graph.nodes() if fused_dequantize(node, kind)}
    absorbed = {node.outputs[0]: node.inputs[0] for node in graph.nodes()
                if fused_activation_dequantize(node, kind)}
    fused |= set(absorbed)
    sizes = {value: 0 if value in fused else tensor_bytes(value) for value in kind}
    step = {node: i for i, node in enumerate(order)}
    first: dict[Value, int] = {}
    last: dict[Value, int] = {}
    for i, node in enumerate(order):
        for value in node.outputs:
            if value is not None:
                first[value] = last[value] = i
    for i, node in enumerate(order):
        for value in node_reads(node):
            if value in last and last[value] < i:
                last[value] = i
    for out, data in absorbed.items():  # the int8 data lives until the int8 layers read it
        if data in last and out in last:
            last[data] = max(last[data], last[out])
    copies = _device_formats(graph, kind, sizes, formats) if formats is not None else {}
    stored = {v: formats.stored[v.name] for v in kind if v.name in formats.stored} \
        if formats is not None else {}
    for copy, made in copies.items():
        kind[copy] = ARENA
        first[copy] = step[made.writers[0]] if made.writers else 0
        last[copy] = max([step[n] for n in made.readers], default=first[copy])
    served = served_by_copies(copies, kind)
    if served:  # an original read through copies lives to its other readers only
        for original in served:
            last[original] = first[original]
        for i, node in enumerate(order):
            for value in node_reads(node):
                if value in served and node not in served[value]:
                    last[value] = max(last[value], i)
    first = {v: first[v] for v in sorted(first, key=first.__getitem__)}
    return Liveness(graph, order, kind, sizes, first, last, step, copies, stored)


def served_by_copies(copies: dict[Value, Copy], kind: dict[Value, str]
                     ) -> dict[Value, set[Node]]:
    """The readers of each arena tensor that read a copy of it instead (its TransData's)."""
    served: dict[Value, set[Node]] = {}
    for made in copies.values():
        if kind.get(made.original) == ARENA and made.writers:
            served.setdefault(made.original, set()).update(made.readers)
    return served


def _device_formats(graph: Graph, kind: dict[Value, str], sizes: dict[Value, int],
                    formats: DeviceFormats) -> dict[Value, Copy]:
    """Size the arena tensors and weights `formats` stores blocked at their padded bytes (in
    `sizes`); return the TransData copies as values of their own, with the node that writes
    each (its tensor's producer; none for a partition input's, converted as the partition
    starts) and the nodes that read it."""
    from graphopt.partition.format_bytes import format_nbytes

    by_name = {value.name: value for value in kind}
    readers_of: dict[Value, list[Node]] = {}
    for node in graph.nodes():
        for value in node_reads(node):
            readers_of.setdefault(value, []).append(node)
    for value in list(sizes):
        if kind[value] == ARENA and value.name in formats.stored and sizes[value]:
            sizes[value] = format_nbytes(formats.stored[value.name], value.static_shape,
                                         value.dtype)
    for name, fmt in formats.weights.items():
        value = by_name.get(name)
        if value is None or value.static_shape is None:
            continue
        group = max((int(n.attr("group", 1)) for n in readers_of.get(value, [])
                     if n.op_type in ("Conv", "FusedConv")), default=1)
        producer = value.producer
        if not sizes.get(value) and producer is not None and producer.op_type == \
                "DequantizeLinear":  # fused: the int8 weight itself is stored in the format
            value = producer.inputs[0]
        if kind.get(value) == WEIGHT and value.static_shape is not None:
            sizes[value] = format_nbytes(fmt, value.static_shape, value.dtype, group)
    copies: dict[Value, Copy] = {}
    for name, have, want, labels in formats.conversions:
        value = by_name.get(name)
        if value is None or value.static_shape is None or value.dtype is None:
            continue
        inside = readers_of.get(value, [])
        readers = [n for n in inside if (n.name or n.op_type) in labels]
        leaving = bool(set(labels) - {n.name or n.op_type for n in inside})
        writers = [value.producer] if value.producer is not None \
            and value.producer.graph is graph else []
        wanted = []
        # The partition's own readers get a copy in their format, unless it is the ND output
        # the caller or the host takes, which is there for them to read (caller memory).
        if readers and not (want == ND and kind[value] == OUTPUT):
            wanted.append((want, readers))
        # An output the device made blocked: the arena holds that original until it is
        # converted, and for the readers that take it as it is.
        if leaving and kind[value] == OUTPUT and writers:
            wanted.append((have, [n for n in inside if n not in readers]))
        for fmt, read_by in wanted:
            copy = Value(f"{name}@{fmt}", value.dtype, value.shape)
            sizes[copy] = format_nbytes(fmt, value.static_shape, value.dtype)
            copies[copy] = Copy(value, writers, read_by)
    return copies
