"""A model below the opset QuantizeInt8's form needs, converted up to it by ONNX's converter."""

from __future__ import annotations

from graphopt import numerics
from graphopt.errors import one_line
from graphopt.ir import Model, load_onnx, to_onnx
from graphopt.warning_scope import warnings_as

INT8_OPSET = 13  # per-axis DequantizeLinear, Split's sizes as an input
# The layers QuantizeInt8 quantizes (after fusion, the fused forms too).
LAYER_OPS = frozenset({"Conv", "FusedConv", "Gemm", "MatMul", "Attention"})


def int8_ready(model: Model, quantize: str | None) -> tuple[Model, str | None]:
    """`model`, or for `quantize="int8"` a model that imports an older ai.onnx opset and has
    layers to quantize, the same converted to opset 13 by ONNX's version converter, which
    rewrites the ops redefined there (Squeeze, Unsqueeze, Split, the Reduce ops, Softmax)
    to keep their meaning; with a note. Unconverted where the converter refuses the model or
    changes its outputs, the note saying so (QuantizeInt8 then quantizes nothing)."""
    opset = model.opset("")
    if quantize != "int8" or opset is None or opset >= INT8_OPSET or not any(
            node.op_type in LAYER_OPS for node in model.graph.all_nodes()):
        return model, None
    import onnx.version_converter

    unconverted = f"QuantizeInt8: ONNX's version converter cannot take the model from opset " \
                  f"{opset} to {INT8_OPSET}"
    try:
        original = to_onnx(model)
        with warnings_as("ignore"):
            converted = onnx.version_converter.convert_version(original, INT8_OPSET)
        if not _same_outputs(original, converted):
            return model, f"{unconverted}: its conversion computes other outputs"
        raised = load_onnx(converted, user_model=True)
    except Exception as exc:  # noqa: BLE001 - the converter's refusals have no common type
        return model, f"{unconverted} ({one_line(str(exc))[:200] or type(exc).__name__})"
    return raised, (f"QuantizeInt8: the model imports ONNX opset {opset}; converted to "
                    f"{INT8_OPSET} by ONNX's version converter, which int8's form needs")


def _same_outputs(original, converted) -> bool:
    """Whether the converted model computes what the original does, on seeded inputs: the
    converter rewrites the ops it has adapters for, and passes others through unchanged even
    where their meaning changed (Hardmax over one axis at 13, from it on before)."""
    feeds = numerics.random_feeds(original, seed=0)
    return not numerics.compare(numerics.run(original, feeds), numerics.run(converted, feeds),
                                1e-5, 1e-6)
