"""Output types of onnxruntime's quantized contrib ops (the QOperator form its quantize_static
writes), which ONNX's shape inference does not know: rules of (output index, dtype, shape)."""

from __future__ import annotations

import math

from graphopt.ir import DType


def broadcast_shape(a, b) -> tuple | None:
    """Numpy broadcasting of two shapes whose dims are ints or names; None when unknown."""
    if a is None or b is None:
        return None
    width = max(len(a), len(b))
    a = (1,) * (width - len(a)) + tuple(a)
    b = (1,) * (width - len(b)) + tuple(b)
    dims = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            dims.append(x)
        elif x == 1:
            dims.append(y)
        else:
            return None
    return tuple(dims)


def _quantized(node, zero_index: int, fallback=None):
    """The dtype of a quantized output: its zero point's, else `fallback`'s."""
    zero = node.input(zero_index)
    if zero is not None:
        return zero.dtype
    return None if fallback is None else fallback.dtype


def _binary(node) -> list:
    """QLinearAdd/QLinearMul(A, A_scale, A_zero, B, B_scale, B_zero, C_scale, C_zero): A and
    B broadcast, in C's zero point's dtype (A's without one)."""
    a, b = node.inputs[0], node.input(3)
    dtype = _quantized(node, 7, a)
    if b is None or dtype is None:
        return []
    return [(0, dtype, broadcast_shape(a.shape, b.shape))]


def _unary(node) -> list:
    """QLinearSigmoid/QLinearLeakyRelu/QLinearSoftmax(X, X_scale, X_zero, Y_scale, Y_zero):
    X's shape, in Y's zero point's dtype (X's without one)."""
    dtype = _quantized(node, 4, node.inputs[0])
    return [] if dtype is None else [(0, dtype, node.inputs[0].shape)]


def _gemm(node) -> list:
    """QGemm(A, a_scale, a_zero, B, b_scale, b_zero, C, y_scale, y_zero): [M, N] after transA
    and transB; y_zero's dtype, float32 without it (as onnxruntime computes it, even with a
    y_scale)."""
    a, b = node.inputs[0], node.input(3)
    zero = node.input(8)  # onnxruntime: float32 without y_zero_point, even with y_scale
    dtype = DType.FLOAT if node.input(7) is None or zero is None else zero.dtype
    if dtype is None:
        return []
    shape = None
    if a is not None and b is not None and a.shape is not None and b.shape is not None \
            and len(a.shape) == 2 and len(b.shape) == 2:
        rows = a.shape[1] if node.attr("transA", 0) else a.shape[0]
        cols = b.shape[0] if node.attr("transB", 0) else b.shape[1]
        shape = (rows, cols)
    return [(0, dtype, shape)]


def _global_average_pool(node) -> list:
    """QLinearGlobalAveragePool(X, x_scale, x_zero, y_scale, y_zero): every spatial dim 1
    ([N, C, 1, 1], or [N, 1, 1, C] with channels_last), in y_zero's dtype."""
    x = node.inputs[0]
    dtype = _quantized(node, 4, x)
    if dtype is None:
        return []
    if x.shape is None or len(x.shape) < 3:
        return [(0, dtype, None)]
    spatial = (1,) * (len(x.shape) - 2)
    last = node.attr("channels_last", 0)
    shape = (x.shape[0], *spatial, x.shape[-1]) if last else (*x.shape[:2], *spatial)
    return [(0, dtype, shape)]


def _pooled(size, kernel: int, stride: int, begin: int, end: int, auto_pad: str):
    """A pooled dim without ceil_mode (whose last window onnxruntime and ONNX count apart)."""
    if not isinstance(size, int):
        return None
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return math.ceil(size / stride)
    if auto_pad == "VALID":
        return (size - kernel) // stride + 1
    return (size + begin + end - kernel) // stride + 1


def _average_pool(node) -> list:
    """QLinearAveragePool(X, x_scale, x_zero, y_scale, y_zero): AveragePool's shape over the
    spatial axes (after C with channels_last), in y_zero's dtype; the spatial dims unknown with
    ceil_mode."""
    x = node.inputs[0]
    dtype = _quantized(node, 4, x)
    kernel = node.attr("kernel_shape")
    if dtype is None:
        return []
    if x.shape is None or kernel is None or len(x.shape) != len(kernel) + 2:
        return [(0, dtype, None)]
    count = len(kernel)
    strides = node.attr("strides") or [1] * count
    pads = node.attr("pads") or [0] * (2 * count)
    auto_pad = node.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    last = node.attr("channels_last", 0)
    sizes = x.shape[1:-1] if last else x.shape[2:]
    pooled = [None if node.attr("ceil_mode", 0) else
              _pooled(size, kernel[i], strides[i], pads[i], pads[i + count], auto_pad)
              for i, size in enumerate(sizes)]
    shape = (x.shape[0], *pooled, x.shape[-1]) if last else (*x.shape[:2], *pooled)
    return [(0, dtype, shape)]


def _concat(node) -> list:
    """QLinearConcat(Y_scale, Y_zero, X1, X1_scale, X1_zero, …): the inputs joined along
    `axis`, in Y_zero's dtype."""
    zero = node.input(1)
    tensors = node.inputs[2::3]
    if zero is None or zero.dtype is None or not tensors or any(t is None for t in tensors):
        return []
    shapes = [t.shape for t in tensors]
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return [(0, zero.dtype, None)]
    rank = len(shapes[0])
    axis = node.attr("axis")
    if not isinstance(axis, int) or not -rank <= axis < rank:
        return [(0, zero.dtype, None)]
    axis %= rank
    joined = [s[axis] for s in shapes]
    shape = list(shapes[0])
    shape[axis] = sum(joined) if all(isinstance(d, int) for d in joined) else None
    return [(0, zero.dtype, tuple(shape))]


QLINEAR_TYPED_BY_RULE = {
    "QGemm": _gemm,
    "QLinearAdd": _binary,
    "QLinearAveragePool": _average_pool,
    "QLinearConcat": _concat,
    "QLinearGlobalAveragePool": _global_average_pool,
    "QLinearLeakyRelu": _unary,
    "QLinearMul": _binary,
    "QLinearSigmoid": _unary,
    "QLinearSoftmax": _unary,
}

__all__ = ["QLINEAR_TYPED_BY_RULE", "broadcast_shape"]
