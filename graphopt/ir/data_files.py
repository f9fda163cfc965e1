"""The external data files an ONNX file names, to tell which an in-place compile left unused."""

from __future__ import annotations

import os
from collections.abc import Iterator

from onnx import ModelProto, TensorProto

from graphopt.ir.external_data import tensor_protos


def data_files(path: str | os.PathLike) -> set[str]:
    """Real paths of the files whose bytes the ONNX model at `path` reads as external data
    (none for a file that is not a readable model: the compile reports that)."""
    from graphopt.errors import GraphoptError
    from graphopt.ir.onnx_io import read_model_proto

    try:
        proto = read_model_proto(path, load_external=False)
    except GraphoptError:
        return set()
    folder = os.path.dirname(os.path.abspath(path))
    return {os.path.realpath(os.path.join(folder, location))
            for location in _locations(proto)}


def _locations(proto: ModelProto) -> Iterator[str]:
    for tensor in tensor_protos(proto):
        if tensor.data_location == TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    yield entry.value
