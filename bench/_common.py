"""Shared bench plumbing: pinned onnxruntime sessions, the correctness check, statistics, output."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import tempfile
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from graphopt import numerics

# BENCH.md: every ORT session in a bench runs on one intra-op and one inter-op thread.
THREADS = 1
# The tolerances graphopt's own --verify uses; the table marks an output beyond them.
RTOL, ATOL = 1e-4, 1e-5


def session_options(level: str = "disable", optimized_path: str | None = None,
                    threads: int = THREADS) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = numerics.LEVELS[level]
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # warnings about unused initializers would flood the table
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    return options


def run_model(path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of the model at `path` at ORT_DISABLE_ALL, so no ORT fusion can hide a bug."""
    sess = ort.InferenceSession(path, session_options("disable"),
                                providers=["CPUExecutionProvider"])
    missing = [i.name for i in sess.get_inputs() if i.name not in feeds]
    if missing:
        # A rewritten model that asks for more than the original's inputs cannot be dropped in.
        raise ValueError(f"needs {len(missing)} more input(s): {missing[0]}"
                         + (", …" if len(missing) > 1 else ""))
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@dataclass
class Check:
    """Max absolute difference per output against the reference, or why there is none."""

    max_abs: dict[str, float]
    ok: bool
    error: str | None = None

    @property
    def worst(self) -> float | None:
        return max(self.max_abs.values(), default=0.0) if self.error is None else None

    def cell(self) -> str:
        if self.error:
            return f"error: {self.error}"
        text = "0" if self.worst == 0 else f"{self.worst:.1e}"
        return text + ("" if self.ok else " ✗")


def check_outputs(path: str, feeds: dict[str, np.ndarray],
                  expected: dict[str, np.ndarray]) -> Check:
    try:
        actual = run_model(path, feeds)
    except Exception as e:  # noqa: BLE001 - ORT's message is the finding
        return Check({}, False, short_reason(e))
    return compare_outputs(expected, actual)


def compare_outputs(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray],
                    rtol: float = RTOL, atol: float = ATOL) -> Check:
    """`actual` against `expected`: max absolute difference per output, ok within rtol/atol."""
    problems = numerics.compare(expected, actual, rtol, atol)
    errors = {}
    for name, exp in expected.items():
        got = actual.get(name)
        if got is None or np.shape(got) != np.shape(exp):
            # A missing output or a wrong shape has no meaningful difference to report.
            return Check({}, False, str(problems[0]) if problems else f"output {name} missing")
        if np.size(exp) == 0:
            errors[name] = 0.0
        elif exp.dtype == object:
            errors[name] = 0.0 if np.array_equal(got, exp) else math.inf
        else:
            diff = np.abs(np.asarray(got, np.float64) - np.asarray(exp, np.float64))
            # NaN in the same place in both is agreement, not a difference.
            diff[np.isnan(diff) & np.isnan(np.asarray(exp, np.float64))] = 0.0
            errors[name] = float(np.max(diff))
    return Check(errors, not problems)


# ORT wraps every cause in the same boilerplate; the cause is what fits in a table cell.
_ORT_NOISE = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : |Load model from \S+ failed:\s*"
                        r"|This is an invalid model\.\s*")


def short_reason(error: BaseException, width: int = 80) -> str:
    """The last non-empty line of an exception (ORT and onnx put the cause there), without
    ORT's boilerplate."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = _ORT_NOISE.sub("", lines[-1]) if lines else type(error).__name__
    text = text.replace("|", "/")  # a pipe would split the markdown cell
    return text if len(text) <= width else text[: width - 1] + "…"


def node_count(path: str) -> int:
    """Top-level nodes of the ONNX file at `path` (weights are not read)."""
    return len(onnx.load(path, load_external_data=False).graph.node)


def megabytes(path: str) -> float:
    return os.path.getsize(path) / 1e6


@dataclass
class Stats:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, times: list[float]) -> "Stats":
        return cls(statistics.median(times), min(times), max(times))

    def cell(self) -> str:
        return f"{_seconds(self.median)} ({_seconds(self.low)}–{_seconds(self.high)})"


def _seconds(value: float) -> str:
    # Three significant digits whatever the scale: 0.0123, 0.456, 12.3.
    return f"{value:.3g}"


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A pipe table with columns padded to equal width, so it reads in a terminal too."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                      *map(line, rows)])


def summary(doc: str) -> str:
    """A script docstring's first paragraph, for its --help (its first line may end mid-sentence)."""
    return doc.split("\n\n")[0]


def write_json(path: str, data: dict) -> None:
    """`data` as JSON at `path`, its folder made first (`--json out/x.json` in a fresh clone)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_strict(data), f, indent=2, allow_nan=False, default=str)
        f.write("\n")


def _strict(data):
    """Infinite or NaN floats as strings: strict JSON readers reject the bare tokens."""
    if isinstance(data, dict):
        return {k: _strict(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_strict(v) for v in data]
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    return data


def shape_list(dims: str, example: str):
    """An argparse type for comma-separated shapes like `example`, each with one positive dim
    per letter of `dims` ("CxHxW")."""
    rank = len(dims.split("x"))

    def parse(text: str) -> list[tuple[int, ...]]:
        try:
            shapes = [tuple(int(d) for d in item.split("x")) for item in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a list like {example}") from None
        if any(len(s) != rank or min(s) < 1 for s in shapes):
            raise argparse.ArgumentTypeError(f"'{text}': each shape is {dims}, every dim ≥ 1")
        return shapes

    return parse


def positive_int(text: str) -> int:
    """An argparse type for a count that must be at least 1 (--runs, --seeds, --threads, …)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type for a count where 0 means none (--warmup), or a seed numpy accepts."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < low:
        # Found mid-run it is a median of no times or a loop that never ran: a traceback.
        raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
    return value


def positive_ints(text: str) -> list[int]:
    """An argparse type for comma-separated counts, each at least 1 ("1,2")."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers") \
            from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': each value must be at least 1")
    return values


def json_path(text: str) -> str:
    """An argparse type for --json FILE: refused now when write_json could not write it there,
    not after the whole run. Missing folders pass (write_json makes them)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path, expected a file name")
    target = os.path.realpath(text)
    if text.endswith(("/", os.sep)) or os.path.isdir(target):
        raise argparse.ArgumentTypeError(f"{text} is a directory, expected a file path")
    if os.path.exists(target):  # write_json opens it in place (a file, /dev/stdout)
        if not os.access(target, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text}: not writable")
        return text
    folder = os.path.dirname(target)
    while not os.path.exists(folder):  # the folder write_json makes the missing ones in
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text}: {folder} is a file, not a folder")
    try:  # permission bits do not tell for root or a read-only mount: create a file there
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".bench-json-", suffix=".tmp")
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text}: cannot create a file in {folder} "
                                         f"({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)
    return text
