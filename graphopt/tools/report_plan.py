"""A memory plan as the .om manifest stores it (Plan.to_dict), drawn with passes.memory.plot."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from graphopt.atomic import scratch_folder
from graphopt.passes.memory import Buffer, TensorPlan, align_up, draw_plan


@dataclass
class StoredPlan:
    """What draw_plan reads of a Plan, rebuilt from its dict: the manifest keeps each tensor's
    offset, size, steps and buffer, not the schedule's nodes a full Plan holds."""

    tensors: dict[str, TensorPlan]
    arena_bytes: int
    lower_bound: int
    strategy: str
    steps: int
    buffers: list[Buffer] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> StoredPlan:
        tensors = {t["name"]: TensorPlan(t["name"], t["offset"], t["size"], t["first"], t["last"],
                                         t["buffer"], t.get("view_of", ""), t.get("inplace_of", ""))
                   for t in data.get("tensors", [])}
        groups: dict[int, list[TensorPlan]] = {}
        for t in tensors.values():
            groups.setdefault(t.buffer, []).append(t)
        alignment = data.get("alignment") or 1
        # A buffer's tensors share its offset (views, in-place chains); it reserves the largest.
        buffers = [Buffer(bid, align_up(max(t.size for t in ts), alignment),
                          min(t.first for t in ts), max(t.last for t in ts),
                          max(t.size for t in ts), ts[0].name)
                   for bid, ts in sorted(groups.items())]
        offsets = {bid: ts[0].offset for bid, ts in groups.items()}
        return cls(tensors, data["arena_bytes"], data.get("lower_bound") or 0,
                   data.get("strategy", "?"), len(data.get("schedule", [])), buffers, offsets)


def plan_svg(data: dict, *, width: int = 960, height: int = 360) -> str:
    """The plan picture (tensors over steps × arena address) as SVG text."""
    plan = StoredPlan.from_dict(data)
    with scratch_folder("graphopt-report-") as tmp:
        path = os.path.join(tmp, "plan.svg")
        draw_plan(plan, path, width=width, height=height)  # duck-typed: what it reads is here
        with open(path, encoding="utf-8") as f:
            return f.read()
