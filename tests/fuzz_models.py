"""Random valid ONNX models built from the subgraphs graphopt's rewrite passes look for."""

from __future__ import annotations

import math

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from helpers import IR_VERSION

BATCH = "N"  # the symbolic batch dim's name; feeds give it two sizes


def symbolic(shape) -> bool:
    """Whether a shape has a symbolic dim, which no constant can take."""
    return any(isinstance(d, str) for d in shape)


class Builder:
    """Appends nodes and initializers; blocks take and return the "current" tensor and its
    shape, so that they compose. `draw` makes every choice, so hypothesis can shrink a failure."""

    def __init__(self, draw, dtype, opset: int):
        self.draw = draw
        self.rng = np.random.default_rng(self.draw(st.integers(0, 2 ** 16), label="seed"))
        self.dtype, self.opset = np.dtype(dtype), opset
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.inputs: list = []
        self.outputs: list = []
        self.count = 0
        self.by_shape: dict[tuple, str] = {}  # a constant of each shape, to share

    # --- plumbing ------------------------------------------------------------------------

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def flag(self, label: str) -> bool:
        return self.draw(st.booleans(), label=label)

    def pick(self, options, label: str):
        return self.draw(st.sampled_from(options), label=label)

    def const(self, array, prefix: str = "c", share: bool = True) -> str:
        """An initializer; a float one in the model's dtype. One of the same shape made before
        may be reused (the same constant read by several nodes is a trap of its own)."""
        array = np.asarray(array)
        if array.dtype.kind == "f":
            array = array.astype(self.dtype)
        key = (array.dtype.str, array.shape)
        if share and array.dtype.kind == "f" and key in self.by_shape \
                and self.flag("share constant"):
            return self.by_shape[key]
        name = self.name(prefix)
        self.inits[name] = array
        if array.dtype.kind == "f":
            self.by_shape.setdefault(key, name)
        return name

    def ints(self, values) -> str:
        return self.const(np.array(values, np.int64), "i", share=False)

    def weights(self, *shape, scale: float = 1.0) -> np.ndarray:
        return self.rng.standard_normal(shape) * scale

    def op(self, op_type: str, inputs, outputs: int = 1, **attrs):
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names,
                                           name=self.name(op_type + "_"), **attrs))
        return names[0] if outputs == 1 else names

    def add_input(self, shape, dtype=None) -> str:
        name = self.name("x")
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype or self.dtype))
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def add_output(self, name: str, shape, dtype=None) -> None:
        if any(o.name == name for o in self.outputs):
            return
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype or self.dtype))
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def tap(self, name: str, shape) -> None:
        """Maybe make an intermediate of a pattern observable: a graph output, or the input of
        a second consumer whose result is one. A fusion must then keep it."""
        how = self.pick(["no", "no", "no", "output", "consumer"], "tap")
        if how == "output":
            self.add_output(name, shape)
        elif how == "consumer":
            self.add_output(self.op("Neg", [name]), shape)

    @property
    def elem(self) -> int:
        """The model's float dtype as an ONNX element type (a Cast's `to`)."""
        return helper.np_dtype_to_tensor_dtype(self.dtype)

    def tap_int(self, name: str, shape) -> None:
        """Maybe make an integer intermediate (indices, a selection) a graph output."""
        if self.flag("integer output"):
            self.add_output(name, shape, np.int64)

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "fuzz", self.inputs, self.outputs,
                                  [numpy_helper.from_array(a, n) for n, a in self.inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                 ir_version=IR_VERSION)

    # --- shapes ----------------------------------------------------------------------------

    def broadcast_shape(self, shape, label: str):
        """A constant shape that broadcasts against `shape` without growing it: scalar, [1],
        the last dim, per-channel [C,1,1] (rank 4), [1,C,1,1], a trailing block, or the whole
        shape (batch dim 1)."""
        rank = len(shape)
        options = [(), (1,), (shape[-1],), tuple(1 if d == BATCH else d for d in shape)]
        if rank >= 3:
            options += [(shape[1],) + (1,) * (rank - 2), (1, shape[1]) + (1,) * (rank - 2),
                        tuple(shape[-2:]), (1,) * (rank - 2) + (shape[-2], 1)]
        # A constant cannot take a symbolic dim past the batch (a sequence's, say).
        return self.pick([o for o in options if not symbolic(o)], label)


# --- blocks on an NCHW tensor -------------------------------------------------------------


def conv_out(size, k, s, d, pb, pe, auto_pad):
    span = (k - 1) * d + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return -(-size // s)
    if auto_pad == "VALID":
        return (size - span) // s + 1
    return (size + pb + pe - span) // s + 1


def conv(b: Builder, x: str, shape):
    n, c, h, w = shape
    depthwise = b.flag("depthwise")
    if depthwise:
        group, m = c, c * b.pick([1, 2], "depth multiplier")
    else:
        group = b.pick([g for g in (1, 2, 3, 4) if c % g == 0], "group")
        m = group * b.draw(st.integers(1, 4), label="filters per group")
    k = (b.pick([1, 2, 3], "kh"), b.pick([1, 2, 3], "kw"))
    strides = (b.pick([1, 2], "sh"), b.pick([1, 2], "sw"))
    dilations = (b.pick([1, 2], "dh"), b.pick([1, 2], "dw"))
    auto_pad = b.pick(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"], "auto_pad")
    pads = [b.draw(st.integers(0, k[i % 2] - 1), label="pad") for i in range(4)]
    if auto_pad.startswith("SAME"):
        dilations = (1, 1)  # onnxruntime's Conv refuses SAME padding with dilations
    explicit = auto_pad == "NOTSET" and b.flag("explicit pads")
    if not explicit:
        pads = [0] * 4
    out = [conv_out(size, k[i], strides[i], dilations[i], pads[i], pads[i + 2], auto_pad)
           for i, size in enumerate((h, w))]
    if min(out) < 1:  # too small a map for this kernel: a 1×1 conv instead
        k, dilations, pads, auto_pad, out = (1, 1), (1, 1), [0] * 4, "NOTSET", [
            conv_out(size, 1, strides[i], 1, 0, 0, "NOTSET") for i, size in enumerate((h, w))]
    attrs = dict(kernel_shape=list(k), strides=list(strides), dilations=list(dilations))
    if explicit:
        attrs["pads"] = pads
    elif auto_pad != "NOTSET":
        attrs["auto_pad"] = auto_pad
    if group > 1:
        attrs["group"] = group
    inputs = [x, b.const(b.weights(m, c // group, *k, scale=1 / math.sqrt(c // group * k[0]
                                                                         * k[1])), "w")]
    if b.flag("conv bias"):
        inputs.append(b.const(b.weights(m, scale=0.5), "bias"))
    return b.op("Conv", inputs, **attrs), [n, m, *out]


def batch_norm(b: Builder, x: str, shape):
    c = shape[1]
    small_var = b.flag("small variance")
    var = b.rng.random(c) * (1e-3 if small_var else 1.0) + (0 if small_var else 0.1)
    eps = b.pick([None, 1e-5, 1e-3, 0.1], "epsilon")
    attrs = {} if eps is None else {"epsilon": eps}
    inputs = [x, b.const(b.weights(c, scale=0.5) + 1, "gamma"),
              b.const(b.weights(c, scale=0.5), "beta"), b.const(b.weights(c, scale=0.5), "mean"),
              b.const(var + (1e-2 if eps is None else 0), "var")]
    return b.op("BatchNormalization", inputs, **attrs), shape


def activation(b: Builder, x: str, shape):
    kind = b.pick(["Relu", "Clip", "LeakyRelu", "Sigmoid", "SiLU", "HardSigmoid", "HardSwish",
                   "HardSwishDecomposed", "Tanh", "Softplus", "Elu", "PRelu"], "activation")
    if kind == "Clip":
        lo, hi = b.pick([(0.0, 6.0), (-1.0, 1.0), (0.0, None), (None, 6.0), (None, None),
                         (-0.5, 0.25), (0.0, 0.0)], "clip bounds")
        inputs = [x, "" if lo is None else b.const(np.array(lo), "lo", share=False)]
        if hi is not None:
            inputs.append(b.const(np.array(hi), "hi", share=False))
        if inputs[-1] == "":
            inputs.pop()
        return b.op("Clip", inputs), shape
    if kind == "LeakyRelu":
        alpha = b.pick([None, 0.1, 0.2, 1.5], "alpha")
        return b.op("LeakyRelu", [x], **({} if alpha is None else {"alpha": alpha})), shape
    if kind == "SiLU":
        s = b.op("Sigmoid", [x])
        b.tap(s, shape)
        return b.op("Mul", [s, x] if b.flag("sigmoid first") else [x, s]), shape
    if kind == "HardSigmoid":
        alpha, beta = b.pick([(None, None), (1 / 6, 0.5), (0.25, 0.4), (0.2, None)], "hs")
        attrs = {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
        hs = b.op("HardSigmoid", [x], **attrs)
        if b.flag("x * hardsigmoid"):
            b.tap(hs, shape)
            return b.op("Mul", [x, hs]), shape
        return hs, shape
    if kind == "HardSwish":
        if b.opset < 14:
            return b.op("Relu", [x]), shape
        return b.op("HardSwish", [x]), shape
    if kind == "HardSwishDecomposed":
        # x · relu6(x + 3) / 6, or a near miss (+2.5, / 5.9)
        three = b.pick([3.0, 3.0, 2.5], "hswish shift")
        six = b.pick([6.0, 6.0, 5.9], "hswish divisor")
        a = b.op("Add", [x, b.const(np.array(three), "three", share=False)])
        c = b.op("Clip", [a, b.const(np.array(0.0), "zero", share=False),
                          b.const(np.array(6.0), "six", share=False)])
        b.tap(c, shape)
        m = b.op("Mul", [x, c])
        if b.flag("divide"):
            return b.op("Div", [m, b.const(np.array(six), "six", share=False)]), shape
        return b.op("Mul", [m, b.const(np.array(1 / six), "sixth", share=False)]), shape
    if kind == "PRelu":
        slope = b.pick([(1,), (shape[1], 1, 1) if len(shape) == 4 else (shape[-1],)], "slope")
        return b.op("PRelu", [x, b.const(b.weights(*slope, scale=0.3), "slope")]), shape
    return b.op(kind, [x]), shape


def affine(b: Builder, x: str, shape):
    """Add/Sub/Mul/Div by a constant of some broadcastable shape, either side."""
    op = b.pick(["Add", "Mul", "Sub", "Div"], "affine op")
    cshape = b.broadcast_shape(shape, "affine shape")
    value = b.weights(*cshape, scale=0.5)
    if op == "Div":
        value = np.sign(value) * (np.abs(value) + 0.5)
    elif op == "Mul" and b.flag("negative mul"):
        value = -np.abs(value)
    c = b.const(value, "k")
    swap = op in ("Add", "Mul", "Sub") and b.flag("constant first")
    return b.op(op, [c, x] if swap else [x, c]), shape


def elementwise_chain(b: Builder, x: str, shape):
    """2-5 elementwise ops, some binary with broadcast constants or with the chain's input."""
    first = x
    for _ in range(b.draw(st.integers(2, 5), label="chain length")):
        kind = b.pick(["Add", "Mul", "Sub", "Div", "Neg", "Abs", "Relu", "Sigmoid", "Tanh",
                       "Max", "Min", "Sqrt", "Reciprocal", "Pow", "with input"], "chain op")
        if kind == "with input":
            x = b.op(b.pick(["Add", "Mul", "Sub", "Max"], "binary"), [x, first])
        elif kind in ("Sqrt", "Reciprocal"):
            x = b.op(kind, [b.op("Add", [b.op("Abs", [x]), b.const(np.array(1.0), "one")])])
        elif kind == "Pow":
            x = b.op("Pow", [x, b.const(np.array(b.pick([2.0, 3.0, 1.0], "exponent")), "p",
                                        share=False)])
        elif kind in ("Add", "Mul", "Sub", "Div", "Max", "Min"):
            cshape = b.broadcast_shape(shape, "chain shape")
            value = b.weights(*cshape, scale=0.5)
            if kind == "Div":
                value = np.sign(value) * (np.abs(value) + 0.5)
            x = b.op(kind, [x, b.const(value, "e")])
        else:
            x = b.op(kind, [x])
        if kind == "Pow" or kind == "Mul":
            x = b.op("Tanh", [x])  # keeps repeated products from overflowing
        b.tap(x, shape)
    return x, shape


def layout_chain(b: Builder, x: str, shape):
    """Reshape/Transpose/Squeeze/Unsqueeze/Flatten steps that end at `shape` again (some
    cancel, some do not until the last step)."""
    start = list(shape)
    for _ in range(b.draw(st.integers(1, 3), label="layout steps")):
        kind = b.pick(["Transpose", "Unsqueeze", "Flatten", "Reshape", "ShapeReshape",
                       "Elementwise"], "layout")
        rank = len(shape)
        if kind == "Transpose":
            keep_batch = shape[0] == BATCH
            rest = list(range(1 if keep_batch else 0, rank))
            perm = ([0] if keep_batch else []) + b.draw(st.permutations(rest), label="perm")
            x, shape = b.op("Transpose", [x], perm=perm), [shape[p] for p in perm]
        elif kind == "Unsqueeze" and rank < 6:
            axis = b.draw(st.integers(1, rank), label="unsqueeze axis")  # the batch stays first
            written = axis - rank - 1 if b.flag("negative axis") else axis
            x = b.op("Unsqueeze", [x, b.ints([written])])
            shape = shape[:axis] + [1] + shape[axis:]
            if b.flag("squeeze back"):
                x, shape = b.op("Squeeze", [x, b.ints([axis])]), shape[:axis] + shape[axis + 1:]
        elif kind == "Flatten" and rank >= 2:
            # Past axis 1 a symbolic batch would be folded into a dim of unknown size.
            axis = 1 if shape[0] == BATCH else b.draw(st.integers(1, rank - 1), label="axis")
            x = b.op("Flatten", [x], axis=axis)
            shape = [shape[0] if axis == 1 else int(np.prod(shape[:axis])),
                     int(np.prod(shape[axis:]))]
        elif kind == "Elementwise":  # between Transposes: what SinkTransposes moves them past
            x, shape = b.pick([affine, activation], "between")(b, x, shape)
        elif kind in ("Reshape", "ShapeReshape"):
            tail = int(np.prod(shape[1:]))
            split = [d for d in range(1, tail + 1) if tail % d == 0]
            d = b.pick(split, "reshape split")
            target = [shape[0], d, tail // d]
            x = reshape_to(b, x, target, kind == "ShapeReshape" and shape[0] == target[0])
            shape = target
        b.tap(x, shape)
    if shape != start:
        # Shape arithmetic reads the batch from x's first dim: only where that is the batch.
        x = reshape_to(b, x, start, shape[0] == start[0] and b.flag("shape arithmetic back"))
    return x, start


def reshape_to(b: Builder, x: str, target, arithmetic: bool) -> str:
    """Reshape x (batch first) to `target`: a constant shape with 0 or -1 for a symbolic
    batch, or Shape → Gather → Unsqueeze → Concat computing it."""
    if arithmetic:
        dims = b.op("Shape", [x])
        batch = b.op("Gather", [dims, b.const(np.array(0, np.int64), "zero", share=False)],
                     axis=0)
        batch = b.op("Unsqueeze", [batch, b.ints([0])])
        shape = b.op("Concat", [batch, b.ints(target[1:])], axis=0)
        return b.op("Reshape", [x, shape])
    first = target[0]
    if first == BATCH:
        first = b.pick([0, -1], "batch as")
    elif b.flag("batch as -1"):
        first = -1
    rest = list(target[1:])
    if first != -1 and rest and b.flag("-1 elsewhere"):
        rest[-1] = -1
    return b.op("Reshape", [x, b.ints([first] + rest)])


def split_concat(b: Builder, x: str, shape):
    """Slice or Split along a static axis, an op on a part, and Concat back, in order or not
    (a near miss for the slicing rules)."""
    axes = [a for a in range(1, len(shape)) if shape[a] >= 2]
    if not axes:
        return x, shape
    axis = b.pick(axes, "split axis")
    cut = b.draw(st.integers(1, shape[axis] - 1), label="cut")
    if b.flag("split op"):
        parts = b.op("Split", [x, b.ints([cut, shape[axis] - cut])], outputs=2, axis=axis)
    else:
        parts = [b.op("Slice", [x, b.ints([0]), b.ints([cut]), b.ints([axis])]),
                 b.op("Slice", [x, b.ints([cut]), b.ints([2 ** 62]), b.ints([axis - len(shape)])])]
    first = parts[0]
    if b.flag("op on a part"):
        first = b.op(b.pick(["Relu", "Neg", "Sigmoid"], "part op"), [first])
    b.tap(parts[1], shape[:axis] + [shape[axis] - cut] + shape[axis + 1:])
    if b.flag("swap parts") and cut * 2 == shape[axis]:
        return b.op("Concat", [parts[1], first], axis=axis), shape
    return b.op("Concat", [first, parts[1]], axis=axis), shape


def host_op(b: Builder, x: str, shape):
    """A TopK over the whole last axis (sorted values, same shape), which ascend310 leaves to
    the host: the graph is cut into device partitions around it."""
    if b.dtype != np.float32:  # onnxruntime has no float16 TopK
        return x, shape
    return b.op("TopK", [x, b.ints([shape[-1]])], outputs=2, axis=-1)[0], shape


def conv_block(b: Builder, x: str, shape):
    x, shape = conv(b, x, shape)
    b.tap(x, shape)
    if b.flag("batchnorm"):
        x, shape = batch_norm(b, x, shape)
        b.tap(x, shape)
    for _ in range(b.draw(st.integers(0, 2), label="after conv")):
        x, shape = b.pick([activation, affine], "after conv op")(b, x, shape)
        b.tap(x, shape)
    return x, shape


def pool(b: Builder, x: str, shape):
    kind = b.pick(["GlobalAveragePool", "MaxPool", "AveragePool"], "pool")
    if kind == "GlobalAveragePool":
        return b.op(kind, [x]), shape[:2] + [1, 1]
    k = [min(2, shape[2]), min(2, shape[3])]
    return b.op(kind, [x], kernel_shape=k, strides=k), \
        shape[:2] + [shape[2] // k[0], shape[3] // k[1]]


CONV_BLOCKS = [conv_block, conv_block, batch_norm, activation, affine, elementwise_chain,
               layout_chain, pool, split_concat, host_op]


def conv_net(b: Builder, batch):
    c = b.draw(st.integers(1, 6), label="channels")
    shape = [batch, c, b.draw(st.integers(1, 9), label="h"), b.draw(st.integers(1, 9), label="w")]
    x = b.add_input(shape)
    for _ in range(b.draw(st.integers(1, 4), label="blocks")):
        x, shape = b.pick(CONV_BLOCKS, "block")(b, x, shape)
    if b.flag("gemm head"):
        x, shape = gemm_head(b, x, shape)
    b.add_output(x, shape)


def gemm_head(b: Builder, x: str, shape):
    """Flatten to [N, K], then Gemm (transA/transB, alpha, beta, C of several shapes) or
    MatMul + Add."""
    x = b.op("Flatten", [x], axis=1)
    k, n = int(np.prod(shape[1:])), b.draw(st.integers(1, 6), label="gemm n")
    if b.flag("matmul add"):
        y = b.op("MatMul", [x, b.const(b.weights(k, n, scale=1 / math.sqrt(k)), "W")])
        b.tap(y, [shape[0], n])
        return b.op("Add", [y, b.const(b.weights(n, scale=0.5), "B")]), [shape[0], n]
    trans_b = b.flag("transB")
    attrs = {"transB": 1} if trans_b else {}
    if b.flag("transA"):
        x, attrs["transA"] = b.op("Transpose", [x], perm=[1, 0]), 1
    for key, options in (("alpha", [None, 1.0, 0.5, 2.0]), ("beta", [None, 1.0, 0.0, -1.5])):
        value = b.pick(options, key)
        if value is not None:
            attrs[key] = value
    w = b.weights(*((n, k) if trans_b else (k, n)), scale=1 / math.sqrt(k))
    inputs = [x, b.const(w, "W")]
    cshape = b.pick([None, (n,), (1,), (1, n)] + ([] if shape[0] == BATCH else [(shape[0], n)]),
                    "gemm C")
    if cshape is not None:
        inputs.append(b.const(b.weights(*cshape, scale=0.5), "C"))
    y = b.op("Gemm", inputs, **attrs)
    if b.flag("gemm activation"):
        b.tap(y, [shape[0], n])
        y, _ = activation(b, y, [shape[0], n])
    return y, [shape[0], n]


# --- blocks on a [N, S, D] tensor -------------------------------------------------------------


def reduce_mean(b: Builder, x: str, axes) -> str:
    if b.opset >= 18:
        return b.op("ReduceMean", [x, b.ints(axes)])
    return b.op("ReduceMean", [x], axes=list(axes))


def layer_norm(b: Builder, x: str, shape):
    rank = len(shape)
    axes = b.pick([[-1], [rank - 1], [1], [-2, -1], [rank - 2, rank - 1]], "ln axes")
    mu = reduce_mean(b, x, axes)
    d = b.op("Sub", [x, mu])
    b.tap(d, shape)
    if b.flag("d*d"):
        sq = b.op("Mul", [d, d])
    else:
        # The near miss is even: an odd power's mean cancels to ~0 over a row, and the Sqrt
        # of it then magnifies any rounding difference (a compare of noise, not of rewrites).
        sq = b.op("Pow", [d, b.const(np.array(b.pick([2.0, 2.0, 2.0, 4.0], "ln exponent")),
                                     "two", share=False)])
    second = [1] if axes != [1] and b.flag("second axes differ") else axes  # a near miss
    var = reduce_mean(b, sq, second)
    eps = b.const(np.array(b.pick([1e-5, 1e-6, 1e-12, 0.1], "ln eps")), "eps", share=False)
    ve = b.op("Add", [var, eps])
    sd = b.op("Sqrt", [ve])
    if b.flag("reciprocal"):
        y = b.op("Mul", [d, b.op("Reciprocal", [sd])])
    else:
        y = b.op("Div", [d, sd])
    reduced = sorted(a % rank for a in axes)
    normalized = [shape[a] for a in reduced]
    if reduced != list(range(rank - len(axes), rank)):  # not trailing: broadcast as [S, 1]
        normalized = [shape[a] if a in reduced else 1 for a in range(1, rank)]
    if not symbolic(normalized) and b.flag("ln scale"):
        y = b.op("Mul", [y, b.const(b.weights(*normalized, scale=0.5) + 1, "gamma")])
        if b.flag("ln bias"):
            y = b.op("Add", [y, b.const(b.weights(*normalized, scale=0.5), "beta")])
    return y, shape


def gelu(b: Builder, x: str, shape):
    perturb = b.pick([1.0, 1.0, 1.0, 1.001, 0.99], "gelu perturbation")
    if b.flag("tanh form"):
        # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
        cube = b.op("Pow", [x, b.const(np.array(3.0), "three", share=False)]) \
            if b.flag("pow 3") else b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = b.op("Add", [x, b.op("Mul", [cube, b.const(np.array(0.044715), "c",
                                                             share=False)])])
        t = b.op("Tanh", [b.op("Mul", [inner, b.const(np.array(math.sqrt(2 / math.pi)
                                                                * perturb), "k", share=False)])])
    else:
        if b.flag("mul by 1/sqrt2"):
            d = b.op("Mul", [x, b.const(np.array(1 / math.sqrt(2) * perturb), "r", share=False)])
        else:
            d = b.op("Div", [x, b.const(np.array(math.sqrt(2) * perturb), "s", share=False)])
        t = b.op("Erf", [d])
    b.tap(t, shape)
    p = b.op("Add", [t, b.const(np.array(1.0), "one", share=False)])
    half = b.const(np.array(0.5), "half", share=False)
    if b.flag("half first"):
        return b.op("Mul", [b.op("Mul", [x, half]), p]), shape
    return b.op("Mul", [b.op("Mul", [x, p]), half]), shape


def matmul_add(b: Builder, x: str, shape):
    d, e = shape[-1], b.pick([shape[-1], 4, 8], "matmul width")
    y = b.op("MatMul", [x, b.const(b.weights(d, e, scale=1 / math.sqrt(d)), "W")])
    shape = shape[:-1] + [e]
    if b.flag("matmul bias"):
        b.tap(y, shape)
        bshape = b.pick([s for s in [(e,), (1, e), tuple(shape[1:])] if not symbolic(s)],
                        "matmul bias shape")
        c = b.const(b.weights(*bshape, scale=0.5), "B")
        y = b.op("Add", [c, y] if b.flag("bias first") else [y, c])
    return y, shape


def attention(b: Builder, x: str, shape):
    """Multi-head attention as exporters write it, with near misses: the softmax axis, the
    scale's value and place, an additive mask of several shapes."""
    n, s, d = shape
    heads = b.pick([h for h in (1, 2, 4) if d % h == 0], "heads")
    dh = d // heads

    def project(label):
        y = b.op("MatMul", [x, b.const(b.weights(d, d, scale=1 / math.sqrt(d)), "W" + label)])
        if b.flag(label + " bias"):
            y = b.op("Add", [y, b.const(b.weights(d, scale=0.3), "B" + label)])
        y = b.op("Reshape", [y, b.ints([0, 0, heads, dh])])
        return b.op("Transpose", [y], perm=[0, 2, 1, 3])

    q, k, v = project("q"), project("k"), project("v")
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scale = b.pick([1 / math.sqrt(dh), 1 / math.sqrt(dh), 0.3, 1.0], "scale")
    place = b.pick(["scores", "q", "div"], "scale place")
    if place == "q":
        q = b.op("Mul", [q, b.const(np.array(scale), "scale", share=False)])
    scores = b.op("MatMul", [q, kt])
    if place == "scores":
        scores = b.op("Mul", [scores, b.const(np.array(scale), "scale", share=False)])
    elif place == "div":
        scores = b.op("Div", [scores, b.const(np.array(1 / scale), "scale", share=False)])
    masks = [None, "input"] if isinstance(s, str) else [None, (s, s), (1, 1, s, s), (1, 1, 1, s),
                                                         "input"]
    mask = b.pick(masks, "mask")
    if mask == "input":
        m = b.add_input([n, 1, 1, s])
        scores = b.op("Add", [scores, m])
    elif mask is not None:
        causal = np.triu(np.full((s, s), -1e4), 1)
        value = np.broadcast_to(causal, (s, s))[-mask[-2]:].reshape(mask) \
            if b.flag("causal") else b.weights(*mask)
        scores = b.op("Add", [scores, b.const(value, "mask")])
    b.tap(scores, [n, heads, s, s])
    probs = b.op("Softmax", [scores], axis=b.pick([-1, -1, 3, 2], "softmax axis"))
    ctx = b.op("MatMul", [probs, v])
    ctx = b.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.ints([0, 0, d])])
    if b.flag("output projection"):
        ctx = b.op("MatMul", [ctx, b.const(b.weights(d, d, scale=1 / math.sqrt(d)), "Wo")])
    if b.flag("residual"):
        ctx = b.op("Add", [ctx, x])
    return ctx, shape


SEQ_BLOCKS = [layer_norm, layer_norm, gelu, gelu, attention, matmul_add, elementwise_chain,
              layout_chain, affine, activation, split_concat, host_op]


def sequence_net(b: Builder, batch):
    shape = [batch, b.draw(st.integers(1, 5), label="s"), b.pick([2, 4, 8], "d")]
    x = b.add_input(shape)
    for _ in range(b.draw(st.integers(1, 3), label="blocks")):
        x, shape = b.pick(SEQ_BLOCKS, "block")(b, x, shape)
    b.add_output(x, shape)


@st.composite
def models(draw, family: str):
    """(model, whether its batch dim is symbolic)."""
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float32, np.float16]), label="dtype")
    opset = draw(st.sampled_from([13, 17, 17, 18]), label="opset")
    b = Builder(draw, dtype, opset)
    symbolic = draw(st.booleans(), label="symbolic batch")
    batch = BATCH if symbolic else draw(st.sampled_from([1, 2]), label="batch")
    (conv_net if family == "conv" else sequence_net)(b, batch)
    return b.model(), symbolic


def feeds_for(model: onnx.ModelProto, batch: int, seed: int = 3,
              sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs; a symbolic dim takes its size in `sizes`, else `batch`."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else (sizes or {}).get(d.dim_param, batch)
                for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if np.dtype(dtype).kind in "OU":  # strings
            feeds[vi.name] = rng.choice(np.array(["ab", "Cd", "ÉF", ""], object), dims)
        else:
            feeds[vi.name] = rng.standard_normal(dims).astype(dtype)
    return feeds

