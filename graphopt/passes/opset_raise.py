"""Raising a model's ai.onnx opset so that a fusion may emit an op only a newer opset defines
(LayerNormalization, opset 17), when every node the model holds keeps its meaning there.

From opset 13 to 17 the ops ONNX redefined only gained types, or attributes whose defaults keep
the old behaviour (Reshape's allowzero, Shape's start/end, the RNNs' layout, BatchNormalization's
type split, the Scatter ops' reduction), or are new — except RoiAlign, whose new
coordinate_transformation_mode attribute (16) defaults to half_pixel where version 10 computed
output_half_pixel: raising past 16 spells the old mode out on each RoiAlign, as ONNX's version
converter does. Below opset 13, Squeeze, Unsqueeze, Split, the Reduce ops and Softmax changed
meaning, and the model is left at its opset.
"""

from __future__ import annotations

import onnx

from graphopt.ir import Model

OLDEST = 13  # the oldest opset raised; see the module docstring

# op -> (the opset whose version added the attribute, the attribute, the older behaviour)
_NEW_DEFAULTS = {"RoiAlign": (16, "coordinate_transformation_mode", "output_half_pixel")}


def raise_blocker(model: Model, target: int) -> str | None:
    """Why `model`'s ai.onnx opset cannot become `target` (≤ 17) without changing what one of
    its nodes computes; None when it can (or already is there)."""
    current = model.opset("") or 1
    if current >= target:
        return None
    if target > 17:
        return f"opset {target} redefined ops this module does not vet (the Reduce ops' axes)"
    if current < OLDEST:
        return f"raising opset {current} to {target} would change the meaning of ops redefined " \
               f"at {OLDEST} (Squeeze, Unsqueeze, Split, Reduce*, Softmax)"
    for function in model.functions:
        version = _function_opset(function)
        if version is not None and version.version < OLDEST:
            return f"local function {function.domain}::{function.name} imports opset " \
                   f"{version.version}, and raising it would change the meaning of ops " \
                   f"redefined at {OLDEST}"
    return None


def _function_opset(function: onnx.FunctionProto) -> onnx.OperatorSetIdProto | None:
    """A local function's own ai.onnx import (None without one)."""
    for entry in function.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry
    return None


def raise_opset(model: Model, target: int) -> None:
    """Declare ai.onnx at `target` (raise_blocker must have found nothing in the way), spelling
    out the older behaviour on nodes whose default changed on the way."""
    current = model.opset("") or 1
    if current >= target:
        return
    for node in model.graph.all_nodes():
        new = _NEW_DEFAULTS.get(node.op_type) if node.is_onnx else None
        if new is not None and current < new[0] <= target and new[1] not in node.attrs:
            node.set_attr(new[1], new[2])
    # onnx.checker wants a function's ops at the versions the model's import gives them.
    for function in model.functions:
        version = _function_opset(function)
        if version is None or version.version >= target:
            continue
        for node in function.node:
            new = _NEW_DEFAULTS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
            if new is not None and version.version < new[0] <= target \
                    and all(a.name != new[1] for a in node.attribute):
                node.attribute.append(onnx.helper.make_attribute(new[1], new[2]))
        version.version = target
    key = "ai.onnx" if "ai.onnx" in model.opset_imports and "" not in model.opset_imports else ""
    model.opset_imports[key] = target
