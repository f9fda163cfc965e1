"""Facts about ops that several passes rely on: randomness, and the data of Constant nodes."""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Node, Tensor
from graphopt.random_seeds import RANDOM_OPS

NONDETERMINISTIC = set(RANDOM_OPS)


def random_reason(node: Node) -> str | None:
    """Why `node` draws random numbers (so two of them on equal inputs differ, and one run to
    the next), or None: the Random* ops, Dropout in training mode (or a mode known only at
    run time), and contrib ops named for either."""
    op = node.op_type
    if node.is_onnx:
        if op in NONDETERMINISTIC:
            return "non-deterministic"
        if op == "Dropout" and node.input(2) is not None:
            mode = node.input(2).constant()
            if mode is None or bool(mode):
                return "Dropout in training mode is random"
        return None
    if "Random" in op or "Dropout" in op:
        return f"op {node.qualified_op} is random"
    return None


def random_functions(model) -> set[tuple[str, str]]:
    """The (domain, name) of the model-local functions whose bodies draw random numbers,
    directly or through another function or a subgraph: each call of one differs from the
    next."""
    def random_op(proto) -> bool:
        if proto.domain in ("", "ai.onnx"):
            # Dropout's mode is a function input here: random unless it is left out.
            return proto.op_type in NONDETERMINISTIC or (
                proto.op_type == "Dropout" and len(proto.input) > 2 and proto.input[2] != "")
        return "Random" in proto.op_type or "Dropout" in proto.op_type

    def nodes_of(nodes):
        for proto in nodes:
            yield proto
            for attr in proto.attribute:
                for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from nodes_of(graph.node)

    calls = {(f.domain, f.name): list(nodes_of(f.node)) for f in model.functions}
    random = {key for key, body in calls.items() if any(random_op(p) for p in body)}
    grew = True
    while grew:  # a function calling a random one is random too
        grew = False
        for key, body in calls.items():
            if key not in random and any((p.domain, p.op_type) in random for p in body):
                random.add(key)
                grew = True
    return random


_NUMERIC_ATTRS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                  "value_ints": np.int64}


def constant_node_tensor(node: Node) -> Tensor | None:
    """The data of a Constant node (no copy for a tensor attribute); None for sparse values and
    attribute references, which stay nodes."""
    if len(node.attrs) != 1:
        return None
    (name, attr), = node.attrs.items()
    if attr.ref_attr_name:
        return None
    if name == "value":
        return attr.value
    if name in _NUMERIC_ATTRS:
        return Tensor(np.array(attr.value, dtype=_NUMERIC_ATTRS[name]))
    if name in ("value_string", "value_strings"):
        # Bytes, as numpy_helper gives for string initializers loaded from a file.
        items = attr.value if isinstance(attr.value, list) else [attr.value]
        array = np.array([s.encode() if isinstance(s, str) else s for s in items], dtype=object)
        return Tensor(array.reshape(()) if name == "value_string" else array, dtype=DType.STRING)
    return None
