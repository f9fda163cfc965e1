"""What a portable .onnx needs from the onnxruntime session that runs it, which an .om's
sessions set for themselves: said in a note when the file is written."""

from __future__ import annotations

from graphopt.codegen.partition_sessions import QDQ_MATMULNBITS_ACCURACY
from graphopt.codegen.split import disabled_optimizers
from graphopt.ir import DType, Model

_FOUR_BIT = (DType.INT4, DType.UINT4)


def session_note(model: Model, path: str) -> str | None:
    """A note naming the optimizers a session at onnxruntime's default level (ORT_ENABLE_ALL)
    must skip, and the config entries it must set, for `model` (about to be written to `path`)
    to compute what it computes at ORT_DISABLE_ALL; None when it needs neither. (The ones an
    .om skips for speed alone, SkipLayerNormFusion, are not named: 1.5% of an -O3 BERT-base's
    time at 1 thread.)"""
    skipped = disabled_optimizers(model, "all", for_speed=False) or []
    config = {QDQ_MATMULNBITS_ACCURACY: "0"} if _four_bit_matmul(model) else {}
    if not skipped and not config:
        return None
    needs = []
    if skipped:
        needs.append(f"disabled_optimizers={skipped!r} (an InferenceSession argument)")
    if config:
        needs.append(", ".join(f'add_session_config_entry("{key}", "{value}")'
                               for key, value in config.items())
                     + " (onnxruntime fuses the model's own 4-bit DequantizeLinear → MatMul "
                     "into MatMulNBits that rounds the activations to int8 otherwise)")
    return (f"{path}: run it with {' and '.join(needs)}, as an .om's sessions are: otherwise "
            "onnxruntime's optimizer, at its default level, changes this model's results or "
            "fails to load it")


def _four_bit_matmul(model: Model) -> bool:
    """Whether a MatMul reads a 4-bit constant through a DequantizeLinear (opset 21's int4
    weights), which onnxruntime fuses by default at accuracy level 4."""
    for node in model.graph.all_nodes():
        if node.op_type != "MatMul" or not node.is_onnx or len(node.inputs) < 2:
            continue
        weight = node.inputs[1]
        dequantize = weight.producer if weight is not None else None
        if dequantize is not None and dequantize.op_type == "DequantizeLinear" \
                and dequantize.is_onnx and dequantize.inputs[0] is not None \
                and dequantize.inputs[0].is_constant and dequantize.inputs[0].dtype in _FOUR_BIT:
            return True
    return False


__all__ = ["session_note"]
