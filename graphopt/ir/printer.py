"""Stable, diff-friendly text form of the IR: one line per node.

    %y<f32[1,64,56,56]> = Conv(%x, %w) {strides=[1,1], pads=[1,1,1,1]}  # /conv1/Conv
"""

from __future__ import annotations

from onnx import AttributeProto, TypeProto

from graphopt.dims import read_dim
from graphopt.ir.attributes import Attr
from graphopt.ir.graph import Graph
from graphopt.ir.model import Model
from graphopt.ir.node import Node
from graphopt.ir.tensor import Tensor
from graphopt.ir.value import Value

_INDENT = "  "

# Characters the printed form gives a meaning to: a name holding one (or a character that does
# not print) is quoted, so that `Concat(%"p, %q")` never reads as two inputs.
_SYNTAX = frozenset(' ,()%=#"<>{}\\')


def quote_name(name: str) -> str:
    """`name` as the printed IR shows it: as it is, or in double quotes with backslash escapes
    where it is empty or holds syntax, spaces or characters that do not print."""
    if name and name.isprintable() and _SYNTAX.isdisjoint(name):
        return name
    return _quoted(name)


def _quoted(text: str) -> str:
    return '"' + "".join(_escaped(c) for c in text) + '"'


def _escaped(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    return char if char.isprintable() else repr(char)[1:-1]


def format_type(value: Value) -> str:
    if value.type_proto is not None:
        return _format_type_proto(value.type_proto)
    dtype = value.dtype.short if value.dtype is not None else "?"
    if value.shape is None:
        return dtype
    dims = ",".join(_dim(d) for d in value.shape)
    return f"{dtype}[{dims}]"


# A dim's name is quoted where it holds what the brackets give a meaning to as well.
_DIM_SYNTAX = _SYNTAX | set("[]?")


def _dim(dim) -> str:
    if dim is None:
        return "?"
    if isinstance(dim, int):
        return str(dim)
    text = str(dim)
    return text if text and text.isprintable() and _DIM_SYNTAX.isdisjoint(text) else _quoted(text)


def _format_type_proto(tp: TypeProto) -> str:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        probe = Value("")
        from graphopt.ir.onnx_io import apply_type

        apply_type(probe, tp)
        return format_type(probe)
    if which == "sequence_type":
        return f"seq({_format_type_proto(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"opt({_format_type_proto(tp.optional_type.elem_type)})"
    if which == "map_type":
        from graphopt.ir.dtypes import DType

        key = DType(tp.map_type.key_type).short
        return f"map({key},{_format_type_proto(tp.map_type.value_type)})"
    if which == "sparse_tensor_type":
        from graphopt.ir.dtypes import DType

        dims = ",".join(_dim(read_dim(d)) for d in tp.sparse_tensor_type.shape.dim)
        return f"sparse<{DType(tp.sparse_tensor_type.elem_type).short}[{dims}]>"
    return "?"


def format_value(value: Value | None) -> str:
    return "None" if value is None else f"%{quote_name(value.name)}"


def _format_attr_value(attr: Attr, depth: int) -> str:
    kind, value = attr.type, attr.value
    if attr.ref_attr_name:
        return f"@{attr.ref_attr_name}"
    if kind == AttributeProto.FLOAT:
        return repr(float(value))
    if kind == AttributeProto.FLOATS:
        return "[" + ",".join(repr(float(v)) for v in value) + "]"
    if kind == AttributeProto.INTS:
        return "[" + ",".join(str(v) for v in value) + "]"
    if kind == AttributeProto.STRING:
        return repr(value)
    if kind == AttributeProto.STRINGS:
        return "[" + ",".join(repr(v) for v in value) + "]"
    if kind == AttributeProto.TENSOR:
        return _format_tensor(value)
    if kind == AttributeProto.TENSORS:
        return "[" + ",".join(_format_tensor(t) for t in value) + "]"
    if kind == AttributeProto.GRAPH:
        return "graph " + quote_name(value.name)
    if kind == AttributeProto.GRAPHS:
        return "[" + ",".join("graph " + quote_name(g.name) for g in value) + "]"
    if kind in (AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS,
                AttributeProto.TYPE_PROTO, AttributeProto.TYPE_PROTOS):
        data = value if isinstance(value, list) else [value]
        import hashlib

        digest = hashlib.sha1(b"".join(v.SerializeToString(deterministic=True) for v in data))
        return f"<{AttributeProto.AttributeType.Name(kind).lower()} {digest.hexdigest()[:12]}>"
    return str(value)


def _format_tensor(tensor: Tensor) -> str:
    dims = ",".join(str(d) for d in tensor.shape)
    if tensor.size <= 8 and tensor.dtype.short != "str":
        try:
            data = tensor.numpy().ravel().tolist()
            return f"{tensor.dtype.short}[{dims}]{data}"
        except (ValueError, TypeError):
            pass
    return f"{tensor.dtype.short}[{dims}]#{tensor.digest()}"


def format_node(node: Node, *, types: bool = True, name: bool = True) -> str:
    """The node's line; `types=False` leaves out its outputs' types, `name=False` its name."""
    outputs = ", ".join("None" if v is None else
                        f"%{quote_name(v.name)}" + (f"<{format_type(v)}>" if types else "")
                        for v in node.outputs)
    inputs = ", ".join(format_value(v) for v in node.inputs)
    line = f"{outputs} = {quote_name(node.qualified_op)}({inputs})"
    if node.attrs:
        attrs = ", ".join(f"{quote_name(key)}={_format_attr_value(attr, 0)}"
                          for key, attr in sorted(node.attrs.items()))
        line += " {" + attrs + "}"
    if node.name and name:
        line += f"  # {quote_name(node.name)}"
    return line



def format_graph(graph: Graph, depth: int = 0) -> list[str]:
    pad = _INDENT * depth
    lines = [f"{pad}graph {quote_name(graph.name)} ("]
    for value in graph.inputs:
        default = f" = {_format_tensor(value.const)}" if value.const is not None else ""
        lines.append(f"{pad}{_INDENT}%{quote_name(value.name)}<{format_type(value)}>{default}")
    lines.append(f"{pad}) {{")
    for value in graph.initializers.values():
        if value.is_input:
            continue
        data = (_format_tensor(value.const) if value.const is not None
                else "sparse")
        lines.append(f"{pad}{_INDENT}%{quote_name(value.name)}<{format_type(value)}> = initializer {data}")
    for node in graph:
        lines.append(pad + _INDENT + format_node(node))
        for attr in sorted(node.attrs.values(), key=lambda a: a.name):
            for sub in attr.graphs():
                lines.extend(format_graph(sub, depth + 2))
    outputs = ", ".join(f"%{quote_name(v.name)}<{format_type(v)}>" for v in graph.outputs)
    lines.append(f"{pad}{_INDENT}return {outputs}")
    lines.append(f"{pad}}}")
    return lines


def format_model(model: Model) -> str:
    opsets = ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in sorted(model.opset_imports.items()))
    header = [f"# ir_version={model.ir_version} opsets=[{opsets}]"]
    if model.functions:
        header.append("# functions: " + ", ".join(f"{f.domain}::{f.name}" for f in model.functions))
    return "\n".join(header + format_graph(model.graph)) + "\n"
