"""ONNX pass dumps whose large weights are written once, by content, to one shared file."""

from __future__ import annotations

import contextlib
import os

from onnx import TensorProto, numpy_helper

from graphopt.atomic import atomic_write_bytes, cannot_write
from graphopt.ir import DType, Model, Tensor, to_onnx

WEIGHTS_FILE = "weights.bin"
# Smaller tensors stay inside each dump, as onnx.save's external-data default keeps them.
INLINE_LIMIT = 1024
_ALIGN = 64  # offsets aligned so a reader may mmap the weights


class SharedWeights:
    """`DIR/weights.bin`: each distinct tensor's bytes appended once, found again by digest."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, WEIGHTS_FILE)
        self.placed: dict[str, tuple[int, int] | None] = {}
        self.size = 0
        # A new compile starts a new file: offsets recorded by an earlier run mean nothing now.
        try:
            with open(self.path, "wb"):
                pass
        except OSError as exc:
            raise cannot_write(self.path, exc) from None

    def place(self, tensor: Tensor) -> tuple[int, int] | None:
        """(offset, length) of the tensor's bytes in the file, appended on first sight; None
        when its data has no raw little-endian form and stays inline. The IR caches digests,
        so a weight no pass touched is not hashed again for every dump."""
        key = tensor.digest()
        if key not in self.placed:
            raw = _raw_bytes(tensor)
            if raw is None:
                self.placed[key] = None
            else:
                pad = -self.size % _ALIGN
                self._append(b"\0" * pad + raw)
                self.placed[key] = (self.size + pad, len(raw))
                self.size += pad + len(raw)
        return self.placed[key]


    def _append(self, data: bytes) -> None:
        """Append `data`; a write the disk refuses (full, read-only) is an OutputError, and
        the file is cut back to what the dumps written so far point into."""
        try:
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.truncate(self.path, self.size)
            raise cannot_write(self.path, exc) from None


def write_onnx_dump(model: Model, path: str, weights: SharedWeights) -> None:
    """Export `model` to `path` with its large initializers as external data in `weights`."""
    swapped = []
    try:
        # While exporting, each large weight is a stub pointing into the weights file, so the
        # export copies a few bytes instead of every weight on every pass. The pass manager
        # runs instruments between passes: nothing else sees the stubs.
        for graph in model.graph.all_graphs():
            for value in graph.initializers.values():
                tensor = value.const
                if (tensor is None or tensor.dtype == DType.STRING
                        or tensor.nbytes < INLINE_LIMIT):
                    continue
                where = weights.place(tensor)
                if where is not None:
                    swapped.append((value, tensor))
                    value.const = Tensor(proto=_external_stub(value.name, tensor, *where))
        data = to_onnx(model).SerializeToString()
    finally:
        for value, tensor in swapped:
            value.const = tensor
    # The weights file is complete before any dump that points into it exists.
    atomic_write_bytes(path, data)


def _raw_bytes(tensor: Tensor) -> bytes | None:
    proto = tensor.to_proto()
    if proto.HasField("raw_data"):
        return proto.raw_data
    try:  # data kept in typed fields (float_data, int32_data, …)
        converted = numpy_helper.from_array(tensor.numpy())
    except (TypeError, ValueError):
        return None
    if converted.data_type != int(tensor.dtype) or not converted.HasField("raw_data"):
        return None  # numpy has no exact form of this element type: keep it inline
    return converted.raw_data


def _external_stub(name: str, tensor: Tensor, offset: int, length: int) -> TensorProto:
    stub = TensorProto()
    stub.name, stub.data_type, stub.doc_string = name, int(tensor.dtype), tensor.doc_string
    stub.dims.extend(tensor.shape)
    stub.data_location = TensorProto.EXTERNAL
    for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)),
                       ("length", str(length))):
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub
