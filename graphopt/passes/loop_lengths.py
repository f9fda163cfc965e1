"""The length of a Loop's scan outputs where the Loop runs exactly its trip count.

ONNX's inference leaves a scan output's leading dim unknown, since a Loop may stop early. One
whose trip count is a constant and whose condition is true throughout (torch exports
nn.EmbeddingBag as such a Loop, one iteration per bag, its trip count the offsets' length) runs
every iteration: pinned with --input-shape, a DLRM's bag sums were still of unknown length, and
the NPU left them to the host for a dynamic shape.
"""

from __future__ import annotations

from graphopt.ir import Model, Node, Value


def fill_scan_lengths(model: Model) -> int:
    """Give each such Loop's scan outputs its trip count as their leading dim; returns how
    many outputs that told more."""
    filled = 0
    for graph in model.graph.all_graphs():
        for node in graph.nodes():
            if node.op_type != "Loop" or not node.is_onnx:
                continue
            trips = _trip_count(node)
            if trips is None or not _runs_every_trip(node):
                continue
            carried = len(node.inputs) - 2  # the loop-carried values come first
            for value in node.outputs[max(carried, 0):]:
                if value is None or value.type_proto is not None or not value.shape \
                        or isinstance(value.shape[0], int):
                    continue
                value.shape = (trips, *value.shape[1:])
                filled += 1
    return filled


def _trip_count(node: Node) -> int | None:
    value = node.input(0) if node.inputs else None
    data = value.constant() if value is not None else None
    if data is None or data.size != 1 or data.dtype.kind not in "iu":
        return None
    trips = int(data.reshape(-1)[0])
    return trips if trips >= 0 else None


def _runs_every_trip(node: Node) -> bool:
    """Whether the Loop's condition is true on entry and after every iteration: absent or a
    true constant on entry, and the body's condition output a true constant or the condition
    it was given (through Identity or Cast)."""
    given = node.input(1) if len(node.inputs) > 1 else None
    if given is not None and not _true(given):
        return False
    body = node.attr("body")
    if body is None or not body.outputs or len(body.inputs) < 2:
        return False
    value = body.outputs[0]
    while value.producer is not None and value.producer.op_type in ("Identity", "Cast") \
            and value.producer.is_onnx and value.producer.inputs:
        value = value.producer.inputs[0]
    return value is body.inputs[1] or _true(value)


def _true(value: Value) -> bool:
    data = value.constant()
    return data is not None and data.size == 1 and bool(data.reshape(-1)[0])
