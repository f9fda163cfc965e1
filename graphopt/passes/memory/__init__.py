"""Static memory planning: lifetimes over a schedule, arena offsets, in-place reuse, ordering."""

from graphopt.passes.memory.aliasing import INPLACE_OPS, VIEW_OPS, Storage
from graphopt.passes.memory.arena_executor import ArenaCheck, ArenaExecutor, check_plan
from graphopt.passes.memory.buffers import (DEFAULT_ALIGNMENT, Buffer, align_up, live_profile,
                                            lower_bound)
from graphopt.passes.memory.liveness import (ARENA, INPUT, OUTPUT, WEIGHT, Lifetime, Liveness,
                                             MemoryPlanError, liveness)
from graphopt.passes.memory.plan import Plan, TensorPlan, plan_memory
from graphopt.passes.memory.plot import draw_plan
from graphopt.passes.memory.schedule import ScheduleResult, schedule_for_memory, schedule_peak
from graphopt.passes.memory.strategies import REUSE_STRATEGIES, STRATEGIES
from graphopt.passes.memory.verify import verify_plan

__all__ = [
    "ARENA", "DEFAULT_ALIGNMENT", "INPLACE_OPS", "INPUT", "OUTPUT", "REUSE_STRATEGIES",
    "STRATEGIES", "VIEW_OPS", "WEIGHT", "ArenaCheck", "ArenaExecutor", "Buffer", "Lifetime",
    "Liveness", "MemoryPlanError", "Plan", "ScheduleResult", "Storage", "TensorPlan", "align_up",
    "check_plan", "draw_plan", "live_profile", "liveness", "lower_bound", "plan_memory",
    "schedule_for_memory", "schedule_peak", "verify_plan",
]
