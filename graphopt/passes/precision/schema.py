"""Which inputs and outputs of a node change dtype with it: the type parameters of its schema
(ONNX's `onnx.defs`, onnxruntime's for com.microsoft and other contrib domains) that are bound
to float32 and admit the half dtype.

A type parameter is converted as a whole (every slot bound to T changes together, as the schema
demands); a slot with a fixed type ("tensor(float)": Resize's scales) keeps float32. Some
parameters stay float32 on purpose: a normalization's statistics outputs (U) carry its float32
stash type, which keeps the accumulation in float32.

A node that reads or writes a sequence or optional of float32 keeps float32 whole: the schema
types the container (S) and its elements (T) with separate parameters and never says they
agree, so converting T alone would leave a seq(tensor(float)) holding float16 tensors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx.defs

from graphopt.ir import DType, Node

_TYPE_STR = {DType.FLOAT16: "tensor(float16)", DType.BFLOAT16: "tensor(bfloat16)"}
# (op type, parameter) pairs kept float32: the normalization statistics, computed at stash_type.
_KEEP_PARAMS = {("LayerNormalization", "U"), ("SkipLayerNormalization", "U"),
                ("SimplifiedLayerNormalization", "U"), ("SkipSimplifiedLayerNormalization", "U")}
# Attributes holding the dtype of a converted output (Cast's `to`; RandomNormal's `dtype`,
# HannWindow's `output_datatype`, …), given or left to the schema's float32 default.
DTYPE_ATTRS = ("to", "dtype", "output_datatype")
# Ops never converted: BitCast reinterprets its input's bits as another type of the same
# width; the ai.onnx.ml ops' tensor attributes (TreeEnsemble's split values, …) are typed like
# their input, and a classical-ML model has nothing to gain from half precision. A model's own
# Q/DQ nodes keep float32 scales: an int16 activation's scale, or a bias's (activation scale ×
# weight scale, ~1e-8), is a float16 subnormal or zero, and a Q/DQ pair must share its scale;
# so do the QLinear ops, whose scales are the same (and which the CPU runs in float32 only).
_NEVER_CONVERTED = {("", "BitCast"), ("", "QuantizeLinear"), ("", "DequantizeLinear"),
                    ("", "DynamicQuantizeLinear"), ("com.microsoft", "QuantizeLinear"),
                    ("com.microsoft", "DequantizeLinear"), ("", "QLinearMatMul"),
                    ("", "QLinearConv"), ("com.microsoft", "QLinearAdd"),
                    ("com.microsoft", "QLinearMul"), ("com.microsoft", "QLinearConcat"),
                    ("com.microsoft", "QLinearSigmoid"), ("com.microsoft", "QLinearLeakyRelu"),
                    ("com.microsoft", "QLinearGlobalAveragePool"),
                    ("com.microsoft", "QLinearAveragePool"), ("com.microsoft", "QLinearSoftmax")}
_NEVER_CONVERTED_DOMAINS = {"ai.onnx.ml"}


@dataclass(frozen=True)
class Slots:
    """Input and output positions of one node that become the half dtype."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def _variadic(param) -> bool:
    return param.option == onnx.defs.OpSchema.FormalParameterOption.Variadic


@functools.cache
def _contrib_schemas() -> dict[tuple[str, str], list]:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    table: dict[tuple[str, str], list] = {}
    for schema in ort_c.get_all_operator_schema():
        table.setdefault((schema.domain, schema.name), []).append(schema)
    for versions in table.values():
        versions.sort(key=lambda s: s.since_version)
    return table


@dataclass(frozen=True)
class _Formal:
    type_str: str
    variadic: bool


@functools.cache
def _signature(op: str, domain: str, opset: int | None):
    """(inputs, outputs, allowed types per parameter) of the schema in force, or None."""
    if domain in ("", "ai.onnx"):
        try:
            schema = onnx.defs.get_schema(op, opset or onnx.defs.onnx_opset_version(), "")
        except onnx.defs.SchemaError:
            return None
        ins = [_Formal(p.type_str, _variadic(p)) for p in schema.inputs]
        outs = [_Formal(p.type_str, _variadic(p)) for p in schema.outputs]
    else:
        versions = _contrib_schemas().get((domain, op))
        if not versions:
            return None
        fitting = [s for s in versions if opset is None or s.since_version <= opset]
        schema = (fitting or versions)[-1]
        ins = [_Formal(p.typeStr, _variadic(p)) for p in schema.inputs]
        outs = [_Formal(p.typeStr, _variadic(p)) for p in schema.outputs]
    allowed = {t.type_param_str: frozenset(t.allowed_type_strs) for t in schema.type_constraints}
    return ins, outs, allowed


def _param(formals: list[_Formal], index: int) -> str | None:
    if index < len(formals):
        return formals[index].type_str
    if formals and formals[-1].variadic:
        return formals[-1].type_str
    return None


def float_dtype_attrs(node: Node, opset: int | None) -> list[str]:
    """The DTYPE_ATTRS of `node` that make an output float32: set to it, or absent where the
    schema's default is float32 (RandomUniform's `dtype`, the window ops' `output_datatype`)."""
    names = []
    for name in DTYPE_ATTRS:
        if name in node.attrs:
            if node.attr(name) == int(DType.FLOAT):
                names.append(name)
        elif _attr_default(node.op_type, node.domain, opset, name) == int(DType.FLOAT):
            names.append(name)
    return names


@functools.cache
def _attr_default(op: str, domain: str, opset: int | None, name: str) -> int | None:
    if domain not in ("", "ai.onnx"):
        return None
    try:
        schema = onnx.defs.get_schema(op, opset or onnx.defs.onnx_opset_version(), "")
    except onnx.defs.SchemaError:
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.HasField("i"):
        return None
    return attr.default_value.i


def has_schema(node: Node, opset: int | None) -> bool:
    return _signature(node.op_type, node.domain, opset) is not None


def schema_lacks(node: Node, half: DType, opset: int | None) -> bool:
    """Whether `node` has a float32 value that only its schema at `opset` keeps from `half`
    (a type parameter that admits float but not `half`, as Conv before opset 22 for bfloat16)."""
    signature = _signature(node.op_type, node.domain, opset)
    if signature is None:
        return False
    ins, outs, allowed = signature
    for formals, values in ((ins, node.inputs), (outs, node.outputs)):
        for index, value in enumerate(values):
            param = _param(formals, index)
            if value is None or param not in allowed or value.dtype != DType.FLOAT:
                continue
            types = allowed[param]
            if "tensor(float)" in types and _TYPE_STR[half] not in types:
                return True
    return False


def _holds_float(type_proto) -> bool:
    """Whether a tensor, sequence, optional or map type has float32 elements."""
    which = type_proto.WhichOneof("value")
    if which == "tensor_type":
        return type_proto.tensor_type.elem_type == DType.FLOAT
    if which == "sequence_type":
        return _holds_float(type_proto.sequence_type.elem_type)
    if which == "optional_type":
        return _holds_float(type_proto.optional_type.elem_type)
    if which == "map_type":
        return _holds_float(type_proto.map_type.value_type)
    return False


def _float_container(value, types: frozenset[str]) -> bool:
    """Whether `value` is a sequence or optional of float32, or is untyped where its parameter
    admits one (shape inference may leave a sequence untyped: assume the worst)."""
    if value.type_proto is not None:
        return _holds_float(value.type_proto)
    return value.dtype is None and any(t != "tensor(float)" and "tensor(float)" in t
                                       for t in types)


def never_converted(node: Node) -> bool:
    """Whether `node` keeps float32 by design (a Q/DQ op, BitCast, an ai.onnx.ml op), not for
    want of a half schema."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    return (domain, node.op_type) in _NEVER_CONVERTED or domain in _NEVER_CONVERTED_DOMAINS


def in_qdq_group(node: Node) -> bool:
    """Whether `node` is an int8 layer: between DequantizeLinear and QuantizeLinear nodes, the
    group onnxruntime runs as one int8 kernel (QLinearConv, QLinearMatMul, …), or a Conv, Gemm
    or MatMul reading dequantized data and weights (AMCT's form, with no QuantizeLinear after:
    the NPU kernel dequantizes in its epilogue). In float16, Casts would come between and the
    layer would run in float16 instead of int8."""
    dequantized = [v is not None and v.producer is not None
                   and v.producer.op_type == "DequantizeLinear" for v in node.inputs]
    if node.op_type in _INT8_LAYERS and len(dequantized) > 1 and all(dequantized[:2]):
        return True  # AMCT's form too, whose int8 kernel dequantizes in its epilogue: no Q after
    return any(dequantized) and any(consumer.op_type == "QuantizeLinear" for v in node.outputs
                                    if v is not None for consumer in v.consumers())


_INT8_LAYERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "FusedConv"})


def convertible_slots(node: Node, half: DType, opset: int | None) -> Slots | None:
    """The slots of `node` that become `half` if the node is converted; None when none would
    (no schema, no float32 slot, no float32-bound parameter admitting `half`, or a sequence or
    optional of float32 among its values)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if never_converted(node):
        return None
    if node.op_type == "BatchNormalization" and domain == "" and node.attr("training_mode", 0):
        # onnxruntime runs a float16 training-mode BatchNormalization in float32 and writes
        # its running statistics over the caller's mean and var arrays.
        return None
    signature = _signature(node.op_type, node.domain, opset)
    if signature is None:
        return None
    ins, outs, allowed = signature
    bound: dict[str, list[tuple[str, int]]] = {}
    for side, formals, values in (("in", ins, node.inputs), ("out", outs, node.outputs)):
        for index, value in enumerate(values):
            param = _param(formals, index)
            if value is None:
                continue
            if _float_container(value, allowed.get(param, frozenset())):
                return None
            if param in allowed:
                bound.setdefault(param, []).append((side, index))
    converted: list[tuple[str, int]] = []
    for param, slots in bound.items():
        if _TYPE_STR[half] not in allowed[param] or (node.op_type, param) in _KEEP_PARAMS:
            continue
        values = [(node.inputs if side == "in" else node.outputs)[i] for side, i in slots]
        if all(v.dtype == DType.FLOAT for v in values):
            converted.extend(slots)
    if not converted:
        return None
    return Slots(tuple(sorted(i for side, i in converted if side == "in")),
                 tuple(sorted(i for side, i in converted if side == "out")))
