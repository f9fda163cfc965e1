"""The offline optimizers a compile-time bench compares: one `compile(src, dst)` call each."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import onnx
import onnxruntime as ort

import graphopt
from _common import session_options


@dataclass
class Compiler:
    name: str
    compile: Callable[[str, str], None] | None  # None when the tool is not installed
    version: str
    missing: str | None = None  # why compile is None, for the table cell


def _graphopt(src: str, dst: str) -> None:
    # Default level (-O2), no tuning: what `graphopt optimize src -o dst.onnx` does.
    graphopt.save(graphopt.optimize(src), dst)


def _onnxsim(src: str, dst: str) -> None:
    import onnxsim

    # check_n=0 (the default): onnxsim's own numeric check would time ORT runs, not the optimizer.
    model, _ = onnxsim.simplify(onnx.load(src))
    onnx.save(model, dst)


def _onnxslim(src: str, dst: str) -> None:
    import onnxslim

    onnx.save(onnxslim.slim(src), dst)


def _ort_basic(src: str, dst: str) -> None:
    # Session creation is ORT's offline optimizer: it optimizes, writes dst, then also plans the
    # session (kernels, memory), which a user pays for in the same call.
    ort.InferenceSession(src, session_options("basic", optimized_path=dst),
                         providers=["CPUExecutionProvider"])


def _optional(name: str, fn: Callable[[str, str], None]) -> Compiler:
    try:
        module = importlib.import_module(name)
    except ImportError:
        return Compiler(name, None, "", "n/a (not installed)")
    return Compiler(name, fn, str(getattr(module, "__version__", "?")).lstrip("v"))


def compilers() -> list[Compiler]:
    """graphopt first: every other tool's ratio is against it."""
    return [Compiler("graphopt", _graphopt, graphopt.__version__),
            _optional("onnxsim", _onnxsim),
            _optional("onnxslim", _onnxslim),
            Compiler("ORT basic", _ort_basic, ort.__version__)]
