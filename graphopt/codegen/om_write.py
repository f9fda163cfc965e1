"""Writing an .om: partitions, the routing between them, and the deterministic zip."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
import zipfile
from typing import Any, Mapping

import onnx
from onnx import TensorProto

from graphopt import __version__ as GRAPHOPT_VERSION
from graphopt import protowire
from graphopt.atomic import atomic_write
from graphopt.codegen.index_bounds import table_bounds
from graphopt.codegen.om_manifest import (
    DETAILS_NAME,
    FORMAT,
    INDEX_DIMS,
    INDEX_ROWS,
    OPTIMIZATION_LEVELS,
    MANIFEST_NAME,
    PARTITION_DIR,
    PARTITION_NAME,
    PROFILES_VERSION,
    REQUIRES_VERSION,
    check_member_name,
    dtype_name,
    file_sha256,
    required_features,
    route,
    sha256,
)
from graphopt.codegen.om_weights import (FILE_ALIGNMENT, WEIGHTS_DIR, Blob, all_tensors, split_weights,
                                         weights_member)
from graphopt.dims import read_dim
from graphopt.errors import ArtifactError, GraphoptError, OutputError

# The prefix of the symbols ONNX's shape inference makes up for dims it cannot name.
_MADE_UP_DIM = "unk__"
# Zip entries carry a timestamp; a fixed one makes the same input give the same bytes.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_ZIP_COMPRESSLEVEL = 6


# --- signature -----------------------------------------------------------------------------


def _signature_entry(value_info: onnx.ValueInfoProto) -> dict:
    kind = value_info.type.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return {"name": value_info.name, "dtype": None, "shape": None}
    tensor_type = getattr(value_info.type, kind)
    shape = None
    if tensor_type.HasField("shape"):
        shape = []
        for dim in tensor_type.shape.dim:
            shape.append(read_dim(dim))  # as the importer reads it: -1 and "?" are unknown
    return {"name": value_info.name, "dtype": dtype_name(tensor_type.elem_type), "shape": shape}


# --- partitions and routing ----------------------------------------------------------------


def graph_inputs(model: onnx.ModelProto) -> list[str]:
    # Models before IR 4 list initializers as inputs too; those are weights, not feeds.
    weights = {init.name for init in model.graph.initializer}
    weights.update(sparse.values.name for sparse in model.graph.sparse_initializer)
    return [vi.name for vi in model.graph.input if vi.name not in weights]


def input_signature(model: onnx.ModelProto) -> list[dict]:
    """The signature entries ({"name", "dtype", "shape"}) of the inputs a caller feeds."""
    fed = set(graph_inputs(model))
    return [_signature_entry(vi) for vi in model.graph.input if vi.name in fed]


@dataclasses.dataclass
class OmPartition:
    """One separately executed ONNX model of an artifact and the device it targets.

    `inputs` / `outputs` default to the model's graph inputs (weights excluded) and outputs.
    `providers` lists the onnxruntime execution providers for the device, preferred first (from
    the target profile); None leaves the choice to the runtime's defaults.
    `optimization_level` ("disable", "basic", "extended", "all") is the onnxruntime graph
    optimization level the runtime should use when its caller does not choose one: a partition
    graphopt already fused and laid out needs no session-time rewriting, so it starts faster.
    `disabled_optimizers` names onnxruntime graph transformers that would change the
    partition's results (see split.py); the runtime passes them to its session.
    `prepack_weights` False tells the runtime that no kernel of this CPU partition runs faster
    for weights pre-packed at session creation (prepacking.py), so its session skips that.
    """

    name: str
    device: str
    model: onnx.ModelProto
    inputs: list[str] | None = None
    outputs: list[str] | None = None
    providers: list[str] | None = None
    optimization_level: str | None = None  # the onnxruntime level the compile left work for
    disabled_optimizers: list[str] | None = None  # onnxruntime optimizers the session must skip
    prepack_weights: bool = True  # False: the session need not pre-pack weights at creation

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not PARTITION_NAME.match(self.name):
            raise ValueError(f"partition name {self.name!r} must match {PARTITION_NAME.pattern}")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"partition {self.name!r}: device must be a non-empty string, e.g. 'cpu'")
        if not isinstance(self.model, onnx.ModelProto):
            raise TypeError(
                f"partition {self.name!r}: model must be an onnx.ModelProto, not {type(self.model).__name__}"
            )
        if self.inputs is None:
            self.inputs = graph_inputs(self.model)
        if self.outputs is None:
            self.outputs = [vi.name for vi in self.model.graph.output]
        self.inputs, self.outputs = list(self.inputs), list(self.outputs)
        if self.optimization_level not in (None, *OPTIMIZATION_LEVELS):
            raise ValueError(f"partition {self.name!r}: optimization_level must be one of "
                             f"{', '.join(OPTIMIZATION_LEVELS)}")
        if self.providers is not None:
            if not all(isinstance(p, str) and p for p in self.providers):
                raise ValueError(f"partition {self.name!r}: providers must be non-empty strings")
            self.providers = list(self.providers)
        if self.disabled_optimizers is not None:
            if not all(isinstance(o, str) and o for o in self.disabled_optimizers):
                raise ValueError(f"partition {self.name!r}: disabled_optimizers must be "
                                 "non-empty strings")
            self.disabled_optimizers = list(self.disabled_optimizers)
        if not isinstance(self.prepack_weights, bool):
            raise ValueError(f"partition {self.name!r}: prepack_weights must be True or False")

    @property
    def member(self) -> str:
        return f"{PARTITION_DIR}{self.name}.onnx"


@dataclasses.dataclass
class OmProfile:
    """One shape profile of an artifact: its name, the dims it pins ({"batch": 4}), and its
    partitions in execution order. Every profile has the artifact's inputs and outputs."""

    name: str
    dims: dict[str, int]
    partitions: list[OmPartition]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not PARTITION_NAME.match(self.name):
            raise ValueError(f"profile name {self.name!r} must match {PARTITION_NAME.pattern}")
        if not self.partitions:
            raise ValueError(f"profile {self.name!r} has no partitions")
        self.dims = {str(k): int(v) for k, v in self.dims.items()}


def uses_external_data(model: onnx.ModelProto, resolvable: Mapping[str, Any] | None = None
                       ) -> bool:
    """Whether a tensor keeps its data in an external file (other than references the writer
    resolves itself, `resolvable`): an .om must be self-contained, and an external reference
    would also let a file read any path."""
    for tensor in all_tensors(model.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location not in (resolvable or {}):
                return True
    return False


def _profile_plans(profiles: list[OmProfile], outputs: list[str] | None,
                   inputs: list[str] | None) -> list[tuple]:
    """(profile, inputs, outputs, routing) of each profile; all must share one signature."""
    plans, names, parts = [], set(), set()
    for profile in profiles:
        if not isinstance(profile, OmProfile):
            raise TypeError(f"profiles must be OmProfile, not {type(profile).__name__}")
        if profile.name in names:
            raise ValueError(f"two profiles are named {profile.name!r}")
        names.add(profile.name)
        for part in profile.partitions:  # they share the artifact's partitions/ folder
            if part.name in parts:
                raise ValueError(f"two profiles have a partition named {part.name!r}")
            parts.add(part.name)
        plan = [(p.name, p.inputs, p.outputs) for p in profile.partitions]
        plans.append((profile, *route(plan, outputs, inputs)))
    first = plans[0]
    for profile, ins, outs, _ in plans[1:]:
        if (ins, outs) != (first[1], first[2]):
            raise ValueError(f"profile {profile.name!r} has inputs {ins} and outputs {outs}; "
                             f"{first[0].name!r} has {first[1]} and {first[2]}")
    return plans


def _signature(partitions: list[OmPartition], tensors: list[str], fed: list[str]
               ) -> dict[str, dict]:
    """The signature entries of `tensors`, from the partitions' graph inputs and outputs; those
    of the `fed` inputs that index a 4-bit embedding table carry its bounds (index_bounds)."""
    signature: dict[str, dict] = {}
    for part in partitions:
        for vi in list(part.model.graph.input) + list(part.model.graph.output):
            signature.setdefault(vi.name, _signature_entry(vi))
    for tensor in tensors:
        if tensor not in signature:
            raise ValueError(f"tensor {tensor!r} is not a graph input or output of its partition")
    named = {dim for name in fed for dim in signature[name]["shape"] or () if isinstance(dim, str)}
    for tensor in tensors:
        shape = signature[tensor]["shape"]
        if tensor not in fed and shape is not None:
            # A symbol ONNX's inference made up (unk__0) names nothing a caller can relate to
            # an input: the output's dim is unknown, as onnxruntime shows the source's.
            signature[tensor]["shape"] = [
                None if isinstance(dim, str) and dim.startswith(_MADE_UP_DIM)
                and dim not in named else dim for dim in shape]
    for part in partitions:
        bounds = table_bounds(part.model)
        for name, rows in bounds.rows.items():
            if name in fed:
                entry = signature[name]
                entry[INDEX_ROWS] = min(rows, entry.get(INDEX_ROWS, rows))
        for (name, axis), rows in sorted(bounds.dims.items()):
            if name in fed:
                pairs = dict(signature[name].get(INDEX_DIMS, []))
                pairs[axis] = min(rows, pairs.get(axis, rows))
                signature[name][INDEX_DIMS] = [[a, r] for a, r in sorted(pairs.items())]
    return signature


def _merged_signature(signatures: list[dict[str, dict]], dynamic: Mapping[str, dict]
                      ) -> dict[str, dict]:
    """One signature for all profiles: a dim the profiles agree on keeps its size, one they
    do not is named as in `dynamic` (null where it has no name there)."""
    merged = {}
    for name, first in signatures[0].items():
        entries = [sig[name] for sig in signatures if name in sig]
        shapes = [e["shape"] for e in entries]
        if any(e["dtype"] != first["dtype"] for e in entries):
            raise ValueError(f"tensor {name!r} has a different dtype in another profile")
        shape = None
        if all(s is not None and len(s) == len(shapes[0]) for s in shapes):
            named = (dynamic.get(name) or {}).get("shape") or []
            named = named if len(named) == len(shapes[0]) else [None] * len(shapes[0])
            shape = [dims[0] if len(set(dims)) == 1 else (named[axis] if isinstance(
                named[axis], str) else None) for axis, dims in enumerate(zip(*shapes))]
        merged[name] = {**first, "shape": shape}
    return merged


# --- writing -------------------------------------------------------------------------------


def _json_value(what: str, value: Any) -> Any:
    # Strict JSON (no NaN) so every reader, not just Python's, can parse the manifest.
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serializable: {exc}") from None


def _compact_json(value: Any) -> bytes:
    # Without indentation: a load parses the manifest at every start, and `graphopt inspect`
    # is the readable view.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _zip_info(name: str, compress: bool = True) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE_TIME)
    # Partition models are stored: weights barely deflate (float bytes look random) and
    # inflating hundreds of MB would dominate the artifact's load time. The manifest and the
    # details are stored too: inflating them costs a small model's load more than it saves.
    info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    info.create_system = 3  # ZipInfo defaults to the host OS; fix it so bytes match across platforms
    info.external_attr = 0o100644 << 16
    return info


_LOCAL_HEADER_SIZE = 30
_PADDING_ID = 0xD935  # the extra-field id zipalign uses; readers skip ids they do not know


def _needs_zip64(size: int) -> bool:
    # zipfile's own rule for a member whose size it is told up front.
    return size * 1.05 > zipfile.ZIP64_LIMIT


def _alignment_padding(header_offset: int, name: str, zip64: bool = False) -> bytes:
    """A zip extra field that makes the member's data start on a FILE_ALIGNMENT boundary
    (past the 20-byte zip64 field zipfile appends to the local header of a member ≥ 2 GiB)."""
    start = header_offset + _LOCAL_HEADER_SIZE + len(name.encode()) + 4 + (20 if zip64 else 0)
    pad = -start % FILE_ALIGNMENT
    return struct.pack("<HH", _PADDING_ID, pad) + b"\0" * pad


CHUNK_BYTES = 4 << 20  # weights blobs are also summed per chunk, checked on every core at load


def _member_entry(name: str, data: bytes | Blob) -> dict:
    if isinstance(data, Blob):
        return _blob_entry(name, data)
    entry = {"sha256": sha256(data), "size": len(data)}
    if name.startswith(WEIGHTS_DIR) and len(data) > CHUNK_BYTES:
        view = memoryview(data)
        entry["chunk_bytes"] = CHUNK_BYTES
        entry["chunk_sha256"] = [sha256(view[i:i + CHUNK_BYTES])
                                 for i in range(0, len(data), CHUNK_BYTES)]
    return entry


def _blob_entry(name: str, blob: Blob) -> dict:
    """`_member_entry` of a blob, hashed as it streams: the same sums, never the whole blob
    in memory."""
    whole, chunk, chunk_sums = hashlib.sha256(), hashlib.sha256(), []
    filled = 0
    for piece in blob.chunks():
        view = memoryview(piece).cast("B")
        whole.update(view)
        while len(view):
            take = min(len(view), CHUNK_BYTES - filled)
            chunk.update(view[:take])
            filled += take
            view = view[take:]
            if filled == CHUNK_BYTES:
                chunk_sums.append(chunk.hexdigest())
                chunk, filled = hashlib.sha256(), 0
    if filled:
        chunk_sums.append(chunk.hexdigest())
    entry = {"sha256": whole.hexdigest(), "size": blob.size}
    if name.startswith(WEIGHTS_DIR) and blob.size > CHUNK_BYTES:
        entry["chunk_bytes"] = CHUNK_BYTES
        entry["chunk_sha256"] = chunk_sums
    return entry


def _partition_entry(part: OmPartition) -> dict:
    entry = {"name": part.name, "device": part.device, "member": part.member,
             "inputs": part.inputs, "outputs": part.outputs}
    if part.providers is not None:
        entry["providers"] = part.providers
    if part.optimization_level is not None:
        entry["optimization_level"] = part.optimization_level
    if part.disabled_optimizers:
        entry["disabled_optimizers"] = part.disabled_optimizers
    if not part.prepack_weights:
        entry["prepack_weights"] = False
    return entry


def write_om(
    path: str | os.PathLike,
    partitions: list[OmPartition],
    *,
    source_path: str | os.PathLike | None = None,
    source_bytes_sha256: str | None = None,
    source_external_sha256: str | None = None,
    hash_source: bool = True,
    target: str = "cpu",
    pass_log: list | None = None,
    extra_members: dict[str, bytes] | None = None,
    extra: dict | None = None,
    outputs: list[str] | None = None,
    inputs: list[str] | None = None,
    weight_sources: Mapping[str, Any] | None = None,
    profiles: list[OmProfile] | None = None,
    dynamic_signature: Mapping[str, dict] | None = None,
) -> None:
    """Write an .om artifact atomically: `path` ends up complete or as it was.

    `partitions` are in execution order. `outputs` overrides the artifact outputs (by default the
    partition outputs no partition consumes); `inputs` gives the order of the artifact's inputs
    (by default the order the partitions first take them). `extra_members` adds files (e.g. "tuning/records.json")
    that are checksummed like partitions. Equal arguments give byte-identical files, so keep
    timings out of `pass_log` if reproducible builds matter.

    `weight_sources` resolves the tensor references `graphopt.ir.tensor.tensor_references` put
    in the partition models: their bytes stream into the weights blobs from where they live.

    `profiles` (instead of `partitions`, which must then be empty) writes an artifact with one
    plan per shape profile, the first being the default; a weight the profiles share is stored
    once. The top-level signature shows a dim that differs between profiles as its name in
    `dynamic_signature` ({tensor: signature entry} of the model before pinning), else null.

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
    if profiles:
        if partitions:
            raise ValueError("give the partitions or the profiles (which hold them), not both")
        partitions = [part for profile in profiles for part in profile.partitions]
    for part in partitions:
        if not isinstance(part, OmPartition):
            raise TypeError(f"partitions must be OmPartition, not {type(part).__name__}")
    plans = _profile_plans(profiles, outputs, inputs) if profiles else None
    if plans:
        top_inputs, top_outputs, routing = plans[0][1:4]
    else:
        plan = [(p.name, p.inputs, p.outputs) for p in partitions]
        top_inputs, top_outputs, routing = route(plan, outputs, inputs)

    members: dict[str, bytes | Blob] = {}
    weight_sources = weight_sources or {}
    # With profiles, a weight every profile holds is stored once, in the first blob that has it.
    shared_weights: dict | None = {} if profiles and len(profiles) > 1 else None
    for part in partitions:
        if uses_external_data(part.model, weight_sources):
            raise ValueError(
                f"partition {part.name!r} keeps tensors in external data; load them into the model first"
            )
        # Large weights go to a blob of their own that the model references: onnxruntime maps
        # it from the artifact at load time instead of copying it out of the protobuf.
        model, blob = split_weights(part.model, weights_member(part.name), weight_sources,
                                    shared_weights)
        try:
            # Initializers first, large ones ahead: a load finds the external references
            # without walking the nodes, and its search for stray ones skips the tensor bytes.
            members[part.member] = protowire.initializers_first(model.SerializeToString())
        except Exception as exc:  # protobuf raises ValueError past 2 GiB, EncodeError on bad fields
            raise ArtifactError(
                f"cannot write {path}: partition {part.name!r} does not serialize ({exc})"
            ) from exc
        if blob is not None:
            members[weights_member(part.name)] = blob
    # Parsed only when asked for (inspect, report), so a load skips it; see DETAILS_NAME.
    details = {"pass_log": _json_value("pass_log", list(pass_log or [])),
               "extra": _json_value("extra", dict(extra or {}))}
    members[DETAILS_NAME] = _compact_json(details)
    for name, data in (extra_members or {}).items():
        check_member_name(name)
        if name == MANIFEST_NAME or name in members or name.startswith(WEIGHTS_DIR):
            raise ValueError(f"extra member {name!r} collides with a member graphopt writes")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"extra member {name!r} must be bytes, not {type(data).__name__}")
        members[name] = bytes(data)

    if plans:
        signatures = [_signature(profile.partitions, top_inputs + top_outputs, top_inputs)
                      for profile, *_ in plans]
        signature = _merged_signature(signatures, dynamic_signature or {})
    else:
        signature = _signature(partitions, top_inputs + top_outputs, top_inputs)

    if source_path is not None:
        source_path = os.fspath(source_path)
        if source_bytes_sha256 is None and hash_source:
            source_bytes_sha256 = file_sha256(source_path)
    manifest = {
        "format": FORMAT,
        "format_version": PROFILES_VERSION if profiles else 1,  # REQUIRES_VERSION below
        "graphopt_version": GRAPHOPT_VERSION,
        "created_by": "graphopt",
        "source": {
            "path": os.path.basename(source_path) if source_path is not None else None,
            "sha256": source_bytes_sha256,
            # Its external data files, which the file's own hash leaves out (only when any).
            **({"external_sha256": source_external_sha256} if source_external_sha256 else {}),
        },
        "target": target,
        "inputs": [signature[t] for t in top_inputs],
        "outputs": [signature[t] for t in top_outputs],
        "partitions": [_partition_entry(p) for p in partitions],
        "execution_order": [p.name for p in (profiles[0].partitions if profiles else partitions)],
        "routing": routing,
        **({"profiles": [
            # The manifest's keys are sorted (stable bytes): dims_order keeps the order the
            # dims were given in, which inspect, run and the runtime's errors show.
            {"name": profile.name, "dims": profile.dims, "dims_order": list(profile.dims),
             "inputs": [sig[t] for t in top_inputs], "outputs": [sig[t] for t in top_outputs],
             "execution_order": [p.name for p in profile.partitions], "routing": edges}
            for (profile, _, _, edges), sig in zip(plans, signatures)]} if plans else {}),
        "pass_log": [],
        "details": DETAILS_NAME,
        "members": {name: _member_entry(name, data) for name, data in members.items()},
        "extra": {},
    }
    requires = required_features(manifest)
    if requires:  # older readers, which would ignore them, refuse version 3
        manifest.update(format_version=REQUIRES_VERSION, requires=requires)
    manifest_bytes = _compact_json(manifest)

    try:
        with atomic_write(path) as f, zipfile.ZipFile(f, "w") as zf:
            # The manifest goes first so a reader (or `unzip -p`) finds it without the central directory.
            zf.writestr(_zip_info(MANIFEST_NAME, compress=False), manifest_bytes)
            for name in sorted(members):
                stored = name.startswith((PARTITION_DIR, WEIGHTS_DIR)) or name == DETAILS_NAME
                info = _zip_info(name, compress=not stored)
                data = members[name]
                if isinstance(data, Blob):
                    info.file_size = data.size
                    info.extra = _alignment_padding(f.tell(), name, _needs_zip64(data.size))
                    # Streamed into the member, piece by piece, as writestr would write it.
                    with zf.open(info, "w") as dest:
                        for piece in data.chunks():
                            dest.write(piece)
                    continue
                if name.startswith(WEIGHTS_DIR):
                    info.extra = _alignment_padding(f.tell(), name)
                zf.writestr(info, data, compresslevel=None if stored else _ZIP_COMPRESSLEVEL)
    except OutputError:
        raise  # the destination refused it: an OSError too, for callers that catch those
    except OSError as exc:  # reading what goes in (a weights file) failed
        raise GraphoptError(f"cannot write {path}: {exc.strerror or exc}") from exc
