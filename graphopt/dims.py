"""How a dim of an ONNX shape reads: a size, a name two values share, or unknown."""

from __future__ import annotations

# Dim names that say "unknown" rather than name a dim two values share: paddle2onnx writes "?"
# for every unknown axis (rapidocr's [-1, 3, "?", "?"] takes 48 x 192), as onnxruntime reads it.
UNNAMED_DIMS = ("?",)


def read_dim(dim) -> int | str | None:
    """A TensorShapeProto.Dimension as graphopt reads it: its size, its name, or None when it
    is unknown (unset, a name in UNNAMED_DIMS, or the -1 some exporters write for "unknown",
    as onnxruntime reads it; no tensor has that size)."""
    which = dim.WhichOneof("value")
    if which == "dim_value":
        return int(dim.dim_value) if dim.dim_value >= 0 else None
    if which == "dim_param" and dim.dim_param not in UNNAMED_DIMS:
        return dim.dim_param or None
    return None
