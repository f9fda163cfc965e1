"""Constant tensor data: initializers and tensor attributes, converted to numpy lazily."""

from __future__ import annotations

import hashlib

import numpy as np
from onnx import TensorProto, numpy_helper

from graphopt.ir.dtypes import DType, nbytes


class Tensor:
    """Immutable constant data, kept as the original TensorProto until someone needs numpy.

    Keeping the proto means an untouched initializer is exported byte for byte as it came in
    (raw_data vs typed fields, external data location), which is what makes round-trips lossless.
    """

    __slots__ = ("_proto", "_array", "dtype", "shape", "doc_string", "_digest")

    def __init__(self, array: np.ndarray | None = None, *, proto: TensorProto | None = None,
                 dtype: DType | None = None):
        if (array is None) == (proto is None):
            raise ValueError("Tensor needs exactly one of array or proto")
        self._proto = proto
        self._array = None if array is None else np.asarray(array)
        self._digest: str | None = None
        if proto is not None:
            self.dtype = DType(proto.data_type)
            self.shape = tuple(int(d) for d in proto.dims)
            self.doc_string = proto.doc_string
        else:
            self.dtype = dtype if dtype is not None else DType.from_numpy(self._array.dtype)
            self.shape = tuple(int(d) for d in self._array.shape)
            self.doc_string = ""

    @classmethod
    def from_proto(cls, proto: TensorProto) -> "Tensor":
        return cls(proto=proto)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.size)

    def numpy(self) -> np.ndarray:
        if self._array is None:
            self._array = numpy_helper.to_array(self._proto)
        return self._array

    def to_proto(self, name: str | None = None) -> TensorProto:
        """The data as a TensorProto named `name` (None keeps the stored proto's own name)."""
        if self._proto is not None:
            if name is None or self._proto.name == name:
                return self._proto
            proto = TensorProto()
            proto.CopyFrom(self._proto)
            proto.name = name
            return proto
        proto = numpy_helper.from_array(self._array, name or "")
        proto.doc_string = self.doc_string
        return proto

    def _raw_bytes(self) -> bytes | None:
        """The proto's little-endian raw_data when it holds the data byte for byte as numpy
        would (not for packed sub-byte types), read without converting to numpy: converting
        would keep a second copy of every weight alive in the cache."""
        proto = self._proto
        if proto is None or self._array is not None or not proto.HasField("raw_data"):
            return None
        if self.dtype.bits < 8 or self.dtype == DType.STRING:
            return None
        return proto.raw_data

    def digest(self) -> str:
        """A content hash of dtype, shape and data: equal digests mean equal tensors."""
        if self._digest is None:
            h = hashlib.sha1(f"{int(self.dtype)}:{self.shape}".encode())
            raw = self._raw_bytes()
            if raw is not None:
                h.update(raw)
            else:
                array = self.numpy()
                if array.dtype == object:
                    for item in array.ravel():
                        h.update(item if isinstance(item, bytes) else str(item).encode())
                        h.update(b"\0")
                else:
                    h.update(np.ascontiguousarray(array).tobytes())
            self._digest = h.hexdigest()[:12]
        return self._digest

    def fingerprint(self) -> str:
        """A cheap hash of dtype, shape and a strided sample of the data: unequal fingerprints
        prove tensors differ; equal ones still need `digest` to prove them equal."""
        h = hashlib.sha1(f"{int(self.dtype)}:{self.shape}".encode())
        raw = self._raw_bytes()
        if raw is not None:
            flat = np.frombuffer(raw, dtype=np.uint8)
            h.update(flat[:: max(1, flat.size // 2048)][:2048].tobytes())
            return h.hexdigest()[:12]
        flat = self.numpy().reshape(-1)
        sample = flat[:: max(1, flat.size // 512)][:512]
        if sample.dtype == object:
            h.update(repr(sample.tolist()).encode())
        else:
            h.update(np.ascontiguousarray(sample).tobytes())
        return h.hexdigest()[:12]

    def __repr__(self) -> str:
        return f"Tensor<{self.dtype.short}{list(self.shape)}>"
