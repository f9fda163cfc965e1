"""Partition weights as raw blobs inside the .om, which the partition models reference as
external data: onnxruntime then memory-maps them straight from the artifact instead of parsing
and copying them out of a protobuf (ResNet-50's session: ~110 ms → ~12 ms here).

Inside the file a reference names a member (`weights/p0.bin`) and an offset into it. Only the
runtime turns that into a file location: the artifact's own name, in the artifact's folder, at
the member's data offset. A reference to anything but a listed weights member, or past its end,
is refused when the artifact is loaded.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # onnx is imported where a model is built: the runtime's load does not need it
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
_DEFAULT, _EXTERNAL = 0, 1  # TensorProto.DataLocation


class BadReference(ValueError):
    """A partition model references external data the artifact does not hold."""


def weights_member(partition: str) -> str:
    return f"{WEIGHTS_DIR}{partition}.bin"


class Blob:
    """A weights member not yet in memory: pieces of tensor data at aligned offsets, read (from
    a protobuf's raw_data, an array or an external file) only while the member is hashed or
    written, one tensor at a time."""

    def __init__(self) -> None:
        self.size = 0
        self._pieces: list[tuple[int, Callable[[], Iterable]]] = []  # (padding, chunks)

    def add(self, length: int, chunks: Callable[[], Iterable]) -> int:
        """Append a tensor's `length` bytes, which `chunks()` yields; returns its offset."""
        padding = -self.size % TENSOR_ALIGNMENT
        offset = self.size + padding
        self._pieces.append((padding, chunks))
        self.size = offset + length
        return offset

    def chunks(self) -> Iterator[bytes | memoryview]:
        for padding, chunks in self._pieces:
            if padding:
                yield b"\0" * padding
            yield from chunks()


def split_weights(model: onnx.ModelProto, member: str,
                  sources: Mapping[str, Any] | None = None,
                  shared: dict | None = None) -> tuple[onnx.ModelProto, Blob | None]:
    """(a copy of `model` whose large main-graph initializers reference `member`, the blob of
    their bytes); (model, None) when nothing is large enough to move.

    `sources` resolves the references `graphopt.ir.tensor.tensor_references` put in the model
    (to Tensors, whose bytes stream from where they live); those left outside the blob are
    read back into the copy. The copy never holds a moved tensor's bytes.

    `shared` ({} to start, then passed to every call for one artifact) stores each distinct
    tensor once: a tensor whose content an earlier call already put in a blob references that
    blob instead (the blob may then be None). With it, tensors move however few bytes they
    add up to."""
    sources = sources or {}
    sizes: dict[int, int] = {}  # initializer index -> bytes, for the tensors to move
    for index, tensor in enumerate(model.graph.initializer):
        length = _source_length(tensor, sources)
        if length is None and tensor.HasField("raw_data"):
            length = len(tensor.raw_data)
        if length is not None and length >= MIN_EXTERNAL_BYTES:
            sizes[index] = length
    referenced = any(_source_length(t, sources) is not None for t in all_tensors(model.graph))
    # Shared across profiles, a tensor is stored once whatever the partition's total: inline,
    # every profile's partition would carry its own copy.
    if sum(sizes.values()) < MIN_BLOB_BYTES and shared is None:
        if not referenced:
            return model, None
        sizes = {}
    stripped = _copy_without_initializers(model)
    blob = None
    for index, tensor in enumerate(model.graph.initializer):
        if index not in sizes:
            stripped.graph.initializer.append(tensor)
            continue
        moved = stripped.graph.initializer.add()
        for field, value in tensor.ListFields():
            if field.name not in ("raw_data", "external_data", "data_location"):
                _copy_field(moved, field, value)
        key = _content_key(tensor, sources) if shared is not None else None
        if key in (shared or {}):
            _set_reference(moved, *shared[key], sizes[index])
            continue
        blob = blob or Blob()
        offset = blob.add(sizes[index], _chunks_of(tensor, sources))
        _set_reference(moved, member, offset, sizes[index])
        if key is not None:
            shared[key] = (member, offset)
    for tensor in all_tensors(stripped.graph):  # references left in the model: inline them
        source = sources.get(_location(tensor)) if tensor.data_location == _EXTERNAL else None
        if source is not None:
            del tensor.external_data[:]
            tensor.data_location = _DEFAULT
            tensor.raw_data = b"".join(bytes(c) for c in source.iter_bytes())
    return stripped, blob


def all_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every tensor of `graph` and its subgraphs: initializers (sparse ones' values and
    indices too) and tensor attributes."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from all_tensors(attr.g)
            for sub in attr.graphs:
                yield from all_tensors(sub)


def _location(tensor: TensorProto) -> str | None:
    for entry in tensor.external_data:
        if entry.key == "location":
            return entry.value
    return None


def _source_length(tensor: TensorProto, sources: Mapping[str, Any]) -> int | None:
    if tensor.data_location != _EXTERNAL or not sources:
        return None
    source = sources.get(_location(tensor))
    return None if source is None else source.nbytes


def _content_key(tensor: TensorProto, sources: Mapping[str, Any]) -> tuple:
    """Equal keys mean equal bytes, dtype and shape."""
    source = sources.get(_location(tensor)) if tensor.data_location == _EXTERNAL else None
    digest = hashlib.sha256()
    for chunk in source.iter_bytes() if source is not None else (tensor.raw_data,):
        digest.update(chunk)
    return tensor.data_type, tuple(tensor.dims), digest.hexdigest()


def _chunks_of(tensor: TensorProto, sources: Mapping[str, Any]) -> Callable[[], Iterable]:
    source = sources.get(_location(tensor)) if tensor.data_location == _EXTERNAL else None
    if source is not None:
        return source.iter_bytes
    # Reading raw_data copies that one tensor, only while its piece is hashed or written.
    return lambda: (tensor.raw_data,)


def _copy_field(message, field, value) -> None:
    if field.is_repeated:
        getattr(message, field.name).extend(value)
    elif field.message_type is not None:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose main graph has no initializers: copying the whole model first
    would copy every weight."""
    import onnx

    copy = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(copy, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(copy.graph, field, value)
    copy.graph.SetInParent()
    return copy


# An external-data reference names its file under this key, and protobuf writes strings as they
# are: bytes without it hold no reference.
LOCATION_KEY = b"location"


def names_a_file(data: bytes) -> bool:
    """Whether serialized protobuf bytes (a model, a node) may hold an external-data reference
    (LOCATION_KEY)."""
    return LOCATION_KEY in data


def external_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """Tensors with external data, in every graph of the model: initializers (sparse ones
    too) and the tensors of node attributes, subgraphs and model-local functions' bodies
    included (a function's Constant naming a file had onnxruntime read it from the folder)."""
    found = []
    graphs = [model.graph, *model.functions]  # a function has nodes, no initializers
    while graphs:
        graph = graphs.pop()
        found.extend(t for t in getattr(graph, "initializer", ()) if t.data_location == _EXTERNAL)
        for sparse in getattr(graph, "sparse_initializer", ()):
            found.extend(t for t in (sparse.values, sparse.indices)
                         if t.data_location == _EXTERNAL)
        for node in graph.node:
            # Serializing a node costs less than asking each attribute for tensors and graphs.
            if not names_a_file(node.SerializeToString()):
                continue
            for attr in node.attribute:
                tensors = [attr.t] if attr.HasField("t") else []
                tensors.extend(attr.tensors)
                for sparse in ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) \
                        + list(attr.sparse_tensors):
                    tensors += [sparse.values, sparse.indices]
                found.extend(t for t in tensors if t.data_location == _EXTERNAL)
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)
    return found


def check_references(model: onnx.ModelProto, sizes: dict[str, int]) -> None:
    """Raise BadReference unless every external reference lies inside a weights member;
    `sizes` maps the artifact's weights members to their byte sizes."""
    for tensor in external_tensors(model):
        check_reference(tensor.name, *_reference(tensor), sizes)


def check_reference(tensor: str, location: str, offset: int, length: int,
                    sizes: dict[str, int]) -> None:
    """Raise BadReference unless `tensor`'s bytes lie inside a weights member (`sizes`)."""
    if location not in sizes:
        raise BadReference(f"tensor {tensor!r} references {location!r}, which is not a "
                           "weights member of the artifact")
    if offset < 0 or length < 0 or offset + length > sizes[location]:
        raise BadReference(f"tensor {tensor!r} reaches past the end of {location!r}")


def point_into(model: onnx.ModelProto, artifact_path: str, data_offsets: dict[str, int], *,
               copy: bool = True) -> onnx.ModelProto:
    """A copy of `model` (`model` itself with copy=False) whose references name the artifact
    file itself (relative to its folder, as onnxruntime requires) at file offsets;
    `data_offsets` maps each weights member to where its bytes start in the file."""
    located = model
    if copy:
        import onnx

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
    import onnx

    full = onnx.ModelProto()
    full.CopyFrom(model)
    blobs: dict[str, bytes] = {}
    for tensor in external_tensors(full):
        location, offset, length = _reference(tensor)
        if location not in blobs:
            blobs[location] = read(location)
        del tensor.external_data[:]
        tensor.data_location = _DEFAULT
        tensor.raw_data = blobs[location][offset:offset + length]
    return full


def _reference(tensor: TensorProto) -> tuple[str, int, int]:
    entries = {e.key: e.value for e in tensor.external_data}
    if not all(isinstance(text, str) for item in entries.items() for text in item):
        # protobuf hands invalid UTF-8 back as bytes
        raise BadReference(f"tensor {tensor.name!r} has an external reference that is not text")
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
    tensor.data_location = _EXTERNAL
