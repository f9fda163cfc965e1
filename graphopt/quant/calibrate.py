"""Run the float model over calibration samples and collect statistics of chosen tensors.

The model runs in onnxruntime at ORT_DISABLE_ALL (so its own fusions cannot hide or rename a
tensor) with the tensors asked for added as graph outputs. Samples stream: each sample's
intermediates are reduced into the running statistics and dropped before the next is read.
Min-max needs one sweep; the histogram methods a second one, over bins fixed by the first.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort

from graphopt.errors import OptionError
from graphopt.ir import Model, Value, to_onnx
from graphopt.option_names import option
from graphopt.numerics import ort_reason
from graphopt.progress import compile_line
from graphopt.quant.calib_data import CalibrationData, calibration_label
from graphopt.quant.stats import METHODS, TensorStats


def calibrate(model: Model, names: list[str], data: CalibrationData, method: str = "minmax",
              channels: frozenset[str] | set[str] = frozenset(),
              input_ranges: dict[str, tuple[float, float]] | None = None
              ) -> dict[str, TensorStats]:
    """Statistics of the float tensors `names` (graph inputs or node outputs of `model`'s main
    graph) over every sample of `data`, ready for `TensorStats.range(method)`; those also in
    `channels` track their per-channel (axis 1) means too. `input_ranges`, when given, gets
    each float input's (smallest, largest) finite value over the data."""
    if method not in METHODS:
        raise OptionError(f"calibration_method {method!r}: unknown (use {', '.join(METHODS)})")
    names = sorted(set(names) | set(channels))
    stats = {name: TensorStats(channels=name in channels) for name in names}
    if not names:
        return stats
    sweeps = ("range",) if method == "minmax" else ("range", "histogram")
    nonfinite_inputs: set[str] = set()
    sample_arrays = _sampler(model, names, data, nonfinite_inputs=nonfinite_inputs,
                             input_ranges=input_ranges)
    total, done = len(data) * len(sweeps), 0
    with compile_line() as line:
        for sweep in sweeps:
            if sweep == "histogram":
                for s in stats.values():
                    s.start_histogram()
            for arrays in sample_arrays():
                for name, array in arrays.items():
                    if sweep == "range":
                        stats[name].observe_range(array)
                    else:
                        stats[name].observe_histogram(array)
                done += 1
                line.update(f"calibrating ({method}): {done}/{total} sample runs", done, total)
            if sweep == "range":
                _check_ranges(stats, data.path, nonfinite_inputs)
    return stats


def gram_matrices(model: Model, values: list[Value], data: CalibrationData
                  ) -> tuple[dict[str, np.ndarray], dict[str, int], dict[str, int]]:
    """XᵀX [C, C] of each float tensor in `values` (node outputs or graph inputs of `model`'s
    main graph) summed over every sample: its last axis C is the features, every other axis
    rows, as a MatMul multiplies them. What GPTQ weighs a weight's rounding errors by. Also
    the number of rows each sum has, and of the rows left out for a NaN or Inf."""
    dtypes = {v.name: v.dtype for v in values}
    grams: dict[str, np.ndarray] = {}
    rows_seen: dict[str, int] = {}
    nonfinite: dict[str, int] = {}
    for arrays in _sampler(model, sorted(dtypes), data, dtypes)():
        for name, array in arrays.items():
            rows = np.asarray(array, np.float64).reshape(-1, array.shape[-1])
            finite = np.isfinite(rows).all(axis=1)
            if not finite.all():
                nonfinite[name] = nonfinite.get(name, 0) + int(np.count_nonzero(~finite))
                rows = rows[finite]
            grams[name] = grams.get(name, 0.0) + rows.T @ rows
            rows_seen[name] = rows_seen.get(name, 0) + len(rows)
    return grams, rows_seen, nonfinite


def channel_extents(model: Model, names: list[str], data: CalibrationData
                    ) -> dict[str, np.ndarray]:
    """The largest |value| of each channel (axis 1) of the float tensors `names` (node outputs
    of `model`'s main graph, rank 2 or more) over every sample of `data`; NaN and Inf left out."""
    extents: dict[str, np.ndarray] = {}
    with compile_line() as line:
        for done, arrays in enumerate(_sampler(model, names, data)(), 1):
            for name, array in arrays.items():
                largest = _channel_extent(array)
                extents[name] = np.maximum(extents.get(name, largest), largest)
            line.update(f"measuring channel ranges: {done}/{len(data)} sample runs", done,
                        len(data))
    return extents


def _channel_extent(array: np.ndarray) -> np.ndarray:
    # [N, C, rest] rows reduce in one contiguous pass each, where a max over axes (0, 2, 3)
    # strides through the whole tensor.
    rows = np.abs(array.reshape(array.shape[0], array.shape[1], -1))
    largest = rows.max(axis=2, initial=0.0).max(axis=0)
    if not np.isfinite(largest).all():  # a NaN or Inf in some channel: its finite values
        largest = np.where(np.isfinite(rows), rows, 0).max(axis=2, initial=0.0).max(axis=0)
    return largest


def _sampler(model: Model, names: list[str], data: CalibrationData, dtypes: dict | None = None,
             nonfinite_inputs: set[str] | None = None,
             input_ranges: dict[str, tuple[float, float]] | None = None):
    """A function whose every call sweeps the samples of `data` once, yielding per sample the
    arrays of `names` (graph inputs from the feeds, the rest computed by one session that
    outputs them, float32 unless `dtypes` says otherwise). Each sample's arrays are dropped
    before the next is read. The float inputs that held a NaN or Inf are added to
    `nonfinite_inputs`."""
    feeds_named = {s.name for s in data.specs}
    fetched = [n for n in names if n not in feeds_named]
    session = _session(model, fetched, dtypes)

    def sweep():
        for feeds in data:
            if nonfinite_inputs is not None:
                nonfinite_inputs.update(
                    name for name, array in feeds.items() if isinstance(array, np.ndarray)
                    and array.dtype.kind == "f" and not np.isfinite(array).all())
            if input_ranges is not None:
                _widen(input_ranges, feeds)
            try:
                outputs = session.run(fetched, feeds) if fetched else []
            except Exception as e:  # noqa: BLE001 - onnxruntime's message is the cause
                raise OptionError(f"{calibration_label(data.path)}: the float model fails on a "
                                  f"sample: {ort_reason(e)}") from None
            arrays = dict(zip(fetched, outputs))
            arrays.update((n, feeds[n]) for n in names if n in feeds_named)
            yield arrays
            del outputs, arrays

    return sweep


def _widen(ranges: dict[str, tuple[float, float]], feeds: dict) -> None:
    """Widen each float feed's (smallest, largest) finite value in `ranges` by this sample's."""
    for name, array in feeds.items():
        if not (isinstance(array, np.ndarray) and array.dtype.kind == "f" and array.size):
            continue
        finite = array[np.isfinite(array)]
        if finite.size:
            lo, hi = ranges.get(name, (np.inf, -np.inf))
            ranges[name] = (min(lo, float(finite.min())), max(hi, float(finite.max())))


def _check_ranges(stats: dict[str, TensorStats], path: str,
                  nonfinite_inputs: set[str] = frozenset()) -> None:
    """Refuse a tensor without a finite range: every value it held on every sample was NaN or
    Inf (the range covers a tensor's finite values), and no scale can cover it. Where inputs of
    the data held such values, say so: one NaN pixel of a single image spreads to every value
    after a global pool, and the layers to skip are not the fix."""
    for name, s in stats.items():
        if not (np.isfinite(s.lo) and np.isfinite(s.hi)):
            held = ", ".join(f"'{n}'" for n in sorted(nonfinite_inputs))
            cause = (f"; the data's input(s) {held} hold NaN or Inf, which the model carries "
                     "there: give samples without them, or" if held else ";")
            raise OptionError(f"{calibration_label(path)}: "
                              f"the float model's tensor '{name}' has no "
                              f"finite range over the samples (NaN or Inf){cause} "
                              f"{option('quant_skip')} the layers that read it")


def _session(model: Model, fetched: list[str], dtypes: dict | None = None
             ) -> ort.InferenceSession:
    """A session that also outputs `fetched`, float32 unless `dtypes` names another type."""
    proto = to_onnx(model)
    present = {o.name for o in proto.graph.output}
    for name in fetched:
        if name not in present:
            dtype = (dtypes or {}).get(name)
            proto.graph.output.append(onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.FLOAT if dtype is None else int(dtype), None))
    return plain_session(proto)


def plain_session(proto: onnx.ModelProto) -> ort.InferenceSession:
    """`proto` in onnxruntime at ORT_DISABLE_ALL (its fusions would hide or rename the tensors
    fetched), on every core, quiet."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = os.cpu_count() or 1
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
