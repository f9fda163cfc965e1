"""`Graph`: an ordered node list (a linked list safe to edit while iterating), inputs,
outputs and initializers; nested graphs know the node that owns them."""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator

import numpy as np

from graphopt.ir.dtypes import DType
from graphopt.ir.node import Node
from graphopt.ir.tensor import Tensor
from graphopt.ir.value import Shape, Value


class CycleError(ValueError):
    """The nodes cannot be ordered: `nodes` lie on or behind a cycle, `cycle` on it."""

    def __init__(self, nodes: list[Node], cycle: list[Node]):
        self.nodes, self.cycle = nodes, cycle
        path = " -> ".join(n.name or n.op_type for n in (cycle + cycle[:1])[:7])
        more = " -> …" if len(cycle) > 6 else ""
        behind = len(nodes) - len(cycle)
        # Nodes after it, or on another cycle: none of them can be ordered either.
        after = f" ({behind} more node(s) cannot be ordered)" if behind else ""
        super().__init__(f"the graph has a cycle of {len(cycle)} node(s): {path}{more}{after}")


def _a_cycle(stuck: list[Node], producers: dict[int, set[int]]) -> list[Node]:
    """One cycle among nodes that cannot be ordered, in data-flow order: every such node waits
    on a producer that also cannot be ordered, so walking producers must come round."""
    position = {id(n): i for i, n in enumerate(stuck)}  # graph order: the same cycle each run
    seen: dict[int, int] = {}
    walk: list[Node] = []
    node = stuck[0]
    while id(node) not in seen:
        seen[id(node)] = len(walk)
        walk.append(node)
        node = stuck[min(position[p] for p in producers[id(node)] if p in position)]
    return walk[seen[id(node)]:][::-1]


# What a pickled graph keeps of itself besides its nodes (see Graph.__getstate__).
_STATE = ("name", "doc_string", "metadata_props", "inputs", "outputs", "initializers", "parent",
          "_len", "_holders", "_used_names")


class Graph:
    __slots__ = ("name", "doc_string", "metadata_props", "inputs", "outputs", "initializers",
                 "parent", "_head", "_tail", "_len", "_holders", "_used_names", "__weakref__")

    def __init__(self, name: str = "main_graph"):
        self.name = name
        self.doc_string = ""
        self.metadata_props: dict[str, str] = {}
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self.parent: Node | None = None  # the node whose attribute holds this subgraph
        self._head: Node | None = None
        self._tail: Node | None = None
        self._len = 0
        # The linked nodes that hold a subgraph attribute (or once did): while there are none,
        # the walks that look for nested graphs (all_graphs, count_nodes, all_values; every
        # pass runs them) stop at this graph instead of checking every node's attributes.
        self._holders: set[Node] = set()
        self._used_names: set[str] | None = None  # kept on the root graph only

    # -- node list -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Node]:
        """Iterate over a snapshot, skipping nodes removed meanwhile; nodes inserted during the
        iteration are not visited (passes that need them run to a fixed point)."""
        for node in self.nodes():
            if node.graph is self:
                yield node

    def nodes(self) -> list[Node]:
        result, node = [], self._head
        while node is not None:
            result.append(node)
            node = node._next
        return result

    def __len__(self) -> int:
        return self._len

    def _link(self, node: Node, prev: Node | None, nxt: Node | None) -> None:
        if node.graph is not None:
            raise ValueError(f"{node} already belongs to a graph")
        node.graph, node._prev, node._next = self, prev, nxt
        if prev is None:
            self._head = node
        else:
            prev._next = node
        if nxt is None:
            self._tail = node
        else:
            nxt._prev = node
        self._len += 1
        for value in node.outputs:
            if value is not None:
                value.graph = self
                if not value.name:
                    value.name = self.fresh_name(node.op_type.lower())
                else:
                    self.claim_name(value.name)
        self.note_subgraphs(node)

    def note_subgraphs(self, node: Node) -> None:
        """Record that linked `node` may hold subgraphs (and point them back to it): called on
        linking, and by whatever gives a linked node a graph attribute (Node.set_attr, import)."""
        subs = node.subgraphs()
        if subs:
            self._holders.add(node)
        for sub in subs:
            sub.parent = node

    def append(self, node: Node) -> Node:
        self._link(node, self._tail, None)
        return node

    def insert_before(self, ref: Node, node: Node) -> Node:
        self._link(node, ref._prev, ref)
        return node

    def insert_after(self, ref: Node, node: Node) -> Node:
        self._link(node, ref, ref._next)
        return node

    def remove(self, node: Node, *, safe: bool = True) -> None:
        """Unlink `node` for good: drop its input uses, and the reads its bodies make of outer
        values (to move a node, use move_before). With `safe`, refuse while any output is still
        used or is a graph output: removing it would leave a dangling reference."""
        if node.graph is not self:
            raise ValueError(f"{node} is not in graph {self.name!r}")
        if safe:
            for value in node.outputs:
                if value is not None and (value.uses or value.is_graph_output):
                    raise ValueError(f"cannot remove {node}: output %{value.name} is still used")
        node.detach_inputs()
        for sub in node.subgraphs():
            _release_captures(sub)
        self._unlink(node)

    def move_before(self, ref: Node, node: Node) -> Node:
        """Move linked `node` (from this graph or another, a nested one say) to just before
        `ref`, keeping its inputs, its readers and the bodies it holds."""
        if node.graph is None:
            raise ValueError(f"{node} belongs to no graph")
        node.graph._unlink(node)
        return self.insert_before(ref, node)

    def _unlink(self, node: Node) -> None:
        if node._prev is None:
            self._head = node._next
        else:
            node._prev._next = node._next
        if node._next is None:
            self._tail = node._prev
        else:
            node._next._prev = node._prev
        node._prev = node._next = None
        node.graph = None
        self._len -= 1
        self._holders.discard(node)

    # -- values ----------------------------------------------------------------------------
    @property
    def root(self) -> "Graph":
        graph = self
        while graph.parent is not None and graph.parent.graph is not None:
            graph = graph.parent.graph
        return graph

    def _namespace(self) -> "_Namespace":
        root = self.root
        if root._used_names is None:
            root._used_names = _Namespace({v.name for v in root.all_values()},
                                          {n.name for n in root.all_nodes() if n.name})
        return root._used_names

    def reserve_names(self) -> None:
        """Keep every value and node name the model holds now from fresh names, whatever
        later edits remove."""
        self._namespace()

    def claim_name(self, name: str) -> None:
        self._namespace().values.add(name)

    def fresh_name(self, prefix: str) -> str:
        """A value name unused anywhere in the model, derived from `prefix`."""
        return self._namespace().fresh(prefix, self._namespace().values)

    def fresh_node_name(self, prefix: str) -> str:
        """A node name unused anywhere in the model (onnxruntime refuses duplicates)."""
        return self._namespace().fresh(prefix, self._namespace().nodes)

    def add_input(self, value: Value) -> Value:
        value.graph, value.is_input = self, True
        self.claim_name(value.name)
        self.inputs.append(value)
        if value.const is not None:
            self.initializers[value.name] = value
        return value

    def add_initializer(self, value: Value) -> Value:
        if value.name in self.initializers:
            raise ValueError(f"initializer {value.name!r} already exists")
        value.graph = self
        self.claim_name(value.name)
        self.initializers[value.name] = value
        return value

    def make_initializer(self, name_hint: str, array: np.ndarray | Tensor) -> Value:
        tensor = array if isinstance(array, Tensor) else Tensor(np.asarray(array))
        return self.add_initializer(Value(self.fresh_name(name_hint), const=tensor))

    def remove_initializer(self, value: Value) -> None:
        """Drop an initializer nothing reads. A fixed weight of a model before IR 4, which is
        listed as a graph input but is no input a caller may feed, leaves the inputs too."""
        fixed = value.is_input and not value.overridable  # import sets this for weights only
        if value.uses or value.is_graph_output or (value.is_input and not fixed):
            raise ValueError(f"initializer %{value.name} is still used")
        del self.initializers[value.name]
        if fixed:
            self.inputs.remove(value)
            value.is_input = False
        value.graph = None

    def make_node(self, op_type: str, inputs: Iterable[Value | None], attrs: dict | None = None, *,
                  domain: str = "", num_outputs: int = 1, name: str = "",
                  before: Node | None = None, dtype: DType | None = None,
                  shape: Shape | None = None) -> Node:
        """Create a node with freshly named outputs, inserted before `before` (or appended)."""
        node = Node(op_type, inputs, attrs, domain=domain, name=name, num_outputs=num_outputs)
        if num_outputs == 1:
            node.output.dtype, node.output.shape = dtype, shape
        if before is None:
            return self.append(node)
        return self.insert_before(before, node)

    def overridable_inputs(self) -> list[str]:
        """The inputs carrying an initializer a caller may override (ONNX IR ≥ 4)."""
        return [v.name for v in self.inputs if v.const is not None and v.overridable]

    def all_values(self) -> Iterator[Value]:
        """Every value defined in this graph and in nested graphs."""
        yield from self.inputs
        for value in self.initializers.values():
            if not value.is_input:
                yield value
        nested = bool(self._holders)
        for node in self.nodes():
            for value in node._outputs:
                if value is not None:
                    yield value
            if nested and node.attrs:  # subgraphs live in attributes
                for sub in node.subgraphs():
                    yield from sub.all_values()

    def all_graphs(self) -> Iterator["Graph"]:
        """This graph and every nested graph, outer before inner."""
        yield self
        if not self._holders:
            return
        for node in self.nodes():
            if node.attrs:  # subgraphs live in attributes: most nodes have none to look at
                for sub in node.subgraphs():
                    yield from sub.all_graphs()

    def all_nodes(self) -> Iterator[Node]:
        for graph in self.all_graphs():
            yield from graph

    def count_nodes(self, recursive: bool = True) -> int:
        # The pass manager counts before and after every pass: walk the links, no list copy.
        total = self._len
        if recursive and self._holders:
            node = self._head
            while node is not None:
                if node.attrs:
                    for sub in node.subgraphs():
                        total += sub.count_nodes()
                node = node._next
        return total

    # -- pickling --------------------------------------------------------------------------
    # By default pickle would follow _next from node to node and each value to its producer,
    # one recursion level per step: a 5000-node chain overflows the stack. The nodes go as a
    # flat list with their wiring instead; a value's producer and uses then name nodes whose
    # own state holds no values (Node.__getstate__), one level deep.
    def __getstate__(self) -> dict:
        state = {slot: getattr(self, slot) for slot in _STATE}
        state["nodes"] = nodes = self.nodes()
        state["wiring"] = [(node._inputs, node._outputs) for node in nodes]
        return state

    def __setstate__(self, state: dict) -> None:
        nodes, wiring = state.pop("nodes"), state.pop("wiring")
        for slot, value in state.items():
            setattr(self, slot, value)
        previous = None
        for node, (inputs, outputs) in zip(nodes, wiring):
            node._inputs, node._outputs = inputs, outputs
            node._prev, node._next = previous, None
            if previous is not None:
                previous._next = node
            previous = node
        self._head, self._tail = (nodes[0] if nodes else None), previous

    # -- order -----------------------------------------------------------------------------
    def sort(self) -> None:
        """Topologically sort the nodes, keeping the current order where it is already valid.
        Nested graphs count as reading the outer values they reference."""
        nodes = self.nodes()
        if self._in_order(nodes):
            return  # the sort below would keep this order: no dependency tables needed
        position = {id(n): i for i, n in enumerate(nodes)}
        deps: dict[int, set[int]] = {}
        users: dict[int, list[Node]] = {id(n): [] for n in nodes}
        for node in nodes:
            producers = set()
            for value in read_values(node):
                prod = _local_producer(value, self)
                if prod is not None and id(prod) != id(node):
                    producers.add(id(prod))
                elif prod is node:
                    producers.add(id(node))  # self-loop: never schedulable
            deps[id(node)] = producers
            for p in producers:
                if p in users:
                    users[p].append(node)
        pending = {k: len(v) for k, v in deps.items()}
        ready = [(position[id(n)], id(n)) for n in nodes if pending[id(n)] == 0]
        heapq.heapify(ready)
        by_id = {id(n): n for n in nodes}
        order: list[Node] = []
        while ready:
            _, nid = heapq.heappop(ready)
            node = by_id[nid]
            order.append(node)
            for user in users[nid]:
                pending[id(user)] -= 1
                if pending[id(user)] == 0:
                    heapq.heappush(ready, (position[id(user)], id(user)))
        if len(order) != len(nodes):
            stuck = [n for n in nodes if pending[id(n)] > 0]
            raise CycleError(stuck, _a_cycle(stuck, deps))
        self._relink(order)

    def _in_order(self, nodes: list[Node]) -> bool:
        """Whether every node comes after the local producers of what it reads (one walk; an
        imported model and most passes' results already are)."""
        seen: set[int] = set()
        for node in nodes:
            reads = node._inputs if not node.attrs else list(read_values(node))
            for value in reads:
                if value is None:
                    continue
                producer = value.producer
                if producer is None:
                    continue
                if producer.graph is not self:
                    producer = _local_producer(value, self)
                    if producer is None:
                        continue
                if id(producer) not in seen:
                    return False  # read before it is produced, or by its own producer
            seen.add(id(node))
        return True

    def reorder(self, order: list[Node]) -> None:
        """Put the nodes in `order` (each node of the graph exactly once), e.g. a memory-aware
        schedule; a step that is not topological is repaired as `sort` would."""
        if len(order) != self._len or {id(n) for n in order} != {id(n) for n in self.nodes()}:
            raise ValueError(f"reorder of graph {self.name!r} must list each of its "
                             f"{self._len} nodes once")
        self._relink(order)
        self.sort()

    def _relink(self, order: list[Node]) -> None:
        self._head = self._tail = None
        previous = None
        for node in order:
            node._prev, node._next = previous, None
            if previous is None:
                self._head = node
            else:
                previous._next = node
            previous = node
        self._tail = previous

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {self._len} nodes>"


class _Namespace:
    """Names in use across a model, with a next-suffix counter per prefix so that handing out
    k names with one prefix costs O(k), not O(k²)."""

    def __init__(self, values: set[str], nodes: set[str]):
        self.values, self.nodes = values, nodes
        self.counters: dict[tuple[int, str], int] = {}

    def fresh(self, prefix: str, used: set[str]) -> str:
        key = (id(used), prefix)
        counter = self.counters.get(key, 0)
        name = prefix if counter == 0 else f"{prefix}_{counter}"
        while name in used:
            counter += 1
            name = f"{prefix}_{counter}"
        self.counters[key] = counter + 1
        used.add(name)
        return name


def read_values(node: Node) -> Iterator[Value]:
    """Values a node reads: its inputs and the outer values its subgraphs capture."""
    for value in node.inputs:
        if value is not None:
            yield value
    for sub in node.subgraphs():
        yield from captured_values(sub)


def _release_captures(graph: Graph) -> None:
    """Drop the reads that a discarded body's nodes make of outer values: a use left behind
    would keep those values' producers alive and count as a reader in every later pass."""
    for inner in graph.all_graphs():
        for node in inner.nodes():
            for index, value in enumerate(node.inputs):
                if value is not None and not _defined_within(value, graph):
                    node.set_input(index, None)


def captured_values(graph: Graph) -> list[Value]:
    """Values from enclosing scopes that `graph` (or graphs nested in it) reads."""
    captured: dict[int, Value] = {}
    for inner in graph.all_graphs():
        for node in inner.nodes():
            for value in node.inputs:
                if value is not None and not _defined_within(value, graph):
                    captured[id(value)] = value
        for value in inner.outputs:
            if not _defined_within(value, graph):
                captured[id(value)] = value
    return list(captured.values())


def _defined_within(value: Value, graph: Graph) -> bool:
    owner = value.graph
    while owner is not None:
        if owner is graph:
            return True
        owner = owner.parent.graph if owner.parent is not None else None
    return False


def _local_producer(value: Value, graph: Graph) -> Node | None:
    """The node of `graph` that (directly or through nesting) produces `value`, if any."""
    node = value.producer
    while node is not None and node.graph is not graph:
        owner = node.graph
        node = owner.parent if owner is not None else None
    return node
