"""The pass manager: runs a pipeline under instruments, repeats fixed-point groups, and
records time, node counts and rewrite counts per pass."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from graphopt.errors import GraphoptError, PassError, UsageError
from graphopt.ir import Model
from graphopt.ir.collector import collection_paused, heap_frozen
from graphopt.option_names import option
from graphopt.passes.base import PASSES, PassContext
from graphopt.passes.instruments import Instrument
from graphopt.passes.pipelines import FixedPoint, Pipeline
from graphopt.passes.unmatched import op_spellings

# A fixed point that keeps removing nodes may run this many times `max_iterations` sweeps.
_PROGRESS_CEILING = 4


@dataclass
class PassRecord:
    name: str
    iteration: int
    seconds: float
    nodes_before: int
    nodes_after: int
    changed: bool
    stats: dict[str, int]

    def to_json(self) -> dict:
        return {"pass": self.name, "iteration": self.iteration, "seconds": round(self.seconds, 6),
                "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
                "changed": self.changed, "rewrites": self.stats}


@dataclass
class PassLog:
    pipeline: str = ""
    records: list[PassRecord] = field(default_factory=list)

    def totals(self) -> dict[str, dict]:
        """Per pass: runs, seconds and rewrites summed over iterations, in first-run order."""
        totals: dict[str, dict] = {}
        for r in self.records:
            entry = totals.setdefault(r.name, {"runs": 0, "seconds": 0.0, "rewrites": Counter()})
            entry["runs"] += 1
            entry["seconds"] += r.seconds
            entry["rewrites"].update(r.stats)
        return totals

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline, "passes": [r.to_json() for r in self.records]}


def check_pass_names(names, what: str) -> None:
    """Passes and rules can both be switched off by name."""
    from graphopt.passes.rules import RULES, rule_passes

    rules = set(RULES) | set(rule_passes())
    unknown = sorted(set(names) - set(PASSES) - rules)
    if unknown:
        hint = did_you_mean(unknown, (*PASSES, *sorted(rules)))
        raise UsageError(f"{what}: unknown pass or rule {', '.join(unknown)} ({hint}passes: "
                          f"{', '.join(sorted(PASSES))}; `graphopt passes` lists the rules)")


def did_you_mean(unknown, known) -> str:
    """"did you mean X? " for names that are a known one in another case (`foldconstants`) or
    close to one (`FuseLayrNorm`, `FuseConvBN`), else ""."""
    import difflib

    by_case = {name.lower(): name for name in known}
    meant = []
    for name in unknown:
        close = [by_case[name.lower()]] if name.lower() in by_case else \
            difflib.get_close_matches(name, list(known), n=1, cutoff=0.7)
        meant += [m for m in close if m not in meant]
    return f"did you mean {', '.join(meant)}? " if meant else ""


class PassManager:
    def __init__(self, pipeline: Pipeline, ctx: PassContext,
                 instruments: list[Instrument] | None = None):
        self.pipeline = pipeline
        self.ctx = ctx
        self.instruments = instruments or []
        # The node count after the last pass, which is the next pass's count before (a walk
        # of the whole graph, twice per pass, otherwise); instruments may edit, so with them
        # every count is taken afresh.
        self._count: int | None = None
        check_pass_names(ctx.options.disabled_passes, option("disable_passes"))

    def run(self, model: Model) -> PassLog:
        # The IR is long-lived: frozen, it is not walked again by each full collection the
        # passes' churn triggers (13 s of a 100k-node compile). Nor are the nodes the passes
        # build (collections paused: 0.9 s of the fusion sweeps at 100k nodes); what they
        # drop is collected after the block, like the frozen nodes they delete.
        with collection_paused(), heap_frozen():
            return self._run(model)

    def _run(self, model: Model) -> PassLog:
        self._count = None
        options = self.ctx.options
        self.ctx.cut_names = self.ctx.cut_names | model.cut_names
        # Only a compile given node names to match (--keep-dtype, --quant-skip) reads them.
        if not self.ctx.source_names and (options.keep_dtype or options.quant_skip):
            self.ctx.source_names = frozenset(
                name for node in model.graph.all_nodes()
                for name in (node.name, *op_spellings(node)) if name)
        log = PassLog(self.pipeline.name)
        started = []
        try:
            for instrument in self.instruments:
                instrument.start(model)
                started.append(instrument)
            for step in self.pipeline.steps:
                if isinstance(step, FixedPoint):
                    self._fixed_point(model, step, log)
                else:
                    self._run_pass(model, step, 0, log)
            for instrument in self.instruments:
                instrument.finish(model, log)
        finally:
            for instrument in started:
                instrument.close()
        return log

    def _fixed_point(self, model: Model, step: FixedPoint, log: PassLog) -> None:
        cap = self.ctx.options.max_iterations
        # Past the cap, a sweep that still removes nodes is progress, not a cycle: each sweep
        # types one more stage of a chain of computed pads (a Swin model's windows), so those
        # sweeps go on, up to a ceiling that bounds the compile time.
        nodes = model.graph.count_nodes()
        iteration = 0
        while iteration < _PROGRESS_CEILING * cap:
            iteration += 1
            changed = False
            for name in step.passes:
                changed |= self._run_pass(model, name, iteration, log)
            if not changed:
                return
            before, nodes = nodes, model.graph.count_nodes()
            if iteration >= cap and nodes >= before:
                break
        self.ctx.note(f"fixed point of {', '.join(step.passes)} not reached in "
                      f"{iteration} iterations")

    def _run_pass(self, model: Model, name: str, iteration: int, log: PassLog) -> bool:
        if name in self.ctx.options.disabled_passes:
            return False
        pass_ = PASSES[name]()
        before = self._count if self._count is not None and not self.instruments \
            else model.graph.count_nodes()
        self._count = None
        start = time.perf_counter()
        self.ctx.current_pass = name
        try:
            result = pass_.run(model, self.ctx)
        except GraphoptError:
            raise  # already one line naming what is at fault (an option, the input model)
        except Exception as e:  # noqa: BLE001 - name the pass, keep the cause chained
            done = [r.name for r in log.records][-5:]
            history = f" (after: {', '.join(done)})" if done else ""
            raise PassError(f"pass {name} failed: {type(e).__name__}: {e}{history}") from e
        seconds = time.perf_counter() - start
        self._count = model.graph.count_nodes()
        record = PassRecord(name, iteration, seconds, before, self._count,
                            result.changed, dict(result.stats))
        log.records.append(record)
        for instrument in self.instruments:
            instrument.after_pass(model, record, log)
        return result.changed
