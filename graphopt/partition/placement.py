"""Placement: which device runs each node, by the target's kernel tables, and why a node falls back.

A node goes to the target's primary device (the NPU) when that device has a kernel for its op
and the node meets the kernel's constraints; otherwise it goes to the host CPU with the first
reason found, in the order a user would fix them: op, dtype, rank, attribute, quantization form
(quant_fit.py), dynamic shape.
A call of a model-local function (an elementwise group of FuseElementwise) is one kernel on the
device: it is placed there when every op of its body is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from graphopt.codegen.om_manifest import dtype_name
from graphopt.ir import Model, Node, Value
from graphopt.partition.body_types import body_ranks, body_types
from graphopt.partition.quant_fit import qdq_problem
from graphopt.partition.target_ort import op_key
from graphopt.passes.fusion.elementwise import DOMAIN as GROUP_DOMAIN

if TYPE_CHECKING:
    from graphopt.partition.target import Device, OpSupport, Target


@dataclass(frozen=True)
class Placement:
    device: str              # a device name of the target ("npu", "cpu")
    engine: str | None       # the engine whose kernel runs it; None on a device without engines
    reason: str | None = None  # why the node is not on the primary device; None when it is


def place(model: Model, target: Target) -> dict[Node, Placement]:
    """A placement for every node of the main graph, in graph order."""
    primary = target.device(target.primary)
    functions = {(f.domain, f.name): f for f in model.functions}
    # An attribute's default is its opset's: GridSample's mode is bilinear at 16, linear at 20.
    opsets = {domain or "": version for domain, version in model.opset_imports.items()}
    opsets.setdefault("", opsets.get("ai.onnx"))
    placements = {}
    for node in model.graph:
        engine, reason = _fit(node, primary, functions, opsets)
        if reason is None:
            placements[node] = Placement(primary.name, engine)
        else:
            placements[node] = Placement(target.host, _host_engine(target), reason)
    return placements


def _host_engine(target: Target) -> str | None:
    engines = target.device(target.host).engines
    return next(iter(engines), None)


# The cube ops a model's own function may hold (graphopt's groups, -O3's FuseElementwise, have
# their conv or GEMM epilogues priced as one cube kernel).
_CUBE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def _fit(node: Node, device: Device, functions: dict,
         opsets: dict) -> tuple[str | None, str | None]:
    """(engine, None) when `device` runs `node`, else (None, the reason it cannot)."""
    function = functions.get((node.domain, node.op_type))
    if function is not None and device.kind != "cpu":
        return _fit_function(node, function, device, opsets)
    support = device.kernel(node.op_type, node.domain, data_dtype(node))
    if support is None:
        return None, _no_kernel(device, node.op_type, node.domain)
    reason = (_dtype_problem(node, support) or _rank_problem(node, support)
              or _absent_input_problem(node, support) or _head_size_problem(node, support)
              or attribute_problem(node.attr, support, node.op_type, node.domain,
                                   _data_rank(node), opsets.get(node.domain))
              or _output_problem(node, support, device.name)
              or (qdq_problem(node, device, functions) if device.kind == "npu" else None)
              or _shape_problem(node, device))
    return (None, reason) if reason else (support.engine, None)


def _no_kernel(device: Device, op: str, domain: str) -> str:
    """Why `device` runs no `op`: its profile leaves it to the host (and says why), or the
    device has no kernel for it."""
    shown = op if domain in ("", "ai.onnx") else f"{domain}::{op}"
    why = device.host_ops.get(op_key(op, domain))
    if why is not None:
        return f"{device.name} profile leaves {shown} to the host: {why}"
    return f"no {device.name} kernel for {shown}"


def _fit_function(node: Node, function, device: Device,
                  opsets: dict) -> tuple[str | None, str | None]:
    # The body's ops run as one fused vector kernel: each must exist for the dtypes it reads
    # and writes inside the body (a Cast to double, a comparison's bool) and take the call's
    # rank (an elementwise body's tensors have the call's) and its attributes.
    dtypes = body_types(node, function) or {}
    # Each op at the ranks of its own tensors: an epilogue group's Gemm is rank 2 where the Add
    # after it broadcasts to rank 3 (the call's rank stands in where inference cannot tell).
    ranks = body_ranks(node, function) or {}
    rank = max((len(v.shape) for v in _tensors(node) if v.shape is not None), default=None)
    engine = None
    if function.domain != GROUP_DOMAIN and any(
            inner.op_type in _CUBE_OPS and inner.domain in ("", "ai.onnx")
            for inner in function.node):
        # A model's own function left uninlined (at -O0, or refused by ONNX's inliner): its
        # conv or GEMM reads the body's own constants, which no tiling of a call can see.
        return None, (f"a model-local function with a {'/'.join(sorted(_CUBE_OPS))} inside "
                      f"({node.qualified_op}, not inlined) runs on the host")
    for inner in function.node:
        if inner.op_type == "Constant" and inner.domain in ("", "ai.onnx"):
            continue  # a constant of the body: data, not a kernel
        where = f"(inside {node.qualified_op})"
        data = inner.input[_data_index(inner.op_type)] if inner.input else None
        read, written = dtypes.get(data), dtypes.get(inner.output[0]) if inner.output else None
        support = device.kernel(inner.op_type, inner.domain, read or written)
        if support is None:
            return None, (f"{_no_kernel(device, inner.op_type, inner.domain)} "
                          f"inside {node.qualified_op}")
        for dtype in (read, written):
            if dtype and support.dtypes and dtype not in support.dtypes:
                return None, f"{device.name} {inner.op_type} does not take {dtype} {where}"
        own = [ranks[name] for name in (*inner.input, *inner.output) if name in ranks]
        inner_rank = max(own) if own else rank
        if support.max_rank is not None and inner_rank is not None \
                and inner_rank > support.max_rank:
            return None, (f"rank {inner_rank} above {support.op}'s limit {support.max_rank} "
                          f"{where}")
        attrs = _body_attrs(inner, node, function)
        problem = attribute_problem(attrs.get, support, inner.op_type, inner.domain,
                                    ranks.get(data, rank), opsets.get(inner.domain))
        if problem:
            return None, f"{problem} {where}"
        engine = engine or support.engine
    reason = _shape_problem(node, device)
    return (None, reason) if reason else (engine, None)


def _body_attrs(inner, node: Node, function) -> dict:
    """`inner`'s attributes, a reference (ref_attr_name) read from the call, else the
    function's default for it; one neither gives is left out (its op default applies)."""
    defaults = {a.name: a for a in function.attribute_proto}
    attrs = {}
    for a in inner.attribute:
        if a.ref_attr_name:
            if a.ref_attr_name in node.attrs:
                attrs[a.name] = node.attr(a.ref_attr_name)
            elif a.ref_attr_name in defaults:
                attrs[a.name] = onnx.helper.get_attribute_value(defaults[a.ref_attr_name])
            continue
        attrs[a.name] = onnx.helper.get_attribute_value(a)
    return attrs


def _data_rank(node: Node) -> int | None:
    """The rank of the data input a kernel is chosen by (see _data_index)."""
    index = _data_index(node.op_type)
    value = node.inputs[index] if len(node.inputs) > index else None
    return len(value.shape) if value is not None and value.shape is not None else None


def _data_index(op_type: str) -> int:
    """Which input holds the data a kernel is chosen by: Where's first is its bool condition."""
    return 1 if op_type == "Where" else 0


def data_dtype(node: Node) -> str | None:
    """The dtype a kernel is chosen by: its data input's (see _data_index), else the first
    typed input's or output's (an output's for sources)."""
    index = _data_index(node.op_type)
    inputs = list(node.inputs)
    data = inputs[index:index + 1] if len(inputs) > index else []
    for value in data + inputs + list(node.outputs):
        if value is not None and value.dtype is not None:
            return dtype_name(int(value.dtype))
    return None


def _dtype_problem(node: Node, support: OpSupport) -> str | None:
    if not support.dtypes:
        return None
    # The data operand in and the result out: index inputs (shapes, axes, indices) are the
    # kernel's business, and Cast/Shape legitimately change type between the two.
    index = _data_index(node.op_type)
    checked = [node.inputs[index] if len(node.inputs) > index else None,
               node.outputs[0] if node.outputs else None]
    for value in checked:
        if value is None or value.dtype is None:
            continue
        name = dtype_name(int(value.dtype))
        if name not in support.dtypes:
            accepted = ", ".join(sorted(support.dtypes))
            return f"dtype {name} of {_describe(value)}: {support.op} takes {accepted}"
    return None


def _absent_input_problem(node: Node, support: OpSupport) -> str | None:
    for index in support.absent_inputs:
        if index < len(node.inputs) and node.inputs[index] is not None:
            return f"input {index} (%{node.inputs[index].name}) of {support.op}: the kernel " \
                   "takes no such operand"
    return None


def _head_size_problem(node: Node, support: OpSupport) -> str | None:
    """A fused attention whose head size the kernel does not take (profile's `head_size`)."""
    if not support.head_size:
        return None
    from graphopt.tuner.attention import attention_work

    work = attention_work(node)
    if work is None:
        return None
    largest, step = support.head_size.get("max"), support.head_size.get("multiple_of", 1)
    for size in dict.fromkeys((work.head_size, work.value_head_size)):
        if largest is not None and size > largest or size % step:
            limits = head_size_words(support.head_size)
            return f"head size {size} of {support.op}: the kernel takes {limits}"
    return None


def head_size_words(limits) -> str:
    """`limits` ({max, multiple_of}) as words: "up to 512, a multiple of 16"."""
    bounds = [f"up to {limits['max']}"] if "max" in limits else []
    bounds += [f"a multiple of {limits['multiple_of']}"] if "multiple_of" in limits else []
    return ", ".join(bounds)


def _rank_problem(node: Node, support: OpSupport) -> str | None:
    if support.max_rank is None:
        return None
    # The inputs and the result: a later output is a by-product in the layout onnxruntime's
    # contrib op packs it, such as Attention's present ([2, B, N, S, H], K and V stacked),
    # which a device computes as the K and V it has anyway.
    checked = [v for v in [*node.inputs, *node.outputs[:1]] if v is not None and v.is_tensor]
    for value in checked:
        if value.shape is not None and len(value.shape) > support.max_rank:
            return f"rank {len(value.shape)} of {_describe(value)} above {support.op}'s limit {support.max_rank}"
    return None


def attribute_problem(attr, support: OpSupport, op_type: str, domain: str,
                      rank: int | None = None, opset: int | None = None) -> str | None:
    """Why an attribute value (`attr(name)`, None when not set: its schema default at `opset`,
    None: the newest) is not one the kernel takes for a data input of `rank`."""
    at_rank = rank is not None and rank in support.rank_attributes
    for name, allowed in support.attributes_at(rank).items():
        value = attr(name)
        if value is None:
            # The default: a profile that allows Resize's linear mode alone does not take an
            # unset mode, which is nearest.
            value = _schema_default(op_type, domain, name, opset)
            if value is None:
                continue
        if isinstance(value, bytes):
            value = value.decode()
        if isinstance(value, list):
            value = tuple(value)
        if not any(_same_value(value, a) for a in allowed):
            choices = ", ".join(str(a) for a in allowed)
            shown = tuple(map(_as_written, value)) if isinstance(value, tuple) \
                else _as_written(value)
            where = f" at rank {rank}" if at_rank and name in support.rank_attributes[rank] else ""
            return f"attribute {name}={shown!r} of {support.op}{where}: takes {choices}"
    for name, (low, high) in support.attribute_ranges.items():
        value = attr(name)
        if value is None:
            value = _schema_default(op_type, domain, name, opset)
        values = value if isinstance(value, (list, tuple)) else [value]
        if value is not None and not all(low <= v <= high for v in values):
            shown = list(map(_as_written, values)) if isinstance(value, (list, tuple)) \
                else _as_written(value)
            return f"attribute {name}={shown!r} of {support.op}: takes {low:g} to {high:g}"
    return None


@functools.lru_cache(maxsize=None)
def _schema_default(op_type: str, domain: str, name: str, opset: int | None = None):
    """The default the op's schema at `opset` (None: the newest) gives the attribute (None:
    none known)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain) if opset is not None \
            else onnx.defs.get_schema(op_type, domain=domain)
    except onnx.defs.SchemaError:
        return None
    attribute = schema.attributes.get(name)
    if attribute is None or not attribute.default_value.name:
        return None
    return onnx.helper.get_attribute_value(attribute.default_value)


def _output_problem(node: Node, support: OpSupport, device: str) -> str | None:
    """A later output the kernel does not compute, which a node or the caller reads (an
    unread one, such as an exporter's unused MaxPool Indices, costs nothing)."""
    if support.max_outputs is None:
        return None
    for index, value in enumerate(node.outputs[support.max_outputs:], support.max_outputs):
        if value is not None and (value.uses or value.is_graph_output):
            first = "the first output" if support.max_outputs == 1 \
                else f"the first {support.max_outputs} outputs"
            return f"output {index} (%{value.name}) of {support.op} is read: the " \
                   f"{device} kernel computes only {first}"
    return None


def _as_written(value):
    """A float attribute (float32) as the decimal that reads back to it: 0.2, not
    0.20000000298023224."""
    return float(str(np.float32(value))) if isinstance(value, float) else value


def _same_value(value, allowed) -> bool:
    """Equal as an ONNX attribute holds it: a float attribute is float32, so the profile's 0.1
    means the float32 nearest 0.1."""
    if isinstance(allowed, list):
        allowed = tuple(allowed)
    if isinstance(value, tuple) and isinstance(allowed, tuple):
        return len(value) == len(allowed) and all(map(_same_value, value, allowed))
    if isinstance(value, float) and isinstance(allowed, (int, float)) \
            and not isinstance(allowed, bool):
        return np.float32(value) == np.float32(allowed)
    return value == allowed


def _shape_problem(node: Node, device: Device) -> str | None:
    if not device.static_shapes_only:
        return None
    for value in _tensors(node):
        if value.static_shape is None:
            return f"dynamic shape: {_describe(value)}"
    return None


def _tensors(node: Node) -> list[Value]:
    values = [v for v in list(node.inputs) + list(node.outputs) if v is not None and v.is_tensor]
    return values


def _describe(value: Value) -> str:
    if value.shape is None:
        return f"%{value.name} (rank unknown)"
    dims = ",".join("?" if d is None else str(d) for d in value.shape)
    return f"%{value.name} [{dims}]"
