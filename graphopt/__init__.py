"""graphopt: an ahead-of-time graph compiler for ONNX models."""

__version__ = "0.1.0"
