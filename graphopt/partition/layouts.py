"""Device data formats of NPU partitions: which values live in NC1HWC0, FRACTAL_Z or FRACTAL_NZ,
and the TransData conversions between formats, before and after cancelling those that meet.

The DaVinci cube reads activations of conv nets as NC1HWC0 (channels split into C1 blocks of
C0 = 16 fp16 / 32 int8 values, innermost), conv weights as FRACTAL_Z and matmul operands as
FRACTAL_NZ (16×16 fractals). Host tensors are ND (NCHW). A first assignment converts around every
cube and pooling op (the naive form); then format-agnostic ops (elementwise on equal shapes, or with
a constant operand, and a Concat of blocked activations along whole C0 blocks or another axis)
take the format their inputs arrive in, which cancels each pair of conversions that meet across
them — GE's TransData elimination. Weights are converted once at
compile time. onnxruntime cannot run these formats, so they stay annotations in the artifact: the
partition models keep ND tensors and the stand-in provider runs them unchanged. An NPU whose
profile has no cube engine gets no formats: they are the cube's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.ir import Node, Value
from graphopt.partition.placement import data_dtype
from graphopt.table import wrap_to_terminal

if TYPE_CHECKING:
    from graphopt.partition.partitioner import Partition, Partitioning

ND = "ND"
NC1HWC0 = "NC1HWC0"
FRACTAL_Z = "FRACTAL_Z"
FRACTAL_NZ = "FRACTAL_NZ"
NDC1HWC0 = "NDC1HWC0"          # a 3-D conv's activations
FRACTAL_Z_3D = "FRACTAL_Z_3D"  # and its weights

# Activation and weight formats of a conv or pooling op by its data rank: CANN runs a 1-D conv
# as a 2-D one over [N, C, 1, W], and a 3-D one in its own formats.
_SPATIAL_FORMATS = {3: (NC1HWC0, FRACTAL_Z), 4: (NC1HWC0, FRACTAL_Z),
                    5: (NDC1HWC0, FRACTAL_Z_3D)}

_CONV = {"Conv", "FusedConv", "ConvTranspose"}
_SPATIAL = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization",
            "LpPool", "Resize", "Upsample", "InstanceNormalization"}
_MATMUL = {"MatMul", "FusedMatMul", "Gemm", "FusedGemm"}
_AGNOSTIC = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Elu",
             "Selu", "Gelu", "FastGelu", "QuickGelu", "Erf", "Exp", "Log", "Abs", "Neg", "Sqrt",
             "Reciprocal", "Softplus", "Mish", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
             "Sum", "Mean", "Where", "Cast", "Identity", "Dropout", "PRelu",
             "QuantizeLinear", "DequantizeLinear"}  # per tensor on the NPU (quant_fit.py)


@dataclass
class PartitionLayout:
    """Formats and conversions of one NPU partition."""

    partition: str
    formats: dict[str, str] = field(default_factory=dict)         # value -> non-ND format
    weights: dict[str, str] = field(default_factory=dict)         # weight -> format, converted offline
    transdata: list[dict] = field(default_factory=list)           # {tensor, from, to, readers}
    naive_transdata: int = 0                                      # before cancellation

    def to_json(self) -> dict:
        return {"formats": dict(sorted(self.formats.items())),
                "weights": dict(sorted(self.weights.items())),
                "transdata": self.transdata, "naive_transdata": self.naive_transdata}


def assign_layouts(partitioning: Partitioning) -> dict[str, PartitionLayout]:
    """The format plan of every partition of an NPU with a cube engine, by partition name: the
    formats are the cube's, so host partitions, and those of an NPU without one, stay ND."""
    target = partitioning.target
    return {part.name: _layout(part, target.device(part.device))
            for part in partitioning.partitions
            if target.device(part.device).kind == "npu"
            and "cube" in target.device(part.device).engines.values()}


def _layout(part: Partition, device) -> PartitionLayout:
    layout = PartitionLayout(part.name)
    naive = _formats(part, device, propagate=False)
    naive_conversions = _conversions(part, *naive)
    layout.naive_transdata = len(naive_conversions)
    stored, wanted = _formats(part, device, propagate=True)
    layout.transdata = _conversions(part, stored, wanted)
    if len(layout.transdata) > len(naive_conversions):
        # Propagating a format into an elementwise op whose other operand is ND converts that
        # operand and the result back (a score matrix plus a bias computed at run time, before
        # a Softmax): two conversions for the one it saved. GE keeps the cheaper placement.
        stored, wanted = naive
        layout.transdata = naive_conversions
    layout.formats = {v.name: f for v, f in stored.items() if f != ND}
    for node in part.nodes:
        for index, value in enumerate(node.inputs):
            if value is not None and _is_weight(value) and _wants(node, index, device) != ND:
                layout.weights[value.name] = _wants(node, index, device)
    return layout


def _is_weight(value: Value) -> bool:
    """A constant, or a quantized one dequantized: AMCT stores it int8 offline, in the format
    its reader wants, so it is converted once at compile time too."""
    producer = value.producer
    return value.is_constant or (producer is not None and producer.op_type == "DequantizeLinear"
                                 and producer.is_onnx and producer.inputs[0].is_constant)


def _wants(node: Node, index: int, device) -> str:
    """The format a cube or pooling op reads input `index` in (ND for the rest, and for a conv
    or matmul the device runs on another engine than its cube)."""
    op = node.op_type
    value = node.inputs[index]
    rank = len(value.shape) if value is not None and value.shape is not None else None
    if (op in _CONV or op in _MATMUL) and not device.on_cube(op, node.domain, data_dtype(node)):
        return ND
    activations, weights = _SPATIAL_FORMATS.get(rank, (ND, ND))
    if op in _CONV:
        return {0: activations, 1: weights}.get(index, ND)
    if op in _SPATIAL:
        return activations if index == 0 else ND
    if op in _MATMUL:
        return FRACTAL_NZ if index in (0, 1) and rank is not None and rank >= 2 else ND
    return ND


def _makes(node: Node, device) -> str:
    """The format a cube or pooling op writes its output in."""
    out = node.outputs[0]
    rank = len(out.shape) if out is not None and out.shape is not None else None
    if (node.op_type in _CONV or node.op_type in _MATMUL) \
            and not device.on_cube(node.op_type, node.domain, data_dtype(node)):
        return ND
    if node.op_type in _CONV or node.op_type in _SPATIAL:
        return _SPATIAL_FORMATS.get(rank, (ND, ND))[0]
    if node.op_type in _MATMUL:
        return FRACTAL_NZ if rank is not None and rank >= 2 else ND
    return ND


def _formats(part: Partition, device,
             propagate: bool) -> tuple[dict[Value, str], dict[tuple, str]]:
    """(stored format per value made in the partition, wanted format per (reader, input index))."""
    stored: dict[Value, str] = {}
    wanted: dict[tuple[Node, int], str] = {}
    for node in part.nodes:
        data = [(i, v) for i, v in enumerate(node.inputs) if v is not None and not _is_weight(v)]
        # An elementwise op on equal shapes runs in the one device format its inputs arrive in
        # (ND inputs are converted to it: a residual branch joins the conv chain's format).
        device_formats = {stored.get(v, ND) for _, v in data} - {ND}
        shapes = {v.shape for _, v in data}
        follow = None
        if (propagate and node.op_type in _AGNOSTIC and len(device_formats) == 1
                and len(shapes) == 1 and None not in shapes
                and all(o is None or o.shape in shapes for o in node.outputs)):
            follow = next(iter(device_formats))
        elif propagate and len(device_formats) == 1 and _concat_in_blocks(node, data):
            follow = next(iter(device_formats))
        for index, value in data:
            wanted[(node, index)] = follow or _wants(node, index, device)
        for value in node.outputs:
            if value is not None:
                stored[value] = follow or _makes(node, device)
    return stored, wanted


def _concat_in_blocks(node: Node, data: list[tuple[int, Value]]) -> bool:
    """Whether a Concat of blocked activations (NC1HWC0, NDC1HWC0) joins them as they are
    stored: along N or a spatial axis always, along C when each input's channels fill whole C0
    blocks (16 values, 32 for int8), where it joins their C1 blocks (a DenseNet's or an RRDB's
    channel Concat of 32-channel growths); none of its inputs is a weight."""
    if node.op_type != "Concat" or not node.is_onnx or len(data) != len(node.inputs):
        return False
    shapes = [v.shape for _, v in data]
    if any(s is None or len(s) not in (4, 5) for s in shapes) or len({len(s) for s in shapes}) != 1:
        return False
    axis = node.attr("axis")
    axis = None if axis is None else axis % len(shapes[0])
    if axis != 1:
        return axis is not None
    block = 32 if data_dtype(node) in ("int8", "uint8") else 16
    return all(isinstance(s[1], int) and s[1] % block == 0 for s in shapes)


def _conversions(part: Partition, stored: dict, wanted: dict) -> list[dict]:
    """One TransData per (tensor, from, to): where a value's stored format is not the format a
    reader in the partition, or the host after it, reads it in."""
    members = set(part.nodes)
    found: dict[tuple[str, str, str], list[str]] = {}
    for (node, index), want in wanted.items():
        value = node.inputs[index]
        if _is_weight(value):
            continue
        have = stored.get(value, ND)  # partition inputs arrive from the host in ND
        if have != want:
            found.setdefault((value.name, have, want), []).append(node.name or node.op_type)
    for value in part.outputs:  # leaving for the host or the caller
        have = stored.get(value, ND)
        if have != ND:
            readers = [u.node.name for u in value.uses if u.node not in members] or ["(caller)"]
            found.setdefault((value.name, have, ND), []).extend(readers)
    return [{"tensor": t, "from": a, "to": b, "readers": readers}
            for (t, a, b), readers in found.items()]


def layout_summary(layouts: dict[str, PartitionLayout]) -> str:
    """One line per NPU partition: values per format, weights converted offline, TransData."""
    lines = []
    for name, layout in layouts.items():
        counts = Counter(layout.formats.values())
        weights = Counter(layout.weights.values())
        formats = ", ".join(f"{n} {f}" for f, n in sorted(counts.items())) or "all ND"
        offline = ", ".join(f"{n} {f}" for f, n in sorted(weights.items())) or "none"
        lines.append(wrap_to_terminal(f"{name}: values {formats}; weights converted offline: "
                                      f"{offline}; TransData {len(layout.transdata)} (naive "
                                      f"placement: {layout.naive_transdata})", hang="  "))
    return "\n".join(lines)
