"""AIPP in the graph: a model input becomes the packed uint8 image ATC's static AIPP takes, and
the crop, channel swap, layout change and normalization it describes become ops before the
model's first node, which later passes fold into the first convolution where they can."""

from __future__ import annotations

import json

import numpy as np

from graphopt.aipp_config import FORMAT_CHANNELS, AippOp
from graphopt.errors import OptionError
from graphopt.ir import DType, Model, Value
from graphopt.option_names import option
from graphopt.source_marks import PREPROCESS_KEY, inserted_preprocessing

_FLOATS = (DType.FLOAT, DType.FLOAT16)


def recorded_ops(recorded: dict, model: Model) -> list[AippOp]:
    """The AippOps a compile recorded (`inserted_preprocessing`), for the inputs of `model`
    they name: what makes the source comparable with a model compiled with them. A record
    that does not fit is an OptionError."""
    feedable = [value.name for value in model.graph.inputs if not value.is_weight]
    ops = []
    for name, entry in recorded.items():
        try:
            fmt = entry["input_format"]
            channels = FORMAT_CHANNELS[fmt]
            ops.append(AippOp(
                line=0, input_rank=feedable.index(name), input_format=fmt,
                src_size=_pair(entry["src_size"]), crop=bool(entry["crop"]),
                crop_start=_pair(entry["crop_start"]), crop_size=_pair(entry["crop_size"]),
                swap_rb=bool(entry["swap_rb"]),
                mean=_floats(entry["mean"], channels), minimum=_floats(entry["min"], channels),
                var_reci=_floats(entry["var_reci"], channels)))
        except (KeyError, TypeError, ValueError):
            raise OptionError(f"its recorded preprocessing of input {name!r} does not fit the "
                              "reference (another model, or a damaged record)") from None
    return ops


def _pair(values) -> tuple[int, int]:
    h, w = (int(v) for v in values)
    return h, w


def _floats(values, count: int) -> tuple[float, ...]:
    floats = tuple(float(v) for v in values)
    if len(floats) != count:
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
        where = (f"{option('insert_op_conf')} {path}:{op.line}" if path is not None
                 else "its recorded preprocessing does not fit the reference")
        if op.input_rank >= len(feedable):
            raise OptionError(f"{where}: related_input_rank {op.input_rank}, but the model "
                              f"has {len(feedable)} input(s)")
        value = feedable[op.input_rank]
        layout, size = _model_side(value, op, where)
        if value.is_graph_output:
            raise OptionError(f"{where}: input {value.name!r} is also an output of the model, "
                              "which would then return the preprocessed image under its name")
        image = _image_input(graph, value, op, size, where)
        _rewire(graph, value, image, op, layout, size)
        recorded[image.name] = {**op.to_json(), "layout": layout,
                                "src_size": list(image.shape[1:3]), "crop_size": list(size)}
        fed = [d if p == -1 else p for d, p in zip(image.shape, (pins or {}).get(
            image.name, [-1] * len(image.shape)))]
        shown.append(f"{image.name!r} takes uint8 {_dims(fed)} ({op.input_format})")
    model.metadata_props[PREPROCESS_KEY] = json.dumps(recorded, sort_keys=True)
    return f"{option('insert_op_conf')}: " + "; ".join(shown)


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _model_side(value: Value, op: AippOp, where: str) -> tuple[str, tuple[int, int]]:
    """The layout (NCHW or NHWC) of the input the preprocessing feeds, and the (h, w) it must
    deliver: the model's, else the crop's or source image's size."""
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
        raise OptionError(f"{where}: input {value.name!r} is {_described(value)}: neither its "
                          f"dim 1 (NCHW) nor its dim 3 (NHWC) is the {c} channel(s) of "
                          f"{op.input_format}")
    wanted = op.crop_size if op.crop else op.src_size
    size = []
    for axis, model_dim, given in (("h", h, wanted[0]), ("w", w, wanted[1])):
        if isinstance(model_dim, int):
            if given and given != model_dim:
                key = "crop_size" if op.crop else "src_image_size"
                raise OptionError(f"{where}: {key}_{axis} {given}, but input {value.name!r} "
                                  f"is {model_dim} along {axis} (graphopt does not resize"
                                  + ("" if op.crop else "; crop: true takes a part of the image")
                                  + ")")
            size.append(model_dim)
        elif given:
            size.append(given)
        else:
            key = "crop_size" if op.crop else "src_image_size"
            raise OptionError(f"{where}: input {value.name!r} has a dynamic {axis} "
                              f"({model_dim!r}); give {key}_{axis}")
    return layout, (size[0], size[1])


_DTYPE_NAMES = {DType.FLOAT: "float32", DType.DOUBLE: "float64", DType.FLOAT16: "float16"}


def _described(value: Value) -> str:
    dtype = (_DTYPE_NAMES.get(value.dtype, value.dtype.name.lower()) if value.dtype is not None
             else "untyped")
    return f"{dtype} {_dims(value.shape)}" if value.shape is not None else dtype


def _image_input(graph, value: Value, op: AippOp, size: tuple[int, int], where: str) -> Value:
    """The uint8 [N, H, W, C] input that replaces `value` (which keeps its readers under a new
    name, to be computed from the image)."""
    src = tuple(s or inner for s, inner in zip(op.src_size, size))  # ATC's default: the model's
    if op.crop:
        for axis, start, inner, outer in zip("hw", op.crop_start, size, src):
            if start + inner > outer:
                raise OptionError(f"{where}: the crop from load_start_pos_"
                                  f"{axis} {start} takes {inner} along {axis}, past the "
                                  f"source image's {outer} (src_image_size_{axis}, by "
                                  "default the model's)")
    batch = value.shape[0]
    name = value.name
    index = graph.inputs.index(value)
    value.name = graph.fresh_name(f"{name}_preprocessed")
    value.is_input = False
    image = Value(name, DType.UINT8, (batch, src[0], src[1], op.channels))
    image.graph, image.is_input = graph, True
    image.doc_string = value.doc_string
    graph.inputs[index] = image
    return image


def _rewire(graph, value: Value, image: Value, op: AippOp, layout: str,
            size: tuple[int, int]) -> None:
    """The ops from `image` to what `value` held, before the graph's first node, in ATC's
    order: crop, channel swap, normalization; the layout change and casts where cheapest."""
    first = graph.nodes()[0] if len(graph) else None
    c = op.channels

    def node(op_type: str, inputs: list, attrs: dict | None = None, dtype=DType.FLOAT,
             shape=None) -> Value:
        made = graph.make_node(op_type, inputs, attrs or {}, dtype=dtype, shape=shape,
                               before=first, name=graph.fresh_node_name(f"aipp_{op_type}"))
        return made.output

    def const(hint: str, array) -> Value:
        return graph.make_initializer(f"aipp_{hint}", np.asarray(array))

    n, (h, w) = image.shape[0], image.shape[1:3]
    current = image
    if op.crop:
        (top, left), (h, w) = op.crop_start, size
        current = node("Slice", [current, const("crop_start", np.array([top, left], np.int64)),
                                 const("crop_end", np.array([top + h, left + w], np.int64)),
                                 const("crop_axes", np.array([1, 2], np.int64))],
                       dtype=DType.UINT8, shape=(n, h, w, c))
    swap = np.array([2, 1, 0], np.int64)
    # ATC swaps before it normalizes, each channel by its constants after the swap. On an NCHW
    # input the swap goes last, on whole planes, with the constants swapped back: where a Conv
    # reads it, FoldInputAffine then permutes the Conv's weights and no op is left of it.
    swap_last = op.swap_rb and layout == "NCHW"
    order = swap if swap_last else np.arange(c)
    if op.swap_rb and not swap_last:  # NHWC: one byte per value to move, before the Cast
        current = node("Gather", [current, const("swap_rb", swap)], {"axis": 3},
                       dtype=DType.UINT8, shape=(n, h, w, c))
    if layout == "NCHW":
        current = node("Transpose", [current], {"perm": [0, 3, 1, 2]}, dtype=DType.UINT8,
                       shape=(n, c, h, w))
    shape = current.shape
    current = node("Cast", [current], {"to": int(DType.FLOAT)}, shape=shape)
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

