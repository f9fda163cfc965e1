"""LayoutNchwc per op: when onnxruntime's NchwcTransformer (1.32, found by running it with B = 8
on AVX2) converts an op, and the blocked node that replaces it. A handler gets the rewriter and
the node; it leaves the node alone (it then reads NCHW, behind a ReorderOutput), builds the
blocked replacement with `rw.add`, or folds the node into a blocked conv with `rw.adopt`.

  Conv, FusedConv   float32 weight [O, I, kh, kw] and bias [O] constant; FusedConv without Z.
                    group 1, I < B: reads the NCHW input itself (filter OIHWBo);
                    group 1, I ≥ B, I % 4 = 0: blocked input, filter OIHWBiBo (I padded to B);
                    depthwise (I = 1, O = group, O % 4 = 0): OIHWBo, group := O';
                    grouped: I and O/group multiples of B, OIHWBiBo.
  activation        Relu, Sigmoid, Tanh, LeakyRelu, HardSigmoid, Clip (constant bounds) or
                    HardSwish after a conv nobody else reads: the conv's `activation` and
                    `activation_params` (as FusedConv carries them), also after a fused Sum:
                    y = act(conv(x) + b + sum), MLAS's order.
  Add, Sum (2)      into a single-reader, activation-free conv as its Sum input (accumulated
                    in place), the first addend's conv first;
  Add, Sum, Mul, Sub, Min, Max   otherwise kept as they are on blocked inputs of equal shape
                    and channels;
  Add, Sub, Mul, Div, Min, Max   of a blocked input and a finite constant number (not a number
                    over the blocked input, nor a division by 0): kept as they are (graphopt's
                    own, beyond onnxruntime's rules);
  Add, Mul          of a blocked input and a constant per channel ([C,1,1] or [1,C,1,1]): a 1×1
                    depthwise nchwc Conv, weights (Mul) or bias (Add) the constant (graphopt's).
  Relu, Sigmoid, Tanh, HardSigmoid   kept as they are on a blocked input; so are HardSwish and
                    LeakyRelu (graphopt's), and GELU as ONNX's Gelu or onnxruntime's Gelu,
                    FastGelu (without its bias) and QuickGelu: elementwise, 0 at 0 (ConvNeXt,
                    FastViT and TinyViT had paid a reorder pair around each).
  Concat            axis 1, every input blocked with C a multiple of B.
  MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool   4-D, C a multiple of B, no indices;
                    no AveragePool with both ceil_mode and count_include_pad.
  BatchNormalization on a blocked input: a 1×1 depthwise nchwc Conv (γ/√(σ²+ε), β − μ·γ/√(σ²+ε)).
  Transpose [0,2,3,1] of a blocked input: ReorderOutput(channels_last=1).
  Resize / Upsample nearest (asymmetric, floor) or linear (half_pixel, align_corners or
                    asymmetric), scales 1 on N and C, whole numbers on H and W: nchwc.Upsample.
  ConvTranspose     kernel = stride, on a blocked input: a 1×1 conv and a depth-to-space
                    (layout_nchwc_upconv; graphopt's own).
  ReduceMean        over H and W, keepdims, of a blocked input: GlobalAveragePool (graphopt's).

The kept ops see the padded channels too; all of them map 0 to a finite value, which the zero
input rows of every blocked filter then ignore (an op that could make inf there, Log or
Reciprocal, would turn the next conv's 0·inf into NaN, so the list stays onnxruntime's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from graphopt.ir import DType, Node, Value
from graphopt.option_names import option
from graphopt.passes.fusion.activation import activation_params, runtime_refuses
from graphopt.passes.layout_nchwc_weights import (
    batchnorm_as_depthwise,
    filter_oihwbibo,
    filter_oihwbo,
    padded,
    padded_vector,
)

if TYPE_CHECKING:
    from graphopt.passes.layout_nchwc import Rewriter

NCHWC = "com.microsoft.nchwc"
MS = "com.microsoft"
POOLS = ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
# The coordinate modes nchwc.Upsample interpolates linearly in (onnxruntime's rule: not
# pytorch_half_pixel, which differs for an output of one pixel, nor half_pixel_symmetric).
LINEAR_COORDINATES = ("half_pixel", "align_corners", "asymmetric")
# Map 0 to a finite value (onnxruntime's four, and HardSwish and LeakyRelu, which map it to 0)
KEPT_UNARY = ("Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu")
FUSED_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip", "HardSwish")
ZERO_AT_ZERO = ("Relu", "Tanh", "LeakyRelu", "HardSwish")  # f(0) = 0: padded 0s stay 0
# GELU in its spellings: elementwise whatever the layout, and 0 at 0. (onnxruntime's BiasGelu
# and FastGelu's bias add along the last axis, which blocking moves: not these.)
KEPT_GELUS = (("", "Gelu"), (MS, "Gelu"), (MS, "FastGelu"), (MS, "QuickGelu"))
ACTIVATION_DEFAULTS = {"LeakyRelu": {"alpha": 0.01}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}}


@dataclass
class Blocked:
    """The NCHWc form of an NCHW value."""

    value: Value      # [N, C', H, W], C' = C padded to the block
    channels: int     # C, what ReorderOutput restores
    node: Node        # the nchwc node computing it (a conv may take an activation or a Sum)
    exclusive: bool   # the NCHW value had one reader and is no graph output
    zero_pads: bool = False  # 0 in the padded channels, as a conv, a pool or a Relu leaves them


def _full_shape(value: Value) -> tuple | None:
    shape = value.shape
    return shape if shape is not None and None not in shape and len(shape) == 4 else None


# -- Conv and what fuses into it ------------------------------------------------------------------
def conv_kind(rw: Rewriter, node: Node) -> str:
    """'nchw', 'depthwise', 'grouped' or 'blocked', or a reason starting with '-'."""
    x, w, b = node.input(0), node.input(1), node.input(2)
    if node.input(3) is not None:
        return "-FusedConv adds a Z input"
    if w is not None and w.shape is not None and len(w.shape) != 4:
        return f"-a {len(w.shape) - 2}-D conv (NCHWc blocks 2-D convs)"
    if w is None or not w.is_constant or w.dtype != DType.FLOAT or w.shape is None:
        return "-the weight is not a constant float32 [O, I, kh, kw] tensor"
    o, i = w.shape[:2]
    if b is not None and not (b.is_constant and b.dtype == DType.FLOAT and b.shape == (o,)):
        return "-the bias is not a constant float32 [O] vector"
    if x.dtype not in (None, DType.FLOAT):
        return f"-the input is {x.dtype.short}, not f32"
    group, block = node.attr("group", 1), rw.block
    if group > 1:
        if i == 1 and o == group:
            return "depthwise" if o % 4 == 0 else \
                f"-depthwise over {o} channels, not a multiple of 4 (ReorderInput's unit)"
        if i % block or (o // group) % block:
            return f"-grouped with {i} in / {o // group} out channels per group, " \
                   f"not multiples of the block {block}"
        return "grouped"
    if i < block:
        return "nchw"
    return "blocked" if i % 4 == 0 else f"-{i} input channels, not a multiple of 4"


def conv(rw: Rewriter, node: Node) -> None:
    kind = conv_kind(rw, node)
    if kind.startswith("-"):
        rw.left[f"{node.qualified_op}: {kind[1:]}"] += 1
        return
    x, w, b = node.input(0), node.input(1), node.input(2)
    o, block = w.shape[0], rw.block
    attrs = dict(node.attrs)
    if kind in ("nchw", "depthwise"):
        weight = rw.constant(w, f"OIHWBo{block}", lambda: filter_oihwbo(w.constant(), block))
    else:
        weight = rw.constant(w, f"OIHWBiBo{block}",
                             lambda: filter_oihwbibo(w.constant(), block))
    if b is not None and o % block:
        b = rw.constant(b, f"pad{block}", lambda: padded_vector(b.constant(), block))
    if kind == "depthwise":
        attrs["group"] = padded(o, block)
    channels = o if kind == "depthwise" else w.shape[1] * node.attr("group", 1)
    source = x if kind == "nchw" else rw.blocked_input(node, x, channels)
    # The filter's and the bias's padded output channels are 0, and so are their results,
    # unless a FusedConv's activation (-O3 fuses them first) maps 0 elsewhere (Sigmoid).
    rw.add(node, "Conv", [source, weight] + ([b] if b is not None else []), attrs, o,
           zero_pads=node.attr("activation") in (None, *ZERO_AT_ZERO))
    rw.result.count(node.op_type if kind == "blocked" else f"{node.op_type}:{kind}")


def activation(rw: Rewriter, node: Node) -> None:
    x = node.input(0)
    source = rw.blocked.get(id(x))
    if source is None:
        return
    params = fusable_activation(node, source)
    if params is not None:
        conv = source.node
        conv.set_attr("activation", node.op_type)
        if params:
            conv.set_attr("activation_params", params)
        rw.adopt(node, source.value, source.channels, conv,
                 source.zero_pads and node.op_type in ZERO_AT_ZERO)
        rw.result.count("activation into Conv")
    elif node.op_type in KEPT_UNARY and (node.op_type not in ("HardSwish", "LeakyRelu")
                                         or _keep_own(rw, node, source.channels)):
        rw.add(node, node.op_type, [source.value], dict(node.attrs), source.channels,
               domain=node.domain, zero_pads=source.zero_pads and node.op_type in ZERO_AT_ZERO)
        rw.result.count(f"{node.op_type} kept blocked")


def gelu(rw: Rewriter, node: Node) -> None:
    """A GELU of KEPT_GELUS on a blocked input: kept as it is, the padded 0s staying 0."""
    source = rw.blocked.get(id(node.input(0)))
    if source is None or len([v for v in node.inputs if v is not None]) != 1:
        return
    rw.add(node, node.op_type, [source.value], dict(node.attrs), source.channels,
           domain=node.domain, zero_pads=source.zero_pads)
    rw.result.count(f"{node.op_type} kept blocked")


def fusable_activation(node: Node, source: Blocked) -> list[float] | None:
    """The activation's parameters when it can become the conv's `activation`, else None."""
    conv = source.node
    if not (conv.op_type == "Conv" and source.exclusive and conv.attr("activation") is None
            and runtime_refuses("FusedConv", node.op_type) is None):
        return None
    bounds = {}
    if node.op_type == "Clip":
        for name, value in zip(("min", "max"), node.inputs[1:3]):
            if value is not None and not value.is_constant:
                return None
            bounds[name] = value.constant() if value is not None else None
        bounds.update(min_attr=node.attr("min"), max_attr=node.attr("max"))
    attrs = {k: node.attr(k, v) for k, v in ACTIVATION_DEFAULTS.get(node.op_type, {}).items()}
    return activation_params(node.op_type, **attrs, **bounds)


# graphopt's own keep-blocked rules (beyond onnxruntime's) pay only where the value goes on to a
# blocked consumer: otherwise the op runs on padded channels and, when its input leaves the
# layout for another reader too, costs a second ReorderOutput.
_ELEMENTWISE = ("Add", "Sum", "Sub", "Mul", "Div", "Min", "Max", *KEPT_UNARY, *FUSED_ACTIVATIONS,
                "BatchNormalization")


def reaches_blocked(value, transpose_ok: bool = True, depth: int = 12) -> bool:
    """Whether `value` reaches, through at most `depth` elementwise ops, a reader that takes a
    blocked input: a 2-D conv, a pool, Concat, Resize, or (`transpose_ok`) a Transpose, which
    a ReorderOutput to channels-last replaces."""
    frontier, seen = [value], set()
    for _ in range(depth + 1):
        following = []
        for current in frontier:
            for use in current.uses:
                reader = use.node
                if id(reader) in seen:
                    continue
                seen.add(id(reader))
                if reader.op_type in ("Conv", "FusedConv"):
                    if _conv_2d(reader):
                        return True
                elif not reader.is_onnx:
                    continue
                elif reader.op_type in (*POOLS, "Concat", "Resize", "Upsample") \
                        or transpose_ok and reader.op_type == "Transpose":
                    return True
                elif reader.op_type in _ELEMENTWISE and reader.outputs \
                        and reader.outputs[0] is not None:
                    following.append(reader.outputs[0])
        frontier = following
    return False


def _keep_own(rw, node, channels: int) -> bool:
    """Whether one of graphopt's own keep-blocked rules should apply to `node`: where its value
    goes on to a blocked consumer; or, on unpadded channels, where keeping it moves the
    ReorderOutput down rather than adding one (no other reader takes its input in NCHW)."""
    if reaches_blocked(node.outputs[0], transpose_ok=channels % rw.block == 0):
        return True
    if channels % rw.block:
        return False
    for value in node.inputs:
        if value is None or value.is_constant:
            continue
        if value.is_graph_output:
            return False
        for use in value.uses:
            other = use.node
            if other is node:
                continue
            layout_reader = other.op_type in ("Conv", "FusedConv") or other.is_onnx \
                and other.op_type in (*_ELEMENTWISE, *POOLS, "Concat")
            if not layout_reader:
                return False  # it leaves the layout anyway: a second ReorderOutput
    return True


# -- elementwise, Concat, BatchNormalization ------------------------------------------------------
def binary(rw: Rewriter, node: Node) -> None:
    sources = [rw.blocked.get(id(v)) if v is not None else None for v in node.inputs]
    if node.op_type == "Mul" and len(sources) == 2 and _channel_gate(rw, node, sources):
        return
    if len(sources) == 2 and sources.count(None) == 1:
        sources = _reordered_other(rw, node, sources)
    if not sources or None in sources:
        return
    if node.op_type in ("Sub", "Min", "Max") and not _keep_own(rw, node, sources[0].channels):
        return
    shapes = {_full_shape(v) for v in node.inputs}
    if len({s.channels for s in sources}) != 1 or len(shapes) != 1 or None in shapes:
        return  # broadcasting, or shapes not known to be equal
    if node.op_type in ("Add", "Sum") and len(sources) == 2:
        for target, other in ((sources[0], sources[1]), (sources[1], sources[0])):
            conv = target.node
            if (conv.op_type == "Conv" and target.exclusive and len(conv.inputs) < 4
                    and conv.attr("activation") is None):
                conv.set_inputs(list(conv.inputs) + [None] * (3 - len(conv.inputs))
                                + [other.value])
                rw.adopt(node, target.value, target.channels, conv,
                         target.zero_pads and other.zero_pads)
                rw.result.count("Add into Conv's Sum")
                return
    rw.add(node, node.op_type, [s.value for s in sources], dict(node.attrs),
           sources[0].channels, domain=node.domain,
           zero_pads=all(s.zero_pads for s in sources))  # 0 + 0, 0 · 0, max(0, 0): 0
    rw.result.count(f"{node.op_type} kept blocked")


def _channel_gate(rw: Rewriter, node: Node, sources: list) -> bool:
    """A Mul of a blocked [1, C, H, W] tensor by a [1, C, 1, 1] one computed at run time (a
    squeeze-and-excitation block's gate) as a 1×1 depthwise nchwc Conv whose weights are the
    gate: [C', 1, 1, 1] is the same bytes as the blocked [1, C', 1, 1] (one input channel per
    group is plain channel order), so a Reshape makes it. onnxruntime's rule takes operands of
    equal shapes only, and each such Mul cost two ReorderOutputs and a ReorderInput (the conv
    takes 0.51-0.75x their time at EfficientNet-B0's shapes, one-off timings outside bench/).
    A gate read in NCHW is reordered in: [1, C, 1, 1] costs nothing to reorder. Whether done."""
    shapes = [_full_shape(v) for v in node.inputs]
    if None in shapes:
        return False
    for index in (0, 1):
        big, small, source = shapes[index], shapes[1 - index], sources[index]
        if source is not None and isinstance(big[0], str) and small == (big[0], big[1], 1, 1) \
                and big[2:] != (1, 1):
            rw.left[f"Mul: a channel gate over the open batch dim {big[0]!r} (each image has "
                    f"its own; {option('input_shapes')} pinning one image blocks it)"] += 1
            return False
        if source is None or big[0] != 1 or small != (1, big[1], 1, 1) or big[2:] == (1, 1):
            continue
        gate, value = sources[1 - index], node.inputs[1 - index]
        if gate is None:
            if value.is_constant or value.dtype != DType.FLOAT or big[1] % 4:
                return False  # a constant is elementwise's per-channel rule
            gate = Blocked(rw.blocked_input(node, value, big[1]), big[1], None, False, True)
        if gate.channels != source.channels:
            return False
        channels = padded(source.channels, rw.block)
        name = node.output.name
        weight = Value(rw.graph.fresh_name(f"{name}_gate"), DType.FLOAT, (channels, 1, 1, 1))
        rw.graph.insert_before(node, Node(
            "Reshape", [gate.value, rw.graph.make_initializer(
                f"{name}_gate_shape", np.array([channels, 1, 1, 1], np.int64))], {},
            outputs=[weight], name=rw.graph.fresh_node_name(f"{node.name or name}/gate")))
        # A padded channel multiplies the blocked input's 0 by the gate's finite value.
        rw.add(node, "Conv", [source.value, weight], {"group": channels, "kernel_shape": [1, 1]},
               source.channels, zero_pads=source.zero_pads or gate.zero_pads)
        rw.result.count("Mul by a channel gate:depthwise")
        return True
    return False


def _reordered_other(rw: Rewriter, node: Node, sources: list) -> list:
    """`sources` with the NCHW input of a blocked one's Add (Mul, …) reordered into the layout
    too, where it has the same [N, C, H, W] (C a multiple of 4, ReorderInput's unit): one
    reorder either way, but the result stays blocked. Else `sources`. onnxruntime's rule, both
    inputs blocked, reorders the result back, and a residual's skip path that left the layout
    once (BlazeNet pads its channels with an NCHW Pad) then kept every later block out of it:
    MediaPipe's palm detector had 15 such Adds."""
    index = sources.index(None)
    other, known = node.inputs[index], sources[1 - index]
    shape = _full_shape(other) if other is not None and not other.is_constant else None
    if shape is None or other.dtype != DType.FLOAT or shape != _full_shape(node.inputs[1 - index]) \
            or shape[1] != known.channels or known.channels % 4 \
            or not any(_reads_blocked(use.node) for use in node.output.uses):
        return sources
    if not _keep_own(rw, node, known.channels):
        return sources
    reordered = rw.blocked_input(node, other, known.channels)
    return [known if i != index else Blocked(reordered, known.channels, reordered.producer,
                                             False, True)  # ReorderInput pads with 0s
            for i in range(2)]


def _reads_blocked(reader: Node) -> bool:
    """Whether `reader` can take a blocked input (by its op alone): a 2-D conv, an activation
    or elementwise op kept in the layout. A sum whose readers all go back to NCHW (a Concat of
    channels off the block, PaddleOCR's FPN) is better left NCHW: reordering its NCHW input in
    would add a reorder, not move one."""
    if reader.op_type in ("Conv", "FusedConv"):
        return _conv_2d(reader)
    return reader.is_onnx and reader.op_type in _ELEMENTWISE and reader.op_type != "Div"


def _conv_2d(conv: Node) -> bool:
    """Whether a Conv or FusedConv has a 4-D weight: a 2-D conv, which NCHWc blocks."""
    weight = conv.input(1)
    return weight is not None and weight.shape is not None and len(weight.shape) == 4


def elementwise(rw: Rewriter, node: Node) -> None:
    """Add, Sub, Mul, Div, Min, Max of two blocked inputs (`binary`, but no Div: 0/0 in the
    padded channels would be NaN, which a conv's zero weight there does not cancel), or of a
    blocked input and a constant: a number (the op kept as it is), or one per channel for Add
    and Mul (a 1×1 depthwise conv, as BatchNormalization becomes). onnxruntime's transformer
    takes neither, and each such op cost a ReorderOutput and a ReorderInput: a PRelu that
    LowerPRelu made Relu(x) + Min(x, 0)·slope, the learned scale of PP-LCNet's blocks."""
    inputs = node.inputs
    blocked = [rw.blocked.get(id(v)) if v is not None else None for v in inputs]
    if len(inputs) != 2 or None not in blocked:
        if node.op_type != "Div":
            binary(rw, node)
        return
    if blocked == [None, None]:
        return
    index = 0 if blocked[0] is not None else 1
    source, other = blocked[index], inputs[1 - index]
    if other is not None and not other.is_constant and node.op_type != "Div":
        binary(rw, node)  # which may reorder the other input in
        return
    data = other.constant() if other is not None and other.is_constant else None
    if data is None or other.dtype != DType.FLOAT or not np.all(np.isfinite(data)) \
            or not _keep_own(rw, node, source.channels):
        return
    if data.size == 1 and data.ndim <= 4:
        if node.op_type == "Div" and (index != 0 or float(data.reshape(-1)[0]) == 0.0):
            return  # a number over the padded channels' 0s, or a division by 0
        rw.add(node, node.op_type, [source.value, other] if index == 0 else
               [other, source.value], dict(node.attrs), source.channels, domain=node.domain,
               zero_pads=source.zero_pads and _zero_at_zero(node.op_type, data))
        rw.result.count(f"{node.op_type} of a number kept blocked")
        return
    per_channel = _per_channel(data, source.channels)
    if per_channel is None or node.op_type not in ("Add", "Mul"):
        return
    ones = np.ones_like(per_channel)
    weight, bias = (per_channel, None) if node.op_type == "Mul" else (ones, per_channel)
    name = node.output.name
    conv_inputs = [source.value, rw.graph.make_initializer(
        f"{name}_by_channel", padded_vector(weight, rw.block).reshape(-1, 1, 1, 1))]
    if bias is not None:
        conv_inputs.append(rw.graph.make_initializer(f"{name}_by_channel_bias",
                                                     padded_vector(bias, rw.block)))
    rw.add(node, "Conv", conv_inputs, {"group": padded(source.channels, rw.block)},
           source.channels, zero_pads=True)  # padded weights and bias are 0
    rw.result.count(f"{node.op_type} by channel:depthwise")


def _zero_at_zero(op: str, number: np.ndarray) -> bool:
    """Whether the op of 0 and `number` (either side) is 0."""
    c = float(number.reshape(-1)[0])
    return op in ("Mul", "Div") or op in ("Add", "Sub") and c == 0.0 \
        or op == "Min" and c >= 0.0 or op == "Max" and c <= 0.0


def _per_channel(data: np.ndarray, channels: int) -> np.ndarray | None:
    """The [C] vector of a constant that broadcasts over N, H and W alone ([C,1,1] or
    [1,C,1,1]) against [N, C, H, W], else None."""
    shape = data.shape
    if shape in ((channels, 1, 1), (1, channels, 1, 1)):
        return data.reshape(channels).astype(np.float32)
    return None


def concat(rw: Rewriter, node: Node) -> None:
    sources = [rw.blocked.get(id(v)) if v is not None else None for v in node.inputs]
    if node.attr("axis") not in (1, -3) or not sources or None in sources \
            or any(s.channels % rw.block for s in sources):
        return
    rw.add(node, "Concat", [s.value for s in sources], {"axis": 1},
           sum(s.channels for s in sources), domain=node.domain, zero_pads=True)  # none
    rw.result.count("Concat kept blocked")


def batchnorm(rw: Rewriter, node: Node) -> None:
    source = rw.blocked.get(id(node.input(0)))
    params = node.inputs[1:5]
    if source is None or any(v is not None for v in node.outputs[1:]) \
            or node.attr("training_mode", 0) or node.attr("spatial", 1) != 1 \
            or len(params) != 4 or not all(
                v is not None and v.is_constant and v.dtype == DType.FLOAT
                and v.shape == (source.channels,) for v in params):
        return
    weight, bias = batchnorm_as_depthwise(*(v.constant() for v in params),
                                          node.attr("epsilon", 1e-5), rw.block)
    rw.add(node, "Conv", [source.value, rw.graph.make_initializer(
        f"{node.output.name}_bn_scale", weight), rw.graph.make_initializer(
        f"{node.output.name}_bn_shift", bias)], {"group": weight.shape[0]}, source.channels,
        zero_pads=True)
    rw.result.count("BatchNormalization:depthwise")


# -- pools, Transpose, Resize ---------------------------------------------------------------------
def pool(rw: Rewriter, node: Node) -> None:
    x = node.input(0)
    channels = rw.channels_of(x)
    reason = None
    if any(v is not None for v in node.outputs[1:]):
        reason = "MaxPool returns indices"
    elif x.shape is not None and len(x.shape) != 4:
        reason = f"a {len(x.shape) - 2}-D pool (NCHWc blocks 2-D pools)"
    elif x.dtype != DType.FLOAT or x.shape is None:
        reason = "the input is not a known float32 4-D tensor"
    elif channels is None or channels % rw.block and id(x) not in rw.blocked:
        # onnxruntime's rule; a tensor already blocked pools its padded channels apart, harmlessly
        # (graphopt's own: BlazeFace's MaxPools over 28, 42 and 88 channels)
        reason = f"{channels or 'unknown'} channels, not a multiple of the block {rw.block}"
    elif not node.op_type.startswith("Global") and len(node.attr("kernel_shape") or ()) != 2:
        reason = "not a 2-D pool"
    elif node.op_type == "AveragePool" and node.attr("ceil_mode", 0) \
            and node.attr("count_include_pad", 0):
        # The blocked kernel divides a window that overhangs the end by the whole kernel; the
        # NCHW one counts only the padding inside it (checked against onnxruntime on a grid).
        reason = "ceil_mode with count_include_pad averages the last window differently"
    if reason:
        rw.left[f"{node.op_type}: {reason}"] += 1
        return
    source = rw.blocked.get(id(x))
    rw.add(node, node.op_type, [rw.blocked_input(node, x, channels)], dict(node.attrs),
           channels, zero_pads=source is None or source.zero_pads)  # a pool of 0s is 0
    rw.result.count(node.op_type)


def spatial_mean(rw: Rewriter, node: Node) -> None:
    """ReduceMean over H and W of a blocked 4-D tensor, keeping its dims (a squeeze-and-
    excitation block's squeeze as the dynamo exporter and timm write it; TorchScript's is a
    GlobalAveragePool): a blocked GlobalAveragePool, where it had cost a ReorderOutput before
    it and a ReorderInput at the gate's conv (graphopt's own rule)."""
    x = node.input(0)
    source = rw.blocked.get(id(x))
    if source is None or x.shape is None or len(x.shape) != 4 \
            or node.attr("keepdims", 1) != 1 or node.attr("noop_with_empty_axes", 0):
        return
    axes = node.attr("axes")
    if axes is None:  # opset 18 takes them as an input
        given = node.input(1)
        if given is None or not given.is_constant:
            return
        axes = np.asarray(given.constant()).reshape(-1).tolist()
    if sorted(int(a) % 4 for a in axes) != [2, 3]:
        return
    rw.add(node, "GlobalAveragePool", [source.value], {}, source.channels,
           zero_pads=source.zero_pads)  # the mean of 0s is 0
    rw.result.count("ReduceMean:GlobalAveragePool")


def channel_pad(rw: Rewriter, node: Node) -> None:
    """A Pad of zeros after the channels of a blocked tensor whose padded channels hold 0s,
    within its last block: the blocked tensor already is the result, with more channels
    counted (graphopt's own rule). BlazeNet pads its residuals' skip path so, and the NCHW Pad
    cost a reorder pair at every block that widens."""
    source = rw.blocked.get(id(node.input(0)))
    pads, fill = node.input(1), node.input(2)
    if source is None or not source.zero_pads or node.attr("mode", "constant") != "constant" \
            or node.input(3) is not None or pads is None or not pads.is_constant:
        return
    if fill is not None and (not fill.is_constant or np.any(fill.constant() != 0)):
        return
    amounts = np.asarray(pads.constant()).reshape(-1)
    if amounts.shape != (8,) or np.any(np.delete(amounts, 5)) or amounts[5] <= 0:
        return
    channels = source.channels + int(amounts[5])
    if padded(channels, rw.block) != padded(source.channels, rw.block):
        return
    # Its own node as producer: no activation or Sum may fuse into the conv behind, whose
    # output other readers may take unpadded.
    rw.adopt(node, source.value, channels, node, True)
    rw.result.count("channel Pad within the block")


def transpose(rw: Rewriter, node: Node) -> None:
    source = rw.blocked.get(id(node.input(0)))
    if source is None or list(node.attr("perm") or ()) != [0, 2, 3, 1]:
        return
    out = node.output
    out.producer = None  # handed over to the ReorderOutput below
    rw.graph.insert_before(node, Node(
        "ReorderOutput", [source.value], {"channels": source.channels, "channels_last": 1},
        domain=NCHWC, outputs=[out], name=rw.graph.fresh_node_name(f"{out.name}/nchwc")))
    rw.graph.remove(node, safe=False)
    rw.result.count("Transpose to NHWC:ReorderOutput")


def resize(rw: Rewriter, node: Node) -> None:
    source = rw.blocked.get(id(node.input(0)))
    resize11 = node.op_type == "Resize" and (rw.model.opset("") or 0) >= 11
    mode = node.attr("mode", "nearest")
    # Before opset 11 (Upsample, Resize-10) coordinates are asymmetric, and nearest floors.
    where = node.attr("coordinate_transformation_mode", "half_pixel") if resize11 \
        else "asymmetric"
    factors = _resize_factors(node, resize11)
    if source is None or factors is None:
        return
    if mode == "nearest":
        if where != "asymmetric" or resize11 and node.attr("nearest_mode") != "floor":
            return
        attrs = {}
    elif mode == "linear" and where in LINEAR_COORDINATES:
        attrs = {"mode": "linear", "coordinate_transformation_mode": where}
    else:
        return
    whole = factors.astype(np.int64)
    if factors.shape != (4,) or np.any(whole != factors) or list(whole[:2]) != [1, 1] \
            or np.any(whole < 1):
        return
    rw.add(node, "Upsample", [source.value], {"scales": whole.tolist(), **attrs},
           source.channels, zero_pads=source.zero_pads)  # both modes interpolate 0s to 0
    rw.result.count(f"{node.op_type}:Upsample")


def _resize_factors(node: Node, resize11: bool) -> np.ndarray | None:
    """A Resize's constant scale per axis: its `scales`, or its `sizes` over the input's known
    dims (torchvision's segmentation heads resize to the size of a feature map, which the
    compile folds to numbers: a whole multiple is the same resize). None when neither is."""
    if resize11 and node.attr("axes") is not None:
        return None
    scales, sizes = node.input(2 if resize11 else 1), node.input(3) if resize11 else None
    if sizes is None:
        return np.asarray(scales.constant(), dtype=np.float64).reshape(-1) \
            if scales is not None and scales.is_constant else None
    if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        # not_larger and not_smaller resize every axis by one scale, the least or greatest of
        # sizes / shape: not the per-axis ratios (onnxruntime's own transformer takes those,
        # and its blocked result comes out of the wrong size)
        return None
    shape = node.input(0).shape
    if not sizes.is_constant or shape is None or not all(isinstance(d, int) and d > 0
                                                         for d in shape):
        return None
    target = np.asarray(sizes.constant()).reshape(-1)
    return target / np.asarray(shape, dtype=np.float64) if target.shape == (len(shape),) \
        else None


# The handlers that block an NCHW input of their own; every other one acts only on a node
# that reads a blocked tensor (asking the rewrite gate about the others recorded decisions
# that change nothing: a transformer's Transposes and Adds in subgraph tuning).
STARTERS = frozenset({conv, pool})

HANDLERS = {
    ("", "Conv"): conv, (MS, "FusedConv"): conv,
    **{("", op): pool for op in POOLS},
    **{("", op): activation for op in FUSED_ACTIVATIONS},
    ("", "Sum"): binary,
    **{("", op): elementwise for op in ("Add", "Sub", "Mul", "Div", "Min", "Max")},
    ("", "Concat"): concat, ("", "BatchNormalization"): batchnorm,
    ("", "Transpose"): transpose, ("", "Pad"): channel_pad,
    ("", "Resize"): resize, ("", "Upsample"): resize,
    ("", "ReduceMean"): spatial_mean,
    **{key: gelu for key in KEPT_GELUS},
}
