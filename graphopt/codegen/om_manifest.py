"""The .om manifest format: its constants, JSON Schema, dtype names, routing, checksums and
structure checks (no onnx import: the runtime's load reads it)."""

from __future__ import annotations

import hashlib
import re
from typing import Any


FORMAT = "graphopt-om"
FORMAT_VERSION = 3  # bump on any change an older reader would misread; readers refuse newer ones
# Version 2 added shape profiles. An artifact without them is still written as version 1, so
# graphopt releases that predate profiles keep reading it; one with profiles is refused by them
# instead of running its default profile on inputs of every shape.
PROFILES_VERSION = 2
# Version 3 added "requires": the features of the manifest a reader must honour to compute the
# artifact's results, each by name. Readers ignore keys they do not know, so a release that
# predated a feature ran such an artifact without it: a partition whose session must not run
# onnxruntime's MatmulTransposeFusion returned results 1.7 off, and one bounding an input's
# ids by a 4-bit table's rows returned garbage for ids past them. Written only when the
# artifact uses one (else as version 1 or 2, as before); a reader refuses a name it does not
# know, naming it.
REQUIRES_VERSION = 3
FEATURES = {
    # A partition's "disabled_optimizers": onnxruntime rewrites that change its results.
    "disabled_optimizers": "its sessions must not run some of onnxruntime's graph rewrites",
    # An input's "index_rows"/"index_dims": ids and lengths bounded by a 4-bit table's rows.
    "index_bounds": "its inputs' ids are bounded by the rows of a 4-bit embedding table",
}
MANIFEST_NAME = "manifest.json"
# The pass log and the extras (memory plan, partitioning, kernel tilings) live in a member of
# their own: a load parses only the small manifest, and they are parsed when asked for. The
# manifest keeps empty "pass_log" and "extra" for the readers that predate this member; those
# run such an artifact as before and only show an empty pass log, so no version bump.
DETAILS_NAME = "details.json"
PARTITION_DIR = "partitions/"
PARTITION_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")  # onnxruntime's, by name
# On an input's entry, what bounds it by a 4-bit embedding table it indexes (codegen/index_bounds):
# the table's rows for the input's ids, [[axis, rows], …] for dims that count positions into one.
INDEX_ROWS = "index_rows"
INDEX_DIMS = "index_dims"

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
                "items": {"type": ["integer", "string", "null"], "minimum": 0},
            },
            # Inputs only: the rows of the 4-bit embedding table the input's ids index; the
            # runtime refuses ids outside [-rows, rows), as Gather does.
            INDEX_ROWS: {"type": "integer", "minimum": 1},
            # Inputs only: [axis, rows] pairs; that dim counts positions 0 … dim - 1 into a 4-bit
            # table of `rows` rows, and the runtime refuses a dim past `rows`, as Gather does.
            INDEX_DIMS: {"type": "array", "items": {
                "type": "array", "prefixItems": [{"type": "integer", "minimum": 0},
                                                 {"type": "integer", "minimum": 1}],
                "minItems": 2, "maxItems": 2}},
        },
    },
}

# JSON Schema (draft 2020-12) of manifest.json, format_version 1 and 2. New optional keys may be added
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
        "format_version": {"enum": [1, PROFILES_VERSION, REQUIRES_VERSION]},
        # Format version 3 only, and required there: FEATURES a reader must honour.
        "requires": {"type": "array", "items": {"type": "string"}},
        "graphopt_version": {"type": "string"},
        "created_by": {"type": "string"},
        "source": {
            "type": "object",
            "required": ["path", "sha256"],
            "properties": {
                # Basename only: a full path would leak the build machine's layout into the artifact.
                "path": {"type": ["string", "null"]},
                "sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"},
                # Of the external data files the source reads (optional; ir/data_files.py).
                "external_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
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
                    # onnxruntime execution providers for the device, preferred first (optional).
                    "providers": {"type": "array", "items": {"type": "string"}},
                    # onnxruntime graph optimization level to run it at unless the caller
                    # chooses (optional): what the compile left for the session to do.
                    "optimization_level": {"enum": list(OPTIMIZATION_LEVELS)},
                    # onnxruntime graph transformers its session must not run (optional):
                    # ones that would change the partition's results.
                    "disabled_optimizers": {"type": "array", "items": {"type": "string"}},
                    # false: its CPU session need not pre-pack weights when it is created
                    # (optional, default true): no kernel runs faster for it.
                    "prepack_weights": {"type": "boolean"},
                },
            },
        },
        # Partition names, each once, in the order they run (with profiles: the default
        # profile's, the first).
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
        # Format version 2 only, and required there: the shape profiles (`--dynamic-dims`), the
        # first being the default. Each has its own partitions (every partition belongs to one
        # profile), run in its execution_order along its routing; its inputs give the concrete
        # shapes a feed must have to run on it. The top-level inputs and outputs name the
        # dims that vary between profiles symbolically (or null).
        "profiles": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "dims", "inputs", "outputs", "execution_order", "routing"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.-]*$"},
                    "dims": {"type": "object", "additionalProperties": {"type": "integer"}},
                    # Optional: the dims' keys in the order they were given (dims is sorted).
                    "dims_order": {"type": "array", "items": {"type": "string"}},
                    "inputs": _SIGNATURE_SCHEMA,
                    "outputs": _SIGNATURE_SCHEMA,
                    "execution_order": {"type": "array", "items": {"type": "string"}},
                    "routing": {"$ref": "#/properties/routing"},
                },
            },
        },
        # Empty when "details" names the member that holds the pass log (see DETAILS_NAME).
        "pass_log": {"type": "array"},
        # Optional: the member holding {"pass_log": [...], "extra": {...}}, always DETAILS_NAME.
        "details": {"const": DETAILS_NAME},
        # Every zip entry except manifest.json, with its checksum; unlisted entries are refused.
        "members": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["sha256", "size"],
                "properties": {
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "size": {"type": "integer", "minimum": 0},
                    # Weights blobs also carry the sha256 of each chunk_bytes-long chunk, so a
                    # reader can check them on several cores at once (optional).
                    "chunk_bytes": {"type": "integer", "minimum": 1},
                    "chunk_sha256": {"type": "array",
                                     "items": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
                },
            },
        },
        # Free-form for callers; empty when "details" names the member that holds it.
        "extra": {"type": "object"},
    },
}

DETAILS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "graphopt .om details",
    "type": "object",
    "required": ["pass_log", "extra"],
    "properties": {"pass_log": {"type": "array"}, "extra": {"type": "object"}},
}


# --- element types -------------------------------------------------------------------------

# Floats are named by width so the names read like numpy's; the rest is the TensorProto name lowered.
_DTYPE_RENAMES = {"FLOAT": "float32", "DOUBLE": "float64"}
# TensorProto.DataType as of onnx 1.23, by value: what an .om's load reads without importing onnx
# (tests/test_om_wire.py checks it against onnx). A newer element type is looked up in onnx.
_ELEMENT_TYPES = (
    "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
    "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16",
    "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4",
    "FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2", "FLOAT6E2M3", "FLOAT6E3M2",
)
_DTYPE_BY_NAME = {_DTYPE_RENAMES.get(name, name.lower()): value
                  for value, name in enumerate(_ELEMENT_TYPES) if value}


def _onnx_element_types() -> dict[int, str]:
    from onnx import TensorProto

    return {value: name for name, value in TensorProto.DataType.items()}


def order_label(plan: dict) -> str:
    """A memory plan's schedule as inspect and the report show it: the method that chose the
    order and, where the order was searched (--memory-reorder), whether it is provably the
    lowest peak any order of the graph has."""
    method, optimal = plan.get("schedule_method", "original"), plan.get("schedule_optimal")
    if optimal is None:
        return method
    return f"{method}, {'optimal' if optimal else 'not proven optimal'}"


def dtype_name(elem_type: int) -> str | None:
    """The manifest name of a TensorProto element type ("float32", "int64"); None if undefined."""
    if elem_type == 0:
        return None
    if 0 < elem_type < len(_ELEMENT_TYPES):
        name = _ELEMENT_TYPES[elem_type]
    else:
        name = _onnx_element_types().get(elem_type)
        if name is None:  # as onnx's TensorProto.DataType.Name
            raise ValueError(f"enum DataType has no value defined for name {elem_type!r}")
    return _DTYPE_RENAMES.get(name, name.lower())


def elem_type_label(elem_type: int) -> str:
    """An element type as messages name it: its manifest name ("float32"), "undefined" for 0,
    "element type N" for a number ONNX does not define."""
    try:
        return dtype_name(elem_type) or "undefined"
    except ValueError:
        return f"element type {elem_type}"


def dtype_from_name(name: str) -> int:
    """The TensorProto element type of a manifest dtype name; KeyError if unknown."""
    value = _DTYPE_BY_NAME.get(name)
    if value is not None:
        return value
    newer = {_DTYPE_RENAMES.get(n, n.lower()): v for v, n in _onnx_element_types().items() if v}
    return newer[name]


def known_dtype(name: str) -> bool:
    """Whether `name` is a manifest dtype name."""
    try:
        dtype_from_name(name)
    except KeyError:
        return False
    return True



# --- member names --------------------------------------------------------------------------


_DRIVE_LETTER = re.compile(r"[A-Za-z]:")


def check_member_name(name: str) -> None:
    """Raise ValueError unless `name` is a relative, normalized path that stays in the archive."""
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or _DRIVE_LETTER.match(name)  # a Windows drive letter would escape on extraction there
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"unsafe member name {name!r} (absolute, or escapes the archive)")
    if not name.isprintable():  # a line break or an escape would reach a terminal listing it
        raise ValueError(f"unsafe member name {name!r} (holds control characters)")


# --- routing and checksums -----------------------------------------------------------------


def route(
    parts: list[tuple[str, list[str], list[str]]], outputs: list[str] | None,
    inputs: list[str] | None = None,
) -> tuple[list[str], list[str], list[dict]]:
    """(top-level inputs, top-level outputs, routing edges) of (name, inputs, outputs) in run order.

    A partition input is fed by the earlier partition that outputs a tensor of that name, else by
    the caller. Without `outputs`, the artifact returns every partition output that no other
    partition consumes. A tensor a partition both takes and returns (ONNX lets a graph output be
    a graph input) is a pass-through: its origin stays upstream. The top-level inputs come in
    the order of `inputs` (the model's), else in the order the partitions first take them.

    ONNX also lets a graph list one tensor as several outputs (onnxruntime returns it at each
    position): a partition or `outputs` may name a tensor twice, which routes it once.
    """
    if not parts:
        raise ValueError("an artifact needs at least one partition")
    producer: dict[str, str] = {}
    seen_names: set[str] = set()
    for name, ins, outs in parts:
        if name in seen_names:
            raise ValueError(f"two partitions are named {name!r}")
        seen_names.add(name)
        for tensor in dict.fromkeys(outs):
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
    if inputs is not None:
        rank = {tensor: i for i, tensor in enumerate(inputs)}
        top_inputs.sort(key=lambda tensor: rank.get(tensor, len(rank)))

    if outputs is None:
        outputs = []
        for name, _, outs in parts:
            for tensor in outs:
                if not consumers.get(tensor, set()) - {name} and tensor not in outputs:
                    outputs.append(tensor)
    outputs = list(outputs)
    if not outputs:
        raise ValueError("the artifact has no outputs")
    for tensor in dict.fromkeys(outputs):
        if tensor not in producer and tensor not in top_inputs:
            raise ValueError(f"output {tensor!r} is produced by no partition")
        routing.append({"tensor": tensor, "from": producer.get(tensor), "to": None})
    return top_inputs, outputs, routing


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str) -> str | None:
    """The sha256 of a file's bytes, read in chunks; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        hash_file_into(digest, path)
    except OSError:
        return None
    return digest.hexdigest()


def hash_file_into(digest, path: str) -> None:
    """Feed a file's bytes to `digest`, a MiB at a time; OSError when it cannot be read."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)


# --- structure checks ----------------------------------------------------------------------


class Malformed(Exception):
    """A problem found in the file; load_om prefixes the path and raises ArtifactError."""


def _field(mapping: dict, key: str, kind: type | tuple, where: str = "manifest") -> Any:
    value = mapping.get(key, _MISSING)
    # JSON gives exact types: the common case costs one comparison (a load runs ~40 of these).
    if type(value) is kind or (type(kind) is tuple and type(value) in kind):
        return value
    return _checked_field(mapping, key, kind, where)


_MISSING = object()


def _checked_field(mapping: dict, key: str, kind: type | tuple, where: str) -> Any:
    if key not in mapping:
        raise Malformed(f"{where} has no {key!r}")
    value = mapping[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise Malformed(f"{where} field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _str_list(mapping: dict, key: str, where: str) -> list[str]:
    value = _field(mapping, key, list, where)
    if not all(isinstance(item, str) for item in value):
        raise Malformed(f"{where} field {key!r} must list strings")
    return value


def _check_signature(entries: list, where: str) -> None:
    for entry in entries:
        if not isinstance(entry, dict):
            raise Malformed(f"manifest {where} entries must be objects")
        _field(entry, "name", str, f"manifest {where} entry")
        dtype = _field(entry, "dtype", (str, type(None)), f"manifest {where} entry")
        if dtype is not None and not known_dtype(dtype):
            raise Malformed(f"manifest {where} entry {entry['name']!r} has unknown dtype {dtype!r}")
        shape = _field(entry, "shape", (list, type(None)), f"manifest {where} entry")
        for dim in shape or []:
            if isinstance(dim, bool) or not isinstance(dim, (int, str, type(None))) \
                    or (isinstance(dim, int) and not 0 <= dim < 2 ** 63):
                raise Malformed(f"manifest {where} entry {entry['name']!r} has a bad dim {dim!r}")
        if not isinstance(entry.get(INDEX_DIMS, []), list):
            raise Malformed(f"manifest {where} entry {entry['name']!r} has a bad {INDEX_DIMS}")
        if INDEX_ROWS in entry:
            rows = entry[INDEX_ROWS]
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 \
                    or dtype not in ("int32", "int64"):  # Gather's index types
                raise Malformed(f"manifest {where} entry {entry['name']!r} has a bad "
                                f"{INDEX_ROWS} {rows!r} (for ids of dtype {dtype})")
        for pair in entry.get(INDEX_DIMS, ()):
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(type(v) is int for v in pair) and pair[0] >= 0 and pair[1] >= 1
                    and dtype is not None  # a tensor's dim: a sequence has none
                    and (shape is None or pair[0] < len(shape))):
                raise Malformed(f"manifest {where} entry {entry['name']!r} has a bad "
                                f"{INDEX_DIMS} entry {pair!r}")


def check_manifest(manifest: dict) -> None:
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
    members = _field(manifest, "members", dict)
    if "details" in manifest and (manifest["details"] != DETAILS_NAME
                                  or DETAILS_NAME not in members):
        raise Malformed(f"manifest details must name the listed member {DETAILS_NAME!r}")
    for name, info in members.items():
        where = f"manifest member {name!r}"
        if not isinstance(info, dict):
            raise Malformed(f"{where} is not an object")
        sha = _field(info, "sha256", str, where)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise Malformed(f"{where} has a malformed sha256")
        size = _field(info, "size", int, where)
        if size < 0:
            raise Malformed(f"{where} has a negative size")
        if "chunk_sha256" in info:
            chunk = _field(info, "chunk_bytes", int, where)
            chunks = _str_list(info, "chunk_sha256", where)
            if chunk < 1 or len(chunks) != -(-size // chunk) or not all(
                    re.fullmatch(r"[0-9a-f]{64}", c) for c in chunks):
                raise Malformed(f"{where} has malformed chunk checksums")
    partitions = _field(manifest, "partitions", list)
    if not partitions:
        raise Malformed("manifest lists no partitions")
    for part in partitions:
        if not isinstance(part, dict):
            raise Malformed("manifest partitions entries must be objects")
        name = _field(part, "name", str, "manifest partition")
        where = f"manifest partition {name!r}"
        if not PARTITION_NAME.match(name):
            raise Malformed(f"{where} has an unsafe name")
        _field(part, "device", str, where)
        _field(part, "member", str, where)
        _str_list(part, "inputs", where)
        _str_list(part, "outputs", where)
        if "providers" in part:
            _str_list(part, "providers", where)
        if part.get("optimization_level", "all") not in OPTIMIZATION_LEVELS:
            raise Malformed(f"{where} has an unknown optimization_level")
        if "disabled_optimizers" in part:
            _str_list(part, "disabled_optimizers", where)
        if "prepack_weights" in part:
            _field(part, "prepack_weights", bool, where)
    order = _str_list(manifest, "execution_order", "manifest")
    names = [p["name"] for p in partitions]
    _check_edges(_field(manifest, "routing", list), "manifest routing")
    _check_requires(manifest)
    if manifest["format_version"] < PROFILES_VERSION or (
            manifest["format_version"] >= REQUIRES_VERSION and "profiles" not in manifest):
        if "profiles" in manifest:
            raise Malformed(f"manifest has profiles, which need format_version {PROFILES_VERSION}")
        orders = [order]
    else:
        orders = _check_profiles(manifest)
        if order != orders[0]:
            raise Malformed("manifest execution_order is not the default (first) profile's")
    listed = [name for names_ in orders for name in names_]
    if sorted(listed) != sorted(names) or len(set(listed)) != len(listed):
        raise Malformed("manifest execution_order must list every partition exactly once"
                        + (" across the profiles" if len(orders) > 1 else ""))


def required_features(manifest: dict) -> list[str]:
    """The FEATURES a manifest (as written) uses, in FEATURES' order."""
    parts = list(manifest.get("partitions", []))
    entries = list(manifest.get("inputs", [])) + [
        e for profile in manifest.get("profiles", []) for e in profile.get("inputs", [])]
    used = {"disabled_optimizers": any(p.get("disabled_optimizers") for p in parts),
            "index_bounds": any(INDEX_ROWS in e or INDEX_DIMS in e for e in entries)}
    return [name for name in FEATURES if used[name]]


def _check_requires(manifest: dict) -> None:
    """A version-3 manifest names the features it uses, each one this reader knows."""
    if manifest["format_version"] < REQUIRES_VERSION:
        if "requires" in manifest:
            raise Malformed(f"manifest lists requires, which need format_version "
                            f"{REQUIRES_VERSION}")
        return
    needed = _str_list(manifest, "requires", "manifest")
    unknown = [name for name in needed if name not in FEATURES]
    if unknown:
        raise Malformed(f"the artifact requires {', '.join(map(repr, unknown))}, which this "
                        "graphopt does not know; upgrade graphopt or recompile the model")


def check_details(details: Any) -> None:
    """Check the structure of the details member (DETAILS_SCHEMA)."""
    if not isinstance(details, dict):
        raise Malformed(f"{DETAILS_NAME} is not a JSON object")
    _field(details, "pass_log", list, DETAILS_NAME)
    _field(details, "extra", dict, DETAILS_NAME)


def _check_edges(routing: list, where: str) -> None:
    for edge in routing:
        if not isinstance(edge, dict):
            raise Malformed(f"{where} entries must be objects")
        _field(edge, "tensor", str, where)
        _field(edge, "from", (str, type(None)), where)
        _field(edge, "to", (str, type(None)), where)


def _fits(own: dict, whole: dict) -> bool:
    """Whether a profile's signature entry is one the artifact's admits: the same dtype, and
    the same rank and numbers where the artifact's dims are numbers."""
    if own["dtype"] != whole["dtype"]:
        return False
    if own["shape"] is None or whole["shape"] is None:
        return True
    return len(own["shape"]) == len(whole["shape"]) and all(
        not isinstance(b, int) or a == b for a, b in zip(own["shape"], whole["shape"]))


def _check_profiles(manifest: dict) -> list[list[str]]:
    """The profiles' structure; returns each one's execution order."""
    profiles = _field(manifest, "profiles", list)
    if not profiles:
        raise Malformed(f"format_version {PROFILES_VERSION} manifest lists no profiles")
    orders, seen = [], set()
    for profile in profiles:
        if not isinstance(profile, dict):
            raise Malformed("manifest profiles entries must be objects")
        name = _field(profile, "name", str, "manifest profile")
        where = f"manifest profile {name!r}"
        if not PARTITION_NAME.match(name) or name in seen:
            raise Malformed(f"{where} has an unsafe or repeated name")
        seen.add(name)
        dims = _field(profile, "dims", dict, where)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in dims.values()):
            raise Malformed(f"{where} dims must be integers")
        order = profile.get("dims_order", list(dims))
        if not (isinstance(order, list) and all(isinstance(key, str) for key in order)
                and sorted(order) == sorted(dims)):
            raise Malformed(f"{where} dims_order must list its dims' keys once each")
        for key in ("inputs", "outputs"):
            _check_signature(_field(profile, key, list, where), f"profile {name!r} {key}")
            if [e["name"] for e in profile[key]] != [e["name"] for e in manifest[key]]:
                raise Malformed(f"{where} {key} are not the artifact's")
            for own, whole in zip(profile[key], manifest[key]):
                if not _fits(own, whole):
                    raise Malformed(f"{where} {key[:-1]} {own['name']!r} is "
                                    f"{own['dtype']}{own['shape']}, which the artifact's "
                                    f"{whole['dtype']}{whole['shape']} does not admit")
        _check_edges(_field(profile, "routing", list, where), f"{where} routing")
        orders.append(_str_list(profile, "execution_order", where))
    return orders


def order_profile_dims(manifest: dict) -> None:
    """Each profile's dims in the order they were given (its dims_order), for a checked
    manifest: JSON with sorted keys stores them sorted."""
    for profile in manifest.get("profiles") or []:
        order = profile.get("dims_order")
        if order is not None:
            profile["dims"] = {key: profile["dims"][key] for key in order}
