"""Node attributes of every ONNX kind, with the attribute type kept explicit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnx import AttributeProto

AttrType = AttributeProto.AttributeType

# Kinds whose value is a list.
LIST_KINDS = {
    AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS, AttributeProto.TENSORS,
    AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTOS,
}


@dataclass
class Attr:
    """One attribute. `value` is int, float, str (bytes when not UTF-8), Tensor, Graph,
    SparseTensorProto, TypeProto, or a list of these. `ref_attr_name` marks an attribute that
    refers to an enclosing function's attribute instead of carrying a value."""

    name: str
    type: int
    value: Any
    ref_attr_name: str = ""
    doc_string: str = ""
    metadata: dict = field(default_factory=dict)

    @property
    def is_graph(self) -> bool:
        return self.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)

    def graphs(self) -> list:
        if self.type == AttributeProto.GRAPH:
            return [self.value]
        if self.type == AttributeProto.GRAPHS:
            return list(self.value)
        return []


def infer_attr(name: str, value: Any) -> Attr:
    """Build an Attr from a plain Python value, as passes write them (`axis=1`, `perm=[0,2,1]`)."""
    from graphopt.ir.graph import Graph
    from graphopt.ir.tensor import Tensor

    if isinstance(value, Attr):
        return value
    if isinstance(value, bool | int):
        return Attr(name, AttributeProto.INT, int(value))
    if isinstance(value, float):
        return Attr(name, AttributeProto.FLOAT, value)
    if isinstance(value, str | bytes):
        return Attr(name, AttributeProto.STRING, value)
    if isinstance(value, Tensor):
        return Attr(name, AttributeProto.TENSOR, value)
    if isinstance(value, Graph):
        return Attr(name, AttributeProto.GRAPH, value)
    if isinstance(value, list | tuple):
        items = list(value)
        if all(isinstance(v, bool | int) for v in items):
            return Attr(name, AttributeProto.INTS, [int(v) for v in items])
        if all(isinstance(v, int | float) for v in items):
            return Attr(name, AttributeProto.FLOATS, [float(v) for v in items])
        if all(isinstance(v, str | bytes) for v in items):
            return Attr(name, AttributeProto.STRINGS, items)
        if all(isinstance(v, Tensor) for v in items):
            return Attr(name, AttributeProto.TENSORS, items)
        if all(isinstance(v, Graph) for v in items):
            return Attr(name, AttributeProto.GRAPHS, items)
    raise TypeError(f"attribute {name!r}: cannot infer an ONNX attribute type for {value!r}")
