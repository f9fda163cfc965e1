"""AIPP's YUV420SP input and colour conversion (CSC) as ONNX ops: each chroma sample repeated
over its 2x2 pixels, and ATC's ((M · (in - input_bias)) >> 8) + output_bias, computed exactly
in float32 and saturated to the 0-255 of the 8-bit image it makes."""

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


def colour_conversion(ops: OpBuilder, pixels: Value, op: AippOp, axis: int) -> Value:
    """`op`'s colour conversion of the float `pixels` (integers 0-255, channels along `axis`,
    before rbuv_swap_switch's swap, which the matrix's columns take)."""
    order = np.argsort(swapped_channels(op.input_format)) if op.swap_rb else np.arange(3)
    matrix = np.array(op.csc_matrix, np.float64).reshape(3, 3)[:, order]
    input_bias = np.array(op.input_bias, np.float32)[order]
    channel_shape = [1] * len(pixels.shape)
    channel_shape[axis] = 3
    if input_bias.any():
        pixels = ops.node("Sub", [pixels, ops.const("csc_input_bias", input_bias.reshape(
            channel_shape))], shape=pixels.shape)
    # One product per input channel, each output channel's sum in 1/256 steps (exact: see
    # aipp_config.ROW_LIMIT), then the shift's floor: Conv or MatMul would be a layer to quantization.
    total = None
    for channel in range(3):
        column = matrix[:, channel]
        if not column.any():
            continue
        picked = ops.node("Gather", [pixels, ops.const("csc_channel", np.array([channel],
                                                                               np.int64))],
                          {"axis": axis}, shape=tuple(1 if i == axis else d
                                                      for i, d in enumerate(pixels.shape)))
        term = ops.node("Mul", [picked, ops.const("csc_column", (column / 256).astype(
            np.float32).reshape(channel_shape))], shape=pixels.shape)
        total = term if total is None else ops.node("Add", [total, term], shape=pixels.shape)
    converted = ops.node("Floor", [total], shape=pixels.shape)
    output_bias = np.array(op.output_bias, np.float32)
    if output_bias.any():
        converted = ops.node("Add", [converted, ops.const("csc_output_bias", output_bias.reshape(
            channel_shape))], shape=pixels.shape)
    return ops.clip(converted, 0.0, 255.0)
