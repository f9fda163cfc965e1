"""Random valid models that an NPU target must cut into several device partitions."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from fuzz_models import (BATCH, Builder, activation, affine, attention, gelu, layer_norm,
                         matmul_add, reduce_mean)

SEQ = "S"  # the symbolic sequence dim of the profiled sequence nets
SIDE = "K"  # the dim of a side input that nothing else shares


def heavy_conv(b: Builder, x: str, shape):
    """A 3×3 conv that keeps the shape, then an activation: work enough that the NPU keeps it
    (a small conv between host ops is an island the partitioner returns to the host)."""
    c = shape[1]
    inputs = [x, b.const(b.weights(c, c, 3, 3, scale=1 / math.sqrt(9 * c)), "w")]
    if b.flag("conv bias"):
        inputs.append(b.const(b.weights(c, scale=0.3), "bias"))
    y = b.op("Conv", inputs, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if b.flag("conv activation"):
        y, _ = activation(b, y, shape)
    return y, shape


def npu_stage(b: Builder, x: str, shape):
    for _ in range(b.draw(st.integers(2, 3), label="convs")):
        x, shape = heavy_conv(b, x, shape)
    return x, shape


def source(b: Builder) -> str:
    """The first graph input: ops whose result jumps with a tiny change of their input (an
    argmax, a threshold, a box selection) read it, so that both sides compute them exactly."""
    return b.inputs[0].name


def boundary(b: Builder, x: str, shape) -> None:
    """Maybe make the tensor about to cross a device boundary a graph output too."""
    if b.flag("output at the boundary"):
        b.add_output(x, shape)


def rejoin(b: Builder, x: str, other: str, shape):
    """Combine a branch computed elsewhere with the trunk."""
    op = b.pick(["Add", "Mul", "Sub"], "rejoin")
    if op == "Mul":
        other = b.op("Sigmoid", [other])  # a gate: keeps repeated products bounded
    return b.op(op, [x, other]), shape


# --- host ops on a continuous path -------------------------------------------------------------


def host_squash(b: Builder, x: str) -> str:
    """Tanh computed in float64, which no NPU kernel takes: a bounded, smooth host op. The
    squashing ops used before (Atan, Asinh, Sinh) have CANN kernels (atlasoxol_09_0020, _0019,
    _0148), and onnxruntime has no float64 kernel for them."""
    y = b.op("Tanh", [b.op("Cast", [x], to=11)])
    return b.op("Cast", [y], to=int(b.elem))


def host_unary(b: Builder, x: str, shape):
    """An op the NPU profiles have no kernel for, continuous in its input."""
    kind = b.pick(["Tanh64", "Softsign+Tanh64", "LpNormalization", "Trilu", "Einsum",
                   "TopK", "ReduceLogSumExp", "Mish"], "host op")
    if kind == "Softsign+Tanh64":
        return host_squash(b, b.op("Softsign", [x])), shape
    if kind == "LpNormalization":
        return b.op("LpNormalization", [x], axis=b.pick([1, -1], "lp axis"),
                    p=b.pick([1, 2], "lp p")), shape
    if kind == "Trilu" and b.opset >= 14:
        return b.op("Trilu", [x, b.const(np.array(b.pick([-1, 0, 1], "k"), np.int64), "k",
                                         share=False)], upper=int(b.flag("upper"))), shape
    if kind == "Einsum":  # an equation CANN's list (atlasoxol_09_0052) does not name
        scale = b.const(b.weights(shape[1], scale=0.5) + 1, "g")
        return b.op("Einsum", [x, scale], equation="bchw,c->bchw"), shape
    if kind == "TopK":  # sorted values along the width: continuous, unlike the indices
        return b.op("TopK", [x, b.ints([shape[-1]])], outputs=2, axis=-1,
                    largest=int(b.flag("largest")))[0], shape
    if kind == "ReduceLogSumExp":
        y = b.op("ReduceLogSumExp", [x], axes=[1], keepdims=1) if b.opset < 18 else \
            b.op("ReduceLogSumExp", [x, b.ints([1])], keepdims=1)
        return b.op("Sub", [x, y]), shape
    if kind == "Tanh64" or (kind == "Mish" and b.opset < 18) or (kind == "Trilu" and b.opset < 14):
        return host_squash(b, x), shape
    return b.op(kind, [x]), shape


def host_double(b: Builder, x: str, shape):
    """A detour through float64, which no NPU kernel takes: Cast, ops, Cast back."""
    d = b.op("Cast", [x], to=11)
    for _ in range(b.draw(st.integers(1, 2), label="double ops")):
        d = b.op(b.pick(["Tanh", "Relu", "Neg", "Sigmoid"], "double op"), [d])
    return b.op("Cast", [d], to=int(b.elem)), shape


def host_resize(b: Builder, x: str, shape):
    """An attribute outside the profile's limits: a cubic Resize (the NPU takes nearest and
    linear) ×2, and a 2×2 MaxPool on the NPU back to the shape."""
    scales = b.name("scales")
    b.inits[scales] = np.array([1, 1, 2, 2], np.float32)  # float32 whatever the model's dtype
    up = b.op("Resize", [x, "", scales], mode="cubic")
    return b.op("MaxPool", [up], kernel_shape=[2, 2], strides=[2, 2]), shape


def shape_reshape(b: Builder, x: str, shape):
    """Reshape of a computed tensor to Shape of another: dynamic until shapes fold (-O2)."""
    flat = b.op("Flatten", [x], axis=1)
    return b.op("Reshape", [b.op(b.pick(["Relu", "Neg", "Sigmoid"], "flat op"), [flat]),
                            b.op("Shape", [x])]), shape


def squeeze_excite(b: Builder, x: str, shape):
    """Pool, a host op on the small pooled tensor, and a gate back on the NPU trunk: a branch
    that fans out and rejoins across devices, with copies cheap enough to keep the trunk there."""
    pooled = b.op("GlobalAveragePool", [x])
    small = [shape[0], shape[1], 1, 1]
    boundary(b, pooled, small)
    g, _ = b.pick([host_unary, host_double], "pooled host op")(b, pooled, small)
    if b.flag("fc after"):
        c = shape[1]
        g = b.op("Conv", [g, b.const(b.weights(c, c, 1, 1, scale=1 / math.sqrt(c)), "fc")],
                 kernel_shape=[1, 1])
    return b.op("Mul", [x, b.op("Sigmoid", [g])]), shape


def host_stage(b: Builder, x: str, shape):
    """A host op in the middle of the trunk, or on a branch that rejoins it."""
    boundary(b, x, shape)
    op = b.pick([host_unary, host_unary, host_double, host_resize, shape_reshape], "host stage")
    y, _ = op(b, x, shape)
    if b.flag("as a branch"):
        z, _ = heavy_conv(b, x, shape)
        y, _ = rejoin(b, z, y, shape)
    return y, shape


# --- host ops on exact data ------------------------------------------------------------------


def from_input(b: Builder, x: str, shape):
    """Host work on the graph input, which the NPU trunk reads too, rejoined with the trunk."""
    src = source(b)
    kind = b.pick(["argmax", "hardmax", "nonzero", "nms", "unary"], "input op")
    if kind == "argmax":  # int64 indices; Neg of int64 has no NPU kernel
        index = b.op("ArgMax", [src], axis=1, keepdims=1,
                     **({"select_last_index": 1} if b.flag("select last") else {}))
        index = b.op(b.pick(["Neg", "Abs"], "int op"), [index])
        b.tap_int(index, [shape[0], 1] + shape[2:])
        y = b.op("Cast", [index], to=int(b.elem))
        y = b.op("Mul", [y, b.const(np.array(0.1), "tenth", share=False)])
    elif kind == "hardmax":
        y = b.op("Hardmax", [src], axis=-1)
    elif kind == "nonzero":  # data-dependent shapes, a static sum again
        y = nonzero_sum(b, src)
    elif kind == "nms":
        y = nms_count(b, src, shape)
    else:
        y, _ = host_unary(b, src, shape)
    return rejoin(b, x, y, shape)


def nonzero_sum(b: Builder, src: str) -> str:
    """NonZero → GatherND → ReduceSum: the sum of the positive elements (scaled), a scalar."""
    positive = b.op("Greater", [src, b.const(np.array(0.0), "zero", share=False)])
    if b.flag("mask output"):
        b.add_output(positive, [d.dim_value or d.dim_param for d in
                                b.inputs[0].type.tensor_type.shape.dim], np.bool_)
    where = b.op("Transpose", [b.op("NonZero", [positive])], perm=[1, 0])
    picked = b.op("GatherND", [src, where])
    # Scaled before the sum: 3×64×32×32 positive halves sum past float16's 65504, an inf that
    # onnxruntime's float32 upcast of ReduceSum → Mul hides but a cut between them keeps.
    picked = b.op("Mul", [picked, b.const(np.array(1e-3), "milli", share=False)])
    return b.op("ReduceSum", [picked], keepdims=0)


def nms_count(b: Builder, src: str, shape) -> str:
    """NonMaxSuppression over fixed boxes scored by the input's first channel: the count of
    selected boxes (its [K, 3] selection maybe a graph output too)."""
    n, _, h, w = shape
    # onnxruntime's NonMaxSuppression is float32 only; constant boxes need a static batch.
    if b.dtype != np.float32 or isinstance(n, str):
        return host_squash(b, src)
    first = b.op("Slice", [src, b.ints([0]), b.ints([1]), b.ints([1])])
    scores = b.op("Reshape", [first, b.ints([0, 1, h * w])])
    corner = b.rng.random((1, h * w, 2)) * 4
    boxes = np.concatenate([corner, corner + 1 + b.rng.random((1, h * w, 2))], -1)
    boxes = b.const(np.broadcast_to(boxes, (n, h * w, 4)).astype(np.float32), "boxes")
    selected = b.op("NonMaxSuppression", [boxes, scores, b.ints([b.pick([1, 3, 8], "max")]),
                                          b.const(np.array([0.5], np.float32), "iou",
                                                  share=False),
                                          b.const(np.array([0.0], np.float32), "thr",
                                                  share=False)])
    b.tap_int(selected, [None, 3])  # its own count, not the side input's K
    count = b.op("ReduceSum", [b.op("Cast", [selected], to=int(b.elem))], keepdims=0)
    return b.op("Mul", [count, b.const(np.array(1e-2), "centi", share=False)])


def dynamic_side_input(b: Builder, x: str, shape):
    """A second input with a dim no pin fixes: nodes reading it fall back for the dynamic
    shape; its mean over that dim is static again and scales the trunk on the NPU."""
    side = b.add_input([SIDE, shape[1]])
    mean = reduce_mean(b, side, [0])  # [1, C]
    gate = b.op("Reshape", [mean, b.ints([1, shape[1], 1, 1])])
    return rejoin(b, x, gate, shape)


def head(b: Builder, x: str, shape):
    """A classifier head, and sorted top scores on the host (a detector's tail)."""
    pooled = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    k = shape[1]
    n = b.pick([8, 16], "classes")
    scores = b.op("Gemm", [pooled, b.const(b.weights(n, k, scale=1 / math.sqrt(k)), "W"),
                           b.const(b.weights(n, scale=0.3), "B")], transB=1)
    boundary(b, scores, [shape[0], n])
    k = b.pick([1, 4, n], "top k")
    top = b.op("TopK", [scores, b.ints([k])], outputs=2, axis=1)[0]
    b.add_output(top, [shape[0], k])


def shared_constant(b: Builder, x: str, shape):
    """A Constant node that a host op and an NPU op both read (it joins one partition, and the
    other must still get it)."""
    value = b.name("constant")
    b.nodes.append(helper.make_node("Constant", [], [value], name=b.name("Constant_"),
                                    value=numpy_helper.from_array(
                                        (b.weights(shape[1], 1, 1, scale=0.3) + 1)
                                        .astype(b.dtype))))
    host = host_squash(b, b.op("Mul", [x, value]))
    return rejoin(b, b.op("Add", [heavy_conv(b, x, shape)[0], value]), host, shape)


def traps(b: Builder, x: str, shape) -> None:
    """Values the artifact's routing must still give the caller: the graph input itself, an
    Identity of a value another output is, an initializer, an input no node reads."""
    if b.flag("input as output"):
        b.add_output(source(b), shape)
    if b.flag("identity output"):
        b.add_output(x, shape)
        b.add_output(b.op("Identity", [x]), shape)
    if b.flag("initializer output"):
        weight = b.const(b.weights(3, scale=0.5), "returned", share=False)
        b.add_output(weight, [3])
    if b.flag("unread input"):
        b.add_input([2, 3])
    if b.flag("string ops"):  # a host-only branch of its own, beside the float graph
        words = b.add_input([3], object)
        # The C locale: onnxruntime refuses a locale the machine lacks (its default en_US).
        b.add_output(b.op("StringNormalizer", [words], case_change_action="UPPER", locale="C"),
                     [3], object)


def maxpool_indices(b: Builder, x: str, shape):
    """A MaxPool whose Indices output is read: the NPU kernel computes the values only. On the
    graph input: where a computed map has near ties, the index taken is the rounding's."""
    values, indices = b.op("MaxPool", [source(b)], outputs=2, kernel_shape=[3, 3],
                           pads=[1, 1, 1, 1])
    b.tap_int(indices, shape)
    odd = b.op("Cast", [b.op("Mod", [indices, b.const(np.array(2, np.int64), "two",
                                                            share=False)])], to=b.elem)
    return rejoin(b, x, b.op("Add", [values, odd]), shape)


PARTITION_BLOCKS = [npu_stage, npu_stage, host_stage, host_stage, squeeze_excite, from_input,
                    dynamic_side_input, shared_constant, maxpool_indices]


def partition_net(b: Builder, batch):
    # Convs this size save the NPU more than the copies to and from it cost, and its launch
    # overhead per kernel: smaller ones are returned to the host whole.
    shape = [batch, b.pick([32, 64, 64], "channels"), *[b.pick([16, 24, 32], "size")] * 2]
    x = b.add_input(shape)
    x, shape = npu_stage(b, x, shape)
    # One stage at least cuts the graph; the others may add convs or cut it again.
    stages = [b.pick(PARTITION_BLOCKS[2:], "cut")] + [
        b.pick(PARTITION_BLOCKS, "stage") for _ in range(b.draw(st.integers(0, 3), label="more"))]
    for stage in stages:
        x, shape = stage(b, x, shape)
        if b.flag("npu after"):
            x, shape = npu_stage(b, x, shape)
    traps(b, x, shape)
    if b.flag("head"):
        head(b, x, shape)
        if b.flag("trunk output too"):
            b.add_output(x, shape)
    else:
        b.add_output(x, shape)


# --- sequence nets with a symbolic batch and sequence ------------------------------------------


def host_seq(b: Builder, x: str, shape):
    kind = b.pick(["TopK", "Tanh64", "double", "Hardmax"], "seq host op")
    if kind == "TopK":  # the sorted features: continuous in the input
        return b.op("TopK", [x, b.ints([shape[-1]])], outputs=2, axis=-1)[0], shape
    if kind == "double":
        return host_double(b, x, shape)
    if kind == "Hardmax" and x == source(b):
        return b.op("Hardmax", [x], axis=-1), shape
    return host_squash(b, x), shape


def wide_matmul(b: Builder, x: str, shape):
    y, shape = matmul_add(b, x, shape)
    return b.op("Relu", [y]), shape


SEQ_PROFILE_BLOCKS = [wide_matmul, wide_matmul, gelu, layer_norm, attention, activation, affine,
                      host_seq, host_seq]


def profiled_net(b: Builder, batch, seq):
    shape = [batch, seq, b.pick([16, 32, 64], "d")]
    x = b.add_input(shape)
    if b.flag("token ids"):  # an int64 input of the same symbolic dims, looked up in a table
        ids = b.add_input(shape[:2], np.int64)  # feeds' normal draws: ids within ±8
        x = b.op("Add", [x, b.op("Gather", [b.const(b.weights(8, shape[2]), "table"), ids])])
    if b.flag("host op on the input"):
        x, shape = host_seq(b, x, shape)
    for _ in range(b.draw(st.integers(1, 4), label="blocks")):
        x, shape = b.pick(SEQ_PROFILE_BLOCKS, "block")(b, x, shape)
        b.tap(x, shape)
    b.add_output(x, shape)


@st.composite
def partition_models(draw):
    """A conv net with host work between, beside and after NPU convs; its batch is static."""
    b = Builder(draw, draw(st.sampled_from([np.float32, np.float32, np.float16]), label="dtype"),
                draw(st.sampled_from([13, 17, 18]), label="opset"))
    partition_net(b, draw(st.sampled_from([1, 2]), label="batch"))
    return b.model()


@st.composite
def profiled_models(draw):
    """(model, its symbolic dims): a conv net with a symbolic batch, or a sequence net with a
    symbolic batch and/or sequence."""
    b = Builder(draw, draw(st.sampled_from([np.float32, np.float32, np.float16]), label="dtype"),
                draw(st.sampled_from([13, 17, 18]), label="opset"))
    if draw(st.booleans(), label="conv"):
        partition_net(b, BATCH)
        dims = [BATCH]
        # The side input's dim too, maybe: an input only the host reads gets pinned.
        if any(d.dim_param == SIDE for vi in b.inputs for d in vi.type.tensor_type.shape.dim) \
                and draw(st.booleans(), label="pin K"):
            dims.append(SIDE)
        return b.model(), dims
    dims = draw(st.sampled_from([[BATCH], [SEQ], [BATCH, SEQ]]), label="symbolic dims")
    profiled_net(b, BATCH if BATCH in dims else draw(st.sampled_from([1, 2]), label="batch"),
                 SEQ if SEQ in dims else draw(st.integers(2, 8), label="seq"))
    return b.model(), dims
