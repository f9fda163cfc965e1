"""Facts about ops that several passes rely on: randomness, and the data of Constant nodes."""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Node, Tensor

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Multinomial", "Bernoulli"}

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
