"""`Node`: one operator application; setting its inputs keeps the values' use lists in sync."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from onnx import AttributeProto

from graphopt.ir.attributes import Attr, infer_attr
from graphopt.ir.value import NO_METADATA, Value

if TYPE_CHECKING:
    from graphopt.ir.graph import Graph

_GRAPH, _GRAPHS = AttributeProto.GRAPH, AttributeProto.GRAPHS


class Node:
    """An operator with ordered inputs (None marks an omitted optional input) and outputs
    (None marks an omitted optional output). A node belongs to at most one graph at a time."""

    __slots__ = ("op_type", "domain", "name", "_inputs", "_outputs", "attrs", "doc_string",
                 "metadata_props", "overload", "graph", "_prev", "_next", "__weakref__")

    def __init__(self, op_type: str, inputs: Iterable[Value | None] = (), attrs: dict | None = None,
                 *, domain: str = "", name: str = "", outputs: Iterable[Value | None] | None = None,
                 num_outputs: int = 1):
        self.op_type = op_type
        self.domain = domain
        self.name = name
        self.doc_string = ""
        self.metadata_props: Mapping[str, str] = NO_METADATA  # see value.NO_METADATA
        self.overload = ""
        self.graph: Graph | None = None
        self._prev: Node | None = None
        self._next: Node | None = None
        self.attrs: dict[str, Attr] = {}
        for key, value in (attrs or {}).items():
            self.attrs[key] = infer_attr(key, value)
        self._inputs: list[Value | None] = []
        for value in inputs:
            self._append_input(value)
        if outputs is None:
            outputs = [Value("") for _ in range(num_outputs)]
        self._outputs: list[Value | None] = []
        for index, value in enumerate(outputs):
            if value is not None:
                if value.producer is not None:
                    raise ValueError(f"{value!r} already has a producer: {value.producer}")
                value.producer, value.index = self, index
            self._outputs.append(value)

    # -- inputs --------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    def _append_input(self, value: Value | None) -> None:
        if value is not None:
            value._add_use(self, len(self._inputs))
        self._inputs.append(value)

    def set_input(self, index: int, value: Value | None) -> None:
        old = self._inputs[index]
        if old is value:
            return
        if old is not None:
            old._remove_use(self, index)
        if value is not None:
            value._add_use(self, index)
        self._inputs[index] = value

    def set_inputs(self, values: Iterable[Value | None]) -> None:
        self.detach_inputs()
        for value in values:
            self._append_input(value)

    def detach_inputs(self) -> None:
        """Drop every input, removing this node from their use lists."""
        for index, value in enumerate(self._inputs):
            if value is not None:
                value._remove_use(self, index)
        self._inputs = []

    def input(self, index: int) -> Value | None:
        """The input at `index`, or None when it is omitted or past the end."""
        return self._inputs[index] if index < len(self._inputs) else None

    # -- outputs -------------------------------------------------------------------------
    @property
    def outputs(self) -> tuple[Value | None, ...]:
        return tuple(self._outputs)

    @property
    def output(self) -> Value:
        """The single (first) output."""
        value = self._outputs[0]
        assert value is not None
        return value

    # -- attributes ----------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        attr = self.attrs.get(name)
        return default if attr is None else attr.value

    def set_attr(self, name: str, value: Any) -> None:
        self.attrs[name] = infer_attr(name, value)
        if self.graph is not None:
            self.graph.note_subgraphs(self)

    def subgraphs(self) -> list["Graph"]:
        # Called for every node on every whole-graph walk: test the kind inline rather than
        # building a list per attribute.
        graphs = []
        if not self.attrs:
            return graphs
        for attr in self.attrs.values():
            if attr.type == _GRAPH:
                graphs.append(attr.value)
            elif attr.type == _GRAPHS:
                graphs.extend(attr.value)
        return graphs

    # -- pickling ------------------------------------------------------------------------
    # The graph carries an attached node's wiring and list links (see Graph.__getstate__), so
    # that the state of a node holds no values and pickling never recurses along a chain.
    def __getstate__(self) -> dict:
        state = {slot: getattr(self, slot) for slot in _STATE}
        if self.graph is None:  # a detached node keeps its own wiring
            state["_inputs"], state["_outputs"] = self._inputs, self._outputs
        return state

    def __setstate__(self, state: dict) -> None:
        for slot, value in state.items():
            setattr(self, slot, value)
        # The owning graph may have been restored first and wired this node already.
        for slot in ("_inputs", "_outputs", "_prev", "_next"):
            if not hasattr(self, slot):
                setattr(self, slot, [] if slot in ("_inputs", "_outputs") else None)

    @property
    def is_onnx(self) -> bool:
        """Whether the op is from the default ONNX domain (spelled "" or "ai.onnx")."""
        return self.domain in ("", "ai.onnx")

    @property
    def qualified_op(self) -> str:
        return self.op_type if self.is_onnx else f"{self.domain}::{self.op_type}"

    @property
    def label(self) -> str:
        """How messages name the node after "node ": its name quoted, or, for the many exports
        whose nodes have none, the value it writes (`writing 'y'`)."""
        return unnamed_label(self.name, [v.name for v in self.outputs if v is not None])

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<{self.qualified_op}{label}>"


# What a pickled node keeps of itself: not its wiring, list links or weak-reference slot.
_STATE = tuple(slot for slot in Node.__slots__
               if slot not in ("_inputs", "_outputs", "_prev", "_next", "__weakref__"))


def unnamed_label(name: str, outputs: list[str]) -> str:
    """Node.label for a node's name and output names: `'conv1'`, `writing 'y'`, or `(unnamed)`
    when it has neither."""
    if name:
        return f"'{name}'"
    written = next((out for out in outputs if out), None)
    return f"writing '{written}'" if written else "(unnamed)"
