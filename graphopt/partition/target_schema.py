"""The target profile format: its JSON Schema (draft 2020-12) and the checker that enforces it.

The checker interprets TARGET_SCHEMA itself, for the small set of keywords the schema uses, so
the documented format and the enforced one cannot drift apart; what a schema cannot say (the
host device must exist, an op sits in one engine, a source names a real figure) is checked by
hand in target.py. No jsonschema dependency.
"""

from __future__ import annotations

import re
from typing import Any

from onnx import TensorProto

from graphopt.codegen.om_manifest import dtype_name

DTYPES = sorted(dtype_name(v) for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)
BUFFERS = ("L0A", "L0B", "L0C", "L1", "UB", "L2")
ENGINE_KINDS = ("cube", "vector", "aicpu", "cpu")

# Figures stay within physical reason, so that no estimate built from them overflows to inf
# or NaN (a bandwidth of 1e-300 bytes/s made every NPU island look free to keep).
_RATE = {"type": "number", "minimum": 1, "maximum": 1e21}
_SECONDS = {"type": "number", "minimum": 0, "maximum": 3600}
_COUNT = {"type": "integer", "minimum": 1, "maximum": 1 << 20}
_BYTES = {"type": "integer", "minimum": 1, "maximum": 1 << 50}
# What an .om partition name may hold: a device's name becomes part of its partitions'.
DEVICE_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"

TARGET_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "graphopt target profile",
    "description": "The devices a compiled model runs on: what each one computes (ops, dtypes, "
                   "constraints per engine), its on-chip buffers and its figures, each figure "
                   "with a source. Rates are per second, sizes in bytes, times in seconds.",
    "type": "object",
    "required": ["schema_version", "name", "primary", "host", "devices"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": 1, "description": "Version of this format; 1."},
        # A kernel signature (tuner/signature.py) starts with it, before a "/".
        "name": {"type": "string", "minLength": 1, "pattern": DEVICE_NAME,
                 "description": "Target name, as given to --target for the built-in profiles: "
                                "letters, digits, _ . - (kernel signatures start with it)."},
        "description": {"type": "string", "description": "One line: the hardware it models."},
        "primary": {"type": "string", "minLength": 1,
                    "description": "Name of the device graphopt places work on first."},
        "host": {"type": "string", "minLength": 1,
                 "description": "Name of the fallback device; it must be the one device of "
                                "kind 'cpu'."},
        "transfer": {"$ref": "#/$defs/transfer"},
        "devices": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/device"},
                    "description": "Every target has exactly one device of kind 'cpu' (the "
                                   "host); an NPU target adds the NPU."},
        "sources": {
            "type": "object", "additionalProperties": {"type": "string", "minLength": 1},
            "description": "Figure key path -> citation, e.g. 'npu.buffers.L0C' or "
                           "'transfer.bandwidth'; '<device>.ops' cites the op table. A figure "
                           "that is derived or estimated says 'derived: …' or 'estimate: …' "
                           "with the reasoning.",
        },
    },
    "$defs": {
        "dtype": {"enum": DTYPES, "description": "A manifest dtype name: float16, float32, "
                                                 "bfloat16, int8, int32, int64, bool, …"},
        "transfer": {
            "type": "object", "required": ["bandwidth", "latency_s"],
            "additionalProperties": False,
            "description": "The host <-> device link; required when a target has two devices.",
            "properties": {
                "bandwidth": {**_RATE, "description": "Bytes per second, one direction."},
                "latency_s": {**_SECONDS, "description": "Fixed cost of one copy, seconds."},
            },
        },
        "device": {
            "type": "object",
            "required": ["name", "kind", "providers", "peak_ops_per_s", "memory_bandwidth",
                         "launch_overhead_s"],
            "additionalProperties": False,
            "description": "One device. Its kernels come either from 'engines' (each engine "
                           "lists its ops) or, on a cpu device only, from 'ops': 'onnxruntime' "
                           "(the installed onnxruntime's CPU kernel registry, read at load "
                           "time); exactly one of the two.",
            "properties": {
                "name": {"type": "string", "minLength": 1, "pattern": DEVICE_NAME,
                         "description": "Device name, unique in the profile ('npu', 'cpu'): "
                                        "letters, digits, '_', '.' and '-'."},
                "kind": {"enum": ["npu", "cpu"], "description": "'npu' or 'cpu'."},
                "providers": {"type": "array", "minItems": 1,
                              "items": {"type": "string", "minLength": 1},
                              "description": "onnxruntime execution providers that run this "
                                             "device's partitions, preferred first."},
                "static_shapes": {"type": "boolean",
                                  "description": "Every tensor of a kernel must have a static "
                                                 "shape (default false; npu only: the cpu "
                                                 "host runs what the others refuse)."},
                "host_ops": {"type": "object",
                             "additionalProperties": {"type": "string", "minLength": 1},
                             "description": "npu only: op key -> why the profile leaves the "
                                            "op to the host although the device may have a "
                                            "kernel for it (a data-dependent result, "
                                            "post-processing); named as the fallback reason."},
                "ops": {"const": "onnxruntime",
                        "description": "cpu only: take the kernels of the installed "
                                       "onnxruntime's CPU provider instead of 'engines'."},
                "engines": {"type": "object", "minProperties": 1,
                            "additionalProperties": {"$ref": "#/$defs/engine"},
                            "description": "Engine name -> its kind and op table."},
                "cube": {"type": "object", "propertyNames": {"$ref": "#/$defs/dtype"},
                         "additionalProperties": {
                             "type": "array", "minItems": 3, "maxItems": 3,
                             "items": {**_COUNT, "maximum": 4096}},
                         "description": "dtype -> [M, K, N] of one cube instruction."},
                "buffers": {"type": "object", "additionalProperties": False,
                            "properties": {b: {**_BYTES, "description": f"{b} size, bytes."}
                                           for b in BUFFERS},
                            "description": "On-chip buffer sizes per AI core, bytes."},
                "ai_cores": {"type": ["integer", "null"], "minimum": 1, "maximum": 1 << 20,
                             "description": "AI (DaVinci) cores; null when not applicable."},
                "aicpu_cores": {"type": ["integer", "null"], "minimum": 0, "maximum": 1 << 20,
                                "description": "CPU cores that run AI CPU operators."},
                "clock_hz": {"type": ["number", "null"], "minimum": 1, "maximum": 1e12,
                             "description": "AI core (cube) clock, Hz."},
                "peak_ops_per_s": {"type": "object", "minProperties": 1,
                                   "propertyNames": {"$ref": "#/$defs/dtype"},
                                   "additionalProperties": _RATE,
                                   "description": "dtype -> peak operations per second "
                                                  "(a multiply-add counts two)."},
                "memory_bandwidth": {**_RATE, "description": "Device memory, bytes/s."},
                "launch_overhead_s": {**_SECONDS,
                                      "description": "Fixed cost of one kernel, seconds."},
                "nchwc_block_size": {
                    "anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 0,
                                                  "maximum": 64}],
                    "description": "cpu only: onnxruntime's NCHWc channel block (16 with "
                                   "AVX-512F, 8 with AVX2, 0 = no NCHWc); 'auto' reads the "
                                   "flags of the CPU graphopt runs on."},
            },
        },
        "engine": {
            "type": "object", "required": ["kind", "ops"], "additionalProperties": False,
            "properties": {
                "kind": {"enum": list(ENGINE_KINDS),
                         "description": "'cube' (AI Core matrix unit), 'vector' (AI Core "
                                        "vector unit), 'aicpu' (AI CPU) or 'cpu'."},
                "defaults": {"$ref": "#/$defs/op_defaults"},
                "ops": {"type": "object", "additionalProperties": {"$ref": "#/$defs/op"},
                        "description": "Op key -> constraints: 'Conv' in the default domain, "
                                       "'com.microsoft::FusedConv' elsewhere."},
            },
        },
        "op_defaults": {
            "type": "object", "additionalProperties": False,
            "description": "Constraints every op of the engine has unless it says otherwise.",
            "properties": {
                "dtypes": {"$ref": "#/$defs/dtypes"},
                "max_rank": {"type": ["integer", "null"], "minimum": 1, "maximum": 64,
                             "description": "Highest rank of any tensor; null = no limit."},
            },
        },
        "op": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "dtypes": {"$ref": "#/$defs/dtypes"},
                "max_rank": {"type": ["integer", "null"], "minimum": 1, "maximum": 64,
                             "description": "Highest rank of any tensor; null = no limit."},
                "attributes": {"type": "object",
                               "additionalProperties": {"type": "array", "minItems": 1},
                               "description": "Attribute -> the values the kernel takes; an "
                                              "attribute not named takes any value."},
                "head_size": {
                    "type": "object", "additionalProperties": False, "minProperties": 1,
                    "properties": {
                        "max": {"type": "integer", "minimum": 1, "maximum": 1 << 20,
                                "description": "The largest head size the kernel takes."},
                        "multiple_of": {"type": "integer", "minimum": 1, "maximum": 1 << 10,
                                        "description": "Head sizes are multiples of it."}},
                    "description": "A fused attention kernel's head sizes (of Q and K, and of "
                                   "V): at most `max`, a multiple of `multiple_of` (CANN's "
                                   "FusedInferAttentionScore: 512, 16)."},
                "absent_inputs": {
                    "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 64},
                    "uniqueItems": True, "minItems": 1,
                    "description": "Indices of optional inputs the kernel has no operand for: "
                                   "a node that gives one stays on the host (MatMulNBits' "
                                   "g_idx, 4)."},
                "attribute_ranges": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "number"},
                                             "minItems": 2, "maxItems": 2},
                    "description": "Attribute -> [lowest, highest] value the kernel takes, "
                                   "both included (MatMulNBits' N: CANN's weight-quantized "
                                   "GEMM takes up to 65535 output columns)."},
                "rank_attributes": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "additionalProperties": {"type": "array", "minItems": 1}},
                    "description": "Data input rank -> attribute -> the values the kernel "
                                   "takes at that rank, in place of `attributes`' (Resize: "
                                   "5-D linear only)."},
                "max_outputs": {"type": "integer", "minimum": 1,
                                "description": "How many of the op's outputs the kernel "
                                               "computes; a node that uses a later one "
                                               "(MaxPool's Indices) stays on the host."},
                "engine_for": {"type": "object", "propertyNames": {"$ref": "#/$defs/dtype"},
                               "additionalProperties": {"type": "string", "minLength": 1},
                               "description": "dtype -> another engine of the device that runs "
                                              "the op for that dtype (int64 on the AI CPU)."},
                "note": {"type": "string",
                         "description": "Why and how: the CANN kernel it maps to, caveats."},
            },
        },
        "dtypes": {"type": "array", "items": {"$ref": "#/$defs/dtype"}, "uniqueItems": True,
                   "minItems": 1,
                   "description": "dtypes of the op's data input and output; absent = any "
                                  "(an empty list, which could mean none, is refused: leave "
                                  "the op out of the table to give it no kernel)."},
    },
}

# The keywords check() interprets; a test keeps TARGET_SCHEMA within them.
KEYWORDS = {"$schema", "$ref", "$defs", "title", "description", "type", "properties", "required",
            "additionalProperties", "propertyNames", "items", "minItems", "maxItems",
            "uniqueItems", "minProperties", "minLength", "enum", "const", "minimum",
            "maximum", "exclusiveMinimum", "anyOf", "pattern"}


class SchemaViolation(Exception):
    """`path: problem`, for the loader to prefix with the file name."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path or '(top level)'}: {problem}")
        self.path, self.problem = path, problem


def check(doc: Any, schema: dict = TARGET_SCHEMA) -> None:
    """Raise SchemaViolation at the first place `doc` breaks `schema` (document order)."""
    _check(doc, schema, "", TARGET_SCHEMA)


def key_path(base: str, key: str) -> str:
    """`base.key`, quoting keys that a dot would make ambiguous ("com.microsoft::Gelu")."""
    if re.fullmatch(r"[A-Za-z_$][\w$]*", key):
        return f"{base}.{key}" if base else key
    return f'{base}["{key}"]'


def _check(value: Any, schema: dict, path: str, root: dict) -> None:
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), path, root)
    if "anyOf" in schema and not any(_passes(value, alt, root) for alt in schema["anyOf"]):
        choices = " or ".join(_describe(a) for a in schema["anyOf"])
        raise SchemaViolation(path, f"expected {choices}, got {_show(value)}")
    if "const" in schema and not _equals(value, schema["const"]):
        raise SchemaViolation(path, f"expected {_describe(schema)}, got {_show(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaViolation(path, f"expected one of {', '.join(map(str, schema['enum']))}, "
                                    f"got {_show(value)}")
    if "type" in schema and not _type_ok(value, schema["type"]):
        raise SchemaViolation(path, f"expected {_describe(schema)}, got {_show(value)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaViolation(path, f"expected {_describe(schema)}, got {_show(value)}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            raise SchemaViolation(path, f"expected {_describe(schema)}, got {_show(value)}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaViolation(path, f"expected {_describe(schema)}, got {_show(value)}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        raise SchemaViolation(path, "expected a non-empty string")
    if isinstance(value, str) and "pattern" in schema \
            and not re.fullmatch(schema["pattern"], value):
        raise SchemaViolation(path, f"{_show(value)} may hold only letters, digits, '_', '.' "
                                    "and '-' (not first)")
    if isinstance(value, list):
        _check_array(value, schema, path, root)
    if isinstance(value, dict):
        _check_object(value, schema, path, root)


def _check_array(value: list, schema: dict, path: str, root: dict) -> None:
    if len(value) < schema.get("minItems", 0):
        raise SchemaViolation(path, f"expected at least {schema['minItems']} item(s), "
                                    f"got {len(value)}")
    if len(value) > schema.get("maxItems", len(value)):
        raise SchemaViolation(path, f"expected at most {schema['maxItems']} items, "
                                    f"got {len(value)}")
    if schema.get("uniqueItems"):
        seen = []
        for item in value:
            if item in seen:
                raise SchemaViolation(path, f"{_show(item)} is listed twice")
            seen.append(item)
    if "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", root)


def _check_object(value: dict, schema: dict, path: str, root: dict) -> None:
    for key in schema.get("required", ()):
        if key not in value:
            raise SchemaViolation(path, f"missing key '{key}'")
    if len(value) < schema.get("minProperties", 0):
        raise SchemaViolation(path, "expected a non-empty object")
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        where = key_path(path, key)
        if "propertyNames" in schema and not _passes(key, schema["propertyNames"], root):
            raise SchemaViolation(where, f"'{key}' is not a {_describe(schema['propertyNames'])}")
        if key in properties:
            _check(item, properties[key], where, root)
        elif extra is False:
            known = ", ".join(properties)
            raise SchemaViolation(where, f"unknown key '{key}' (known: {known})")
        elif isinstance(extra, dict):
            _check(item, extra, where, root)


def _passes(value: Any, schema: dict, root: dict) -> bool:
    try:
        _check(value, schema, "", root)
    except SchemaViolation:
        return False
    return True


def _resolve(ref: str, root: dict) -> dict:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


_TYPE_NAMES = {"object": "an object", "array": "an array", "string": "a string",
               "integer": "an integer", "number": "a number", "boolean": "true or false",
               "null": "null"}


_PYTHON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool,
                 "null": type(None)}


def _equals(value: Any, const: Any) -> bool:
    """JSON's equality: 1.0 is 1 (one number type), true is not 1, "1" is not 1."""
    if isinstance(const, bool) or isinstance(value, bool):
        return value is const
    if isinstance(const, (int, float)):
        return isinstance(value, (int, float)) and value == const
    return type(value) is type(const) and value == const


def _type_ok(value: Any, types: str | list[str]) -> bool:
    # JSON has one number type: 3.0 is an integer, and true is not a number.
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    for t in [types] if isinstance(types, str) else types:
        if t in _PYTHON_TYPES and isinstance(value, _PYTHON_TYPES[t]):
            return True
        if is_number and (t == "number" or t == "integer" and (
                isinstance(value, int) or value.is_integer())):  # float() of 10**400 overflows
            return True
    return False


def _describe(schema: dict) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return {"dtype": "dtype name (float16, float32, int8, …)"}.get(name, name)
    if "const" in schema:
        return _show(schema["const"])
    types = schema.get("type", "value")
    types = [types] if isinstance(types, str) else list(types)
    text = " or ".join(_TYPE_NAMES.get(t, t) for t in types if t != "null")
    if "exclusiveMinimum" in schema:
        text += f" > {schema['exclusiveMinimum']}"
    elif "minimum" in schema:
        text += f" ≥ {schema['minimum']}"
    if "maximum" in schema:
        top = schema["maximum"]
        text += f" and ≤ {top if isinstance(top, int) else format(top, 'g')}"
    return text + (" or null" if "null" in types else "")


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}… ({len(text)} digits)"
