"""A model below the opset QuantizeInt8's form needs, converted up to it by ONNX's converter."""

from __future__ import annotations

from graphopt import numerics
from graphopt.errors import one_line
from graphopt.ir import Model, load_onnx, to_onnx
from graphopt.option_names import option
from graphopt.passes.options import Options
from graphopt.warning_scope import warnings_as

INT8_OPSET = 13  # per-axis DequantizeLinear, Split's sizes as an input
# Resize's coordinate_transformation_mode, from opset 11; before it, Upsample and Resize-10
# sample at x / scale (asymmetric).
RESIZE_COORDINATES = 11
# The layers QuantizeInt8 quantizes (after fusion, the fused forms too).
LAYER_OPS = frozenset({"Conv", "FusedConv", "Gemm", "MatMul", "Attention"})


def int8_ready(model: Model, options: Options) -> tuple[Model, str | None]:
    """`model`, or for `options.quantize="int8"` a model that imports an older ai.onnx opset
    and has layers to quantize, the same converted to opset 13 by ONNX's version converter,
    which rewrites the ops redefined there (Squeeze, Unsqueeze, Split, the Reduce ops,
    Softmax) to keep their meaning; with a note. Unconverted where the converter refuses the
    model or changes its outputs on the first calibration sample (else seeded inputs at the
    pinned shapes), the note saying so (QuantizeInt8 then quantizes nothing)."""
    opset = model.opset("")
    if options.quantize != "int8" or opset is None or opset >= INT8_OPSET or not any(
            node.op_type in LAYER_OPS for node in model.graph.all_nodes()):
        return model, None
    import onnx.version_converter

    unconverted = f"QuantizeInt8: ONNX's version converter cannot take the model from opset " \
                  f"{opset} to {INT8_OPSET}"
    nested = _nested_hardmax(model)
    if nested:
        return model, (f"{unconverted}: it would change what {nested} computes (the converter "
                       "leaves a Hardmax as it is, which from opset 13 takes the one axis it "
                       "names where it took every axis from it on), inside a branch the "
                       "numerical check may not run")
    try:
        original = to_onnx(model)
        with warnings_as("ignore"):
            converted = onnx.version_converter.convert_version(original, INT8_OPSET)
        if opset < RESIZE_COORDINATES:
            _keep_asymmetric_resizes(converted)
        feeds, which = _check_feeds(model, original, options)
        try:
            expected = numerics.run(original, feeds)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own message says why
            return model, (f"{unconverted}: the conversion could not be checked, since "
                           f"onnxruntime cannot run the model on {which} "
                           f"({one_line(numerics.ort_reason(exc))[:200]}); "
                           f"{option('input_shapes')} or {option('calibration')} give it "
                           "inputs it runs on")
        if numerics.compare(expected, numerics.run(converted, feeds), 1e-5, 1e-6):
            return model, f"{unconverted}: its conversion computes other outputs"
        raised = load_onnx(converted, user_model=True)
    except Exception as exc:  # noqa: BLE001 - the converter's refusals have no common type
        return model, f"{unconverted} ({one_line(str(exc))[:200] or type(exc).__name__})"
    return raised, (f"QuantizeInt8: the model imports ONNX opset {opset}; converted to "
                    f"{INT8_OPSET} by ONNX's version converter, which int8's form needs")


def _nested_hardmax(model: Model) -> str | None:
    """A Hardmax inside an If or Loop body whose axis is not its input's last (or of an input
    of unknown rank), named: the converter passes it through with another meaning, and the
    check on one sample need not run that branch (an int8 compile had 15 of 64 elements wrong
    in the branch the first calibration sample did not take). A Softmax or LogSoftmax the
    converter rewrites, and one in the main graph the check runs."""
    nested = [node for node in model.graph.all_nodes()
              if node.graph is not model.graph and node.op_type == "Hardmax" and node.is_onnx
              and int(node.attr("axis", 1)) != -1]
    if not nested:
        return None
    ranks = _ranks(to_onnx(model))
    for node in nested:
        axis, rank = int(node.attr("axis", 1)), ranks.get(node.inputs[0].name)
        if rank is None or not -rank <= axis < rank or axis % rank != rank - 1:
            return f"the Hardmax {node.name!r}" if node.name else "a Hardmax"
    return None


def _ranks(proto) -> dict[str, int]:
    """The rank of every value ONNX's shape inference finds a shape for, in every graph (a name
    two subgraphs share takes the inner one's, which is rarely another rank)."""
    import onnx

    try:
        with warnings_as("ignore"):
            proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - nothing inferred: every rank unknown
        return {}
    from graphopt.ir.onnx_io import graph_protos

    return {info.name: len(info.type.tensor_type.shape.dim)
            for graph in graph_protos(proto.graph)
            for info in (*graph.input, *graph.output, *graph.value_info)
            if info.type.tensor_type.HasField("shape")}


def _check_feeds(model: Model, original, options: Options) -> tuple[dict, str]:
    """The inputs the conversion is checked on, and how to name them: the first calibration
    sample, else seeded inputs at the pinned shapes. The converter rewrites the ops it has
    adapters for and passes others through unchanged even where their meaning changed
    (Hardmax over one axis at 13, from it on before). Seeded inputs with every open dim at 1
    made a [1, 3, 1, 1] image, which a detector's downsampling Resize refuses: PP-OCR's
    detector stayed at opset 11 and quantized nothing."""
    if options.calibration:
        from graphopt.quant.calib_data import read_calibration

        try:  # bad data is reported by name where it is read for the ranges
            return next(iter(read_calibration(options.calibration, model.graph))), \
                "the first calibration sample"
        except Exception:  # noqa: BLE001
            pass
    shapes = options.input_shapes or None
    return numerics.random_feeds(original, seed=0, shapes=shapes), \
        "seeded inputs" + (" at the pinned shapes" if shapes else " with every open dim at 1")


def _keep_asymmetric_resizes(converted) -> None:
    """Upsample (7, 9) and Resize-10 sample linearly at x_out / scale (`asymmetric`); the
    converter's Resize-13 leaves coordinate_transformation_mode at its default, half_pixel,
    which moves every output of a linear resize (a bilinear Upsample by 2: 2.4 off on unit
    inputs), so a model with one stayed in float. Spell the old mode out (below opset 11
    every Resize of the converted model came from one of those)."""
    import onnx

    def graphs(graph):
        yield graph
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from graphs(attr.g)
                for g in attr.graphs:
                    yield from graphs(g)

    for graph in graphs(converted.graph):
        for node in graph.node:
            if node.op_type != "Resize" or node.domain not in ("", "ai.onnx"):
                continue
            names = {a.name for a in node.attribute}
            mode = next((a.s for a in node.attribute if a.name == "mode"), b"nearest")
            if mode == b"linear" and "coordinate_transformation_mode" not in names:
                node.attribute.append(onnx.helper.make_attribute(
                    "coordinate_transformation_mode", "asymmetric"))
