"""Static operand shapes ONNX's inference lets through and onnxruntime refuses at every run.

A Conv whose weight does not fit its input or group, a Gemm bias that does not broadcast, a
Clip bound that is no scalar: such a model loaded, compiled and failed at every run."""

from __future__ import annotations

from graphopt.errors import InputError
from graphopt.ir import Model, Node


def check_operand_shapes(model: Model, label: str) -> None:
    """InputError naming the first main-graph node whose static operands cannot work together
    (a branch the inputs never take is left alone, as onnxruntime leaves it)."""
    for node in model.graph:
        if not node.is_onnx:
            continue
        check = _CHECKS.get(node.op_type)
        problem = check(node) if check is not None else None
        if problem:
            raise InputError(f"{label}: node {node.label} ({node.op_type}) {problem}; onnxruntime "
                             "loads such a model and fails at every run")


def _shape(node: Node, index: int) -> tuple[int, ...] | None:
    value = node.input(index)
    return value.static_shape if value is not None else None


def _conv(node: Node) -> str | None:
    group = node.attr("group", 1)
    if group < 1:
        return f"has group={group}; a group count is at least 1"
    weight, data = _shape(node, 1), node.input(0).shape if node.input(0) is not None else None
    if weight is None or len(weight) < 3:
        return None
    if weight[0] % group:
        return f"has {weight[0]} output channels (its weight's dim 0), which group={group} " \
               "does not divide"
    if data is not None and len(data) == len(weight) and isinstance(data[1], int) \
            and data[1] != weight[1] * group:
        return (f"reads {data[1]} channels, where its weight of shape {list(weight)} with "
                f"group={group} takes {weight[1] * group}")
    kernel = node.attr("kernel_shape")
    if kernel is not None and tuple(kernel) != weight[2:]:
        return f"has kernel_shape={list(kernel)}, where its weight's is {list(weight[2:])}"
    bias = _shape(node, 2)
    if bias is not None and bias != (weight[0],):
        return f"has a bias of shape {list(bias)} for {weight[0]} output channels"
    return None


def _gemm(node: Node) -> str | None:
    a, b, c = _shape(node, 0), _shape(node, 1), _shape(node, 2)
    if a is None or b is None or c is None or len(a) != 2 or len(b) != 2:
        return None
    rows = a[1] if node.attr("transA", 0) else a[0]
    columns = b[0] if node.attr("transB", 0) else b[1]
    if len(c) > 2 or any(got not in (1, want) for got, want in zip(c[::-1], (columns, rows))):
        return f"has C of shape {list(c)}, which does not broadcast to its [{rows}, {columns}]"
    return None


def _clip(node: Node) -> str | None:
    for index, bound in ((1, "min"), (2, "max")):
        shape = _shape(node, index)
        # onnxruntime takes a rank-0 tensor or one of shape [1].
        if shape is not None and (len(shape) > 1 or (shape and shape[0] != 1)):
            return f"has a {bound} of shape {list(shape)}; a bound is a scalar"
    return None


_CHECKS = {"Conv": _conv, "Gemm": _gemm, "Clip": _clip}
