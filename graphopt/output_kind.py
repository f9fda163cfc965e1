"""What an output path's name asks for: an .om artifact or optimized ONNX, by its extension in
any case (MODEL.OM is an artifact too), and never a name that is the extension alone."""

from __future__ import annotations

import os

from graphopt.errors import UsageError


def writes_om(path) -> bool:
    return os.fspath(path).lower().endswith(".om")


def writes_onnx(path) -> bool:
    return os.fspath(path).lower().endswith(".onnx")


def check_file_name(flag: str, path) -> None:
    """Refuse `.om`, `dir/.onnx` or a picture's `.png`: a hidden file named after the format,
    not a model's or a plot's name."""
    name = os.path.basename(os.fspath(path))
    if name.lower() in (".om", ".onnx", ".png", ".svg"):
        example = "model" if name.lower() in (".om", ".onnx") else "memory"
        raise UsageError(f"{flag} {os.fspath(path)}: the name is the extension alone; give the "
                         f"file a name, such as {example}{name}")
