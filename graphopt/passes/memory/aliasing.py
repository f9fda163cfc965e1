"""Storage sharing: view groups (fixed by the graph) and in-place reuse (decided per schedule).

View ops (Reshape, Squeeze, Unsqueeze, Flatten, Identity) only relabel their input's bytes, so
their output joins the input's *group*: one storage that lives as long as any member is read.
A view of a graph input or a weight is a view of caller or weight memory and takes no arena.

In place: when an elementwise op (Add, Relu, Clip, Cast to the same width, …) reads a group for
the last time, and the input it reads has the output's byte size and shape (no broadcasting of
that input), the output may be written over that input:

    step i:   y = Relu(x)        x's group has no reader after step i
              ┌──── x ────┐
              │           ├──── y ────┐     one buffer: [first(x), last(y)]
              └───────────┴───────────┘

Whether x dies at step i depends on the schedule, so in-place pairs are chosen while walking a
schedule (`Storage.assign`); the scheduler makes the same choice through `inplace_choice`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from graphopt.ir import Graph, Node, Value
from graphopt.passes.memory.buffers import Buffer, align_up
from graphopt.passes.memory.liveness import ARENA, Copy, node_reads, served_by_copies

VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})

_UNARY = ("Relu", "Sigmoid", "Tanh", "Erf", "Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal",
          "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Not", "Elu", "Selu", "Softplus",
          "Softsign", "HardSigmoid", "HardSwish", "Mish", "Cast", "Clip", "LeakyRelu", "PRelu",
          "ThresholdedRelu", "Celu", "Gelu", "IsNaN", "BatchNormalization")
_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater",
           "Less", "GreaterOrEqual", "LessOrEqual", "BitShift")
# (domain, op) -> input indexes whose storage the output may take; None: any input.
INPLACE_OPS: dict[tuple[str, str], tuple[int, ...] | None] = {
    **{("", op): (0,) for op in _UNARY},
    **{("", op): (0, 1) for op in _BINARY},
    **{("", op): None for op in ("Sum", "Max", "Min", "Mean")},
    ("", "Where"): (1, 2),
    **{("com.microsoft", op): (0,) for op in ("Gelu", "FastGelu", "QuickGelu", "BiasGelu")},
}


@dataclass
class Group:
    """Values sharing one storage whatever the schedule: a root and the views of it."""

    id: int
    root: Value
    kind: str
    nbytes: int
    members: list[Value] = field(default_factory=list)


def view_source(node: Node, kind: dict[Value, str], nbytes: dict[Value, int],
                device_format: Mapping[Value, str] | None = None) -> Value | None:
    """The input whose bytes `node`'s output relabels, or None when it must be a copy (the
    output is caller-owned or a weight, or the sizes or the device formats disagree)."""
    if not node.is_onnx or node.op_type not in VIEW_OPS or len(node.outputs) != 1:
        return None
    x, y = node.input(0), node.outputs[0]
    if x is None or y is None or kind.get(y) != ARENA or x not in nbytes:
        return None
    if device_format and device_format.get(x) != device_format.get(y):
        return None
    return x if nbytes[x] == nbytes[y] else None


def _inplace_inputs(node: Node, out: Value, kind: dict[Value, str],
                    nbytes: dict[Value, int],
                    device_format: Mapping[Value, str] | None = None) -> list[Value]:
    """Inputs of `node` whose storage `out` may take once they die (order-independent checks):
    of its shape, element width and device format."""
    domain = "" if node.is_onnx else node.domain
    if (domain, node.op_type) not in INPLACE_OPS or kind.get(out) != ARENA:
        return []
    if node.op_type == "BatchNormalization" and len(node.outputs) != 1:
        return []  # training mode also writes running statistics
    allowed = INPLACE_OPS[(domain, node.op_type)]
    result = []
    for index, x in enumerate(node.inputs):
        if x is None or (allowed is not None and index not in allowed) or x in result:
            continue
        if (x.static_shape == out.static_shape and nbytes.get(x) == nbytes[out]
                and x.dtype is not None and out.dtype is not None
                and x.dtype.bits == out.dtype.bits
                and (not device_format or device_format.get(x) == device_format.get(out))):
            result.append(x)
    return result


class Storage:
    """The graph's storage model, independent of the order: groups, and per node (by position
    in `nodes`) the arena groups it reads, the arena groups it defines, and its in-place
    candidates [(output group, [(input group, input value), …]), …]."""

    def __init__(self, graph: Graph, kind: dict[Value, str], nbytes: dict[Value, int], *,
                 alignment: int, inplace: bool = True,
                 copies: Mapping[Value, Copy] | None = None,
                 device_format: Mapping[Value, str] | None = None):
        self.graph, self.kind, self.alignment = graph, kind, alignment
        self.nodes = graph.nodes()
        self.index = {node: i for i, node in enumerate(self.nodes)}
        self.groups: list[Group] = []
        self.group_of: dict[Value, Group] = {}
        self.view_of: dict[Value, Value] = {}
        for value in kind:
            if value.producer is None:
                self._new_group(value, nbytes)
        for node in self.nodes:
            source = view_source(node, kind, nbytes, device_format)
            for value in node.outputs:
                if value is None:
                    continue
                if source is not None:
                    group = self.group_of[source]
                    group.members.append(value)
                    self.group_of[value] = group
                    self.view_of[value] = source
                else:
                    self._new_group(value, nbytes)
        self.size = [align_up(g.nbytes, alignment) for g in self.groups]
        self.reads: list[tuple[int, ...]] = []
        self.defines: list[tuple[int, ...]] = []
        self.candidates: list[list[tuple[int, list[tuple[int, Value]]]]] = []
        self.readers = [0] * len(self.groups)
        for node in self.nodes:
            reads = tuple(dict.fromkeys(
                self.group_of[v].id for v in node_reads(node)
                if v in self.group_of and self.group_of[v].kind == ARENA))
            for g in reads:
                self.readers[g] += 1
            self.reads.append(reads)
            outs = [v for v in node.outputs if v is not None]
            roots = [self.group_of[v] for v in outs if self.group_of[v].root is v]
            self.defines.append(tuple(g.id for g in roots if g.kind == ARENA))
            cands = []
            if inplace:
                for v in outs:
                    if self.group_of[v].root is v:
                        inputs = [(self.group_of[x].id, x)
                                  for x in _inplace_inputs(node, v, kind, nbytes,
                                                           device_format)
                                  if self.group_of[x].kind == ARENA]
                        if inputs:
                            cands.append((self.group_of[v].id, inputs))
            self.candidates.append(cands)
        # TransData copies (liveness): written by their tensor's producer, or, a partition
        # input's, as the partition starts.
        self.at_start: list[int] = []
        for copy, made in (copies or {}).items():
            g = self.group_of[copy].id
            for node in made.writers:
                self.defines[self.index[node]] += (g,)
            if not made.writers:
                self.at_start.append(g)
            for node in made.readers:
                self.reads[self.index[node]] += (g,)
                self.readers[g] += 1
        # A reader served by a copy reads the copy, not the original: the original's group
        # dies once its copies are written (it may take no reader's place in place either).
        for original, served in served_by_copies(dict(copies or {}), kind).items():
            g = self.group_of[original].id
            for node in served:
                n = self.index[node]
                others = [v for v in node_reads(node)
                          if v is not original and self.group_of.get(v) is self.groups[g]]
                if g in self.reads[n] and not others:
                    self.reads[n] = tuple(x for x in self.reads[n] if x != g)
                    self.readers[g] -= 1
                self.candidates[n] = [(out, [(i, x) for i, x in ins if x is not original])
                                      for out, ins in self.candidates[n]]
                self.candidates[n] = [(out, ins) for out, ins in self.candidates[n] if ins]

    def _new_group(self, value: Value, nbytes: dict[Value, int]) -> None:
        group = Group(len(self.groups), value, self.kind[value], nbytes[value], [value])
        self.groups.append(group)
        self.group_of[value] = group

    def inplace_choice(self, n: int, remaining: Sequence[int]) -> list[tuple[int, int, Value]]:
        """(output group, input group, input value) pairs node `n` writes in place, given each
        group's count of readers not yet run (node `n` included): an input group qualifies when
        `n` is its last reader, and each is taken by one output at most."""
        chosen: list[tuple[int, int, Value]] = []
        for out_g, inputs in self.candidates[n]:
            for g, x in inputs:
                if remaining[g] == 1 and all(c[1] != g for c in chosen):
                    chosen.append((out_g, g, x))
                    break
        return chosen

    def assign(self, order: Sequence[Node]) -> "Assignment":
        """Walk `order` (a checked schedule): group lifetimes, in-place pairs, and the buffers
        the strategies place (in-place chains merged)."""
        first = [-1] * len(self.groups)
        last = [-1] * len(self.groups)
        remaining = list(self.readers)
        parent = list(range(len(self.groups)))  # in-place chains, output -> input group
        inplace: dict[Value, Value] = {}
        for g in self.at_start:
            first[g] = last[g] = 0
        for step, node in enumerate(order):
            n = self.index[node]
            for out_g, g, x in self.inplace_choice(n, remaining):
                parent[out_g] = g
                inplace[self.groups[out_g].root] = x
            for g in self.defines[n]:
                first[g] = last[g] = step
            for g in self.reads[n]:
                remaining[g] -= 1
                last[g] = step
        buffer_of: dict[int, int] = {}
        buffers: list[Buffer] = []
        planned = [g for g in range(len(self.groups)) if first[g] >= 0]
        for g in sorted(planned, key=first.__getitem__):  # an input group before its taker
            if parent[g] == g:
                buffer_of[g] = len(buffers)
                buffers.append(Buffer(len(buffers), self.size[g], first[g], last[g],
                                      self.groups[g].nbytes, self.groups[g].root.name))
            else:
                buffer_of[g] = b = buffer_of[parent[g]]
                buffers[b].last = max(buffers[b].last, last[g])
        return Assignment(self, buffers, buffer_of, inplace, first, last)


@dataclass
class Assignment:
    storage: Storage
    buffers: list[Buffer]
    buffer_of: dict[int, int]        # arena group id -> buffer id
    inplace: dict[Value, Value]      # output -> the input whose storage it took
    first: list[int]                 # per group (-1: not in the arena)
    last: list[int]

    def buffer(self, value: Value) -> int | None:
        group = self.storage.group_of.get(value)
        return None if group is None else self.buffer_of.get(group.id)


def is_external_view(storage: Storage, value: Value) -> bool:
    """A view whose storage is caller or weight memory."""
    group = storage.group_of.get(value)
    return group is not None and group.root is not value and group.kind != ARENA

