"""QuantizeInt4Weights: weight-only block-wise INT4 of MatMul, Gemm, FusedMatMul and Attention's
packed QKV into com.microsoft's MatMulNBits (packing and math in blockwise.py; an Attention
becomes MatMulNBits, a Split and MultiHeadAttention: attention_split.py), and of embedding
tables into GatherBlockQuantized, a tied output head sharing its table's bytes (int4_tables.py).

    A ─ MatMul(A, W[K,N]) ─ Add(b[N]) ─▶      A ─ MatMulNBits(A, q, scales, zero_points, b) ─▶
    A ─ Gemm(A, W, C) {alpha, beta, transB}   (W' = alpha·(transB ? Wᵀ : W), bias = beta·C)
    A ─ FusedMatMul(A, W) {alpha, transB}     (onnxruntime's, as FuseMatMul writes it)

W must be a constant 2-D float matrix of A's dtype with no NaN or Inf, or a Transpose of one;
A of known rank ≥ 2.
Each block is rounded to its fitted range, or, with `int4_method` "gptq", by GPTQ against the
calibration inputs (gptq.py; a tied head's balanced with its table's Gathers: tied_gram). A
constant [N] bias added right after a MatMul becomes the node's bias input; a Gemm's C of shape
[N], [1, N] or a scalar does too, any other C (a full [M, N] matrix) stays a following Add.
Gemm and FusedMatMul with transA are left alone. `quant_skip` names nodes or op types to skip;
the block size is `int4_group_size`; zero points make it asymmetric (more accurate than
symmetric for the skewed columns real weights have). Activations
stay in their float dtype unless `int4_accuracy_level` asks otherwise (4: onnxruntime quantizes
each row of A to int8 on the fly and multiplies in integers, which pays when A is a single row,
as in token-by-token decoding). `int4_embeddings` quantizes embedding tables too.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

from graphopt.ir import DType, Model, Node, Tensor, Value
from graphopt.option_names import option, setting
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import replace_value
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.precision.blockwise import BlockQuant, quantize
from graphopt.passes.precision.gptq import gptq_quantize
from graphopt.passes.precision.casts import constant_data
from graphopt.passes.precision.int4_tables import (
    embedding_tables,
    gathered_after,
    head_weights,
    only_gathered,
    rewrite_gathers,
    tied_gram,
    tied_table,
)
from graphopt.passes.precision.nested import nested_note
from graphopt.passes.precision.policy import Support, check_options
from graphopt.quant import attention_split
from graphopt.quant.attention_split import split_attention
from graphopt.quant.calib_data import read_calibration
from graphopt.quant.calibrate import gram_matrices
from graphopt.quant.select import KEPT_BY_GATE, kept_by_skip, skipped, unmatched_skips
from graphopt.quant.unfused_activations import join_float_activations, split_activations
from graphopt.table import format_bytes

MS = "com.microsoft"
_FLOATS = (DType.FLOAT, DType.FLOAT16)
MIN_BLOCK = 16  # the smallest block onnxruntime's MatMulNBits takes
# A block's range of a NaN or an Inf is NaN, and its scale would make the whole block NaN (GPTQ
# carries it into the column's later blocks too): such a weight stays float, named in a note.
NONFINITE = "B holds NaN or Inf"


@dataclass
class _Plan:
    weight: np.ndarray             # W' [K, N], alpha and transB applied
    bias: np.ndarray | None = None  # [N]: MatMulNBits' bias input
    absorbed: Node | None = None   # the MatMul's bias Add, replaced too
    add_after: Value | None = None  # a Gemm's C that is not a row: an Add after the node
    add_scale: float = 1.0         # beta, applied to a constant add_after


def quantizable(node: Node) -> bool:
    """MatMul, Gemm, onnxruntime's FusedMatMul (FuseMatMul's form of a MatMul that reads a
    transposed weight, such as GPT-2's head reading its token table), or its Attention (whose
    packed QKV weight becomes MatMulNBits before a MultiHeadAttention: attention_split.py)."""
    return (node.op_type in ("MatMul", "Gemm") and node.is_onnx) \
        or (node.op_type in ("FusedMatMul", "Attention") and node.domain == MS)


def _b_data(node: Node) -> np.ndarray | None:
    """The constant data of B, seen through a Transpose of a constant matrix (kept unfolded
    when other nodes read the matrix too, which would then be stored twice)."""
    w = node.input(1)
    if w is None:
        return None
    data = constant_data(w)
    source = w.producer
    if data is None and source is not None and source.op_type == "Transpose" and source.is_onnx:
        matrix = constant_data(source.input(0))
        if matrix is not None and matrix.ndim == 2 and list(source.attr("perm", [1, 0])) == [1, 0]:
            data = matrix.T
    return data


def _plan(node: Node) -> _Plan | str:
    """How to quantize `node`, or why it cannot be."""
    if node.op_type == "Attention":
        return _attention_plan(node)
    a, w = node.input(0), node.input(1)
    data = _b_data(node)
    if data is None or data.ndim != 2:
        return "B is not a constant matrix"
    if not np.isfinite(data).all():
        return NONFINITE
    if a.dtype not in _FLOATS or w.dtype != a.dtype:
        return f"A is {a.dtype.short if a.dtype else 'untyped'}, B {w.dtype.short}"
    if a.shape is None or len(a.shape) < 2:
        return "A's rank is unknown or below 2"
    if node.op_type in ("Gemm", "FusedMatMul"):
        if node.attr("transA", 0) or node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
            return f"{node.op_type} with transA or a batch transpose"
        data = (data.T if node.attr("transB", 0) else data) * np.float32(node.attr("alpha", 1.0))
    n, k, itemsize = data.shape[1], data.shape[0], a.dtype.numpy.itemsize
    if column_bytes(k, MIN_BLOCK, itemsize) >= k * itemsize:
        # A column of K = 1 took 12.5 bytes for its 4: "0.00 MiB → 0.00 MiB (225% larger)".
        return (f"K = {k}: a 4-bit block of {MIN_BLOCK}, its scale and zero point take more "
                "bytes than the column it holds")
    if node.op_type == "Gemm":
        beta, c = node.attr("beta", 1.0), node.input(2)
        if c is None:
            return _Plan(data)
        bias = constant_data(c)
        if bias is not None and bias.size in (1, n) and (bias.ndim < 2 or bias.shape[0] == 1):
            return _Plan(data, np.broadcast_to(bias.reshape(-1) * beta, (n,)))
        if bias is None and beta != 1.0:
            return "Gemm with a computed C and beta != 1"
        return _Plan(data, add_after=c, add_scale=beta)
    out = node.output
    if len(out.uses) == 1 and not out.is_graph_output:
        add, index = out.uses[0]
        other = add.input(1 - index) if add.op_type == "Add" and add.is_onnx else None
        bias = None if other is None else constant_data(other)
        if bias is not None and bias.shape == (n,) and other.dtype == a.dtype:
            return _Plan(data, bias, absorbed=add)
    return _Plan(data)


def _attention_plan(node: Node) -> _Plan | str:
    """An Attention's packed QKV weight and bias as one GEMM's, or why they cannot be."""
    why = attention_split.refusal(node)
    if why is not None:
        return f"Attention: {why}"
    a, w, b = node.input(0), node.input(1), node.input(2)
    data = constant_data(w)
    if data is None or data.ndim != 2 or data.shape[1] % 3:
        return "Attention: its QKV weight is not a constant matrix of three equal parts"
    if not np.isfinite(data).all():
        return NONFINITE
    if a.dtype not in _FLOATS or w.dtype != a.dtype:
        return f"Attention: input is {a.dtype.short if a.dtype else 'untyped'}, QKV weight " \
               f"{w.dtype.short}"
    bias = None if b is None else constant_data(b)
    if b is not None and (bias is None or bias.shape != (data.shape[1],)):
        return "Attention: its QKV bias is not a constant vector"
    return _Plan(data, bias)


@register
class QuantizeInt4Weights(Pass):
    name = "QuantizeInt4Weights"
    description = ("weight-only block-wise INT4: MatMul/Gemm/FusedMatMul with a constant weight "
                   "into com.microsoft::MatMulNBits, embedding tables into GatherBlockQuantized "
                   "(--quantize int4, --int4-group-size, --int4-embeddings, --int4-method)")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        options = ctx.options
        check_options(options)
        result = PassResult()
        infer_shapes(model)  # fusions leave new values untyped until the pipeline's last one
        graph, support = model.graph, Support(ctx.target)
        # -O3's FusedGemm (a MatMul or Gemm with its activation) is no layer _plan takes.
        splits = split_activations(graph, model.opset("") or 0, convs=False)
        block, skip = options.int4_group_size, options.quant_skip
        level = options.int4_accuracy_level
        missing = unmatched_skips(graph, skip, self.name, ctx.source_names, ctx.cut_names)
        if missing:
            ctx.note(missing)
        nested = nested_note(graph, self.name, lambda node: node.op_type in ("MatMul", "Gemm"))
        if nested:
            ctx.note(nested)

        def held_back(node: Node) -> str | None:
            """Why the options keep `node` float, or None."""
            if skipped(node, skip):
                return kept_by_skip()
            return None if ctx.allows(node.op_type, node) else KEPT_BY_GATE

        refused: dict[str, str] = {}  # embedding table -> why it stays float
        tables = {} if not options.int4_embeddings else embedding_tables(
            graph, block, lambda node: held_back(node) is None and support.has(
                "GatherBlockQuantized", MS, node.input(0).dtype), refused)
        before = after = 0
        unsupported: set[str] = set()
        jobs = []
        left: dict[str, int] = {}  # why a MatMul or Gemm stays float -> how many
        nonfinite: list[str] = []  # the weights left float for a NaN or Inf
        kept: Counter = Counter()  # why a layer the pass could take stays float -> how many
        for node in graph:
            if not quantizable(node):
                continue
            held = held_back(node)
            plan = _plan(node)
            if held is not None:
                if not isinstance(plan, str):  # one it could not take anyway goes unmentioned
                    kept[held] += 1
                continue
            if isinstance(plan, str):
                left[plan] = left.get(plan, 0) + 1
                if plan == NONFINITE:
                    nonfinite.append(_weight_name(node))
                continue
            dtype = node.input(0).dtype
            if not support.has("MatMulNBits", MS, dtype):
                unsupported.add(dtype.short)
                continue
            jobs.append((node, plan, dtype, tied_table(tables, plan.weight, dtype)))
        # A tied head's GPTQ weighs its inputs' XᵀX against the identity its table's Gathers
        # read the levels by (tied_gram), when they will read them: a table some other op
        # reads stays float, and its head is then rounded for its own inputs alone.
        grams = _calibration_grams(model, ctx, [node.input(0) for node, _, _, _ in jobs])
        rewritten = [node for node, _, _, _ in jobs]
        # One rounding of a table serves every head tied to it: GPTQ weighs their XᵀX summed.
        head_grams: dict[str, np.ndarray] = {}
        for node, _, _, table in jobs if grams is not None else ():
            if table is not None:
                name = table.value.name
                head_grams[name] = head_grams.get(name, 0.0) + grams[node.input(0).name]
        # Each layer's input by its name now: rewriting a MatMul renames its output (h → h_q4),
        # the input of the next layer when one feeds another.
        gram_keys = {id(node): node.input(0).name for node, _, _, _ in jobs}
        # A weight several layers read (the same effective matrix: one initializer, alpha and
        # transB alike) is rounded once and stored once, GPTQ weighing their XᵀX summed; it
        # had been rounded per layer, stored twice and counted twice in the note.
        weight_keys = {id(node): _weight_key(plan, dtype)
                       for node, plan, dtype, table in jobs if table is None}
        shared_grams: dict[tuple, np.ndarray] = {}
        for node, _, _, table in jobs if grams is not None else ():
            if table is None:
                key = weight_keys[id(node)]
                shared_grams[key] = shared_grams.get(key, 0.0) + grams[gram_keys[id(node)]]
        stored: dict[tuple, tuple] = {}  # weight key → (its initializers, its block)
        refitted: dict[int, int] = {}  # smaller block → weights that got it
        blocks: set[int] = set()  # the blocks the quantized weights and tables use
        singular = 0  # weights GPTQ could not take
        for node, plan, dtype, table in jobs:
            key = weight_keys.get(id(node))  # None for a tied head
            if key in stored:
                weights, fitted = stored[key]
                _rewrite(graph, node, plan, fitted, dtype, weights, level)
                result.count(f"{node.op_type}_quantized")
                result.count("weight_shared")
                continue
            before += plan.weight.size * dtype.bits // 8
            if table is not None:
                shared = table.quant is not None
                quant = None
                if grams is not None and not shared:
                    gram = head_grams[table.value.name]
                    if gathered_after(table, rewritten):
                        gram = tied_gram(gram)
                    quant = _gptq(plan.weight, gram, table.block, dtype)
                    singular += quant is None
                weights = head_weights(graph, table, quant)
                after += 0 if shared else table.quant.nbytes
                blocks.add(table.block)
                _rewrite(graph, node, plan, table.block, dtype, weights, level)
                result.count("tied_head")
                continue
            fitted = block_for(plan.weight.shape[0], block, dtype.bits // 8)
            blocks.add(fitted)
            if fitted != block:
                refitted[fitted] = refitted.get(fitted, 0) + 1
            quant = None
            if grams is not None:
                quant = _gptq(plan.weight, shared_grams[key], fitted, dtype)
                singular += quant is None
            if quant is None:
                quant = quantize(plan.weight, fitted, symmetric=False, scale_dtype=dtype.numpy)
            weights = _initializers(graph, node.input(1), quant)
            stored[key] = (weights, fitted)
            _rewrite(graph, node, plan, fitted, dtype, weights, level)
            after += quant.nbytes
            result.count(f"{node.op_type}_quantized")
        embedded = 0
        tied: list[int] = []  # of each quantized table that heads share, how many heads
        for table in tables.values():
            if not only_gathered(table):
                refused[table.value.name] = "is read by other ops too (it would be stored " \
                                            "twice)"
                continue
            embedded += 1
            before += table.data.nbytes
            shared = table.quant is not None
            if shared:
                tied.append(table.heads)
            rewrite_gathers(graph, table)
            blocks.add(table.block)
            after += 0 if shared else table.quant.nbytes
            result.count("Gather_quantized", len(table.gathers))
        join_float_activations(graph, splits, {id(node) for node, _, _, _ in jobs})
        for value in list(graph.initializers.values()):
            if not value.uses and not value.is_graph_output and not value.is_input:
                graph.remove_initializer(value)
        if result.changed:
            model.opset_imports.setdefault(MS, 1)
            ctx.note(_summary(result.stats, embedded, tied, before, after, sorted(blocks))
                     + _float_weights_left(graph))
            # A weight too short to pack is a choice a user may not expect, beside weights
            # that did pack (unlike a MatMul of two activations, which none would).
            kept.update({why: n for why, n in left.items() if why.startswith("K = ")})
        elif not unsupported:  # a compile that quantized nothing says why
            reasons = sorted(left.items()) + kept.most_common()
            kept.clear()  # said here
            why = "; ".join(f"{n} × {reason}" for reason, n in reasons)
            # Its MatMuls in If or Loop bodies, which the note before names, are MatMuls too.
            where = "the main graph" if nested else "the model"
            ctx.note("QuantizeInt4Weights quantized nothing: " + (
                f"no MatMul or Gemm weight it takes ({why})" if why else
                f"{where} has no MatMul or Gemm with a constant weight (int4 is weight-only "
                "for those; Conv weights stay float)"))
        if kept:
            ctx.note("QuantizeInt4Weights kept in float: " + "; ".join(
                f"{n} × {why}" for why, n in kept.most_common()))
        if nonfinite:
            ctx.note(_nonfinite_note(nonfinite))
        if options.int4_embeddings and (refused or not embedded):
            ctx.note(_tables_note(refused, embedded))
        if refitted:
            ctx.note(f"QuantizeInt4Weights: block {block} would pad K to a multiple of it; "
                     + ", ".join(f"{n} weight(s) use {b}" for b, n in sorted(refitted.items()))
                     + ", which packs them smaller")
        if singular:
            ctx.note(f"QuantizeInt4Weights: {singular} weight(s) rounded without GPTQ: their "
                     "inputs' Gram matrix stayed singular after damping")
        if unsupported:
            ctx.note("QuantizeInt4Weights: the target has no MatMulNBits kernel for "
                     f"{', '.join(sorted(unsupported))} activations; those weights stay float")
        return result


def _weight_key(plan: _Plan, dtype: DType) -> tuple:
    """What makes two layers' weights one: the effective matrix's bytes (alpha and transB
    applied) in the layer's dtype (a Gemm's alpha made a float16 weight float32)."""
    weight = np.ascontiguousarray(plan.weight, dtype=dtype.numpy)
    return weight.shape, dtype, hashlib.sha256(weight.tobytes()).digest()


def _gptq(weight: np.ndarray, gram: np.ndarray, block: int, dtype: DType) -> BlockQuant | None:
    """GPTQ's rounding of `weight` against `gram`, or None when that stays singular."""
    try:
        return gptq_quantize(weight, gram, block, dtype.numpy)
    except np.linalg.LinAlgError:
        return None


def _weight_name(node: Node) -> str:
    """The name of `node`'s weight: the constant a Transpose of it reads, if one does."""
    w = node.input(1)
    source = w.producer
    if source is not None and source.op_type == "Transpose" and source.inputs:
        return source.input(0).name
    return w.name


def _nonfinite_note(names: list[str]) -> str:
    """Which weights stay float because they hold NaN or Inf (the first three)."""
    named = sorted(set(names))
    listed = ", ".join(f"%{name}" for name in named[:3])
    more = f" and {len(named) - 3} more" if len(named) > 3 else ""
    return (f"QuantizeInt4Weights: {len(named)} weight(s) hold NaN or Inf and stay float: "
            f"{listed}{more} (a 4-bit block's scale would be NaN, and every weight in it)")


def _tables_note(refused: dict[str, str], embedded: int) -> str:
    """What int4_embeddings left float: each table with its reason (the first three), or that
    the model has none."""
    flag = option("int4_embeddings")
    if not refused:
        return f"QuantizeInt4Weights: {flag}: the model has no embedding table (a constant " \
               "float matrix that Gathers index along its rows)"
    named = sorted(refused.items())
    listed = "; ".join(f"%{name} {why}" for name, why in named[:3])
    more = f"; {len(named) - 3} more" if len(named) > 3 else ""
    return (f"QuantizeInt4Weights: {flag}: {len(named)} embedding table(s) stay float"
            f"{'' if embedded else ', none quantized'}: {listed}{more}")


def _calibration_grams(model: Model, ctx: PassContext, inputs: list[Value]) -> dict | None:
    """The Gram matrices GPTQ weighs by, of the MatMul inputs over the calibration data (for a
    shape profile the data does not fit, those a profile it fits measured: shared_stats.py);
    None when the method is plain rounding."""
    if ctx.options.int4_method != "gptq" or not inputs:
        return None
    values = list({v.name: v for v in inputs}.values())
    shared, mismatch = ctx.shared_stats, ctx.calibration_mismatch
    if mismatch is not None:
        if shared is None or not shared.ready:
            raise mismatch
        return shared.lookup_grams([v.name for v in values], model.graph, str(mismatch))
    data = read_calibration(ctx.options.calibration, model.graph)
    grams, rows, nonfinite = gram_matrices(model, values, data)
    if shared is not None:
        shared.keep_grams(grams, model.graph)
    if nonfinite:
        # Left out of the sums, as int8's ranges leave them out; int8 says so, and so does this.
        name = sorted(nonfinite)[0]
        ctx.note(f"QuantizeInt4Weights: {setting('int4_method', 'gptq')}: rows holding NaN or "
                 f"Inf were left out of {len(nonfinite)} layer input(s)' sums (e.g. %{name}: "
                 f"{nonfinite[name]} of {nonfinite[name] + rows[name]} rows); check the "
                 "calibration data")
    short = sorted(name for name, gram in grams.items() if rows[name] < len(gram))
    if short:
        # XᵀX then has rank below K: GPTQ fits the rounding to the inputs' subspace alone.
        ctx.note(f"QuantizeInt4Weights: {setting('int4_method', 'gptq')}: the calibration data gives fewer "
                 f"rows than features for {len(short)} layer input(s) (e.g. %{short[0]}: "
                 f"{rows[short[0]]} for {len(grams[short[0]])}); more samples would fit them "
                 "better")
    return grams


def _summary(stats: dict, tables: int, tied: list[int], before: int, after: int,
             blocks: list[int]) -> str:
    """The note on what was quantized and the bytes it saved: `tables` quantized, those
    shared with heads by their heads in `tied` (stats' tied_head also counts heads whose
    table stayed float)."""
    layers = sum(stats.get(k, 0) for k in ("MatMul_quantized", "Gemm_quantized",
                                           "FusedMatMul_quantized", "Attention_quantized",
                                           "tied_head"))
    weights = layers - stats.get("weight_shared", 0)
    parts = [f"{weights} weight(s)" + (f" read by {layers} layers" if layers > weights else "")
             ] if weights else []
    if tables:
        heads = sum(tied)
        shared = "a tied output head" if heads == len(tied) else f"{heads} tied output heads"
        parts.append(f"{tables} embedding table(s)"
                     + (f", {len(tied)} shared with {shared}" if tied else ""))
    change = (f"{100 * (1 - after / before):.0f}% smaller" if after <= before
              else f"{100 * (after / before - 1):.0f}% larger")
    return (f"QuantizeInt4Weights: {' and '.join(parts)}, {before / 2**20:.2f} MiB → "
            f"{after / 2**20:.2f} MiB ({change}; block{'s' if len(blocks) > 1 else ''} "
            f"{', '.join(map(str, blocks))}, with scales and zero points)")


def _float_weights_left(graph) -> str:
    """What the summary's figures leave out: the bytes of float weights (constants of rank ≥ 2)
    that stay as they were, by the ops that read them, e.g. "; 2.10 MiB of float weights
    stay (Conv ×12, Gather)"; "" when none do. In units that show a small amount (a few
    hundred bytes had read "0.00 MiB")."""
    left, readers = 0, {}
    for value in graph.initializers.values():
        tensor = value.const
        if value.dtype not in _FLOATS or tensor is None or len(tensor.shape) < 2 \
                or _block_scales(value):
            continue
        left += tensor.nbytes
        for reader, _ in value.uses:
            readers[reader.op_type] = readers.get(reader.op_type, 0) + 1
    if not left:
        return ""
    ops = sorted(readers.items(), key=lambda item: (-item[1], item[0]))
    named = ", ".join(op if n == 1 else f"{op} ×{n}" for op, n in ops[:4])
    more = f", +{len(ops) - 4} op type(s)" if len(ops) > 4 else ""
    return f"; {format_bytes(left)} of float weights stay ({named}{more})"


def _block_scales(value) -> bool:
    """Whether `value` is the pass's own scales or zero points (an embedding table's are
    [rows, blocks]): counted as float weights left, they read as a table the pass had kept."""
    return bool(value.uses) and all(
        reader.domain == MS and reader.op_type in ("MatMulNBits", "GatherBlockQuantized")
        and index in (2, 3) for reader, index in value.uses)


def block_for(k: int, group: int, scale_bytes: int) -> int:
    """The block for a weight of `k` rows: `group`, or a smaller power of 2 (≥ 16) when that
    stores fewer bytes per column. K is zero-padded to a whole number of blocks, so a block
    that does not divide K (or exceeds it) packs padding: K = 768 in blocks of 512 stores
    1024 rows, in blocks of 256 exactly 768. Smaller blocks are never less accurate."""
    candidates = [b for b in (1 << e for e in range(4, group.bit_length())) if b <= group]
    return min(reversed(candidates), key=lambda block: column_bytes(k, block, scale_bytes))


def column_bytes(k: int, block: int, scale_bytes: int) -> float:
    """What one column of `k` rows takes in blocks of `block`: 4-bit values (K zero-padded to
    whole blocks), a scale and a 4-bit zero point per block."""
    return -(-k // block) * (block / 2 + scale_bytes + 0.5)


def _initializers(graph, w: Value, quant) -> tuple[Value, Value, Value | None]:
    """MatMulNBits' B, scales and zero points for weight `w`, as new initializers."""
    return (graph.make_initializer(f"{w.name}_q4", quant.packed),
            graph.make_initializer(f"{w.name}_scales", quant.scales),
            None if quant.zero_points is None
            else graph.make_initializer(f"{w.name}_zero_points", quant.zero_points))


def _nbits(graph, node: Node, plan: _Plan, block: int, dtype: DType, weights,
           accuracy_level: int, out: Value) -> Node:
    """MatMulNBits of `node`'s input by `weights` (+ the plan's bias) into `out`."""
    k, n = plan.weight.shape
    inputs = [node.input(0), *weights]
    if plan.bias is not None:
        inputs += [None, graph.make_initializer(f"{node.input(1).name}_bias",
                                                Tensor(np.asarray(plan.bias, dtype.numpy)))]
    attrs = {"K": k, "N": n, "bits": 4, "block_size": block}
    if accuracy_level:
        attrs["accuracy_level"] = accuracy_level
    return Node("MatMulNBits", inputs, attrs, domain=MS, outputs=[out],
                name=graph.fresh_node_name(f"{node.name or 'matmul'}_q4"))


def _rewrite(graph, node: Node, plan: _Plan, block: int, dtype: DType, weights,
             accuracy_level: int) -> None:
    """Replace `node` (and the bias Add it absorbs) by MatMulNBits reading `weights`; an
    Attention by MatMulNBits, a Split and a MultiHeadAttention."""
    if node.op_type == "Attention":
        split_attention(graph, node, lambda qkv: _nbits(graph, node, plan, block, dtype,
                                                        weights, accuracy_level, qkv))
        return
    replaced = plan.absorbed or node
    out = Value(graph.fresh_name(f"{replaced.output.name}_q4"), dtype, replaced.output.shape)
    q_node = _nbits(graph, node, plan, block, dtype, weights, accuracy_level, out)
    graph.insert_before(node, q_node)
    if plan.add_after is not None:
        c = plan.add_after
        if plan.add_scale != 1.0:
            c = graph.make_initializer(f"{c.name}_beta", Tensor(
                (constant_data(c) * plan.add_scale).astype(dtype.numpy)))
        summed = Value(graph.fresh_name(f"{node.output.name}_bias"), dtype, node.output.shape)
        graph.insert_after(q_node, Node("Add", [out, c], outputs=[summed],
                                        name=graph.fresh_node_name(f"{q_node.name}_add")))
        out = summed
    # `out` is a fresh node output of the same dtype, so it can always take over a graph
    # output's name.
    assert replace_value(replaced.output, out), replaced
    w = node.input(1)
    for dead in (plan.absorbed, node):
        if dead is not None:
            graph.remove(dead)
    if w.producer is not None and not w.uses and not w.is_graph_output:
        graph.remove(w.producer)  # the Transpose _b_data saw through
