"""How a dim of an ONNX shape reads: a size, a name two values share, or unknown."""

from __future__ import annotations

# Dim names that say "unknown" rather than name a dim two values share: paddle2onnx writes "?"
# for every unknown axis (rapidocr's [-1, 3, "?", "?"] takes 48 x 192), as onnxruntime reads it.
UNNAMED_DIMS = ("?",)


def read_dim(dim) -> int | str | None:
    """A TensorShapeProto.Dimension as graphopt reads it: its size, its name, or None when it
    is unknown (unset, a name in UNNAMED_DIMS, or the -1 some exporters write for "unknown",
    as onnxruntime reads it; no tensor has that size)."""
    which = dim.WhichOneof("value")
    if which == "dim_value":
        return int(dim.dim_value) if dim.dim_value >= 0 else None
    if which == "dim_param" and dim.dim_param not in UNNAMED_DIMS:
        return dim.dim_param or None
    return None


def bound_dim(dim: str, bindings: dict[str, int]) -> int | str | None:
    """A named dim once some names have sizes: the size a name is bound to, or an exporter's
    expression of bound names evaluated (`floor(width/2 - 1/2) + 1`, as YOLOv8's exports write
    their value_info); the name unchanged when it mentions no bound name; None (unknown) when
    it mentions one but cannot be evaluated, rather than keep a dim that the pin contradicts."""
    if dim in bindings:
        return bindings[dim]
    import ast
    import re

    words = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", dim))
    if not words & bindings.keys():
        return dim
    try:
        value = _evaluate(ast.parse(dim, mode="eval").body, bindings)
        return int(value) if value == int(value) and value >= 0 else None
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError):  # int(inf), int(nan)
        return None


def _evaluate(node, bindings: dict[str, int]) -> float:
    """Arithmetic of numbers and bound names, floor and ceil; ValueError for anything else."""
    import ast
    import math
    import operator

    binary = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in bindings:
        return bindings[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in binary:
        return binary[type(node.op)](_evaluate(node.left, bindings),
                                     _evaluate(node.right, bindings))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, bindings)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords \
            and node.func.id in ("floor", "ceil") and len(node.args) == 1:
        rounding = math.floor if node.func.id == "floor" else math.ceil
        return rounding(_evaluate(node.args[0], bindings))
    raise ValueError(f"not an expression of sizes: {ast.dump(node)}")
