"""The static memory plan of each partition a compile made, and its pictures (--memory-plot)."""

from __future__ import annotations

import os

from graphopt.compile_result import OptimizeResult
from graphopt.errors import OptionError
from graphopt.ir import Model
from graphopt.ir.collector import collection_paused, heap_frozen


def plan_partition_memory(models: dict[str, Model], reorder: bool = False,
                          layouts: dict | None = None) -> dict:
    """The static memory plan of each partition model (or why it has none: a dynamic shape).
    With `reorder`, each model's nodes take the memory-aware order its plan was made for. A
    partition with a device layout (`layouts`, the partitioning's) is planned as the device
    stores its tensors: blocked formats padded, TransData copies counted."""
    from graphopt.partition.format_bytes import DeviceFormats

    # The IR is long-lived: no full collection should walk it again; nor should the plan's
    # own tables (a few objects per value, garbage only once planned), which three full
    # collections walked at 100k nodes (0.3-0.5 s of 1.5 s).
    layouts = layouts or {}
    with collection_paused(), heap_frozen():
        return {name: _plan_memory(model, reorder, DeviceFormats.of(layouts[name])
                                   if name in layouts else None)
                for name, model in models.items()}


def _plan_memory(model: Model, reorder: bool, formats=None):
    from graphopt.passes.memory import MemoryPlanError, plan_memory

    try:
        plan = plan_memory(model, reorder=reorder, formats=formats)
    except MemoryPlanError as e:
        return str(e)
    if plan.schedule_method != "original":
        model.graph.reorder(plan.schedule)
    return plan


def memory_plots(result: OptimizeResult, path: str) -> list[tuple[str, str, object]]:
    """(file, title, plan) of each planned partition's memory picture: `path` when there is
    one, else `stem.<partition>.ext` (a shape profile's partitions carry its name); the title
    names the partition and the profile's dims. A partition without work memory gets none.
    OptionError, before anything is written, when no partition has a picture."""
    runs = [(c.profile.name + ".", f" ({c.profile.label})", c.result)
            for c in result.profiles] or [("", "", result)]
    planned = {prefix + name: (prefix + name + dims, plan) for prefix, dims, run in runs
               for name, plan in run.memory_plans.items() if not isinstance(plan, str)}
    # A partition whose every tensor is an input, output or weight has nothing to draw.
    plans = {name: entry for name, entry in planned.items() if entry[1].tensors}
    if planned and not plans:
        raise OptionError("--memory-plot: no partition has work memory to draw (every tensor "
                          "is an input, an output or a weight)")
    if not plans:
        reasons = "; ".join(dict.fromkeys(
            f"{prefix}{name}: {plan}" for prefix, _, run in runs
            for name, plan in run.memory_plans.items())) or "no target was given"
        raise OptionError(f"--memory-plot: no partition has a memory plan ({reasons})")
    stem, ext = os.path.splitext(path)
    return [(path if len(plans) == 1 else f"{stem}.{name}{ext}", title, plan)
            for name, (title, plan) in plans.items()]


def draw_memory_plans(result: OptimizeResult, path: str) -> list[str]:
    """Draw each planned partition's memory (tensors over time × address) as memory_plots
    names the files; returns the files written. OptionError for a `path` that is not .png or
    .svg, as the command line's --memory-plot (any other name had been written as a PNG)."""
    from graphopt.passes.memory import draw_plan

    if not os.fspath(path).lower().endswith((".png", ".svg")):
        raise OptionError(f"draw_memory_plans: {path}: the picture must end in .png or .svg")
    written = []
    for target, title, plan in memory_plots(result, path):
        draw_plan(plan, target, title=title)
        written.append(target)
    return written
