"""InferShapes: onnx.shape_inference over the IR, results kept on values."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

import onnx
from onnx import ModelProto, TypeProto, ValueInfoProto

from graphopt.ir import DType, Model
from graphopt.ir.onnx_export import to_onnx, without_tree_tables
from graphopt.ir.onnx_io import graph_protos, read_type
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.disputed_shapes import forget_disputed_sizes, hide_from_inference
from graphopt.passes.loop_lengths import fill_scan_lengths
from graphopt.passes.ml_types import ML_TYPED_BY_RULE, declare_spec_types
from graphopt.passes.qlinear_types import QLINEAR_TYPED_BY_RULE, broadcast_shape
from graphopt.protowire import varint
from graphopt.warning_scope import warnings_as

# Initializers at most this large keep their data during inference so that data propagation
# (Shape→Gather→Concat→Reshape) can see them; larger ones go in as typed inputs to avoid copying
# weights into a second protobuf.
DATA_PROP_LIMIT = 4096
# onnx's data propagation treats every 1-D tensor as a shape and spells it out element by
# element (~140 bytes and ~0.3 µs each): GPT-2 pinned to 1e8 tokens took 14 GB and 95 s in
# inference. A Range with constant bounds longer than this gets its limit as a typed input
# (its length stays unknown), and a model with a longer 1-D tensor is inferred without data
# propagation.
VECTOR_PROP_LIMIT = 1 << 16


def weightless_proto(model: Model, value_infos: bool = True) -> ModelProto:
    """The model with weights above DATA_PROP_LIMIT bytes as typed inputs; without the
    intermediate values' types when `value_infos` is False (with them, the nodes whose size
    onnxruntime disputes are hidden from inference: see disputed_shapes)."""
    with without_tree_tables():
        proto = to_onnx(model, weights_as_inputs_above=DATA_PROP_LIMIT, value_infos=value_infos)
    if proto.ir_version < 4:
        proto.ir_version = 4  # lets initializers stay out of the input list for inference
    _unbind_overridable(model, proto.graph)
    _hide_long_ranges(proto.graph)
    if value_infos:
        hide_from_inference(model, proto)
    for graph in graph_protos(proto.graph):
        declare_spec_types(graph)
    return proto


def _unbind_overridable(model: Model, graph: onnx.GraphProto) -> None:
    """Drop the data of the initializers a caller may override (graph inputs with a default):
    inference would size from the default (a Reshape to it then looks like a no-op, and its
    Shape folds), where onnxruntime takes whatever the caller feeds."""
    names = set(model.graph.overridable_inputs())
    if names:
        kept = [t for t in graph.initializer if t.name not in names]
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _hide_long_ranges(graph: onnx.GraphProto) -> None:
    """Make the limit of every Range longer than VECTOR_PROP_LIMIT a typed input (see there)."""
    initializers = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Range" or node.domain not in ("", "ai.onnx") or len(node.input) != 3:
            continue
        if not all(name in initializers for name in node.input):
            continue
        start, limit, delta = (onnx.numpy_helper.to_array(initializers[name]).reshape(-1)
                               for name in node.input)
        if start.size != 1 or limit.size != 1 or delta.size != 1 or delta[0] == 0:
            continue
        if (float(limit[0]) - float(start[0])) / float(delta[0]) <= VECTOR_PROP_LIMIT:
            continue
        tensor = initializers.pop(node.input[1])
        graph.initializer.remove(tensor)
        graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                              list(tensor.dims)))


# onnxruntime contrib ops whose first output has their first input's type and shape. ONNX shape
# inference knows no contrib op, so without this everything after one (a model fused by
# onnxruntime's transformer optimizer, say) stays untyped: not quantized, not planned.
SAME_AS_INPUT = frozenset({"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd",
                           "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
                           "RotaryEmbedding"})
# Inference reruns at most this often to carry types past contrib ops: a round carries them
# past every contrib op whose input it typed, so a chain of layers takes a round a layer.
_CONTRIB_ROUNDS = 64


def infer_shapes(model: Model) -> int:
    """Run ONNX shape inference and copy the inferred types onto node outputs; past the
    contrib ops ONNX cannot type and _carry_through_contrib_ops can, and past nodes whose size
    onnxruntime computes otherwise (disputed_shapes), run it again from their outputs.
    Returns how many values gained or changed type information."""
    changed = 0
    for _ in range(_CONTRIB_ROUNDS):
        proto = weightless_proto(model)
        try:
            with warnings_as("ignore"):
                inferred = onnx.shape_inference.infer_shapes(
                    proto, check_type=False, strict_mode=False,
                    data_prop=not _long_vectors(proto.graph))
        except Exception:  # noqa: BLE001 - inference is best effort; passes check what they rely on
            return changed
        changed += record_types(model, inferred)
        # A node whose size onnxruntime and ONNX dispute forgets the sizes inferred from
        # it: the next round derives them from its unknown ones, which inference keeps.
        carried = _carry_through_contrib_ops(model) + forget_disputed_sizes(model) \
            + fill_scan_lengths(model)
        if not carried:
            return changed
        changed += carried
    return changed


# Default-domain ops ONNX's inference leaves untyped whose output is their input's type and
# shape: GroupNormalization (a function op), ImageScaler (an experimental op of opsets 1-9 that
# onnxruntime still runs: an opset-8 model's static tensors after one had been called dynamic).
_UNINFERRED_SAME_AS_INPUT = frozenset({"GroupNormalization", "ImageScaler"})

# Skip(Simplified)LayerNormalization's fourth output, the sum of input, skip and bias, which a
# residual path reads on: its first input's type and shape too.
_SKIP_SUM_OUTPUT = 3
# Attention's second output, `present`: K and V in [2, B, N, T, H], which
# PackedGuardedSelfAttention reads V from.
_PRESENT_OUTPUT = 1


def _carry_through_contrib_ops(model: Model) -> int:
    """Type the first output of each contrib op InferShapes knows from its inputs, where that
    says more than the output carries (nothing, or a model's own value info with symbolic dims
    where the inputs are now static). Returns how many outputs it typed."""
    typed = 0
    for graph in model.graph.all_graphs():
        for node in graph.nodes():
            source = node.inputs[0] if node.inputs else None
            if source is None or source.dtype is None:
                continue
            if node.op_type in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization") \
                    and node.domain == "com.microsoft":
                typed += _type_outputs(node, [(_SKIP_SUM_OUTPUT, source.dtype, source.shape)])
            if node.op_type == "Attention" and node.domain == "com.microsoft":
                typed += _type_outputs(node, [(_PRESENT_OUTPUT, source.dtype,
                                               _present_shape(node))])
            if node.domain == "com.microsoft" and node.op_type in _TYPED_BY_RULE:
                typed += _type_outputs(node, _TYPED_BY_RULE[node.op_type](node))
                continue
            if node.domain == "ai.onnx.ml" and node.op_type in ML_TYPED_BY_RULE:
                typed += _type_outputs(node, ML_TYPED_BY_RULE[node.op_type](node))
                continue
            out = node.outputs[0] if node.outputs else None
            if out is None or out.type_proto is not None:
                continue
            dtype, shape = source.dtype, source.shape
            if node.domain in ("", "ai.onnx") and node.op_type in _UNINFERRED_SAME_AS_INPUT:
                pass  # onnx 1.23 infers nothing for these: Y is X's type and shape
            elif node.domain in ("", "ai.onnx"):
                # onnxruntime's own RMSNorm in the default domain (its optimizer's and
                # FuseLayerNorm's below opset 23): Y has X's shape and the scale's dtype.
                if node.op_type != "SimplifiedLayerNormalization" or len(node.inputs) < 2 \
                        or node.inputs[1] is None or node.inputs[1].dtype is None:
                    continue
                dtype, shape = node.inputs[1].dtype, source.shape
            elif node.domain != "com.microsoft":
                continue
            elif node.op_type in SAME_AS_INPUT:
                shape = source.shape
            elif node.op_type in ("Attention", "MultiHeadAttention"):
                shape = _attention_shape(node)
            elif node.op_type == "FusedMatMul":
                shape = _fused_matmul_shape(node)
            elif node.op_type == "FusedGemm":
                shape = _fused_gemm_shape(node)
            elif node.op_type == "FusedConv":
                shape = _fused_conv_shape(node)
            else:
                continue
            if _knows_more(dtype, shape, out):
                out.dtype, out.shape = dtype, shape
                typed += 1
    return typed


def _embed_layer_norm_types(node) -> list:
    """EmbedLayerNormalization(input_ids [B, S], …, word_embedding [V, H], …): the embedding
    [B, S, H] in the table's dtype, mask_index int32 [B], and the optional sum of embeddings
    before the normalization, like the first."""
    ids, table = node.inputs[0], node.input(2)
    if table is None or table.dtype is None or ids.shape is None or len(ids.shape) != 2 \
            or table.shape is None or len(table.shape) != 2:
        return []
    embedded = (*ids.shape, table.shape[1])
    return [(0, table.dtype, embedded), (1, DType.INT32, (ids.shape[0],)),
            (2, table.dtype, embedded)]


# onnxruntime contrib ops typed by a rule of their own: op -> [(output index, dtype, shape)].
def _matmul_nbits_types(node) -> list:
    """MatMulNBits(A [..., K], B packed, scales, …) with attribute N: A's leading dims and N,
    in A's dtype (a 4-bit GEMM with a bias input was left untyped, and fp16 kept it float32)."""
    a, n = node.inputs[0], node.attr("N")
    if a.dtype is None or not isinstance(n, int):
        return []
    shape = None if a.shape is None or not a.shape else (*a.shape[:-1], n)
    return [(0, a.dtype, shape)]


def _group_query_attention_types(node) -> list:
    """GroupQueryAttention's output [B, S, N·H] in the query's dtype: the query's own width, or
    N/(N + 2·N_kv) of it where Q, K and V come packed (no key input); without a past, its
    present keys and values [B, N_kv, S, H]. With a past their length depends on the past
    buffer's, which the model's declarations say (a graph output's)."""
    query, heads, kv_heads = node.inputs[0], node.attr("num_heads"), node.attr("kv_num_heads")
    if query.dtype is None or not isinstance(heads, int) or not isinstance(kv_heads, int):
        return []
    shape = query.shape
    if shape is None or len(shape) != 3 or not isinstance(shape[2], int):
        return [(0, query.dtype, None if shape is None or len(shape) != 3
                 else (shape[0], shape[1], None))]
    packed = node.input(1) is None
    width = shape[2] * heads // (heads + 2 * kv_heads) if packed else shape[2]
    types = [(0, query.dtype, (shape[0], shape[1], width))]
    if node.input(3) is None and width % heads == 0:  # no past: the present is the new keys
        present = (shape[0], kv_heads, shape[1], width // heads)
        types += [(1, query.dtype, present), (2, query.dtype, present)]
    return types


def _dynamic_quantize_lstm_types(node) -> list:
    """onnxruntime's DynamicQuantizeLSTM (its dynamic int8 quantizer's LSTM, ddddocr's): as
    LSTM, Y [seq, directions, batch, hidden] and Y_h, Y_c [directions, batch, hidden], in X's
    dtype."""
    x, hidden = node.inputs[0], node.attr("hidden_size")
    if x is None or x.dtype is None or not isinstance(hidden, int) or x.shape is None \
            or len(x.shape) != 3:
        return []
    direction = node.attr("direction", "forward")
    if isinstance(direction, bytes):
        direction = direction.decode()
    state = (2 if direction == "bidirectional" else 1, x.shape[1], hidden)
    return [(0, x.dtype, (x.shape[0], *state)), (1, x.dtype, state), (2, x.dtype, state)]


_TYPED_BY_RULE = {
    "DynamicQuantizeLSTM": _dynamic_quantize_lstm_types,
    "EmbedLayerNormalization": _embed_layer_norm_types,
    "GroupQueryAttention": _group_query_attention_types,
    "MatMulNBits": _matmul_nbits_types,
    **QLINEAR_TYPED_BY_RULE,
}


def _type_outputs(node, types: list) -> int:
    typed = 0
    for index, dtype, shape in types:
        out = node.outputs[index] if index < len(node.outputs) else None
        if out is not None and out.type_proto is None and _knows_more(dtype, shape, out):
            out.dtype, out.shape = dtype, shape
            typed += 1
    return typed


def _knows_more(dtype, shape, value) -> bool:
    """Whether (dtype, shape) tells more than `value` carries: a dtype where it has none, a
    rank where it has none, or more static dims of the same rank. Strictly more, so that
    rounds of inference end."""
    if value.dtype is None:
        return True
    if dtype != value.dtype or shape is None:
        return False
    if value.shape is None:
        return True
    static = sum(isinstance(d, int) for d in shape)
    return len(shape) == len(value.shape) and static > sum(isinstance(d, int)
                                                           for d in value.shape)


def _fused_matmul_shape(node) -> tuple | None:
    """The shape of FusedMatMul(A, B): MatMul's, after transA/transB swap the last two axes of
    A and B (None with transBatch, 1-D operands or an unknown or unbroadcastable batch)."""
    a, b = (v.shape if v is not None else None for v in node.inputs[:2])
    if a is None or b is None or len(a) < 2 or len(b) < 2 \
            or node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
        return None
    rows = a[-1] if node.attr("transA", 0) else a[-2]
    cols = b[-2] if node.attr("transB", 0) else b[-1]
    batch = broadcast_shape(a[:-2], b[:-2])
    return None if batch is None else (*batch, rows, cols)


def _fused_gemm_shape(node) -> tuple | None:
    """The shape of FusedGemm(A, B, C): Gemm's [M, N], M from A and N from B after transA and
    transB (None for operands not 2-D)."""
    a, b = (v.shape if v is not None else None for v in node.inputs[:2])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    return (a[1] if node.attr("transA", 0) else a[0], b[0] if node.attr("transB", 0) else b[1])


def _fused_conv_shape(node) -> tuple | None:
    """FusedConv(X, W, B, Z)'s output shape, a Conv's: [N, M, spatial sizes] (onnxruntime's
    offline optimizer writes it at its extended level; untyped, everything after it had lost
    its shape, and a static CNN so saved went to the host on an NPU target whole)."""
    x, w = (v.shape if v is not None else None for v in node.inputs[:2])
    if x is None or w is None or len(x) < 3 or len(w) != len(x) \
            or not all(isinstance(d, int) for d in (*x[2:], *w[2:])):
        return None
    spatial = len(x) - 2
    kernel = list(node.attr("kernel_shape") or w[2:])
    strides = list(node.attr("strides") or [1] * spatial)
    dilations = list(node.attr("dilations") or [1] * spatial)
    pads = list(node.attr("pads") or [0] * (2 * spatial))
    auto_pad = node.attr("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    sizes = []
    for axis in range(spatial):
        size, span = x[2 + axis], dilations[axis] * (kernel[axis] - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            sizes.append(-(-size // strides[axis]))
        else:
            padded = size if auto_pad == "VALID" else size + pads[axis] + pads[axis + spatial]
            sizes.append((padded - span) // strides[axis] + 1)
    return (x[0], w[0], *sizes)


def _attention_shape(node) -> tuple | None:
    """[B, S, value width] of an Attention (packed weights: a third of their columns, or
    qkv_hidden_sizes[2]) or a MultiHeadAttention of 3-D query and value; None when unknown."""
    query = node.inputs[0].shape
    if query is None or len(query) != 3:
        return None
    if node.op_type == "Attention":
        sizes = node.attr("qkv_hidden_sizes")
        weight = node.input(1).shape if node.input(1) is not None else None
        width = sizes[2] if sizes else weight[1] // 3 if weight and isinstance(weight[1], int) \
            else None
    else:
        value = node.input(2).shape if node.input(2) is not None else None
        width = value[2] if value is not None and len(value) == 3 else None
    return None if width is None else (query[0], query[1], width)


def _present_shape(node) -> tuple | None:
    """[2, B, N, S, H] of an Attention's `present` (K then V) without past state; None when
    unknown, or when K and V differ in width and so cannot share one tensor."""
    query, heads = node.inputs[0].shape, node.attr("num_heads")
    if query is None or len(query) != 3 or not isinstance(heads, int) or heads <= 0 \
            or node.input(4) is not None:
        return None
    sizes = node.attr("qkv_hidden_sizes")
    weight = node.input(1).shape if node.input(1) is not None else None
    if sizes:
        width = sizes[1] if sizes[1] == sizes[2] else None
    else:
        width = weight[1] // 3 if weight and isinstance(weight[1], int) else None
    if width is None or width % heads:
        return None
    return (2, query[0], heads, query[1], width // heads)


def _long_vectors(graph: onnx.GraphProto) -> bool:
    """Whether a typed value of `graph` is a 1-D tensor longer than VECTOR_PROP_LIMIT."""
    for info in (*graph.input, *graph.output, *graph.value_info):
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else ()
        if len(dims) == 1 and dims[0].dim_value > VECTOR_PROP_LIMIT:
            return True
    return False


def record_types(model: Model, inferred: ModelProto, static_only: bool = False) -> int:
    """Copy the types ONNX inferred for `model` (`inferred`: its exported, inferred proto) onto
    the values nodes compute (see record_type_bytes). Returns how many values gained or changed
    type information."""
    return record_type_bytes(model, inferred_types(model, inferred), static_only)


def inferred_types(model: Model, inferred: ModelProto) -> dict[str, bytes]:
    """Value name -> serialized TypeProto of every typed value info and output of `inferred`
    (`model` exported and inferred)."""
    types: dict[str, bytes] = {}
    # Walking 100k node protos for subgraphs costs more than asking the IR whether any exist.
    nested = next(islice(model.graph.all_graphs(), 1, None), None) is not None
    holders = []  # the types that can hold element types: sequences, maps, optionals
    for graph_proto in graph_protos(inferred.graph) if nested else (inferred.graph,):
        for infos in (graph_proto.value_info, graph_proto.output):
            for info in infos:
                raw = _type_bytes(info)
                if raw is not None:
                    types[info.name] = raw
                    if raw[:1] in _HOLDER_TAGS:
                        holders.append(raw)
    symbols = _element_symbols(holders)
    if symbols:
        marks = [symbol.encode() for symbol in symbols]
        for name, raw in types.items():
            if any(mark in raw for mark in marks):
                types[name] = _without_symbols(raw, symbols)
    return types


def record_type_bytes(model: Model, types: dict[str, bytes], static_only: bool = False) -> int:
    """Copy inferred types (value name -> serialized TypeProto) onto the values nodes compute,
    where they know at least as much as the value does; with `static_only`, only tensor types
    of fully static shape (an inference that dropped the declared value infos names unknown
    dims afresh, and must not rename a declared "batch"). Returns how many values gained or
    changed type information."""
    # A model has a few distinct tensor types: each is read (and judged static) once.
    read: dict[bytes, tuple[tuple, bool]] = {}
    changed = 0
    for value in model.graph.all_values():
        if value.producer is None:
            continue
        raw = types.get(value.name)
        if raw is None:
            continue
        known = read.get(raw)
        if known is None:
            new = read_type(TypeProto.FromString(raw))
            known = (new, _static(new))
            if new[2] is None:  # a non-tensor type is a TypeProto of each value's own
                read[raw] = known
        new, static = known
        if static_only and not static:
            continue
        before = (value.dtype, value.shape, value.type_proto)
        new = _named_sizes_kept(new, value.shape)
        if _more_specific(new, before):
            value.dtype, value.shape, value.type_proto = new
            if new != before:
                changed += 1
    return changed


def drop_unfounded_declarations(model: Model, types: dict[str, bytes]) -> int:
    """Undo the static dims a model's own value infos declare for computed values where
    inference from the inputs finds a dim that is not that number (symbolic, unknown, or
    another size): a tracer's leftover, [3, 7] for what is [3, N]. Folding Shape on it would
    bake in 7, and onnxruntime itself gives the declared or the computed size depending on its
    optimization level. A declared rank the node does not compute ([1, 24] for a Softmax's
    [1, 2, 3, 4]) gives way to the inferred shape whole, a declaration with static dims where
    inference finds no rank is dropped (an intermediate's, or a graph output's that a node
    reads), and a declared dtype the node does not compute gives way to the inferred one.
    Returns how many values were corrected."""
    corrected = 0
    read: dict[bytes, tuple] = {}  # a model has a few distinct types: read each once
    for value in model.graph.all_values():
        raw = types.get(value.name) if value.producer is not None else None
        if raw is None or value.type_proto is not None:
            continue
        if raw not in read:
            read[raw] = read_type(TypeProto.FromString(raw))
        dtype, inferred, type_proto = read[raw]
        if type_proto is None and dtype is not None and value.dtype is not None \
                and dtype != value.dtype:  # a stale dtype: onnxruntime refuses the node
            value.dtype = dtype
            corrected += 1
        if value.shape is None:
            continue
        if inferred is None:
            if type_proto is None and any(type(d) is int for d in value.shape) \
                    and (value.uses or not value.is_graph_output):
                # Not even the rank follows from the inputs (a Squeeze without axes of
                # [N, 1, 4], traced at N = 1 as [4]): the whole declaration is unfounded.
                # A graph output nothing reads keeps it as its signature, which
                # output_declarations corrects; one a Shape reads would fold from it. Such
                # an output keeps its rank, dims unknown: onnx.checker refuses a main graph's
                # output without one, and the declaration is the only rank there is.
                keep_rank = value.is_graph_output and value.graph is model.graph
                value.shape = (None,) * len(value.shape) if keep_rank else None
                corrected += 1
            continue
        if len(inferred) != len(value.shape):  # a declared rank the node does not compute
            value.shape = tuple(inferred)       # (onnxruntime warns, and returns what it
            corrected += 1                      # computes): a Shape of it must not fold
            continue
        if all(type(d) is not int for d in value.shape):
            continue
        fixed = tuple(found if type(declared) is int and found != declared else declared
                      for declared, found in zip(value.shape, inferred))
        if fixed != tuple(value.shape):
            value.shape = fixed
            corrected += 1
    return corrected


# The prefix of the symbols ONNX's inference makes up for dims it cannot name.
_GENERATED_DIM = "unk__"


# The first byte of a serialized TypeProto that is a sequence, map or optional type (fields
# 4, 5 and 9, length-delimited): telling them apart needs no parse of every value's type.
_HOLDER_TAGS = (b"\x22", b"\x2a", b"\x4a")


def _element_symbols(holders: list[bytes]) -> set[str]:
    """The symbols ONNX's inference made up inside the element types of sequences (and of
    the maps and optionals that hold them). A sequence's element type is one for all of its
    elements, so such a symbol stands for sizes that differ (the split dim of the [64, 8]
    pieces of a SplitToSequence), and every SequenceAt of the sequence, and what is computed
    from it, carries it: onnxruntime then took the pieces as one size and reused a buffer
    of one for the other ("Shape mismatch attempting to re-use buffer"), and the declared
    64 and 8 gave way to it."""
    found: set[str] = set()
    for raw in holders:
        found.update(d.dim_param for shape in _element_shapes(TypeProto.FromString(raw))
                     for d in shape.dim if d.dim_param.startswith(_GENERATED_DIM))
    return found


def _element_shapes(type_proto: TypeProto) -> Iterator:
    """The tensor shapes of a type, nested in sequences, optionals and maps."""
    which = type_proto.WhichOneof("value")
    if which == "tensor_type":
        if type_proto.tensor_type.HasField("shape"):
            yield type_proto.tensor_type.shape
    elif which in ("sequence_type", "optional_type"):
        yield from _element_shapes(getattr(type_proto, which).elem_type)
    elif which == "map_type":
        yield from _element_shapes(type_proto.map_type.value_type)


def _without_symbols(raw: bytes, symbols: set[str]) -> bytes:
    """A serialized TypeProto with the dims named by `symbols` made unknown."""
    type_proto = TypeProto.FromString(raw)
    dims = [d for shape in _element_shapes(type_proto) for d in shape.dim
            if d.dim_param in symbols]
    for dim in dims:
        dim.ClearField("dim_param")
    return type_proto.SerializeToString() if dims else raw


def _type_bytes(info: ValueInfoProto) -> bytes | None:
    """The serialized type of a ValueInfoProto, None without one. Cut from the info's own
    bytes, which protobuf writes in field order (name = 1, type = 2): the type sub-message's
    Python object would cost ~7 µs per value at 100k values (against ~1 µs at 1k) in
    protobuf's object cache, over half of a 100k-node inference."""
    data = info.SerializeToString()
    if data[:1] == b"\x0a":  # the name's tag
        length, pos = varint(data, 1, len(data))
        pos += length
        if data[pos:pos + 1] == b"\x12":  # the type's tag
            length, pos = varint(data, pos + 1, len(data))
            return data[pos:pos + length]
    return info.type.SerializeToString() if info.HasField("type") else None


def _named_sizes_kept(new: tuple, old_shape) -> tuple:
    """The inferred (dtype, shape, type_proto) with a dim the value names (`seq`) kept where
    inference sizes it 0: the name still allows an empty dim, where a wrong 0 would stick (onnx
    1.23's inference of a 3-D Attention with named widths makes its output's last dim 0,
    which onnxruntime then reported against every run and `inspect` showed as the
    signature)."""
    dtype, shape, type_proto = new
    if shape is None or old_shape is None or len(shape) != len(old_shape) \
            or not any(d == 0 and isinstance(o, str) for d, o in zip(shape, old_shape)):
        return new
    kept = tuple(o if d == 0 and isinstance(o, str) else d for d, o in zip(shape, old_shape))
    return dtype, kept, type_proto


def _more_specific(new: tuple, old: tuple) -> bool:
    """Take the inferred (dtype, shape, type_proto) unless it knows less than what the value
    already carries."""
    new_dtype, new_shape, new_tp = new
    old_dtype, old_shape, old_tp = old
    if new_tp is not None or old_tp is not None:
        return new_tp is not None and old_tp is None
    if new_dtype is None and old_dtype is not None:
        return False
    if new_shape is None:
        return old_shape is None
    if old_shape is None or len(old_shape) != len(new_shape):
        return old_shape is None
    known_new = sum(isinstance(d, int) for d in new_shape)
    known_old = sum(isinstance(d, int) for d in old_shape)
    return known_new >= known_old


@register
class InferShapes(Pass):
    name = "InferShapes"
    description = "infer dtypes and shapes of every value with onnx.shape_inference, and past " \
                  "the onnxruntime contrib ops it cannot type"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        # Type knowledge is not a rewrite: it never makes a fixed-point loop go round again.
        if not fully_typed(model):
            infer_shapes(model)
        return PassResult(changed=False)


def _static(value_type: tuple) -> bool:
    dtype, shape, type_proto = value_type
    return type_proto is None and dtype is not None and shape is not None and \
        all(type(dim) is int for dim in shape)


def fully_typed(model: Model) -> bool:
    """Whether every computed value has a dtype and a static shape (or a non-tensor type):
    then inference would only restate what the input check (compile_checks.check_input) and the
    passes recorded, so a static model skips -O2's three inferences (~1/6 of its compile)."""
    for value in model.graph.all_values():
        if value.producer is not None and value.type_proto is None and \
                not _static((value.dtype, value.shape, None)):
            return False
    return True
