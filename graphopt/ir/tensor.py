"""Constant tensor data: initializers and tensor attributes, converted to numpy lazily."""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from stat import S_ISREG

import numpy as np
from onnx import TensorProto, numpy_helper

from graphopt.errors import InputError
from graphopt.ir.dtypes import DType, nbytes

# Bytes per read when a tensor's data streams out of its file (hashing, writing).
STREAM_CHUNK = 16 << 20
# External data smaller than this is read into memory; larger is memory-mapped, so pages are
# read on demand and a weight nobody touches never costs resident memory.
_MAP_ABOVE = 1 << 20
# The location prefix of a reference proto (see `tensor_references`).
REFERENCE_PREFIX = "graphopt-tensor:"
_REFERENCES: ContextVar["dict[str, Tensor] | None"] = ContextVar("graphopt_tensor_references",
                                                                 default=None)


class ExternalDataChanged(InputError, ValueError):
    """The file a tensor's data lives in is not the one the model was loaded with."""


class ExternalImport:
    """One import of a model file: the external tensors it makes share one mapping per data
    file (by this object's identity), and know which model file names that data."""

    __slots__ = ("model_path",)

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path


class Tensor:
    """Immutable constant data, kept as the original TensorProto until someone needs numpy.

    Keeping the proto means an untouched initializer is exported byte for byte as it came in
    (raw_data vs typed fields, external data location), which is what makes round-trips lossless.
    """

    __slots__ = ("_proto", "_array", "dtype", "shape", "doc_string", "_digest", "_external",
                 "_load")

    def __init__(self, array: np.ndarray | None = None, *, proto: TensorProto | None = None,
                 dtype: DType | None = None):
        if (array is None) == (proto is None):
            raise ValueError("Tensor needs exactly one of array or proto")
        self._proto = proto
        self._array = None if array is None else np.asarray(array)
        self._digest: str | None = None
        self._external: tuple[str, int, int, tuple] | None = None  # file, offset, length, id
        self._load: object | None = None  # the import it came from: its tensors share mappings
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

    @classmethod
    def from_external(cls, proto: TensorProto, base_dir: str,
                      load: object | None = None) -> "Tensor":
        """A tensor whose data stays in the external file `proto` names (relative to
        `base_dir`) until someone reads it: then it is memory-mapped, not loaded. The tensors
        of one `load` (any object standing for one import) share one mapping per file. Raises
        ValueError when the file is missing or too short."""
        entries = {e.key: e.value for e in proto.external_data}
        location = entries.get("location", "")
        path = os.path.join(base_dir, location)
        tensor = cls(proto=proto)
        offset = int(entries.get("offset") or 0)
        try:
            stat = os.stat(path)
        except OSError as e:
            raise ValueError(f"external data file {location!r}: {e.strerror}") from None
        if not S_ISREG(stat.st_mode):
            raise ValueError(f"external data location {location!r} is not a file")
        size = stat.st_size
        if offset > size:
            raise ValueError(f"external data offset {offset} lies past the end of "
                             f"{location!r} ({size} bytes)")
        # Without a length the tensor takes the bytes its dtype and shape need, from its
        # offset on (onnx and onnxruntime read it so): several may share one file.
        length = int(entries["length"]) if entries.get("length") else tensor.nbytes
        if tensor.streamable and length != tensor.nbytes:
            raise ValueError(f"external data holds {length} bytes, the tensor's dtype and "
                             f"shape need {tensor.nbytes}")
        if offset + length > size:
            raise ValueError(f"external data {location!r} ends at byte {size}, "
                             f"the tensor reaches byte {offset + length}")
        tensor._external = (path, offset, length, stat_identity(stat))
        tensor._load = load
        return tensor

    @property
    def external_path(self) -> str | None:
        """The external data file the tensor's bytes are in (None when they are in memory)."""
        return self._external[0] if self._external is not None else None

    @property
    def source_model(self) -> str | None:
        """The model file whose import made this external tensor (None for any other)."""
        return self._load.model_path if isinstance(self._load, ExternalImport) else None

    def reads(self, path: str) -> bool:
        """Whether the data still lives in the external file `path`, unread."""
        return self.is_external and \
            os.path.realpath(self._external[0]) == os.path.realpath(path)

    def follow_move(self, path: str, offset: int) -> None:
        """The external file this tensor reads was replaced by `path`, which holds the same
        bytes at `offset` (a save over the model's own data file): read them there."""
        self._external = (path, offset, self.nbytes, stat_identity(os.stat(path)))

    @property
    def streamable(self) -> bool:
        """Whether the data is plain bytes, one element after another (not strings, not packed
        sub-byte types): what `iter_bytes` yields and an external file holds."""
        return self.dtype.bits >= 8 and self.dtype != DType.STRING

    @property
    def is_external(self) -> bool:
        """Whether the data still lives in an external file (read lazily)."""
        return self._external is not None and self._array is None

    @property
    def size(self) -> int:
        # Plain integer product: np.prod costs ~10 µs a call, and every export asks each
        # initializer its size (2 s of a 50k-node compile).
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.size)

    def numpy(self) -> np.ndarray:
        if self._array is None:
            self._array = (self._read_external() if self._external is not None
                           else _proto_array(self._proto))
        return self._array

    def uncached_numpy(self) -> np.ndarray:
        """The data as numpy without keeping a converted copy: the array held or mapped, else
        one read from the proto's raw bytes for a caller done with it soon (onnxruntime copying
        a weight into its session). `numpy()` would cache a second copy of every weight."""
        raw = None if self.is_external else self._raw_bytes()
        dtype = self.dtype.numpy if raw is not None and self.streamable else None
        if dtype is None or dtype.itemsize * 8 != self.dtype.bits:
            return self.numpy()
        dtype = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
        return np.frombuffer(raw, dtype=dtype, count=self.size).reshape(self.shape)

    def _read_external(self) -> np.ndarray:
        _, offset, length, _ = self._external
        dtype = self.dtype.numpy if self.streamable else None
        if dtype is None or dtype.itemsize * 8 != self.dtype.bits:
            return numpy_helper.to_array(self._loaded_proto())
        dtype = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
        with self._open_external() as f:
            if length < _MAP_ABOVE or self.size == 0:
                array = np.fromfile(f, dtype=dtype, count=self.size, offset=offset)
                return array.reshape(self.shape)
            # One copy-on-write mapping per file and import, shared by its tensors' arrays
            # (a Tensor is immutable; tensors of one import stored on the same bytes share
            # pages): a write would never reach the model's file or another import's. A
            # mapping per tensor held a descriptor each, and a model of a few hundred mapped
            # weights ran out of them ("Too many open files").
            if self._load is None:  # made outside an import: a mapping of its own
                self._load = object()
            mapping = _file_mapping(f, (*self._external[::3], self._load))
            return np.frombuffer(mapping, dtype=dtype, count=self.size,
                                 offset=offset).reshape(self.shape)

    def _open_external(self):
        """The external data file, refused when it is no longer the file the model was
        loaded with (saved over since, say): its offsets would point at other bytes."""
        path, _, _, identity = self._external
        try:
            f = open(path, "rb")  # noqa: SIM115 - the caller closes it
        except OSError as exc:  # deleted or made unreadable since the import
            kept = _reopen_retained(identity)
            if kept is not None:
                return kept
            raise ExternalDataChanged(
                f"external data file {path} of tensor '{self._proto.name}' cannot be read "
                f"since the model was loaded ({exc.strerror or exc}); load the model "
                "again") from None
        if stat_identity(os.fstat(f.fileno())) != identity:
            f.close()
            kept = _reopen_retained(identity)
            if kept is not None:  # graphopt's own save replaced it: the old bytes are kept
                return kept
            raise ExternalDataChanged(f"external data file {path} was replaced or changed "
                                      "after the model was loaded; load the model again")
        return f

    def _loaded_proto(self, name: str | None = None) -> TensorProto:
        """A copy of the proto with its external data read into raw_data."""
        proto = TensorProto()
        proto.CopyFrom(self._proto)
        del proto.external_data[:]
        proto.data_location = TensorProto.DEFAULT
        proto.raw_data = b"".join(self._file_chunks())
        if name is not None:
            proto.name = name
        return proto

    def _file_chunks(self, size: int = STREAM_CHUNK) -> Iterator[bytes]:
        path, offset, length, _ = self._external
        with self._open_external() as f:
            f.seek(offset)
            while length > 0:
                chunk = f.read(min(size, length))
                if not chunk:
                    raise ValueError(f"external data file {path} is shorter than it was")
                length -= len(chunk)
                yield chunk

    def iter_bytes(self, size: int = STREAM_CHUNK) -> Iterator[bytes | memoryview]:
        """The data as little-endian bytes (what raw_data would hold), in pieces of at most
        `size` bytes, without a second copy of the whole tensor: external data streams from
        its file, an array yields views of its own memory. Only for `streamable` tensors."""
        if not self.streamable:
            raise ValueError(f"{self!r}: {self.dtype.name} data is not plain bytes")
        if self.is_external:
            yield from self._file_chunks(size)
            return
        raw = self._raw_bytes()
        if raw is None:
            array = np.ascontiguousarray(self.numpy())
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
            raw = memoryview(array.reshape(-1).view(np.uint8))
        view = memoryview(raw)
        for start in range(0, len(view), size):
            yield view[start:start + size]

    def to_proto(self, name: str | None = None) -> TensorProto:
        """The data as a TensorProto named `name` (None keeps the stored proto's own name).
        Inside `tensor_references`, a large tensor comes back as a reference instead."""
        references = _REFERENCES.get()
        if references is not None and self._referable():
            return self._reference(references, name)
        if self._external is not None:  # mapped or not, the proto itself has no data
            return self._loaded_proto(name)
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

    def described(self, name: str | None = None) -> TensorProto:
        """The tensor's TensorProto without its data (no raw_data, no external reference):
        what a writer that streams the bytes puts before them. Every other field of the
        stored proto (doc string, metadata) is kept; its data is not copied."""
        meta = TensorProto()
        if self._proto is not None:
            for field, value in self._proto.ListFields():
                if field.name in ("raw_data", "external_data", "data_location"):
                    continue
                repeated = field.is_repeated if hasattr(field, "is_repeated") \
                    else field.label == field.LABEL_REPEATED  # protobuf before 6
                if repeated:
                    getattr(meta, field.name).extend(value)
                elif field.message_type is not None:  # segment
                    getattr(meta, field.name).CopyFrom(value)
                else:
                    setattr(meta, field.name, value)
        else:
            meta.data_type = int(self.dtype)
            meta.dims.extend(self.shape)
            meta.doc_string = self.doc_string
        if name is not None:
            meta.name = name
        return meta

    def _referable(self) -> bool:
        # What an .om moves out of its models into a weights blob: data that would be in
        # raw_data (not typed fields) and at least 1 KiB (om_weights.MIN_EXTERNAL_BYTES).
        if not self.streamable or self.nbytes < 1024:
            return False
        return (self._proto is None or self._external is not None
                or self._proto.HasField("raw_data"))

    def _reference(self, references: "dict[str, Tensor]", name: str | None) -> TensorProto:
        key = f"{REFERENCE_PREFIX}{id(self)}"
        references[key] = self  # also keeps the tensor, so the id stays unique meanwhile
        proto = TensorProto()
        proto.name = name if name is not None else (self._proto.name if self._proto else "")
        proto.data_type = int(self.dtype)
        proto.dims.extend(self.shape)
        proto.doc_string = self.doc_string
        for k, v in (("location", key), ("offset", "0"), ("length", str(self.nbytes))):
            entry = proto.external_data.add()
            entry.key, entry.value = k, v
        proto.data_location = TensorProto.EXTERNAL
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
            if self.is_external and self.streamable:
                for chunk in self._file_chunks():
                    h.update(chunk)
            elif raw is not None:
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
        if self.is_external and self.streamable:
            _, offset, length, _ = self._external
            if length:  # the same bytes as raw_data would give, read from a transient mapping
                with self._open_external() as f:
                    flat = np.memmap(f, dtype=np.uint8, mode="r", offset=offset,
                                     shape=(length,))
                    h.update(flat[:: max(1, length // 2048)][:2048].tobytes())
                    del flat
            return h.hexdigest()[:12]
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


# (path, file identity, import) -> the file's mapping, while an array maps from it.
_MAPPINGS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_MAPPINGS_LOCK = threading.Lock()


# Data files a save of graphopt's replaced while tensors of the model may still read them (a
# model saved over its own .data, then saved again as an .om): the old file, kept open, by the
# identity those tensors recorded. Its disk space is freed when the process ends.
_RETAINED: dict[tuple, int] = {}
_RETAINED_LOCK = threading.Lock()


def retain_before_replacing(path: str) -> None:
    """Keep the current content of the file at `path` readable by the tensors that recorded
    it, through the rename that is about to replace it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    identity = stat_identity(os.fstat(fd))
    with _RETAINED_LOCK:
        if identity in _RETAINED:
            os.close(fd)
        else:
            _RETAINED[identity] = fd


def _reopen_retained(identity: tuple):
    with _RETAINED_LOCK:
        fd = _RETAINED.get(identity)
    if fd is None:
        return None
    try:  # a file description of its own (offset included), where /proc offers one
        return open(f"/proc/self/fd/{fd}", "rb")  # noqa: SIM115 - the caller closes it
    except OSError:
        return os.fdopen(os.dup(fd), "rb")


def _file_mapping(f, key: tuple) -> mmap.mmap:
    with _MAPPINGS_LOCK:
        mapping = _MAPPINGS.get(key)
        if mapping is None:
            mapping = _MAPPINGS[key] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return mapping


def _proto_array(proto: TensorProto) -> np.ndarray:
    """numpy_helper.to_array, but a string tensor whose bytes are not all UTF-8 (onnx.proto
    asks for UTF-8; onnxruntime takes any bytes) gives its elements as bytes objects."""
    try:
        return numpy_helper.to_array(proto)
    except UnicodeDecodeError:
        return np.array(list(proto.string_data), dtype=object).reshape(tuple(proto.dims))


@contextmanager
def tensor_copies() -> Iterator[None]:
    """Inside the block `to_proto` returns the data even within `tensor_references`: for a
    proto that must stand alone (one onnxruntime loads)."""
    token = _REFERENCES.set(None)
    try:
        yield
    finally:
        _REFERENCES.reset(token)


def referenced(tensor: Tensor, references: dict[str, Tensor]) -> Tensor | None:
    """The tensor in `references` that `tensor`, imported from a reference proto made inside
    `tensor_references`, stands for; None when it is not such a stand-in."""
    proto = tensor._proto
    if proto is None or proto.data_location != TensorProto.EXTERNAL:
        return None
    for entry in proto.external_data:
        if entry.key == "location":
            return references.get(entry.value)
    return None


def stat_identity(stat: os.stat_result) -> tuple:
    """What tells one file's content from another's at a path: device, inode, size, mtime."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def external_initializers(model) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of every initializer of `model` (nested graphs included) whose data
    still lives in an external file."""
    for graph in model.graph.all_graphs():
        for value in graph.initializers.values():
            if value.const is not None and value.const.is_external:
                yield value.name, value.const


@contextmanager
def inline_tensors() -> Iterator[None]:
    """Inside the block, `to_proto` holds every tensor's data again, even within a
    tensor_references block: for a model that must leave it (one onnxruntime runs there)."""
    token = _REFERENCES.set(None)
    try:
        yield
    finally:
        _REFERENCES.reset(token)


@contextmanager
def tensor_references() -> Iterator[dict[str, Tensor]]:
    """Inside the block, `to_proto` of a large plain-bytes tensor returns a proto without data
    whose external reference names a key of the yielded dict (`graphopt-tensor:<id>`), which
    maps it to the Tensor. A writer (the .om's weights blobs) then streams each tensor's bytes
    from where they live instead of copying every weight into protobufs first. Such protos
    must not leave the block: nothing else can resolve them."""
    references: dict[str, Tensor] = {}
    token = _REFERENCES.set(references)
    try:
        yield references
    finally:
        _REFERENCES.reset(token)
