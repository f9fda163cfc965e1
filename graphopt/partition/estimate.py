"""Tensor sizes and host↔device copy times, shared by the partitioner and the cost models.

A copy of n bytes over the target's link costs latency + n / bandwidth (an estimate from the
profile's figures). Node times come from the cost models in graphopt.tuner: the CPU roofline
for the host, the tiled cube and vector estimates for the NPU.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from graphopt.ir import Value

if TYPE_CHECKING:
    from graphopt.partition.target import Target


def value_bytes(value: Value | None) -> int:
    """Bytes of a statically shaped tensor; 0 when unknown (dynamic values are not estimated)."""
    if value is None or value.dtype is None or value.static_shape is None:
        return 0
    return math.prod(value.static_shape) * max(1, value.dtype.bits // 8)


# Ops that read from their data input only the elements they output (a gather's rows, a
# slice's window), not the whole input: a 90 MB embedding table is not read per lookup.
PARTIAL_READ = frozenset({"Gather", "GatherElements", "GatherND", "Slice", "Compress",
                          "GatherBlockQuantized"})


def bytes_moved(node) -> int:
    """Bytes a kernel reads and writes, each input and output once; an op of PARTIAL_READ
    reads as much of its data input as it writes."""
    ins = [v for v in node.inputs if v is not None]
    outs = [v for v in node.outputs if v is not None]
    if node.op_type in PARTIAL_READ and ins:
        return 2 * sum(value_bytes(v) for v in outs) + sum(value_bytes(v) for v in ins[1:])
    return sum(value_bytes(v) for v in ins + outs)


def transfer_seconds(nbytes: int, target: Target) -> float:
    """One host↔device copy of `nbytes`."""
    if not target.transfer_bandwidth:
        return 0.0
    return target.transfer_latency_s + nbytes / target.transfer_bandwidth
