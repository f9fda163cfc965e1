"""`graphopt bisect`: the first pass run, then the first rewrite in it, after which the
optimized model's outputs break tolerance against the original.

One compile with a recording gate numbers every rewrite the passes ask for (RulePass rules,
fusions, layout, folding, cleanups). If that model is out of tolerance, a binary search on k
(compile allowing only the first k rewrites; compiles are deterministic, so those are the
recording's first k) finds the smallest k that breaks: rewrite k is the culprit, and its pass
run comes with it. EliminateDeadNodes and InferShapes ask no gate (removing dead nodes and
inferring shapes never change outputs). A pass that asks no gate and breaks outputs anyway is
found by a second search over the pass runs of one compile, at pass granularity.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
from onnx import ModelProto

from graphopt import api_args, numerics
from graphopt.errors import InputError, OptionError, model_label, one_line
from graphopt.input_shapes import check_pins, check_pins_fit_feeds, input_shapes_argument
from graphopt.ir import to_onnx
from graphopt.ir.onnx_io import read_model_proto
from graphopt.option_names import BISECT_FLAGS, option, setting, usage
from graphopt.rounding import weight_rounding, within_rounding
from graphopt.tools.accuracy_rule import accuracy_rule, below_cosine
from graphopt.tools.rule_text import rule_text
from graphopt.tools.bisect_compile import (
    Compiled,
    GateCall,
    RunInfo,
    Setup,
    check_same_calls,
    compile_prefix,
)
from graphopt.tools.bisect_diff import rewrite_lines
from graphopt.tools.compare import DEFAULT_ATOL, DEFAULT_RTOL

# Passes that cannot change outputs by design; a run of theirs after the culprit's needs no check.
SAFE_PASSES = frozenset({"EliminateDeadNodes", "InferShapes"})


@dataclass
class BisectResult:
    """`found` False: the full compile is within tolerance. Otherwise the culprit at
    `granularity` "rewrite" (pass, run, rule, anchor), "pass" (a pass that asks no rewrite gate,
    so no finer granularity) or "import" (the model breaks before any pass runs)."""

    model: str
    pipeline: str
    found: bool
    total_rewrites: int          # rewrites the full compile asked the gate for
    pass_runs: int               # runs in the full compile's pass log
    evaluations: int = 0         # compiled models run in onnxruntime and compared
    problem: str = ""            # how the outputs differ after the culprit (or "")
    granularity: str = ""
    pass_name: str | None = None
    pass_run: int | None = None  # 1-based position in the pass log of the compile allowing
    allowed: int | None = None   # the first `allowed` rewrites (fewer rewrites, fewer fixed-point
                                 # sweeps: a pass culprit's run number is of that compile)
    iteration: int | None = None  # fixed-point iteration of that run (0: not in a group)
    rule: str | None = None
    anchor: str | None = None
    rewrite: int | None = None   # 1-based among all rewrites of the compile
    rewrite_in_run: int | None = None  # 1-based among the rewrites of its pass run
    rewrites_in_run: int | None = None
    enabled_by: str | None = None  # a pass culprit that only breaks after this rewrite
    before_lines: list[str] = field(default_factory=list)  # "- " removed, "  " context
    after_lines: list[str] = field(default_factory=list)   # "+ " created, "  " context
    target: str | None = None    # the target compiled for (None: no target)
    switched_off: list[str] = field(default_factory=list)  # passes and rules switched off
    inputs: str = ""             # what the outputs were compared on
    judged_by: str = ""          # the rule: "allclose(rtol=…, atol=…)" or "cosine >= …"
    rule_note: str = ""          # why the rule is cosine when none was given (a lossy compile)
    rounding_note: str = ""      # the full compile (or, once found, an evaluation on the
                                 # way) passed the default rule by rounding alone: which
                                 # allowance it met (rounding.within_rounding)
    empty_outputs: list[str] = field(default_factory=list)  # outputs holding no element, which
                                                            # no rule can fail

    def to_json(self) -> dict:
        return asdict(self)


class _Evaluator:
    """Runs compiled models against the original's outputs, counting and reporting each run."""

    def __init__(self, reference: ModelProto, feeds: dict, progress: Callable[[str], None],
                 inputs: str = "seeded random inputs", rounding: bool = True,
                 label: str = "the original model"):
        self.reference, self.feeds, self.progress = reference, feeds, progress
        self.judge = {"rtol": DEFAULT_RTOL, "atol": DEFAULT_ATOL, "min_cosine": None}
        # Outputs off by rounding alone pass, as under --verify and compare (rounding.py);
        # False where the user gave tolerances, which apply as given.
        self.rounding = rounding
        self.rounding_note: str | None = None  # of the last evaluation, if it passed by it
        self.passed_by_rounding = ""  # the note of the last evaluation that did
        self.count = 0
        self._own: dict | Exception | None = None  # the original at ORT_ENABLE_ALL, once run
        self._moved: dict | Exception | None = None  # its rounding.weight_rounding, once run
        try:
            self.expected = numerics.run(reference, feeds)
        except Exception as e:  # noqa: BLE001 - onnxruntime's own message is the explanation
            reason = numerics.ort_reason(e)
            # A model onnxruntime refuses to load is at fault whatever the inputs.
            loads = ("Invalid model", "INVALID_GRAPH", "is not a registered function/op")
            on = "" if any(text in reason for text in loads) else f" on {inputs}"
            raise InputError(f"onnxruntime cannot run {label}{on}: {reason}") from None

    def __call__(self, compiled: Compiled, what: str) -> str | None:
        """How `compiled`'s outputs break tolerance, or None when they do not."""
        self.count += 1
        self.rounding_note = None
        from graphopt.compile_verify import not_runnable_here

        proto = to_onnx(compiled.model)
        not_here = not_runnable_here(proto, "bisect")
        if not_here:  # every compile would "break" the outputs, each by the same layout pass
            raise OptionError(not_here)
        try:
            actual = numerics.run(proto, self.feeds)
        except Exception as e:  # noqa: BLE001 - a wrong rewrite may leave a model ORT refuses
            problem = f"the optimized model does not run: {numerics.ort_reason(e)}"
        else:
            judge = self.judge
            if judge["min_cosine"] is not None:
                mismatches = below_cosine(self.expected, actual, judge)
            else:
                mismatches = self._beyond_rounding(actual, judge)
            problem = "; ".join(str(m) for m in mismatches[:3]) or None
        verdict = ("ok" + (" (rounding alone, see note)" if self.rounding_note else "")
                   if problem is None else f"outputs differ: {problem}")
        self.progress(one_line(f"bisect: evaluation {self.count}: {what}: {verdict}"))
        return problem

    def _own_outputs(self) -> dict:
        """The original's outputs at ORT_ENABLE_ALL (rounding's baseline), run once however
        many compiles fail: a bisect of a large model may judge dozens."""
        if self._own is None:
            try:
                self._own = numerics.run(self.reference, self.feeds, "all")
            except Exception as e:  # noqa: BLE001 - within_rounding takes it as no baseline
                self._own = e
        if isinstance(self._own, Exception):
            raise RuntimeError(str(self._own))  # a fresh one: re-raising grows its traceback
        return self._own

    def _weight_rounding(self) -> dict:
        """rounding.weight_rounding of the original on the feeds, run once, as _own_outputs."""
        if self._moved is None:
            try:
                self._moved = weight_rounding(self.reference, self.feeds)
            except Exception as e:  # noqa: BLE001 - within_rounding takes it as no yardstick
                self._moved = e
        if isinstance(self._moved, Exception):
            raise RuntimeError(str(self._moved))
        return self._moved

    def _beyond_rounding(self, actual: dict, judge: dict) -> list:
        """The outputs outside rtol/atol, none when rounding explains them all (as --verify's
        compile_verify._beyond_rounding judges; the note says which allowance they met)."""
        mismatches = numerics.compare(self.expected, actual, judge["rtol"], judge["atol"])
        if not mismatches or not self.rounding or set(self.expected) - set(actual):
            return mismatches
        failing = [name for name, reference in self.expected.items()
                   if numerics.compare({name: reference}, {name: actual[name]}, judge["rtol"],
                                       judge["atol"])]
        self.rounding_note = within_rounding(self.reference, self.feeds, self.expected, actual,
                                             failing, judge, own=self._own_outputs,
                                             sensitivity=self._weight_rounding)
        self.passed_by_rounding = self.rounding_note or self.passed_by_rounding
        return [] if self.rounding_note else mismatches


def _load(model) -> tuple[ModelProto, str]:
    model = api_args.model(model, "model")
    if isinstance(model, ModelProto):
        return model, "<model>"
    return read_model_proto(model), model


def _feeds(reference: ModelProto, label: str, feeds, shapes: dict) -> dict:
    from graphopt.codegen.feeds import check_feeds, typed_inputs

    check_pins(shapes, typed_inputs(reference), label)
    if feeds is not None:
        from graphopt.compile_verify import load_inputs  # the --inputs .npz reader of --verify

        arrays = load_inputs(feeds, option("feeds", BISECT_FLAGS))
        where = (option("feeds", BISECT_FLAGS) if isinstance(feeds, Mapping)
                 else setting("feeds", feeds, BISECT_FLAGS))
        try:
            check_feeds(typed_inputs(reference), arrays)
        except InputError as e:
            raise InputError(f"{where}: {e}") from None
        check_pins_fit_feeds(shapes, arrays, where)
        return arrays
    try:
        return numerics.random_feeds(reference, seed=0, shapes=shapes,
                                     feeds_keyword="feeds")
    except ValueError as e:
        raise OptionError(f"bisect: {e} (give {option('feeds', BISECT_FLAGS)})") from None


def _switched_off(switches: dict) -> list[str]:
    """The pass and rule names the compiles leave out, by disable_passes and the switch file
    (both checked by the compile that ran before this)."""
    from graphopt.switches import read_switch_file

    names = set(api_args.names(switches["disable_passes"], "disable_passes"))
    if switches["switch_file"]:
        names |= read_switch_file(os.fspath(switches["switch_file"]))
    return sorted(names)


def _rule_text(judge: dict) -> str:
    return rule_text(judge["rtol"], judge["atol"], judge["min_cosine"])


def _prefix(k: int, calls: list[GateCall]) -> str:
    if k == 0:
        return f"no rewrite of {len(calls)} allowed"
    return f"first {k} of {len(calls)} rewrites (last: {calls[k - 1].describe()})"


def bisect(model, *, level: int = 2, target=None, feeds=None, rtol: float | None = None,
           atol: float | None = None, min_cosine: float | None = None, input_shapes=None,
           allow_custom_ops: bool = False, precision: str = "keep", quantize: str = "none",
           calibration: str | os.PathLike | None = None, pass_options: dict | None = None,
           disable_passes=(), switch_file: str | os.PathLike | None = None,
           fold_size_limit: int | str | None = None,
           progress: Callable[[str], None] | None = None) -> BisectResult:
    """Find what breaks `model`'s outputs (path, bytes or ModelProto) at -O`level`, against
    onnxruntime at ORT_DISABLE_ALL on `feeds` (a dict, an .npz path, or seeded random inputs
    shaped by `input_shapes`); `allow_custom_ops` keeps ops of unknown domains in the
    compiles, as optimize's does. `progress` receives one line per evaluation.

    `precision`, `quantize`, `calibration`, `pass_options`, `disable_passes`, `switch_file` and
    `fold_size_limit` compile as optimize's do, so that the compile bisected is the one that
    broke (a pass switched off there is off in every compile here too). The
    outputs break when they fail allclose(`rtol`, `atol`) (1e-4, 1e-5) or, given `min_cosine`,
    a cosine below it; a compile a lossy precision pass changed is judged by cosine when no
    rule is given, as `graphopt compare` judges it. With neither `rtol` nor `atol` given,
    outputs off by rounding alone do not break, as under --verify and compare
    (rounding.within_rounding); tolerances given apply as given."""
    # Checked as optimize and compare_models check theirs: rtol=-1 or min_cosine=5 had made
    # every compile break, naming a culprit, and rtol="1e-3" or feeds=[array] raised from numpy.
    level = api_args.integer(level, option("level", BISECT_FLAGS))
    feeds = api_args.feeds(feeds, option("feeds", BISECT_FLAGS))
    rtol, atol = (api_args.tolerance(value, option(keyword, BISECT_FLAGS))
                  for keyword, value in (("rtol", rtol), ("atol", atol)))
    min_cosine = api_args.cosine(min_cosine, option("min_cosine", BISECT_FLAGS))
    target = api_args.target(target)
    allow_custom_ops = api_args.flag(allow_custom_ops, "allow_custom_ops")
    calibration = api_args.path(calibration, "calibration")
    pass_options = api_args.mapping(pass_options, "pass_options")
    if progress is not None and not callable(progress):
        raise OptionError(f"progress: expected a function taking a line of text, got "
                          f"{api_args.shown(progress)}")
    progress = progress or (lambda line: None)
    if min_cosine is not None and (rtol is not None or atol is not None):
        raise OptionError(f"{option('min_cosine', BISECT_FLAGS)} replaces the "
                          f"{option('rtol', BISECT_FLAGS)}/{option('atol', BISECT_FLAGS)} rule; "
                          "give one or the other")
    source, label = _load(model)
    with model_label(label):  # the compiles read the proto: errors name the file
        shapes = input_shapes_argument(input_shapes)
        options = {**pass_options, **({"allow_custom_ops": True} if allow_custom_ops else {})}
        for keyword, value, default in (("precision", precision, "keep"),
                                        ("quantize", quantize, "none"),
                                        ("calibration", calibration, None)):
            if value not in (None, default):
                options[keyword] = value
        switches = {"disable_passes": disable_passes, "switch_file": switch_file,
                    "fold_size_limit": fold_size_limit}
        setup = Setup(source, label, level, target, shapes, pass_options=options,
                      switches=switches)
        arrays = _feeds(source, label, feeds, shapes)
        inputs = setting("feeds", feeds, BISECT_FLAGS) if isinstance(feeds, (str, os.PathLike)) \
            else "the given inputs" if feeds is not None else "seeded random inputs"
        # A 1×1 image or a one-token sequence says little: say so, as compare does.
        if feeds is None:
            from graphopt.codegen.feeds import typed_inputs
            from graphopt.tools.compare_run import open_dims_note

            opened = open_dims_note(typed_inputs(source), shapes, arrays)
            inputs += f" ({opened})" if opened else ""
        evaluate = _Evaluator(source, arrays, progress, inputs, label=label,
                              rounding=rtol is None and atol is None)

        full = compile_prefix(setup, None)
        calls = full.calls
        choose = (f"{usage('min_cosine', 'C', BISECT_FLAGS)} or {option('rtol', BISECT_FLAGS)}/"
                  f"{option('atol', BISECT_FLAGS)} choose the rule")
        evaluate.judge, rule_note = accuracy_rule(
            [{"pass": run.name, "changed": run.changed} for run in full.runs], rtol, atol,
            min_cosine, choose)
        result = BisectResult(label, full.pipeline, False, len(calls), len(full.runs),
                              target=target.name if target is not None else None, inputs=inputs,
                              switched_off=_switched_off(switches),
                              judged_by=_rule_text(evaluate.judge), rule_note=rule_note)
        problem = evaluate(full, f"full compile, {len(calls)} rewrites in {len(full.runs)} pass "
                                 "runs")
        if problem is None:
            result.evaluations = evaluate.count
            result.rounding_note = evaluate.rounding_note or ""
            empty = [name for name, value in evaluate.expected.items()
                     if isinstance(value, np.ndarray) and value.size == 0]
            if empty:  # "within tolerance" over no element says nothing: say so
                result.empty_outputs = empty
            return result
        result.found = True
        lo, hi, at_hi = 0, len(calls), full  # invariant: prefix hi breaks, prefix lo-1 does not
        while lo < hi:
            mid = (lo + hi) // 2
            compiled = compile_prefix(setup, mid)
            check_same_calls(calls, compiled)
            found = evaluate(compiled, _prefix(mid, calls))
            if found:
                hi, at_hi, problem = mid, compiled, found
            else:
                lo = mid + 1
        if hi == 0:
            _blame_pass(result, setup, evaluate, calls, 0, at_hi, -1, problem)
        else:
            _blame_rewrite(result, setup, evaluate, calls, hi, at_hi, problem)
        result.evaluations = evaluate.count
        result.rounding_note = evaluate.passed_by_rounding  # what "see note" in the progress meant
        return result


def _blame_rewrite(result: BisectResult, setup: Setup, evaluate: _Evaluator,
                   calls: list[GateCall], k: int, at_k: Compiled, problem: str) -> None:
    """Rewrite k breaks the compile allowing k; check that it breaks the model by itself (not
    through a later pass that asks no gate) unless nothing after its run could matter."""
    call = calls[k - 1]
    after = None
    if any(run.changed and run.name not in SAFE_PASSES for run in at_k.runs[call.run + 1:]):
        after = compile_prefix(setup, k, stop_after=call.run)
        check_same_calls(calls, after)
        alone = evaluate(after, f"first {k} rewrites, stopped after pass run {call.run + 1} "
                                f"({call.pass_name})")
        if alone is None:
            result.enabled_by = f"rewrite {k}: {call.describe()}"
            _blame_pass(result, setup, evaluate, calls, k, at_k, call.run, problem)
            return
        problem = alone
    after = after or compile_prefix(setup, k, stop_after=call.run)
    before = compile_prefix(setup, k - 1, stop_after=call.run)
    in_run = [i for i, c in enumerate(calls) if c.run == call.run]
    run = at_k.runs[call.run]
    result.problem, result.granularity = problem, "rewrite"
    result.pass_name, result.pass_run = call.pass_name, call.run + 1
    result.iteration = run.iteration
    result.rule, result.anchor, result.rewrite, result.allowed = call.rule, call.anchor, k, k
    result.rewrite_in_run, result.rewrites_in_run = in_run.index(k - 1) + 1, len(in_run)
    result.before_lines, result.after_lines = rewrite_lines(before.model, after.model)


def _blame_pass(result: BisectResult, setup: Setup, evaluate: _Evaluator,
                calls: list[GateCall], k: int, at_k: Compiled, start: int, problem: str) -> None:
    """The compile `at_k`, allowing the first k rewrites, breaks outputs; its state after run
    `start` does not (start -1: the imported model itself is a candidate). Search every run
    after `start`, not only those that reported a change: a custom pass that changes the
    model without saying so was passed over, and the import blamed."""
    runs: list[RunInfo] = at_k.runs
    candidates = ([-1] if start == -1 else []) + list(range(start + 1, len(runs)))
    lo, hi, at_hi = 0, len(candidates) - 1, None  # the last candidate's state is at_k's final one
    while lo < hi:
        mid = (lo + hi) // 2
        stop = candidates[mid]
        compiled = compile_prefix(setup, k, stop_after=stop)
        check_same_calls(calls, compiled)
        what = "the imported model" if stop == -1 else \
            f"pass runs 1-{stop + 1} (last: {runs[stop].name})"
        found = evaluate(compiled, f"{what}, {_prefix(k, calls)}")
        if found:
            hi, at_hi, problem = mid, compiled, found
        else:
            lo = mid + 1
    culprit = candidates[hi]
    result.problem = problem
    if culprit == -1:
        result.granularity = "import"
        return
    after = at_hi or compile_prefix(setup, k, stop_after=culprit)
    before = compile_prefix(setup, k, stop_after=culprit - 1)
    result.granularity = "pass"
    result.pass_name, result.pass_run, result.allowed = runs[culprit].name, culprit + 1, k
    result.iteration = runs[culprit].iteration
    result.before_lines, result.after_lines = rewrite_lines(before.model, after.model)
