"""Channel equalization before INT8: per-channel scales moved into the weights of the layers
around a scale-equivariant region, so that every activation quantized in it uses its range
more evenly.

A region is a set of tensors joined by ops that commute with a positive scale of each channel
(Relu, LeakyRelu, PRelu, pooling, a ReduceMean or ReduceMax over the spatial axes, Identity,
a Flatten or Reshape of 1×1 maps, an Add or Sum of region tensors), written by Conv or Gemm
layers (or their fused forms with such an activation) and read by Conv or Gemm layers only: a ResNet
bottleneck's inner activations, or a whole stage's residual stream, written by each block's
last conv and its projection shortcut and read by the next blocks' first convs. Multiplying
the writers' output channel c by s_c and dividing the readers' input channel c by s_c leaves
the float model's outputs as they were, up to float rounding, and every tensor of the region
carries channel c s_c times larger.

An activation quantized per tensor takes its step from its widest channel, so a channel of
range R_c under a widest R rounds with an error R / R_c times larger, relative to its values,
than the widest one's. Scaled up by s_c, channel c keeps the same step and its error, divided
back by s_c in the reader, shrinks by s_c. The reader's weights, quantized per output channel,
then hold column c s_c times smaller, whose rounding errors grow by s_c in turn:
s_c = √(R / R_c), clipped to [1, MAX_SCALE], splits the difference, as cross-layer equalization
balances two layers' weight ranges (Nagel et al., "Data-Free Quantization Through Weight
Equalization and Bias Correction", 2019), here by the activations' ranges over the calibration
data. On the zoo's ResNet-50 (bench/precision.py) it cuts the mean logit error of the INT8
`.om` from 0.0063σ to 0.0050σ on each of five 256-image sets, at no cost at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphopt.ir import DType, Model, Node, Value
from graphopt.source_marks import record_rescaled

# A channel is scaled up by at most this much: past it, the readers' weight columns shrink
# until their rounding, not the activation's, dominates. √(R / R_c) up to 16 gave the zoo's
# ResNet-50 the least error of the three settings tried (mean logit error 0.0050σ, against
# 0.0054σ for (R / R_c)^0.75 up to 32 and 0.0063σ, no gain, for R / R_c up to 64).
MAX_SCALE = 16.0

# Ops whose output channel c is f(s_c·x) = s_c·f(x) of their first input's channel c, for s_c > 0.
_THROUGH = {"Relu", "LeakyRelu", "PRelu", "MaxPool", "AveragePool", "GlobalAveragePool",
            "GlobalMaxPool", "Identity"}
# Reductions that do so over the axes they reduce, when those leave the channel axis alone.
_REDUCE = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum"}
# FusedConv and FusedGemm activations that commute with a positive scale (not Clip's bounds,
# nor Sigmoid).
_HOMOGENEOUS = {None, "Relu", "LeakyRelu"}


@dataclass
class Region:
    """Tensors that must carry one channel scale, with the layers that write and read them."""

    members: list[Value] = field(default_factory=list)
    writers: list[Node] = field(default_factory=list)
    readers: list[Node] = field(default_factory=list)
    blocked: bool = False


def equalize_channels(model: Model, extents) -> int:
    """Scale the channels of every region of `model`'s main graph (see the module docstring);
    `extents(names)` gives each named tensor's largest |value| per channel (axis 1) over the
    calibration data. Returns how many regions were scaled."""
    regions = [r for r in _regions(model) if not r.blocked and r.writers and r.readers]
    if not regions:
        return 0
    measured = extents(sorted({v.name for r in regions for v in r.members}))
    scaled = 0
    for region in regions:
        scales = _scales(region, measured)
        if scales is not None:
            _apply(model.graph, region, scales)
            # Their names stay (notes and statistics name them), their contents do not: compare
            # must not pair them with the float model's tensors of those names.
            record_rescaled(model.metadata_props, [v.name for v in region.members])
            scaled += 1
    return scaled


def _scales(region: Region, measured: dict[str, np.ndarray]) -> np.ndarray | None:
    channels = _channels(region.writers[0])
    seen = [measured[v.name] for v in region.members
            if v.name in measured and measured[v.name].shape == (channels,)]
    if not seen:
        return None
    extent = np.max(seen, axis=0).astype(np.float64)
    widest = float(extent.max())
    if not np.isfinite(widest) or widest <= 0:
        return None
    # A channel that never fired (extent 0) keeps its scale: nothing of it is rounded.
    bounded = np.sqrt(widest / np.maximum(extent, widest / MAX_SCALE ** 2))  # ≤ MAX_SCALE
    scales = np.maximum(np.where(extent > 0, bounded, 1.0), 1.0)
    return None if np.all(scales == 1) else scales


# --- regions -----------------------------------------------------------------------------------


def _regions(model: Model) -> list[Region]:
    """The regions of the main graph: its float tensors, joined through the ops _joins takes."""
    graph = model.graph
    parent: dict[int, Value] = {}

    def find(value: Value) -> Value:
        root = value
        while id(root) in parent and parent[id(root)] is not root:
            root = parent[id(root)]
        parent[id(value)] = root
        return root

    def join(a: Value, b: Value) -> None:
        parent.setdefault(id(a), a)
        parent.setdefault(id(b), b)
        parent[id(find(a))] = find(b)

    for node in graph:
        if _joins(node):
            for value in _joined_inputs(node):
                join(value, node.outputs[0])
    regions: dict[int, Region] = {}
    for value in _activations(graph):
        region = regions.setdefault(id(find(value)), Region())
        region.members.append(value)
    for region in regions.values():
        _connect(region, graph)
    return list(regions.values())


def _activations(graph) -> list[Value]:
    """The float tensors the main graph's nodes compute, each once."""
    out: dict[int, Value] = {}
    for node in graph:
        for value in node.outputs:
            if value is not None and value.dtype == DType.FLOAT:
                out[id(value)] = value
    return list(out.values())


def _connect(region: Region, graph) -> None:
    """Fill the region's writers and readers; block it when anything else computes or reads
    one of its tensors, or a layer cannot take the scale."""
    ids = {id(v) for v in region.members}
    channels: set[int] = set()
    for value in region.members:
        producer = value.producer
        if value.is_graph_output or value.shape is None or len(value.shape) < 2:
            region.blocked = True
            return
        if isinstance(value.shape[1], int):
            channels.add(value.shape[1])
        if producer is None:
            region.blocked = True
            return
        if _writes(producer):
            region.writers.append(producer)
        elif not _joins(producer) or any(id(v) not in ids for v in _joined_inputs(producer)):
            # Also a Relu of a graph input, or an Add of a tensor of another dtype.
            region.blocked = True
            return
        for use in value.uses:
            node = use.node
            if node.graph is not graph:  # read inside an If or Loop body
                region.blocked = True
                return
            if use.index == 0 and _reads(node):
                if node not in region.readers:
                    region.readers.append(node)
            elif not ((_joins(node) and id(node.outputs[0]) in ids
                       and use.index < len(_joined_inputs(node))) or node.op_type == "Shape"):
                region.blocked = True
                return
    layers = {_channels(n) for n in region.writers} | {_input_channels(n) for n in region.readers}
    if len(channels | layers) != 1:
        region.blocked = True


def _joins(node: Node) -> bool:
    """Whether `node`'s output carries the channel scale of the inputs _joined_inputs names."""
    if node.op_type in ("Add", "Sum") and node.domain == "":
        # Of one rank: a broadcast [C, 1, 1] would hold its channels on axis 0.
        ranks = {len(v.shape) if v is not None and v.shape is not None else None
                 for v in node.inputs}
        return None not in ranks and len(ranks) == 1 \
            and not any(v.is_constant for v in node.inputs)
    return _passes_through(node)


def _joined_inputs(node: Node) -> tuple[Value, ...]:
    return node.inputs if node.op_type in ("Add", "Sum") else node.inputs[:1]


def _passes_through(node: Node) -> bool:
    if node.domain != "" or node.op_type not in _THROUGH | _REDUCE | {"Flatten", "Reshape"}:
        return False
    if any(v is not None and v.uses for v in node.outputs[1:]):  # MaxPool's indices, a mask
        return False
    if node.op_type in ("Flatten", "Reshape"):  # [N, C, 1, 1] → [N, C]: channel c stays c
        return _keeps_channels(node.inputs[0].shape, node.outputs[0].shape)
    if node.op_type == "PRelu":
        return node.inputs[1] is not None and node.inputs[1].is_constant
    if node.op_type in _REDUCE:
        return _spatial_reduction(node)
    return True


def _keeps_channels(before, after) -> bool:
    """Whether a reshape from `before` to `after` only drops or adds unit dims after the
    channel axis."""
    if before is None or after is None or len(before) < 2 or len(after) < 2:
        return False
    same = all(a is not None and a == b for a, b in zip(before[:2], after[:2]))
    return same and all(d == 1 for d in (*before[2:], *after[2:]))


def _spatial_reduction(node: Node) -> bool:
    """Whether a Reduce node reduces spatial axes only (2 and after), which keeps channel c at
    index 1: a global pool written as ReduceMean over (2, 3), as dynamo exports write it."""
    shape = node.inputs[0].shape
    if shape is None:
        return False
    if len(node.inputs) > 1 and node.inputs[1] is not None:  # opset 18: the axes as an input
        axes = node.inputs[1].constant()
    else:
        axes = node.attr("axes", None)
    if axes is None or len(np.ravel(axes)) == 0:  # every axis, or none, by noop_with_empty_axes
        return False
    return all(int(a) % len(shape) >= 2 for a in np.ravel(axes))


def _writes(node: Node) -> bool:
    """Whether `node` is a layer whose output channels can be scaled in its weights."""
    if node.op_type == "Conv" and node.domain == "":
        return _constant_weights(node)
    if node.op_type == "FusedConv" and node.domain == "com.microsoft":
        return node.attr("activation", None) in _HOMOGENEOUS and _constant_weights(node) \
            and (len(node.inputs) < 4 or node.inputs[3] is None)
    if _is_gemm(node):
        bias = node.input(2)
        return _constant_weights(node) and node.attr("transA", 0) == 0 \
            and node.attr("activation", None) in _HOMOGENEOUS \
            and (bias is None or (bias.shape is not None and len(bias.shape) == 1))
    return False


def _reads(node: Node) -> bool:
    """Whether `node` is a layer whose input channels can be scaled in its weights."""
    if (node.op_type, node.domain) in (("Conv", ""), ("FusedConv", "com.microsoft")):
        return _constant_weights(node)
    if _is_gemm(node):
        return _constant_weights(node) and node.attr("transA", 0) == 0
    return False


def _is_gemm(node: Node) -> bool:
    return (node.op_type, node.domain) in (("Gemm", ""), ("FusedGemm", "com.microsoft"))


def _constant_weights(node: Node) -> bool:
    weight, bias = node.input(1), node.input(2)
    return weight is not None and weight.is_constant and (bias is None or bias.is_constant)


def _channels(writer: Node) -> int:
    weight = writer.inputs[1].shape
    if _is_gemm(writer):
        return weight[0] if writer.attr("transB", 0) else weight[1]
    return weight[0]


def _input_channels(reader: Node) -> int:
    weight = reader.inputs[1].shape
    if _is_gemm(reader):
        return weight[1] if reader.attr("transB", 0) else weight[0]
    return weight[1] * int(reader.attr("group", 1))


# --- rewriting ---------------------------------------------------------------------------------


def _apply(graph, region: Region, scales: np.ndarray) -> None:
    for writer in region.writers:
        weight = writer.inputs[1].constant().astype(np.float64)
        if _is_gemm(writer) and not writer.attr("transB", 0):
            weight = weight * scales[None, :]
        else:
            weight = weight * scales.reshape(-1, *[1] * (weight.ndim - 1))
        _replace(graph, writer, 1, weight)
        bias = writer.input(2)
        if bias is not None:
            _replace(graph, writer, 2, bias.constant().astype(np.float64) * scales)
    for reader in region.readers:
        weight = reader.inputs[1].constant().astype(np.float64)
        if _is_gemm(reader):
            weight = weight / (scales[None, :] if reader.attr("transB", 0) else scales[:, None])
        else:  # [O, C/g, …]: output o reads the input channels of its group
            groups = int(reader.attr("group", 1))
            per_group = weight.shape[1]
            group_of = np.arange(weight.shape[0]) // (weight.shape[0] // groups)
            columns = scales.reshape(groups, per_group)[group_of]
            weight = weight / columns.reshape(*columns.shape, *[1] * (weight.ndim - 2))
        _replace(graph, reader, 1, weight)


def _replace(graph, node: Node, index: int, array: np.ndarray) -> None:
    """Give `node` input `index` a new initializer of `array` (in the old one's dtype): another
    node may share the old one, which is dropped when nothing reads it any more."""
    old = node.inputs[index]
    node.set_input(index, graph.make_initializer(old.name, array.astype(old.constant().dtype)))
    if not old.uses and not old.is_graph_output and not old.is_input:
        graph.remove_initializer(old)
