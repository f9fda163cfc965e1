"""The inputs that choose an If's branch, so that seeded verification can run each branch."""

from __future__ import annotations

from onnx import ModelProto, TensorProto

# Ops a condition passes through unchanged in what it selects (a Not swaps the branches).
_PASSING = frozenset({"Identity", "Not", "Cast", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})


def branch_switches(model: ModelProto) -> list[str]:
    """The graph inputs, boolean and of one element, that an If of the main graph takes its
    condition from (through Not, Cast, Identity or a reshape): an optimum-style merged decoder's
    `use_cache_branch`. Seeded inputs draw one value for each and so run one branch alone."""
    producers = {out: node for node in model.graph.node for out in node.output}
    initialized = {t.name for t in model.graph.initializer}
    candidates = {i.name for i in model.graph.input
                  if i.name not in initialized and _one_bool(i.type)}
    found = []
    for node in model.graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        name = node.input[0]
        while name in producers and producers[name].op_type in _PASSING \
                and producers[name].domain in ("", "ai.onnx"):
            name = producers[name].input[0]
        if name in candidates and name not in found:
            found.append(name)
    return found


def _one_bool(type_proto) -> bool:
    tensor = type_proto.tensor_type
    if not type_proto.HasField("tensor_type") or tensor.elem_type != TensorProto.BOOL:
        return False
    if not tensor.HasField("shape"):
        return False
    return all(d.HasField("dim_value") and d.dim_value == 1 for d in tensor.shape.dim)


__all__ = ["branch_switches"]
