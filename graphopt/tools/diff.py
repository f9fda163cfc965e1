"""Structural diff of two models: nodes removed, added and changed, initializers, op-type counts."""

from __future__ import annotations

import difflib
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from onnx import FunctionProto, ModelProto

from graphopt.errors import InputError
from graphopt.ir import Graph, Model, Node, Value, format_node, load_onnx
from graphopt.ir.printer import format_type
from graphopt.option_names import setting


@dataclass
class NodeEntry:
    """A node only one side has. `scope` locates nodes of nested graphs ("" for the main graph)."""

    name: str
    op: str
    line: str
    scope: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "scope": self.scope, "line": self.line}


@dataclass
class NodeChange:
    """A node both sides have (see `diff_models` for how they pair up) whose line differs."""

    name: str                 # B's node name
    name_before: str          # A's, which differs when a rewrite rebuilt the node
    op_before: str
    op_after: str
    before: str
    after: str
    scope: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "name_before": self.name_before, "op_before": self.op_before,
                "op_after": self.op_after, "scope": self.scope, "before": self.before,
                "after": self.after}


@dataclass
class ValueChange:
    """An initializer or graph input/output on one or both sides; type None: absent there."""

    name: str
    type_before: str | None
    type_after: str | None

    def to_json(self) -> dict:
        return {"name": self.name, "type_before": self.type_before, "type_after": self.type_after}


@dataclass
class FunctionChange:
    """A model-local function only one side has, or whose body or signature differs."""

    name: str                 # domain::name, with ":overload" when it has one
    change: str               # "removed", "added" or "changed"
    lines: list[str] = field(default_factory=list)  # a changed one's printed lines, -/+

    def to_json(self) -> dict:
        return {"name": self.name, "change": self.change, "lines": self.lines}


@dataclass
class GraphDiff:
    label_a: str
    label_b: str
    nodes_a: int
    nodes_b: int
    removed: list[NodeEntry] = field(default_factory=list)
    added: list[NodeEntry] = field(default_factory=list)
    changed: list[NodeChange] = field(default_factory=list)
    initializers_removed: list[ValueChange] = field(default_factory=list)
    initializers_added: list[ValueChange] = field(default_factory=list)
    initializers_changed: list[ValueChange] = field(default_factory=list)  # new data or type
    io_changed: list[ValueChange] = field(default_factory=list)  # "input x" / "output y"
    # Opset versions by domain ("" is ai.onnx): the same node means another op at another
    # version; None: the side imports no such domain.
    opsets_changed: list[ValueChange] = field(default_factory=list)
    functions_changed: list[FunctionChange] = field(default_factory=list)
    # (scope, name in A, name in B) of nodes alike but for their names: --quant-skip,
    # --keep-dtype and bisect's anchors select by name.
    renamed: list[tuple[str, str, str]] = field(default_factory=list)
    # The model's ir_version and metadata_props (graphopt.lossy_passes changes how compare
    # judges it), by key; None: the side has no such property.
    properties_changed: list[ValueChange] = field(default_factory=list)
    op_counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    unrelated: bool = False  # no input and no output name in common: maybe two models

    @property
    def empty(self) -> bool:
        return not (self.removed or self.added or self.changed or self.initializers_removed
                    or self.initializers_added or self.initializers_changed or self.io_changed
                    or self.opsets_changed or self.functions_changed or self.renamed
                    or self.properties_changed)

    def op_deltas(self) -> list[tuple[str, int, int, int]]:
        """(op, count A, count B, B - A) for the op types whose count differs."""
        return [(op, a, b, b - a) for op, (a, b) in sorted(self.op_counts.items()) if a != b]

    def to_json(self) -> dict:
        return {
            "a": self.label_a, "b": self.label_b,
            "nodes": {"a": self.nodes_a, "b": self.nodes_b},
            "removed": [e.to_json() for e in self.removed],
            "added": [e.to_json() for e in self.added],
            "changed": [c.to_json() for c in self.changed],
            "initializers": {"removed": [v.to_json() for v in self.initializers_removed],
                             "added": [v.to_json() for v in self.initializers_added],
                             "changed": [v.to_json() for v in self.initializers_changed]},
            "io_changed": [v.to_json() for v in self.io_changed],
            "opsets_changed": [{"domain": v.name, "a": v.type_before, "b": v.type_after}
                               for v in self.opsets_changed],
            "functions_changed": [f.to_json() for f in self.functions_changed],
            "renamed": [{"scope": s, "a": a, "b": b} for s, a, b in self.renamed],
            "properties_changed": [{"property": v.name, "a": v.type_before, "b": v.type_after}
                                   for v in self.properties_changed],
            "unrelated": self.unrelated,
            "op_counts": [{"op": op, "a": a, "b": b, "delta": b - a}
                          for op, (a, b) in sorted(self.op_counts.items())],
        }


def load_for_diff(path: str | os.PathLike) -> Model:
    """An .onnx model or ONNX dump; printed-IR dumps are refused with the way to get ONNX ones."""
    path = os.fspath(path)
    if path.endswith(".txt"):
        raise InputError(f"{path}: a printed-IR dump cannot be read back; dump with "
                         f"`{setting('dump_format', 'onnx')}` (or both) and diff the .onnx "
                         "files")
    return load_onnx(path)


def diff_models(a: Model | ModelProto, b: Model | ModelProto, *, label_a: str = "A",
                label_b: str = "B") -> GraphDiff:
    """What changed from `a` to `b`. Nodes pair up by name where the name is unique on both
    sides; then by (op type, input names, output names); then a node rebuilt by a rewrite
    (same op reading the corresponding data input, as a fused Conv replaces its Conv) pairs
    with the one it replaced. A pair whose printed line (the name aside) differs is a change."""
    a = a if isinstance(a, Model) else load_onnx(a)
    b = b if isinstance(b, Model) else load_onnx(b)
    nodes_a, nodes_b = list(_walk(a.graph)), list(_walk(b.graph))
    diff = GraphDiff(label_a, label_b, len(nodes_a), len(nodes_b))
    pairs, only_a, only_b = _match(nodes_a, nodes_b)
    for (scope, na), (_, nb) in pairs:
        before, after = format_node(na), format_node(nb)
        # A new name alone is no change, nor a type one side leaves unknown (an import infers
        # every value's type: a model against its first dump would be all changes).
        if (format_node(na, name=False) != format_node(nb, name=False)
                and not _only_inferred(na, nb)):
            diff.changed.append(NodeChange(nb.name, na.name, na.qualified_op, nb.qualified_op,
                                           before, after, scope))
        elif na.name != nb.name:  # a name cleared or given selects otherwise too
            diff.renamed.append((scope, na.name, nb.name))
    diff.removed = [NodeEntry(n.name, n.qualified_op, format_node(n), s) for s, n in only_a]
    diff.added = [NodeEntry(n.name, n.qualified_op, format_node(n), s) for s, n in only_b]
    _diff_initializers(a, b, diff)
    _diff_io(a.graph, b.graph, diff)
    _diff_opsets(a, b, diff)
    _diff_properties(a, b, diff)
    _diff_functions(a, b, diff)
    count_a = Counter(n.qualified_op for _, n in nodes_a)
    count_b = Counter(n.qualified_op for _, n in nodes_b)
    diff.op_counts = {op: (count_a[op], count_b[op]) for op in count_a.keys() | count_b.keys()}
    return diff


Located = tuple[str, Node]


def _walk(graph: Graph, scope: str = "") -> Iterator[Located]:
    for node in graph:
        yield scope, node
        for attr in sorted(node.attrs.values(), key=lambda attr: attr.name):
            for sub in attr.graphs():
                yield from _walk(sub, f"{scope}{node.name or node.op_type}.{attr.name}/")


def _match(nodes_a: list[Located], nodes_b: list[Located]):
    """(pairs, only in a, only in b), each list in its side's node order."""
    def unique_names(nodes: list[Located]) -> dict[tuple[str, str], Node]:
        seen = Counter((s, n.name) for s, n in nodes if n.name)
        return {(s, n.name): n for s, n in nodes if n.name and seen[(s, n.name)] == 1}

    names_b = unique_names(nodes_b)
    pairs: list[tuple[Located, Located]] = []
    paired_a: set[int] = set()
    paired_b: set[int] = set()
    for key, node in unique_names(nodes_a).items():
        other = names_b.get(key)
        if other is not None:
            pairs.append(((key[0], node), (key[0], other)))
            paired_a.add(id(node))
            paired_b.add(id(other))
    # Unnamed or renamed nodes: the same op reading and writing the same values is the same node.
    by_structure: dict[tuple, list[Node]] = defaultdict(list)
    for scope, node in nodes_b:
        if id(node) not in paired_b:
            by_structure[_structure(scope, node)].append(node)
    for scope, node in nodes_a:
        if id(node) in paired_a:
            continue
        candidates = by_structure.get(_structure(scope, node))
        if candidates:
            other = candidates.pop(0)
            pairs.append(((scope, node), (scope, other)))
            paired_a.add(id(node))
            paired_b.add(id(other))
    _match_rebuilt(nodes_a, nodes_b, pairs, paired_a, paired_b)
    order = {id(n): i for i, (_, n) in enumerate(nodes_b)}
    pairs.sort(key=lambda pair: order[id(pair[1][1])])
    return (pairs, [x for x in nodes_a if id(x[1]) not in paired_a],
            [x for x in nodes_b if id(x[1]) not in paired_b])


def _match_rebuilt(nodes_a: list[Located], nodes_b: list[Located], pairs: list,
                   paired_a: set[int], paired_b: set[int]) -> None:
    """Pair the rest by (scope, op, first input seen through the pairs so far): a rewrite that
    rebuilds a node keeps its op and data input but takes new weights, outputs and name."""
    renamed: dict[str, str] = {}  # A value name -> B value name, from paired nodes' operands

    def learn(na: Node, nb: Node) -> None:
        for va, vb in zip(na.inputs + na.outputs, nb.inputs + nb.outputs):
            if va is not None and vb is not None:
                renamed.setdefault(va.name, vb.name)

    for (_, na), (_, nb) in pairs:
        learn(na, nb)
    names_a = {v.name for _, node in nodes_a for v in node.inputs if v is not None}
    candidates: dict[tuple, list[Node]] = defaultdict(list)
    for scope, node in nodes_b:
        if id(node) not in paired_b and node.inputs and node.inputs[0] is not None:
            candidates[(scope, node.qualified_op, node.inputs[0].name)].append(node)
    for scope, node in nodes_a:
        if id(node) in paired_a or not node.inputs or node.inputs[0] is None:
            continue
        first = node.inputs[0].name
        found = candidates.get((scope, node.qualified_op, renamed.get(first, first)))
        if not found:
            continue
        # Two convs on one input (a residual branch): the one whose weights come from this
        # one's (W → W_fused), then the one with the same shapes and attributes, is the
        # rebuilt one.
        other = max(found, key=lambda cand: _likeness(node, cand, renamed, names_a))
        found.remove(other)
        pairs.append(((scope, node), (scope, other)))
        paired_a.add(id(node))
        paired_b.add(id(other))
        learn(node, other)


def _likeness(a: Node, b: Node, renamed: dict[str, str],
              names_a: set[str]) -> tuple[int, int, int]:
    """How alike `b` is to `a`: weights descended from a's by name (a fold names what it makes
    after what it took: W → W_fused, W_b), then output types, then attributes in common."""
    weights = {renamed.get(v.name, v.name) for v in a.inputs[1:] if v is not None}
    lineage = sum(1 for v in b.inputs[1:]
                  if v is not None and _origin(v.name, names_a | weights) in weights)
    types = sum(1 for va, vb in zip(a.outputs, b.outputs)
                if va is not None and vb is not None and format_type(va) == format_type(vb))
    attrs = sum(1 for name, attr in a.attrs.items()
                if name in b.attrs and b.attrs[name].value == attr.value)
    return lineage, types, attrs


def _origin(name: str, known: set[str]) -> str | None:
    """The longest of the `known` names that `name` is or extends by `_…` (`w_b_fused` comes
    from `w_b`, not `w`, where A has both): what a rewrite made it from."""
    cuts = [name] + [name[:i] for i in range(len(name) - 1, 0, -1) if name[i] == "_"]
    return next((cut for cut in cuts if cut in known), None)


def _only_inferred(a: Node, b: Node) -> bool:
    """Whether `a` and `b` print alike but for output types one of them leaves unknown."""
    if format_node(a, types=False, name=False) != format_node(b, types=False, name=False):
        return False
    return all(va is None or vb is None or va.dtype is None or vb.dtype is None
               or format_type(va) == format_type(vb) for va, vb in zip(a.outputs, b.outputs))


def _structure(scope: str, node: Node) -> tuple:
    return (scope, node.qualified_op, tuple(v.name if v else "" for v in node.inputs),
            tuple(v.name if v else "" for v in node.outputs))


def _initializers(model: Model) -> dict[str, Value]:
    return {name: value for graph in model.graph.all_graphs()
            for name, value in graph.initializers.items()}


def _same_data(a: Value, b: Value) -> bool:
    if a.sparse_const is not None or b.sparse_const is not None:
        return (a.sparse_const is not None and b.sparse_const is not None
                and a.sparse_const.SerializeToString() == b.sparse_const.SerializeToString())
    if a.const is b.const:
        return True
    # The cheap sampled fingerprint tells most different tensors apart without a full hash.
    return a.const.fingerprint() == b.const.fingerprint() and a.const.digest() == b.const.digest()


def _diff_initializers(a: Model, b: Model, diff: GraphDiff) -> None:
    inits_a, inits_b = _initializers(a), _initializers(b)
    for name, value in inits_a.items():
        if name not in inits_b:
            diff.initializers_removed.append(ValueChange(name, format_type(value), None))
        elif (format_type(value) != format_type(inits_b[name])
              or not _same_data(value, inits_b[name])):
            diff.initializers_changed.append(
                ValueChange(name, format_type(value), format_type(inits_b[name])))
    diff.initializers_added = [ValueChange(name, None, format_type(value))
                               for name, value in inits_b.items() if name not in inits_a]


def _diff_io(a: Graph, b: Graph, diff: GraphDiff) -> None:
    shared = {v.name for v in (*a.inputs, *a.outputs)} & {v.name for v in (*b.inputs, *b.outputs)}
    diff.unrelated = not shared and bool(a.inputs or a.outputs) and bool(b.inputs or b.outputs)
    for kind, values_a, values_b in (("input", a.inputs, b.inputs),
                                     ("output", a.outputs, b.outputs)):
        types_a = {v.name: format_type(v) for v in values_a}
        types_b = {v.name: format_type(v) for v in values_b}
        for name in list(types_a) + [n for n in types_b if n not in types_a]:
            if types_a.get(name) != types_b.get(name):
                diff.io_changed.append(ValueChange(f"{kind} {name}", types_a.get(name),
                                                   types_b.get(name)))
        # The same names in another order: a caller that takes outputs by position breaks.
        kept_a = [name for name in types_a if name in types_b]
        kept_b = [name for name in types_b if name in types_a]
        if kept_a != kept_b:
            diff.io_changed.append(ValueChange(f"{kind} order", ", ".join(kept_a),
                                               ", ".join(kept_b)))


def _diff_opsets(a: Model, b: Model, diff: GraphDiff) -> None:
    def versions(model: Model) -> dict[str, int]:
        return {("" if domain == "ai.onnx" else domain): version
                for domain, version in model.opset_imports.items()}

    versions_a, versions_b = versions(a), versions(b)
    for domain in sorted(versions_a.keys() | versions_b.keys()):
        before, after = versions_a.get(domain), versions_b.get(domain)
        if before != after:
            diff.opsets_changed.append(ValueChange(
                domain or "ai.onnx", None if before is None else str(before),
                None if after is None else str(after)))


def _diff_properties(a: Model, b: Model, diff: GraphDiff) -> None:
    def properties(model: Model) -> dict[str, str]:
        return {"ir_version": str(model.ir_version), **dict(model.metadata_props)}

    props_a, props_b = properties(a), properties(b)
    for key in sorted(props_a.keys() | props_b.keys()):
        if props_a.get(key) != props_b.get(key):
            diff.properties_changed.append(ValueChange(key, props_a.get(key), props_b.get(key)))


def _diff_functions(a: Model, b: Model, diff: GraphDiff) -> None:
    """Model-local functions by (domain, name, overload): a body that differs is a change,
    shown as the lines of its printed form that differ."""
    def by_key(model: Model) -> dict[str, FunctionProto]:
        return {f"{f.domain}::{f.name}" + (f":{f.overload}" if f.overload else ""): f
                for f in model.functions}

    functions_a, functions_b = by_key(a), by_key(b)
    for name in list(functions_a) + [n for n in functions_b if n not in functions_a]:
        fa, fb = functions_a.get(name), functions_b.get(name)
        if fb is None:
            diff.functions_changed.append(FunctionChange(name, "removed"))
        elif fa is None:
            diff.functions_changed.append(FunctionChange(name, "added"))
        elif fa.SerializeToString(deterministic=True) != fb.SerializeToString(deterministic=True):
            lines = [line for line in difflib.ndiff(_printed(fa), _printed(fb))
                     if line[:1] in "-+"]
            diff.functions_changed.append(FunctionChange(name, "changed", lines))


def _printed(function: FunctionProto) -> list[str]:
    import onnx.printer

    return [line.strip() for line in onnx.printer.to_text(function).splitlines() if line.strip()]
