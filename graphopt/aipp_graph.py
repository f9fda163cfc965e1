"""AIPP in the graph: a model input becomes the packed uint8 image ATC's static AIPP takes, and
the crop, channel swap, colour conversion, layout change and normalization it describes become
ops before the model's first node, which later passes fold into the first convolution where
they can."""

from __future__ import annotations

import contextlib
import json

import numpy as np

from graphopt.aipp_colour import colour_conversion, converted_yuv420, swapped_channels, yuv444
from graphopt.aipp_config import (FORMAT_CHANNELS, FOUR_BYTE_FORMATS, MATRIX_RANGE, AippOp,
                                  check_normalized, matrix_problem)
from graphopt.aipp_ops import OpBuilder
from graphopt.errors import OptionError
from graphopt.ir import DType, Model, Value
from graphopt.option_names import option
from graphopt.source_marks import PREPROCESS_KEY, inserted_preprocessing

_FLOATS = (DType.FLOAT, DType.FLOAT16)


def recorded_ops(recorded: dict, model: Model) -> list[AippOp]:
    """The AippOps a compile recorded (`inserted_preprocessing`), for the inputs of `model`
    they name: what makes the source comparable with a model compiled with them. A record
    that does not fit, or that no configuration could give, is an OptionError."""
    feedable = [value.name for value in model.graph.inputs if not value.is_weight]
    ops = []
    for name, entry in recorded.items():
        try:
            fmt = entry["input_format"]
            channels = FORMAT_CHANNELS[fmt]
            op = AippOp(
                line=0, input_rank=feedable.index(name), input_format=fmt,
                src_size=_pair(entry["src_size"]), crop=_flag(entry["crop"]),
                crop_start=_pair(entry["crop_start"]), crop_size=_pair(entry["crop_size"]),
                swap_rb=_flag(entry["swap_rb"]),
                mean=_floats(entry["mean"], channels), minimum=_floats(entry["min"], channels),
                var_reci=_floats(entry["var_reci"], channels),
                csc_matrix=_matrix(entry.get("csc_matrix")),
                input_bias=_integers(entry.get("input_bias", [0, 0, 0]), 3, (0, 255)),
                output_bias=_integers(entry.get("output_bias", [0, 0, 0]), 3, (0, 255)),
                x_last=_flag(entry.get("x_last", False)))
            # As the configuration reader refuses them: a colour conversion of one channel
            # failed in onnxruntime, blamed on the reference; inf constants compared as FAIL.
            if (op.csc_matrix is not None and channels == 1) or \
                    (op.x_last and fmt not in FOUR_BYTE_FORMATS):
                raise ValueError(entry)
            check_normalized(op, name)
        except (KeyError, TypeError, ValueError, OptionError):
            raise OptionError(f"its recorded preprocessing of input {name!r} does not fit the "
                              "reference (another model, or a damaged record)") from None
        ops.append(op)
    return ops


def _pair(values) -> tuple[int, int]:
    h, w = (int(v) for v in values)
    return h, w


def _flag(value) -> bool:
    """A recorded switch: JSON's true or false (bool() takes "no" for true)."""
    if not isinstance(value, bool):
        raise ValueError(value)
    return value


def _matrix(values) -> tuple[int, ...] | None:
    """A recorded colour matrix, only as a configuration could give it (matrix_problem): an
    all-zero one made a Floor of no input, one past int16 or ROW_LIMIT a conversion ATC cannot
    make."""
    matrix = _integers(values, 9, MATRIX_RANGE)
    if matrix is not None and matrix_problem(matrix):
        raise ValueError(values)
    return matrix


def _integers(values, count: int, bounds: tuple[int, int]) -> tuple[int, ...] | None:
    """JSON integers (int() also took "12" and 1.5) of `count`, within `bounds`."""
    if values is None:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(values)
    integers = tuple(values)
    low, high = bounds
    if len(integers) != count or not all(low <= v <= high for v in integers):
        raise ValueError(values)
    return integers


def _floats(values, count: int) -> tuple[float, ...]:
    """JSON numbers (float() also took "nan") of `count`, finite in float32."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ValueError(values)
    floats = tuple(float(v) for v in values)
    with np.errstate(over="ignore"):
        if len(floats) != count or not np.isfinite(np.float32(floats)).all():
            raise ValueError(values)
    return floats


def insert_aipp(model: Model, ops: list[AippOp], path: str | None,
                pins: dict[str, list[int]] | None = None) -> str:
    """Give each input an `aipp_op` names its preprocessing; returns the compile's note.
    `path` is the configuration file the ops come from, None for ops a compile recorded;
    `pins` (--input-shape's, applied later) show in the note as the input will be fed."""
    graph = model.graph
    feedable = [value for value in graph.inputs if not value.is_weight]
    recorded = inserted_preprocessing(model.metadata_props)
    shown = []
    for op in ops:
        where = _Where(op, path)
        opset = model.opset("")
        if opset is None or opset < 7:  # Sub and Mul broadcast as numpy does from opset 7
            raise OptionError(f"{where}: the model imports opset {opset} of the default domain; "
                              "the preprocessing's ops need opset 7 or later")
        if op.input_rank >= len(feedable):
            raise OptionError(f"{where.at('related_input_rank')}: related_input_rank "
                              f"{op.input_rank}, but the model "
                              f"has {len(feedable)} input(s)")
        value = feedable[op.input_rank]
        layout, size = _model_side(value, op, where, (pins or {}).get(value.name))
        if value.is_graph_output:
            raise OptionError(f"{where}: input {value.name!r} is also an output of the model, "
                              "which would then return the preprocessed image under its name")
        image, src = _image_input(graph, value, op, size, where)
        _rewire(OpBuilder(graph, opset), value, image, op, layout, src, size)
        recorded[image.name] = {**op.to_json(), "layout": layout,
                                "src_size": list(src), "crop_size": list(size)}
        fed = [d if p == -1 else p for d, p in zip(image.shape, (pins or {}).get(
            image.name, [-1] * len(image.shape)))]
        shown.append(f"{image.name!r} takes uint8 {_dims(fed)} ({op.input_format})"
                     + _layout_guess(value.shape, op.channels))
    model.metadata_props[PREPROCESS_KEY] = json.dumps(recorded, sort_keys=True)
    return f"{option('insert_op_conf')}: " + "; ".join(shown)


def _layout_guess(shape, channels: int) -> str:
    """What the note says when the model's input reads as NCHW and NHWC alike ([N, 3, W, 3]):
    NCHW was taken, as ATC's default input format."""
    if shape[1] == shape[3] == channels:
        return f", its input read as NCHW (dims 1 and 3 are both {channels})"
    return ""


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


class _Where:
    """Where an aipp_op's refusal points: the configuration file's line of the block (str), or
    of the key at fault (at); a compile's recorded preprocessing has no file to point into."""

    def __init__(self, op: AippOp, path: str | None) -> None:
        self._op, self._path = op, path

    def at(self, key: str) -> str:
        if self._path is None:
            return "its recorded preprocessing does not fit the reference"
        return f"{option('insert_op_conf')} {self._path}:{self._op.line_of(key)}"

    def __str__(self) -> str:
        return self.at("")


def _model_side(value: Value, op: AippOp, where: _Where,
                pin: list[int] | None) -> tuple[str, tuple[int, int]]:
    """The layout (NCHW or NHWC) of the input the preprocessing feeds, and the (h, w) it must
    deliver: the model's, else the crop's or source image's size, else (no crop) the size
    --input-shape pins the image to (`pin`), as ATC takes a size the file leaves out from
    --input_shape."""
    shape = value.shape
    if value.dtype not in _FLOATS or shape is None or len(shape) != 4:
        raise OptionError(f"{where}: input {value.name!r} is {_described(value)}; AIPP feeds a "
                          "float32 or float16 image of rank 4 (NCHW, or NHWC)")
    c = op.channels
    if shape[1] == c:
        layout, (h, w) = "NCHW", shape[2:]
    elif shape[3] == c:
        layout, (h, w) = "NHWC", shape[1:3]
    else:
        raise OptionError(f"{where.at('input_format')}: input {value.name!r} is "
                          f"{_described(value)}: neither its "
                          f"dim 1 (NCHW) nor its dim 3 (NHWC) is the {c} channel(s) of "
                          f"{op.input_format}")
    wanted = op.crop_size if op.crop else op.src_size
    pinned = (None, None) if op.crop else _pinned_size(op, pin)
    size = []
    for axis, model_dim, given, fed in (("h", h, wanted[0], pinned[0]),
                                        ("w", w, wanted[1], pinned[1])):
        if isinstance(model_dim, int):
            if given and given != model_dim:
                key = "crop_size" if op.crop else "src_image_size"
                raise OptionError(f"{where.at(f'{key}_{axis}')}: {key}_{axis} {given}, but "
                                  f"input {value.name!r} "
                                  f"is {model_dim} along {axis} (graphopt does not resize"
                                  + ("" if op.crop else "; crop: true takes a part of the image")
                                  + ")")
            size.append(model_dim)
        elif given or fed:
            size.append(given or fed)
        else:
            key = "crop_size" if op.crop else "src_image_size"
            flag = option("input_shapes")
            # ATC's --input_shape (graphopt atc translates it) gives the model's own shape,
            # graphopt's the image's.
            dims = _model_dims(value.shape, layout) if flag == "--input_shape" else \
                _image_dims(op, "N", "H", "W")
            pinning = "" if op.crop else f", or the image's size in {flag} ({value.name}:{dims})"
            raise OptionError(f"{where}: input {value.name!r} has a dynamic {axis} "
                              f"({model_dim!r}); give {key}_{axis}{pinning}")
    return layout, (size[0], size[1])


def _pinned_size(op: AippOp, pin: list[int] | None) -> tuple[int | None, int | None]:
    """The (h, w) of the image a pin (-1 where open) gives, None where it gives none: the image
    is [N, H, W, C], or [N, H * 3 / 2, W, 1] for YUV420SP."""
    if not pin or len(pin) != 4:
        return None, None
    rows, width = (size if size > 0 else None for size in pin[1:3])
    if rows is not None and op.input_format == "YUV420SP_U8":
        rows = rows * 2 // 3 if rows % 3 == 0 else None
    return rows, width


def _model_dims(shape, layout: str) -> str:
    """The model input's dims as ATC's --input_shape writes them, H and W for its height and
    width, N for an open batch."""
    height = 2 if layout == "NCHW" else 1
    named = {height: "H", height + 1: "W"}
    return ",".join(named.get(i) or (str(d) if isinstance(d, int) else "N")
                    for i, d in enumerate(shape))


def _image_dims(op: AippOp, batch, height, width) -> str:
    """The image's dims as --input-shape writes them, for a batch, height and width (numbers
    or letters): what the preprocessed input is fed."""
    channels = 4 if op.input_format in FOUR_BYTE_FORMATS else op.channels
    rows = f"{height}*3/2" if op.input_format == "YUV420SP_U8" else height
    return f"{batch},{rows},{width},{1 if op.input_format == 'YUV420SP_U8' else channels}"


def image_shape(op: AippOp, batch: int, height: int, width: int) -> list[int]:
    """The uint8 image's shape for a batch and an image of height × width pixels."""
    if op.input_format == "YUV420SP_U8":
        return [batch, height * 3 // 2, width, 1]
    return [batch, height, width, 4 if op.input_format in FOUR_BYTE_FORMATS else op.channels]


_DTYPE_NAMES = {DType.FLOAT: "float32", DType.DOUBLE: "float64", DType.FLOAT16: "float16"}


def _described(value: Value) -> str:
    dtype = (_DTYPE_NAMES.get(value.dtype, value.dtype.name.lower()) if value.dtype is not None
             else "untyped")
    return f"{dtype} {_dims(value.shape)}" if value.shape is not None else dtype


def _image_input(graph, value: Value, op: AippOp, size: tuple[int, int],
                 where: _Where) -> tuple[Value, tuple[int, int]]:
    """The uint8 input that replaces `value` (which keeps its readers under a new name, to be
    computed from the image), and the image's (h, w) in pixels. RGB888 and YUV400 images are
    [N, H, W, C], XRGB8888 and ARGB8888 [N, H, W, 4]; YUV420SP is [N, H * 3 / 2, W, 1]: the Y
    plane's H rows of W bytes, then H / 2 rows of interleaved U and V samples, each for 2x2
    pixels (NV12; NV21 swaps U and V)."""
    src = tuple(s or inner for s, inner in zip(op.src_size, size))  # ATC's default: the model's
    if op.input_format == "YUV420SP_U8":
        _check_even(op, src, where)
    if op.crop:
        for axis, start, inner, outer in zip("hw", op.crop_start, size, src):
            if start + inner > outer:
                raise OptionError(f"{where.at(f'load_start_pos_{axis}')}: the crop from "
                                  "load_start_pos_"
                                  f"{axis} {start} takes {inner} along {axis}, past the "
                                  f"source image's {outer} (src_image_size_{axis}, by "
                                  "default the model's)")
    batch = value.shape[0]
    name = value.name
    index = graph.inputs.index(value)
    value.name = graph.fresh_name(f"{name}_preprocessed")
    value.is_input = False
    _, rows, width, channels = image_shape(op, 0, *src)
    image = Value(name, DType.UINT8, (batch, rows, width, channels))
    image.graph, image.is_input = graph, True
    image.doc_string = value.doc_string
    graph.inputs[index] = image
    return image, (src[0], src[1])


def _check_even(op: AippOp, src: tuple[int, ...], where: _Where) -> None:
    """YUV420SP's chroma covers 2x2 pixels: the image and the crop's start are even."""
    for axis, size, given in zip("hw", src, op.src_size):
        if size % 2:
            key = f"src_image_size_{axis}" if given else \
                f"the model's {axis} (src_image_size_{axis} by default)"
            raise OptionError(f"{where.at(f'src_image_size_{axis}')}: {key} {size} is odd: a "
                              "YUV420SP_U8 image is even in "
                              "both dims")
    for axis, start in zip("hw", op.crop_start):
        if op.crop and start % 2:
            raise OptionError(f"{where.at(f'load_start_pos_{axis}')}: load_start_pos_{axis} "
                              f"{start} is odd: a crop of a "
                              "YUV420SP_U8 image starts at an even pixel, as in ATC")


def _rewire(ops: OpBuilder, value: Value, image: Value, op: AippOp, layout: str,
            src: tuple[int, int], size: tuple[int, int]) -> None:
    """The ops from `image` to what `value` held, before the graph's first node, in ATC's
    order: crop, channel swap, colour conversion, normalization; the layout change and casts
    where cheapest."""
    node, const = ops.node, ops.const
    c = op.channels
    n = image.shape[0]
    (top, left), (h, w) = (op.crop_start, size) if op.crop else ((0, 0), src)
    csc = op.csc_matrix is not None
    if op.input_format == "YUV420SP_U8" and csc:
        with ops.exact():
            current = converted_yuv420(ops, image, src[0], (top, left), (h, w), op,
                                       1 if layout == "NCHW" else 3)
        _normalized(ops, value, current, op, layout, swap_last=False)
        return
    if op.input_format == "YUV420SP_U8":
        current = yuv444(ops, image, src[0], (top, left), (h, w))
    elif op.crop or op.input_format in FOUR_BYTE_FORMATS:
        # The crop, and the R, G, B bytes of a 4-byte pixel: one Slice, on uint8.
        first = int(op.input_format in FOUR_BYTE_FORMATS and not op.x_last)
        current = ops.slice(image, [top, left, first], [top + h, left + w, first + c],
                            [1, 2, 3], DType.UINT8, (n, h, w, c))
    else:
        current = image
    swap = np.array(swapped_channels(op.input_format), np.int64)
    # ATC swaps before it normalizes, each channel by its constants after the swap. On an NCHW
    # input the swap goes last, on whole planes, with the constants swapped back: where a Conv
    # reads it, FoldInputAffine then permutes the Conv's weights and no op is left of it. A
    # colour conversion takes the swap into its matrix instead.
    swap_last = op.swap_rb and layout == "NCHW" and not csc
    if op.swap_rb and not swap_last and not csc:  # NHWC: one byte per value to move
        current = node("Gather", [current, const("swap_rb", swap)], {"axis": 3},
                       dtype=DType.UINT8, shape=(n, h, w, c))
    if layout == "NCHW":
        current = node("Transpose", [current], {"perm": [0, 3, 1, 2]}, dtype=DType.UINT8,
                       shape=(n, c, h, w))
    with ops.exact() if csc else contextlib.nullcontext():
        current = node("Cast", [current], {"to": int(DType.FLOAT)}, shape=current.shape)
        if csc:
            current = colour_conversion(ops, current, op, 1 if layout == "NCHW" else 3)
    _normalized(ops, value, current, op, layout, swap_last)


def _normalized(ops: OpBuilder, value: Value, current: Value, op: AippOp, layout: str,
                swap_last: bool) -> None:
    """Normalize the float pixels `current` into what `value` held: each channel's
    (x - mean - min) * var_reci, and the swap last where `swap_last` says so."""
    node, const = ops.node, ops.const
    c, shape = op.channels, current.shape
    swap = np.array(swapped_channels(op.input_format), np.int64)
    order = swap if swap_last else np.arange(c)
    channel_shape = (1, c, 1, 1) if layout == "NCHW" else (c,)
    offset = np.add(op.mean, op.minimum)[np.argsort(order)]
    if offset.any():
        current = node("Sub", [current, const("mean", offset.astype(np.float32)
                                              .reshape(channel_shape))], shape=shape)
    scale = np.asarray(op.var_reci)[np.argsort(order)]
    if (scale != 1.0).any():
        current = node("Mul", [current, const("var_reci", scale.astype(np.float32)
                                              .reshape(channel_shape))], shape=shape)
    if swap_last:
        current = node("Gather", [current, const("swap_rb", swap)], {"axis": 1}, shape=shape)
    if value.dtype == DType.FLOAT16:
        current = node("Cast", [current], {"to": int(DType.FLOAT16)}, dtype=DType.FLOAT16,
                       shape=shape)
    value.replace_all_uses_with(current)
