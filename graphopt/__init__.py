"""graphopt: an ahead-of-time graph compiler for ONNX models."""

__version__ = "0.1.0"

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and editors see; at run time, _API below
    from graphopt.codegen.loader import load
    from graphopt.compiler import OptimizeResult, optimize, save
    from graphopt.ir import load_onnx, to_onnx

__all__ = ["OptimizeResult", "__version__", "load", "load_onnx", "optimize", "save", "to_onnx"]

# The API is imported on first use (PEP 562): `graphopt --help` or a process that only loads an
# .om does not pay for the compiler's passes, networkx and optuna.
_API = {
    "load": "graphopt.codegen.loader",
    "optimize": "graphopt.compiler",
    "save": "graphopt.compiler",
    "OptimizeResult": "graphopt.compiler",
    "load_onnx": "graphopt.ir",
    "to_onnx": "graphopt.ir",
}


def __getattr__(name: str):
    module = _API.get(name)
    if module is not None:
        value = getattr(_import_module(module), name)
        globals()[name] = value  # the next access is a plain attribute
        return value
    # graphopt.zoo builds the benchmark models; imported on first use, not with the compiler.
    if name == "zoo":
        return _import_module("graphopt.zoo")
    raise AttributeError(f"module 'graphopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
