"""Graph inputs that index a 4-bit embedding table: where Gather refuses an id outside its table,
onnxruntime's GatherBlockQuantized returns a row of zeros, so an `.om` records each such input's
table size ("index_rows" on its signature entry) and its runtime refuses those ids itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from graphopt.errors import GraphoptError

if TYPE_CHECKING:
    import onnx

QUANTIZED_GATHER = ("com.microsoft", "GatherBlockQuantized")
# Ops that hand their first input on value for value: an id reaches the table unchanged. (Not
# Cast: int64 → int32 wraps an id the table would refuse into one it takes.)
_PASSING = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def indexed_inputs(model: onnx.ModelProto) -> dict[str, int]:
    """{graph input: rows of the smallest table it indexes} for the inputs that reach a
    GatherBlockQuantized's indices through ops that pass ids on unchanged, in the main graph."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}
    fed = {vi.name for vi in graph.input}
    found: dict[str, int] = {}
    for node in graph.node:
        if (node.domain, node.op_type) != QUANTIZED_GATHER or len(node.input) < 2:
            continue
        rows = _table_rows(node, producers, initializers)
        source = node.input[1]
        while source not in fed and source in producers \
                and producers[source].op_type in _PASSING and not producers[source].domain:
            source = producers[source].input[0]
        if rows is not None and source in fed:
            found[source] = min(rows, found.get(source, rows))
    return found


def _table_rows(node: onnx.NodeProto, producers: dict, initializers: dict) -> int | None:
    """The rows along the node's gather_axis of its table: an initializer's dims, or the shape a
    Reshape of constant shape gives it (a table tied to an output head); None if unknown."""
    from onnx import numpy_helper

    axis = next((a.i for a in node.attribute if a.name == "gather_axis"), 0)
    data = node.input[0]
    dims: list[int] | None = None
    if data in initializers:
        dims = list(initializers[data].dims)
    elif data in producers and producers[data].op_type == "Reshape" \
            and producers[data].input[1] in initializers:
        dims = numpy_helper.to_array(initializers[producers[data].input[1]]).tolist()
    if dims is None or not -len(dims) <= axis < len(dims):
        return None
    rows = int(dims[axis])
    return rows if rows > 0 else None


def check_ids(name: str, ids: np.ndarray, rows: int) -> None:
    """Refuse ids of input `name` outside [-rows, rows), as Gather would."""
    if ids.size == 0 or (int(ids.min()) >= -rows and int(ids.max()) < rows):
        return
    first = int(np.flatnonzero((ids < -rows) | (ids >= rows))[0])
    where = [int(i) for i in np.unravel_index(first, ids.shape)]
    raise GraphoptError(f"input {name!r} holds {ids.flat[first]} at {where}: the embedding table "
                        f"it indexes has {rows} rows (ids {-rows} to {rows - 1})")
