"""Calibration of the CPU cost model: onnxruntime micro-benchmarks on this machine, saved as JSON.

Each benchmark is a one-op ONNX model run at ORT_ENABLE_ALL on `threads` intra-op threads,
through an IOBinding (no numpy conversion of outputs), timed as the median of repeated runs:

    overhead     a chain of 65 tiny Relus against a single one: µs per node and per run
    gemm         MatMul [M,K]·[K,N]                      → peak GFLOP/s of the gemm class
    conv         3×3 Conv, 64 (32 quick) channels        → peak GFLOP/s of the conv class
    gemm_int8    the MatMul, QDQ on uint8 data and int8 weights (runs as QLinearMatMul)
    conv_int8    the Conv, QDQ likewise (runs as QLinearConv, in NHWC with its Transposes)
    elementwise  Add of two large vectors                → bandwidth GB/s (memory-bound)
    softmax, layernorm                                   → bandwidth of the reduction class
    transpose    [64, n, n] → [64, n, n]ᵀ                → bandwidth of the movement class

A kernel's net time is its median minus the run's fixed cost and one node's overhead; a
compute-bound class fits its peak (bandwidth from the Add), a memory-bound one its bandwidth
(peak from the MatMul, so arithmetic rarely binds). The JSON records the onnxruntime version and
the CPU model; `load` warns (StaleCalibrationWarning) when either differs from this machine's.
A calibration written before the int8 classes existed gets them from its float classes, at the
`cpu` profile's int8 speed-up.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphopt.api_args import THREAD_LIMIT, is_integer
from graphopt.cache_dir import cache_dir
from graphopt.errors import OptionError
from graphopt.input_files import looks_like_zip, refuse_device
from graphopt.option_names import CALIBRATE_FLAGS, option
from graphopt.tuner.cpu_model import (
    INT8_CLASSES,
    OP_CLASSES,
    ClassConstants,
    CpuCostModel,
    int8_speedup,
)
from graphopt.warning_scope import notice

FORMAT_VERSION = 1
OVERHEAD_CHAIN = 65


class StaleCalibrationWarning(UserWarning):
    """A calibration measured with another onnxruntime or on another CPU than this one."""


@dataclass
class Measurement:
    name: str
    seconds: float       # median wall time of one run
    flops: float
    bytes: float
    runs: int

    def to_json(self) -> dict:
        return {"name": self.name, "seconds": self.seconds, "flops": self.flops,
                "bytes": self.bytes, "runs": self.runs}


_JSON_TYPES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
               type(None): "null", int: "a number", float: "a number"}


def _object(value, where: str) -> dict:
    """`value` when it is a JSON object; ValueError naming `where` otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {_JSON_TYPES.get(type(value), 'a value')}, not an object")
    return value


def _number(table: dict, key: str, where: str = "") -> float:
    """table[key] as a float; ValueError naming the field when it is missing or no number."""
    field = f"{where}.{key}" if where else key
    if key not in table:
        raise ValueError(f"{field}: missing")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = "" if value is None else f" {value!r}"
        raise ValueError(f"{field}: {_JSON_TYPES.get(type(value), 'a value')}{shown}, not a "
                         "number")
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        number = math.inf
    if not math.isfinite(number):  # JSON's Infinity and NaN too
        raise ValueError(f"{field}: not a finite number")
    return number


def _field(where: str, make):
    """make(), its errors named by the field `where` they come from."""
    try:
        return make()
    except KeyError as e:
        raise ValueError(f"{where}: missing key {e}") from None
    except (TypeError, ValueError, AttributeError, OverflowError) as e:
        message = str(e)
        raise ValueError(message if message.startswith(where) else f"{where}: {message}") \
            from None


@dataclass
class CalibrationResult:
    """Fitted constants per op class, with what they were measured on."""

    constants: dict[str, ClassConstants]
    run_overhead_us: float                    # fixed cost of one session run, nodes aside
    onnxruntime_version: str
    cpu_model: str
    threads: int
    quick: bool = False
    created: str = ""
    measurements: list[Measurement] = field(default_factory=list)

    def cost_model(self) -> CpuCostModel:
        return CpuCostModel(self.constants)

    def to_json(self) -> dict:
        return {
            "format_version": FORMAT_VERSION, "target": "cpu",
            "onnxruntime_version": self.onnxruntime_version, "cpu_model": self.cpu_model,
            "threads": self.threads, "quick": self.quick, "created": self.created,
            "run_overhead_us": self.run_overhead_us,
            "constants": {cls: c.to_json() for cls, c in self.constants.items()},
            "measurements": [m.to_json() for m in self.measurements],
        }

    def save(self, path: str | os.PathLike | None = None) -> str:
        """Writes the JSON to `path` (default: default_path()) and returns the path."""
        from graphopt.atomic import atomic_write_bytes

        path = os.fspath(path) if path is not None else default_path()
        if path == default_path():
            os.makedirs(os.path.dirname(path), exist_ok=True)
        text = json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"
        atomic_write_bytes(path, text.encode("utf-8"))
        return path

    @classmethod
    def from_json(cls, doc: dict, label: str = "<json>") -> CalibrationResult:
        try:
            if not isinstance(doc, dict):
                raise ValueError(f"{_JSON_TYPES.get(type(doc), 'a value')}, not an object")
            if doc.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format_version {doc.get('format_version')!r}, "
                                 f"this graphopt reads {FORMAT_VERSION}")
            if doc.get("target", "cpu") != "cpu":  # graphopt calibrates the CPU alone
                raise ValueError(f"target {doc.get('target')!r}, not cpu")
            constants = {}
            for name, c in _object(doc["constants"], "constants").items():
                if name not in OP_CLASSES:
                    raise ValueError(f"unknown op class '{name}'")
                c, where = _object(c, f"constants.{name}"), f"constants.{name}"
                constants[name] = ClassConstants(*(_number(c, key, where) for key in (
                    "peak_gflops", "bandwidth_gbs", "overhead_us")))
                c = constants[name]
                if not all(math.isfinite(v) and v >= 0 for v in vars(c).values()):
                    raise ValueError(f"constants.{name}: figures must be finite and ≥ 0")
                # A rate of 0 would price all of that side of the roofline at nothing.
                if c.peak_gflops == 0 or c.bandwidth_gbs == 0:
                    raise ValueError(f"constants.{name}: peak_gflops and bandwidth_gbs must "
                                     "be above 0")
            for int8, float_class in INT8_CLASSES.items():
                if int8 not in constants and float_class in constants:
                    c = constants[float_class]
                    constants[int8] = ClassConstants(c.peak_gflops * int8_speedup(),
                                                     c.bandwidth_gbs, c.overhead_us)
            overhead = _number(doc, "run_overhead_us")
            threads = _number(doc, "threads")
            if threads != int(threads):
                raise ValueError(f"threads: {threads}, not a whole number")
            threads = int(threads)
            if not (math.isfinite(overhead) and overhead >= 0):
                raise ValueError("run_overhead_us must be finite and ≥ 0")
            if threads < 1:
                raise ValueError("threads must be at least 1")
            if not constants:  # every figure would silently be the profile's defaults
                raise ValueError("no op class constants")
            return cls(constants=constants, run_overhead_us=overhead,
                       onnxruntime_version=str(doc["onnxruntime_version"]),
                       cpu_model=str(doc["cpu_model"]), threads=threads,
                       quick=bool(doc.get("quick", False)), created=str(doc.get("created", "")),
                       measurements=[_field(f"measurements[{i}]", lambda i=i, m=m: Measurement(
                           **_object(m, f"measurements[{i}]")))
                           for i, m in enumerate(doc.get("measurements", []))])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise OptionError(f"calibration {label}: not a graphopt CPU calibration ({what}); "
                              "re-run `graphopt calibrate --target cpu`") from None

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> CalibrationResult:
        """Reads a calibration (default: default_path()). A calibration from another onnxruntime
        version or CPU still loads, with a StaleCalibrationWarning: its constants remain the best
        figures at hand, but kernels change between releases and machines."""
        path = os.fspath(path) if path is not None else default_path()
        refuse_device(path, "calibration")
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as e:
            raise OptionError(f"calibration {path}: cannot read it: {e.strerror or e} "
                              "(run `graphopt calibrate --target cpu`)") from None
        except json.JSONDecodeError as e:
            raise OptionError(f"calibration {path}: not valid JSON: {e.msg}") from None
        except RecursionError:  # [[[…]]]: more nesting than the parser takes
            raise OptionError(f"calibration {path}: not a graphopt CPU calibration (nested too "
                              "deeply); re-run `graphopt calibrate --target cpu`") from None
        except UnicodeDecodeError:
            # optimize's --calibration is data, profile's the cost model's fit: an .npz meant
            # as the model's inputs lands here.
            data = (" (an .npz: the model's inputs go in --inputs, and --calibration here is "
                    "the CPU cost model's fit that `graphopt calibrate` writes)"
                    if looks_like_zip(path) else "; re-run `graphopt calibrate --target cpu`")
            raise OptionError(f"calibration {path}: not valid JSON (not UTF-8 text){data}") \
                from None
        result = cls.from_json(doc, path)
        for what, theirs, ours in (("onnxruntime", result.onnxruntime_version, ort.__version__),
                                   ("CPU", result.cpu_model, cpu_model_name())):
            if theirs != ours:
                notice(f"calibration {path} was measured with {what} {theirs}, this is "
                       f"{ours}: re-run `graphopt calibrate --target cpu` for figures that hold "
                       "here", StaleCalibrationWarning, stacklevel=2)
        return result


def save(result: CalibrationResult, path: str | os.PathLike | None = None) -> str:
    return result.save(path)


def load(path: str | os.PathLike | None = None) -> CalibrationResult:
    return CalibrationResult.load(path)


def default_path() -> str:
    """$XDG_CACHE_HOME/graphopt/calibration-cpu.json (~/.cache when unset)."""
    return os.path.join(cache_dir(), "calibration-cpu.json")


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# --- the micro-benchmarks ------------------------------------------------------------------


@dataclass
class _Bench:
    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    flops: float
    bytes: float


def _f32(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _make(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "calibration", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def _rand(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _int8_variant(bench: _Bench, rng) -> _Bench:
    """`bench`'s one Conv or MatMul as graphopt's INT8 pass writes it: uint8 data and int8
    weights dequantized into it, its output quantized to uint8, which onnxruntime runs as one
    QLinearConv or QLinearMatMul. Flops as the float kernel; bytes at one per element."""
    graph = bench.model.graph
    op = graph.node[0]
    (x,), (y,) = graph.input, graph.output
    w = numpy_helper.to_array(next(t for t in graph.initializer if t.name == op.input[1]))
    scalar = lambda name, v, dtype: numpy_helper.from_array(np.array(v, dtype), name)  # noqa: E731
    inits = [numpy_helper.from_array(np.clip(np.round(w / 0.02), -127, 127).astype(np.int8),
                                     "w_q"),
             scalar("x_scale", 0.02, np.float32), scalar("x_zero", 128, np.uint8),
             scalar("w_scale", 0.02, np.float32),
             scalar("y_scale", 0.5, np.float32), scalar("y_zero", 128, np.uint8)]
    nodes = [helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_f"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w_f"]),
             helper.make_node(op.op_type, ["x_f", "w_f"], ["y_f"], name=op.op_type),
             helper.make_node("QuantizeLinear", ["y_f", "y_scale", "y_zero"], ["y_q"])]
    nodes[2].attribute.extend(op.attribute)
    shape = lambda v: [d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    model = _make(nodes, [helper.make_tensor_value_info("x_q", TensorProto.UINT8, shape(x))],
                  [helper.make_tensor_value_info("y_q", TensorProto.UINT8, shape(y))], inits)
    feed = rng.integers(0, 256, shape(x), dtype=np.uint8)
    elems = math.prod(shape(x)) + w.size + math.prod(shape(y))
    return _Bench(f"QDQ {bench.name}", model, {"x_q": feed}, bench.flops, float(elems))


def _relu_chain(length: int) -> _Bench:
    names = ["x"] + [f"r{i}" for i in range(length - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu{i}")
             for i in range(length)]
    model = _make(nodes, [_f32("x", [1, 16])], [_f32("y", [1, 16])])
    return _Bench(f"relu x{length}", model, {"x": np.ones((1, 16), np.float32)}, 0.0, 0.0)


def benchmarks(quick: bool, seed: int = 0) -> dict[str, _Bench]:
    """The kernels that stand for each op class, by benchmark name."""
    rng = np.random.default_rng(seed)
    out: dict[str, _Bench] = {}
    m, k, n = (256, 512, 512) if quick else (512, 1024, 1024)
    out["gemm"] = _Bench(
        f"MatMul {m}x{k}x{n}",
        _make([helper.make_node("MatMul", ["a", "w"], ["y"])], [_f32("a", [m, k])],
              [_f32("y", [m, n])], [numpy_helper.from_array(_rand(rng, k, n), "w")]),
        {"a": _rand(rng, m, k)}, 2.0 * m * k * n, 4.0 * (m * k + k * n + m * n))
    c, hw = (32, 28) if quick else (64, 56)
    out["conv"] = _Bench(
        f"Conv 3x3 {c}->{c} {hw}x{hw}",
        _make([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
              [_f32("x", [1, c, hw, hw])], [_f32("y", [1, c, hw, hw])],
              [numpy_helper.from_array(_rand(rng, c, c, 3, 3), "w"),
               numpy_helper.from_array(_rand(rng, c), "b")]),
        {"x": _rand(rng, 1, c, hw, hw)}, 2.0 * c * hw * hw * c * 9,
        4.0 * (2 * c * hw * hw + c * c * 9 + c))
    out["gemm_int8"] = _int8_variant(out["gemm"], rng)
    out["conv_int8"] = _int8_variant(out["conv"], rng)
    size = (1 << 20) if quick else (1 << 22)
    out["elementwise"] = _Bench(
        f"Add {size >> 20}M floats",
        _make([helper.make_node("Add", ["a", "b"], ["y"])], [_f32("a", [size]), _f32("b", [size])],
              [_f32("y", [size])]),
        {"a": _rand(rng, size), "b": _rand(rng, size)}, float(size), 12.0 * size)
    rows, cols = (256, 1024) if quick else (1024, 1024)
    out["softmax"] = _Bench(
        f"Softmax {rows}x{cols}",
        _make([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_f32("x", [rows, cols])],
              [_f32("y", [rows, cols])]),
        {"x": _rand(rng, rows, cols)}, 4.0 * rows * cols, 8.0 * rows * cols)
    out["layernorm"] = _Bench(
        f"LayerNormalization {rows}x{cols}",
        _make([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
              [_f32("x", [rows, cols])], [_f32("y", [rows, cols])],
              [numpy_helper.from_array(_rand(rng, cols), "g"),
               numpy_helper.from_array(_rand(rng, cols), "b")]),
        {"x": _rand(rng, rows, cols)}, 8.0 * rows * cols, 8.0 * rows * cols + 8.0 * cols)
    side = 128 if quick else 256
    out["transpose"] = _Bench(
        f"Transpose 64x{side}x{side}",
        _make([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])],
              [_f32("x", [64, side, side])], [_f32("y", [64, side, side])]),
        {"x": _rand(rng, 64, side, side)}, 0.0, 8.0 * 64 * side * side)
    return out


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def time_bench(bench: _Bench, threads: int, seconds: float, min_runs: int = 5,
               max_runs: int = 2000) -> Measurement:
    """Median wall time of one run of `bench`, repeating for about `seconds` after warm-up."""
    sess = _session(bench.model, threads)
    binding = sess.io_binding()
    for name, array in bench.feeds.items():
        binding.bind_cpu_input(name, array)
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cpu")
    for _ in range(2):
        sess.run_with_iobinding(binding)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < deadline):
        start = time.perf_counter()
        sess.run_with_iobinding(binding)
        times.append(time.perf_counter() - start)
    return Measurement(bench.name, statistics.median(times), bench.flops, bench.bytes, len(times))


Progress = Callable[[str, Measurement], None]


def calibrate(threads: int = 1, seconds_budget: float = 12.0, quick: bool = False,
              progress: Progress | None = None) -> CalibrationResult:
    """Runs the micro-benchmarks for about `seconds_budget` seconds of timed runs (sessions and
    warm-ups come on top) and fits the constants. `progress(key, measurement)` follows each one."""
    # An integer (onnxruntime's option takes no 2.5, True would pass as 1), bounded as
    # onnxruntime starts every thread it is asked for.
    if not is_integer(threads) or not 1 <= threads <= THREAD_LIMIT:
        raise OptionError(f"{option('threads', CALIBRATE_FLAGS)} must be from 1 to "
                          f"{THREAD_LIMIT}, got {threads!r}")
    if not seconds_budget > 0:
        raise OptionError(f"the calibration budget must be > 0 seconds, got {seconds_budget}")
    kernels = benchmarks(quick)
    share = seconds_budget / (len(kernels) + 2)
    measured: dict[str, Measurement] = {}

    def run(key: str, bench: _Bench) -> Measurement:
        measured[key] = time_bench(bench, threads, share)
        if progress is not None:
            progress(key, measured[key])
        return measured[key]

    one = run("overhead-1", _relu_chain(1)).seconds
    chain = run(f"overhead-{OVERHEAD_CHAIN}", _relu_chain(OVERHEAD_CHAIN)).seconds
    node_s = max((chain - one) / (OVERHEAD_CHAIN - 1), 1e-8)
    run_s = max(one - node_s, 0.0)
    for key, bench in kernels.items():
        run(key, bench)

    def net(key: str) -> float:
        # Never below a tenth of the raw time: noise must not fit an absurd rate.
        raw = measured[key].seconds
        return max(raw - run_s - node_s, raw / 10)

    bandwidth = kernels["elementwise"].bytes / net("elementwise") / 1e9
    gemm_peak = kernels["gemm"].flops / net("gemm") / 1e9
    conv_peak = kernels["conv"].flops / net("conv") / 1e9
    gemm_int8_peak = kernels["gemm_int8"].flops / net("gemm_int8") / 1e9
    conv_int8_peak = kernels["conv_int8"].flops / net("conv_int8") / 1e9
    reduction_bw = ((kernels["softmax"].bytes + kernels["layernorm"].bytes)
                    / (net("softmax") + net("layernorm")) / 1e9)
    movement_bw = kernels["transpose"].bytes / net("transpose") / 1e9
    overhead_us = node_s * 1e6
    constants = {
        "gemm": ClassConstants(gemm_peak, bandwidth, overhead_us),
        "conv": ClassConstants(conv_peak, bandwidth, overhead_us),
        "gemm_int8": ClassConstants(gemm_int8_peak, bandwidth, overhead_us),
        "conv_int8": ClassConstants(conv_int8_peak, bandwidth, overhead_us),
        "elementwise": ClassConstants(gemm_peak, bandwidth, overhead_us),
        "reduction": ClassConstants(gemm_peak, reduction_bw, overhead_us),
        "movement": ClassConstants(gemm_peak, movement_bw, overhead_us),
        "view": ClassConstants(gemm_peak, bandwidth, overhead_us),
    }
    return CalibrationResult(
        constants=constants, run_overhead_us=run_s * 1e6, onnxruntime_version=ort.__version__,
        cpu_model=cpu_model_name(), threads=threads, quick=quick,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        measurements=list(measured.values()))


def load_or_calibrate(path: str | os.PathLike | None = None, quick: bool = True,
                      threads: int = 1, progress: Progress | None = None) -> CalibrationResult:
    """The calibration at `path` (default_path()), measured (quick) and saved first if absent."""
    path = os.fspath(path) if path is not None else default_path()
    if os.path.exists(path):
        return CalibrationResult.load(path)
    result = calibrate(threads=threads, seconds_budget=4.0 if quick else 12.0, quick=quick,
                       progress=progress)
    result.save(path)
    return result
