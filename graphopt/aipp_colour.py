"""AIPP's YUV420SP input and colour conversion (CSC) as ONNX ops: each chroma sample repeated
over its 2x2 pixels, and ATC's ((M · (in - input_bias)) >> 8) + output_bias, computed exactly
in float32 and saturated to the 0-255 of the 8-bit image it makes. A YUV420SP frame is
converted with its chroma's share computed once per 2x2 pixels, before it is repeated."""

from __future__ import annotations

import numpy as np

from graphopt.aipp_config import AippOp
from graphopt.aipp_ops import OpBuilder
from graphopt.ir import DType, Value


def swapped_channels(input_format: str) -> list[int]:
    """The channel order rbuv_swap_switch makes: R and B swap, or U and V (NV21 as NV12)."""
    return [0, 2, 1] if input_format == "YUV420SP_U8" else [2, 1, 0]


def yuv444(ops: OpBuilder, image: Value, height: int, start: tuple[int, int],
           size: tuple[int, int]) -> Value:
    """The uint8 [N, h, w, 3] Y, U, V pixels of the `size` window at `start` (even) of the
    YUV420SP `image` ([N, height * 3 / 2, W, 1])."""
    (top, left), (h, w) = start, size
    n = image.shape[0]
    luma = ops.slice(image, [top, left], [top + h, left + w], [1, 2], DType.UINT8, (n, h, w, 1))
    half_h, half_w = (h + 1) // 2, (w + 1) // 2  # chroma rows and U, V pairs the window covers
    chroma = ops.slice(image, [height + top // 2, left], [height + top // 2 + half_h,
                                                          left + 2 * half_w],
                       [1, 2], DType.UINT8, (n, half_h, 2 * half_w, 1))
    chroma = ops.reshape(chroma, (n, half_h, 1, half_w, 1, 2))
    for axis in (4, 2):  # each sample twice along w, then each row twice along h
        shape = list(chroma.shape)
        shape[axis] = 2
        chroma = ops.node("Concat", [chroma, chroma], {"axis": axis}, dtype=DType.UINT8,
                          shape=tuple(shape))
    chroma = ops.reshape(chroma, (n, 2 * half_h, 2 * half_w, 2))
    if (2 * half_h, 2 * half_w) != (h, w):  # an odd crop: its last row or column of pairs
        chroma = ops.slice(chroma, [0, 0], [h, w], [1, 2], DType.UINT8, (n, h, w, 2))
    return ops.node("Concat", [luma, chroma], {"axis": 3}, dtype=DType.UINT8, shape=(n, h, w, 3))


def converted_yuv420(ops: OpBuilder, image: Value, height: int, start: tuple[int, int],
                     size: tuple[int, int], op: AippOp, axis: int) -> Value:
    """The float pixels `op`'s colour conversion makes of the `size` window at `start` (even)
    of the YUV420SP `image`, channels along `axis` (1: NCHW, 3: NHWC). The matrix's Y column
    multiplies the luma plane; its U and V columns the chroma plane at quarter resolution, and
    that share is repeated over each 2x2 pixels before the two are added (the same exact sums
    in another order): half the work of converting the upsampled YUV444 pixels."""
    (top, left), (h, w) = start, size
    n = image.shape[0]
    half_h, half_w = (h + 1) // 2, (w + 1) // 2  # an odd window converts one more row or column
    full = (2 * half_h, 2 * half_w)
    matrix, bias = _unswapped(op)

    def channels_along_axis(value: Value, rows: int, cols: int, count: int) -> Value:
        shape = (n, count, rows, cols) if axis == 1 else (n, rows, cols, count)
        if axis == 1 and count > 1:  # the plane's interleaved pairs to planes, still uint8
            value = ops.reshape(value, (n, rows, cols, count))
            return ops.node("Transpose", [value], {"perm": [0, 3, 1, 2]}, dtype=DType.UINT8,
                            shape=shape)
        return ops.reshape(value, shape)

    def column(values: np.ndarray) -> Value:
        shape = [1, 1, 1, 1]
        shape[axis] = 3
        return ops.const("csc_column", values.astype(np.float32).reshape(shape))

    def shifted(value: Value, channel_bias: np.ndarray, count: int) -> Value:
        value = ops.node("Cast", [value], {"to": int(DType.FLOAT)}, shape=value.shape)
        if not channel_bias.any():
            return value
        shape = [1, 1, 1, 1]
        shape[axis] = count
        return ops.node("Sub", [value, ops.const("csc_input_bias", channel_bias.reshape(shape))],
                        shape=value.shape)

    luma = ops.slice(image, [top, left], [top + full[0], left + full[1]], [1, 2], DType.UINT8,
                     (n, *full, 1))
    luma = shifted(channels_along_axis(luma, *full, 1), bias[:1], 1)
    luma_shape = tuple(3 if i == axis else d for i, d in enumerate(luma.shape))
    total = ops.node("Mul", [luma, column(matrix[:, 0])], shape=luma_shape)
    chroma = ops.slice(image, [height + top // 2, left], [height + top // 2 + half_h,
                                                          left + 2 * half_w],
                       [1, 2], DType.UINT8, (n, half_h, 2 * half_w, 1))
    chroma = shifted(channels_along_axis(chroma, half_h, half_w, 2), bias[1:], 2)
    share = _mixed(ops, chroma, matrix[:, 1:], axis)
    if share is not None:
        share = ops.upsample2x(share, (2, 3) if axis == 1 else (1, 2))
        total = ops.node("Add", [total, share], shape=luma_shape)
    if full != (h, w):
        axes = [2, 3] if axis == 1 else [1, 2]
        shape = (n, 3, h, w) if axis == 1 else (n, h, w, 3)
        total = ops.slice(total, [0, 0], [h, w], axes, DType.FLOAT, shape)
    return _saturated(ops, total, op.output_bias, axis)


def colour_conversion(ops: OpBuilder, pixels: Value, op: AippOp, axis: int) -> Value:
    """`op`'s colour conversion of the float `pixels` (integers 0-255, channels along `axis`,
    before rbuv_swap_switch's swap, which the matrix's columns take)."""
    matrix, input_bias = _unswapped(op)
    channel_shape = [1] * len(pixels.shape)
    channel_shape[axis] = 3
    if input_bias.any():
        pixels = ops.node("Sub", [pixels, ops.const("csc_input_bias", input_bias.reshape(
            channel_shape))], shape=pixels.shape)
    return _saturated(ops, _mixed(ops, pixels, matrix, axis), op.output_bias, axis)


def _unswapped(op: AippOp) -> tuple[np.ndarray, np.ndarray]:
    """`op`'s matrix over 256 and its input bias for the channels as they come, before
    rbuv_swap_switch's swap: its columns and biases reordered, so no op makes the swap."""
    order = np.argsort(swapped_channels(op.input_format)) if op.swap_rb else np.arange(3)
    matrix = np.array(op.csc_matrix, np.float64).reshape(3, 3)[:, order] / 256
    return matrix, np.array(op.input_bias, np.float32)[order]


def _mixed(ops: OpBuilder, pixels: Value, columns: np.ndarray, axis: int) -> Value | None:
    """Σ_k pixels[k] · columns[:, k], the 3 output channels along `axis` (None when every
    column is 0): one product per input channel, each sum exact in 1/256 steps (see
    aipp_config.ROW_LIMIT). Not a Conv or MatMul, which quantization would take for a layer."""
    total = None
    for channel in range(columns.shape[1]):
        if not columns[:, channel].any():
            continue
        picked = ops.node("Gather", [pixels, ops.const("csc_channel", np.array([channel],
                                                                               np.int64))],
                          {"axis": axis}, shape=tuple(1 if i == axis else d
                                                      for i, d in enumerate(pixels.shape)))
        shape = tuple(3 if i == axis else d for i, d in enumerate(picked.shape))
        column = [1] * len(shape)
        column[axis] = 3
        term = ops.node("Mul", [picked, ops.const("csc_column", columns[:, channel].astype(
            np.float32).reshape(column))], shape=shape)
        total = term if total is None else ops.node("Add", [total, term], shape=shape)
    return total


def _saturated(ops: OpBuilder, total: Value, output_bias, axis: int) -> Value:
    """The shift's floor of the matrix's sums `total`, plus the output bias, in 0-255."""
    converted = ops.node("Floor", [total], shape=total.shape)
    output_bias = np.array(output_bias, np.float32)
    if output_bias.any():
        shape = [1] * len(total.shape)
        shape[axis] = 3
        converted = ops.node("Add", [converted, ops.const("csc_output_bias", output_bias.reshape(
            shape))], shape=total.shape)
    return ops.clip(converted, 0.0, 255.0)
