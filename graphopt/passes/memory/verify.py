"""Static checks of a memory plan: aligned offsets, an arena that holds every tensor, and no two
tensors live at a common step sharing a byte unless the plan shares their storage on purpose."""

from __future__ import annotations

from graphopt.ir import Graph, Model
from graphopt.passes.memory.liveness import MemoryPlanError, liveness, main_graph
from graphopt.passes.memory.plan import Plan, TensorPlan


def verify_plan(plan: Plan, model: Model | Graph | None = None) -> None:
    """Raise MemoryPlanError naming the first fault. With `model`, also check that every arena
    tensor of the plan's schedule is planned, with its size and lifetime."""
    tensors = list(plan.tensors.values())
    for t in tensors:
        if t.offset % plan.alignment:
            raise MemoryPlanError(f"memory plan: %{t.name} at offset {t.offset} is not aligned to "
                                  f"{plan.alignment} bytes")
        if t.offset < 0 or t.offset + t.size > plan.arena_bytes:
            raise MemoryPlanError(f"memory plan: %{t.name} [{t.offset}, {t.offset + t.size}) lies "
                                  f"outside the {plan.arena_bytes}-byte arena")
        if not 0 <= t.first <= t.last < max(plan.steps, 1):
            raise MemoryPlanError(f"memory plan: %{t.name} has lifetime [{t.first}, {t.last}] "
                                  f"outside the {plan.steps}-step schedule")
    slot: dict[int, TensorPlan] = {}
    for t in tensors:
        other = slot.setdefault(t.buffer, t)
        if other.offset != t.offset:
            raise MemoryPlanError(f"memory plan: %{t.name} shares buffer {t.buffer} with "
                                  f"%{other.name} but sits at offset {t.offset}, "
                                  f"not {other.offset}")
    _check_overlaps(plan, tensors)
    if model is not None:
        _check_against(plan, main_graph(model))


def _check_overlaps(plan: Plan, tensors: list[TensorPlan]) -> None:
    """Tensors live at a common step may share bytes only on purpose: views of one storage, or
    an in-place handover (the input's last step is the output's first, the output overwrote it)."""
    def root(t: TensorPlan) -> TensorPlan:
        seen = 0
        while t.view_of and t.view_of in plan.tensors and seen < len(tensors):
            t, seen = plan.tensors[t.view_of], seen + 1
        return t

    def handover(a: TensorPlan, b: TensorPlan) -> bool:
        early, late = (a, b) if a.first <= b.first else (b, a)
        source = plan.tensors.get(root(late).inplace_of)
        return (early.last == late.first and source is not None
                and root(source) is root(early) and source.last == late.first)

    active: list[TensorPlan] = []
    for t in sorted(tensors, key=lambda t: (t.first, t.offset)):
        active = [a for a in active if a.last >= t.first]
        for a in active:
            if not (a.size and t.size and a.offset < t.offset + t.size
                    and t.offset < a.offset + a.size):
                continue
            if a.buffer == t.buffer and (root(a) is root(t) or handover(a, t)):
                continue
            raise MemoryPlanError(
                f"memory plan: %{a.name} [{a.offset}, {a.offset + a.size}) live in steps "
                f"{a.first}-{a.last} overlaps %{t.name} [{t.offset}, {t.offset + t.size}) "
                f"live in steps {t.first}-{t.last}")
        active.append(t)


def _check_against(plan: Plan, graph: Graph) -> None:
    live = liveness(graph, plan.schedule, formats=plan.formats)
    for value in live.first:
        t = plan.tensors.get(value.name)
        if t is None:
            if value.name not in plan.external:
                raise MemoryPlanError(f"memory plan: %{value.name} is neither planned nor external")
            continue
        actual = (live.nbytes[value], live.first[value], live.last[value])
        if (t.size, t.first, t.last) != actual:
            raise MemoryPlanError(
                f"memory plan: %{value.name} is planned as {t.size} B over steps "
                f"{t.first}-{t.last}, but is {actual[0]} B over steps {actual[1]}-{actual[2]}")
