"""INT4 embedding tables for QuantizeInt4Weights: a Gather from a constant [rows, width] float
table becomes com.microsoft's GatherBlockQuantized, and a tied output head (a MatMul whose weight
is that table transposed, as GPT-2's is) reads the same 4-bit bytes through MatMulNBits.

    T[V,H] ─ Gather(T, ids)          q[V,H/blk,blk/2] ─ Reshape[V,H/2] ─ GatherBlockQuantized
    x ─ MatMul(x, Tᵀ[H,V])    ─▶     x ─ MatMulNBits(x, q, scales, zero_points)

The two layouts agree byte for byte: MatMulNBits stores, for each of its N = V output columns, the
K = H weights that feed it, block after block, two per byte, low nibble first; GatherBlockQuantized
with uint8 data packs each row's H values the same way along its last axis, with the same
[V, H/blk] scales and the same nibble-packed [V, ceil(H/blk/2)] zero points. Only the shape of the
packed tensor differs, so one Reshape lets both read one initializer. onnxruntime folds the Reshape
when it loads the model; the artifact holds the table once, where the export held it twice.

A table whose width no block of 16 or more divides stays float (GatherBlockQuantized does not pad),
and so does one holding NaN or Inf, or one that any op other than its Gathers and tied heads reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphopt.ir import DType, Graph, Node, Value
from graphopt.passes.edit import replace_value
from graphopt.passes.precision.blockwise import BlockQuant, quantize
from graphopt.passes.precision.casts import constant_data

MS = "com.microsoft"


@dataclass
class Table:
    """An embedding table, the Gathers that read it and, once quantized, its 4-bit tensors."""
    value: Value
    data: np.ndarray               # [rows, width]
    block: int
    gathers: list[Node] = field(default_factory=list)
    quant: BlockQuant | None = None  # Tᵀ as MatMulNBits lays it out, once quantized
    scales: Value | None = None      # [rows, width/block]
    zero_points: Value | None = None  # uint8 [rows, ceil(width/block/2)]
    packed: Value | None = None      # uint8 [rows, width/block, block/2]: a tied head's B
    scale_dtype: DType | None = None  # a tied head's: float16 under a mixed mode, else the table's
    heads: int = 0                   # the heads tied to it that read its bytes now

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def width(self) -> int:
        return self.data.shape[1]


def table_block(width: int, group: int) -> int | None:
    """The largest power of 2 in [16, group] that divides `width`, or None."""
    block = 1 << (group.bit_length() - 1)
    while block >= 16:
        if width % block == 0:
            return block
        block //= 2
    return None


def embedding_tables(graph: Graph, group: int, wanted,
                     refused: dict[str, str] | None = None) -> dict[str, Table]:
    """The candidate tables, by value name: constant 2-D float tables that axis-0 Gathers
    read, each of which `wanted(node)` accepts (quant_skip, the rewrite gate, the target's
    kernels). Other readers may remain: a tied head, which the pass rewrites before it turns to
    the Gathers (only_gathered then says whether the table can go). `refused` collects why
    each other constant matrix that a Gather indexes is no candidate, by value name."""
    tables: dict[str, Table] = {}
    refused = {} if refused is None else refused
    for node in graph:
        source = node.input(0) if _embedding_gather(node) else None
        if source is None or source.name in tables or source.name in refused:
            continue
        data = constant_data(source)
        if data is None or data.ndim != 2:
            continue  # not a table: Gathers of computed data or of shapes are no embeddings
        if source.is_graph_output:
            refused[source.name] = "is a graph output"
            continue
        if source.dtype not in (DType.FLOAT, DType.FLOAT16):
            refused[source.name] = f"is {source.dtype.short}, not a float table"
            continue
        if not np.isfinite(data).all():  # a 4-bit block of it would be NaN throughout
            refused[source.name] = "holds NaN or Inf (a 4-bit block's scale would be NaN)"
            continue
        block = table_block(data.shape[1], group)
        # A Gather in a Loop or If body that captures the table is no reader this pass rewrites
        # (only_gathered then keeps the table float).
        gathers = [user for user, index in source.uses
                   if index == 0 and _embedding_gather(user) and user.graph is graph]
        if block is None:
            refused[source.name] = f"is {data.shape[1]} wide, which no block of 16 or more " \
                                   "divides (GatherBlockQuantized does not pad)"
        elif not all(wanted(g) for g in gathers):
            refused[source.name] = "is read by a Gather that is skipped, held back or has " \
                                   "no 4-bit kernel on the target"
        else:
            tables[source.name] = Table(source, data, block, gathers)
    for node in graph.all_nodes():  # bodies: torch's EmbeddingBag exports as a Loop of Gathers
        source = node.input(0) if node.graph is not graph and _embedding_gather(node) else None
        if source is None or source.name in tables or source.name in refused \
                or source.graph is not graph:
            continue
        data = constant_data(source)
        if data is not None and data.ndim == 2 and source.dtype in (DType.FLOAT, DType.FLOAT16):
            holder = node.graph.parent.op_type if node.graph.parent is not None else "a subgraph"
            refused[source.name] = f"is read inside a {holder} body (an EmbeddingBag's, as " \
                                   "torch exports it), whose Gathers the pass does not rewrite"
    return tables


def _embedding_gather(node: Node) -> bool:
    return node.op_type == "Gather" and node.is_onnx and node.attr("axis", 0) in (0, -2)


def only_gathered(table: Table) -> bool:
    """Whether the table's Gathers are all that read it now (the heads tied to it rewritten):
    otherwise it stays float, or the model would store it in float and in 4 bits."""
    return len(table.value.uses) == len(table.gathers) and not table.value.is_graph_output


def gathered_after(table: Table, rewritten: list[Node]) -> bool:
    """Whether the table's Gathers will be all that read it once the `rewritten` nodes (its
    tied heads among them) and the Transposes only they read are gone: only_gathered, asked
    before a head is rounded, which is balanced for the Gathers only if they will share it."""
    gone = {id(node) for node in (*table.gathers, *rewritten)}

    def going(node: Node) -> bool:
        if id(node) in gone:
            return True
        out = node.outputs[0] if node.op_type == "Transpose" and node.outputs else None
        return out is not None and bool(out.uses) and not out.is_graph_output \
            and all(id(user) in gone for user, _ in out.uses)

    return not table.value.is_graph_output and all(going(user) for user, _ in table.value.uses)


def tied_table(tables: dict[str, Table], weight: np.ndarray, dtype: DType) -> Table | None:
    """The table whose transpose the head weight W [K, N] of activation `dtype` is, if any,
    claimed for heads of that dtype. A mixed precision mode makes the head float16 and leaves
    the table float32: the head's weight is then the table rounded to float16, and the shared
    scales are float16, as MatMulNBits takes its activation's dtype."""
    k, n = weight.shape
    for table in tables.values():
        if table.data.shape != (n, k) or table.scale_dtype not in (None, dtype):
            continue
        if table.value.dtype == dtype or (table.value.dtype, dtype) == (DType.FLOAT,
                                                                        DType.FLOAT16):
            if np.array_equal(table.data.astype(dtype.numpy).T, weight):
                table.scale_dtype = dtype
                return table
    return None


def tied_gram(gram: np.ndarray) -> np.ndarray:
    """The Hessian GPTQ rounds a tied table against: its heads' inputs' XᵀX plus the identity
    that plain rounding weighs the Gathers' error by, scaled to the same trace. GPTQ against
    XᵀX alone moves the head's error into the rows the Gathers read (on gpt2_small a single
    token's logits lost more through the embedding than the head gained); the identity keeps
    each row near its own levels, so both readers gain."""
    return gram + np.trace(gram) / len(gram) * np.eye(len(gram))


def _quantize(graph: Graph, table: Table, quant: BlockQuant | None = None) -> None:
    """Quantize `table` once, as MatMulNBits lays out Tᵀ: scales and zero points as both ops
    read them; the packed bytes wait for the first reader to choose their shape. `quant`, when
    given, is the head's rounding of Tᵀ (GPTQ against tied_gram) in place of plain rounding."""
    if table.quant is None:
        name, dtype = table.value.name, table.scale_dtype or table.value.dtype
        quant = quant or quantize(table.data.astype(dtype.numpy).T, table.block,
                                  symmetric=False, scale_dtype=dtype.numpy)
        table.quant = quant
        table.scales = graph.make_initializer(
            f"{name}_scales", quant.scales.reshape(table.rows, table.width // table.block))
        table.zero_points = graph.make_initializer(f"{name}_zero_points",
                                                   quant.zero_points.reshape(table.rows, -1))


def head_weights(graph: Graph, table: Table,
                 quant: BlockQuant | None = None) -> tuple[Value, Value, Value]:
    """MatMulNBits' B, scales and zero points for a head tied to `table`: the table's bytes
    (`quant` when the table is not quantized yet and the head rounded it by GPTQ)."""
    _quantize(graph, table, quant)
    table.heads += 1
    if table.packed is None:
        table.packed = graph.make_initializer(f"{table.value.name}_q4", table.quant.packed)
    return table.packed, table.scales, table.zero_points


def rewrite_gathers(graph: Graph, table: Table) -> None:
    """Replace the table's Gathers by GatherBlockQuantized: on its own packed rows, or, when a
    head is tied to it, on the head's packed bytes seen through a Reshape."""
    _quantize(graph, table)
    rows, width, dtype, name = table.rows, table.width, table.value.dtype, table.value.name
    if table.packed is None:
        flat = graph.make_initializer(f"{name}_q4", table.quant.packed.reshape(rows, width // 2))
    else:
        shape = graph.make_initializer(f"{name}_q4_shape", np.array([rows, width // 2], np.int64))
        flat = Value(graph.fresh_name(f"{name}_q4_rows"), DType.UINT8, [rows, width // 2])
        graph.insert_before(table.gathers[0], Node(
            "Reshape", [table.packed, shape], outputs=[flat],
            name=graph.fresh_node_name(f"{name}_q4_rows")))
    scaled = table.scale_dtype or dtype  # GatherBlockQuantized returns its scales' dtype
    for gather in table.gathers:
        old = gather.output
        out = Value(graph.fresh_name(f"{old.name}_q4"), scaled, old.shape)
        node = Node("GatherBlockQuantized",
                    [flat, gather.input(1), table.scales, table.zero_points],
                    {"bits": 4, "block_size": table.block, "gather_axis": 0, "quantize_axis": 1},
                    domain=MS, outputs=[out],
                    name=graph.fresh_node_name(f"{gather.name or 'gather'}_q4"))
        graph.insert_before(gather, node)
        if scaled != dtype:  # back to the table's dtype, which the Gather's readers take
            cast = Value(graph.fresh_name(f"{old.name}_q4_{dtype.short}"), dtype, old.shape)
            graph.insert_after(node, Node("Cast", [out], {"to": int(dtype)}, outputs=[cast],
                                          name=graph.fresh_node_name(f"{node.name}_cast")))
            out = cast
        assert replace_value(old, out), gather
        graph.remove(gather)
