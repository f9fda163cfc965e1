"""`Buffer`: one arena slot to place (bytes × an inclusive step interval), and the lower bound.

A buffer is what the strategies place: one tensor, or the tensors that share storage (a view
group, an in-place chain). Its interval [first, last] is inclusive: a tensor written at step 3 and
last read at step 5 occupies its bytes during steps 3, 4 and 5, so the output of step 5 may not
take its place unless the plan says so explicitly (in place).

    address ▲
            │      ┌────────┐
            │ ┌────┤   b    │      the lower bound is the highest column:
            │ │ a  ├────────┴──┐   max over steps of the summed sizes
            │ │    │     c     │   of the buffers live at that step
            └─┴────┴───────────┴──▶ step
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_ALIGNMENT = 64


def align_up(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


@dataclass
class Buffer:
    """`size` is what the arena reserves (aligned); `nbytes` the tensor bytes it holds (the
    same-size strategy matches on it, as onnxruntime's planner does)."""

    id: int
    size: int
    first: int
    last: int
    nbytes: int = -1
    name: str = ""

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            self.nbytes = self.size
        if self.last < self.first:
            raise ValueError(f"buffer {self.label}: last step {self.last} < first {self.first}")

    @property
    def label(self) -> str:
        return self.name or f"#{self.id}"

    def meets(self, other: "Buffer") -> bool:
        """Whether the two are live at a common step."""
        return self.first <= other.last and other.first <= self.last


def live_profile(buffers: Iterable[Buffer], steps: int | None = None) -> list[int]:
    """Bytes live at each step (a difference array: linear in buffers + steps)."""
    buffers = list(buffers)
    if steps is None:
        steps = max((b.last for b in buffers), default=-1) + 1
    delta = [0] * (steps + 1)
    for b in buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    profile, running = [], 0
    for d in delta[:steps]:
        running += d
        profile.append(running)
    return profile


def lower_bound(buffers: Iterable[Buffer]) -> int:
    """No placement of these buffers fits in fewer bytes: max over steps of live bytes."""
    return max(live_profile(buffers), default=0)


def arena_size(buffers: Sequence[Buffer], offsets: dict[int, int]) -> int:
    return max((offsets[b.id] + b.size for b in buffers), default=0)


def conflicts(buffers: Sequence[Buffer]) -> dict[int, list[Buffer]]:
    """For each buffer id, the buffers live at a common step with it (a sweep over first steps:
    linear in the number of overlapping pairs, not quadratic in buffers)."""
    result: dict[int, list[Buffer]] = {b.id: [] for b in buffers}
    active: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (b.first, b.id)):
        active = [a for a in active if a.last >= b.first]
        for a in active:
            result[a.id].append(b)
            result[b.id].append(a)
        active.append(b)
    return result


def count_conflicts(buffers: Sequence[Buffer]) -> int:
    """How many pairs of buffers live at a common step (what conflicts() would list, counted
    in O(n log n) without listing them): in (first, id) order, the i-th buffer meets the i
    before it but those whose last step comes before its first, and every buffer that ends
    before its first step also starts before it, so those are counted from all the ends."""
    import bisect

    lasts = sorted(b.last for b in buffers)
    order = sorted(buffers, key=lambda b: (b.first, b.id))
    return sum(i - bisect.bisect_left(lasts, b.first) for i, b in enumerate(order))
