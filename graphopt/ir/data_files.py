"""The external data files an ONNX file names: to tell which an in-place compile left unused,
and to hash them with the model an artifact records as its source."""

from __future__ import annotations

import hashlib
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


def external_data_sha256(path: str | os.PathLike) -> str | None:
    """The sha256 of the external data the ONNX model at `path` reads: each file's name
    (relative to the model's folder) and bytes, in name order. None when it reads none, or
    one cannot be read. The model file's own hash leaves them out: two models that differ in
    their weights alone had recorded the same source."""
    files = data_files(path)
    if not files:
        return None
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    from graphopt.codegen.om_manifest import hash_file_into

    named = sorted((os.path.relpath(real, folder), real) for real in files)
    digest = hashlib.sha256()
    try:
        for name, real in named:
            digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
            hash_file_into(digest, real)
    except OSError:
        return None
    return digest.hexdigest()
