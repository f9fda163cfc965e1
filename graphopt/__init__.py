"""graphopt: an ahead-of-time graph compiler for ONNX models."""

__version__ = "0.1.0"

from graphopt.codegen.loader import load  # noqa: E402
from graphopt.compiler import OptimizeResult, optimize, save  # noqa: E402
from graphopt.ir import load_onnx, to_onnx  # noqa: E402

__all__ = ["OptimizeResult", "__version__", "load", "load_onnx", "optimize", "save", "to_onnx"]


def __getattr__(name: str):
    # graphopt.zoo builds the benchmark models; imported on first use, not with the compiler.
    if name == "zoo":
        import importlib

        return importlib.import_module("graphopt.zoo")
    raise AttributeError(f"module 'graphopt' has no attribute {name!r}")
