"""Numeric checks with onnxruntime: seeded inputs, sessions at a chosen level, output comparison."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import ModelProto

LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session(model: ModelProto | bytes | str, level: str = "disable", threads: int = 1,
            providers: list[str] | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # failures raise; their log lines would only repeat them
    data = model.SerializeToString() if isinstance(model, ModelProto) else model
    return ort.InferenceSession(data, options, providers=providers or ["CPUExecutionProvider"])


def optimized_by_onnxruntime(model: ModelProto, level: str) -> ModelProto:
    """`model` as onnxruntime's CPU provider rewrites it at `level` (its optimized model, read
    back; weights included, so only for models small enough to copy)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="graphopt-ort-") as folder:
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def _concrete_shape(info: onnx.ValueInfoProto, dims: dict[str, int],
                    pinned: list[int] | None) -> list[int]:
    shape = []
    for axis, dim in enumerate(info.type.tensor_type.shape.dim):
        if pinned is not None and axis < len(pinned) and pinned[axis] >= 0:
            shape.append(int(pinned[axis]))
        elif dim.HasField("dim_value"):
            shape.append(int(dim.dim_value))
        else:
            shape.append(int(dims.get(dim.dim_param, 1)))
    return shape


def random_feeds(model: ModelProto, seed: int = 0, dims: dict[str, int] | None = None,
                 shapes: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input that has no initializer: normal floats, small
    non-negative integers (safe as indices into any non-empty axis), random booleans.
    A dim comes from `shapes[input][axis]` (ATC-style pins, -1 = not pinned), else the model,
    else `dims[symbol]`, else 1."""
    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    initialized = {t.name for t in model.graph.initializer}
    # A symbol pinned on one input binds it on every other input too (as --input-shape does).
    for info in model.graph.input:
        for dim, pinned in zip(info.type.tensor_type.shape.dim, (shapes or {}).get(info.name, ())):
            if dim.dim_param and pinned >= 0:
                dims.setdefault(dim.dim_param, int(pinned))
    feeds = {}
    for info in model.graph.input:
        if info.name in initialized:
            continue
        tensor_type = info.type.tensor_type
        if not info.type.HasField("tensor_type"):
            raise ValueError(f"input '{info.name}' is not a tensor; pass explicit inputs")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        shape = _concrete_shape(info, dims, (shapes or {}).get(info.name))
        if dtype == np.bool_:
            data = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            data = rng.integers(0, 2, size=shape)
        elif dtype == object:
            data = np.full(shape, "a", dtype=object)
        else:
            data = rng.standard_normal(shape)
        # np.asarray: a 0-d draw comes back as a numpy scalar, which onnxruntime refuses.
        feeds[info.name] = np.asarray(data).astype(dtype)
    return feeds


def run(model: ModelProto | bytes, feeds: dict[str, np.ndarray], level: str = "disable"
        ) -> dict[str, np.ndarray]:
    sess = session(model, level)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@dataclass
class Mismatch:
    output: str
    problem: str
    max_abs: float = 0.0
    max_rel: float = 0.0

    def __str__(self) -> str:
        return f"output '{self.output}': {self.problem}"


def compare(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray], rtol: float = 1e-4,
            atol: float = 1e-5) -> list[Mismatch]:
    """Outputs that differ: missing, different dtype or shape, or values beyond
    |a - e| <= atol + rtol * |e| (NaN equals NaN)."""
    problems = []
    for name, exp in expected.items():
        if name not in actual:
            problems.append(Mismatch(name, "missing"))
            continue
        got = np.asarray(actual[name])
        exp = np.asarray(exp)
        if got.dtype != exp.dtype:
            problems.append(Mismatch(name, f"dtype {got.dtype} != expected {exp.dtype}"))
            continue
        if got.shape != exp.shape:
            problems.append(Mismatch(name, f"shape {got.shape} != expected {exp.shape}"))
            continue
        if exp.dtype == object or exp.dtype == np.bool_ or np.issubdtype(exp.dtype, np.integer):
            if not np.array_equal(got, exp):
                bad = int(np.sum(got != exp))
                problems.append(Mismatch(name, f"{bad} element(s) differ"))
            continue
        e = exp.astype(np.float64)
        a = got.astype(np.float64)
        both_nan = np.isnan(e) & np.isnan(a)
        diff = np.where(both_nan, 0.0, np.abs(a - e))
        diff = np.where(np.isinf(e) & (a == e), 0.0, diff)
        bound = atol + rtol * np.abs(np.where(both_nan, 0.0, e))
        bad = ~(diff <= bound)
        if bad.any():
            rel = diff / np.maximum(np.abs(e), 1e-30)
            problems.append(Mismatch(
                name, f"{int(bad.sum())}/{bad.size} element(s) beyond rtol={rtol} atol={atol} "
                f"(max abs err {float(np.nanmax(diff)):.3g})",
                float(np.nanmax(diff)), float(np.nanmax(np.where(bad, rel, 0.0)))))
    return problems
