"""The per-kernel configs an .om carries for its NPU partitions: each cube kernel's tiling and
every kernel's estimated time (estimates, never measurements)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from graphopt.tuner.model import model_estimate
from graphopt.tuner.tiling import cube_dtype

if TYPE_CHECKING:
    from graphopt.ir import Model
    from graphopt.partition.partitioner import Partitioning
    from graphopt.tuner.tiling import Tiling

SOURCE_DEFAULT = "default"  # the documented default heuristic
SOURCE_TUNED = "tuned"      # from the tuning knowledge base (kb.tuned_tilings)


def kernel_records(model: Model, partitioning: Partitioning,
                   tilings: dict[str, Tiling] | None = None, source: str = "given") -> dict:
    """{"estimate_us", "partitions": {name: [{node, op, kind, estimate_us, bound, tiling?,
    tiling_source?}]}} for the NPU partitions of `model`; empty when there are none.
    A node's tiling from `tilings` is labelled `source` (SOURCE_TUNED for the knowledge
    base's), any other SOURCE_DEFAULT."""
    npu = {p.name for p in partitioning.partitions
           if partitioning.target.device(p.device).kind == "npu"}
    if not npu:
        return {}
    estimate = model_estimate(model, partitioning, tilings)
    partitions: dict[str, list[dict]] = {name: [] for name in sorted(npu)}
    for row in estimate.rows:
        if row.partition not in npu or row.kind == "transfer":
            continue
        record = {"node": row.name, "op": row.op, "kind": row.kind,
                  "estimate_us": round(row.seconds * 1e6, 3),
                  "bound": row.estimate.breakdown.get("bound", "")}
        if row.tiling is not None:
            record["tiling"] = dataclasses.asdict(row.tiling)
            record["tiling_source"] = source if tilings and row.name in tilings else SOURCE_DEFAULT
            shape = row.estimate.breakdown.get("shape")
            if shape is not None:  # the cube's dtype: int8 kernels take another cube and tiling
                record["dtype"] = cube_dtype(shape.dtype)
        partitions[row.partition].append(record)
    return {"estimate_us": round(estimate.seconds * 1e6, 3), "partitions": partitions}
