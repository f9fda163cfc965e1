"""What `graphopt inspect` shows of a plain .onnx model: signature, opsets, op counts, weight bytes."""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from graphopt.codegen.feeds import typed_entry, typed_inputs
from graphopt.codegen.inspect_om import (format_bytes, op_counts, signature_cells,
                                         source_edit_lines, weight_tensors)
from graphopt.errors import InputError, one_line
from graphopt.input_files import refuse_device
from graphopt.ir.onnx_io import check_looks_like_model
from graphopt.source_marks import cut_outputs, inserted_preprocessing, io_types
from graphopt.table import format_table


def read_onnx(path: str | os.PathLike, om_too: bool = True) -> onnx.ModelProto:
    """Parse an .onnx file without its external data (inspection needs only the weights' dims).
    `om_too`: the caller took an .om as well, which a bad file's message then says it is not."""
    path = os.fspath(path)
    what = "neither an .om artifact nor a valid ONNX model" if om_too else "not a valid ONNX model"
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .onnx or .om file")
    refuse_device(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InputError(f"{path}: {what} ({exc})") from None
    check_looks_like_model(model, path, what)
    return model


def _elem_types(type_proto) -> str:
    """The element type numbers a (possibly nested) TypeProto names, for a message."""
    kind = type_proto.WhichOneof("value")
    inner = getattr(type_proto, kind) if kind else None
    if kind in ("tensor_type", "sparse_tensor_type"):
        return f"elem_type {inner.elem_type}"
    if kind in ("sequence_type", "optional_type"):
        return _elem_types(inner.elem_type)
    if kind == "map_type":
        return f"key_type {inner.key_type}, {_elem_types(inner.value_type)}"
    return "no type"


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.data_type == TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    # From the dims, not the payload, so external-data and packed tensors count alike.
    return math.prod(tensor.dims) * itemsize


def describe_onnx(model: onnx.ModelProto, path: str) -> dict:
    """`graphopt inspect model.onnx --json`: signature, opsets, node and op counts, weights."""
    held = list(weight_tensors(model.graph))
    weights = [tensor for tensor, _, _ in held]
    counts = op_counts(model)
    for tensor in weights:  # an invalid model: its weight bytes would read negative
        if any(dim < 0 for dim in tensor.dims):
            raise InputError(f"{path}: weight {one_line(tensor.name)!r} has a negative dim "
                             f"{list(tensor.dims)}; not a valid ONNX model")
    for info in (*model.graph.input, *model.graph.output):
        try:
            typed_entry(info)
        except ValueError:  # an element type number ONNX does not define, maybe nested
            raise InputError(f"{path}: value {info.name!r} has an element type ONNX does not "
                             f"define ({_elem_types(info.type)})") from None
    return {
        "file": path,
        "ir_version": model.ir_version,
        "producer": " ".join(filter(None, [model.producer_name, model.producer_version])) or None,
        "opsets": {op.domain or "ai.onnx": op.version for op in model.opset_import},
        "inputs": typed_inputs(model),  # a sequence's entry also has its "type" and "element"
        "outputs": [typed_entry(vi) for vi in model.graph.output],
        "nodes": sum(counts.values()),
        "ops": dict(sorted(counts.items())),
        # Model-local functions (FuseElementwise's, a dynamo export's): a node that calls one
        # is counted above under its name, the nodes of its body are not.
        "functions": [{"name": f"{f.domain}::{f.name}" if f.domain else f.name,
                       "nodes": len(f.node)} for f in model.functions],
        "initializers": sum(not constant for _, constant, _ in held),  # nested ones too
        "constant_tensors": sum(constant for _, constant, _ in held),  # of Constant nodes
        "weight_bytes": sum(_tensor_bytes(t) for t in weights),  # of both
        "nested_weight_bytes": sum(_tensor_bytes(t) for t, _, nested in held if nested),
        "external_data": any(t.data_location == TensorProto.EXTERNAL for t in weights),
        # Files the weights point to that are not beside the model: inspect reads dims only,
        # but the model will not load (compare, diff and optimize refuse it).
        "missing_external_files": _missing_external_files(weights, path),
        # Locations outside the model's folder (absolute, or through ..), which loading refuses.
        "outside_external_files": _outside_external_files(weights, path),
        # What a graphopt compile edited of its source (--out-nodes, --insert-op-conf,
        # --input-fp16-nodes, --output-type).
        "outputs_cut": cut_outputs(model.metadata_props),
        "preprocess": inserted_preprocessing(model.metadata_props),
        "io_types": io_types(model.metadata_props),
    }


def _external_locations(weights) -> set[str]:
    return {entry.value for t in weights if t.data_location == TensorProto.EXTERNAL
            for entry in t.external_data if entry.key == "location"}


def _outside(folder: str, name: str) -> bool:
    resolved = os.path.normpath(os.path.join(folder, name))
    return os.path.isabs(name) or os.path.commonpath([folder, resolved]) != folder


def _missing_external_files(weights, path: str) -> list[str]:
    folder = os.path.dirname(os.path.abspath(path))
    return sorted(name for name in _external_locations(weights) if not _outside(folder, name)
                  and not os.path.isfile(os.path.join(folder, name)))


def _outside_external_files(weights, path: str) -> list[str]:
    folder = os.path.dirname(os.path.abspath(path))
    return sorted(name for name in _external_locations(weights) if _outside(folder, name))


def format_onnx(summary: dict) -> str:
    """The describe_onnx summary for a person."""
    constants = summary.get("constant_tensors", 0)
    weights = f"{summary['initializers']} initializers, " + (
        f"{constants} Constant node tensor(s), " if constants else "") + \
        format_bytes(summary["weight_bytes"])
    nested = summary.get("nested_weight_bytes", 0)
    if nested:
        weights += f" ({format_bytes(nested)} of it inside If/Loop/Scan bodies)"
    if summary["external_data"]:
        weights += " (some in external data)"
    missing = summary.get("missing_external_files")
    if missing:
        weights += (f"; missing beside the model: {', '.join(missing)} (it will not load "
                    "without them)")
    outside = summary.get("outside_external_files")
    if outside:
        weights += (f"; outside the model's folder: {', '.join(outside)} (compile and load "
                    "refuse external data there)")
    # The producer, the opset domains and the external data's file names are the model's
    # text (any byte): a line break in one printed a line of the model's making.
    weights = one_line(weights)
    header = [
        ("format", f"ONNX, IR version {summary['ir_version']}"
                   + (f", produced by {one_line(summary['producer'])}"
                      if summary["producer"] else "")),
        ("opsets", ", ".join(f"{one_line(d)} {v}" for d, v in summary["opsets"].items())),
        ("nodes", f"{summary['nodes']} ({len(summary['ops'])} op types)"),
        ("weights", weights),
        *source_edit_lines(summary.get("outputs_cut"), summary.get("preprocess"),
                           summary.get("io_types")),
    ]
    functions = summary.get("functions")
    if functions:
        shown = ", ".join(f"{one_line(f['name'])} ({f['nodes']} nodes)" for f in functions[:3])
        more = f", +{len(functions) - 3}" if len(functions) > 3 else ""
        header.insert(3, ("functions", f"{len(functions)} model-local: {shown}{more}"))
    width = max(len(key) for key, _ in header)
    parts = [f"{one_line(summary['file'])}\n"
             + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in header)]
    signature = [[direction, e["name"], *signature_cells(e)]
                 for direction, entries in (("input", summary["inputs"]), ("output", summary["outputs"]))
                 for e in entries]
    parts.append(format_table(["role", "tensor", "dtype", "shape"], signature, title="signature",
                              names={1}))
    ops = sorted(summary["ops"].items(), key=lambda item: (-item[1], item[0]))
    parts.append(format_table(["op type", "count"], [list(item) for item in ops], title="op types"))
    return "\n\n".join(parts)
