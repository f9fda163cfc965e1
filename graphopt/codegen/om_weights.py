"""Partition weights as raw blobs inside the .om, which the partition models reference as
external data: onnxruntime then memory-maps them straight from the artifact instead of parsing
and copying them out of a protobuf (ResNet-50's session: ~110 ms → ~12 ms here).

Inside the file a reference names a member (`weights/p0.bin`) and an offset into it. Only the
runtime turns that into a file location: the artifact's own name, in the artifact's folder, at
the member's data offset. A reference to anything but a listed weights member, or past its end,
is refused when the artifact is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import onnx
from onnx import TensorProto

WEIGHTS_DIR = "weights/"
MIN_EXTERNAL_BYTES = 1024  # smaller tensors stay in the model: a reference would cost as much
# A partition whose large tensors add up to less stays one protobuf: for a few hundred KiB,
# parsing is cheaper than opening and mapping the artifact a second time.
MIN_BLOB_BYTES = 1 << 20
TENSOR_ALIGNMENT = 64      # each tensor's bytes start 64-byte aligned (SIMD loads, cache lines)
FILE_ALIGNMENT = 4096      # a blob starts on a page, so its mapping and the tensors are aligned
_KEYS = {"location", "offset", "length"}


class BadReference(ValueError):
    """A partition model references external data the artifact does not hold."""


def weights_member(partition: str) -> str:
    return f"{WEIGHTS_DIR}{partition}.bin"


def split_weights(model: onnx.ModelProto, member: str) -> tuple[onnx.ModelProto, bytes | None]:
    """(a copy of `model` whose large main-graph initializers reference `member`, the blob of
    their bytes); (model, None) when nothing is large enough to move."""
    large = [t for t in model.graph.initializer
             if t.HasField("raw_data") and len(t.raw_data) >= MIN_EXTERNAL_BYTES]
    if sum(len(t.raw_data) for t in large) < MIN_BLOB_BYTES:
        return model, None
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    blob = bytearray()
    for tensor in stripped.graph.initializer:
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < MIN_EXTERNAL_BYTES:
            continue
        blob += b"\0" * (-len(blob) % TENSOR_ALIGNMENT)
        offset = len(blob)
        blob += tensor.raw_data
        tensor.ClearField("raw_data")
        _set_reference(tensor, member, offset, len(blob) - offset)
    return stripped, bytes(blob)


def external_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """Initializers with external data, in every graph of the model."""
    found = []
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        found.extend(t for t in graph.initializer if t.data_location == TensorProto.EXTERNAL)
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t") and attr.t.data_location == TensorProto.EXTERNAL:
                    found.append(attr.t)
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)
    return found


def check_references(model: onnx.ModelProto, sizes: dict[str, int]) -> None:
    """Raise BadReference unless every external reference lies inside a weights member;
    `sizes` maps the artifact's weights members to their byte sizes."""
    for tensor in external_tensors(model):
        location, offset, length = _reference(tensor)
        if location not in sizes:
            raise BadReference(f"tensor {tensor.name!r} references {location!r}, which is not a "
                               "weights member of the artifact")
        if offset < 0 or length < 0 or offset + length > sizes[location]:
            raise BadReference(f"tensor {tensor.name!r} reaches past the end of {location!r}")


def point_into(model: onnx.ModelProto, artifact_path: str,
               data_offsets: dict[str, int]) -> onnx.ModelProto:
    """A copy of `model` whose references name the artifact file itself (relative to its
    folder, as onnxruntime requires) at file offsets; `data_offsets` maps each weights member
    to where its bytes start in the file."""
    located = onnx.ModelProto()
    located.CopyFrom(model)  # small: the weights are not in it
    name = os.path.basename(artifact_path)
    for tensor in external_tensors(located):
        location, offset, length = _reference(tensor)
        _set_reference(tensor, name, data_offsets[location] + offset, length)
    return located


def with_weights(model: onnx.ModelProto, read: Callable[[str], bytes]) -> onnx.ModelProto:
    """A copy of `model` with every referenced tensor's bytes back inside it; `read(member)`
    returns a weights member's bytes."""
    full = onnx.ModelProto()
    full.CopyFrom(model)
    blobs: dict[str, bytes] = {}
    for tensor in external_tensors(full):
        location, offset, length = _reference(tensor)
        if location not in blobs:
            blobs[location] = read(location)
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
        tensor.raw_data = blobs[location][offset:offset + length]
    return full


def _reference(tensor: TensorProto) -> tuple[str, int, int]:
    entries = {e.key: e.value for e in tensor.external_data}
    if set(entries) - _KEYS or "location" not in entries:
        raise BadReference(f"tensor {tensor.name!r} has an external reference graphopt does not "
                           f"write (keys {sorted(entries)})")
    try:
        return entries["location"], int(entries.get("offset", 0)), int(entries["length"])
    except (KeyError, ValueError):
        raise BadReference(f"tensor {tensor.name!r} has a malformed external reference") from None


def _set_reference(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL
