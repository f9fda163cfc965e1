"""Offset assignment: place buffers in one arena so that no two live at a common step overlap.

Each strategy maps buffers (sizes already aligned) to offsets; offsets are sums of aligned sizes,
so they are aligned too. They are the ones runtimes use, under the names the literature uses:

- naive: no reuse, every buffer gets its own bytes.
- same_size (onnxruntime's planner): a freed slot is reused only by a tensor of exactly its
  byte size.
- greedy_by_size (TFLite GreedyBySize): largest first, each into the tightest gap left by the
  placed buffers it meets in time.
- greedy_by_breadth (TFLite GreedyByBreadth): steps by decreasing live bytes; their tensors
  largest first, into the tightest gap.
- best_fit (XLA's heap simulator): in time order, allocate from the best-fitting free chunk,
  coalescing chunks on free.
- greedy_search (graphopt): greedy_by_size's placement over several orders (size, size ×
  lifetime, lifetime, …), then a seeded local search swapping two buffers of the best order
  while the arena does not grow, until it meets the lower bound or its budget.

Greedy by size alone is within a few percent of the lower bound on most CNNs but not all: on
DenseNet-121 it leaves 11 % (the concatenations' long-lived inputs fragment the arena); the
search closes that gap in a few hundred swaps.
"""

from __future__ import annotations

import bisect
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from graphopt.passes.memory.buffers import Buffer, arena_size, conflicts, live_profile, lower_bound

Meets = dict[int, list[Buffer]]  # buffer id -> the buffers live at a common step (conflicts())
Strategy = Callable[[Sequence[Buffer], Meets | None], dict[int, int]]


def naive(buffers: Sequence[Buffer], meets: Meets | None = None) -> dict[int, int]:
    offsets, end = {}, 0
    for b in sorted(buffers, key=lambda b: (b.first, b.id)):
        offsets[b.id] = end
        end += b.size
    return offsets


def _by_step(buffers: Sequence[Buffer]) -> tuple[dict[int, list[Buffer]], dict[int, list[Buffer]]]:
    born: dict[int, list[Buffer]] = defaultdict(list)
    dies: dict[int, list[Buffer]] = defaultdict(list)
    for b in sorted(buffers, key=lambda b: b.id):
        born[b.first].append(b)
        dies[b.last].append(b)
    return born, dies


def same_size(buffers: Sequence[Buffer], meets: Meets | None = None) -> dict[int, int]:
    born, dies = _by_step(buffers)
    free: dict[int, list[int]] = defaultdict(list)
    offsets, end = {}, 0
    for step in sorted(set(born) | set(dies)):
        for b in born.get(step, ()):
            slots = free[b.nbytes]
            if slots:
                offsets[b.id] = slots.pop()
            else:
                offsets[b.id] = end
                end += b.size
        for b in dies.get(step, ()):  # free after the step: its readers run at it
            free[b.nbytes].append(offsets[b.id])
    return offsets


def _tightest_gap(size: int, placed: list[tuple[int, int]]) -> int:
    """The start of the smallest gap of at least `size` bytes between the (offset, end) ranges,
    else the first byte above them all."""
    placed.sort()
    best, best_gap, top = None, None, 0
    for offset, end in placed:
        gap = offset - top
        if gap >= size and (best_gap is None or gap < best_gap):
            best, best_gap = top, gap
        top = max(top, end)
    return top if best is None else best


def _place(order: Sequence[Buffer], meets: Meets, offsets: dict[int, int],
           start: int = 0) -> None:
    """Place order[start:] one by one, each in the tightest gap around the buffers already in
    `offsets` that it meets in time."""
    for b in order[start:]:
        placed = [(offsets[o.id], offsets[o.id] + o.size) for o in meets[b.id] if o.id in offsets]
        offsets[b.id] = _tightest_gap(b.size, placed)


def greedy_by_size(buffers: Sequence[Buffer], meets: Meets | None = None) -> dict[int, int]:
    offsets: dict[int, int] = {}
    order = sorted(buffers, key=lambda b: (-b.size, b.first, b.id))
    _place(order, conflicts(buffers) if meets is None else meets, offsets)
    return offsets


def greedy_by_breadth(buffers: Sequence[Buffer], meets: Meets | None = None) -> dict[int, int]:
    """TFLite visits steps by decreasing breadth (live bytes) and, at each, its unplaced tensors
    largest first. A tensor is thus placed at the broadest step of its lifetime (the earliest
    of equals): one range-max query per tensor gives that step, so no per-step tensor lists
    are built."""
    profile = live_profile(buffers)
    widest = _broadest_steps(profile, buffers)
    order = sorted(buffers, key=lambda b: (widest[b.id], b.size, -b.id), reverse=True)
    offsets: dict[int, int] = {}
    _place(order, conflicts(buffers) if meets is None else meets, offsets)
    return offsets


def _broadest_steps(profile: list[int], buffers: Sequence[Buffer]) -> dict[int, tuple[int, int]]:
    """Buffer id -> (live bytes, -step) of the broadest step of its lifetime, the earliest of
    equals: range-max queries over a sparse table (O(1) each after O(n log n) set-up), built
    and queried with numpy a level at a time."""
    steps = len(profile)
    if not buffers:
        return {}
    # Each step's rank in (width, -step) order: the widest step, the earliest of equals, has
    # the highest rank. (np.unique, the obvious tool, costs 10 ms on its first call.)
    by_rank = np.lexsort((-np.arange(steps, dtype=np.int64), np.asarray(profile)))
    keys = np.empty(steps, dtype=np.int64)
    keys[by_rank] = np.arange(steps, dtype=np.int64)
    levels = [keys]
    width = 1
    while 2 * width <= steps:
        prev = levels[-1]
        levels.append(np.maximum(prev[:-width], prev[width:]))
        width *= 2
    lo = np.fromiter((b.first for b in buffers), dtype=np.int64, count=len(buffers))
    hi = np.fromiter((b.last for b in buffers), dtype=np.int64, count=len(buffers))
    level = np.floor(np.log2(hi - lo + 1)).astype(np.int64)
    best = np.empty(len(buffers), dtype=np.int64)
    for k in range(int(level.max()) + 1):
        rows = np.nonzero(level == k)[0]
        if len(rows):
            table = levels[k]
            best[rows] = np.maximum(table[lo[rows]], table[hi[rows] - (1 << k) + 1])
    broadest = by_rank[best].tolist()
    return {b.id: (profile[step], -step) for b, step in zip(buffers, broadest)}


_ORDERS = (
    lambda b: (-b.size, b.first, b.id),                       # TFLite's GreedyBySize
    lambda b: (-b.size, b.first - b.last, b.id),              # longer lifetime first on ties
    lambda b: (-b.size * (b.last - b.first + 1), b.id),       # area in the time x bytes plane
    lambda b: (b.first - b.last, -b.size, b.id),              # longest lifetime first
    lambda b: (-b.size, b.last, b.id),
)
# Above this many conflicting pairs (thousands of tensors live at once) the search keeps to
# TFLite's order: each extra order or swap costs a pass over every pair.
_SEARCH_PAIRS = 1_000_000


def greedy_search(buffers: Sequence[Buffer], meets: Meets | None = None, *,
                  swaps: int | None = None, seed: int = 0,
                  time_limit: float = 0.25) -> dict[int, int]:
    """`swaps` defaults to 1000 up to 2000 buffers, 100 above (a swap re-places a suffix of
    the order, linear in the buffers); `time_limit` caps the search on any machine."""
    meets = conflicts(buffers) if meets is None else meets
    bound = lower_bound(buffers)
    wide = sum(len(m) for m in meets.values()) > _SEARCH_PAIRS
    best_order: list[Buffer] = []
    best: dict[int, int] = {}
    for key in _ORDERS[:1] if wide else _ORDERS:
        order = sorted(buffers, key=key)
        offsets: dict[int, int] = {}
        _place(order, meets, offsets)
        if not best_order or arena_size(buffers, offsets) < arena_size(buffers, best):
            best_order, best = order, offsets
        if arena_size(buffers, best) <= bound:
            return best
    rng, deadline = random.Random(seed), time.perf_counter() + time_limit
    size = arena_size(buffers, best)
    if swaps is None:
        swaps = 0 if wide else 1000 if len(buffers) <= 2000 else 100
    for _ in range(swaps if len(buffers) > 1 else 0):
        if size <= bound or time.perf_counter() > deadline:
            break
        i, j = sorted(rng.sample(range(len(best_order)), 2))
        order = best_order[:]
        order[i], order[j] = order[j], order[i]
        offsets = {b.id: best[b.id] for b in order[:i]}  # the prefix places as before
        _place(order, meets, offsets, i)
        new = arena_size(buffers, offsets)
        if new <= size:  # sideways moves too: plateaus are wide
            best_order, best, size = order, offsets, new
    return best


def best_fit(buffers: Sequence[Buffer], meets: Meets | None = None) -> dict[int, int]:
    born, dies = _by_step(buffers)
    chunks: list[list[int]] = []  # free [offset, size], sorted by offset, coalesced
    offsets, end = {}, 0
    for step in sorted(set(born) | set(dies)):
        for b in sorted(born.get(step, ()), key=lambda b: (-b.size, b.id)):
            fits = [c for c in chunks if c[1] >= b.size]
            if fits:
                chunk = min(fits, key=lambda c: (c[1], c[0]))
                offsets[b.id] = chunk[0]
                chunk[0] += b.size
                chunk[1] -= b.size
                if chunk[1] == 0:
                    chunks.remove(chunk)
            elif chunks and chunks[-1][0] + chunks[-1][1] == end:
                offsets[b.id] = chunks.pop()[0]  # grow the heap from the free chunk at its top
                end = offsets[b.id] + b.size
            else:
                offsets[b.id] = end
                end += b.size
        for b in dies.get(step, ()):
            _release(chunks, offsets[b.id], b.size)
    return offsets


def _release(chunks: list[list[int]], offset: int, size: int) -> None:
    if size == 0:
        return
    i = bisect.bisect_left(chunks, [offset, 0])
    if i > 0 and chunks[i - 1][0] + chunks[i - 1][1] == offset:
        i -= 1
        chunks[i][1] += size
    else:
        chunks.insert(i, [offset, size])
    if i + 1 < len(chunks) and chunks[i][0] + chunks[i][1] == chunks[i + 1][0]:
        chunks[i][1] += chunks.pop(i + 1)[1]


STRATEGIES: dict[str, Strategy] = {
    "naive": naive,
    "same_size": same_size,
    "greedy_by_size": greedy_by_size,
    "greedy_by_breadth": greedy_by_breadth,
    "best_fit": best_fit,
    "greedy_search": greedy_search,
}
# plan_memory keeps the smallest of these; on a tie, the earlier one (the plain strategies first,
# so a figure credited to the search is one no single strategy reached).
REUSE_STRATEGIES = ("greedy_by_size", "greedy_by_breadth", "best_fit", "same_size", "greedy_search")
# The strategies that place each buffer around the placed ones it meets in time: their cost
# grows with the pairs of buffers live at a common step, the square of how many live at once.
PAIRWISE_STRATEGIES = ("greedy_by_size", "greedy_by_breadth", "greedy_search")
# Above this many pairs (1,400 tensors live at once: an unrolled RNN's step outputs before
# their Concat) plan_memory's default set leaves the pairwise strategies out; they took 17 s
# at 8 M pairs and 95 s at 32 M, for arenas the sweep-based best_fit matches there.
MAX_PAIRS = 1_000_000
