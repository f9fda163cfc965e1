"""`plan_memory`: the static memory plan of a graph — every activation's offset in one work
buffer (CANN's work memory), next to weight, input and output bytes and the lower bound."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.codegen.om_manifest import order_label
from graphopt.errors import OptionError
from graphopt.ir import Graph, Model, Node
from graphopt.table import format_bytes
from graphopt.passes.memory.aliasing import Assignment, Storage, is_external_view
from graphopt.passes.memory.buffers import (DEFAULT_ALIGNMENT, Buffer, arena_size, conflicts,
                                            count_conflicts, lower_bound)
from graphopt.passes.memory.liveness import (INPUT, WEIGHT, Liveness, liveness, main_graph,
                                             tensor_bytes)
from graphopt.passes.memory.schedule import schedule_for_memory
from graphopt.passes.memory.strategies import (MAX_PAIRS, PAIRWISE_STRATEGIES, REUSE_STRATEGIES,
                                               STRATEGIES)

if TYPE_CHECKING:
    from graphopt.partition.format_bytes import DeviceFormats

PLAN_FORMAT = 1


@dataclass
class TensorPlan:
    """One arena tensor: bytes [offset, offset + size) from step `first` to step `last`.
    Tensors of one `buffer` share storage on purpose (a view, or an in-place chain)."""

    name: str
    offset: int
    size: int
    first: int
    last: int
    buffer: int
    view_of: str = ""      # the tensor whose bytes this one relabels (Reshape, Squeeze, …)
    inplace_of: str = ""   # the dying input this one overwrote

    @property
    def note(self) -> str:
        if self.view_of:
            return f"view of %{self.view_of}"
        return f"in place of %{self.inplace_of}" if self.inplace_of else ""


@dataclass
class Plan:
    tensors: dict[str, TensorPlan]
    arena_bytes: int                 # the work buffer
    lower_bound: int                 # max over the schedule of live (aligned) bytes
    weight_bytes: int
    input_bytes: int
    output_bytes: int
    strategy: str
    candidates: dict[str, int]       # arena bytes of every strategy tried (naive included)
    alignment: int
    schedule: list[Node] = field(repr=False)
    schedule_method: str = "original"
    # With reorder: whether no order of the graph has a lower peak (proven by the exact search
    # or by meeting the one-node floor); None when the order was not searched.
    schedule_optimal: bool | None = None
    buffers: list[Buffer] = field(default_factory=list, repr=False)
    offsets: dict[int, int] = field(default_factory=dict, repr=False)  # buffer id -> offset
    # every other tensor: name -> "input", "output" or "weight" (views of them included)
    external: dict[str, str] = field(default_factory=dict, repr=False)
    notes: list[str] = field(default_factory=list)
    formats: DeviceFormats | None = field(default=None, repr=False)  # an NPU partition's
    transdata_copies: int = 0        # of them, the TransData copies planned as tensors

    @property
    def steps(self) -> int:
        return len(self.schedule)

    @property
    def ratio(self) -> float:
        """Arena bytes over the lower bound (1.0 is optimal for this schedule)."""
        return self.arena_bytes / self.lower_bound if self.lower_bound else 1.0

    def schedule_names(self) -> list[str]:
        return [node.name or f"{node.op_type}@{i}" for i, node in enumerate(self.schedule)]

    def summary(self) -> str:
        order = "" if self.schedule_optimal is None else "; order " + order_label(
            {"schedule_method": self.schedule_method, "schedule_optimal": self.schedule_optimal})
        sizes = (f"weights {format_bytes(self.weight_bytes)}, inputs "
                 f"{format_bytes(self.input_bytes)}, outputs {format_bytes(self.output_bytes)}")
        bodies = self.bodies_note()
        bodies = f"; {bodies}" if bodies else ""
        if not self.tensors:
            return (f"no work memory (every tensor is an input, an output or a weight); "
                    f"{sizes}{bodies}")
        copies = self.transdata_copies
        device = "" if self.formats is None else \
            f"; device formats, {copies} TransData cop{'y' if copies == 1 else 'ies'}"
        return (f"work memory {format_bytes(self.arena_bytes)} ({self.arena_bytes:,} B; "
                f"{self.strategy}, {self.ratio:.3f}x the lower bound "
                f"{format_bytes(self.lower_bound)}); {sizes}; "
                f"{_count(len(self.tensors), 'tensor')} in {_count(len(self.buffers), 'buffer')} "
                f"over {_count(self.steps, 'step')}{device}{bodies}{order}")

    def bodies_note(self) -> str:
        """What the plan leaves out: the values inside If/Loop/Scan bodies are the runtime's
        (liveness plans a holder as one step), and a model whose work is all in a branch
        (silero-vad's If) would otherwise show a work memory of a few bytes as the whole."""
        holders = Counter(node.qualified_op for node in self.schedule if node.subgraphs())
        if not holders:
            return ""
        return (f"not counted: memory inside the bodies of "
                f"{_count(sum(holders.values()), 'control-flow node')} "
                f"({', '.join(sorted(holders))}), which the runtime allocates as they run")

    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT, "alignment": self.alignment,
            "arena_bytes": self.arena_bytes, "lower_bound": self.lower_bound,
            "weight_bytes": self.weight_bytes, "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes, "strategy": self.strategy,
            "candidates": self.candidates, "schedule_method": self.schedule_method,
            **({} if self.schedule_optimal is None
               else {"schedule_optimal": self.schedule_optimal}),
            "schedule": self.schedule_names(),
            "tensors": [{"name": t.name, "offset": t.offset, "size": t.size, "first": t.first,
                         "last": t.last, "buffer": t.buffer,
                         **({"view_of": t.view_of} if t.view_of else {}),
                         **({"inplace_of": t.inplace_of} if t.inplace_of else {})}
                        for t in self.tensors.values()],
            "notes": self.notes,
            # Sizes as the NPU stores its tensors (blocked formats, TransData copies `T@FORMAT`).
            **({} if self.formats is None else {"sizes": "device formats",
                                                  "transdata_copies": self.transdata_copies}),
            # inspect's tables show it beside the work memory, which would read as the whole.
            **({"not_counted": note} if (note := self.bodies_note()) else {}),
        }

    def to_json(self, indent: int | None = None) -> str:
        """The plan for the .om manifest: sizes, strategy, schedule by node name, tensors."""
        return json.dumps(self.to_dict(), indent=indent)


def plan_memory(model: Model | Graph, schedule: Sequence[Node] | None = None, *,
                alignment: int = DEFAULT_ALIGNMENT, strategies: Sequence[str] | None = None,
                inplace: bool = True, fold_constants: bool = True, reorder: bool = False,
                time_budget: float = 1.0, formats: DeviceFormats | None = None) -> Plan:
    """Plan the work buffer of `model`'s main graph over `schedule` (default: the graph's order;
    `reorder=True` first picks a memory-aware order, see `schedule_for_memory`). Tries every
    reuse strategy (or those named in `strategies`) and keeps the smallest arena. `formats`
    (an NPU partition's) sizes tensors as the device stores them, TransData copies included
    (liveness). Raises MemoryPlanError when a tensor has no static size."""
    if alignment < 1:
        raise OptionError(f"memory plan: alignment must be a positive byte count, got {alignment}")
    names = list(strategies or REUSE_STRATEGIES)
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise OptionError(f"memory plan: unknown strategy '{unknown[0]}' "
                          f"(known: {', '.join(STRATEGIES)})")
    graph = main_graph(model)
    method, optimal = "original", None
    if reorder:
        chosen = schedule_for_memory(graph, alignment=alignment, inplace=inplace,
                                     fold_constants=fold_constants, time_budget=time_budget,
                                     formats=formats)
        schedule, method, optimal = chosen.order, chosen.method, chosen.optimal
    live = liveness(graph, schedule, fold_constants=fold_constants, formats=formats)
    storage = Storage(graph, live.kind, live.nbytes, alignment=alignment, inplace=inplace,
                      copies=live.copies, device_format=live.device_format)
    assignment = storage.assign(live.schedule)
    buffers = assignment.buffers
    notes = []
    pairs = count_conflicts(buffers)
    if strategies is None and pairs > MAX_PAIRS:
        names = [n for n in names if n not in PAIRWISE_STRATEGIES]
        notes.append(f"{pairs:,} pairs of tensors live at a common step: placed by "
                     f"{' and '.join(names)} alone (the greedy strategies go pair by pair)")
    # Shared: the pairs of buffers live at a common step, for the strategies that use them.
    meets = conflicts(buffers) if any(n in PAIRWISE_STRATEGIES for n in names) else None
    candidates = {}
    results = {}
    for name in dict.fromkeys(["naive", *names]):
        results[name] = STRATEGIES[name](buffers, meets)
        candidates[name] = arena_size(buffers, results[name])
    chosen_name = min((n for n in names), key=lambda n: (candidates[n], names.index(n)))
    offsets = results[chosen_name]
    plan = _assemble(live, assignment, offsets, chosen_name, candidates, alignment, method)
    plan.schedule_optimal = optimal
    plan.formats, plan.transdata_copies = formats, len(live.copies)
    plan.notes[:0] = notes
    return plan


def _assemble(live: Liveness, assignment: Assignment, offsets: dict[int, int], strategy: str,
              candidates: dict[str, int], alignment: int, method: str) -> Plan:
    graph, storage, buffers = live.graph, assignment.storage, assignment.buffers
    tensors: dict[str, TensorPlan] = {}
    external: dict[str, str] = {}
    for value in live.first:
        b = assignment.buffer(value)
        if b is None:
            external[value.name] = (storage.group_of[value].kind if is_external_view(storage, value)
                                    else live.kind[value])
            continue
        view, inplace = storage.view_of.get(value), assignment.inplace.get(value)
        tensors[value.name] = TensorPlan(value.name, offsets[b], live.nbytes[value],
                                         live.first[value], live.last[value], b,
                                         view.name if view is not None else "",
                                         inplace.name if inplace is not None else "")
    for value in live.kind:
        if value.producer is None and value not in live.copies:
            external[value.name] = live.kind[value]
    outputs = {id(v): v for v in graph.outputs}
    notes = [f"{node.qualified_op} '{node.name}': memory inside its subgraphs is the runtime's, "
             "not planned" for node in live.schedule if node.subgraphs()]
    return Plan(
        tensors=tensors,
        arena_bytes=arena_size(buffers, offsets),
        lower_bound=lower_bound(buffers),
        weight_bytes=live.bytes_of(WEIGHT),
        input_bytes=sum(live.nbytes[v] for v in graph.inputs if live.kind[v] == INPUT),
        output_bytes=sum(tensor_bytes(v) for v in outputs.values()),
        strategy=strategy, candidates=candidates, alignment=alignment,
        schedule=live.schedule, schedule_method=method, buffers=buffers, offsets=dict(offsets),
        external=external, notes=notes)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
