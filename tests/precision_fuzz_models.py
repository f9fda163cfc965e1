"""Random small ONNX models for fuzzing the precision modes: a builder that tracks each value's
shape, dtype and whether its values are exact (integers no float path feeds) or smooth (no
comparison, rounding to integers or float-chosen index decides them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT, INT64, BOOL = "f", "i", "b"
ELEM = {FLOAT: TensorProto.FLOAT, INT64: TensorProto.INT64, BOOL: TensorProto.BOOL}


@dataclass(frozen=True)
class Value:
    name: str
    kind: str           # FLOAT, INT64 or BOOL
    shape: tuple
    exact: bool = True   # no float computation decides it (ints and bools only)
    smooth: bool = True  # a continuous function of the inputs (floats only)


class Builder:
    def __init__(self, opset: int, rng: np.random.Generator, constant_nodes: bool,
                 symbolic: bool = False):
        self.opset, self.rng, self.constant_nodes = opset, rng, constant_nodes
        self.symbolic = symbolic  # inputs declare a batch "N", outputs no static dims
        self.nodes, self.inits, self.inputs, self.values = [], [], [], []
        self.feeds, self.weights = {}, {}  # weights: name → float array (a noisy copy may vary it)
        self.counter = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}_{self.counter}"

    def input(self, name, kind, shape, array):
        declared = ("N", *shape[1:]) if self.symbolic else shape
        self.inputs.append(helper.make_tensor_value_info(name, ELEM[kind], declared))
        self.feeds[name] = array
        value = Value(name, kind, tuple(shape))
        self.values.append(value)
        return value

    def const(self, array, stem="c", weight=True) -> str:
        """An initializer, or a Constant node: precision passes see both."""
        array = np.asarray(array)
        name = self.fresh(stem)
        if self.constant_nodes and self.rng.random() < 0.3:
            self.nodes.append(helper.make_node("Constant", [], [name], self.fresh("Constant"),
                                               value=numpy_helper.from_array(array, name)))
        else:
            self.inits.append(numpy_helper.from_array(array, name))
        if weight and array.dtype == np.float32 and array.size > 1:
            self.weights[name] = array
        return name

    def weight(self, *shape, scale=1.0) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def node(self, op, inputs, outs, **attrs) -> list[Value]:
        """Add `op`; `outs` are (kind, shape, exact, smooth) of its outputs."""
        names = [self.fresh(op.lower()) for _ in outs]
        self.nodes.append(helper.make_node(op, inputs, names, self.fresh(op), **attrs))
        made = [Value(n, *o) for n, o in zip(names, outs)]
        self.values.extend(made)
        return made

    def one(self, op, inputs, kind, shape, exact=True, smooth=True, **attrs) -> Value:
        return self.node(op, inputs, [(kind, tuple(shape), exact, smooth)], **attrs)[0]

    def pick(self, n: int, kind=FLOAT, pred=lambda v: True) -> Value | None:
        found = [v for v in self.values if v.kind == kind and pred(v)]
        # Favour recent values, so that models grow deep rather than wide.
        return found[-1 - n % min(len(found), 4)] if found else None

    def model(self, outputs: list[Value]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "fuzz", self.inputs,
            [helper.make_tensor_value_info(v.name, ELEM[v.kind],
                                           [None] * len(v.shape) if self.symbolic else v.shape)
             for v in outputs],
            self.inits)
        return helper.make_model(graph, ir_version=8,
                                 opset_imports=[helper.make_opsetid("", self.opset)])


def _floats(v: Value, *more: Value) -> bool:
    return all(m.smooth for m in (v, *more))


# --- ops: each takes (builder, n) and adds a few nodes, or nothing when it has no operand -----

def conv(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) == 4)
    if not x:
        return
    c, k, co = x.shape[1], [1, 3][n % 2], 2 + n % 3
    inputs = [x.name, b.weight(co, c, k, k, scale=np.sqrt(2 / (c * k * k)))]
    if n % 3:
        inputs.append(b.weight(co, scale=0.1))
    b.one("Conv", inputs, FLOAT, (1, co, *x.shape[2:]), smooth=x.smooth, pads=[k // 2] * 4,
          kernel_shape=[k, k])


def conv_transpose(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) == 4)
    if not x:
        return
    c, k, co = x.shape[1], [1, 3][n % 2], 2 + n % 2
    b.one("ConvTranspose", [x.name, b.weight(c, co, k, k, scale=np.sqrt(1 / (c * k * k)))],
          FLOAT, (1, co, *x.shape[2:]), smooth=x.smooth, pads=[k // 2] * 4)


def matmul(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 2 and v.shape[-1] >= 2)
    if not x:
        return
    d, k = x.shape[-1], [8, 16, 32][n % 3]
    y = b.one("MatMul", [x.name, b.weight(d, k, scale=1 / np.sqrt(d))], FLOAT,
              (*x.shape[:-1], k), smooth=x.smooth)
    if n % 2:  # a bias, which int4 folds into MatMulNBits
        b.one("Add", [y.name, b.weight(k, scale=0.1)], FLOAT, y.shape, smooth=y.smooth)


def gemm(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) == 2)
    if not x:
        x = b.pick(n, pred=lambda v: len(v.shape) >= 2)
        if not x:
            return
        x = b.one("Flatten", [x.name], FLOAT, (x.shape[0], int(np.prod(x.shape[1:]))),
                  smooth=x.smooth, axis=1)
    d, k, trans = x.shape[1], [4, 16][n % 2], n % 3 == 0
    w = b.weight(*((k, d) if trans else (d, k)), scale=1 / np.sqrt(d))
    b.one("Gemm", [x.name, w, b.weight(k, scale=0.1)], FLOAT, (x.shape[0], k), smooth=x.smooth,
          transB=int(trans), alpha=[1.0, 0.5][n % 2])


def batchnorm(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) == 4)
    if not x:
        return
    c = x.shape[1]
    var = b.const((b.rng.random(c) + 0.5).astype(np.float32), "var")
    b.one("BatchNormalization", [x.name, b.weight(c), b.weight(c, scale=0.1),
                                 b.weight(c, scale=0.1), var], FLOAT, x.shape, smooth=x.smooth)


def softmax(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 1)
    if not x:
        return
    op = ["Softmax", "LogSoftmax"][n % 2]
    b.one(op, [x.name], FLOAT, x.shape, smooth=x.smooth, axis=-1 - n % len(x.shape))


def layernorm(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 2 and v.shape[-1] >= 2)
    if not x:
        return
    d = x.shape[-1]
    if b.opset >= 17 and n % 2:
        b.one("LayerNormalization", [x.name, b.weight(d), b.weight(d, scale=0.1)], FLOAT,
              x.shape, smooth=x.smooth, axis=-1, epsilon=1e-5)
        return
    # The decomposition exporters write (which FuseLayerNorm matches).
    mean = reduce_(b, "ReduceMean", x, [-1], True)
    centred = b.one("Sub", [x.name, mean.name], FLOAT, x.shape, smooth=x.smooth)
    square = b.one("Pow", [centred.name, b.const(np.float32(2.0))], FLOAT, x.shape,
                   smooth=x.smooth)
    var = reduce_(b, "ReduceMean", square, [-1], True)
    eps = b.one("Add", [var.name, b.const(np.float32(1e-5))], FLOAT, var.shape, smooth=x.smooth)
    std = b.one("Sqrt", [eps.name], FLOAT, var.shape, smooth=x.smooth)
    normed = b.one("Div", [centred.name, std.name], FLOAT, x.shape, smooth=x.smooth)
    scaled = b.one("Mul", [normed.name, b.weight(d)], FLOAT, x.shape, smooth=x.smooth)
    b.one("Add", [scaled.name, b.weight(d, scale=0.1)], FLOAT, x.shape, smooth=x.smooth)


def reduce_(b, op, x, axes, keepdims) -> Value:
    rank = len(x.shape)
    axes = sorted({a % rank for a in axes})
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keepdims or i not in axes)
    attrs = {"keepdims": int(keepdims)}
    inputs = [x.name]
    if op == "ReduceSum" or b.opset >= 18:
        inputs.append(b.const(np.array(axes, np.int64), "axes"))
    else:
        attrs["axes"] = axes
    return b.one(op, inputs, x.kind, shape, smooth=x.smooth, **attrs)


def reduce(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 2)
    if not x:
        return
    op = ["ReduceMean", "ReduceSum", "ReduceMax"][n % 3]
    axes = [1 + n % (len(x.shape) - 1)] if n % 4 else list(range(1, len(x.shape)))
    reduce_(b, op, x, axes, keepdims=n % 5 != 0)


def _positive(b, x, offset) -> Value:
    a = b.one("Abs", [x.name], FLOAT, x.shape, smooth=x.smooth)
    return b.one("Add", [a.name, b.const(np.float32(offset))], FLOAT, x.shape, smooth=x.smooth)


def math_(b, n):
    x = b.pick(n)
    if not x:
        return
    kind = n % 7
    if kind == 0:
        b.one("Exp", [x.name], FLOAT, x.shape, smooth=x.smooth)
    elif kind == 1:
        b.one("Log", [_positive(b, x, 0.5).name], FLOAT, x.shape, smooth=x.smooth)
    elif kind == 2:
        b.one("Sqrt", [_positive(b, x, 0.1).name], FLOAT, x.shape, smooth=x.smooth)
    elif kind == 3:
        b.one("Reciprocal", [_positive(b, x, 1.0).name], FLOAT, x.shape, smooth=x.smooth)
    elif kind == 4:
        b.one("Pow", [x.name, b.const(np.float32([2.0, 3.0][n % 2]))], FLOAT, x.shape,
              smooth=x.smooth)
    else:
        y = b.pick(n // 7, pred=lambda v: v.shape == x.shape) or x
        b.one("Div", [x.name, _positive(b, y, 1.0).name], FLOAT, x.shape,
              smooth=_floats(x, y))


def activation(b, n):
    x = b.pick(n)
    if not x:
        return
    op = ["Erf", "Tanh", "Sigmoid", "Relu", "Clip"][n % 5]
    inputs = [x.name]
    if op == "Clip":
        inputs += [b.const(np.float32(-1.5)), b.const(np.float32(2.0))][: 1 + n % 2]
    b.one(op, inputs, FLOAT, x.shape, smooth=x.smooth)


def binary(b, n):
    x = b.pick(n)
    if not x:
        return
    y = b.pick(n // 3, pred=lambda v: v.shape == x.shape and v.name != x.name)
    other = y.name if y else b.weight(*x.shape[1:], scale=0.5)
    b.one(["Add", "Mul", "Sub"][n % 3], [x.name, other], FLOAT, x.shape,
          smooth=_floats(x, *(y,) if y else ()))


def resize(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) == 4 and v.shape[2] <= 8)
    if not x:
        return
    mode = ["nearest", "linear"][n % 2]
    scales = b.const(np.array([1, 1, 2, 2], np.float32), "scales", weight=False)
    b.one("Resize", [x.name, "", scales], FLOAT, (*x.shape[:2], x.shape[2] * 2, x.shape[3] * 2),
          smooth=x.smooth, mode=mode)


def pad(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) == 4)
    if not x:
        return
    mode = ["constant", "reflect", "edge"][n % 3]
    if min(x.shape[2:]) < 2:  # reflect needs two values along a padded axis
        mode = "constant"
    inputs = [x.name, b.const(np.array([0, 0, 1, 0, 0, 0, 0, 1], np.int64), "pads")]
    if mode == "constant":
        inputs.append(b.const(np.float32(0.25)))
    b.one("Pad", inputs, FLOAT, (*x.shape[:2], x.shape[2] + 1, x.shape[3] + 1),
          smooth=x.smooth, mode=mode)


def concat_split_slice(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 2)
    if not x:
        return
    axis = 1 + n % (len(x.shape) - 1)
    kind = n % 3
    if kind == 0:
        y = b.pick(n // 3, pred=lambda v: v.shape == x.shape)
        shape = list(x.shape)
        shape[axis] *= 2
        b.one("Concat", [x.name, (y or x).name], FLOAT, shape, smooth=_floats(x, y or x),
              axis=axis)
    elif kind == 1 and x.shape[axis] >= 2:
        first = x.shape[axis] // 2
        sizes = [first, x.shape[axis] - first]
        outs = []
        for size in sizes:
            shape = list(x.shape)
            shape[axis] = size
            outs.append((FLOAT, tuple(shape), True, x.smooth))
        attrs = {"num_outputs": 2} if b.opset >= 18 and n % 2 else {}
        inputs = [x.name] if attrs else [x.name, b.const(np.array(sizes, np.int64), "split")]
        if attrs and sizes[0] != sizes[1]:
            sizes_ok = -(-x.shape[axis] // 2)  # num_outputs: the first parts are the larger
            outs[0] = (FLOAT, tuple(s if i != axis else sizes_ok for i, s in enumerate(x.shape)),
                       True, x.smooth)
            outs[1] = (FLOAT, tuple(s if i != axis else x.shape[axis] - sizes_ok
                                    for i, s in enumerate(x.shape)), True, x.smooth)
        b.node("Split", inputs, outs, axis=axis, **attrs)
    elif x.shape[axis] >= 2:
        shape = list(x.shape)
        shape[axis] -= 1
        b.one("Slice", [x.name, b.const(np.array([1], np.int64), "starts"),
                        b.const(np.array([x.shape[axis]], np.int64), "ends"),
                        b.const(np.array([axis], np.int64), "axes")], FLOAT, shape,
              smooth=x.smooth)


def gather(b, n):
    ids = b.pick(n, INT64, pred=lambda v: v.name == "ids")
    if ids and n % 2:
        rows = int(b.feeds["ids"].max()) + 1 + n % 3
        width = [8, 16][n // 2 % 2]
        b.one("Gather", [b.weight(rows, width), ids.name], FLOAT, (*ids.shape, width))
        return
    x = b.pick(n, pred=lambda v: len(v.shape) >= 2 and v.shape[1] >= 2)
    if not x:
        return
    index = b.const(np.array([x.shape[1] - 1, 0], np.int64), "idx")
    b.one("Gather", [x.name, index], FLOAT, (x.shape[0], 2, *x.shape[2:]), smooth=x.smooth,
          axis=1)


def cast(b, n):
    kind = n % 4
    if kind == 0:  # ids to float
        ids = b.pick(n, INT64)
        if ids:
            b.one("Cast", [ids.name], FLOAT, ids.shape, smooth=ids.exact, to=TensorProto.FLOAT)
        return
    x = b.pick(n)
    if not x:
        return
    if kind == 1:  # float → int32 → float: a rounding to integers
        s = b.one("Mul", [x.name, b.const(np.float32(4.0))], FLOAT, x.shape, smooth=x.smooth)
        i = b.one("Cast", [s.name], INT64, x.shape, exact=False, to=TensorProto.INT32)
        b.values[-1] = Value(i.name, "i32", i.shape, False)  # not an int64 operand for others
        b.one("Cast", [i.name], FLOAT, x.shape, smooth=False, to=TensorProto.FLOAT)
    elif kind == 2:  # float → int64, an output of its own
        b.one("Cast", [x.name], INT64, x.shape, exact=False, to=TensorProto.INT64)
    else:  # float → float, a no-op Cast
        b.one("Cast", [x.name], FLOAT, x.shape, smooth=x.smooth, to=TensorProto.FLOAT)


def reshape_by_shape(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 3)
    if not x:
        return
    shape = b.one("Shape", [x.name], INT64, (len(x.shape),))
    if n % 2:  # [d0, d1, rest]: dims gathered and multiplied
        head = b.one("Slice", [shape.name, b.const(np.array([0], np.int64)),
                               b.const(np.array([2], np.int64))], INT64, (2,))
        tail = b.one("Slice", [shape.name, b.const(np.array([2], np.int64)),
                               b.const(np.array([len(x.shape)], np.int64))], INT64,
                     (len(x.shape) - 2,))
        prod = reduce_(b, "ReduceProd", tail, [0], True)
        target = b.one("Concat", [head.name, prod.name], INT64, (3,), axis=0)
        out = (*x.shape[:2], int(np.prod(x.shape[2:])))
    else:  # [d0, -1]
        first = b.one("Gather", [shape.name, b.const(np.array([0], np.int64))], INT64, (1,),
                      axis=0)
        target = b.one("Concat", [first.name, b.const(np.array([-1], np.int64))], INT64, (2,),
                       axis=0)
        out = (x.shape[0], int(np.prod(x.shape[1:])))
    b.one("Reshape", [x.name, target.name], FLOAT, out, smooth=x.smooth)


def _broadcasts(small, big) -> bool:
    try:
        return np.broadcast_shapes(small, big) == tuple(big)
    except ValueError:
        return False


def where(b, n):
    x = b.pick(n)
    if not x:
        return
    kind = n % 3
    if kind == 2:  # a condition from exact integers: ids compared with a constant
        ids = b.pick(n, INT64, pred=lambda v: v.exact and _broadcasts(v.shape, x.shape))
        if ids:
            cond = b.one("Equal", [ids.name, b.const(np.int64(1))], BOOL, ids.shape)
            b.one("Where", [cond.name, x.name, b.const(np.float32(-1.0))], FLOAT, x.shape,
                  smooth=x.smooth)
            return
    y = b.pick(n // 3, pred=lambda v: v.shape == x.shape)
    op = ["Less", "Greater"][kind % 2]
    cond = b.one(op, [x.name, (y or x).name if n % 4 else b.const(np.float32(0.1))], BOOL,
                 x.shape, exact=False)
    b.one("Where", [cond.name, x.name, (y or x).name], FLOAT, x.shape, smooth=False)
    if n % 5 == 0:  # a bool output of its own
        b.one("Not", [cond.name], BOOL, x.shape, exact=False)


def topk_argmax(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 1 and v.shape[-1] >= 2)
    if not x:
        return
    if n % 2:
        k = 1 + n % x.shape[-1]
        shape = (*x.shape[:-1], k)
        b.node("TopK", [x.name, b.const(np.array([k], np.int64), "k")],
               [(FLOAT, shape, True, x.smooth), (INT64, shape, False, True)], axis=-1)
    else:
        keep = n % 3 != 0
        shape = x.shape[:-1] + ((1,) if keep else ())
        b.one("ArgMax", [x.name], INT64, shape, exact=False, axis=-1, keepdims=int(keep))


def cumsum(b, n):
    x = b.pick(n, pred=lambda v: len(v.shape) >= 1)
    if not x:
        return
    axis = b.const(np.array(n % len(x.shape), np.int64), "axis")
    b.one("CumSum", [x.name, axis], FLOAT, x.shape, smooth=x.smooth, reverse=n % 2)


def constant_of_shape(b, n):
    x = b.pick(n)
    if not x:
        return
    shape = b.one("Shape", [x.name], INT64, (len(x.shape),))
    fill = b.one("ConstantOfShape", [shape.name], FLOAT, x.shape,
                 value=numpy_helper.from_array(np.array([0.5], np.float32)))
    b.one(["Add", "Mul"][n % 2], [x.name, fill.name], FLOAT, x.shape, smooth=x.smooth)


def int_arith(b, n):
    i = b.pick(n, INT64)
    if not i:
        return
    b.one(["Add", "Mul"][n % 2], [i.name, b.const(np.int64(2))], INT64, i.shape, exact=i.exact)


OPS = [conv, conv_transpose, matmul, gemm, batchnorm, softmax, layernorm, reduce, math_,
       activation, binary, resize, pad, concat_split_slice, gather, cast, reshape_by_shape, where,
       topk_argmax, cumsum, constant_of_shape, int_arith]


@dataclass
class Fuzzed:
    model: onnx.ModelProto
    feeds: dict
    outputs: list[Value]
    builder: Builder


def build(opset: int, seed: int, layout: int, steps: list[tuple[int, int]],
          outputs: list[int], constant_nodes: bool, symbolic: bool = False) -> Fuzzed:
    """A model of `steps` (op index, operand choice) on an image, a sequence and/or token ids
    (`layout`'s bits), its feeds, and its outputs: the last value plus those `outputs` pick;
    `symbolic` declares the inputs' batch dim "N" (fed as 1) and the outputs' dims open."""
    rng = np.random.default_rng(seed)
    b = Builder(opset, rng, constant_nodes, symbolic)
    if layout % 4 != 1:
        c, h = 2 + seed % 3, [4, 6, 8][seed // 3 % 3]
        b.input("x", FLOAT, (1, c, h, h), rng.standard_normal((1, c, h, h)).astype(np.float32))
    if layout % 4 != 0:
        s, d = 2 + seed % 4, [16, 32][seed % 2]
        b.input("s", FLOAT, (1, s, d), rng.standard_normal((1, s, d)).astype(np.float32))
    if layout & 4:
        b.input("ids", INT64, (1, 5), rng.integers(0, 6, (1, 5)).astype(np.int64))
    for op, n in steps:
        OPS[op % len(OPS)](b, n)
    computed = [v for v in b.values if v.kind in (FLOAT, INT64, BOOL)
                and v.name not in b.feeds]
    if not computed:
        return None
    chosen = [computed[-1]] + [computed[i % len(computed)] for i in outputs]
    unique = list({v.name: v for v in chosen}.values())
    return Fuzzed(b.model(unique), b.feeds, unique, b)
