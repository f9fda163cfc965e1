"""Which head merges of a fused attention stay layout copies: MultiHeadAttention takes Q, K and V
batch-first, [B, S, N·H], and a model whose heads are split from another layout needs them
copied into it, where its unfused MatMuls read the split heads as they are.

A merge costs nothing when the model split the heads from a batch-first projection itself (the
rewrite reads that projection), or when the Transpose it builds will meet its inverse: the
heads come, through Reshapes and Transposes, from row-wise ops (a MatMul by a constant matrix,
a constant bias or scale, a Slice of the last axis) over a Transpose that keeps the last axis,
which SinkTransposes moves down to cancel (a batch-first nn.MultiheadAttention swaps its inputs
to sequence-first before projecting them). Otherwise, as for a sequence-first module's inputs,
the merge copies the tensor, and onnxruntime's CPU MultiHeadAttention copies it again into its
[B, N, S, H] layout.
"""

from __future__ import annotations

from graphopt.ir import Value

_LAYOUT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
_AFFINE = frozenset({"Add", "Sub", "Mul", "Div"})
_MAX_STEPS = 32


def merge_source(x4: Value) -> tuple[Value, bool]:
    """(the value the heads of `x4` come from, whether merging them back surely copies them):
    walked up through layout ops and the pieces taken of a packed projection (a Split, a
    Gather of one index), then through row-wise ops. A copy where the heads were split by a
    Transpose that moves the leading axis (a sequence-first [S, B·N, H] turned to
    [B·N, S, H]) from a projection by a constant matrix, unless the rows it projects come
    from a Transpose that keeps the last axis, which SinkTransposes cancels."""
    value, reordered = x4, False
    for _ in range(_MAX_STEPS):
        node = value.producer
        if node is None or not node.is_onnx or not node.inputs or not (
                node.op_type in _LAYOUT or node.op_type == "Split"
                or node.op_type == "Gather" and node.input(1) is not None
                and node.input(1).constant() is not None):
            break
        if node.op_type == "Transpose":
            perm = list(node.attr("perm") or [])
            reordered = reordered or not perm or perm[0] != 0
        value = node.inputs[0]  # (a piece of a packed projection leads to the projection)
    projected = False
    for _ in range(_MAX_STEPS):
        node = value.producer
        data = _row_wise_data(node) if node is not None else None
        if data is None:
            break
        projected = projected or node.op_type == "MatMul"
        value = data
    node = value.producer
    if node is not None and node.is_onnx and node.op_type == "Transpose":
        perm = list(node.attr("perm") or [])
        if len(perm) >= 2 and perm[-1] == len(perm) - 1:
            return node.inputs[0], False
    return value, reordered and projected


def _row_wise_data(node) -> Value | None:
    """The data input of `node` when it computes each row from that row alone, else None."""
    if not node.is_onnx or not node.inputs:
        return None
    constants = [v for v in node.inputs[1:] if v is not None and v.constant() is not None]
    if node.op_type == "MatMul":
        weight = node.input(1)
        return node.input(0) if weight is not None and weight.constant() is not None \
            and weight.constant().ndim == 2 else None
    if node.op_type == "Slice":
        return node.input(0) if len(constants) == len(node.inputs) - 1 else None
    if node.op_type in _AFFINE:
        data = [v for v in node.inputs if v is not None and v.constant() is None]
        fixed = [v for v in node.inputs if v is not None and v.constant() is not None]
        if len(data) == 1 and len(fixed) == 1 and all(
                d == 1 for d in fixed[0].constant().shape[:-1]):
            return data[0]
    return None
