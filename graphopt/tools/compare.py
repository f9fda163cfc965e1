"""compare_models: a reference and a candidate run on the same inputs, judged tensor by tensor.

Each compared tensor becomes a Row with msaccucmp's metrics (graphopt.tools.metrics) and a verdict:
- shapes differ, or dtypes differ unless both are floating point (an f16 candidate is compared
  with its f32 reference on values, with a note): fail, no metrics.
- integer, bool and string tensors: exact equality; `mismatches` counts unequal elements.
- bfloat16 and float8 tensors (ml_dtypes arrays) are judged as the float32 values they hold.
- a sequence passes when its length matches and every element passes, a map when its keys
  match and every value passes, an empty optional (None) when the other is empty too; the row
  is labelled by its type (`seq(map(int64,float32))[3]`, `optional(None)`); its cosine is its
  lowest element's, its other metrics those of all the values it holds together.
- float tensors: a NaN or Inf on either side fails the row unless the other side has the same
  there (NaN for NaN, an infinity of the same sign), as numpy's allclose with equal_nan judges
  them; they are counted in the note, and the metrics cover the elements finite in both.
  Otherwise the rule is allclose, every element
  within |c - r| <= atol + rtol·|r| (rtol 1e-4, atol 1e-5 by default; between two float16
  tensors rtol is at least float16's step, metrics.effective_rtol), or, when `min_cosine` is
  given instead, cosine similarity >= min_cosine, and the norms' agreement too
  (metrics.norm_agreement: a uniform 30% error keeps the cosine at 1). `mismatches` always
  counts the elements
  outside rtol/atol. Empty tensors pass. KL divergence is filled in only for probability
  distributions (the rule is in graphopt.tools.metrics).

Only outputs decide `CompareReport.passed`. With per_tensor=True the values both graphs compute
under the same name with the same shape are compared too, in the candidate's graph order; they
are informative, and the first one that fails (`first_failing_intermediate`) is where accuracy
broke. A shared name whose shapes differ (a layout change, say) is skipped and counted in notes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx

from graphopt import api_args
from graphopt.codegen.feeds import output_label, proto_type, type_label
from graphopt.errors import GraphoptError, OptionError, naming
from graphopt.ir.dtypes import DType
from graphopt.lent_weights import lending
from graphopt.numerics import Mismatch, paired, random_inputs_hint, widened
from graphopt.option_names import COMPARE_FLAGS, option, setting
from graphopt.random_seeds import seeding_note
from graphopt.rounding import within_half_precision, within_rounding
from graphopt.tools import metrics
from graphopt.tools.compare_run import (
    check_signatures,
    load_candidate,
    load_reference,
    make_feeds,
    source_note,
    with_candidates_edits,
)
from graphopt.tools.rule_text import cosine_text, exact, rule_text
from graphopt.tools.slices import hidden_slice_warning, worst_slice

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


@dataclass
class Row:
    """One tensor's comparison; a metric is None where it does not apply."""

    name: str
    role: str                      # "output" or "intermediate"
    dtype: str                     # the reference's, short: "f32"; or its type: "seq(float32)"
    shape: tuple | None            # a sequence's or map's length; None for an empty optional
    passed: bool = True
    cosine: float | None = None
    max_abs: float | None = None
    mean_abs: float | None = None
    max_rel: float | None = None
    mean_rel: float | None = None
    rmse: float | None = None
    kl: float | None = None
    mismatches: int | None = None  # elements beyond rtol/atol (unequal, for exact dtypes)
    note: str = ""
    producer: str = ""             # the candidate's node computing it
    partition: str = ""            # its .om partition

    def to_dict(self) -> dict:
        data = asdict(self)
        data["shape"] = None if self.shape is None else list(self.shape)
        return data


def _short(dtype: np.dtype) -> str:
    try:
        return DType.from_numpy(dtype).short
    except (KeyError, TypeError, ValueError):
        return str(dtype)


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def layout(value: Any, declared: str | None = None) -> tuple[str, tuple | None]:
    """A row's dtype and shape for a value: a tensor's short dtype and shape, a sequence's or
    map's type (`declared` where given) and length, `optional(None)` and no shape for None."""
    if value is None:
        return output_label(None), None
    if isinstance(value, (list, tuple, Mapping)):
        return output_label(value, declared), (len(value),)
    array = np.asarray(value)
    return _short(array.dtype), tuple(array.shape)


def _structured(value: Any) -> bool:
    return value is None or isinstance(value, (list, tuple, Mapping))


def compare_arrays(name: str, reference, candidate, *, rtol: float = DEFAULT_RTOL,
                   atol: float = DEFAULT_ATOL, min_cosine: float | None = None,
                   role: str = "output", declared: str | None = None) -> Row:
    """Judge `candidate` against `reference` by the rules in this module's docstring.
    `declared` is the reference's type label for a sequence or map (`seq(float32)`)."""
    judge = {"rtol": rtol, "atol": atol, "min_cosine": min_cosine}
    if _structured(reference) or _structured(candidate):
        return _compare_values(name, reference, candidate, role, declared, judge)
    ref, cand = np.asarray(reference), np.asarray(candidate)
    row = Row(name, role, _short(ref.dtype), tuple(ref.shape))
    same_dtype, cand_dtype = ref.dtype == cand.dtype, _short(cand.dtype)
    ref, cand = widened(ref), widened(cand)  # bfloat16 and float8 as the floats they hold
    floats = ref.dtype.kind in "fc" and cand.dtype.kind in "fc"
    if ref.shape != cand.shape:
        row.passed, row.note = False, f"shape {_shape(cand.shape)} vs reference {_shape(ref.shape)}"
        return row
    if not same_dtype:
        row.note = f"dtype {cand_dtype} vs reference {row.dtype}"
        if not floats:
            row.passed = False
            return row
    if not floats:
        row.mismatches = int(np.count_nonzero(ref != cand))
        row.passed = row.mismatches == 0
        if ref.dtype.kind in "iu":
            row.max_abs, row.mean_abs = metrics.absolute_errors(ref, cand)
        return row
    if ref.dtype.kind == "c" or cand.dtype.kind == "c":  # judge complex numbers as (re, im) pairs
        ref, cand = (np.stack([a.real, a.imag], axis=-1) for a in (ref, cand))
    notes = [row.note] if row.note else []
    finite = np.isfinite(ref) & np.isfinite(cand)
    nonfinite = ref.size - int(np.count_nonzero(finite))
    bad = 0
    if nonfinite:
        # NaN where the reference has NaN, an infinity of the same sign where it has one:
        # the candidate reproduces the reference there (a log of 0, a mask's -inf).
        same = (np.isnan(ref) & np.isnan(cand)) | (ref == cand)
        bad = int(np.count_nonzero(~finite & ~same))
        if bad:
            for side, array in (("reference", ref), ("candidate", cand)):
                nan, inf = metrics.nonfinite_counts(array)
                counts = [f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "Inf")) if n]
                if counts:
                    notes.append(f"{side} has {' and '.join(counts)}")
            # The counts alone read as agreement where an infinity changed sign.
            first = np.unravel_index(int(np.flatnonzero(~finite & ~same)[0]), ref.shape)
            notes.append(f"{bad} disagree, first at {list(map(int, first))}: reference "
                         f"{ref[first]}, candidate {cand[first]}")
            row.passed = False
        else:
            notes.append(f"{nonfinite} NaN/Inf in both, alike")
        kept_ref, kept_cand = ref[finite], cand[finite]
    else:
        kept_ref, kept_cand = ref, cand
    row.note = "; ".join(notes)
    row.mismatches = metrics.allclose_mismatches(kept_ref, kept_cand, rtol, atol) + bad
    if kept_ref.size == 0:
        return row
    row.cosine = metrics.cosine_similarity(kept_ref, kept_cand)
    row.max_abs, row.mean_abs = metrics.absolute_errors(kept_ref, kept_cand)
    row.max_rel, row.mean_rel = metrics.relative_errors(kept_ref, kept_cand) or (None, None)
    row.rmse = metrics.rmse(kept_ref, kept_cand)
    if not nonfinite:
        row.kl = metrics.kl_divergence(ref, cand)
    if min_cosine is not None and not np.any(kept_ref) and row.cosine < min_cosine:
        # An all-zero reference has no direction: its cosine is 0 against any noise (1e-6).
        row.note = "; ".join(filter(None, [row.note, "the reference is all zeros, where a "
                                           "cosine measures nothing: judged by rtol/atol"]))
        within = row.mismatches == 0
    else:
        within = row.mismatches == 0 if min_cosine is None else row.cosine >= min_cosine
        scale = metrics.norm_agreement(kept_ref, kept_cand) if min_cosine is not None else None
        if within and scale is not None and scale[0] < min_cosine:
            within = False  # the right direction at the wrong scale: a cosine cannot tell
            row.note = "; ".join(filter(None, [row.note, scale_text(scale[1], min_cosine)]))
    row.passed = row.passed and within
    return row


def scale_text(ratio: float, min_cosine: float) -> str:
    """Why a row with a passing cosine failed: its norm strays more than `min_cosine` allows."""
    allowed = (1.0 / min_cosine ** 2 - 1.0) ** 0.5
    return (f"norm {ratio:.4g}× the reference's (a cosine of {exact(min_cosine)} holds the scale "
            f"to ±{allowed:.1%}, which a cosine alone does not see)")


def _compare_values(name: str, reference, candidate, role: str, declared: str | None,
                    judge: dict) -> Row:
    """A sequence, map or optional judged tensor by tensor (see the module docstring)."""
    row = Row(name, role, *layout(reference, declared))
    problems, cosines = [], []
    for pair in paired(name, reference, candidate):
        if isinstance(pair, Mismatch):
            where = "" if pair.output == name else f"{pair.output}: "
            problems.append(where + pair.problem)
            continue
        element = compare_arrays(*pair, role=role, **judge)
        if element.cosine is not None:
            cosines.append(element.cosine)
        if not element.passed:
            problems.append(f"{element.name}: {_why(element, judge)}")
    whole = _whole(name, reference, candidate, role, judge)
    if whole is not None:
        for metric in ("max_abs", "mean_abs", "max_rel", "mean_rel", "rmse", "mismatches"):
            setattr(row, metric, getattr(whole, metric))
        # The lowest element's, which a cosine rule judges, not that of all values together.
        row.cosine = min(cosines, default=None)
    row.passed = not problems
    if problems:
        more = f"; {len(problems) - 1} more element(s) fail" if len(problems) > 1 else ""
        row.note = problems[0] + more
    return row


def _why(row: Row, judge: dict) -> str:
    """Why a tensor's row failed, in a few words."""
    if row.note:
        return row.note
    if judge["min_cosine"] is not None and row.cosine is not None:
        return f"cosine {cosine_text(row.cosine, judge['min_cosine'])} < " \
               f"{exact(judge['min_cosine'])}"
    return f"{row.mismatches} mismatch(es)"


def _whole(name: str, reference, candidate, role: str, judge: dict) -> Row | None:
    """Every tensor inside two values compared as one, for the row's metrics; None unless each
    has the shape of its reference and they concatenate."""
    refs, cands = [], []
    for pair in paired(name, reference, candidate):
        if isinstance(pair, Mismatch):
            return None
        _, ref, cand = pair
        ref, cand = widened(ref), widened(cand)
        if ref.shape != cand.shape:
            return None
        refs.append(ref.reshape(-1))
        cands.append(cand.reshape(-1))
    if not refs:
        return None
    try:
        together = np.concatenate(refs), np.concatenate(cands)
    except (TypeError, ValueError):
        return None
    return compare_arrays(name, *together, role=role, **judge)


@dataclass
class CompareReport:
    """Rows for the outputs (first) and, with per_tensor, the shared intermediates in graph order."""

    reference: str
    candidate: str
    rule: str                      # "allclose(rtol=0.0001, atol=1e-05)" or "cosine >= 0.999"
    inputs: str                    # where the feeds came from
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    min_cosine: float | None = None  # the rule's threshold, when it is a cosine rule
    candidate_run: str = ""          # how the candidate ran: "graphopt's .om runtime", …

    @property
    def outputs(self) -> list[Row]:
        return [r for r in self.rows if r.role == "output"]

    @property
    def intermediates(self) -> list[Row]:
        return [r for r in self.rows if r.role == "intermediate"]

    @property
    def passed(self) -> bool:
        """Whether every output passes (intermediates never decide)."""
        return all(r.passed for r in self.outputs)

    @property
    def first_failing_intermediate(self) -> Row | None:
        return next((r for r in self.intermediates if not r.passed), None)

    def to_dict(self) -> dict:
        first = self.first_failing_intermediate
        return {"reference": self.reference, "candidate": self.candidate,
                "candidate_run": self.candidate_run, "rule": self.rule,
                "inputs": self.inputs, "passed": self.passed,
                "first_failing_intermediate": first.name if first else None,
                "rows": [r.to_dict() for r in self.rows], "notes": list(self.notes)}


def _deployed_why(proto) -> str:
    """Why a lossy candidate runs at ORT_ENABLE_ALL, by the lossy passes its metadata names
    (what accuracy_rule.deployed_level chose that level by)."""
    from graphopt.tools.accuracy_rule import marked_lossy

    lossy = marked_lossy(proto.metadata_props) if proto is not None else []
    if "QuantizeInt8" in lossy:
        return "where its int8 kernels run"
    if "QuantizeInt4Weights" in lossy:
        return "where its 4-bit kernels run"
    return "as a compile a lossy precision pass changed is deployed"


def _checked_tolerances(rtol, atol) -> tuple[float, float]:
    """rtol and atol as optimize and bisect check theirs (api_args.tolerance); here neither
    may be None, since compare always judges by them."""
    checked = []
    for keyword, value in (("rtol", rtol), ("atol", atol)):
        what = option(keyword, COMPARE_FLAGS)
        if value is None:
            raise OptionError(f"{what}: expected a number, got None")
        checked.append(api_args.tolerance(value, what))
    return checked[0], checked[1]


@lending()  # a reference read from its file lends its weights (compare_run._read_onnx)
def compare_models(reference, candidate, feeds=None, *, per_tensor: bool = False,
                   rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
                   min_cosine: float | None = None, seed: int = 0,
                   input_shapes: dict | str | None = None,
                   rounding: bool | None = None) -> CompareReport:
    """Run `reference` (an .onnx path or ModelProto, onnxruntime at ORT_DISABLE_ALL) and
    `candidate` (an .onnx path or ModelProto run the same way, or an .om path run by graphopt's
    runtime) on `feeds` (a dict or an .npz path; default: seeded random data, `input_shapes`
    pinning dynamic dims) and compare their outputs, and with `per_tensor` their shared
    intermediates. `min_cosine` replaces the rtol/atol rule. `rounding`: whether outputs off
    by rounding alone pass, as --verify passes them (None: under the default rtol and atol
    only; a caller that filled in the defaults for tolerances not given says True). Either
    model may also be the Side load_reference or load_candidate made of it, so a caller that
    read it reads it once.

    Raises InputError for a missing or unreadable file, feeds lacking or mismatching an input,
    or models whose inputs differ; OptionError for bad tolerances.
    """
    rtol, atol = _checked_tolerances(rtol, atol)
    api_args.cosine(min_cosine, option("min_cosine", COMPARE_FLAGS))
    # "no" would read as true: per-tensor rows switched on, the rounding allowance forced.
    per_tensor = api_args.flag(per_tensor, option("per_tensor", COMPARE_FLAGS))
    if rounding is not None:
        rounding = api_args.flag(rounding, "rounding")
    rule = rule_text(rtol, atol, min_cosine)
    ref_side, cand_side = load_reference(reference), load_candidate(candidate)
    ref_side, edited = with_candidates_edits(ref_side, cand_side)
    check_signatures(ref_side, cand_side)
    arrays, source = make_feeds(ref_side, cand_side, feeds, seed, input_shapes)
    report = CompareReport(ref_side.label, cand_side.label, rule, source,
                           notes=list(cand_side.notes), min_cosine=min_cosine)
    report.candidate_run = (
        "graphopt's .om runtime" if cand_side.session is not None
        else "onnxruntime, optimizations disabled" if cand_side.level == "disable"
        else f"onnxruntime at ORT_ENABLE_ALL, {_deployed_why(cand_side.proto)}")
    report.notes.extend(edited)
    seeded = seeding_note(ref_side.proto) if ref_side.proto is not None else None
    if seeded:
        report.notes.append(seeded)
    other_source = source_note(ref_side, cand_side)
    if other_source:
        report.notes.append(other_source)
    outputs = set(ref_side.outputs) | set(cand_side.outputs)
    shared = []
    # The .om's refusals of these feeds (no shape profile fits, a partition fails) name it.
    candidate_run = cand_side.label + (f" on {setting('feeds', feeds, COMPARE_FLAGS)}"
                                       if isinstance(feeds, (str, os.PathLike)) else "")
    with naming(candidate_run):
        cand_tensors = cand_side.tensors_for(arrays)  # an .om: of the profile the feeds run
    ran = cand_side.profile_note(arrays)
    if ran:
        report.notes.append(ran)
    computed: set[str] = set()
    rescaled: list[str] = []
    if per_tensor:
        computed = {t.name for t in ref_side.tensors} - outputs - set(arrays)
        # Values the compile scaled per channel (INT8's channel equalization) under their
        # names: paired, a stem Relu read as the first failure (cosine 0.995) of a float layer.
        scaled = set(cand_side.rescaled_values())
        rescaled = [t.name for t in cand_tensors if t.name in computed and t.name in scaled]
        shared = [t for t in cand_tensors if t.name in computed and t.name not in scaled]
    names = [t.name for t in shared]
    # A candidate cut short (--out-nodes) returns tensors the reference computes inside, or
    # holds as an input or weight (a cut at one of those left no row: compare then crashed).
    inner = {t.name for t in ref_side.tensors} | _inputs_and_weights(ref_side)
    inner_outputs = [n for n in cand_side.outputs if n not in ref_side.outputs and n in inner]
    cut = [n for n in ref_side.outputs
           if n not in cand_side.outputs and n in cand_side.cut_outputs()]
    try:
        ref_values = ref_side.run(arrays, names + inner_outputs)
    except GraphoptError as exc:
        if feeds is None:  # the reference itself refuses them: the inputs, not the compile
            hint = random_inputs_hint(source, bool(input_shapes), option("feeds", COMPARE_FLAGS),
                                      reason=str(exc), signature=ref_side.inputs)
            raise GraphoptError(f"{exc}{hint}") from None
        raise
    retyped = _retype_inner_outputs(ref_values, inner_outputs, cand_side)
    if retyped:
        report.notes.append(retyped)
    with naming(candidate_run):
        cand_values = cand_side.run(arrays, names)
    shared = [t for t in shared if t.name in cand_values and t.name in ref_values]

    judge = {"rtol": rtol, "atol": atol, "min_cosine": min_cosine}
    if min_cosine is not None:
        report.notes.append(f"beyond tol: the elements outside rtol={exact(rtol)}, "
                            f"atol={exact(atol)}, for information; the cosine rule decides "
                            "each row")
    producers = {t.name: t for t in cand_tensors}
    # The candidate's output order; reference outputs it lacks come last, as failures.
    ordered = ([n for n in cand_side.outputs if n in ref_side.outputs or n in inner_outputs]
               + [n for n in ref_side.outputs if n not in cand_side.outputs and n not in cut])
    declared = declared_types(ref_side.proto)
    for name in ordered:
        if name not in cand_side.outputs:
            report.rows.append(Row(name, "output", *layout(ref_values[name], declared.get(name)),
                                   passed=False, note=f"not an output of {cand_side.label}"))
            continue
        row = compare_arrays(name, ref_values[name], cand_values[name], declared=declared.get(name),
                             **judge)
        tensor = producers.get(name)
        row.producer, row.partition = (tensor.producer, tensor.partition) if tensor else ("", "")
        report.rows.append(row)
        ref_value, cand_value = ref_values[name], cand_values[name]
        if row.cosine is not None and isinstance(ref_value, np.ndarray) \
                and isinstance(cand_value, np.ndarray):
            ref_value = widened(ref_value)
            worst = worst_slice(ref_value, widened(cand_value))
            warning = worst and hidden_slice_warning(name, ref_value, row.cosine, worst)
            if warning:
                report.notes.append(warning)
    floored = _float16_floor_note(report, ref_values, cand_values, rtol, min_cosine)
    if floored:
        report.notes.append(floored)
    if rounding is None:
        rounding = (rtol, atol) == (DEFAULT_RTOL, DEFAULT_ATOL)
    if rounding:
        _allow_rounding(report, ref_side, arrays, ref_values, cand_values, judge)
    empty = [r.name for r in report.outputs if r.shape is not None and 0 in r.shape
             and not _structured(ref_values.get(r.name))]
    if empty:  # a pass over no element proves nothing: a dim pinned or fed as 0, say
        report.notes.append(f"output(s) {', '.join(empty)} hold no element at these input "
                            "shapes: nothing of them was compared")
    if cut:
        report.notes.append(f"outputs of {ref_side.label} that {cand_side.label} was compiled "
                            f"without ({option('out_nodes')}): {', '.join(cut)} (not compared)")
    extra = [n for n in cand_side.outputs if n not in ref_side.outputs and n not in inner_outputs]
    if extra:
        report.notes.append(f"outputs of {cand_side.label} not in {ref_side.label}: "
                            f"{', '.join(extra)} (not compared)")
    skipped = []
    for tensor in shared:
        ref_value, cand_value = ref_values[tensor.name], cand_values[tensor.name]
        if layout(ref_value)[1] != layout(cand_value)[1] and not _structured(ref_value):
            skipped.append(tensor.name)
            continue
        row = compare_arrays(tensor.name, ref_value, cand_value, role="intermediate",
                             declared=declared.get(tensor.name), **judge)
        row.producer, row.partition = tensor.producer, tensor.partition
        report.rows.append(row)
    if rounding:
        _allow_rounding_inside(report, ref_side, arrays, ref_values, cand_values, judge)
    if skipped:
        shown = ", ".join(skipped[:3]) + (", …" if len(skipped) > 3 else "")
        report.notes.append(f"{len(skipped)} shared name(s) skipped, the shapes differ: {shown}")
    if rescaled:
        shown = ", ".join(rescaled[:3]) + (", …" if len(rescaled) > 3 else "")
        report.notes.append(f"{len(rescaled)} intermediate(s) hold their channels scaled by "
                            f"{cand_side.label}'s channel equalization (INT8), under the same "
                            f"names: not compared ({shown})")
    unmatched = len(computed) - len(shared) - len(rescaled)
    if unmatched:  # a failure among them shows first downstream, at a value both compute
        where = ("; the first failing one compared may lie downstream of where the values "
                 "start to drift" if report.first_failing_intermediate else "")
        report.notes.append(f"{unmatched} of the {len(computed)} intermediates of "
                            f"{ref_side.label} have no value of their name in "
                            f"{cand_side.label} (fused, folded or renamed): not compared{where}")
    return report


def _float16_floor_note(report: CompareReport, ref_values: dict, cand_values: dict,
                        rtol: float, min_cosine: float | None) -> str | None:
    """A note naming the outputs judged at a coarser rtol than the rule's, float16 in both
    models (metrics.effective_rtol): the rule line alone read as if rtol held for them."""
    if min_cosine is not None:
        return None
    names = [row.name for row in report.outputs
             if isinstance(ref_values.get(row.name), np.ndarray)
             and isinstance(cand_values.get(row.name), np.ndarray)
             and metrics.effective_rtol(ref_values[row.name], cand_values[row.name], rtol) > rtol]
    if not names:
        return None
    return (f"{', '.join(names)}: float16 in both models, judged at "
            f"rtol={exact(metrics.FLOAT16_STEP)} (float16's step, which a sum in another order "
            f"can round by) rather than {exact(rtol)}")


def _retype_inner_outputs(ref_values: dict, inner_outputs: list[str], candidate) -> str | None:
    """Cast, in `ref_values`, the tensors the candidate was cut to (--out-nodes) and gives in
    another dtype (--output-type) as its compile cast them, which the reference, ending
    elsewhere, has no output to take; returns a note saying so, or None."""
    recorded = candidate.io_types()["outputs"]
    cast = [name for name in inner_outputs if name in recorded
            and isinstance(ref_values.get(name), np.ndarray)
            and ref_values[name].dtype != np.dtype(recorded[name])]
    for name in cast:  # numpy rounds to nearest even, as ONNX's Cast does
        ref_values[name] = ref_values[name].astype(recorded[name])
    if not cast:
        return None
    return (f"{candidate.label} was cut to {', '.join(cast)} ({option('out_nodes')}) and gives "
            f"{'it' if len(cast) == 1 else 'them'} in another dtype ({option('output_type')}): "
            "the reference's values were cast alike")


def _allow_rounding(report: CompareReport, ref_side, feeds, ref_values: dict,
                    cand_values: dict, judge: dict) -> None:
    """Pass the failing outputs that rounding alone explains, as --verify does, with its note:
    a compile's NCHWc convolutions sum in another order, which onnxruntime's own optimizer does
    to the original too. A cosine rule is applied as given."""
    failing = [r for r in report.outputs if not r.passed]
    if not failing or judge["min_cosine"] is not None or ref_side.proto is None \
            or any(r.name not in ref_values or r.name not in cand_values for r in failing):
        return
    names = [r.name for r in failing]
    reference = ref_side.proto
    if not set(names) <= set(ref_side.outputs):  # tensors inside it, of a cut candidate
        reference = _ending_at(reference, names)
    expected, actual = {n: ref_values[n] for n in names}, {n: cand_values[n] for n in names}
    note = within_half_precision(reference, expected, actual, names, feeds) \
        or within_rounding(reference, feeds, expected, actual, names, judge)
    if note is None:
        return
    for row in failing:
        row.passed = True
        row.note = f"{row.note}; rounding (see note)" if row.note else "rounding (see note)"
    report.notes.append(note)


def _allow_rounding_inside(report: CompareReport, ref_side, feeds, ref_values: dict,
                           cand_values: dict, judge: dict) -> None:
    """Pass each failing intermediate that rounding alone explains, by the outputs' rule: an
    NCHWc conv's sums, off by 3e-5 in 2 elements, were named the first failure of a compile
    whose outputs pass. The original's run at ORT_ENABLE_ALL and its weights' rounding are
    measured once, with every such tensor an output."""
    failing = [r for r in report.intermediates if not r.passed
               and r.name in ref_values and r.name in cand_values]
    if not failing or judge["min_cosine"] is not None or ref_side.proto is None:
        return
    from graphopt import numerics
    from graphopt.rounding import weight_rounding

    reference = _ending_at(ref_side.proto, [r.name for r in failing])
    measured: dict = {}

    def once(key: str, measure):
        if key not in measured:
            measured[key] = measure()
        return measured[key]

    for row in failing:
        note = within_rounding(reference, feeds, {row.name: ref_values[row.name]},
                               {row.name: cand_values[row.name]}, [row.name], judge,
                               own=lambda: once("own", lambda: numerics.run(reference, feeds,
                                                                            "all")),
                               sensitivity=lambda: once("weights", lambda: weight_rounding(
                                   reference, feeds)))
        if note is not None:
            row.passed = True
            row.note = f"{row.note}; rounding" if row.note else "rounding"


def _ending_at(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """`model` with `names` as its outputs (onnxruntime types them): the original a candidate
    cut short by --out-nodes is judged against."""
    ended = onnx.ModelProto()
    ended.CopyFrom(model)
    del ended.graph.output[:]
    ended.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    return ended


def declared_types(model: onnx.ModelProto | None) -> dict[str, str]:
    """The type labels of the values a model declares as sequences, maps or optionals (its
    outputs and value_info), by name."""
    if model is None:
        return {}
    return {info.name: type_label(proto_type(info.type))
            for info in (*model.graph.output, *model.graph.value_info)
            if info.type.WhichOneof("value") in ("sequence_type", "map_type", "optional_type")}


def _inputs_and_weights(side) -> set[str]:
    """The names of the inputs and initializers of an ONNX side's main graph."""
    if side.proto is None:
        return set()
    graph = side.proto.graph
    return {value.name for value in (*graph.input, *graph.initializer)}
