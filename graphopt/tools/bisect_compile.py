"""Compiles for bisection: optimize()'s pipeline with only the first k rewrites allowed, every
gate call recorded with its pass run, optionally stopped after a given pass run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onnx import ModelProto

from graphopt.errors import GraphoptError, OptionError, PassError
from graphopt.input_shapes import pin_input_shapes
from graphopt.ir import Model, load_onnx
from graphopt.opcheck import check_ops
from graphopt.passes import PIPELINES, Options, PassContext, PassManager, for_target
from graphopt.passes.base import anchor_key
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.instruments import Instrument, VerifyAfterEachPass

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
    """Numbers the pass runs (so the gate knows which run asks) and stops the compile after
    run `stop_after` (-1: before the first pass, None: never)."""

    def __init__(self, stop_after: int | None = None):
        self.stop_after = stop_after
        self.runs: list[RunInfo] = []

    def start(self, model) -> None:
        if self.stop_after == -1:
            raise _Stop

    def after_pass(self, model, record, log) -> None:
        self.runs.append(RunInfo(record.name, record.iteration, record.changed))
        if self.stop_after is not None and len(self.runs) > self.stop_after:
            raise _Stop


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

    def __post_init__(self) -> None:
        if self.level not in PIPELINES:
            raise OptionError(f"optimization level {self.level} does not exist "
                              f"(use 0 to {max(PIPELINES)})")

    def options(self) -> Options:
        """Fresh per compile: the driver writes into them (the NCHWc block size)."""
        return Options(level=self.level, input_shapes=dict(self.input_shapes))


@dataclass
class Compiled:
    model: Model
    calls: list[GateCall]
    runs: list[RunInfo]   # the runs that finished, in log order
    pipeline: str
    limit: int | None
    stopped: bool         # ended early by stop_after


def compile_prefix(setup: Setup, limit: int | None, stop_after: int | None = None) -> Compiled:
    """Compile as graphopt.compiler.optimize does (same import checks, pins, pipeline, target
    tail) but under a PrefixGate(limit) and the RunTracker; no verification or partitioning.
    optimize() takes no instruments, hence this driver; tests/test_bisect.py checks that both
    compile to the same model."""
    model = load_onnx(setup.source)
    check_ops(model, setup.label)
    options = setup.options()
    if options.input_shapes:
        pin_input_shapes(model, options.input_shapes)
        infer_shapes(model)
    tracker = RunTracker(stop_after)
    gate = PrefixGate(limit, tracker)
    ctx = PassContext(options, target=setup.target, gate=gate)
    # Structure first: a run that breaks the graph is named before the tracker may stop.
    instruments = ([VerifyAfterEachPass()] if options.verify_structure else []) + [tracker]
    target = setup.target
    if target is not None and not options.nchwc_block_size:
        options.nchwc_block_size = target.device(target.primary).nchwc_block_size
    pipeline = for_target(PIPELINES[options.level], target)
    stopped = False
    try:
        PassManager(pipeline, ctx, instruments).run(model)
    except _Stop:
        stopped = True
    except PassError as e:
        allowed = "every rewrite" if limit is None else f"the first {limit} rewrite(s)"
        raise PassError(f"{e} (bisect: compiling with {allowed} allowed)") from e
    return Compiled(model, gate.calls, tracker.runs, pipeline.name, limit, stopped)


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
