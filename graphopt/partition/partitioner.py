"""Cut a placed graph into maximal convex device partitions and return unprofitable NPU islands.

Clustering walks the nodes in topological order and puts each node into a partition of its
device: one that feeds it, else the most recent one of that device, provided no path leaves that
partition and re-enters it through another. Keeping the quotient graph (partitions as nodes)
acyclic is exactly that convexity condition, and it holds by construction: a node joins partition
C only if C is not an ancestor of another partition the node reads. Same-device partitions are
then merged pairwise wherever the quotient stays acyclic (networkx checks it).

An NPU partition next to a CPU partition is an island: if the host↔device copies it causes cost
more than the NPU saves over running its nodes on the host (the tuner's cost models: the CPU
roofline against the NPU's cube and vector estimates), it goes back to the CPU, and clustering
runs again. Once every island pays its way alone, islands that exchange values through host
partitions are judged together, since each may be paying only with copies the other saves.

A Constant node is data, not work (onnxruntime turns it into an initializer at load): it joins
the partition that reads it, never one of its own. So does what the caller gets but no node
makes or reads: an initializer that is a graph output, a graph input no node reads.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from graphopt.ir import Model, Node, Value
from graphopt.ir.collector import heap_frozen
from graphopt.partition.estimate import transfer_seconds, value_bytes
from graphopt.partition.island_edge import host_edge
from graphopt.partition.layouts import assign_layouts
from graphopt.partition.placement import Placement, place

if TYPE_CHECKING:
    from graphopt.partition.target import Target


@dataclass
class Partition:
    """Nodes that run together on one device, as one onnxruntime session."""

    name: str
    device: str
    nodes: list[Node]
    inputs: list[Value]      # from outside: graph inputs (read or not), other partitions' outputs
    outputs: list[Value]     # read by later partitions, or graph outputs (initializers too)

    def op_counts(self) -> Counter:
        """Nodes per op, those inside an If's or a Loop's body included (as `graphopt inspect`
        and the optimize summary count them)."""
        return Counter(node.qualified_op for node in _with_nested(self.nodes))

    def node_count(self) -> int:
        return sum(self.op_counts().values())


@dataclass
class Partitioning:
    target: Target
    partitions: list[Partition]           # in execution order
    placements: dict[Node, Placement]
    returned: list[str] = field(default_factory=list)  # one line per island sent back to the CPU
    layouts: dict = field(default_factory=dict)  # partition name -> layouts.PartitionLayout (NPU)

    def fallbacks(self) -> list[tuple[Node, str]]:
        """Nodes that are not on the primary device, with the reason, in graph order."""
        return [(node, p.reason) for node, p in self.placements.items() if p.reason]


def partition(model: Model, target: Target, *, return_islands: bool = True) -> Partitioning:
    """Place every main-graph node of `model` on a device of `target` and cut the partitions."""
    with heap_frozen():  # the IR is long-lived: no full collection should walk it again
        return _partition(model, target, return_islands)


def _partition(model: Model, target: Target, return_islands: bool) -> Partitioning:
    nodes = model.graph.nodes()
    if len(target.devices) == 1:
        placements = {node: Placement(target.primary, None) for node in nodes}
    else:
        placements = place(model, target)
    returned: list[str] = []
    position = {node: k for k, node in enumerate(nodes)}
    # Constants, and weights' DequantizeLinear nodes, join a partition that reads them, rather
    # than the first partition in graph order: onnxruntime's quantize_static writes every
    # weight's DequantizeLinear first, and a BERT's float weights (11.7 MB) had left its first
    # NPU partition as run-time tensors into every later one.
    followers = {node for node in nodes
                 if is_constant_node(node) or _weight_dequantize(node, placements)}
    constants = [node for node in nodes if node in followers]
    work = [node for node in nodes if node not in followers]
    while True:
        clusters = _attach_constants(_merge(_cluster(work, placements), placements),
                                     constants, placements, target.host)
        # Members in graph order: each partition's nodes stay topologically sorted.
        clusters = [sorted(c, key=position.__getitem__) for c in clusters]
        if not return_islands:
            break
        islands = _unprofitable_islands(clusters, placements, target, model)
        if not islands:
            break
        for members, reason in islands:
            returned.append(f"{len(members)} node(s) from {_label(members[0])}: {reason}")
            for node in members:
                placements[node] = Placement(target.host, None, reason)
    if not nodes:  # a graph that passes its inputs (or constants) through still runs
        # somewhere: on the host, since no device kernel has anything to do
        parts = [Partition(f"p0_{target.host}", target.host, [],
                           list(model.graph.inputs), list(model.graph.outputs))]
    else:
        parts = _partitions(clusters, placements, position)
        _add_graph_values(parts, model, target.host)
    result = Partitioning(target, parts, placements, returned)
    result.layouts = assign_layouts(result)
    return result


# --- clustering ----------------------------------------------------------------------------


def reads(node: Node) -> list[Value]:
    """Every value `node` reads, its subgraphs' reads from enclosing scopes included."""
    values = [v for v in node.inputs if v is not None]
    inner_defined: set[int] = set()
    for sub in node.subgraphs():
        for graph in sub.all_graphs():
            inner_defined.update(id(v) for v in graph.inputs)
            inner_defined.update(id(v) for v in graph.initializers.values())
            for inner in graph:
                inner_defined.update(id(v) for v in inner.outputs if v is not None)
        for inner in sub.all_nodes():
            values.extend(v for v in inner.inputs if v is not None and id(v) not in inner_defined)
    return values


def _weight_dequantize(node: Node, placements: dict[Node, Placement]) -> bool:
    """A DequantizeLinear of constants (a quantized weight or bias) placed on the device of
    every node that reads it: it can run wherever they do."""
    if node.op_type != "DequantizeLinear" or not node.is_onnx or node.subgraphs() \
            or not all(v is None or v.is_constant for v in node.inputs):
        return False
    readers = [use.node for value in node.outputs if value is not None for use in value.uses]
    device = placements[node].device
    return bool(readers) and all(top_level(reader) in placements
                                 and placements[top_level(reader)].device == device
                                 for reader in readers)


def is_constant_node(node: Node) -> bool:
    """An ONNX Constant: a value written into the model, which no device needs a kernel for."""
    return node.op_type == "Constant" and node.is_onnx and not node.inputs


def top_level(node: Node) -> Node:
    """The main-graph node that holds `node`, through any nesting of subgraphs."""
    while node.graph is not None and node.graph.parent is not None:
        node = node.graph.parent
    return node


def _cluster(nodes: list[Node], placements: dict[Node, Placement]) -> list[list[Node]]:
    cluster_of: dict[Node, int] = {}
    devices: list[str] = []
    members: list[list[Node]] = []
    preds: list[set[int]] = []          # direct predecessor clusters
    latest: dict[str, int] = {}         # the most recent cluster per device

    def is_ancestor(a: int, b: int) -> bool:
        stack, seen = [b], {b}
        while stack:
            for p in preds[stack.pop()]:
                if p == a:
                    return True
                if p not in seen:
                    seen.add(p)
                    stack.append(p)
        return False

    for node in nodes:
        device = placements[node].device
        feeding = {cluster_of[v.producer] for v in reads(node) if v.producer in cluster_of}
        candidates = sorted(c for c in feeding if devices[c] == device)
        if device in latest and latest[device] not in candidates:
            candidates.append(latest[device])
        chosen = next((c for c in candidates
                       if not any(q != c and is_ancestor(c, q) for q in feeding)), None)
        if chosen is None:
            chosen = len(members)
            devices.append(device)
            members.append([])
            preds.append(set())
        members[chosen].append(node)
        cluster_of[node] = chosen
        preds[chosen] |= feeding - {chosen}
        latest[device] = chosen
    return members


def _quotient(clusters: list[list[Node]]) -> nx.DiGraph:
    owner = {node: i for i, members in enumerate(clusters) for node in members}
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(clusters)))
    for i, members in enumerate(clusters):
        for node in members:
            for value in reads(node):
                j = owner.get(value.producer)
                if j is not None and j != i:
                    graph.add_edge(j, i)
    return graph


_MERGE_LIMIT = 400  # pairwise merging is quadratic in partitions; past this the greedy cut stands


def _merge(clusters: list[list[Node]], placements: dict[Node, Placement]) -> list[list[Node]]:
    """Merge same-device clusters wherever the quotient graph stays acyclic."""
    if len(clusters) > _MERGE_LIMIT:
        return clusters
    graph = _quotient(clusters)
    device = {i: placements[c[0]].device for i, c in enumerate(clusters)}
    alive = list(range(len(clusters)))
    merged = {i: list(c) for i, c in enumerate(clusters)}
    changed = True
    while changed:
        changed = False
        for a in alive:
            for b in alive:
                if b <= a or device[a] != device[b] or _indirect_path(graph, a, b) \
                        or _indirect_path(graph, b, a):
                    continue
                graph = nx.contracted_nodes(graph, a, b, self_loops=False)
                merged[a].extend(merged.pop(b))
                alive.remove(b)
                changed = True
                break
            if changed:
                break
    return [merged[i] for i in alive]


def _indirect_path(graph: nx.DiGraph, a: int, b: int) -> bool:
    """A path a → … → b through some other cluster (merging a and b would close a cycle)."""
    return any(s != b and nx.has_path(graph, s, b) for s in graph.successors(a))


def _attach_constants(clusters: list[list[Node]], constants: list[Node],
                      placements: dict[Node, Placement], host: str) -> list[list[Node]]:
    """`clusters` with each Constant node (or weight's DequantizeLinear) in one: the first (in
    dependency order) of those that read it, else, when only the caller does, a host cluster (its value then needs no copy off
    a device), else the first. Placements follow, without a fallback reason."""
    if not constants:
        return clusters
    clusters = [list(c) for c in clusters] or [[]]
    owner = {node: i for i, members in enumerate(clusters) for node in members}
    quotient = _quotient(clusters)
    home = next((i for i, c in enumerate(clusters) if c and placements[c[0]].device == host), 0)
    for node in constants:
        readers = {owner[top_level(use.node)] for value in node.outputs if value is not None
                   for use in value.uses if top_level(use.node) in owner}
        # A reader no other reader depends on: edges from it to the others close no cycle.
        chosen = min((i for i in readers if not nx.ancestors(quotient, i) & readers),
                     default=home)
        quotient.add_edges_from((chosen, i) for i in readers - {chosen})
        device = placements[clusters[chosen][0]].device if clusters[chosen] else host
        clusters[chosen].append(node)
        # A weight's DequantizeLinear keeps its engine and reason where it stays on its device.
        if is_constant_node(node) or placements[node].device != device:
            placements[node] = Placement(device, None)
    return clusters


# --- islands -------------------------------------------------------------------------------


def _unprofitable_islands(clusters, placements, target: Target, model: Model
                          ) -> list[tuple[list[Node], str]]:
    host, primary = target.device(target.host), target.device(target.primary)
    # The cost models the tuner uses: a roofline per op class on the host, the tiled cube and
    # vector estimates on the NPU (estimates both; only their difference matters here).
    from graphopt.tuner.cpu_model import host_cost_model, model_functions
    from graphopt.tuner.model import node_estimate

    host_model = host_cost_model(target, host)
    functions = model_functions(model)  # a call is priced as its body on either side
    owner = {node: i for i, c in enumerate(clusters) for node in c}
    device = [placements[c[0]].device for c in clusters]

    def device_saves(nodes: list[Node]) -> float:
        # The model, for a graphopt:: call: its group (a Conv epilogue's cube kernel included).
        return sum(host_model.node_seconds(n, functions)
                   - node_estimate(n, primary, model)[1].seconds for n in nodes)

    found = []
    for i, members in enumerate(clusters):
        if device[i] == host.name:
            continue
        # A Constant follows its readers back (_attach_constants), not the island's cost.
        work = [n for n in members if not is_constant_node(n)]
        if not work:
            continue
        copies = _island_copies(members, owner, i, device, host.name, target)
        if copies is None:
            continue
        # First the island's host-bound edge, where handing it back saves more in copies than
        # the device saves on it: the rest is judged again without it, in the next round.
        edge, gain, edge_saves = host_edge(
            work, owner, i, lambda c: c is None or device[c] == host.name, target, reads,
            top_level, device_saves)
        if edge:
            # Its copies cost gain + what the device saves on it: where the device is slower
            # on the edge, the copies are the lesser part (a YOLO decode: 59 of 427 µs).
            found.append((edge, f"returned to {host.name}: the host-bound edge of an "
                                f"{primary.name} island, where "
                                f"{_verdict(edge_saves, gain + edge_saves, primary.name)}"))
            continue
        saved = device_saves(work)
        if saved < copies:
            found.append((work, f"returned to {host.name}: "
                                f"{_verdict(saved, copies, primary.name)}"))
    if not found:
        found = _unprofitable_unions(clusters, owner, device, host.name, primary.name, target,
                                     device_saves)
    return found


def _island_copies(members: list[Node], owner: dict, index: int, device: list[str], host: str,
                   target: Target) -> float | None:
    """The seconds of host↔device copies that cluster `index` on the device adds over the
    same nodes on the host (negative: copies it saves), or None when it exchanges nothing
    with the host."""
    on_host_side = on_device_side = 0.0  # copies the island causes / would cause on the host
    touches_host = False
    taken, given = _crossing(members, owner, index)
    read_ids = {id(value) for value in taken}
    for value in taken + given:
        seconds = transfer_seconds(value_bytes(value), target)
        other = {owner.get(n) for n in _neighbours(value, members, owner, index)}
        host_ends = [o for o in other if o is None or device[o] == host]
        touches_host |= any(o is not None for o in host_ends)
        # A value the island reads crosses for it only where no other reader on the island's
        # side (host or device) already takes it across: the device's value that a host TopK
        # reads reaches the host whether or not the island moves there.
        crossing = _readers_sides(value, owner, index, device, host) \
            if id(value) in read_ids else set()
        if host_ends and "device" not in crossing:
            on_host_side += seconds
        if any(o is not None and device[o] != host for o in other) and "host" not in crossing:
            on_device_side += seconds
    return on_host_side - on_device_side if touches_host else None


def _verdict(saved: float, copies: float, primary: str) -> str:
    """Why nodes the device would run went back: what the device saves on them against the
    copies (net: those it adds less those it removes)."""
    gain = (f"the {primary} would save {saved * 1e6:.1f} µs on them" if saved >= 0 else
            f"the {primary} would be {-saved * 1e6:.1f} µs slower on them")
    if abs(copies) < 5e-8:  # (an island whose values cross either way: "0.0 µs" said nothing)
        return gain + ", and would add no host↔device copies"
    return gain + (f", and would add {copies * 1e6:.1f} µs of host↔device copies" if copies >= 0
                   else f", which the {-copies * 1e6:.1f} µs of copies it would save does not "
                        "make up")


def _unprofitable_unions(clusters, owner: dict, device: list[str], host: str, primary: str,
                         target: Target, device_saves) -> list[tuple[list[Node], str]]:
    """Device islands that exchange values through host clusters, judged together once each
    alone pays its way. Each is then priced with the others on the device: a conv whose
    output a host TopK and a device Mul both read, and the Mul's island after the TopK, each
    kept the other's copies, and the two on the device cost more than both on the host."""
    quotient = _quotient(clusters)
    coupling = nx.Graph()
    for h in range(len(clusters)):
        if device[h] != host:
            continue
        for name in {device[c] for c in quotient.pred[h]} | {device[c] for c in quotient.succ[h]}:
            near = [c for c in (*quotient.pred[h], *quotient.succ[h]) if device[c] == name]
            if name != host:  # a union of one device's islands only
                coupling.add_nodes_from(near)
                coupling.add_edges_from(zip(near, near[1:]))
    found = []
    for group in nx.connected_components(coupling):
        if len(group) < 2:
            continue
        index = min(group)
        joined = {node: (index if at in group else at) for node, at in owner.items()}
        members = [node for c in sorted(group) for node in clusters[c]]
        work = [n for n in members if not is_constant_node(n)]
        copies = _island_copies(members, joined, index, device, host, target)
        saved = device_saves(work)
        if copies is not None and saved < copies:
            found.append((work, f"returned to {host} with the {len(group) - 1} other {primary} "
                                f"island(s) it exchanges values with through the host: "
                                f"{_verdict(saved, copies, primary)}"))
    return found


def _crossing(members: list[Node], owner: dict, index: int) -> tuple[list[Value], list[Value]]:
    """(values the cluster reads from outside, values it makes that are read outside or are
    graph outputs), each once, in first-seen order. Weights travel with the nodes that read
    them, so they never cross."""
    inputs: dict[int, Value] = {}
    outputs: dict[int, Value] = {}
    for node in members:
        for value in reads(node):
            if not value.is_weight and owner.get(value.producer) != index:
                inputs.setdefault(id(value), value)
        for value in node.outputs:
            if value is not None and (value.is_graph_output or any(
                    owner.get(top_level(use.node)) != index for use in value.uses)):
                outputs.setdefault(id(value), value)
    return list(inputs.values()), list(outputs.values())


def _readers_sides(value: Value, owner: dict, index: int, device: list[str],
                   host: str) -> set[str]:
    """Where `value` is read outside cluster `index` besides its producer's cluster: "host"
    (a host cluster, or the caller) and/or "device"."""
    sides = {"host"} if value.is_graph_output else set()
    made_in = owner.get(value.producer)
    for use in value.uses:
        at = owner.get(top_level(use.node))
        if at != index and at != made_in:
            sides.add("host" if at is None or device[at] == host else "device")
    return sides


def _neighbours(value: Value, members: list[Node], owner: dict, index: int) -> list[Node | None]:
    """The nodes across the edge from the cluster for `value`; None stands for the caller."""
    if owner.get(value.producer) != index:
        return [value.producer]  # None for a graph input
    ends: list[Node | None] = [top_level(use.node) for use in value.uses
                               if owner.get(top_level(use.node)) != index]
    if value.is_graph_output:
        ends.append(None)
    return ends


def _label(node: Node) -> str:
    return node.name or f"{node.op_type} -> %{node.outputs[0].name}"


# --- result --------------------------------------------------------------------------------


def _add_graph_values(parts: list[Partition], model: Model, host: str) -> None:
    """Give a partition what the caller exchanges with the graph but no node reads or makes:
    a graph input no node reads (the artifact still takes every input the model declares)
    joins a host partition's inputs, an initializer that is a graph output the outputs of a
    partition that reads it (its data is there already), else of a host partition."""
    home = next((p for p in parts if p.device == host), parts[0])
    taken = {id(v) for p in parts for v in p.inputs}
    made = {id(v) for p in parts for v in p.outputs}
    for value in model.graph.inputs:
        if not value.is_weight and id(value) not in taken:
            home.inputs.append(value)
            taken.add(id(value))
    part_of = {node: p for p in parts for node in p.nodes}
    for value in model.graph.outputs:
        if value.is_weight and id(value) not in made:
            readers = [part_of[top_level(u.node)] for u in value.uses
                       if top_level(u.node) in part_of]
            min(readers, key=parts.index, default=home).outputs.append(value)
            made.add(id(value))


def _partitions(clusters: list[list[Node]], placements, position: dict[Node, int]) -> list[Partition]:
    graph = _quotient(clusters)
    if not nx.is_directed_acyclic_graph(graph):  # the construction guarantees it; say so if not
        raise AssertionError("partitions are not convex: the quotient graph has a cycle")
    # Ties between independent partitions go to the one whose first node comes first.
    first = {i: position[c[0]] for i, c in enumerate(clusters)}
    order = list(nx.lexicographical_topological_sort(graph, key=first.__getitem__))
    owner = {node: i for i, c in enumerate(clusters) for node in c}
    result = []
    for rank, i in enumerate(order):
        device = placements[clusters[i][0]].device
        inputs, outputs = _crossing(clusters[i], owner, i)
        result.append(Partition(f"p{rank}_{device}", device, clusters[i], inputs, outputs))
    return result


def _with_nested(nodes):
    for node in nodes:
        yield node
        for graph in node.subgraphs():
            yield from graph.all_nodes()
