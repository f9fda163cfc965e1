"""graphopt: an ahead-of-time graph compiler for ONNX models."""

__version__ = "0.2.0"

from typing import TYPE_CHECKING

from graphopt.lazy import lazy_attributes

if TYPE_CHECKING:  # what type checkers and editors see; at run time, lazy_attributes below
    from graphopt.codegen.loader import load
    from graphopt.compile_result import OptimizeResult
    from graphopt.compile_save import save
    from graphopt.compiler import optimize
    from graphopt.ir import load_onnx, to_onnx

__all__ = ["OptimizeResult", "__version__", "load", "load_onnx", "optimize", "save", "to_onnx"]

# Imported on first use: `graphopt --help`, or a process that only loads an .om, does not pay
# for the compiler's passes, networkx and optuna. graphopt.zoo builds the benchmark models;
# graphopt.errors holds the exception classes, reachable before any call has imported them.
__getattr__, __dir__ = lazy_attributes(__name__, {
    "load": "graphopt.codegen.loader:load",
    "optimize": "graphopt.compiler:optimize",
    "save": "graphopt.compile_save:save",
    "OptimizeResult": "graphopt.compile_result:OptimizeResult",
    "load_onnx": "graphopt.ir:load_onnx",
    "to_onnx": "graphopt.ir:to_onnx",
    "errors": "graphopt.errors",
    "zoo": "graphopt.zoo",
    "option_names": "graphopt.option_names",  # FLAGS: each keyword's command-line flag
    "compile_memory": "graphopt.compile_memory",  # draw_memory_plans, --memory-plot's drawing
}, globals())
