"""Property tests of the memory planner on random lifetimes and random DAGs: no strategy
overlaps live tensors, every plan is at least the lower bound, reuse never loses to no reuse,
the exact schedule is optimal on small graphs, and planned graphs run correctly in the arena."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphopt.ir import DType, Graph, Model, Value
from graphopt.passes.memory import (REUSE_STRATEGIES, STRATEGIES, Buffer, check_plan,
                                    lower_bound, plan_memory, schedule_for_memory, schedule_peak,
                                    verify_plan)
from graphopt.passes.memory.buffers import align_up, arena_size, conflicts, count_conflicts

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- random lifetimes -------------------------------------------------------------------------
@st.composite
def interval_sets(draw) -> list[Buffer]:
    steps = draw(st.integers(1, 24))
    buffers = []
    for i in range(draw(st.integers(0, 30))):
        first = draw(st.integers(0, steps - 1))
        last = draw(st.integers(first, min(steps - 1, first + draw(st.integers(0, 8)))))
        nbytes = draw(st.sampled_from([0, 1, 4, 64, 100, 256, 1000, 4096]))
        buffers.append(Buffer(i, align_up(nbytes, 64), first, last, nbytes))
    return buffers


def assert_no_overlap(buffers: list[Buffer], offsets: dict[int, int]) -> None:
    for a, b in itertools.combinations(buffers, 2):
        if a.meets(b) and a.size and b.size:
            disjoint = (offsets[a.id] + a.size <= offsets[b.id]
                        or offsets[b.id] + b.size <= offsets[a.id])
            assert disjoint, f"{a} at {offsets[a.id]} overlaps {b} at {offsets[b.id]}"


@FAST
@given(interval_sets())
def test_strategies_never_overlap_live_buffers_and_respect_the_bound(buffers):
    bound = lower_bound(buffers)
    sizes = {}
    for name, strategy in STRATEGIES.items():
        offsets = strategy(buffers)
        assert set(offsets) == {b.id for b in buffers}, name
        assert all(o % 64 == 0 for o in offsets.values()), name
        assert_no_overlap(buffers, offsets)
        sizes[name] = arena_size(buffers, offsets)
        assert sizes[name] >= bound, name
    assert sizes["naive"] == sum(b.size for b in buffers)
    assert sizes["greedy_by_size"] <= sizes["naive"]
    assert sizes["greedy_search"] <= sizes["greedy_by_size"]


@FAST
@given(interval_sets())
def test_pairs_are_counted_as_conflicts_lists_them(buffers):
    listed = sum(len(met) for met in conflicts(buffers).values()) // 2
    assert count_conflicts(buffers) == listed == sum(
        a.meets(b) for a, b in itertools.combinations(buffers, 2))


# -- random graphs ----------------------------------------------------------------------------
UNARY = ("Relu", "Sigmoid", "Neg", "Tanh")


@st.composite
def random_models(draw, max_nodes: int = 12) -> Model:
    """A DAG of elementwise, broadcast, concat, reshape and same-width cast ops on [n, c]
    float tensors, some values dead, a few graph outputs."""
    graph = Graph("random")
    n = draw(st.sampled_from([1, 2, 4]))
    values = [graph.add_input(Value("x", DType.FLOAT, (n, draw(st.sampled_from([4, 8, 16])))))]
    if draw(st.booleans()):
        values.append(graph.add_input(Value("x2", DType.FLOAT, (n, 8))))
    for _ in range(draw(st.integers(1, max_nodes))):
        a = draw(st.sampled_from(values[-6:]))
        kind = draw(st.sampled_from(
            ["unary", "unary", "binary", "bias", "concat", "reshape", "cast"]))
        shape = a.shape
        if kind == "binary":
            same = [v for v in values if v.shape == shape and v.dtype == a.dtype]
            b = draw(st.sampled_from(same))
            node = graph.make_node(draw(st.sampled_from(["Add", "Mul", "Sub"])), [a, b],
                                   dtype=a.dtype, shape=shape)
        elif kind == "bias" and a.dtype == DType.FLOAT and len(shape) == 2:
            data = np.linspace(-1, 1, shape[1], dtype=np.float32)[None]
            bias = graph.make_initializer("bias", data)
            node = graph.make_node("Add", [bias, a] if draw(st.booleans()) else [a, bias],
                                   dtype=a.dtype, shape=shape)
        elif kind == "concat" and len(shape) == 2 and a.dtype == DType.FLOAT:
            partners = [v for v in values if v.dtype == DType.FLOAT and v.shape is not None
                        and len(v.shape) == 2 and v.shape[0] == shape[0]]
            b = draw(st.sampled_from(partners))
            node = graph.make_node("Concat", [a, b], {"axis": 1}, dtype=a.dtype,
                                   shape=(shape[0], shape[1] + b.shape[1]))
        elif kind == "reshape":
            flat = (int(np.prod(shape)),) if len(shape) == 2 else (n, -1)
            target = flat if len(shape) == 2 else (n, int(np.prod(shape)) // n)
            dims = graph.make_initializer("shape", np.array(target, dtype=np.int64))
            node = graph.make_node("Reshape", [a, dims], dtype=a.dtype, shape=target)
        elif kind == "cast":
            to = DType.INT32 if a.dtype == DType.FLOAT else DType.FLOAT
            node = graph.make_node("Cast", [a], {"to": int(to)}, dtype=to, shape=shape)
        else:
            if a.dtype != DType.FLOAT:
                node = graph.make_node("Cast", [a], {"to": int(DType.FLOAT)}, dtype=DType.FLOAT,
                                       shape=shape)
            else:
                node = graph.make_node(draw(st.sampled_from(UNARY)), [a], dtype=a.dtype,
                                       shape=shape)
        values.append(node.output)
    produced = values[len(graph.inputs):]
    outputs = {id(produced[-1]): produced[-1]}
    for value in draw(st.lists(st.sampled_from(produced), max_size=2)):
        outputs[id(value)] = value
    graph.outputs.extend(outputs.values())
    return Model(graph, opset_imports={"": 17})


@FAST
@given(random_models(), st.sampled_from([1, 16, 64]))
def test_plans_of_random_graphs_verify_and_respect_the_bound(model, alignment):
    plan = plan_memory(model, alignment=alignment, strategies=list(STRATEGIES))
    verify_plan(plan, model)
    assert all(t.offset % alignment == 0 for t in plan.tensors.values())
    assert plan.arena_bytes >= plan.lower_bound
    assert plan.candidates["greedy_by_size"] <= plan.candidates["naive"]
    assert plan.arena_bytes == min(plan.candidates.values())
    assert plan.lower_bound == schedule_peak(model, alignment=alignment)
    for name in REUSE_STRATEGIES:  # each strategy's own placement verifies too
        other = plan_memory(model, alignment=alignment, strategies=[name])
        verify_plan(other, model)


def _topological_orders(nodes, preds):
    if not nodes:
        yield []
        return
    for node in nodes:
        if not preds[node] & set(nodes):
            rest = [n for n in nodes if n is not node]
            for tail in _topological_orders(rest, preds):
                yield [node, *tail]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_models(max_nodes=6))
def test_exact_schedule_is_optimal_and_heuristics_never_lose_to_the_original(model):
    graph = model.graph
    result = schedule_for_memory(model, exact=True, time_budget=5.0)
    original = schedule_peak(model)
    assert result.original_peak == original
    assert result.peak == schedule_peak(model, result.order)   # the claimed peak is the real one
    heuristic = min(v for k, v in result.candidates.items() if k != "exact")
    assert result.peak <= heuristic <= original
    assert result.floor <= result.peak
    nodes = graph.nodes()
    preds = {n: {v.producer for v in n.inputs if v is not None and v.producer is not None}
             for n in nodes}
    best = min(schedule_peak(model, order) for order in _topological_orders(nodes, preds))
    assert result.optimal and result.peak == best


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_models(max_nodes=10), st.booleans())
def test_the_arena_executor_reproduces_random_graphs(model, reorder):
    plan = plan_memory(model, reorder=reorder)
    check = check_plan(model, plan, seed=1)
    assert check.ok, check.mismatches
