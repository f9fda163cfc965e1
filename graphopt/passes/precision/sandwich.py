"""Half regions with no matrix work, fed only by float32 ops: kept float32."""

from __future__ import annotations

import math
from collections import Counter

from graphopt.ir import DType, Node
from graphopt.passes.precision.casts import constant_data
from graphopt.passes.precision.policy import ALLOW, PASS_THROUGH
from graphopt.passes.precision.schema import Slots


def drop_sandwiched(chosen: list[tuple[Node, Slots]], half_values: set[int],
                    allowed) -> tuple[list[tuple[Node, Slots]], Counter]:
    """`chosen` without the regions that would only round float32 values to half and back, and
    the op counts of what they held.

    A region is a set of chosen nodes joined by the half values they pass each other. One with
    no matrix or conv work (nothing in ALLOW, no recurrent layer, nothing `allowed`) and no
    table to store in half (a weight as large as what its reader computes, as an embedding
    Gather's), whose every computed input comes from a float32 op (its outputs go to float32
    ops or to the float32 signature), computes nothing half precision pays for: a forced
    mode's Relus and Adds between the Convs a schema or --precision-deny keeps float32 (97
    Casts in a bf16 MobileNetV2 at opset 17). `half_values` loses the outputs of the regions
    dropped."""
    index = {id(node): i for i, (node, _) in enumerate(chosen)}
    parent = list(range(len(chosen)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, (node, slots) in enumerate(chosen):
        for k in slots.inputs:
            producer = node.inputs[k].producer
            if id(node.inputs[k]) in half_values and id(producer) in index:
                parent[root(i)] = root(index[id(producer)])
    regions: dict[int, list[int]] = {}
    for i in range(len(chosen)):
        regions.setdefault(root(i), []).append(i)
    dropped = {i for members in regions.values()
               if _pointless([chosen[i] for i in members], allowed)
               for i in members}
    for i in dropped:
        node, slots = chosen[i]
        for k in slots.outputs:
            half_values.discard(id(node.outputs[k]))
    kept_float = Counter(chosen[i][0].qualified_op for i in sorted(dropped))
    return [entry for i, entry in enumerate(chosen) if i not in dropped], kept_float


# Matrix work besides ALLOW's: recurrent layers, GEMMs over a sequence.
_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})


def _pointless(region: list[tuple[Node, Slots]], allowed) -> bool:
    if any(node.op_type in ALLOW or node.op_type in _RECURRENT or allowed(node)
           or _reads_a_table(node, slots)
           for node, slots in region):
        return False
    inside = {id(node) for node, _ in region}
    entering = [value for node, _ in region for value in node.inputs
                if value is not None and constant_data(value) is None
                and id(value.producer) not in inside]
    # Read from the model's inputs and writing its outputs alone, the region is the model
    # (elementwise ops alone), where the user asked for half; read by a float32 op after it
    # (a tree ensemble comparing scaled features with float32 thresholds), it only rounds.
    # Fed a half value (a float16 input that --input-fp16-nodes made, Cast to float32 by the
    # source edit), it would widen and round it. Writing an output is no reason: the signature
    # keeps float32, and a tail between a float32 op and the output (an --out-nodes cut after
    # a Conv bf16 keeps) only rounds.
    read_after = any(id(use.node) not in inside for node, slots in region
                     for k in slots.outputs for use in node.outputs[k].uses)
    return bool(entering) and not any(
        (_from_a_model_input(value) and not read_after)
        or value.dtype in (DType.FLOAT16, DType.BFLOAT16) for value in entering)


def _from_a_model_input(value) -> bool:
    """Whether `value` is a model input, or one that data movement alone makes of one (a
    Transpose of an NHWC image, which stays float32 as it reads a float32 input: the
    preprocessing after it had been kept float32 as if a float32 op fed it)."""
    while value.producer is not None:
        node = value.producer
        if node.op_type not in PASS_THROUGH or not node.is_onnx or not node.inputs \
                or node.inputs[0] is None:
            return False
        value = node.inputs[0]
    return constant_data(value) is None


# Ops that pick elements out of their data input: a table they read may be stored in half.
_INDEXING = frozenset({"Gather", "GatherElements", "GatherND"})


def _reads_a_table(node: Node, slots: Slots) -> bool:
    """Whether `node` picks from a weight it converts that holds as many elements as one of its
    outputs (symbolic dims counted as 1): half the bytes of the table, against Casts of what
    is read from it. An elementwise op's weight is no table: a scikit-learn scaler's [10]
    factors against its [N, 10] output (N counted as 1) had kept a pipeline's features in
    float16 before a tree ensemble compared them with float32 thresholds."""
    if node.op_type not in _INDEXING:
        return False
    sizes = [math.prod(d if isinstance(d, int) else 1 for d in node.outputs[k].shape)
             for k in slots.outputs if node.outputs[k].shape is not None]
    weights = [data.size for data in (constant_data(node.inputs[k]) for k in slots.inputs)
               if data is not None]
    return bool(sizes and weights) and max(weights) >= min(sizes)
