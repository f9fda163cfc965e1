"""FuseAttention: scaled dot-product attention over split heads into MultiHeadAttention/Attention.

    O = softmax(s · Q·Kᵀ + M) · V      Q [B,N,S,H], Kᵀ [B,N,H,T], V [B,N,T,Hv]
      → MultiHeadAttention(q, k, v, attention_bias=M, num_heads=N, scale=s)   (com.microsoft)
        where q = Q with its heads merged back, [B,S,N·H] (k and v likewise)

      Q ──┐                                                q ──┐
      Kᵀ ─┴─ MatMul ─ ·s ─ +M ─ Softmax ─┐                 k ──┼─ MultiHeadAttention ─ [B,S,N·Hv]
      V ─────────────────────────────── MatMul ─ O    ⇒    v ──┘     ─ Reshape ─ Transpose ─ O

The model's own head split, Transpose(Reshape(q, [B,S,N,H]), [0,2,1,3]), is looked through;
elsewhere the merge is built, and the Transpose/Reshape pairs the rewrite leaves around O cancel in
SimplifyLayout and EliminateNoOps. The scale is the product of FusedMatMul's alpha, a Mul or Div
of the scores by a scalar, and scalars multiplying Q and Kᵀ. Masks: Add(scores, M) passes M as
`attention_bias`, expanded over the query axis when it broadcasts there (padding masks [B,1,1,T]),
and (scores + M1) + M2 passes M1 + M2 (T5: its relative position bias, then its padding mask);
Where(keep, scores, fill) becomes the bias Where(keep, 0, fill), a constant when keep is one
(a causal mask): score + fill is the fill itself when the fill swallows any score, as float32's
lowest (what exporters write) or -inf does. A fill like -1e4 does not: a row whose every key is
masked would no longer average V evenly, so it is not fused.

Q, K and V must be one batch of N heads: by their inferred shapes or, where ONNX's inference
named one size twice (the -1 of each x.view(B, -1, N, H) afresh), by the dims the ops that split
the heads prove (symbolic_dims.proven_dims); a number of heads and head sizes either way.

Self-attention whose q, k, v are x·Wq + bq, x·Wk + bk, x·Wv + bv of one x with constant weights
then packs into com.microsoft::Attention(x, [Wq|Wk|Wv], [bq|bk|bv]): one GEMM for the three.

PyTorch's export of scaled_dot_product_attention zeroes NaN probabilities, Where(IsNaN(P), 0, P),
so a row whose every key is masked gives 0: the fused output keeps that with
Where(IsNaN(out), Σ_T 0·V, out) (_zero_nan_rows). On the CPU that extra pass pays only where the
projections pack, so a guarded attention fuses there only then (_cpu_loss). A mask that provably
adds 0 (transformers' mask for a model without padding) is dropped (attention_masks).
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Attr, Const, OneOf, Optional, Var
from graphopt.option_names import option
from graphopt.passes.base import register
from graphopt.passes.fusion.attention_masks import adds_nothing
from graphopt.passes.fusion.group_query import GroupQueryCausalAttention
from graphopt.passes.fusion.rotary_heads import RotaryOnMergedHeads
from graphopt.passes.fusion.matmul import unsafe_scale
from graphopt.passes.fusion.merge_copies import merge_source
from graphopt.passes.fusion.packed_heads import PackedHeadSlice, PackedProjectionAttention
from graphopt.passes.fusion.window_mask import WindowMask
from graphopt.passes.rules import Rule, RulePass, cast_by_onnxruntime, target_refuses
from graphopt.passes.symbolic_dims import (Dim, Equalities, describe, proven_dims,
                                           value_dims)

MS = "com.microsoft"
MERGE_Q = (0, 2, 1, 3)    # [B,N,S,H] → [B,S,N,H]; its own inverse
MERGE_KT = (0, 3, 1, 2)   # Kᵀ [B,N,H,T] → [B,T,N,H]; the exporters' split is (0, 2, 3, 1)
# A Where mask's fill at or below this swallows any score s (s + fill == fill in float32 for
# |s| under 1e22): float32's lowest (-3.4e38), which the exporters write, and -inf.
SWALLOWING_FILL = -1e30


def _scalar(data) -> bool:
    return data.size == 1 and data.dtype.kind == "f"


def _off(flag) -> bool:
    return not flag


def _times_scalar(op, x, key: str):
    """x, or x · c for a scalar constant c bound as `<key>_scale`."""
    return OneOf(op.Mul(x, Const(pred=_scalar, name=f"{key}_scale")), x)


def _scores(op, q4, k):
    q, k = _times_scalar(op, q4, "q"), _times_scalar(op, k, "k")
    product = OneOf(op.MatMul(q, k),
                    op.FusedMatMul(q, k, _domain=MS, alpha=Attr("alpha", 1.0),
                                   transA=Attr("trans_a", 0, pred=_off),
                                   transB=Attr("trans_b", 0),
                                   transBatchA=Attr("batch_a", 0, pred=_off),
                                   transBatchB=Attr("batch_b", 0, pred=_off)))
    return OneOf(op.Mul(product, Const(pred=_scalar, name="mul")),
                 op.Div(product, Const(pred=_scalar, name="div")), product)


def _masked(op, scores):
    fill = Const(pred=_scalar, name="fill")
    # Two biases added in turn: T5's relative position bias, then its padding mask.
    return OneOf(op.Add(op.Add(scores, Var("mask")), Var("mask2")),
                 op.Add(scores, Var("mask")), op.Where(Var("keep"), scores, fill),
                 op.Where(Var("drop"), fill, scores), scores)


def _broadcast_shape(a: tuple, b: tuple) -> tuple:
    """The shape two biases' sum broadcasts to (a dim of 1 gives way; of two symbolic dims,
    the first: each already fits the scores, so they name one size)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def _nan_guarded(op, probs):
    """probs, or Where(IsNaN(probs), 0, probs), bound as `nan_guard`: PyTorch's export of
    scaled_dot_product_attention zeroes the probabilities of a row that came out NaN (every key
    masked with -inf, or a NaN score), so that row of P·V is 0 rather than NaN."""
    return OneOf(op.Where(op.IsNaN(probs), Const(0.0), probs, _name="nan_guard"), probs)


def _zero_nan_rows(op, out: Value, v: Value) -> Value:
    """The fused attention's `out` [B,S,N·Hv] as the guarded P·V gives it: where a row of
    probabilities was NaN, out is NaN, and P·V is 0 there, or NaN where V's column (over the
    keys) holds a NaN or ±inf (0·inf). z = Σ_T 0·V is exactly that, 0 or NaN per column, so
    Where(IsNaN(out), z, out). Elsewhere out is the same P·V."""
    zeros = op.Mul(v, op.const(np.array(0, out.dtype.numpy)))
    zeros.dtype, zeros.shape = out.dtype, v.shape  # the rule framework's broadcast check reads it
    guarded = op.Where(op.IsNaN(out), _summed(op, zeros, 1), out)
    guarded.dtype, guarded.shape = out.dtype, out.shape
    return guarded


def _summed(op, x: Value, axis: int) -> Value:
    """ReduceSum of x over `axis`, kept: its axes are an input from opset 13 on."""
    if (op.model.opset("") or 1) >= 13:
        return op.ReduceSum(x, op.const(np.array([axis])), keepdims=1)
    return op.ReduceSum(x, axes=[axis], keepdims=1)


def _same(a, b) -> bool:
    return a is not None and a == b


def _rank_problem(q4: Value, k: Value, v4: Value) -> str | None:
    shapes = [x.shape for x in (q4, k, v4)]
    if any(s is None for s in shapes):
        return f"the rank of Q, K or V is unknown (shapes {shapes}; run InferShapes)"
    if any(len(s) != 4 for s in shapes):
        if all(d is None or isinstance(d, int) for s in shapes for d in s):
            # Static already: pinning changes nothing. An attention of one head over rank-3
            # tensors (a VAE's mid-block) has no heads to unmerge.
            return (f"Q, K, V are not all of rank 4 (shapes {shapes}), and UnmergeHeads found "
                    "no heads merged into their batch ([batch·heads, seq, dim]) to write them "
                    "on: one head, or a split it does not follow")
        return (f"Q, K, V are not all of rank 4 (shapes {shapes}); heads merged into the batch "
                "([batch·heads, seq, dim]) are unmerged first where the shapes are static "
                f"(pin them with {option('input_shapes')})")
    return None


def _problem(dims: list[list[Dim]], trans_b: int, equal: Equalities) -> str | None:
    """Why Q, K(ᵀ), V with `dims` are not [B,N,S,H], [B,N,H,T] (or [B,N,T,H]), [B,N,T,Hv]
    with N, H known, dims in one class of `equal` being the same."""
    (b, n, s, h), ks, (vb, vn, t, hv) = dims
    kb, kn, kh, kt = (ks[0], ks[1], ks[3], ks[2]) if trans_b else ks
    if any(equal.number(d) is None for d in (n, h, hv)):
        return f"the head count and head sizes ({describe(n)}, {describe(h)}, " \
               f"{describe(hv)}) are not static"
    same = equal.same
    if not (same(b, kb) and same(b, vb) and same(n, kn) and same(n, vn) and same(h, kh)
            and same(kt, t)):
        q_, k_, v_ = ([describe(d) for d in x] for x in dims)
        pairs = ((b, kb), (b, vb), (n, kn), (n, vn), (h, kh), (kt, t))
        open_dims = any(not same(x, y) and (equal.number(x) is None or equal.number(y) is None)
                        for x, y in pairs)
        hint = (f"; dims named apart may be one size at run time: pinned ({option('input_shapes')}"
                f" or {option('dynamic_dims')}), they are compared as numbers") if open_dims else ""
        return f"Q {q_}, K {k_}, V {v_} do not line up as one batch of {equal.number(n)} " \
               f"heads without broadcasting{hint}"
    return None


def _head_dims(q4: Value, k: Value, v4: Value,
               trans_b: int) -> tuple[list[list[Dim]], Equalities] | str:
    """The dims of Q, K, V as their inferred shapes give them or, where those do not line up,
    as the ops that split the heads prove them (with the classes of dims proven equal); or why
    they are not one batch of heads. ONNX's inference names the -1 of each x.view(B, -1, N, H)
    afresh (Q's sequence unk__14, K's unk__15, V's unk__16), or the head count where the -1 is
    there: the target read from x's own Shape proves them x's sequence, or N."""
    problem = _rank_problem(q4, k, v4)
    if problem:
        return problem
    dims, equal = [value_dims(x) for x in (q4, k, v4)], Equalities()
    if _problem(dims, trans_b, equal) is None:
        return dims, equal
    dims = [proven_dims(x, equal) for x in (q4, k, v4)]
    return _problem(dims, trans_b, equal) or (dims, equal)


def _fits(dim, want) -> bool:
    """A mask dim that is `want`, or symbolic where `want` is not known to differ: a mask that
    broadcasts over the keys adds one number to a whole row, which softmax ignores, so no model
    has one, and a batch or head dim that is neither 1 nor `want` fails in the original too."""
    return _same(dim, want) or not isinstance(dim, int) or not isinstance(want, int)


def _widens_nothing(dim, want, declared: set[str]) -> bool:
    """Whether a mask's batch, head or query dim `dim` (not 1) leaves the scores' `want` as it
    is. Where the scores' dim is 1 at run time and the mask's larger, the original broadcasts
    the scores up to the mask's, which MultiHeadAttention, whose output takes Q's dims, refuses.
    So `dim` is `want`, or `want` is a number other than 1 (a mask dim of another size fails in
    the original too), or both are open and not two dims the graph's inputs name apart (a
    name that shape inference made up, "unk__8", may stand for the other: ONNX's inference
    names a Reshape's output dims afresh)."""
    if _same(dim, want):
        return True
    if isinstance(want, int):
        return want != 1 and not isinstance(dim, int)
    if isinstance(dim, int):  # a fixed size over Q's open dim
        return False
    return not (dim in declared and want in declared)


def _declared_dims(model) -> set[str]:
    """The dim names the main graph's inputs declare."""
    return {d for v in model.graph.inputs if v.shape is not None
            for d in v.shape if isinstance(d, str)}


def _shape_derived(value: Value, limit: int = 64) -> bool:
    """Whether `value` is computed from constants and tensor shapes alone (through Shape and
    Size), as a causal mask sliced to the sequence is, and not from data a caller feeds (a
    padding mask). A walk past `limit` nodes answers no."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v.is_constant:
            continue
        node = v.producer
        if node is None:  # a graph input, or a value from an enclosing graph
            return False
        if node.is_onnx and node.op_type in ("Shape", "Size") or id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > limit:
            return False
        stack.extend(i for i in node.inputs if i is not None)
    return True


def _on_cpu(target, *values: Value) -> bool:
    """Whether onnxruntime's CPU provider would run a MultiHeadAttention over `values`: without
    a target, or when the target's device for it is a CPU. That is its primary device if it has
    the op and can take the shapes (an NPU that compiles static shapes only cannot take a
    symbolic sequence), else its host.

    There, a causal mask that the model slices to the sequence at run time (GPT-2's exports
    with a symbolic sequence) makes the fusion a loss: per layer the bias is built by Where
    and Expand over [1, 1, S, T], and a 2-layer GPT-2 at seq 16 ran 1.03× the original at
    ORT_ENABLE_ALL against 0.98× unfused (1 thread, onnxruntime 1.32, AVX-512); at batch 4,
    seq 64 both ran level. With the sequence pinned the mask is a constant and the fusion
    pays (0.92× against 0.93×)."""
    if target is None:
        return True
    device = target.device(target.primary)
    dynamic = any(v.shape is None or not all(isinstance(d, int) for d in v.shape)
                  for v in values)
    if device.kernel("MultiHeadAttention", MS) is None or device.static_shapes_only and dynamic:
        device = target.device(target.host)
    return device.kind == "cpu"


def _no_row_masked_whole(fill, keep: Value | None, drop: Value | None) -> bool:
    """Whether a float16 Where fills masked scores with float16's lowest (what exporters write
    there) under a constant condition that keeps a key in every row (a causal mask). The bias
    then masks with -inf (_attention_bias): each masked key weighs 0, as the fill gives it
    wherever a row's scores stay within float16's range of each other, and no row is left to
    average V by the fill alone."""
    cond = keep if keep is not None else drop
    data = cond.constant() if cond is not None else None
    if fill.dtype != np.float16 or float(fill.reshape(-1)[0]) > np.finfo(np.float16).min \
            or data is None or data.ndim < 1 or data.size == 0:
        return False
    kept = data if keep is not None else ~data
    return bool(np.all(np.any(kept, axis=-1)))


def _bias_problem(m: Value, bns: list, t, declared: set[str]) -> str | None:
    """Why M cannot be MultiHeadAttention's attention_bias [B or 1, N or 1, S, T] (`bns` the
    entries B, N, S; `declared` as _widens_nothing's)."""
    b, n, s = bns
    if m.shape is None or len(m.shape) > 4:
        return f"the mask %{m.name} has shape {m.shape}, not of rank ≤ 4"
    mb, mn, ms, mt = (1,) * (4 - len(m.shape)) + tuple(m.shape)
    if not (_fits(mt, t) and mt != 1
            and all(dim == 1 or _widens_nothing(dim, want, declared)
                    for dim, want in ((mb, b), (mn, n), (ms, s)))):
        return f"the mask %{m.name} of shape {list(m.shape)} does not broadcast to " \
               f"[B or 1, N or 1, S or 1, T] = [{b}, {n}, {s}, {t}]"
    return None


def _own_merge(x4: Value, merge: tuple[int, ...], width: int, equal: Equalities) -> Value | None:
    """The model's own x3 [B,S,N·H] when x4 = Transpose(Reshape(x3)) splits exactly that (the
    Reshape's leading dims are x3's, as inferred or proven), else None."""
    split = x4.producer
    if merge == MERGE_KT:
        transposed = _transposed_split(x4, width, equal)
        if transposed is not None:
            return transposed
    elif merge == MERGE_Q:
        single = _single_head(x4, width, equal)
        if single is not None:
            return single
    split_perm = tuple(int(i) for i in np.argsort(merge))
    if split is not None and split.op_type == "Transpose" and split.is_onnx \
            and tuple(split.attr("perm") or ()) == split_perm:
        reshape = split.inputs[0].producer
        x3 = reshape.inputs[0] if reshape is not None and reshape.op_type == "Reshape" else None
        if x3 is not None and reshape.is_onnx and x3.shape is not None \
                and len(x3.shape) == 3 and x3.shape[2] == width:
            own = value_dims(x3)[:2]
            for r in (value_dims(split.inputs[0]), proven_dims(split.inputs[0], equal)):
                if r is not None and all(equal.same(a, b) for a, b in zip(r[:2], own)):
                    return x3
    return None


def _transposed_split(kt: Value, width: int, equal: Equalities) -> Value | None:
    """The projection x3 [B,T,N·H] when Kᵀ [B,N,H,T] = Reshape(Transpose(x3, [0,2,1])): the
    form SimplifyLayout's ReshapeChain gives the exporters' Reshape → Transpose(0,2,3,1) once
    the shapes are static (the pinned dynamo BERT then lost its packed attention), or, at a
    batch of 1, Reshape(Transpose(Reshape(x3, [T, N·H]), [1, 0])) (a dynamo SDPA export with
    a bool padding mask then stayed unfused at batch 1 alone)."""
    split = kt.producer
    if split is None or split.op_type != "Reshape" or not split.is_onnx:
        return None
    flip = split.inputs[0].producer
    if flip is None or flip.op_type != "Transpose" or not flip.is_onnx:
        return None
    perm = tuple(flip.attr("perm") or ())
    if perm == (0, 2, 1):
        x3 = flip.inputs[0]
    elif perm == (1, 0):  # at a batch of 1, ReshapeChain drops it: Reshape(x3, [T, N·H]) first
        x3 = _unbatched(flip.inputs[0])
        if x3 is None:
            return None
    else:
        return None
    if _projected_from(x3) is None:  # a projection transposed, not heads flattened back
        return None
    if x3.shape is None or len(x3.shape) != 3 or x3.shape[2] != width or kt.shape is None \
            or len(kt.shape) != 4:
        return None
    heads, head_size = kt.shape[1], kt.shape[2]  # the split of the N·H the Transpose put first
    if not (isinstance(heads, int) and isinstance(head_size, int) and heads * head_size == width):
        return None
    dims, own = value_dims(kt) or proven_dims(kt, equal), value_dims(x3)
    same = dims is not None and own is not None and equal.same(dims[0], own[0]) \
        and equal.same(dims[3], own[1])
    return x3 if same else None


def _single_head(x4: Value, width: int, equal: Equalities) -> Value | None:
    """x3 [B,S,H] when x4 [B,1,S,H] = Reshape(x3): one head's split, whose Transpose(0,2,1,3)
    moves a dim of 1 and which TransposeChain folds into its Reshape (a one-head attention
    with a padding mask then stayed unfused)."""
    reshape = x4.producer
    if reshape is None or reshape.op_type != "Reshape" or not reshape.is_onnx:
        return None
    x3 = reshape.inputs[0]
    if x3.shape is None or len(x3.shape) != 3 or x3.shape[2] != width or x4.shape is None \
            or len(x4.shape) != 4 or x4.shape[1] != 1 or x4.shape[3] != width:
        return None
    dims, own = value_dims(x4) or proven_dims(x4, equal), value_dims(x3)
    same = dims is not None and own is not None and equal.same(dims[0], own[0]) \
        and equal.same(dims[2], own[1])
    return x3 if same else None


def _unbatched(x2: Value) -> Value | None:
    """x3 [1, T, N·H] when x2 = Reshape(x3) is x3 without its batch of 1, else None."""
    squeeze = x2.producer
    if squeeze is None or squeeze.op_type != "Reshape" or not squeeze.is_onnx:
        return None
    x3 = squeeze.inputs[0]
    if x3.shape is None or len(x3.shape) != 3 or x3.shape[0] != 1 \
            or x2.shape is None or tuple(x2.shape) != tuple(x3.shape[1:]):
        return None
    return x3


def _widening(m: Value, bnst: list) -> str | None:
    """Why a mask of zeros cannot just be dropped: it would broadcast the scores
    [B, N, S, T] (`bnst` their entries) to more dims or larger ones."""
    if m.shape is None or len(m.shape) > 4 or not all(
            dim == 1 or _fits(dim, want)
            for dim, want in zip(m.shape, bnst[4 - len(m.shape):])):
        return f"the mask %{m.name} of shape {m.shape} adds 0, but broadcasts the scores " \
               f"[{', '.join(map(str, bnst))}] further"
    return None


def _merged(op, x4: Value, merge: tuple[int, ...], width: int, equal: Equalities) -> Value:
    """x4 with its heads merged, [B,S,N·H]: the model's own (_own_merge), else
    Reshape(Transpose(x4, merge))."""
    own = _own_merge(x4, merge, width, equal)
    if own is not None:
        return own
    return op.Reshape(op.Transpose(x4, perm=list(merge)), op.const(np.array([0, 0, width])))


def _projected_from(x3: Value | None) -> Value | None:
    """x when x3 = x·W (+ b) with W a constant matrix (and b a constant vector of its width),
    or that times a scalar constant, the projections PackedSelfAttention packs; else None."""
    node = x3.producer if x3 is not None else None
    if node is not None and node.is_onnx and node.op_type == "Mul":
        scales = [v for v in node.inputs if v is not None and v.is_constant
                  and v.constant() is not None and _scalar(v.constant())]
        rest = [v for v in node.inputs if v is not None and not v.is_constant]
        node = rest[0].producer if len(scales) == 1 and len(rest) == 1 else None
    bias = None
    if node is not None and node.is_onnx and node.op_type == "Add":
        consts = [v for v in node.inputs if v is not None and v.is_constant]
        rest = [v for v in node.inputs if v is not None and not v.is_constant]
        node = rest[0].producer if len(consts) == 1 and len(rest) == 1 else None
        bias = consts[0] if consts else None
    if node is None or not node.is_onnx or node.op_type != "MatMul":
        return None
    x, w = node.inputs
    if not w.is_constant or w.shape is None or len(w.shape) != 2 \
            or bias is not None and tuple(bias.shape or ()) != (w.shape[1],):
        return None
    return x


def _cpu_loss(q4: Value, k: Value, v4: Value, trans_b: int, widths: tuple[int, int],
              equal: Equalities) -> str | None:
    """Why a NaN-guarded attention would run slower fused on onnxruntime's CPU provider: its
    guard's pass over V and the output (_zero_nan_rows) is paid back only where Q, K and V
    pack into one Attention (GPT-2 ran 1.08x the unfused block; a 2-layer Llama, with its
    heads proven through the rotary embedding, 1.18x)."""
    qk, hv = widths
    if qk != hv or not _packs(q4, k, v4, trans_b, widths, equal):
        return "on the CPU, MultiHeadAttention and the pass that keeps the guard's zero " \
               "rows run slower than the MatMul + Softmax they replace, unless Q, K and V " \
               "pack into one Attention (projections of one input by constant weights)"
    return None


def _copy_loss(q4: Value, k: Value, v4: Value, trans_b: int, widths: tuple[int, int],
               equal: Equalities) -> str | None:
    """Why the fused attention would run slower on onnxruntime's CPU provider for the copies
    its head merges make (merge_copies): where two or more of Q, K and V are split from
    another layout than [B, S, N·H] and do not come from one input, which packs into
    Attention. A sequence-first nn.MultiheadAttention's cross-attention at [128, 2, 256] ran
    1.07x the original fused against 1.00x unfused (1 thread, onnxruntime 1.32, AVX-512)."""
    qk, hv = widths
    merges = ((q4, MERGE_Q, qk), (k, MERGE_Q if trans_b else MERGE_KT, qk), (v4, MERGE_Q, hv))
    sources, copies = [], 0
    for x4, merge, width in merges:
        if _own_merge(x4, merge, width, equal) is not None:
            sources.append(x4)
            continue
        source, copied = merge_source(x4)
        sources.append(source)
        copies += copied
    if copies < 2 or all(source is sources[0] for source in sources):
        return None
    return f"on the CPU, {copies} of Q, K and V are split into heads from another layout " \
           "than [B, S, N·H] (a sequence-first module's): MultiHeadAttention would copy " \
           "them into it, and runs slower than the MatMul + Softmax that read them as they are"


def _packs(q4: Value, k: Value, v4: Value, trans_b: int, widths: tuple[int, int],
           equal: Equalities) -> bool:
    """Whether Q, K and V are split from projections of one x with constant weights, which
    PackedSelfAttention will pack into one Attention."""
    qk, hv = widths
    sources = [_projected_from(_own_merge(x4, merge, width, equal)) for x4, merge, width in
               ((q4, MERGE_Q, qk), (k, MERGE_Q if trans_b else MERGE_KT, qk), (v4, MERGE_Q, hv))]
    return sources[0] is not None and all(x is sources[0] for x in sources)


def _scale(alpha, q_scale, k_scale, mul, div) -> float:
    """The one factor of the scores: FusedMatMul's alpha, the scalars Q and K were multiplied
    by, and a Mul or Div of the scores."""
    scale = float(alpha)
    for factor in (q_scale, k_scale, mul):
        scale *= 1.0 if factor is None else float(factor.reshape(-1)[0])
    return scale / (1.0 if div is None else float(div.reshape(-1)[0]))


class ScaledDotProductAttention(Rule):
    """softmax(s·Q·Kᵀ (+ mask)) · V on split heads → com.microsoft::MultiHeadAttention."""

    emits = ((MS, "MultiHeadAttention"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, q4, k, v4):
        probs = op.Softmax(_masked(op, _scores(op, q4, k)), axis=Attr("axis"))
        return op.MatMul(_nan_guarded(op, probs), v4)

    def check(self, q4, k, v4, model, target=None, axis=None, trans_b=0, alpha=1.0, q_scale=None,
              k_scale=None, mask=None, keep=None, drop=None, fill=None, mul=None, div=None,
              nan_guard=None, mask2=None):
        found = _head_dims(q4, k, v4, trans_b)
        if isinstance(found, str):
            return found
        dims, equal = found
        if 0 in (equal.number(dims[0][2]), equal.number(dims[2][2])):
            # onnxruntime's optimizer drops the Expand that shapes the fused op's mask to
            # [B, 1, 0, 0], which its Attention then refuses: a BERT pinned to a sequence of 0
            # had compiled into an .om that did not run.
            return "a sequence of 0 queries or keys"
        if axis is None and (model.opset("") or 1) < 13:
            return "Softmax has no axis: before opset 13 that means axis 1"
        if axis not in (None, -1, 3):
            return f"Softmax runs over axis {axis}, not the key axis"
        if q4.dtype not in (DType.FLOAT, DType.FLOAT16) or k.dtype != q4.dtype \
                or v4.dtype != q4.dtype:
            return "Q, K and V are not all float32 or all float16"
        if div is not None and float(div.reshape(-1)[0]) == 0.0:
            return "the scores are divided by zero"
        scale = _scale(alpha, q_scale, k_scale, mul, div)
        if scale == 0:  # onnxruntime reads scale 0 as unset: 1/√head_size
            return "the composed scale is 0, which MultiHeadAttention takes for its default"
        problem = unsafe_scale(scale, "scale")
        if problem:
            return problem
        n, h, hv = (equal.number(d) for d in (dims[0][1], dims[0][3], dims[2][3]))
        if nan_guard is not None and _on_cpu(target, q4, k, v4):
            problem = _cpu_loss(q4, k, v4, trans_b, (n * h, n * hv), equal)
            if problem:
                return problem
        if _on_cpu(target, q4, k, v4):
            problem = _copy_loss(q4, k, v4, trans_b, (n * h, n * hv), equal)
            if problem:
                return problem
        if mask2 is not None:  # each bias as if it were the only one; their sum is the bias
            bns, t = [equal.entry(d) for d in dims[0][:3]], equal.entry(dims[2][2])
            for bias in (mask, mask2):
                problem = self.check(q4, k, v4, model, target, axis, trans_b, alpha, q_scale,
                                     k_scale, mask=bias, mul=mul, div=div,
                                     nan_guard=nan_guard) \
                    or _bias_problem(bias, bns, t, _declared_dims(model))
                if problem:
                    return problem
            return None
        if adds_nothing(mask, keep):  # fused without it, where it broadcasts no further
            return _widening(mask if mask is not None else keep,
                             [equal.entry(d) for d in (*dims[0][:3], dims[2][2])])
        if fill is not None and not float(fill.reshape(-1)[0]) <= SWALLOWING_FILL \
                and not _no_row_masked_whole(fill, keep, drop):
            return f"the masked scores are filled with {fill.reshape(-1)[0]}, not a number " \
                   "that swallows any score (float32's lowest): score + fill is then not " \
                   "the fill, and a row whose every key is masked would stop averaging V evenly"
        cond = keep if keep is not None else drop
        built = cond if cond is not None else mask
        if built is not None and built.constant() is None and _shape_derived(built) \
                and _on_cpu(target, q4, k, v4, built):
            what = "Where condition" if cond is not None else "additive mask"
            return f"the {what} is a mask built to the sequence at run time, so the bias " \
                   "would be built on every run: onnxruntime's CPU MultiHeadAttention with it " \
                   "runs slower than the MatMul + Softmax it replaces (pin the sequence with " \
                   f"{option('input_shapes')} or {option('dynamic_dims')} to make the mask a " \
                   "constant)"
        if mask is not None and mask.dtype != self.mask_dtype(q4):
            return f"the additive mask %{mask.name} is not of Q's type, {q4.dtype.short}"
        if cond is not None and cond.dtype != DType.BOOL:
            return f"the Where condition %{cond.name} is not bool"
        if mask is None and cond is None:
            return None
        return _bias_problem(mask if mask is not None else cond,
                             [equal.entry(d) for d in dims[0][:3]], equal.entry(dims[2][2]),
                             _declared_dims(model))

    def mask_dtype(self, q4: Value) -> DType | None:
        """The type an additive mask must have: Q's, as MultiHeadAttention takes its bias."""
        return q4.dtype

    def rewrite(self, op, q4, k, v4, trans_b=0, alpha=1.0, q_scale=None, k_scale=None,
                mul=None, div=None, mask=None, keep=None, drop=None, fill=None, nan_guard=None,
                mask2=None, **_):
        dims, equal = _head_dims(q4, k, v4, trans_b)
        (b, n, s, h), _, (_, _, t, hv) = dims
        b, s, t = equal.entry(b), equal.entry(s), equal.entry(t)
        n, h, hv = equal.number(n), equal.number(h), equal.number(hv)
        scale = _scale(alpha, q_scale, k_scale, mul, div)
        q = _merged(op, q4, MERGE_Q, n * h, equal)
        k = _merged(op, k, MERGE_Q if trans_b else MERGE_KT, n * h, equal)
        v = _merged(op, v4, MERGE_Q, n * hv, equal)
        if mask2 is not None:  # (s + M1) + M2 as s + (M1 + M2): a fill that swallows stays
            total = op.Add(mask, mask2)
            total.dtype, total.shape = mask.dtype, _broadcast_shape(mask.shape, mask2.shape)
            mask = total
        elif adds_nothing(mask, keep):
            mask = keep = None
        bias = _attention_bias(op, q4.dtype, (s, t), q, v, mask, keep, drop, fill)
        inputs = [q, k, v] + ([None, None, bias] if bias is not None else [])
        out = op.MultiHeadAttention(*inputs, _domain=MS, num_heads=n, scale=scale)
        out.dtype, out.shape = q4.dtype, (b, s, n * hv)
        if nan_guard is not None:
            out = _zero_nan_rows(op, out, v)
        heads = op.Reshape(out, op.const(np.array([0, 0, n, hv])))
        heads.dtype, heads.shape = q4.dtype, (b, s, n, hv)
        return op.Transpose(heads, perm=list(MERGE_Q))


def _to_float(to) -> bool:
    return to == int(DType.FLOAT)


def _to_half(to) -> bool:
    return to == int(DType.FLOAT16)


class UpcastScaledDotProductAttention(ScaledDotProductAttention):
    """softmax over float32 scores of float16 Q·Kᵀ, times float16 V made float32 →
    float16 com.microsoft::MultiHeadAttention, its output made float32.

    The TorchScript export of a float16 Llama, Mistral, Qwen2, Gemma or Falcon
    (transformers' eager attention: `softmax(scores, dtype=torch.float32)`) casts the scores
    to float32 before the mask and the Softmax, and V with them, so P·V runs in float32 and is
    cast back to float16 after the head merge. The fused op computes the scores without rounding them to float16
    first (onnxruntime's CPU kernel runs in float32; an NPU accumulates in float32), and its
    output rounds to float16 once, where the original's Cast after the merge rounds it: the
    Cast this rule puts after it and that one then meet and cancel. An additive float32 mask
    is cast to float16 for the bias: float32's lowest, the exporters' fill, becomes -inf,
    which masks a key as the lowest did."""

    dtypes = (DType.FLOAT,)
    device_dtypes = ()

    def pattern(self, op, q4, k, v4):
        scores = op.Cast(_scores(op, q4, k), to=Attr("to", pred=_to_float))
        probs = op.Softmax(_masked(op, scores), axis=Attr("axis"))
        return op.MatMul(_nan_guarded(op, probs),
                         op.Cast(v4, to=Attr("v_to", pred=_to_float)))

    def unsupported(self, root: Value, target=None) -> str | None:
        problem = super().unsupported(root, None)  # onnxruntime's kernels, a float32 root
        if problem:  # the device runs the float16 op: asked of it below, not float32's
            return problem
        return target_refuses(target, self.emits, root,
                              cast_by_onnxruntime(target, root) or "float16")

    def check(self, q4, k, v4, model, target=None, axis=None, trans_b=0, alpha=1.0, q_scale=None,
              k_scale=None, mask=None, keep=None, drop=None, fill=None, mul=None, div=None,
              nan_guard=None, mask2=None):
        if q4.dtype != DType.FLOAT16:
            return "the scores made float32 are not float16's"
        return super().check(q4, k, v4, model, target, axis, trans_b, alpha, q_scale, k_scale,
                             mask, keep, drop, fill, mul, div, nan_guard, mask2)

    def mask_dtype(self, q4: Value) -> DType | None:
        return DType.FLOAT  # added to the float32 scores; the rewrite casts it

    def rewrite(self, op, q4, k, v4, to=None, v_to=None, mask=None, **bound):
        if mask is not None and mask.constant() is not None:
            # Cast now, so the bias is a constant that GroupQueryCausalAttention reads.
            with np.errstate(over="ignore"):  # float32's lowest is float16's -inf
                mask = op.const(mask.constant().astype(np.float16))
        elif mask is not None:
            half = op.Cast(mask, to=int(DType.FLOAT16))
            half.dtype, half.shape = DType.FLOAT16, mask.shape
            mask = half
        heads = super().rewrite(op, q4, k, v4, mask=mask, **bound)
        heads.dtype = DType.FLOAT16
        out = op.Cast(heads, to=int(DType.FLOAT))
        out.dtype = DType.FLOAT
        return out


class HalfThroughReshape(Rule):
    """Cast(Reshape(Cast(x, float32)), float16) of a float16 x → Reshape(x): float32 holds
    every float16 exactly, so the two Casts give x back. UpcastScaledDotProductAttention
    leaves the first after its float16 output, the model's head merge and its own Cast back
    to float16 follow; without this the Casts stay, and the Reshapes they part do not merge."""

    dtypes = (DType.FLOAT16,)

    def pattern(self, op, x, shape):
        wide = op.Cast(x, to=Attr("wide", pred=_to_float))
        return op.Cast(op.Reshape(wide, shape, allowzero=Attr("allowzero", 0)),
                       to=Attr("back", pred=_to_half))

    def check(self, x, shape, wide=None, back=None, allowzero=0):
        return None if x.dtype == DType.FLOAT16 else "the value cast to float32 is not float16"

    def rewrite(self, op, x, shape, allowzero=0, **_):
        return op.Reshape(x, shape, allowzero=allowzero) if allowzero else op.Reshape(x, shape)


def _attention_bias(op, dtype: DType, lengths: tuple, q: Value, v: Value, mask, keep, drop,
                    fill) -> Value | None:
    """The mask as a [B or 1, N or 1, S, T] float bias (None without a mask), `lengths` the
    (S, T) shape entries; q and v are Q's [B,S,N·H] and V's [B,T,N·Hv] forms, whose shapes
    give S and T at run time when they are not static."""
    float_type, dtype = dtype, dtype.numpy
    if keep is not None or drop is not None:
        cond = keep if keep is not None else drop
        value = float(fill.reshape(-1)[0])
        # A float16 fill that does not swallow the scores (float16's lowest under a causal
        # condition, _no_row_masked_whole) is written as -inf: added to a score of +40000,
        # -65504 had left a masked key above a visible one that scored -40000. So is a fill
        # past the bias type's range (float32's lowest in an upcast attention's float16 bias),
        # as a Cast would make it.
        kept = value <= SWALLOWING_FILL and value >= float(np.finfo(dtype).min)
        zero, big = np.array(0, dtype), np.array(value if kept else -np.inf, dtype)
        if cond.constant() is not None:
            chosen = np.where(cond.constant(), *((zero, big) if keep is not None else (big, zero)))
            mask = op.const(chosen.astype(dtype))
        else:
            pair = (op.const(zero), op.const(big))
            mask = op.Where(cond, *(pair if keep is not None else pair[::-1]))
            mask.dtype, mask.shape = float_type, cond.shape
    if mask is None:
        return None
    s, t = lengths
    shape = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
    # MultiHeadAttention takes a bias of S rows (or 1) and exactly T columns: a key dim that is
    # not provably T (another symbol, which may be 1 at run time) is expanded to T too.
    rows_ok, cols_ok = len(mask.shape) == 4 and _same(shape[2], s), _same(shape[3], t)
    if rows_ok and cols_ok:
        return mask
    wanted = (s if not rows_ok else 1, t if not cols_ok else 1)
    if mask.constant() is not None and all(isinstance(d, int) for d in (s, t)):
        return op.const(np.ascontiguousarray(np.broadcast_to(
            mask.constant().reshape(shape), shape[:2] + (s, t))))
    if all(isinstance(d, int) for d in wanted):
        target = op.const(np.array([1, 1, *wanted]))
    else:  # a dynamic length: read S from Q's shape, T from V's, at run time
        dims = [op.const(np.array([d])) if isinstance(d, int) else
                op.Gather(op.Shape(_rows_of(x)), op.const(np.array([1])), axis=0)
                for d, x in zip(wanted, (q, v))]
        target = op.Concat(op.const(np.array([1, 1])), *dims, axis=0)
    # Typed here: the fusion sweeps that follow (PackedSelfAttention) run before InferShapes.
    bias = op.Expand(mask, target)
    bias.dtype, bias.shape = mask.dtype, shape[:2] + (s, t if not cols_ok else shape[3])
    return bias


def _rows_of(x3: Value) -> Value:
    """A value whose first two dims are x3's: the input x of a projection x3 = x·W (+ b), W a
    matrix and b a vector, else x3 itself. Reading the sequence there leaves the projection
    to PackedSelfAttention, which packs it only when nothing else reads it."""
    node = x3.producer
    if node is not None and node.is_onnx and node.op_type == "Add":
        bias = [v for v in node.inputs if v is not None and v.shape is not None
                and len(v.shape) <= 1]
        rest = [v for v in node.inputs if v is not None and v not in bias]
        node = rest[0].producer if len(bias) == 1 and len(rest) == 1 else None
    if node is not None and node.is_onnx and node.op_type == "MatMul":
        x, w = node.inputs
        if x.shape is not None and len(x.shape) == 3 and w.shape is not None \
                and len(w.shape) == 2:
            return x
    return x3


def _projection(op, x, w, b):
    """x·W + b, or x·W where a zero bias was folded away."""
    return OneOf(op.Add(op.MatMul(x, w), b), op.MatMul(x, w))


def _self_attention(op, x, wq, wk, wv, bq, bk, bv, bias, v=None):
    """MultiHeadAttention over x's projections (`v`, when given, the V projection's pattern);
    Q's may be scaled by a constant, bound as `q_scale` (Whisper's q_proj(x) · scaling)."""
    query = _projection(op, x, wq, bq)
    return op.MultiHeadAttention(
        OneOf(op.Mul(query, Const(pred=_scalar, name="q_scale")), query),
        _projection(op, x, wk, bk),
        v if v is not None else _projection(op, x, wv, bv),
        None, None, Optional(bias), _domain=MS, num_heads=Attr("heads"),
        scale=Attr("scale"), unidirectional=Attr("causal", 0),
        mask_filter_value=Attr("filter", None, pred=lambda v: v is None))


class PackedSelfAttention(Rule):
    """MultiHeadAttention over x·Wq, x·Wk, x·Wv (+ biases) → Attention with [Wq|Wk|Wv] packed.

    One GEMM instead of three; zero biases folded away count as absent."""

    emits = ((MS, "Attention"),)
    dtypes = (DType.FLOAT,)
    device_dtypes = (DType.FLOAT16,)

    def pattern(self, op, x, wq, wk, wv, bq, bk, bv, bias):
        return _self_attention(op, x, wq, wk, wv, bq, bk, bv, bias)

    def check(self, x, wq, wk, wv, bq=None, bk=None, bv=None, q_scale=None):
        if x.shape is None or len(x.shape) != 3:
            return f"%{x.name} is not of rank 3"
        weights, biases = (wq, wk, wv), (bq, bk, bv)
        if not all(w.is_constant and w.shape is not None and len(w.shape) == 2 for w in weights):
            return "a projection weight is not a constant matrix"
        if len({w.shape[0] for w in weights}) != 1 or wq.shape[1] != wk.shape[1]:
            return f"projection weights {[list(w.shape) for w in weights]} do not pack"
        for w, b in [(w, b) for w, b in zip(weights, biases) if b is not None]:
            if not b.is_constant or tuple(b.shape or ()) != (w.shape[1],):
                return f"bias %{b.name} is not a constant of shape [{w.shape[1]}]"
        return None

    def rewrite(self, op, x, wq, wk, wv, heads, scale, causal, bq=None, bk=None, bv=None,
                bias=None, q_scale=None, **_):
        return self.packed(op, x, wq, wk, wv, heads, scale, causal, bq, bk, bv, bias,
                           q_scale=q_scale)

    @staticmethod
    def packed(op, x, wq, wk, wv, heads, scale, causal, bq, bk, bv, bias, outputs=1,
               q_scale=None):
        # A scaled Q, (x·Wq + bq)·s, is x·(Wq·s) + bq·s: the scale goes into Q's weights.
        factor = 1.0 if q_scale is None else q_scale.reshape(()).astype(np.float64)
        weights = np.concatenate([wq.constant() * factor, wk.constant(), wv.constant()],
                                 axis=1).astype(wq.constant().dtype)
        biases = np.concatenate([np.zeros(w.shape[1], weights.dtype) if b is None
                                 else b.constant() * (factor if w is wq else 1.0)
                                 for w, b in ((wq, bq), (wk, bk), (wv, bv))]
                                ).astype(weights.dtype)
        sizes = {"qkv_hidden_sizes": [wq.shape[1], wk.shape[1], wv.shape[1]]} \
            if wv.shape[1] != wq.shape[1] else {}
        extra = [None, None, bias] if bias is not None else []
        if scale is None:  # MultiHeadAttention's default, 1/√(Q's head size), made explicit
            scale = float(1.0 / np.sqrt(np.float32(wq.shape[1] // heads)))
        return op.Attention(x, op.const(weights), op.const(biases), *extra, _domain=MS,
                            _outputs=outputs, num_heads=heads, scale=scale,
                            unidirectional=causal, **sizes)


class PackedGuardedSelfAttention(PackedSelfAttention):
    """PackedSelfAttention where the NaN rows of the MultiHeadAttention are zeroed from V's
    columns (_zero_nan_rows): V, which the packed Attention computes inside, comes from its
    `present` output ([2, B, N, T, H], K then V), so the guard stays exact."""

    def pattern(self, op, x, wq, wk, wv, bq, bk, bv, bias, axes):
        v = _projection(op, x, wv, bv)
        attention = _self_attention(op, x, wq, wk, wv, bq, bk, bv, bias, v=v)
        zeros = op.Mul(v, Const(0.0))
        column = OneOf(op.ReduceSum(zeros, Var("axes", const=True), keepdims=1),
                       op.ReduceSum(zeros, axes=[1], keepdims=1))
        return op.Where(op.IsNaN(attention), column, attention)

    def check(self, x, wq, wk, wv, bq=None, bk=None, bv=None, axes=None, q_scale=None):
        if axes is not None and axes.constant().reshape(-1).tolist() != [1]:
            return f"the guard sums V over axes {axes.constant().tolist()}, not the keys' [1]"
        problem = super().check(x, wq, wk, wv, bq, bk, bv)
        if problem is None and wv.shape[1] != wq.shape[1]:
            # Attention's present holds K and V alike: [2, B, N, T, H].
            return f"V's width {wv.shape[1]} is not Q's {wq.shape[1]}, and the guard reads V " \
                   "from Attention's present output, which holds K and V of one width"
        return problem

    def rewrite(self, op, x, wq, wk, wv, heads, scale, causal, bq=None, bk=None, bv=None,
                bias=None, q_scale=None, **_):
        out, present = self.packed(op, x, wq, wk, wv, heads, scale, causal, bq, bk, bv, bias,
                                   outputs=2, q_scale=q_scale)
        v = op.Gather(present, op.const(np.array(1)), axis=0)  # [B, N, T, H]
        column = _summed(op, op.Mul(v, op.const(np.array(0, wv.dtype.numpy))), 2)
        # [B, N, 1, H] → [B, 1, N·H], beside out's [B, S, N·H]
        merged = op.Reshape(op.Transpose(column, perm=list(MERGE_Q)),
                            op.const(np.array([0, 0, wv.shape[1]])))
        return op.Where(op.IsNaN(out), merged, out)


@register
class FuseAttention(RulePass):
    name = "FuseAttention"
    description = "scaled dot-product attention (scale, padding/causal masks) into " \
                  "MultiHeadAttention; Q/K/V projections packed into Attention, also where " \
                  "one projection already packs them (ViT's qkv)"
    rules = (WindowMask, ScaledDotProductAttention, UpcastScaledDotProductAttention,
             HalfThroughReshape, PackedGuardedSelfAttention,
             PackedSelfAttention, PackedHeadSlice, PackedProjectionAttention,
             GroupQueryCausalAttention, RotaryOnMergedHeads)


__all__ = ["FuseAttention"]
