"""A model below the opset QuantizeInt8's form needs, converted up to it by ONNX's converter."""

from __future__ import annotations

from graphopt.ir import Model, load_onnx, to_onnx
from graphopt.warning_scope import warnings_as

INT8_OPSET = 13  # per-axis DequantizeLinear, Split's sizes as an input
_LAYER_OPS = frozenset({"Conv", "Gemm", "MatMul"})


def int8_ready(model: Model, quantize: str | None) -> tuple[Model, str | None]:
    """`model`, or for `quantize="int8"` a model that imports an older ai.onnx opset and has
    layers to quantize, the same converted to opset 13 by ONNX's version converter, which
    rewrites the ops redefined there (Squeeze, Unsqueeze, Split, the Reduce ops, Softmax)
    to keep their meaning; with a note. Unconverted (QuantizeInt8 then says why it quantized
    nothing) where the converter refuses the model."""
    opset = model.opset("")
    if quantize != "int8" or opset is None or opset >= INT8_OPSET or not any(
            node.op_type in _LAYER_OPS and node.is_onnx for node in model.graph.all_nodes()):
        return model, None
    import onnx.version_converter

    try:
        with warnings_as("ignore"):
            converted = onnx.version_converter.convert_version(to_onnx(model), INT8_OPSET)
        raised = load_onnx(converted, user_model=True)
    except Exception:  # noqa: BLE001 - the converter's refusals have no common type
        return model, None
    return raised, (f"QuantizeInt8: the model imports ONNX opset {opset}; converted to "
                    f"{INT8_OPSET} by ONNX's version converter, which int8's form needs")
