"""The node-by-node listing of `graphopt inspect --nodes`: what ATC's --mode=1 JSON gives of a
model, each node's name, op, inputs, outputs and attributes, for an .om's partitions or an
.onnx model."""

from __future__ import annotations

import math

import onnx
from onnx import helper

from graphopt.table import elide, format_table

_SHOWN_ATTRIBUTE = 40  # characters of an attribute's value in the text table
# Characters of a name, and of a cell of names, in the text table: a column is as wide as its
# widest cell, so one 5,000-character name had made a 100k-node listing 503 MB (--json keeps
# every name whole).
_SHOWN_NAME, _SHOWN_NAMES = 80, 200


def node_records(graph: onnx.GraphProto) -> list[dict]:
    """Each node of `graph` in its order, as JSON-ready fields; an If's, Loop's or Scan's body
    nested under its attribute."""
    return [{"name": node.name, "op": op_name(node), "inputs": list(node.input),
             "outputs": list(node.output),
             "attributes": {a.name: _attribute(a) for a in node.attribute}}
            for node in graph.node]


def op_name(node: onnx.NodeProto) -> str:
    """The op as inspect's op counts name it: `domain::Op` outside the default domain."""
    domain = node.domain if node.domain not in ("", "ai.onnx") else ""
    return f"{domain}::{node.op_type}" if domain else node.op_type


def _attribute(attribute: onnx.AttributeProto):
    if attribute.ref_attr_name:  # inside a function body: the caller's attribute
        return {"ref": attribute.ref_attr_name}
    return _plain(helper.get_attribute_value(attribute))


def _plain(value):
    """`value` (an attribute's) as JSON takes it: strict JSON has no NaN or infinity, and a
    tensor or graph is described, not dumped."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:  # binary: shown as it is, not with replacement characters
            return {"bytes_hex": value.hex()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    if isinstance(value, onnx.TensorProto):
        return {"tensor": helper.tensor_dtype_to_string(value.data_type).replace(
            "TensorProto.", "").lower(), "shape": list(value.dims)}
    if isinstance(value, onnx.SparseTensorProto):
        return {"sparse_tensor": list(value.dims)}
    if isinstance(value, onnx.GraphProto):
        return {"graph": value.name, "nodes": node_records(value)}
    if isinstance(value, onnx.TypeProto):
        return str(value).strip()
    return value


def format_nodes(records: list[dict], title: str) -> str:
    """The records as a table, one row per node (a body's nodes are counted, not listed)."""
    rows = [[i, elide(r["name"], _SHOWN_NAME), r["op"], _names(r["inputs"]),
             _names(r["outputs"]), _attribute_text(r["attributes"])]
            for i, r in enumerate(records)]
    return format_table(["#", "node", "op", "inputs", "outputs", "attributes"], rows,
                        title=title, names=(1, 3, 4))


def _names(names: list[str]) -> str:
    return elide(", ".join(elide(name, _SHOWN_NAME) for name in names), _SHOWN_NAMES)


def _attribute_text(attributes: dict) -> str:
    shown = []
    for name, value in attributes.items():
        if isinstance(value, dict) and "graph" in value:
            text = f"<body of {len(value['nodes'])} nodes>"
        elif isinstance(value, dict) and "tensor" in value:
            text = f"<{value['tensor']} {value['shape']}>"
        elif isinstance(value, dict) and "sparse_tensor" in value:
            text = f"<sparse {value['sparse_tensor']}>"
        elif isinstance(value, dict) and "bytes_hex" in value:
            text = f"<{len(value['bytes_hex']) // 2} bytes>"
        else:
            text = str(value).replace(" ", "")
        if len(text) > _SHOWN_ATTRIBUTE:
            text = text[:_SHOWN_ATTRIBUTE - 1] + "…"
        shown.append(f"{name}={text}")
    return " ".join(shown)
