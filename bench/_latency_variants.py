"""What the latency bench runs per model: how each variant's file is built from the original and
how each is opened as a session at a given thread count, bound to the model's feeds."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

import graphopt
from graphopt.codegen import OmSession

from _common import session_options, short_reason
from _compilers import compilers

CPU = ["CPUExecutionProvider"]

# Set on every session the bench times. After a run, onnxruntime's intra-op workers spin waiting
# for more work; with the variants interleaved, one session's spinning workers take the cores the
# next variant runs on (at 2 threads on 2 cores: mobilenetv2 36 ms interleaved against 7 ms
# alone). With the spin stopped when each run returns, interleaved is within ~20% of alone, the
# same for every variant.
SESSION_CONFIG = {"session.force_spinning_stop": "1"}


@dataclass(frozen=True)
class Variant:
    key: str           # JSON key
    name: str          # table column
    what: str          # one line for the table's legend
    file: str          # which built file it runs (a key of build_files' result)
    level: str | None  # the ORT level its session runs at; None: graphopt's .om runtime


VARIANTS = [
    Variant("original_disable_all", "orig DISABLE_ALL", "the original at ORT_DISABLE_ALL",
            "original", "disable"),
    Variant("original_enable_all", "orig ENABLE_ALL", "the original at ORT_ENABLE_ALL",
            "original", "all"),
    Variant("graphopt_onnx", "graphopt .onnx",
            "graphopt.optimize (-O2, no tuning) saved as .onnx, at ORT_ENABLE_ALL",
            "graphopt.onnx", "all"),
    Variant("graphopt_om", "graphopt .om",
            "graphopt.optimize(target=\"cpu\") saved as .om (what `graphopt optimize -o x.om` "
            "writes: conv nets blocked into NCHWc offline), run by "
            "OmSession(intra_op_num_threads=T) at the levels the artifact records "
            "(ORT_ENABLE_EXTENDED; ORT_ENABLE_BASIC for transformer partitions, which would "
            "otherwise be re-fused into SkipLayerNormalization)", "graphopt.om", None),
    Variant("onnxsim", "onnxsim", "onnxsim.simplify's output at ORT_ENABLE_ALL",
            "onnxsim", "all"),
    Variant("onnxslim", "onnxslim", "onnxslim.slim's output at ORT_ENABLE_ALL",
            "onnxslim", "all"),
    Variant("ort_offline", "ORT offline",
            "ORT's offline-optimized model (optimized_model_filepath at ORT_ENABLE_EXTENDED), "
            "loaded at ORT_ENABLE_ALL", "ort_offline", "all"),
]
BASELINE = "original_enable_all"


@dataclass
class BuiltFile:
    path: str | None
    error: str | None = None      # why there is no file ("n/a ..." when a tool is not installed)
    seconds: float | None = None  # what building it took, for the JSON


@dataclass
class Runner:
    """A session bound to its feeds: `call()` is the inference the bench times, `outputs(raw)`
    names what it returned."""

    call: Callable[[], object]
    outputs: Callable[[object], dict[str, np.ndarray]]


def versions() -> dict[str, str | None]:
    found = {c.name: (c.version or None) for c in compilers()}
    return {"graphopt": graphopt.__version__, "onnxruntime": ort.__version__,
            "onnxsim": found.get("onnxsim"), "onnxslim": found.get("onnxslim")}


@contextlib.contextmanager
def _quiet():
    sink = io.StringIO()  # onnxsim/onnxslim may print; that output is not the table
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
            contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        yield


def _build(make: Callable[[], None], path: str) -> BuiltFile:
    start = time.perf_counter()
    try:
        with _quiet():
            make()
    except Exception as e:  # noqa: BLE001 - a tool's failure is a table cell, not a crash
        return BuiltFile(None, short_reason(e))
    seconds = time.perf_counter() - start
    if not os.path.exists(path):
        return BuiltFile(None, "wrote no file", seconds)
    return BuiltFile(path, None, seconds)


def _ort_offline(src: str, dst: str) -> None:
    # Session creation is ORT's offline optimizer; EXTENDED adds ORT's contrib-op fusions
    # (Gelu, LayerNormalization, Attention, ...) to BASIC's, without ALL's layout changes.
    ort.InferenceSession(src, session_options("extended", optimized_path=dst), providers=CPU)


def build_files(src: str, workdir: str, level: int = 2) -> dict[str, BuiltFile]:
    """Every file a variant runs, keyed like Variant.file; graphopt's two at -O`level`."""
    files = {"original": BuiltFile(src)}
    go_onnx, go_om = os.path.join(workdir, "graphopt.onnx"), os.path.join(workdir, "graphopt.om")
    # The portable .onnx has no target; the .om is compiled for this CPU, as the CLI does.
    for key, path, target in (("graphopt.onnx", go_onnx, None), ("graphopt.om", go_om, "cpu")):
        start = time.perf_counter()
        try:
            with _quiet():
                result = graphopt.optimize(src, target=target, level=level)
        except Exception as e:  # noqa: BLE001
            files[key] = BuiltFile(None, short_reason(e))
            continue
        seconds = time.perf_counter() - start
        built = _build(functools.partial(graphopt.save, result, path), path)
        if built.seconds is not None:
            built.seconds += seconds
        files[key] = built
        del result  # bert_base's weights need not stay in memory while the tools run
    tools = {c.name: c for c in compilers()}
    for name in ("onnxsim", "onnxslim"):
        tool, path = tools[name], os.path.join(workdir, f"{name}.onnx")
        files[name] = (BuiltFile(None, tool.missing) if tool.compile is None
                       else _build(functools.partial(tool.compile, src, path), path))
    path = os.path.join(workdir, "ort_offline.onnx")
    files["ort_offline"] = _build(functools.partial(_ort_offline, src, path), path)
    return files


def _pinned(options: ort.SessionOptions, threads: int) -> ort.SessionOptions:
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    for key, value in SESSION_CONFIG.items():
        options.add_session_config_entry(key, value)
    return options


def _bind(feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """The feeds a session declares. A rewritten model that asks for more than the original's
    inputs cannot be dropped in; one that dropped an unused input just gets fewer."""
    missing = [n for n in names if n not in feeds]
    if missing:
        raise ValueError(f"needs {len(missing)} more input(s): {missing[0]}"
                         + (", …" if len(missing) > 1 else ""))
    return {n: feeds[n] for n in names}


def open_runner(variant: Variant, path: str, threads: int,
                feeds: dict[str, np.ndarray]) -> Runner:
    if variant.level is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CANN is not available": the bench is CPU-only
            om = OmSession(path, intra_op_num_threads=threads, inter_op_num_threads=1,
                           session_config=SESSION_CONFIG)
        bound = _bind(feeds, [e["name"] for e in om.inputs])
        return Runner(lambda: om.run(bound), lambda raw: raw)
    sess = ort.InferenceSession(path, _pinned(session_options(variant.level), threads),
                                providers=CPU)
    bound = _bind(feeds, [i.name for i in sess.get_inputs()])
    names = [o.name for o in sess.get_outputs()]
    return Runner(lambda: sess.run(names, bound), lambda raw: dict(zip(names, raw)))
