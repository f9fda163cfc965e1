"""The speed line under a lossy compile's accuracy report: the written model's run time against
its source's on this machine, one thread each, in interleaved runs, medians compared."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import onnx
import onnxruntime as ort

from graphopt import numerics
from graphopt.output_kind import writes_om

# Time spent on the timed runs of both models together, past the warm-up; the rounds are
# between MIN_ROUNDS and MAX_ROUNDS whatever the budget says.
BUDGET_SECONDS = 2.0
MIN_ROUNDS, MAX_ROUNDS = 3, 25
# Slower than this ratio and the line becomes a warning: below it, the noise of a shared
# machine's few runs (a few percent) can tip it either way.
SLOWER = 1.05


@dataclass(frozen=True)
class SpeedCheck:
    source_seconds: float   # median seconds of one run
    output_seconds: float
    rounds: int

    @property
    def ratio(self) -> float:
        return self.output_seconds / self.source_seconds

    @property
    def slower(self) -> bool:
        return self.ratio > SLOWER

    def format(self, source_label: str, output_label: str) -> str:
        levels = "ORT_ENABLE_ALL, the .om at the levels it records" \
            if writes_om(output_label) else "ORT_ENABLE_ALL"
        return (f"speed: {output_label} takes {self.ratio:.2f}× the time of {source_label} on "
                f"this machine ({_ms(self.output_seconds)} against {_ms(self.source_seconds)} a "
                f"run; 1 thread, {levels}, medians of {self.rounds} interleaved runs)")


def _ms(seconds: float) -> str:
    """Three significant digits, trailing zeros kept ("31.0 µs" beside "33.2 µs", where .3g
    wrote "31 µs") and no exponent (1234 ms, not 1.23e+03)."""
    value, unit = (seconds * 1e3, "ms") if seconds >= 1e-3 else (seconds * 1e6, "µs")
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{decimals}f} {unit}"


def _onnx_runner(model):
    """run(feeds) of an .onnx path or ModelProto on one thread at ORT_ENABLE_ALL."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    # bfloat16 and float8 pass as their bits: the binding has no numpy type for them.
    run = numerics.typed_runner(session) or session.run
    return lambda feeds: run(None, {k: v for k, v in feeds.items() if k in names})


def _om_session(path):
    """An .om's session on one thread, its partitions at the levels their compile recorded
    (what `graphopt run` and `graphopt.load` use)."""
    from graphopt.codegen.loader import load

    return load(path, intra_op_num_threads=1, inter_op_num_threads=1)


def speed_check(source, output, feeds: dict, budget: float = BUDGET_SECONDS) -> SpeedCheck:
    """Time `source` (an .onnx path or ModelProto) against `output` (.onnx or .om path) on
    `feeds`: one untimed run each, then rounds of one run each, alternating which goes first
    (a run finds the caches as the one before left them), for about `budget` seconds."""
    om = _om_session(output) if writes_om(output) else None
    try:
        return _timed(_onnx_runner(source), om.run if om else _onnx_runner(output), feeds,
                      budget)
    finally:
        if om is not None:
            om.close()


def _timed(source_run, output_run, feeds: dict, budget: float) -> SpeedCheck:
    runners = [source_run, output_run]
    warm = []
    for run in runners:
        start = time.perf_counter()
        run(feeds)
        warm.append(time.perf_counter() - start)
    rounds = int(budget / max(sum(warm), 1e-9))
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, rounds))
    samples: list[list[float]] = [[], []]
    for index in range(rounds):
        for which in ((0, 1) if index % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            runners[which](feeds)
            samples[which].append(time.perf_counter() - start)
    return SpeedCheck(statistics.median(samples[0]), statistics.median(samples[1]), rounds)
