"""float16 overflow the CPU stand-in hides: the reference's values of the tensors a candidate
holds in float16, against float16's range.

onnxruntime's CPU provider has float16 kernels for few ops; it runs the others in float32
behind Casts it inserts at load, and drops the Casts between two such ops. A value beyond
±65504 then flows on in float32 where float16 hardware (an NPU, a GPU) would make it inf.
"""

from __future__ import annotations

import numpy as np
import onnx

from graphopt.option_names import from_command_line, option

FP16_MAX = float(np.finfo(np.float16).max)


def half_tensors(models: list[onnx.ModelProto]) -> dict[str, str]:
    """Each float16 value computed in `models`, by name, mapped to the name the float32
    reference gives it: its own, or, for a value ConvertPrecision renamed because a Cast back
    to float32 took over its name (a graph output `y` computed as `y_f16`), that Cast's."""
    half: dict[str, str] = {}
    for model in models:
        graph = model.graph
        typed = {v.name: v.type.tensor_type.elem_type
                 for v in (*graph.value_info, *graph.output, *graph.input)}
        produced = {out for node in graph.node for out in node.output if out}
        for name, elem_type in typed.items():
            if elem_type == onnx.TensorProto.FLOAT16 and name in produced:
                half[name] = name
        for node in graph.node:
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if node.op_type == "Cast" and to == onnx.TensorProto.FLOAT and node.input[0] in half:
                half[node.input[0]] = node.output[0]
    return half


# Attention masks fill with float32's lowest value (or near it) on purpose: in float16 that
# becomes -inf, which softmax takes as a zero weight. Magnitudes this large are sentinels, not
# arithmetic that overflowed.
SENTINEL = 1e30


def overflows(values: dict[str, np.ndarray]) -> list[tuple[str, float]]:
    """(name, largest |finite value|) of each array beyond float16's range, largest first
    (mask sentinels aside)."""
    found = []
    for name, array in values.items():
        array = np.asarray(array)
        if array.dtype.kind != "f" or not array.size:
            continue
        finite = np.abs(array[np.isfinite(array)], dtype=np.float64)
        peak = float(finite[finite < SENTINEL].max(initial=0.0))
        if peak > FP16_MAX:
            found.append((name, peak))
    return sorted(found, key=lambda item: -item[1])


def overflow_note(found: list[tuple[str, float]], makers: dict[str, str] | None = None) -> str:
    """The warning for `found` (overflows' list); `makers` names each tensor's node, which is
    what --keep-dtype takes."""
    if not found:
        return ""
    makers = makers or {}

    def shown_one(name: str, peak: float) -> str:
        maker = makers.get(name)
        return f"{name} (max {peak:.3g}" + (f", node {maker})" if maker else ")")

    shown = ", ".join(shown_one(name, peak) for name, peak in found[:5])
    more = f", and {len(found) - 5} more" if len(found) > 5 else ""
    keep = (f"{option('keep_dtype')} the nodes that make them" if from_command_line()
            else f"list the nodes that make them in {option('keep_dtype')}")
    return (f"float16 overflow: {len(found)} tensor(s) the model holds in float16 exceed "
            f"±{FP16_MAX:g} on this input: {shown}{more}. float16 hardware makes them inf; "
            f"onnxruntime's CPU provider computes many float16 ops in float32, so its outputs "
            f"need not show it. {keep}, or "
            "use a bf16 mode (float32's range) on a target with bfloat16 kernels (ascend910b; "
            "not cpu or ascend310)")
