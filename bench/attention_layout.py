"""A model with attention, compiled with and without FuseAttention, against the original.

Per model: the original at ORT_ENABLE_ALL, graphopt -O2 with FuseAttention switched off, and
graphopt -O2, each run at ORT_ENABLE_ALL in onnxruntime's CPU provider at 1 thread, the calls
interleaved, medians of the per-call wall time, node counts beside them, outputs compared with
the original at ORT_DISABLE_ALL. Inputs are random (seed 0); a symbolic dim takes the size
--dims gives it, a bool input (a padding mask) is False but for its last quarter in the last
row. --extra adds already compiled files (another graphopt's output, say) to the same runs.

    python bench/attention_layout.py tenc_sf.dyn18.onnx --dims seq=128,batch=4
    python bench/attention_layout.py a.onnx b.onnx --dims seq=64,batch=2 --extra before=a.old.onnx
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphopt  # noqa: E402
from _common import markdown_table, run_model, session_options  # noqa: E402


def _feeds(path: str, dims: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    model = onnx.load(path, load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param]
                 for d in tensor.shape.dim]
        if tensor.elem_type == onnx.TensorProto.BOOL:
            mask = np.zeros(shape, bool)
            if mask.ndim == 2:
                mask[-1, shape[1] - shape[1] // 4:] = True
            feeds[value.name] = mask
        else:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def bench(path: str, dims: dict[str, int], extra: dict[str, str], runs: int,
          folder: str) -> list[list[str]]:
    files = {"original": path}
    for name, disabled in (("-O2 without FuseAttention", {"FuseAttention"}), ("-O2", set())):
        out = os.path.join(folder, f"{len(files)}.onnx")
        graphopt.save(graphopt.optimize(path, level=2, disable_passes=disabled), out)
        files[name] = out
    files.update(extra)
    feeds = _feeds(path, dims)
    want = run_model(path, feeds)
    sessions = {name: ort.InferenceSession(file, session_options("all"),
                                           providers=["CPUExecutionProvider"])
                for name, file in files.items()}
    times: dict[str, list[float]] = {name: [] for name in files}
    for i in range(runs + 10):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            if i >= 10:
                times[name].append(time.perf_counter() - start)
    base = float(np.median(times["original"]))
    rows = []
    for name, file in files.items():
        got = run_model(file, feeds)
        diff = max(float(np.max(np.abs(want[k] - got[k]))) for k in want)
        median = float(np.median(times[name]))
        rows.append([os.path.basename(path), name,
                     str(len(onnx.load(file, load_external_data=False).graph.node)),
                     f"{median * 1e6:.0f}", f"{median / base:.2f}", f"{diff:.1e}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="ONNX models")
    parser.add_argument("--dims", default="", help="sizes of symbolic dims: seq=128,batch=4")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=FILE",
                        help="a compiled file to run beside the others (one model only)")
    parser.add_argument("--runs", type=int, default=200, help="timed calls per variant (200)")
    args = parser.parse_args(argv)
    dims = {k: int(v) for k, v in (p.split("=") for p in args.dims.split(",") if p)}
    extra = dict(p.split("=", 1) for p in args.extra)
    if extra and len(args.models) > 1:
        parser.error("--extra goes with one model")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for path in args.models:
            rows += bench(path, dims, extra, args.runs, folder)
    print(f"median µs per call of {args.runs} interleaved calls, 1 thread, ORT_ENABLE_ALL, "
          f"onnxruntime {ort.__version__}, dims {args.dims or 'as exported'}\n")
    print(markdown_table(["model", "variant", "nodes", "µs", "× original", "max abs Δ"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
