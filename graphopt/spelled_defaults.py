"""Attribute defaults that ONNX's shape inference reads otherwise than the spec and onnxruntime,
spelled out at import so that both size the op alike."""

from __future__ import annotations

from graphopt.ir import Model

# STFT's `onesided` defaults to 1 in the spec, and onnxruntime returns frame_length / 2 + 1
# frequency bins without it; onnx 1.23's inference takes 0 and sizes all frame_length of them
# (16 where onnxruntime gives 9). Written out, inference agrees, and the spectrum and what an
# audio front end computes from it (a mel MatMul, a Log) keep static shapes.
_DEFAULTS = {"STFT": {"onesided": 1}}


def spell_out_defaults(model: Model) -> int:
    """Write the attributes of _DEFAULTS that a node leaves unset, at their spec defaults;
    returns how many were written. It changes no result: onnxruntime reads the same values."""
    written = 0
    for node in model.graph.all_nodes():
        defaults = _DEFAULTS.get(node.op_type) if node.is_onnx else None
        for name, value in (defaults or {}).items():
            if node.attr(name) is None:
                node.set_attr(name, value)
                written += 1
    return written
