"""The .om artifact: a deterministic zip of partition ONNX models described by a JSON manifest."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import zipfile
import zlib
from typing import Any, Iterable

import onnx
from onnx import TensorProto

from graphopt import __version__ as GRAPHOPT_VERSION
from graphopt.atomic import atomic_write
from graphopt.errors import ArtifactError, GraphoptError

FORMAT = "graphopt-om"
FORMAT_VERSION = 1  # bump on any change an older reader would misread; readers refuse newer ones
MANIFEST_NAME = "manifest.json"
PARTITION_DIR = "partitions/"

# Zip entries carry a timestamp; a fixed one makes the same input give the same bytes.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_ZIP_COMPRESSLEVEL = 6
# The manifest is parsed before anything is verified: bound what a hostile file can make us read.
_MAX_MANIFEST_BYTES = 64 << 20
_PARTITION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")

_SIGNATURE_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "dtype", "shape"],
        "properties": {
            "name": {"type": "string"},
            # TensorProto type name, lower case, floats by width: "float32", "int64", "bool", "bfloat16";
            # null for non-tensor values (sequences, maps, optionals) or an undefined element type.
            "dtype": {"type": ["string", "null"]},
            # null when the rank is unknown; per dim an int, a symbolic name, or null if unknown.
            "shape": {
                "type": ["array", "null"],
                "items": {"type": ["integer", "string", "null"]},
            },
        },
    },
}

# JSON Schema (draft 2020-12) of manifest.json, format_version 1. New optional keys may be added
# without a version bump; readers ignore keys they do not know. "extra" is free-form for callers.
MANIFEST_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "graphopt .om manifest",
    "type": "object",
    "required": [
        "format", "format_version", "graphopt_version", "created_by", "source", "target",
        "inputs", "outputs", "partitions", "execution_order", "routing", "pass_log", "members",
        "extra",
    ],
    "properties": {
        "format": {"const": FORMAT},
        "format_version": {"const": FORMAT_VERSION},
        "graphopt_version": {"type": "string"},
        "created_by": {"type": "string"},
        "source": {
            "type": "object",
            "required": ["path", "sha256"],
            "properties": {
                # Basename only: a full path would leak the build machine's layout into the artifact.
                "path": {"type": ["string", "null"]},
                "sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"},
            },
        },
        "target": {"type": "string"},
        # The artifact's signature: tensors fed by the caller / returned to the caller.
        "inputs": _SIGNATURE_SCHEMA,
        "outputs": _SIGNATURE_SCHEMA,
        "partitions": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "device", "member", "inputs", "outputs"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.-]*$"},
                    "device": {"type": "string"},
                    "member": {"type": "string"},
                    "inputs": {"type": "array", "items": {"type": "string"}},
                    "outputs": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        # Partition names, each once, in the order they run.
        "execution_order": {"type": "array", "items": {"type": "string"}},
        # One edge per partition input ("from" null: fed by the caller) and per artifact output
        # ("to" null: returned to the caller). Tensors are routed by name.
        "routing": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["tensor", "from", "to"],
                "properties": {
                    "tensor": {"type": "string"},
                    "from": {"type": ["string", "null"]},
                    "to": {"type": ["string", "null"]},
                },
            },
        },
        "pass_log": {"type": "array"},
        # Every zip entry except manifest.json, with its checksum; unlisted entries are refused.
        "members": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["sha256", "size"],
                "properties": {
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "size": {"type": "integer", "minimum": 0},
                },
            },
        },
        "extra": {"type": "object"},
    },
}


# --- element types -------------------------------------------------------------------------

# Floats are named by width so the names read like numpy's; the rest is the TensorProto name lowered.
_DTYPE_RENAMES = {"FLOAT": "float32", "DOUBLE": "float64"}
_DTYPE_BY_NAME = {
    _DTYPE_RENAMES.get(name, name.lower()): value
    for name, value in TensorProto.DataType.items()
    if value != TensorProto.UNDEFINED
}


def dtype_name(elem_type: int) -> str | None:
    """The manifest name of a TensorProto element type ("float32", "int64"); None if undefined."""
    if elem_type == TensorProto.UNDEFINED:
        return None
    name = TensorProto.DataType.Name(elem_type)
    return _DTYPE_RENAMES.get(name, name.lower())


def dtype_from_name(name: str) -> int:
    """The TensorProto element type of a manifest dtype name; KeyError if unknown."""
    return _DTYPE_BY_NAME[name]


def _signature_entry(value_info: onnx.ValueInfoProto) -> dict:
    kind = value_info.type.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return {"name": value_info.name, "dtype": None, "shape": None}
    tensor_type = getattr(value_info.type, kind)
    shape = None
    if tensor_type.HasField("shape"):
        shape = []
        for dim in tensor_type.shape.dim:
            which = dim.WhichOneof("value")
            if which == "dim_value":
                shape.append(dim.dim_value)
            else:
                shape.append(dim.dim_param if which == "dim_param" else None)
    return {"name": value_info.name, "dtype": dtype_name(tensor_type.elem_type), "shape": shape}


# --- partitions and routing ----------------------------------------------------------------


def _graph_inputs(model: onnx.ModelProto) -> list[str]:
    # Models before IR 4 list initializers as inputs too; those are weights, not feeds.
    weights = {init.name for init in model.graph.initializer}
    weights.update(sparse.values.name for sparse in model.graph.sparse_initializer)
    return [vi.name for vi in model.graph.input if vi.name not in weights]


@dataclasses.dataclass
class OmPartition:
    """One separately executed ONNX model of an artifact and the device it targets.

    `inputs` / `outputs` default to the model's graph inputs (weights excluded) and outputs.
    """

    name: str
    device: str
    model: onnx.ModelProto
    inputs: list[str] | None = None
    outputs: list[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _PARTITION_NAME.match(self.name):
            raise ValueError(f"partition name {self.name!r} must match {_PARTITION_NAME.pattern}")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"partition {self.name!r}: device must be a non-empty string, e.g. 'cpu'")
        if not isinstance(self.model, onnx.ModelProto):
            raise TypeError(
                f"partition {self.name!r}: model must be an onnx.ModelProto, not {type(self.model).__name__}"
            )
        if self.inputs is None:
            self.inputs = _graph_inputs(self.model)
        if self.outputs is None:
            self.outputs = [vi.name for vi in self.model.graph.output]
        self.inputs, self.outputs = list(self.inputs), list(self.outputs)

    @property
    def member(self) -> str:
        return f"{PARTITION_DIR}{self.name}.onnx"


def _route(
    parts: list[tuple[str, list[str], list[str]]], outputs: list[str] | None
) -> tuple[list[str], list[str], list[dict]]:
    """(top-level inputs, top-level outputs, routing edges) of (name, inputs, outputs) in run order.

    A partition input is fed by the earlier partition that outputs a tensor of that name, else by
    the caller. Without `outputs`, the artifact returns every partition output that no other
    partition consumes. A tensor a partition both takes and returns (ONNX lets a graph output be
    a graph input) is a pass-through: its origin stays upstream.
    """
    if not parts:
        raise ValueError("an artifact needs at least one partition")
    producer: dict[str, str] = {}
    seen_names: set[str] = set()
    for name, ins, outs in parts:
        if name in seen_names:
            raise ValueError(f"two partitions are named {name!r}")
        seen_names.add(name)
        for tensor in outs:
            if tensor in ins:
                continue
            if tensor in producer:
                raise ValueError(f"tensor {tensor!r} is output by {producer[tensor]!r} and {name!r}")
            producer[tensor] = name

    top_inputs: list[str] = []
    consumers: dict[str, set[str]] = {}
    done: set[str] = set()
    routing: list[dict] = []
    for name, ins, _ in parts:
        for tensor in ins:
            source = producer.get(tensor)
            if source is not None and source not in done:
                raise ValueError(
                    f"partition {name!r} consumes {tensor!r} before {source!r} produces it; "
                    "list partitions in execution order"
                )
            if source is None and tensor not in top_inputs:
                top_inputs.append(tensor)
            consumers.setdefault(tensor, set()).add(name)
            routing.append({"tensor": tensor, "from": source, "to": name})
        done.add(name)

    if outputs is None:
        outputs = []
        for name, _, outs in parts:
            for tensor in outs:
                if not consumers.get(tensor, set()) - {name} and tensor not in outputs:
                    outputs.append(tensor)
    outputs = list(outputs)
    if not outputs:
        raise ValueError("the artifact has no outputs")
    if len(set(outputs)) != len(outputs):
        raise ValueError("the artifact lists an output twice")
    for tensor in outputs:
        if tensor not in producer and tensor not in top_inputs:
            raise ValueError(f"output {tensor!r} is produced by no partition")
        routing.append({"tensor": tensor, "from": producer.get(tensor), "to": None})
    return top_inputs, outputs, routing


def _iter_tensors(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
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
                yield from _iter_tensors(attr.g)
            for sub in attr.graphs:
                yield from _iter_tensors(sub)


def _uses_external_data(model: onnx.ModelProto) -> bool:
    # An .om must be self-contained; an external reference would also let a file read any path.
    return any(t.data_location == TensorProto.EXTERNAL for t in _iter_tensors(model.graph))


# --- writing -------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _check_member_name(name: str) -> None:
    """Raise ValueError unless `name` is a relative, normalized path that stays in the archive."""
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or re.match(r"[A-Za-z]:", name)  # a Windows drive letter would escape on extraction there
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"unsafe member name {name!r} (absolute, or escapes the archive)")


def _json_value(what: str, value: Any) -> Any:
    # Strict JSON (no NaN) so every reader, not just Python's, can parse the manifest.
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serializable: {exc}") from None


def _zip_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # ZipInfo defaults to the host OS; fix it so bytes match across platforms
    info.external_attr = 0o100644 << 16
    return info


def write_om(
    path: str | os.PathLike,
    partitions: list[OmPartition],
    *,
    source_path: str | os.PathLike | None = None,
    source_bytes_sha256: str | None = None,
    target: str = "cpu",
    pass_log: list | None = None,
    extra_members: dict[str, bytes] | None = None,
    extra: dict | None = None,
    outputs: list[str] | None = None,
) -> None:
    """Write an .om artifact atomically: `path` ends up complete or as it was.

    `partitions` are in execution order. `outputs` overrides the artifact outputs (by default the
    partition outputs no partition consumes). `extra_members` adds files (e.g. "tuning/records.json")
    that are checksummed like partitions. Equal arguments give byte-identical files, so keep
    timings out of `pass_log` if reproducible builds matter.

    Raises ValueError/TypeError for inconsistent arguments (a caller bug) and GraphoptError when
    the file cannot be produced (unserializable model, unwritable path).
    """
    path = os.fspath(path)
    if not isinstance(target, str):
        raise TypeError(f"target must be a string, not {type(target).__name__}")
    if source_bytes_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", str(source_bytes_sha256)):
        raise ValueError(f"source_bytes_sha256 must be 64 lower-case hex digits: {source_bytes_sha256!r}")
    if pass_log is not None and not isinstance(pass_log, (list, tuple)):
        raise TypeError(f"pass_log must be a list, not {type(pass_log).__name__}")
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict, not {type(extra).__name__}")
    partitions = list(partitions)
    for part in partitions:
        if not isinstance(part, OmPartition):
            raise TypeError(f"partitions must be OmPartition, not {type(part).__name__}")
    plan = [(p.name, p.inputs, p.outputs) for p in partitions]
    top_inputs, top_outputs, routing = _route(plan, outputs)

    members: dict[str, bytes] = {}
    for part in partitions:
        if _uses_external_data(part.model):
            raise ValueError(
                f"partition {part.name!r} keeps tensors in external data; load them into the model first"
            )
        try:
            members[part.member] = part.model.SerializeToString()
        except Exception as exc:  # protobuf raises ValueError past 2 GiB, EncodeError on bad fields
            raise ArtifactError(
                f"cannot write {path}: partition {part.name!r} does not serialize ({exc})"
            ) from exc
    for name, data in (extra_members or {}).items():
        _check_member_name(name)
        if name == MANIFEST_NAME or name in members:
            raise ValueError(f"extra member {name!r} collides with a member graphopt writes")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"extra member {name!r} must be bytes, not {type(data).__name__}")
        members[name] = bytes(data)

    signature: dict[str, dict] = {}
    for part in partitions:
        for vi in list(part.model.graph.input) + list(part.model.graph.output):
            signature.setdefault(vi.name, _signature_entry(vi))
    for tensor in top_inputs + top_outputs:
        if tensor not in signature:
            raise ValueError(f"tensor {tensor!r} is not a graph input or output of its partition")

    if source_path is not None:
        source_path = os.fspath(source_path)
        if source_bytes_sha256 is None:
            source_bytes_sha256 = _file_sha256(source_path)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "graphopt_version": GRAPHOPT_VERSION,
        "created_by": "graphopt",
        "source": {
            "path": os.path.basename(source_path) if source_path is not None else None,
            "sha256": source_bytes_sha256,
        },
        "target": target,
        "inputs": [signature[t] for t in top_inputs],
        "outputs": [signature[t] for t in top_outputs],
        "partitions": [
            {
                "name": p.name, "device": p.device, "member": p.member,
                "inputs": p.inputs, "outputs": p.outputs,
            }
            for p in partitions
        ],
        "execution_order": [p.name for p in partitions],
        "routing": routing,
        "pass_log": _json_value("pass_log", list(pass_log or [])),
        "members": {
            name: {"sha256": _sha256(data), "size": len(data)}
            for name, data in members.items()
        },
        "extra": _json_value("extra", dict(extra or {})),
    }
    manifest_bytes = (json.dumps(manifest, sort_keys=True, indent=2, allow_nan=False) + "\n").encode()

    try:
        with atomic_write(path) as f, zipfile.ZipFile(f, "w") as zf:
            # The manifest goes first so a reader (or `unzip -p`) finds it without the central directory.
            zf.writestr(_zip_info(MANIFEST_NAME), manifest_bytes, compresslevel=_ZIP_COMPRESSLEVEL)
            for name in sorted(members):
                zf.writestr(_zip_info(name), members[name], compresslevel=_ZIP_COMPRESSLEVEL)
    except OSError as exc:
        raise GraphoptError(f"cannot write {path}: {exc.strerror or exc}") from exc


# --- reading -------------------------------------------------------------------------------


class _Malformed(Exception):
    """A problem found in the file; load_om prefixes the path and raises ArtifactError."""


def _field(mapping: dict, key: str, kind: type | tuple, where: str = "manifest") -> Any:
    if key not in mapping:
        raise _Malformed(f"{where} has no {key!r}")
    value = mapping[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise _Malformed(f"{where} field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _str_list(mapping: dict, key: str, where: str) -> list[str]:
    value = _field(mapping, key, list, where)
    if not all(isinstance(item, str) for item in value):
        raise _Malformed(f"{where} field {key!r} must list strings")
    return value


def _check_signature(entries: list, where: str) -> None:
    for entry in entries:
        if not isinstance(entry, dict):
            raise _Malformed(f"manifest {where} entries must be objects")
        _field(entry, "name", str, f"manifest {where} entry")
        dtype = _field(entry, "dtype", (str, type(None)), f"manifest {where} entry")
        if dtype is not None and dtype not in _DTYPE_BY_NAME:
            raise _Malformed(f"manifest {where} entry {entry['name']!r} has unknown dtype {dtype!r}")
        shape = _field(entry, "shape", (list, type(None)), f"manifest {where} entry")
        for dim in shape or []:
            if isinstance(dim, bool) or not isinstance(dim, (int, str, type(None))):
                raise _Malformed(f"manifest {where} entry {entry['name']!r} has a bad dim {dim!r}")


def _read_manifest(zf: zipfile.ZipFile) -> dict:
    try:
        info = zf.getinfo(MANIFEST_NAME)
    except KeyError:
        raise _Malformed(f"no {MANIFEST_NAME} (a zip, but not a graphopt .om)") from None
    if info.file_size > _MAX_MANIFEST_BYTES:
        raise _Malformed(f"{MANIFEST_NAME} is implausibly large ({info.file_size} bytes)")
    try:
        manifest = json.loads(zf.read(info).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Malformed(f"{MANIFEST_NAME} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise _Malformed(f"{MANIFEST_NAME} is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise _Malformed(
            f"not a graphopt .om (manifest format is {manifest.get('format')!r}, expected {FORMAT!r})"
        )
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise _Malformed(f"manifest format_version is {version!r}, not an integer")
    if version > FORMAT_VERSION:
        raise _Malformed(
            f"format_version {version} is newer than this graphopt {GRAPHOPT_VERSION} reads "
            f"(up to {FORMAT_VERSION}); upgrade graphopt or recompile the model"
        )
    if version < 1:
        raise _Malformed(f"unsupported format_version {version}")
    return manifest


def _check_manifest(manifest: dict) -> None:
    """Check the structure the loader and runtime rely on (MANIFEST_SCHEMA, without a dependency)."""
    for key in ("graphopt_version", "created_by", "target"):
        _field(manifest, key, str)
    source = _field(manifest, "source", dict)
    _field(source, "path", (str, type(None)), "manifest source")
    _field(source, "sha256", (str, type(None)), "manifest source")
    for key in ("inputs", "outputs"):
        _check_signature(_field(manifest, key, list), key)
    _field(manifest, "pass_log", list)
    _field(manifest, "extra", dict)
    for name, info in _field(manifest, "members", dict).items():
        where = f"manifest member {name!r}"
        if not isinstance(info, dict):
            raise _Malformed(f"{where} is not an object")
        sha = _field(info, "sha256", str, where)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise _Malformed(f"{where} has a malformed sha256")
        if _field(info, "size", int, where) < 0:
            raise _Malformed(f"{where} has a negative size")
    partitions = _field(manifest, "partitions", list)
    if not partitions:
        raise _Malformed("manifest lists no partitions")
    for part in partitions:
        if not isinstance(part, dict):
            raise _Malformed("manifest partitions entries must be objects")
        name = _field(part, "name", str, "manifest partition")
        where = f"manifest partition {name!r}"
        if not _PARTITION_NAME.match(name):
            raise _Malformed(f"{where} has an unsafe name")
        _field(part, "device", str, where)
        _field(part, "member", str, where)
        _str_list(part, "inputs", where)
        _str_list(part, "outputs", where)
    order = _str_list(manifest, "execution_order", "manifest")
    names = [p["name"] for p in partitions]
    if sorted(order) != sorted(names) or len(set(order)) != len(order):
        raise _Malformed("manifest execution_order must list every partition exactly once")
    routing = _field(manifest, "routing", list)
    for edge in routing:
        if not isinstance(edge, dict):
            raise _Malformed("manifest routing entries must be objects")


def _check_routing(manifest: dict) -> None:
    by_name = {p["name"]: p for p in manifest["partitions"]}
    ordered = [(n, by_name[n]["inputs"], by_name[n]["outputs"]) for n in manifest["execution_order"]]
    try:
        top_inputs, top_outputs, routing = _route(ordered, [o["name"] for o in manifest["outputs"]])
    except ValueError as exc:
        raise _Malformed(f"inconsistent partitions: {exc}") from None
    if top_inputs != [i["name"] for i in manifest["inputs"]]:
        raise _Malformed("manifest inputs do not match the inputs the partitions need")
    if routing != manifest["routing"]:
        raise _Malformed("manifest routing does not match the partitions' inputs and outputs")


def _read_member(zf: zipfile.ZipFile, name: str, expected: dict) -> bytes:
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise _Malformed(f"member {name!r} listed in the manifest is missing from the archive") from None
    # Compare the declared size first: it also bounds how much a zip bomb can make us inflate.
    if info.file_size != expected["size"]:
        raise _Malformed(
            f"member {name!r} has size {info.file_size}, manifest says {expected['size']} "
            "(tampered or corrupt)"
        )
    try:
        data = zf.read(info)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError) as exc:
        raise _Malformed(f"member {name!r} is corrupt ({exc})") from None
    if _sha256(data) != expected["sha256"]:
        raise _Malformed(f"member {name!r} fails its sha256 check (tampered or corrupt)")
    return data


def _parse_partition(part: dict, data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)  # plain protobuf decoding: nothing in the file is executed
    except Exception as exc:  # protobuf's DecodeError type differs between its implementations
        raise _Malformed(f"partition {part['name']!r} is not a valid ONNX model ({exc})") from None
    if _uses_external_data(model):
        raise _Malformed(f"partition {part['name']!r} references external data, which an .om may not")
    inputs = set(_graph_inputs(model))
    outputs = {vi.name for vi in model.graph.output}
    for tensor in part["inputs"]:
        if tensor not in inputs:
            raise _Malformed(f"partition {part['name']!r} input {tensor!r} is not one of its model's")
    for tensor in part["outputs"]:
        if tensor not in outputs:
            raise _Malformed(f"partition {part['name']!r} output {tensor!r} is not one of its model's")
    return model


@dataclasses.dataclass(frozen=True)
class OmArtifact:
    """A loaded, verified .om: its manifest, member bytes and partition models."""

    path: str
    manifest: dict
    members: dict[str, bytes]
    models: dict[str, onnx.ModelProto]  # by partition name

    @property
    def inputs(self) -> list[dict]:
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[dict]:
        return self.manifest["outputs"]

    @property
    def execution_order(self) -> list[str]:
        return self.manifest["execution_order"]

    @property
    def routing(self) -> list[dict]:
        return self.manifest["routing"]

    def member(self, name: str) -> bytes:
        """The verified bytes of a member, e.g. "partitions/p0.onnx"."""
        return self.members[name]

    @property
    def partitions(self) -> list[OmPartition]:
        """The partitions in execution order."""
        by_name = {p["name"]: p for p in self.manifest["partitions"]}
        parts = []
        for name in self.execution_order:
            entry = by_name[name]
            model = self.models[name]
            parts.append(OmPartition(name, entry["device"], model, entry["inputs"], entry["outputs"]))
        return parts

    def partition_bytes(self, name: str) -> bytes:
        """The serialized model of partition `name`, as stored."""
        member = next(p["member"] for p in self.manifest["partitions"] if p["name"] == name)
        return self.members[member]


def load_om(path: str | os.PathLike) -> OmArtifact:
    """Load and verify an .om; any problem raises ArtifactError naming the file and the problem."""
    path = os.fspath(path)
    try:
        return _load(path)
    except _Malformed as exc:
        raise ArtifactError(f"{path}: {exc}") from None


def _load(path: str) -> OmArtifact:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise _Malformed(f"cannot read ({exc.strerror or exc})") from None
    if not magic.startswith(b"PK"):
        raise _Malformed("not an .om artifact (not a zip archive)")
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise _Malformed("truncated or corrupt zip archive (no readable central directory)") from None
    except OSError as exc:
        raise _Malformed(f"cannot read ({exc.strerror or exc})") from None
    with zf:
        names = zf.namelist()
        # Refuse unsafe names before reading anything: this also protects anyone who unzips the file.
        for name in names:
            try:
                _check_member_name(name)
            except ValueError as exc:
                raise _Malformed(str(exc)) from None
        if len(set(names)) != len(names):
            raise _Malformed("a member name appears twice (ambiguous, possibly tampered)")
        try:
            manifest = _read_manifest(zf)
        except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError) as exc:
            raise _Malformed(f"{MANIFEST_NAME} is corrupt ({exc})") from None
        _check_manifest(manifest)
        listed = manifest["members"]
        for name in listed:
            try:
                _check_member_name(name)
            except ValueError as exc:
                raise _Malformed(f"manifest lists an {exc}") from None
        for name in names:
            if name != MANIFEST_NAME and name not in listed:
                raise _Malformed(f"member {name!r} is not listed in the manifest (tampered?)")
        members = {name: _read_member(zf, name, listed[name]) for name in sorted(listed)}

    models: dict[str, onnx.ModelProto] = {}
    for part in manifest["partitions"]:
        if part["member"] not in members:
            raise _Malformed(f"partition {part['name']!r} member {part['member']!r} is not a listed member")
        models[part["name"]] = _parse_partition(part, members[part["member"]])
    _check_routing(manifest)
    return OmArtifact(path=path, manifest=manifest, members=members, models=models)


def is_om(path: str | os.PathLike) -> bool:
    """Whether `path` looks like an .om (zip with a graphopt manifest); checksums are not verified."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return False
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo(MANIFEST_NAME)
            if info.file_size > _MAX_MANIFEST_BYTES:
                return False
            manifest = json.loads(zf.read(info).decode("utf-8"))
    except (OSError, KeyError, ValueError, EOFError, RuntimeError, NotImplementedError,
            zipfile.BadZipFile, zlib.error):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT
