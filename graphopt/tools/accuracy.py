"""accuracy_report: what a precision change (fp16, bf16, mixed, int8, int4) cost, per output.

Both models run on the same feeds (given; the first samples of calibration data, read as
calibration reads them, each output's cosines reported on the sample where it agrees least and
its top-1 agreement and perplexities over every sample's rows; or seeded
random data in the reference's signature, as `graphopt compare` makes them); per output:
- cosine similarity of candidate vs reference (graphopt.tools.compare.compare_arrays);
- the largest absolute difference, beside the reference's largest magnitude (over every
  sample): a detector's box 94 px off reads a cosine of 0.9987, and "94.2 of 640" here;
- for a float output of rank 3 or more, the worst cosine of its slices along axis 1 (a
  detector's channels, a sequence's positions), with a warning when the whole-tensor cosine
  hides a slice that agrees far less;
- top-1 agreement for outputs that are plausibly classifier scores [batch, classes] or LM logits
  [batch, seq, vocab] (graphopt.tools.output_kinds says when): the fraction of rows
  (batch × positions) whose argmax over the last axis is the same; for per-pixel class scores
  [batch, classes, H, W] (a segmentation head), of pixels whose argmax over axis 1 is;
- for an integer, bool or string output (class ids, masks), how many elements differ: such
  outputs have no cosine, and `compare` and `--verify` require them equal;
- for LM-like outputs, perplexity exp(mean over positions of −log softmax(logits)[target]) of
  each model and the relative change cand/ref − 1. The targets are the next tokens of an
  integer [batch, seq] input named `input_ids` (position t predicts input_ids[:, t+1]) when
  the feeds have one with seq ≥ 2, or the tokens at their own positions where the logits
  change with a later token (a masked LM); otherwise the reference's own argmax at each
  position (then the reference's perplexity is its greedy confidence and the change says how
  much less sure the candidate is of the same tokens).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass, field

import numpy as np

from graphopt.codegen.feeds import numpy_dtype
from graphopt.errors import GraphoptError
from graphopt.quant.calib_data import (CalibrationShapeError, InputSpec, profile_samples,
                                       read_calibration)
from graphopt.table import format_table
from graphopt.tools.compare import compare_arrays, declared_types
from graphopt.tools.compare_run import (
    Side,
    check_signatures,
    load_candidate,
    load_reference,
    make_feeds,
    shared_dims,
    with_candidates_edits,
)
from graphopt.tools.half_range import (
    HalfValue,
    cast_readers,
    half_tensors,
    makers_of,
    operand_names,
    overflow_note,
    overflows,
    own_overflows,
    unmatched_half_values,
)
from graphopt.tools.output_kinds import model_facts, output_kind
from graphopt.tools.rule_text import cosine_text
from graphopt.tools.metrics import norm_agreement
from graphopt.tools.slices import hidden_slice_warning, worst_slice

# The report warns of an output whose norm strays by more than 20%, a cosine of 0.98's worth
# (metrics.norm_agreement), which the cosine column cannot show: int4's rule is 0.98.
SCALE_WARNING = 0.98


@dataclass
class OutputAccuracy:
    name: str
    shape: tuple | None                # None: a sequence, map or optional
    kind: str  # "classifier", "lm", "segmentation", "tensor", or the type (seq(float32))
    cosine: float | None
    top1: float | None = None          # argmax agreement over rows
    perplexity: tuple[float, float] | None = None  # (reference, candidate)
    targets: str = ""                  # "input_ids", "own input_ids" or "reference argmax"
    note: str = ""
    worst_slice: tuple[float, int] | None = None  # (cosine, index) of the worst [:, i]
    sample: int | None = None          # which calibration sample the row is from (1-based)
    slice_sample: int | None = None    # the worst slice's sample, where it is another
    differ: int | None = None          # an integer, bool or string output: elements not equal
    max_error: tuple[float, float] | None = None  # (largest |cand - ref|, largest |ref|)
    rows: int = 0                      # the rows top-1 counts
    positions: int = 0                 # the positions perplexity scores

    @property
    def perplexity_change(self) -> float | None:
        if self.perplexity is None:
            return None
        ref, cand = self.perplexity
        return cand / ref - 1.0


@dataclass
class AccuracyReport:
    reference: str
    candidate: str
    inputs: str                        # where the feeds came from
    outputs: list[OutputAccuracy] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # printed under the table
    feeds: dict | None = None  # what the (first) sample fed, for a speed check on the same
    notes: list[str] = field(default_factory=list)  # printed after the warnings
    samples: list[dict] = field(default_factory=list)  # every sample's feeds, from calibration

    @property
    def min_cosine(self) -> float | None:
        values = [o.cosine for o in self.outputs if o.cosine is not None]
        return min(values) if values else None

    def format(self) -> str:
        rows = []
        for o in self.outputs:
            ppl = ""
            if o.perplexity is not None:
                ppl = (f"{o.perplexity[0]:.4g} -> {o.perplexity[1]:.4g} "
                       f"({100 * o.perplexity_change:+.2f}%, on {o.targets})")
            shape = "" if o.shape is None else "[" + ",".join(map(str, o.shape)) + "]"
            worst = "" if o.worst_slice is None else \
                f"{cosine_text(o.worst_slice[0])} at [:,{o.worst_slice[1]}]" + \
                ("" if o.slice_sample is None else f" (sample {o.slice_sample})")
            error = "" if o.max_error is None else \
                f"{o.max_error[0]:.3g} of {o.max_error[1]:.3g}"
            rows.append([o.name, shape, o.kind,
                         "" if o.cosine is None else cosine_text(o.cosine), error, worst,
                         "" if o.top1 is None else f"{100 * o.top1:.1f}%", ppl,
                         "" if o.sample is None else str(o.sample), o.note])
        headers = ["output", "shape", "kind", "cosine", "max |error|", "worst slice",
                   "top-1 agree", "perplexity", "sample", "note"]
        # The other columns only where some output has one (top-1 not for a detector's).
        kept = [i for i in range(len(headers)) if i < 4 or any(r[i] for r in rows)]
        headers, rows = [headers[i] for i in kept], [[r[i] for i in kept] for r in rows]
        table = format_table(headers, rows, title=f"accuracy vs {self.reference} on {self.inputs}",
                             names={0})
        return "\n".join([table, *(f"warning: {w}" for w in self.warnings),
                          *(f"note: {n}" for n in self.notes)])


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def perplexity(logits: np.ndarray, targets: np.ndarray) -> float:
    """exp of the mean negative log-likelihood of `targets` [batch, seq] under `logits`."""
    logp = _log_softmax(logits)
    picked = np.take_along_axis(logp, targets[..., None].astype(np.int64), axis=-1)
    return float(np.exp(-picked.mean()))


def _lm_targets(ref: np.ndarray, feeds: dict, sees_ahead) -> tuple[slice, np.ndarray, str]:
    """(the positions scored, their target tokens, where the targets came from). A causal LM
    is scored on the next token; one whose logits see later tokens (`sees_ahead()`: a masked
    LM such as RoBERTa's, which predicts the token at its own position) on its own."""
    ids = feeds.get("input_ids")
    batch, seq, vocab = ref.shape
    if (ids is not None and ids.dtype.kind in "iu" and ids.shape == (batch, seq) and seq >= 2
            and ids.min() >= 0 and ids.max() < vocab):
        if sees_ahead():
            return slice(0, seq), ids, "own input_ids"
        return slice(0, seq - 1), ids[:, 1:], "input_ids"
    return slice(0, seq), ref.argmax(axis=-1), "reference argmax"


def _sees_ahead(run, arrays: dict, name: str, ref: np.ndarray) -> bool:
    """Whether the logits `name` (`ref` on `arrays`) at earlier positions change when the last
    token of input_ids does: a bidirectional (masked) LM's do, a causal LM's do not. The last
    token becomes another id the feeds already hold, which the model takes."""
    ids = arrays["input_ids"]
    last = ids[:, -1]
    other = np.where(last == ids.min(), ids.max(), ids.min())
    if np.array_equal(other, last):  # one id throughout: nothing to change it to
        return False
    changed = ids.copy()
    changed[:, -1] = other
    probe = np.asarray(run({**arrays, "input_ids": changed}, [])[name])
    if probe.shape != ref.shape:
        return False
    before, after = ref[:, :-1].astype(np.float64), probe[:, :-1].astype(np.float64)
    return bool(np.abs(after - before).max() > 1e-4 * max(np.abs(before).max(), 1e-30))


# The report runs on this many calibration samples at most and shows each output's worst cosine
# (top-1 and perplexity pooled over them all): one sample can hide a flip (Mask2Former's fp16
# mask threshold: cosine 0.999998 on the first image, 0.89 on the second).
REPORT_SAMPLES = 8


def calibration_feeds(path, reference: Side, candidate: Side,
                      limit: int | None = REPORT_SAMPLES) -> tuple[list[dict], str]:
    """The first `limit` (None: all) samples of the calibration data at `path` (an .npz or a
    directory, in any layout calibration takes), cast to the inputs' dtypes as calibration
    casts them, and their label. The dims are the reference's, with those the candidate pins where the
    reference's are open: of the first of its shape profiles the data fits, when it has
    several."""
    profiles = getattr(candidate.session, "profiles", None) or [None]
    mismatch = None
    # Of a directory whose files hold several profiles' shapes, each profile reads the files
    # that fit it, as the compile calibrated it (read whole, the first misfit was refused).
    def within():
        return profile_samples(set()) if len(profiles) > 1 else contextlib.nullcontext()

    for index in range(len(profiles)):
        dims = shared_dims(reference, candidate, index)
        specs = []
        for entry in reference.inputs:
            shape = dims.get(entry["name"])
            dtype = numpy_dtype(entry["dtype"])
            if dtype is not None:
                specs.append(InputSpec(entry["name"], dtype,
                                       None if shape is None else tuple(shape)))
        try:
            with within():
                data = read_calibration(path, specs)
                samples = list(itertools.islice(data, limit))
        except CalibrationShapeError as exc:
            mismatch = mismatch or exc
            continue
        path, count = os.fspath(path), len(data)
        if count == 1:
            return samples, path
        if len(samples) == 1:
            return samples, f"{path} (sample 1 of {count})"
        return samples, (f"{path} (samples 1-{len(samples)} of {count}: cosines from each "
                         f"output's worst, top-1 and perplexity over those {len(samples)})")
    raise mismatch


def _candidate_models(candidate: Side) -> list:
    """The ONNX models the candidate runs: itself, or an .om's partitions."""
    if candidate.proto is not None:
        return [candidate.proto]
    return [part.model for part in candidate.session.artifact.partitions]


def _reference_names(reference: Side) -> set[str]:
    return {t.name for t in reference.tensors} | set(reference.outputs)


def _reference_names_of_half_tensors(reference: Side, candidate: Side) -> list[str]:
    """The reference's names of the values the candidate computes in float16."""
    known = _reference_names(reference)
    return sorted({name for name in half_tensors(_candidate_models(candidate), known).values()
                   if name in known})


def _unmatched_half_values(reference: Side, candidate: Side) -> dict[str, HalfValue]:
    """The candidate's float16 values the reference has no name for (fused, or new)."""
    return unmatched_half_values(_candidate_models(candidate), _reference_names(reference))


def accuracy_report(reference, candidate, feeds=None, *, seed: int = 0,
                    input_shapes: dict | str | None = None, calibration=None,
                    reference_label: str | None = None,
                    samples: int | None = REPORT_SAMPLES) -> AccuracyReport:
    """Run `reference` and `candidate` (.onnx paths or ModelProtos; the candidate may be an .om
    path) on `feeds` (a dict or an .npz path), or on the first `samples` samples of
    `calibration` (an .npz or a directory of them, as the calibration option takes; None: all),
    or else on seeded random data (`input_shapes` pinning dynamic dims), and measure each
    output as this module's docstring says. `reference_label` names a reference given as a
    ModelProto in the report."""
    ref_side, cand_side = load_reference(reference), load_candidate(candidate)
    if reference_label is not None:
        ref_side.label = reference_label
    ref_side, _ = with_candidates_edits(ref_side, cand_side)  # as compare runs it
    check_signatures(ref_side, cand_side)
    if feeds is None and calibration is not None:
        fed, source = calibration_feeds(calibration, ref_side, cand_side, samples)
        fed = [make_feeds(ref_side, cand_side, sample, seed, input_shapes)[0] for sample in fed]
        reports = [_measure(ref_side, cand_side, sample, source) for sample in fed]
        report = _worst_of(reports) if len(reports) > 1 else reports[0]
        report.samples = fed
        return _with_source_notes(report, ref_side)
    arrays, source = make_feeds(ref_side, cand_side, feeds, seed, input_shapes)
    try:
        return _with_source_notes(_measure(ref_side, cand_side, arrays, source), ref_side)
    except GraphoptError as exc:
        if feeds is None and _filled_open_dims(ref_side, arrays):  # what the model cannot run
            raise SeededInputsRefused(f"{exc} (on seeded random inputs, their open dims set to "
                                      "1)") from None
        raise


def _with_source_notes(report: AccuracyReport, reference: Side) -> AccuracyReport:
    """`report` with a note where the reference is quantized already: its QuantizeLinear →
    DequantizeLinear pairs run in float in the reference, as int8 kernels in a deployment at
    ORT_ENABLE_ALL (the candidate), which differ by themselves: recompiling such a model read
    a cosine of 0.99995 over zero rewrites."""
    if reference.proto is not None and _simulated_qdq(reference.proto.graph):
        report.notes.append(f"{reference.label} is quantized already: the reference runs its "
                            "QuantizeLinear/DequantizeLinear pairs in float (onnxruntime at "
                            "ORT_DISABLE_ALL), a deployment on onnxruntime's int8 kernels, "
                            "which differ by themselves: part of the gap may be the input "
                            "model's own")
    return report


def _simulated_qdq(graph) -> bool:
    """Whether a DequantizeLinear reads a QuantizeLinear's output: an activation quantized in
    the graph, which onnxruntime's optimizer turns into int8 kernels and its float run does not."""
    quantized = {out for node in graph.node if node.op_type == "QuantizeLinear"
                 and node.domain in ("", "ai.onnx", "com.microsoft") for out in node.output}
    return any(node.op_type == "DequantizeLinear" and node.input and node.input[0] in quantized
               for node in graph.node)


def _filled_open_dims(side: Side, arrays: dict) -> bool:
    """Whether seeded random `arrays` set an open dim of an input of `side` to 1."""
    for entry in side.inputs:
        array = arrays.get(entry["name"])
        if entry.get("shape") is None or not hasattr(array, "shape"):
            continue
        if any(not isinstance(dim, int) and size == 1
               for dim, size in zip(entry["shape"], array.shape)):
            return True
    return False


class SeededInputsRefused(GraphoptError):
    """The models could not run on the seeded random inputs, with open dims set to 1: other
    inputs may well run."""


def _badness(entry: OutputAccuracy) -> tuple[int, float]:
    """How badly a row agrees, for picking each output's worst sample: a row with a note
    (non-finite values, a shape or dtype mismatch, a missing output) or a tensor without a
    cosine ranks below any clean one; then the lower cosine is the worse."""
    if entry.differ is not None:  # exact outputs: the sample with the most elements changed
        return int(entry.differ > 0), entry.differ / max(1, int(np.prod(entry.shape)))
    flagged = bool(entry.note) or (entry.cosine is None and entry.shape is not None)
    return int(flagged), -(entry.cosine if entry.cosine is not None else -1.0)


def _worst_of(reports: list[AccuracyReport]) -> AccuracyReport:
    """One report of several samples': each output's row from the sample where it agrees
    least (`_badness`), numbered, and every sample's warnings, each naming its sample."""
    for number, report in enumerate(reports, 1):
        for entry in report.outputs:
            entry.sample = number
        # A warning names its sample: it speaks of that sample's row, which may not be shown.
        report.warnings[:] = [f"sample {number}: {w}" for w in report.warnings]
    spoiled = [(number, index, entry) for number, report in enumerate(reports, 1)
               for index, entry in enumerate(report.outputs) if _spoiled(entry)]
    by_output = [list(rows) for rows in zip(*(report.outputs for report in reports))]
    merged = reports[0]
    for report in reports[1:]:
        for index, entry in enumerate(report.outputs):
            shown = merged.outputs[index]
            # A sample on which the float model itself made NaN/Inf measures nothing: another
            # sample's figure is shown, and that sample named, rather than every row blank.
            if _spoiled(shown) and not _spoiled(entry) \
                    or not _spoiled(entry) and _badness(entry) > _badness(shown):
                merged.outputs[index] = entry
        merged.warnings.extend(w for w in report.warnings if w not in merged.warnings)
    for number, index, entry in spoiled:
        if merged.outputs[index] is not entry:
            merged.warnings.append(f"sample {number}: output '{entry.name}' not measured: "
                                   f"{entry.note}")
    for shown, rows in zip(merged.outputs, by_output):
        _pool(shown, rows)
    return merged


def _pool(shown: OutputAccuracy, rows: list[OutputAccuracy]) -> None:
    """Top-1 agreement and perplexities over every sample's rows, on the row shown: the sample
    with the lowest cosine need not be the one whose argmax flips (a classifier read 100% on
    it while another sample's class changed)."""
    top1 = [(r.top1, r.rows) for r in rows if r.top1 is not None and r.rows]
    if top1:
        shown.top1 = sum(value * count for value, count in top1) / sum(c for _, c in top1)
    errors = [r.max_error for r in rows if r.max_error is not None]
    if errors:  # the largest of any sample, beside the largest magnitude of any
        shown.max_error = (max(e[0] for e in errors), max(e[1] for e in errors))
    # The worst slice of any sample: a detector's score channel read 0.35 on one sample while
    # the row shown, the sample of the lowest whole cosine, said 0.87.
    sliced = [r for r in rows if r.worst_slice is not None]
    if sliced:
        worst = min(sliced, key=lambda r: r.worst_slice[0])
        shown.worst_slice = worst.worst_slice
        shown.slice_sample = None if worst.sample == shown.sample else worst.sample
    scored = [r for r in rows if r.perplexity is not None and r.positions]
    if scored:
        total = sum(r.positions for r in scored)
        # perplexity = exp(mean NLL): pooled, the means weighted by the positions scored.
        shown.perplexity = tuple(
            float(np.exp(sum(np.log(r.perplexity[side]) * r.positions for r in scored) / total))
            for side in (0, 1))


def _max_error(ref: np.ndarray, cand: np.ndarray) -> tuple[float, float] | None:
    """(largest |cand - ref|, largest finite |ref|), in float64 (float16 outputs subtract
    without rounding), or None where shapes differ or the reference holds nothing finite. An
    element finite on one side alone, or non-finite on both but not alike (inf against NaN,
    +inf against -inf), is off by inf: a float16 overflow is what the column is for."""
    if ref.shape != cand.shape:
        return None
    wide = np.complex128 if "c" in (ref.dtype.kind, cand.dtype.kind) else np.float64
    ref, cand = ref.astype(wide), cand.astype(wide)
    finite = np.isfinite(ref) & np.isfinite(cand)
    if not np.isfinite(ref).any():
        return None
    alike = (np.isnan(ref) & np.isnan(cand)) | (ref == cand)
    largest = float(np.abs(ref[np.isfinite(ref)]).max())
    if not (finite | alike).all():
        return float("inf"), largest
    error = float(np.abs(cand[finite] - ref[finite]).max()) if finite.any() else 0.0
    return error, largest


def _spoiled(entry: OutputAccuracy) -> bool:
    """Whether a row measured nothing because the reference held NaN/Inf on its sample."""
    return entry.cosine is None and entry.shape is not None \
        and ("reference has" in entry.note or "in both, alike" in entry.note)


def _overflow_warning(ref_side: Side, reference_values: dict, unmatched: dict[str, HalfValue],
                      candidate_values: dict) -> str:
    """The float16 overflow warning: of the float16 values the reference has names for, as
    the reference computes them; of the others, as the candidate's own run shows them."""
    found = overflows(reference_values) + own_overflows(unmatched, candidate_values)
    makers = {out: node.name for node in ref_side.proto.graph.node for out in node.output
              if node.name}
    return overflow_note(sorted(found, key=lambda item: -item[1]),
                         {**makers, **makers_of(unmatched)}, cast_readers(unmatched))


def _measure(ref_side: Side, cand_side: Side, arrays: dict, source: str) -> AccuracyReport:
    """Run both sides on `arrays` and measure each output as this module's docstring says."""
    half = _reference_names_of_half_tensors(ref_side, cand_side)
    unmatched = _unmatched_half_values(ref_side, cand_side)
    expected = ref_side.run(arrays, [n for n in half if n not in ref_side.outputs])
    # The values the reference has no name for are judged in the candidate's own run.
    actual = cand_side.run(arrays, [n for n in operand_names(unmatched)
                                    if n not in cand_side.outputs])
    facts = model_facts(ref_side.proto)
    report = AccuracyReport(ref_side.label, cand_side.label, source, feeds=arrays)
    note = _overflow_warning(ref_side, {name: expected[name] for name in half if name in expected},
                             unmatched, {**arrays, **actual})
    if note:
        report.warnings.append(note)
    declared = declared_types(ref_side.proto)  # a sequence's or map's type, as the model says
    for name in ref_side.outputs:
        if not isinstance(expected[name], np.ndarray):  # a sequence, map or optional
            row = compare_arrays(name, expected[name], actual.get(name),
                                 declared=declared.get(name))
            report.outputs.append(OutputAccuracy(name, None, row.dtype, row.cosine, note=row.note))
            continue
        ref = np.asarray(expected[name])
        if name not in actual:
            report.outputs.append(OutputAccuracy(name, ref.shape, "tensor", None,
                                                 note=f"not an output of {cand_side.label}"))
            continue
        cand = np.asarray(actual[name])
        row = compare_arrays(name, ref, cand)
        entry = OutputAccuracy(name, ref.shape, output_kind(name, ref, facts, arrays),
                               row.cosine, note=row.note)
        if ref.dtype.kind not in "fc" and not row.note and row.mismatches is not None:
            # Class ids, masks, token ids: no cosine, and a flip showed as a blank row.
            entry.differ = row.mismatches
            entry.note = (f"{row.mismatches} of {ref.size} element(s) differ" if row.mismatches
                          else "all elements equal")
        if row.cosine is not None:
            entry.max_error = _max_error(ref, cand)
            entry.worst_slice = worst_slice(ref, cand)
            warning = entry.worst_slice and hidden_slice_warning(name, ref, row.cosine,
                                                                 entry.worst_slice)
            if warning:
                report.warnings.append(warning)
            scale = norm_agreement(ref, cand)
            if scale is not None and scale[0] < SCALE_WARNING:
                report.warnings.append(
                    f"{name}: cosine {row.cosine:.6f}, but its norm is {scale[1]:.4g}× the "
                    "reference's: a cosine does not see a change of scale")
        if entry.kind != "tensor" and cand.shape == ref.shape and row.cosine is not None:
            axis = 1 if entry.kind == "segmentation" else -1  # the class axis: per pixel
            entry.top1 = float(np.mean(ref.argmax(axis=axis) == cand.argmax(axis=axis)))
            entry.rows = int(ref.size // ref.shape[axis])
            if entry.kind == "lm" and ref.size:
                positions, targets, entry.targets = _lm_targets(
                    ref, arrays, lambda: _sees_ahead(ref_side.run, arrays, name, ref))
                entry.perplexity = (perplexity(ref[:, positions], targets),
                                    perplexity(cand[:, positions], targets))
                entry.positions = int(targets.size)
        report.outputs.append(entry)
    return report
