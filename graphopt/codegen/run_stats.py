"""Timing an artifact's runs and summarizing them: latency percentiles and output statistics."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from graphopt.codegen.feeds import output_label
from graphopt.table import format_table

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """fn()'s result and the wall-clock seconds it took."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def time_runs(run: Callable[[], Any], repeat: int, warmup: int = 0) -> list[float]:
    """Seconds of each of `repeat` calls of `run`, after `warmup` untimed ones."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, not {repeat}")
    if warmup < 0:
        raise ValueError(f"warmup must be at least 0, not {warmup}")
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples


@dataclasses.dataclass(frozen=True)
class LatencyStats:
    """Latency of `runs` timed runs, in seconds. Percentiles interpolate linearly between
    samples (numpy's default), so p99 of few runs lies between the two slowest."""

    runs: int
    min: float
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def from_samples(cls, samples: list[float]) -> LatencyStats:
        if not samples:
            raise ValueError("no samples to summarize")
        data = np.asarray(samples, dtype=np.float64)
        p50, p90, p99 = np.percentile(data, [50, 90, 99])
        return cls(runs=len(data), min=float(data.min()), mean=float(data.mean()),
                   p50=float(p50), p90=float(p90), p99=float(p99), max=float(data.max()))

    def to_json(self) -> dict:
        """Milliseconds, for reports and benches."""
        return {"runs": self.runs, **{f"{k}_ms": round(getattr(self, k) * 1e3, 6)
                                      for k in ("min", "mean", "p50", "p90", "p99", "max")}}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.1 else f"{seconds * 1e3:.1f}"


def format_latency(stats: LatencyStats) -> str:
    """One table row of the statistics, in milliseconds."""
    headers = ["runs", "min ms", "mean ms", "p50 ms", "p90 ms", "p99 ms", "max ms"]
    row = [stats.runs] + [_ms(getattr(stats, k)) for k in ("min", "mean", "p50", "p90", "p99", "max")]
    return format_table(headers, [row])


def _stats(array: np.ndarray | None) -> list[str]:
    """min, max, mean and the count of non-finite values, where they mean something."""
    if array is None:
        return ["", "", "", ""]
    if array.dtype.type.__module__.split(".")[0] == "ml_dtypes":  # bfloat16, float8
        from graphopt.numerics import widened  # imports onnx: only for such outputs

        array = widened(array)
    if array.size == 0 or array.dtype.kind not in "biuf":
        return ["", "", "", ""]
    if array.dtype.kind == "b":
        return [str(bool(array.min())), str(bool(array.max())), f"{array.mean():.4g}", ""]
    if array.dtype.kind == "f":
        finite = np.isfinite(array)
        bad = int(array.size - np.count_nonzero(finite))
        values = array[finite].astype(np.float64)
        if values.size == 0:
            return ["", "", "", str(bad)]
        return [f"{values.min():.4g}", f"{values.max():.4g}", f"{values.mean():.4g}",
                str(bad) if bad else ""]
    return [str(array.min()), str(array.max()), f"{array.astype(np.float64).mean():.4g}", ""]


def _numbers(value: Any) -> np.ndarray | None:
    """The values inside an output as one array: a tensor's, every element of a sequence
    (flattened), a map's values; None where they cannot be put together."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        parts = [_numbers(item) for item in value]
        if not parts or any(p is None for p in parts) or len({p.dtype for p in parts}) > 1:
            return None
        return np.concatenate([p.reshape(-1) for p in parts])
    return np.asarray(value)


def _shape_cell(value: Any) -> str:
    """A tensor's shape; a sequence's count and element shape (`2×[2,3]`), or each element's
    when they differ; a map's size."""
    if value is None:
        return "-"
    if isinstance(value, Mapping):
        return f"({len(value)} keys)"
    if isinstance(value, (list, tuple)):
        shapes = [_shape_cell(item) for item in value]
        if not shapes:
            return "0 elements"
        if len(set(shapes)) == 1:
            return f"{len(shapes)}×{shapes[0]}"
        more = f", +{len(shapes) - 3}" if len(shapes) > 3 else ""
        return ", ".join(shapes[:3]) + more
    return "[" + ",".join(str(d) for d in np.shape(value)) + "]"


def _dtype_cell(value: Any, declared: str | None) -> str:
    if isinstance(value, np.ndarray):
        # onnxruntime returns a string tensor as an array of Python str objects
        return "string" if value.dtype == object else str(value.dtype)
    if isinstance(value, (list, tuple, Mapping)) or value is None:
        return output_label(value, declared)
    return str(np.asarray(value).dtype)


def format_outputs(outputs: Mapping[str, Any], types: Mapping[str, str] | None = None) -> str:
    """A table of each output: name, dtype, shape and a few statistics. A sequence, map or
    empty optional is labelled by its type (`seq(float32)`, from `types` where given) and its
    statistics cover every value it holds."""
    rows = []
    for name, value in outputs.items():
        rows.append([name, _dtype_cell(value, (types or {}).get(name)), _shape_cell(value),
                     *_stats(_numbers(value))])
    return format_table(["output", "dtype", "shape", "min", "max", "mean", "nan/inf"], rows,
                        names={0})
