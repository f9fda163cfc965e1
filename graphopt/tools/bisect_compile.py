"""Compiles for bisection: optimize() with only the first k rewrites allowed, every gate call
recorded with its pass run, optionally stopped after a given pass run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onnx import ModelProto

from graphopt.errors import GraphoptError, InputError, ModelAtFault, OptionError, PassError
from graphopt.ir import Model
from graphopt.passes import PIPELINES
from graphopt.passes.base import anchor_key
from graphopt.passes.instruments import Instrument

if TYPE_CHECKING:
    from graphopt.ir import Node
    from graphopt.partition import Target


class NondeterministicCompile(GraphoptError):
    """Two compiles of the same model asked the gate for different rewrites."""


@dataclass(frozen=True)
class GateCall:
    """One rewrite a pass asked the gate for."""

    pass_name: str
    run: int       # 0-based index of the pass run in the manager's log
    rule: str
    anchor: str    # passes.base.anchor_key of the node the pass matched

    def describe(self) -> str:
        return f"{self.pass_name} (pass run {self.run + 1}) {self.rule} at {self.anchor}"


@dataclass(frozen=True)
class RunInfo:
    name: str
    iteration: int  # fixed-point iteration, 0 outside a fixed-point group
    changed: bool


class _Stop(Exception):
    """Raised by RunTracker to end a compile early; never leaves compile_prefix."""


class RunTracker(Instrument):
    """Numbers the pass runs (so the gate knows which run asks), keeps the model being compiled
    and the pipeline's name, and stops the compile after run `stop_after` (-1: before the first
    pass, None: never)."""

    def __init__(self, stop_after: int | None = None):
        self.stop_after = stop_after
        self.runs: list[RunInfo] = []
        self.model: Model | None = None
        self.pipeline = ""

    def start(self, model) -> None:
        self.model = model
        if self.stop_after == -1:
            raise _Stop

    def after_pass(self, model, record, log) -> None:
        self.pipeline = log.pipeline
        self.runs.append(RunInfo(record.name, record.iteration, record.changed))
        if self.stop_after is not None and len(self.runs) > self.stop_after:
            raise _Stop

    def finish(self, model, log) -> None:
        self.pipeline = log.pipeline


class PrefixGate:
    """A rewrite gate allowing the first `limit` calls (every call when None) and recording
    all of them."""

    def __init__(self, limit: int | None, tracker: RunTracker):
        self.limit = limit
        self.tracker = tracker
        self.calls: list[GateCall] = []

    def __call__(self, pass_name: str, rule: str, node: Node) -> bool:
        # The run asking is the one after the last finished run.
        self.calls.append(GateCall(pass_name, len(self.tracker.runs), rule, anchor_key(node)))
        return self.limit is None or len(self.calls) <= self.limit


@dataclass
class Setup:
    """What every compile of one bisection shares."""

    source: ModelProto
    label: str
    level: int
    target: Target | None = None
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    pass_options: dict = field(default_factory=dict)  # e.g. precision, for optimize()
    switches: dict = field(default_factory=dict)  # disable_passes, switch_file, fold_size_limit

    def __post_init__(self) -> None:
        if self.level not in PIPELINES:
            raise OptionError(f"optimization level {self.level} does not exist "
                              f"(use 0 to {max(PIPELINES)})")


@dataclass
class Compiled:
    model: Model
    calls: list[GateCall]
    runs: list[RunInfo]   # the runs that finished, in log order
    pipeline: str
    limit: int | None
    stopped: bool         # ended early by stop_after


def compile_prefix(setup: Setup, limit: int | None, stop_after: int | None = None) -> Compiled:
    """Compile with graphopt.compiler.optimize under a PrefixGate(limit), with the RunTracker
    as an instrument (which may stop the compile after a given run); no verification."""
    from graphopt.compiler import optimize

    tracker = RunTracker(stop_after)
    gate = PrefixGate(limit, tracker)
    stopped = False
    try:
        optimize(setup.source, level=setup.level, input_shapes=setup.input_shapes or None,
                 target=setup.target, rewrite_gate=gate, pass_options=setup.pass_options,
                 instruments=[tracker], **setup.switches)
    except _Stop:
        stopped = True
    except PassError as e:
        allowed = "every rewrite" if limit is None else f"the first {limit} rewrite(s)"
        raise PassError(f"{e} (bisect: compiling with {allowed} allowed)") from e
    except ModelAtFault:
        raise
    except InputError:
        # After the passes ran, an InputError is optimize's final check that onnxruntime
        # loads (and can run) the result: a rewrite gone wrong, which is what bisect looks
        # for (a LayerNormalization given axis 7 had ended the search with that error). Its
        # evaluation runs the model and counts the refusal as broken outputs. Refused with no
        # rewrite allowed, the fault is the model's or its pins', which the error names.
        if not tracker.runs or tracker.model is None or limit == 0:
            raise
    return Compiled(tracker.model, gate.calls, tracker.runs, tracker.pipeline, limit, stopped)


def check_same_calls(recording: list[GateCall], compiled: Compiled) -> None:
    """A prefix compile must ask for the recording's rewrites in the same order up to and
    including its first denied one; otherwise prefixes of the recording mean nothing."""
    upto = len(compiled.calls) if compiled.limit is None else compiled.limit + 1
    for index, (want, got) in enumerate(zip(recording[:upto], compiled.calls[:upto])):
        if want != got:
            raise NondeterministicCompile(
                f"the compile is not deterministic: rewrite {index + 1} was "
                f"{want.describe()} in the first compile but {got.describe()} in the compile "
                f"allowing {compiled.limit}; bisection needs every compile of the model to ask "
                "for the same rewrites in the same order")
    if len(compiled.calls) < min(upto, len(recording)) and not compiled.stopped:
        raise NondeterministicCompile(
            f"the compile is not deterministic: the first compile asked for "
            f"{len(recording)} rewrites, the compile allowing {compiled.limit} only for "
            f"{len(compiled.calls)}")
