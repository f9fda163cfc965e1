"""onnxruntime's CPU STFT against the strided Conv graphopt's LowerSTFT puts in its place (-O3).

Per signal length × frame length × frame step, a one-STFT model (a Hann window, one-sided, a
batch of one) and what `graphopt.optimize(model, level=3)` makes of it run interleaved in
onnxruntime's CPU provider at 1 thread and ORT_DISABLE_ALL, medians of the per-call wall time.
Beside the times: each one's largest error against the exact transform (numpy's float64 FFT of
the same float32 samples), relative to the largest bin. A power-of-two frame past 512 is left
to onnxruntime's FFT (the `lowered` column then times the same STFT).

    python bench/stft.py
    python bench/stft.py --shapes 16000x400x160 --runs 100
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fused_kernel import table_main  # noqa: E402

import graphopt  # noqa: E402

# 16 kHz speech: 25 ms frames every 10 ms (Whisper's, NeMo's and a keyword spotter's log-mel),
# 32 ms frames; 10 s of it; music-style frames of 1024 and 2048 samples.
SHAPES = ((16000, 400, 160), (16000, 512, 160), (16000, 256, 128), (160000, 400, 160),
          (16000, 640, 320), (16000, 1024, 256), (16000, 2048, 512))


def _model(length: int, frame: int, step: int):
    signal = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, length, 1])
    spectrum = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    weights = [numpy_helper.from_array(np.array(step, np.int64), "step"),
               numpy_helper.from_array(np.hanning(frame).astype(np.float32), "window")]
    node = helper.make_node("STFT", ["x", "step", "window"], ["y"], onesided=1)
    graph = helper.make_graph([node], "g", [signal], [spectrum], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _exact(x: np.ndarray, frame: int, step: int) -> np.ndarray:
    window = np.hanning(frame).astype(np.float32).astype(np.float64)
    samples = x[0, :, 0].astype(np.float64)
    count = (samples.size - frame) // step + 1
    frames = np.stack([samples[i * step:i * step + frame] * window for i in range(count)])
    bins = np.fft.rfft(frames, axis=-1)
    return np.stack([bins.real, bins.imag], -1)[None]


def rows(shape: tuple[int, ...], runs: int) -> list[list[str]]:
    import time

    import onnxruntime as ort
    from _common import session_options

    length, frame, step = shape
    model = _model(length, frame, step)
    lowered = graphopt.optimize(model, level=3).to_onnx()
    fired = any(node.op_type == "Conv" for node in lowered.graph.node)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, length, 1)).astype(np.float32)}
    sessions = {name: ort.InferenceSession(proto.SerializeToString(), session_options("disable"),
                                           providers=["CPUExecutionProvider"])
                for name, proto in (("STFT", model), ("lowered", lowered))}
    times: dict[str, list[float]] = {name: [] for name in sessions}
    outputs = {}
    for i in range(10 + runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            outputs[name] = session.run(None, feeds)[0]
            if i >= 10:
                times[name].append(time.perf_counter() - start)
    ort_us, lowered_us = (float(np.median(t)) * 1e6 for t in times.values())
    exact = _exact(feeds["x"], frame, step)
    scale = float(np.abs(exact).max())
    errors = [f"{float(np.abs(outputs[name] - exact).max()) / scale:.1e}" for name in sessions]
    return [["x".join(map(str, shape)), f"{ort_us:.1f}",
             f"{lowered_us:.1f}" + ("" if fired else " (kept)"), f"{lowered_us / ort_us:.2f}",
             *errors]]


COLUMNS = ["L×N×step", "STFT µs", "lowered µs", "×", "STFT error", "lowered error"]

if __name__ == "__main__":
    sys.exit(table_main(__doc__, COLUMNS, SHAPES, "LxNxSTEP", "16000x400x160", rows, runs=30))
