"""A profile's aggregations: per op type, per node, per partition, cost model agreement, JSON."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from graphopt.tuner.cpu_model import spearman

MIN_RANKED = 3  # priced kernels a rank correlation is reported over


@dataclass(frozen=True)
class OpStats:
    """One op type's kernels over the kept runs; `predicted_us`, `measured_predicted_us` and
    the roofline sides are per run and cover only the kernels the cost model priced."""

    op_type: str
    kernels: int
    calls: int
    total_us: float
    share: float                          # of all kernel time
    predicted_us: float | None
    measured_predicted_us: float | None
    compute_us: float | None
    memory_us: float | None

    @property
    def mean_us(self) -> float:
        return self.total_us / self.calls if self.calls else 0.0

    @property
    def bound(self) -> str | None:
        """What limits it by the roofline: "compute", "memory", or "overhead" when the fixed
        cost per kernel outweighs both sides."""
        if self.predicted_us is None:
            return None
        roof = max(self.compute_us or 0.0, self.memory_us or 0.0)
        if self.predicted_us - roof > roof:
            return "overhead"
        return "compute" if (self.compute_us or 0.0) >= (self.memory_us or 0.0) else "memory"


class ProfileStats:
    """Aggregations over `self.kernels`, `self.partitions`, `self.runs`, `self.wall_s`."""

    @property
    def total_us(self) -> float:
        """Kernel time summed over every kernel and kept run."""
        return sum(k.total_us for k in self.kernels)

    @property
    def kernel_us_per_run(self) -> float:
        return self.total_us / self.runs

    @property
    def wall_us_per_run(self) -> float:
        return float(np.mean(self.wall_s)) * 1e6

    @property
    def matched_share(self) -> float:
        total = self.total_us
        return sum(k.total_us for k in self.kernels if k.node) / total if total else 0.0

    def by_op(self) -> list[OpStats]:
        """Op types by kernel time, largest first."""
        groups = defaultdict(list)
        for kernel in self.kernels:
            groups[kernel.op_type].append(kernel)
        total = self.total_us or 1.0
        rows = []
        for op_type, kernels in groups.items():
            priced = [k for k in kernels if k.predicted_us is not None]

            def per_run(values, priced=priced):
                return sum(values) / self.runs if priced else None

            rows.append(OpStats(
                op_type, len(kernels), sum(k.calls for k in kernels),
                sum(k.total_us for k in kernels), sum(k.total_us for k in kernels) / total,
                per_run(k.predicted_us * k.calls for k in priced),
                per_run(k.total_us for k in priced),
                per_run(k.compute_us * k.calls for k in priced),
                per_run(k.memory_us * k.calls for k in priced)))
        return sorted(rows, key=lambda r: (-r.total_us, r.op_type))

    def top(self, count: int) -> list:
        """The `count` kernels with the most time."""
        return sorted(self.kernels, key=lambda k: (-k.total_us, k.name))[:count]

    def by_partition(self) -> list[tuple]:
        """(PartitionInfo, kernels, kernel µs per run, share) in execution order."""
        total = self.total_us or 1.0
        rows = []
        for part in self.partitions:
            mine = [k for k in self.kernels if k.partition == part.name]
            spent = sum(k.total_us for k in mine)
            rows.append((part, len(mine), spent / self.runs, spent / total))
        return rows

    def spearman(self) -> float:
        """Rank correlation of predicted and measured time per call over the priced kernels;
        NaN below MIN_RANKED of them (two points correlate ±1 whatever the model says) or
        when either side is constant (spearman_gap says which)."""
        priced = [k for k in self.kernels if k.predicted_us is not None]
        if len(priced) < MIN_RANKED:
            return float("nan")
        return spearman([k.predicted_us for k in priced], [k.mean_us for k in priced])

    def spearman_gap(self) -> str:
        """Why spearman() is NaN, for the report ("" when it is not)."""
        priced = [k for k in self.kernels if k.predicted_us is not None]
        if len(priced) < MIN_RANKED:
            return (f"{len(priced)} priced kernel(s), a rank correlation needs {MIN_RANKED}; "
                    "the CPU model prices matched host nodes")
        if len({k.predicted_us for k in priced}) == 1:
            return f"the cost model predicts the same time for all {len(priced)} priced kernels"
        if len({k.mean_us for k in priced}) == 1:
            return f"all {len(priced)} priced kernels measured the same time"
        return ""

    def to_json(self) -> dict:
        rho = self.spearman()
        return {
            "path": self.path, "kind": self.kind, "runs": self.runs, "warmup": self.warmup,
            "threads": self.threads, "cost_model": self.cost_model, "notes": self.notes,
            "shape_profile": self.shape_profile,
            "wall_us_per_run": self.wall_us_per_run, "kernel_us_per_run": self.kernel_us_per_run,
            "matched_share": self.matched_share,
            "spearman": None if math.isnan(rho) else rho,
            "partitions": [{"name": p.name, "device": p.device, "level": p.level,
                            "providers": p.providers, "nodes": p.nodes, "kernels": n,
                            "kernel_us_per_run": us, "share": share}
                           for p, n, us, share in self.by_partition()],
            "ops": [{"op": r.op_type, "kernels": r.kernels, "calls": r.calls,
                     "total_us": r.total_us, "mean_us": r.mean_us, "share": r.share,
                     "predicted_us_per_run": r.predicted_us,
                     "measured_priced_us_per_run": r.measured_predicted_us,
                     "bound": r.bound} for r in self.by_op()],
            "kernels": [{"partition": k.partition, "name": k.name, "op": k.op_type,
                         "provider": k.provider, "calls": k.calls, "total_us": k.total_us,
                         "mean_us": k.mean_us, "median_us": k.median_us, "node": k.node, "matched_by": k.how or None,
                         "predicted_us": k.predicted_us} for k in self.top(len(self.kernels))],
        }
