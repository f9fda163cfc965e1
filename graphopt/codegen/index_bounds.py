"""Graph inputs that index a 4-bit embedding table: where Gather refuses an id outside its table,
onnxruntime's GatherBlockQuantized returns a row of zeros, so an `.om` records what bounds such
an input on its signature entry and its runtime refuses what Gather would have refused:
* "index_rows": the input's values are the ids (through ops that pass them on unchanged);
* "index_dims", [[axis, rows], …]: a dim of the input counts the positions 0, 1, …, dim - 1
  that index the table (Range(0, Shape(input)[axis], 1), a language model's position ids)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from graphopt.errors import InputError

if TYPE_CHECKING:
    import onnx

QUANTIZED_GATHER = ("com.microsoft", "GatherBlockQuantized")
# Ops that hand their first input on value for value: an id reaches the table unchanged. (Not
# Cast: int64 → int32 wraps an id the table would refuse into one it takes.)
_PASSING = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


class Bounds:
    """What bounds the graph inputs of one model: ids (`rows[input]`) and position counts
    (`dims[(input, axis)]`), each by the smallest table it indexes."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.dims: dict[tuple[str, int], int] = {}


def table_bounds(model: onnx.ModelProto) -> Bounds:
    """The bounds the main graph's GatherBlockQuantized nodes put on its inputs."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}
    fed = {vi.name for vi in graph.input}
    bounds = Bounds()
    for node in graph.node:
        if (node.domain, node.op_type) != QUANTIZED_GATHER or len(node.input) < 2:
            continue
        rows = _table_rows(node, producers, initializers)
        if rows is None:
            continue
        source = _passed_from(node.input[1], producers, fed)
        if source in fed:
            bounds.rows[source] = min(rows, bounds.rows.get(source, rows))
            continue
        counted = _counted_dim(producers.get(source), producers, initializers, fed)
        if counted is not None:
            bounds.dims[counted] = min(rows, bounds.dims.get(counted, rows))
    return bounds


def _passed_from(value: str, producers: dict, fed: set[str]) -> str:
    """The value that `value` is, element for element, through ops that pass ids on."""
    while value not in fed and value in producers \
            and producers[value].op_type in _PASSING and not producers[value].domain:
        value = producers[value].input[0]
    return value


def _counted_dim(node, producers: dict, initializers: dict, fed: set[str]
                 ) -> tuple[str, int] | None:
    """(input, axis) when `node` is Range(0, Gather(Shape(input), axis), 1): the positions
    0 … dim - 1, every one of which a table of `rows` rows holds exactly when dim <= rows."""
    if node is None or node.op_type != "Range" or node.domain or len(node.input) != 3:
        return None
    start, limit, delta = node.input
    if _constant(start, initializers) != 0 or _constant(delta, initializers) != 1:
        return None
    gather = producers.get(limit)
    if gather is None or gather.op_type != "Gather" or gather.domain \
            or any(a.name == "axis" and a.i != 0 for a in gather.attribute):
        return None
    shape = producers.get(gather.input[0])
    axis = _constant(gather.input[1], initializers)
    if shape is None or shape.op_type != "Shape" or shape.domain or shape.attribute \
            or axis is None or axis < 0 or shape.input[0] not in fed:
        return None
    return shape.input[0], axis


def _constant(name: str, initializers: dict) -> int | None:
    """The value of a one-element integer initializer, else None."""
    from onnx import numpy_helper

    tensor = initializers.get(name)
    if tensor is None:
        return None
    value = numpy_helper.to_array(tensor)
    if value.size != 1 or value.dtype.kind not in "iu":
        return None
    return int(value.reshape(()))


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
    raise InputError(f"input {name!r} holds {ids.flat[first]} at {where}: the embedding table "
                        f"it indexes has {rows} rows (ids {-rows} to {rows - 1})")


def check_dim(name: str, array: np.ndarray, axis: int, rows: int) -> None:
    """Refuse input `name` when its dim `axis` counts more positions than the table has rows."""
    if array.ndim > axis and array.shape[axis] > rows:
        count = array.shape[axis]
        raise InputError(f"input {name!r} has {count} along axis {axis}: positions 0 to "
                            f"{count - 1} index an embedding table of {rows} rows (at most {rows} "
                            "along that axis)")
