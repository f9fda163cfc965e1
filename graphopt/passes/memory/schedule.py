"""Memory-aware scheduling: the topological order that lowers the peak of live bytes.

The peak of an order is the lower bound of its plan (`buffers.lower_bound` over the buffers that
`Storage.assign` makes of it, in-place included), so a lower peak is a smaller work buffer.
State after running a set S of nodes: live(S) = bytes of the arena groups defined in S that a node
outside S still reads. Running node n costs live(S) + the bytes its new outputs allocate (an
output written in place of a dying input allocates nothing).

- Heuristics, linear-ish, for any size: the original order; greedy list schedulers (among ready
  nodes take the smallest net growth, or the smallest allocation); post-order DFS from the sinks
  visiting the heaviest (or lightest) operand subtree first, as XLA's DFS scheduler does. The
  best of them is kept, the original order winning ties.
- Exact, for small graphs: DP over scheduled sets with memoization (a state is the set S, so
  orders reaching the same S share their future), pruned by the best heuristic peak, within a
  time budget. Nodes that allocate nothing are run as soon as they are ready in both: that never
  raises the peak (their cost is live(S), at most the previous step's cost) and only frees
  memory earlier.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.ir import Graph, Model, Node
from graphopt.passes.memory.aliasing import Storage
from graphopt.passes.memory.buffers import DEFAULT_ALIGNMENT, lower_bound
from graphopt.passes.memory.liveness import (check_schedule, classify, liveness, main_graph,
                                             node_reads, outer_producer, tensor_bytes)

if TYPE_CHECKING:
    from graphopt.partition.format_bytes import DeviceFormats


@dataclass
class ScheduleResult:
    order: list[Node]
    peak: int                 # live-bytes peak (the plan's lower bound) of `order`
    original_peak: int
    method: str               # which candidate won: original, greedy_net, …, exact
    candidates: dict[str, int] = field(default_factory=dict)
    floor: int = 0            # no order goes below this: the largest working set of one node
    optimal: bool = False     # proven: the exact search finished, or the peak meets the floor


_FLOOR_NODES = 2000


class _Problem:
    """The graph as integers: node n's predecessors, successors, arena groups it reads and
    defines, group sizes and reader counts."""

    def __init__(self, storage: Storage):
        self.storage = storage
        graph, nodes, index = storage.graph, storage.nodes, storage.index
        self.n = len(nodes)
        self.preds: list[list[int]] = []
        self.succs: list[list[int]] = [[] for _ in nodes]
        for i, node in enumerate(nodes):
            preds = []
            for value in node_reads(node):
                producer = outer_producer(value, graph)
                if producer is not None and index[producer] not in preds:
                    preds.append(index[producer])
            self.preds.append(preds)
            for p in preds:
                self.succs[p].append(i)
        self.reads, self.defines = storage.reads, storage.defines
        self.size, self.readers = storage.size, storage.readers
        self.group_readers: list[list[int]] = [[] for _ in self.size]
        for n, groups in enumerate(self.reads):
            for g in groups:
                self.group_readers[g].append(n)

    def floor(self) -> int:
        """A peak no order goes below. When node n runs, these are live: the groups it reads,
        its outputs (those that might go in place aside), and every group defined by an
        ancestor of n and read by a descendant of n. The last needs ancestor/descendant sets
        (bitsets): skipped above _FLOOR_NODES nodes, where only the first two count."""
        need = []
        for n in range(self.n):
            maybe_inplace = {out for out, _ in self.storage.candidates[n]}
            need.append(sum(self.size[g] for g in self.reads[n])
                        + sum(self.size[g] for g in self.defines[n] if g not in maybe_inplace))
        if self.n <= _FLOOR_NODES:
            order = _topological(self)
            anc, desc = [0] * self.n, [0] * self.n
            for n in order:
                for p in self.preds[n]:
                    anc[n] |= anc[p] | (1 << p)
            for n in reversed(order):
                for c in self.succs[n]:
                    desc[n] |= desc[c] | (1 << c)
            producer = {g: n for n in range(self.n) for g in self.defines[n]}
            for g, p in producer.items():
                before_a_reader = 0
                for r in self.group_readers[g]:
                    before_a_reader |= anc[r]
                readers = sum(1 << r for r in self.group_readers[g])
                between = desc[p] & before_a_reader & ~readers  # readers count it already
                while between:
                    low = between & -between
                    need[low.bit_length() - 1] += self.size[g]
                    between ^= low
        return max(need, default=0)


class _State:
    def __init__(self, problem: _Problem):
        self.p = problem
        self.remaining = list(problem.readers)
        self.indeg = [len(ps) for ps in problem.preds]
        self.ready = {n for n in range(problem.n) if not problem.preds[n]}
        # A partition input's TransData copy is live from the start (liveness).
        self.live = sum(problem.size[g] for g in problem.storage.at_start if problem.readers[g])
        self.mask = 0

    def alloc(self, n: int) -> int:
        p = self.p
        if not p.defines[n]:
            return 0
        taken = {out for out, _, _ in p.storage.inplace_choice(n, self.remaining)}
        return sum(p.size[g] for g in p.defines[n] if g not in taken)

    def freed(self, n: int) -> int:
        return sum(self.p.size[g] for g in self.p.reads[n] if self.remaining[g] == 1)

    def apply(self, n: int) -> int:
        """Run `n`; returns the bytes live during its step."""
        p = self.p
        cost = self.live + self.alloc(n)
        for g in p.defines[n]:
            if p.readers[g]:
                self.live += p.size[g]
        for g in p.reads[n]:
            self.remaining[g] -= 1
            if self.remaining[g] == 0:
                self.live -= p.size[g]
        self.ready.discard(n)
        self.mask |= 1 << n
        for s in p.succs[n]:
            self.indeg[s] -= 1
            if self.indeg[s] == 0:
                self.ready.add(s)
        return cost

    def undo(self, n: int) -> None:
        p = self.p
        for s in p.succs[n]:
            if self.indeg[s] == 0:
                self.ready.discard(s)
            self.indeg[s] += 1
        self.ready.add(n)
        self.mask &= ~(1 << n)
        for g in p.reads[n]:
            if self.remaining[g] == 0:
                self.live += p.size[g]
            self.remaining[g] += 1
        for g in p.defines[n]:
            if p.readers[g]:
                self.live -= p.size[g]

    def run_free(self) -> tuple[list[int], int]:
        """Run every ready node that allocates nothing, lowest index first, until none is left;
        returns them and the highest step cost among them."""
        ran, peak = [], 0
        while True:
            free = [n for n in self.ready if self.alloc(n) == 0]
            if not free:
                return ran, peak
            for n in sorted(free):
                if n in self.ready and self.alloc(n) == 0:
                    peak = max(peak, self.apply(n))
                    ran.append(n)


def _greedy(problem: _Problem, key: Callable[[_State, int], tuple]) -> list[int]:
    """List scheduling: run the ready node with the smallest key; nodes that allocate nothing
    first. Keys live in a heap and are recomputed only when they can change: a node's
    allocation and freed bytes change only when a group it reads drops to one remaining reader
    (it may then free it, or write in place of it)."""
    state, order = _State(problem), []
    version = [0] * problem.n
    heap: list[tuple] = []

    def push(n: int) -> None:
        version[n] += 1
        heapq.heappush(heap, (state.alloc(n) > 0, key(state, n), n, version[n]))

    for n in sorted(state.ready):
        push(n)
    while heap:
        *_, n, seen = heapq.heappop(heap)
        if seen != version[n] or n not in state.ready:
            continue
        state.apply(n)
        order.append(n)
        for m in problem.succs[n]:
            if state.indeg[m] == 0:
                push(m)
        for g in problem.reads[n]:
            if state.remaining[g] == 1:
                for m in problem.group_readers[g]:
                    if m in state.ready:
                        push(m)
    return order


def _net_growth(state: _State, n: int) -> tuple:
    return (state.alloc(n) - state.freed(n), n)


def _smallest_alloc(state: _State, n: int) -> tuple:
    return (state.alloc(n), -state.freed(n), n)


def _dfs(problem: _Problem, heaviest_first: bool) -> list[int]:
    """Post-order DFS from the sinks; operands whose subtrees define more bytes go first
    (or last)."""
    weight = [0] * problem.n
    for n in _topological(problem):
        weight[n] = (sum(problem.size[g] for g in problem.defines[n])
                     + sum(weight[p] for p in problem.preds[n]))
    sign = -1 if heaviest_first else 1
    visited = [False] * problem.n
    order: list[int] = []

    def operands(n: int):
        return iter(sorted(problem.preds[n], key=lambda p: (sign * weight[p], p)))

    for sink in (n for n in range(problem.n) if not problem.succs[n]):
        stack = [(sink, operands(sink))]
        visited[sink] = True
        while stack:
            node, preds = stack[-1]
            for p in preds:
                if not visited[p]:
                    visited[p] = True
                    stack.append((p, operands(p)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def _topological(problem: _Problem) -> list[int]:
    indeg = [len(ps) for ps in problem.preds]
    order = [n for n in range(problem.n) if indeg[n] == 0]
    for n in order:
        for s in problem.succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    return order


class _OutOfTime(Exception):
    pass


def _exact(problem: _Problem, bound: int, floor: int, deadline: float) -> list[int] | None:
    """An order with peak < `bound`, the lowest possible, or None when none beats `bound`.
    Raises _OutOfTime past `deadline`. A state stops searching once the rest of its order
    peaks at most at `floor`: every full order peaks at least there, so a lower rest cannot
    lower any full order's peak."""
    state = _State(problem)
    memo: dict[int, int] = {}      # scheduled set -> lowest peak of the rest (capped at bound)
    choice: dict[int, int] = {}
    calls = [0]

    def solve() -> int:
        if not state.ready:
            return 0
        key = state.mask
        if key in memo:
            return memo[key]
        calls[0] += 1
        if calls[0] % 256 == 0 and time.perf_counter() > deadline:
            raise _OutOfTime
        best, best_n = bound, -1
        for n in sorted(state.ready, key=lambda n: (state.alloc(n), n)):
            cost = state.live + state.alloc(n)
            if cost >= best:
                break  # sorted by allocation: the rest cost at least as much
            state.apply(n)
            ran, free_peak = state.run_free()
            value = max(cost, free_peak, solve())
            for m in reversed(ran):
                state.undo(m)
            state.undo(n)
            if value < best:
                best, best_n = value, n
                if best <= floor:
                    break
        memo[key] = best
        if best_n >= 0:
            choice[key] = best_n
        return best

    ran, free_peak = state.run_free()
    order = list(ran)
    if max(free_peak, solve()) >= bound:
        return None
    while state.ready:
        n = choice[state.mask]
        state.apply(n)
        order.append(n)
        ran, _ = state.run_free()
        order.extend(ran)
    return order


def _storage(graph: Graph, alignment: int, inplace: bool, fold_constants: bool,
             formats: DeviceFormats | None = None) -> Storage:
    if formats is not None:  # an NPU partition: device sizes and TransData copies
        live = liveness(graph, fold_constants=fold_constants, formats=formats)
        return Storage(graph, live.kind, live.nbytes, alignment=alignment, inplace=inplace,
                       copies=live.copies, device_format=live.device_format)
    kind = classify(graph, fold_constants=fold_constants)
    nbytes = {value: tensor_bytes(value) for value in kind}
    return Storage(graph, kind, nbytes, alignment=alignment, inplace=inplace)


def _peak(storage: Storage, order: Sequence[Node]) -> int:
    return lower_bound(storage.assign(order).buffers)


def schedule_peak(model: Model | Graph, order: Sequence[Node] | None = None, *,
                  alignment: int = DEFAULT_ALIGNMENT, inplace: bool = True,
                  fold_constants: bool = True) -> int:
    """The live-bytes peak of `order` (default: the graph's): the lower bound of its plan."""
    graph = main_graph(model)
    order = check_schedule(graph, order)
    return _peak(_storage(graph, alignment, inplace, fold_constants), order)


def schedule_for_memory(model: Model | Graph, *, alignment: int = DEFAULT_ALIGNMENT,
                        inplace: bool = True, fold_constants: bool = True,
                        exact: bool | None = None, exact_limit: int = 40,
                        time_budget: float = 1.0,
                        formats: DeviceFormats | None = None) -> ScheduleResult:
    """A topological order of the main graph with a low live-bytes peak: the best heuristic,
    improved by the exact search when `exact` (default: when at most `exact_limit` nodes
    allocate arena memory) and it finishes within `time_budget` seconds."""
    graph = main_graph(model)
    storage = _storage(graph, alignment, inplace, fold_constants, formats)
    problem = _Problem(storage)
    nodes = storage.nodes
    orders: dict[str, list[Node]] = {"original": nodes}
    heuristics = {
        "greedy_net": lambda: _greedy(problem, _net_growth),
        "greedy_alloc": lambda: _greedy(problem, _smallest_alloc),
        "dfs_heavy_first": lambda: _dfs(problem, True),
        "dfs_light_first": lambda: _dfs(problem, False),
    }
    for name, make in heuristics.items():
        orders[name] = [nodes[i] for i in make()]
    candidates = {name: _peak(storage, order) for name, order in orders.items()}
    method = min(candidates, key=lambda name: candidates[name])  # dicts keep order: original first
    result = ScheduleResult(orders[method], candidates[method], candidates["original"], method,
                            candidates, problem.floor())
    result.optimal = result.peak <= result.floor
    costly = sum(1 for d in problem.defines if d)
    if exact is None:
        exact = costly <= exact_limit
    if exact and not result.optimal:
        try:
            found = _exact(problem, result.peak, result.floor, time.perf_counter() + time_budget)
        except (_OutOfTime, RecursionError):  # a deep search is a long one: keep the heuristic
            return result
        result.optimal = True
        if found is not None:
            order = [nodes[i] for i in found]
            result.order, result.peak, result.method = order, _peak(storage, order), "exact"
            candidates["exact"] = result.peak
    return result
