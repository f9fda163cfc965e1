"""`Value`: one SSA tensor (or sequence/optional) with its single producer and ordered uses."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple

from graphopt.frozen_map import FrozenMap
from graphopt.ir.dtypes import DType

if TYPE_CHECKING:
    import numpy as np
    from onnx import SparseTensorProto, TypeProto

    from graphopt.ir.graph import Graph
    from graphopt.ir.node import Node
    from graphopt.ir.tensor import Tensor

Dim = int | str | None
Shape = tuple[Dim, ...]


# The metadata_props of nearly every node and value: one shared read-only mapping, not an empty
# dict apiece (~64 bytes per node and per value, ~10% of a big graph's IR). Metadata is assigned
# whole (import); writing into the shared one raises.
NO_METADATA: Mapping[str, str] = FrozenMap({})


class Use(NamedTuple):
    node: "Node"
    index: int


class Value:
    """A named value. `producer` is the node that computes it (None for graph inputs and
    initializers); `uses` lists (node, input index) pairs in the order they were connected and is
    maintained by `Node` setters, never by hand.

    `shape` is None when the rank is unknown; a dim is an int, a symbolic name, or None.
    Non-tensor types (sequences, optionals, maps, sparse tensors) keep their TypeProto in
    `type_proto` and leave `dtype`/`shape` unset.
    """

    __slots__ = ("name", "dtype", "shape", "type_proto", "producer", "index", "_uses", "const",
                 "sparse_const", "is_input", "overridable", "graph", "doc_string", "metadata_props", "__weakref__")

    def __init__(self, name: str, dtype: DType | None = None, shape: Shape | None = None, *,
                 const: "Tensor | None" = None):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.type_proto: TypeProto | None = None
        self.producer: Node | None = None
        self.index = 0
        # An insertion-ordered dict used as a set: removing a use is O(1), not a scan of a
        # shared constant's thousands of readers (quadratic dead-node removal at 100k nodes).
        self._uses: dict[Use, None] = {}
        self.const = const
        self.sparse_const: SparseTensorProto | None = None
        self.is_input = False
        # An initializer listed as a graph input is a default the caller may override, except
        # before IR 4, where every initializer had to be listed and runtimes treat them as
        # weights (onnxruntime refuses feeds for them).
        self.overridable = True
        self.graph: Graph | None = None
        self.doc_string = ""
        self.metadata_props: Mapping[str, str] = NO_METADATA  # assigned whole, never edited
        if const is not None:
            self.dtype = const.dtype
            self.shape = const.shape

    # -- uses ----------------------------------------------------------------------------
    @property
    def uses(self) -> tuple[Use, ...]:
        return tuple(self._uses)

    def _add_use(self, node: "Node", index: int) -> None:
        self._uses[Use(node, index)] = None

    def _remove_use(self, node: "Node", index: int) -> None:
        # Use compares its node by identity (Node keeps object equality) and its index.
        try:
            del self._uses[Use(node, index)]
        except KeyError:
            raise AssertionError(f"use ({node}, {index}) missing on {self}") from None

    def consumers(self) -> list["Node"]:
        """Distinct consuming nodes, in use order."""
        seen: dict[int, Node] = {}
        for use in self._uses:
            seen.setdefault(id(use.node), use.node)
        return list(seen.values())

    def replace_all_uses_with(self, other: "Value") -> int:
        """Rewire every consumer to read `other`; returns the number of uses moved.
        Graph outputs are not touched: a pass that removes an output's producer must rename."""
        count = 0
        for use in list(self._uses):
            use.node.set_input(use.index, other)
            count += 1
        return count

    # -- facts ---------------------------------------------------------------------------
    @property
    def is_initializer(self) -> bool:
        return self.const is not None and self.producer is None

    @property
    def is_weight(self) -> bool:
        """An initializer, dense or sparse: data that travels with the nodes reading it."""
        return self.producer is None and (self.const is not None or self.sparse_const is not None)

    @property
    def is_constant(self) -> bool:
        """True when the data is fixed at compile time: an initializer a user cannot override."""
        return self.const is not None and not (self.is_input and self.overridable)

    def constant(self) -> "np.ndarray | None":
        return self.const.numpy() if self.is_constant else None

    @property
    def is_graph_output(self) -> bool:
        if self.graph is None:
            return False
        for output in self.graph.outputs:
            if output is self:
                return True
        return False

    @property
    def is_tensor(self) -> bool:
        return self.type_proto is None

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dim is a known integer, else None."""
        shape = self.shape
        if shape is None:
            return None
        for dim in shape:  # a loop, not all() over a generator: asked of every value, often
            if not isinstance(dim, int):
                return None
        return shape  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"%{self.name}"
