"""GroupQueryCausalAttention: causal attention over K/V heads repeated for groups of query heads
into onnxruntime's GroupQueryAttention, which reads each K/V head once for its whole group.

Llama-style models (Llama, Mistral, Qwen2, Gemma) project K and V to fewer heads than Q and
repeat each for its group before attending (transformers' `repeat_kv`):

    k [B,S,G·H] ─ Reshape [B,S,G,H] ─ Transpose(0,2,1,3) ─ Unsqueeze(2) ─ Expand [B,G,R,S,H]
                ─ Reshape [B,G·R,S,H]            (then, once ScaledDotProductAttention fused it,
                ─ Transpose(0,2,1,3) ─ Reshape [B,S,N·H] ─ MultiHeadAttention's key; V alike)

Head n of the N = G·R heads reads K/V head n // R, as GroupQueryAttention's query head n reads
its KV head n // (N / G). With the constant causal bias that a pinned export's mask folds to
(0 on and below the diagonal, a fill that swallows any score above: float32's lowest or -inf;
in float16 its lowest, −65504, which exporters write there: a causal row keeps its diagonal,
so each masked key weighs 0, as GroupQueryAttention masks it, wherever a row's scores lie
within float16's range of each other)
the result is GroupQueryAttention's, which is causal by itself, over q and the unrepeated k and
v merged back to [B,S,G·H] (the projections themselves where nothing came between them and the
split: a rotary embedding on the split heads stays), with every sequence full (seqlens_k =
S − 1, total_sequence_length = S) and no past:

    MultiHeadAttention(q, repeat(k), repeat(v), bias=causal)
      → GroupQueryAttention(q, merge(k), merge(v), seqlens_k, total_sequence_length,
                            kv_num_heads=G)
      → GroupQueryAttention(x·[Wq|Wk|Wv] + [bq|bk|bv], …)    when the three are projections
                                                             of one x by constant matrices

Neither the repeated K/V nor the S × S bias is made any more, and the projections are one GEMM.
onnxruntime 1.32's CPU kernel runs it in 0.77–0.94× the time of the MultiHeadAttention over
repeated heads (2 to 12 query heads per K/V head, 128 to 512 tokens, 1 thread:
`python bench/group_query.py`). Only self-attention without a past (a prefill or an
encoder-shaped use): K and V span the query's own S tokens.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Attr, Optional
from graphopt.passes.rules import Rule

MS = "com.microsoft"
SPLIT = [0, 2, 1, 3]         # [B,S,G,H] ↔ [B,G,S,H]; its own inverse
SWALLOWING_FILL = -1e30      # as in attention.py: a bias at or below it swallows any score


def const_list(value: Value | None) -> list[int] | None:
    data = None if value is None else value.constant()
    return None if data is None else [int(d) for d in data.reshape(-1)]


def _only(node, op_type: str):
    """node when it is the default-domain op_type, else None."""
    return node if node is not None and node.is_onnx and node.op_type == op_type else None


_LAYOUT = frozenset({"Reshape", "Transpose"})
_MAX_CHECKED = 1 << 25   # elements of the index arrays repeated_heads traces K/V's layout with


def _layout_chain(value: Value) -> tuple[Value, list]:
    """(v, nodes): the Reshapes and Transposes, by constant shapes and perms, that lead from v
    to `value`, in the order they run (none: `value` itself)."""
    nodes = []
    while value.producer is not None and value.producer.is_onnx \
            and value.producer.op_type in _LAYOUT and len(nodes) < 16:
        node = value.producer
        if node.op_type == "Reshape" and const_list(node.input(1)) is None:
            break
        nodes.append(node)
        value = node.inputs[0]
    return value, nodes[::-1]


def _moved(indices: np.ndarray, node) -> np.ndarray | None:
    """What a Reshape or Transpose does to a tensor of `indices`; None where it cannot."""
    if node.op_type == "Transpose":
        perm = node.attr("perm")
        return np.transpose(indices, list(perm) if perm is not None else None)
    target = const_list(node.input(1))
    if not node.attr("allowzero"):
        target = [indices.shape[i] if d == 0 and i < indices.ndim else d
                  for i, d in enumerate(target)]
    try:
        return indices.reshape(target)
    except ValueError:
        return None


def repeated_heads(value: Value, heads: int) -> tuple[Value, int] | None:
    """(u, G) when `value` [B,S,N·H] is u [B,G,S,H] (K or V split into its G heads, rotated
    or not) with each head repeated in place for its group of the N query heads (head n holds
    u's head n // (N/G)) by an Unsqueeze, an Expand, and Reshapes and Transposes in whatever
    arrangement the exporter wrote them; else None. The arrangement is checked by moving an
    index tensor of u's shape through the same ops."""
    repeated, after = _layout_chain(value)
    expand = repeated.producer
    if expand is None or not expand.is_onnx or expand.op_type != "Expand" \
            or const_list(expand.input(1)) is None:
        return None
    unsqueeze = expand.inputs[0].producer
    if unsqueeze is None or not unsqueeze.is_onnx or unsqueeze.op_type != "Unsqueeze":
        return None
    axes = unsqueeze.attr("axes")
    axes = list(axes) if axes is not None else const_list(
        unsqueeze.input(1) if len(unsqueeze.inputs) > 1 else None)
    split = unsqueeze.inputs[0]
    shape, target = split.shape, const_list(expand.input(1))
    if axes is None or shape is None or len(shape) != 4 \
            or any(not isinstance(d, int) or d <= 0 for d in shape[1:]):
        return None
    # An open batch is traced at two sizes: an arrangement that read a fixed batch fails.
    batches = [shape[0]] if isinstance(shape[0], int) and shape[0] > 0 else [2, 3]
    found = {_traced_groups((batch, *shape[1:]), axes, target, after, heads)
             for batch in batches}
    groups = found.pop() if len(found) == 1 else None
    return (split, groups) if groups else None


def merged_heads(op, split: Value, groups: int) -> Value:
    """The [B,S,G·H] tensor whose heads `split` [B,G,S,H] holds: the value the model split,
    where it split one (x.view(B, S, G, H).transpose(1, 2)), else `split` merged back."""
    node = split.producer
    if node is not None and node.is_onnx and node.op_type == "Transpose" \
            and list(node.attr("perm") or ()) == SPLIT:
        reshape = node.inputs[0].producer
        source = reshape.inputs[0] if reshape is not None and reshape.is_onnx \
            and reshape.op_type == "Reshape" else None
        if source is not None and source.shape is not None and len(source.shape) == 3 \
                and _reshaped(list(source.shape), reshape) == [
                    source.shape[0], split.shape[2], groups, split.shape[3]] \
                and source.shape[2] == groups * split.shape[3]:
            return source
    return op.Reshape(op.Transpose(split, perm=SPLIT),
                      op.const(np.array([0, 0, groups * split.shape[3]])))


def _reshaped(shape: list, node) -> list | None:
    """The shape a Reshape of a `shape` tensor by its constant target gives (0 copies the
    input's dim unless `allowzero`; a -1 takes the rest of a static size); None when the
    target is not constant or the -1 cannot be told."""
    target = const_list(node.input(1) if len(node.inputs) > 1 else None)
    if target is None:
        return None
    if not node.attr("allowzero"):
        target = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(target)]
    if -1 in target:
        known = [d for d in target if d != -1]
        if target.count(-1) > 1 or not all(isinstance(d, int) and d > 0
                                           for d in (*shape, *known)):
            return None
        target[target.index(-1)] = int(np.prod(shape)) // int(np.prod(known))
    return target


def _traced_groups(shape: tuple, axes: list[int], target: list[int], after: list,
                   heads: int) -> int | None:
    """G when an index tensor of u's `shape` [B,G,S,H], moved through the Unsqueeze at `axes`,
    the Expand to `target` and the ops `after`, comes out [B,S,N·H] with u's G heads repeated
    in place for the N = `heads` query heads; else None."""
    batch, groups, length, size = shape
    if int(np.prod(shape)) * heads > _MAX_CHECKED or heads % groups:
        return None
    split = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    rank = split.ndim + len(axes)
    indices = np.expand_dims(split, [a % rank for a in axes])
    try:
        indices = np.broadcast_to(indices, np.broadcast_shapes(indices.shape, tuple(target)))
    except ValueError:
        return None
    for node in after:
        indices = _moved(indices, node)
        if indices is None:
            return None
    expected = split[:, np.arange(heads) // (heads // groups)]        # [B,N,S,H]
    expected = expected.transpose(0, 2, 1, 3).reshape(batch, length, heads * size)
    return groups if indices.shape == expected.shape and np.array_equal(indices, expected) \
        else None


def causal_problem(bias: Value | None, causal: int, length: int) -> str | None:
    """Why the bias (or MultiHeadAttention's `unidirectional`) is not the causal mask over
    `length` tokens that GroupQueryAttention applies by itself; None when it is."""
    if bias is None:
        return None if causal else "no causal mask: GroupQueryAttention is causal only"
    data = bias.constant()
    if data is None:
        return f"the attention bias %{bias.name} is not a constant"
    if data.ndim < 2 or data.shape[-2:] != (length, length):
        return f"the attention bias is {list(data.shape)}, not one [{length}, {length}] mask"
    # transformers expands the mask over the batch (and heads): one mask repeated is causal.
    squares = data.reshape(-1, length, length)
    if any(not np.array_equal(other, squares[0]) for other in squares[1:]):
        return f"the attention bias is {list(data.shape)}, and its sequences' masks differ " \
               "(padding): GroupQueryAttention masks every sequence alike"
    square = squares[0]
    below = np.tril(np.ones((length, length), bool))
    fill = np.finfo(np.float16).min if data.dtype == np.float16 else SWALLOWING_FILL
    if np.any(square[below] != 0) or np.any(square[~below] > fill):
        return "the attention bias is not a causal mask (0 on and below the diagonal, a fill " \
               "that swallows any score above it)"
    return None


def _projection(value: Value):
    """(x, W, b) when value is x·W + b or x·W (b None), W a constant matrix and b a constant
    vector of W's width; else None."""
    node, bias = value.producer, None
    if node is not None and node.is_onnx and node.op_type == "Add":
        consts = [v for v in node.inputs if v is not None and v.constant() is not None]
        rest = [v for v in node.inputs if v is not None and v.constant() is None]
        if len(consts) != 1 or len(rest) != 1:
            return None
        bias, node = consts[0], rest[0].producer
    matmul = _only(node, "MatMul")
    if matmul is None or matmul.input(1).constant() is None \
            or matmul.input(1).constant().ndim != 2:
        return None
    width = matmul.input(1).constant().shape[1]
    if bias is not None and bias.constant().shape != (width,):
        return None
    return matmul.input(0), matmul.input(1), bias


def _head_size_refused(target, root: Value, size: int) -> str | None:
    """Why the target's device for the attention takes no GroupQueryAttention of this head
    size (the 910B's FusedInferAttentionScore: up to 512, multiples of 16)."""
    if target is None:
        return None
    from graphopt.partition.placement import head_size_words
    from graphopt.passes.rules import placed_device

    device = placed_device(target, root)
    kernel = device.kernel("GroupQueryAttention", MS)
    limits = kernel.head_size if kernel is not None else {}
    if not limits or size <= limits.get("max", size) and size % limits.get("multiple_of", 1) == 0:
        return None
    return f"target {target.shown}: its {device.name}'s GroupQueryAttention takes head sizes " \
           f"{head_size_words(limits)}, not {size}"


class GroupQueryCausalAttention(Rule):
    """MultiHeadAttention over K/V heads repeated for groups of query heads, with a causal
    mask, → com.microsoft::GroupQueryAttention over the unrepeated K/V (module docstring)."""

    emits = ((MS, "GroupQueryAttention"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, q, k, v, bias):
        return op.MultiHeadAttention(
            q, k, v, None, None, Optional(bias), _domain=MS, num_heads=Attr("heads"),
            scale=Attr("scale", None), unidirectional=Attr("causal", 0),
            mask_filter_value=Attr("filter", None, pred=lambda f: f is None))

    def check(self, q, k, v, heads, causal=0, bias=None, target=None):
        kv = [repeated_heads(x, heads) for x in (k, v)]
        if None in kv:
            return "K or V is not a repeat of fewer heads for groups of the query's " \
                   "(transformers' repeat_kv) over the query's own tokens"
        (k_split, groups), (v_split, v_groups) = kv
        if groups != v_groups or k_split.shape[2:] != v_split.shape[2:]:
            return f"K has {groups} heads of {list(k_split.shape[2:])} and V {v_groups} of " \
                   f"{list(v_split.shape[2:])}"
        _, _, length, size = k_split.shape
        # The query may be the fusion's own merge, made in this pass and not inferred yet.
        if q.shape is not None and (len(q.shape) != 3 or q.shape[1:] != (length, heads * size)):
            return f"the query %{q.name} is {list(q.shape)}, not [B, {length}, {heads * size}]" \
                   " (K and V span other tokens than the query's: a past, or cross-attention)"
        if q.shape is None and bias is None:  # (a bias's query dim tells the query's length)
            return f"the query %{q.name} has no inferred shape to tell its length by"
        if size % 8:  # onnxruntime 1.32's CPU kernel refuses any other head size when it runs
            return f"the head size {size} is not a multiple of 8"
        return _head_size_refused(target, q, size) or causal_problem(bias, causal, length)

    def rewrite(self, op, q, k, v, heads, scale=None, **_):
        (k_split, groups), (v_split, _) = (repeated_heads(x, heads) for x in (k, v))
        k_flat, v_flat = (merged_heads(op, x, groups) for x in (k_split, v_split))
        batch, _, length, size = k_split.shape
        if scale is None:  # MultiHeadAttention's default, 1/√H, made explicit
            scale = float(1.0 / np.sqrt(np.float32(size)))
        # Every sequence full: its last token at S − 1; an open batch read from q at run time.
        last = np.array([length - 1], np.int32)
        if isinstance(batch, int):
            seqlens = op.const(np.repeat(last, batch))
        else:
            rows = op.Slice(op.Shape(q), op.const(np.array([0])), op.const(np.array([1])))
            seqlens = op.Expand(op.const(last), rows)
        total = op.const(np.array(length, np.int32))
        packed = _packed(op, q, k_flat, v_flat)
        inputs = [packed, None, None] if packed is not None else [q, k_flat, v_flat]
        return op.GroupQueryAttention(*inputs, None, None, seqlens, total, _domain=MS,
                                      num_heads=heads, kv_num_heads=groups, scale=scale)


def _packed(op, q: Value, k: Value, v: Value) -> Value | None:
    """x·[Wq|Wk|Wv] + [bq|bk|bv] when q, k and v are projections of one x by constant matrices
    (GroupQueryAttention then reads them packed, one GEMM for the three); else None."""
    parts = [_projection(x) for x in (q, k, v)]
    if None in parts or len({id(x) for x, _, _ in parts}) != 1:
        return None
    x = parts[0][0]
    weights = np.concatenate([w.constant() for _, w, _ in parts], axis=1)
    if weights.dtype not in (np.float32, np.float16):
        return None
    packed = op.MatMul(x, op.const(weights))
    if all(b is None for _, _, b in parts):
        return packed
    biases = np.concatenate([np.zeros(w.constant().shape[1], weights.dtype) if b is None
                             else b.constant() for _, w, b in parts]).astype(weights.dtype)
    return op.Add(packed, op.const(biases))


__all__ = ["GroupQueryCausalAttention", "causal_problem", "const_list", "repeated_heads"]
