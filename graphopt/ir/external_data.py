"""Saving ONNX files whose large weights live in `<file>.data` next to them, streamed from the
IR, so a model past protobuf's 2 GB limit can be written without a second copy in memory."""

from __future__ import annotations

import os

from onnx import ModelProto, TensorProto

from graphopt.atomic import atomic_write, atomic_write_bytes
from graphopt.errors import GraphoptError, OptionError
from graphopt.ir.model import Model
from graphopt.ir.tensor import Tensor, tensor_references

THRESHOLD_ENV = "GRAPHOPT_EXTERNAL_DATA_THRESHOLD"
# Weights past this many bytes in all go to external data: well under protobuf's 2 GiB hard
# limit, leaving room for the graph itself and for whatever reads the file.
DEFAULT_THRESHOLD = 1 << 30
PAGE = 4096               # tensors of 1 MiB and up start on a page: onnxruntime can map them
SMALL_ALIGNMENT = 64


def threshold() -> int:
    """The weight bytes above which `save_onnx` writes external data: $GRAPHOPT_EXTERNAL_DATA_
    THRESHOLD (bytes) when set, else 1 GiB."""
    text = os.environ.get(THRESHOLD_ENV)
    if text is None or text == "":
        return DEFAULT_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise OptionError(f"{THRESHOLD_ENV}={text!r}: expected a number of bytes ≥ 0")
    return value


def weight_bytes(model: Model) -> int:
    """Bytes of the main graph's initializers."""
    return sum(v.const.nbytes for v in model.graph.initializers.values() if v.const is not None)


def save_onnx(model: Model | ModelProto, path: str | os.PathLike,
              external: bool | None = None) -> None:
    """Write `model` to `path` atomically. With external data (`external=True`, or None and
    the weights past `threshold()`), every main-graph initializer of 1 KiB or more goes to
    `<path>.data` (its location is that file's name, so the pair moves together) and streams
    there tensor by tensor; the data file is replaced first, then the model."""
    path = os.fspath(path)
    if isinstance(model, ModelProto):
        if external is False or (external is None and model.ByteSize() <= threshold()):
            _write_proto(model, path)
            return
        from graphopt.ir.onnx_io import (
            load_onnx,  # keeps the proto's tensors, copies no data
        )

        model = load_onnx(model)
    from graphopt.ir.onnx_io import to_onnx

    if external is None:
        external = weight_bytes(model) > threshold()
    if not external:
        _write_proto(to_onnx(model), path)
        return
    data_path = path + ".data"
    with tensor_references() as sources:
        proto = to_onnx(model)
        placed = _place(proto, os.path.basename(data_path), sources)
    try:
        with atomic_write(data_path) as f:
            for offset, tensor in placed:
                f.write(b"\0" * (offset - f.tell()))
                for chunk in tensor.iter_bytes():
                    f.write(chunk)
    except OSError as e:
        raise GraphoptError(f"cannot write {data_path}: {e.strerror or e}") from None
    _write_proto(proto, path)


def _place(proto: ModelProto, location: str, sources: dict[str, Tensor]
           ) -> list[tuple[int, Tensor]]:
    """Point the main graph's referenced initializers at `location` (offsets in order, aligned)
    and read every other reference back inline; returns (offset, tensor) in file order."""
    placed, end = [], 0
    for tensor in proto.graph.initializer:
        source = _source(tensor, sources)
        if source is None:
            continue
        alignment = PAGE if source.nbytes >= 1 << 20 else SMALL_ALIGNMENT
        offset = end + (-end % alignment)
        del tensor.external_data[:]
        for key, value in (("location", location), ("offset", str(offset)),
                           ("length", str(source.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        placed.append((offset, source))
        end = offset + source.nbytes
    # Subgraph initializers and tensor attributes stay inline: not every runtime resolves
    # external data there.
    for tensor in _nested_tensors(proto):
        source = _source(tensor, sources)
        if source is not None:
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = b"".join(bytes(c) for c in source.iter_bytes())
    return placed


def _source(tensor: TensorProto, sources: dict[str, Tensor]) -> Tensor | None:
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    location = next((e.value for e in tensor.external_data if e.key == "location"), None)
    return sources.get(location)


def _nested_tensors(proto: ModelProto):
    graphs = []
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                graphs.append(attr.g)
            graphs.extend(attr.graphs)
    while graphs:
        graph = graphs.pop()
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)


def _write_proto(proto: ModelProto, path: str) -> None:
    try:
        data = proto.SerializeToString()
    except ValueError as e:  # protobuf refuses messages past 2 GB
        raise GraphoptError(f"{path}: model too large to serialize ({e}); its weights may be "
                            "in external data: save(…, external_data=True)") from None
    atomic_write_bytes(path, data)
