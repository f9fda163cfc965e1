"""Target profiles: the devices a compiled model runs on, loaded from shipped or user JSON files.

A profile (format: target_schema.TARGET_SCHEMA) names a primary device, on which graphopt places
work first, and the host CPU it falls back to. Every target has exactly one device of kind
"cpu", the host; a single-device target (`cpu`) is its own primary and host. An NPU device
lists its kernels per engine (cube, vector, AI CPU) with the dtypes and constraints each takes;
a cpu device may instead say `"ops": "onnxruntime"` and gets the installed onnxruntime's CPU
kernel table. Any problem with a profile is an OptionError naming the file and the key at fault.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from graphopt.errors import OptionError, UsageError
from graphopt.frozen_map import FrozenMap
from graphopt.option_names import option, setting
from graphopt.partition.target_ort import nchwc_block_size, op_key, ort_cpu_kernels
from graphopt.partition.target_schema import SchemaViolation, check, key_path

_FROZEN: Mapping = FrozenMap({})


@dataclass(frozen=True)
class OpSupport:
    op: str                          # "Conv"; "com.microsoft::FusedConv" outside the default domain
    engine: str                      # engine name within the device
    dtypes: frozenset[str]           # accepted dtypes of the data input/output; empty = any
    max_rank: int | None
    attributes: Mapping[str, tuple]  # attribute name -> allowed values
    note: str | None
    dtype_engines: Mapping[str, str] = field(default_factory=dict)  # dtype -> engine (int64)
    max_outputs: int | None = None   # outputs the kernel computes (MaxPool: not its Indices)
    # data input rank -> attribute -> the values taken at that rank (Resize: 5-D linear only)
    rank_attributes: Mapping[int, Mapping[str, tuple]] = field(default_factory=dict)
    # attribute -> (lowest, highest) value taken, both included (MatMulNBits' N ≤ 65535)
    attribute_ranges: Mapping[str, tuple] = field(default_factory=dict)
    absent_inputs: tuple[int, ...] = ()  # optional inputs the kernel has no operand for
    head_size: Mapping[str, int] = field(default_factory=dict)  # attention: max, multiple_of

    def attributes_at(self, rank: int | None) -> Mapping[str, tuple]:
        """The attribute values the kernel takes for a data input of `rank`."""
        if rank is None or rank not in self.rank_attributes:
            return self.attributes
        return {**self.attributes, **self.rank_attributes[rank]}


@dataclass(frozen=True, eq=False)
class Device:
    name: str                        # "npu" / "cpu"
    kind: str                        # "npu" | "cpu"
    providers: tuple[str, ...]       # onnxruntime execution providers, preferred first
    static_shapes_only: bool
    engines: Mapping[str, str]       # engine name -> kind
    cube: Mapping[str, tuple[int, int, int]] | None  # dtype -> (M, K, N)
    buffers: Mapping[str, int]       # "L0A", "L0B", "L0C", "L1", "UB" -> bytes
    ai_cores: int | None
    aicpu_cores: int | None
    clock_hz: float | None
    peak_ops_per_s: Mapping[str, float]  # dtype -> ops/s
    memory_bandwidth: float          # bytes/s
    launch_overhead_s: float
    nchwc_block_size: int            # cpu only; 0 = no NCHWc
    kernels: Mapping[str, OpSupport] = field(default_factory=dict, repr=False)  # op key -> support
    kernel_source: str = "profile"   # "profile", or "onnxruntime" for the installed CPU table
    nchwc_auto: bool = False         # nchwc_block_size was "auto": this CPU's, read at load
    host_ops: Mapping[str, str] = field(default_factory=dict)  # op key -> why it stays on host

    def kernel(self, op: str, domain: str = "", dtype: str | None = None) -> OpSupport | None:
        """The device's kernel for `op` (None: it has none); with `dtype`, on the engine that
        runs that dtype."""
        support = self.kernels.get(op_key(op, domain))
        if support is not None and dtype in support.dtype_engines:
            return replace(support, engine=support.dtype_engines[dtype])
        return support

    def has_kernel(self, op: str, domain: str, dtype: str | None) -> bool:
        support = self.kernels.get(op_key(op, domain))
        return support is not None and (dtype is None or not support.dtypes
                                        or dtype in support.dtypes)

    def on_cube(self, op: str, domain: str = "", dtype: str | None = None) -> bool:
        """Whether the device runs `op` (on data of `dtype`, whose engine_for may name another
        engine) on a cube engine: a profile may list Conv or MatMul on its vector engine, where
        it gets no tiling and no fractal formats."""
        support = self.kernel(op, domain, dtype)
        return support is not None and self.engines.get(support.engine) == "cube"

    def engine_ops(self, engine: str) -> list[OpSupport]:
        """The kernels whose home engine is `engine`, by op key."""
        return [s for _, s in sorted(self.kernels.items()) if s.engine == engine]


@dataclass(frozen=True, eq=False)
class Target:
    name: str
    description: str
    path: str                        # the file it came from
    devices: tuple[Device, ...]
    primary: str                     # the device graphopt places work on first
    host: str                        # the fallback device (the cpu)
    transfer_bandwidth: float        # host <-> device bytes/s; 0 on a single-device target
    transfer_latency_s: float
    sources: Mapping[str, str]       # figure key path -> citation

    @property
    def shown(self) -> str:
        """The name messages give: a profile file named like a built-in target says which file,
        so that a refusal is not read as the built-in's."""
        if self.name in builtin_targets() and not is_builtin(self):
            return f"{self.name} (profile file {os.path.basename(self.path)})"
        return self.name

    def device(self, name: str) -> Device:
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(f"target {self.shown} has no device '{name}' "
                       f"(devices: {', '.join(d.name for d in self.devices)})")

    def figures(self) -> dict[str, Any]:
        """Every figure of the profile by key path ("npu.buffers.L0C", "transfer.bandwidth"),
        the keys `sources` cites."""
        out: dict[str, Any] = {}
        for d in self.devices:
            for key in ("ai_cores", "aicpu_cores", "clock_hz"):
                if getattr(d, key) is not None:
                    out[f"{d.name}.{key}"] = getattr(d, key)
            out.update({f"{d.name}.peak_ops_per_s.{t}": v for t, v in d.peak_ops_per_s.items()})
            out[f"{d.name}.memory_bandwidth"] = d.memory_bandwidth
            out[f"{d.name}.launch_overhead_s"] = d.launch_overhead_s
            out.update({f"{d.name}.buffers.{b}": v for b, v in d.buffers.items()})
            out.update({f"{d.name}.cube.{t}": v for t, v in (d.cube or {}).items()})
            if d.kind == "cpu":
                out[f"{d.name}.nchwc_block_size"] = d.nchwc_block_size
        if len(self.devices) > 1:
            out["transfer.bandwidth"] = self.transfer_bandwidth
            out["transfer.latency_s"] = self.transfer_latency_s
        return out


def builtin_targets() -> list[str]:
    """Sorted names of the shipped profiles."""
    return sorted(p.name[:-5] for p in _targets_dir().iterdir() if p.name.endswith(".json"))


def load_target(name_or_path: str | os.PathLike) -> Target:
    """A built-in target by name ("ascend310"), or a profile file ("my_target.json")."""
    text = os.fspath(name_or_path)
    if not text.strip():  # an unset shell variable: "…: unknown target" named nothing
        raise OptionError(f"{option('target')}: no target named (built-in: "
                          f"{', '.join(builtin_targets())}; or give a profile .json file)")
    if text in builtin_targets():
        return _load_builtin(text)
    if text.lower() in builtin_targets() and not os.path.exists(text):
        return _load_builtin(text.lower())  # ATC's spelling of the chip: Ascend310
    if text.endswith(".json") or os.sep in text or os.path.exists(text):
        target = _load_file(text, text)
        _check_op_names(target, text)  # the shipped profiles' are checked by the tests
        return target
    import difflib

    near = difflib.get_close_matches(text.lower(), builtin_targets(), n=1, cutoff=0.8)
    hint = f"did you mean {near[0]}? " if near else ""
    raise UsageError(f"{setting('target', text)}: unknown target ({hint}built-in: "
                      f"{', '.join(builtin_targets())}; or give a profile .json file)")


# --- loading -------------------------------------------------------------------------------


def is_builtin(target: "Target") -> bool:
    """Whether `target` is the shipped profile of its name, not a user's file named so."""
    return target.name in builtin_targets() and target.path == _load_builtin(target.name).path


def as_given(target: "Target") -> str:
    """What --target takes for `target`: a built-in's name, a custom profile's file."""
    return target.name if is_builtin(target) else target.path


def _targets_dir():
    return resources.files("graphopt.partition") / "targets"


@functools.cache
def _load_builtin(name: str) -> Target:
    with resources.as_file(_targets_dir() / f"{name}.json") as path:
        return _load_file(os.fspath(path), name)


_MAX_PROFILE_BYTES = 64 << 20  # characters: a profile listing every op is a few MB


def _load_file(path: str, label: str) -> Target:
    try:
        # utf-8-sig: a byte order mark (Windows Notepad writes one) is read past.
        with open(path, encoding="utf-8-sig") as f:
            text = f.read(_MAX_PROFILE_BYTES + 1)
        if len(text) > _MAX_PROFILE_BYTES:  # /dev/zero, or a wrong file, read without end
            raise OptionError(f"{setting('target', label)}: larger than "
                              f"{_MAX_PROFILE_BYTES >> 20} MiB, more than a target profile holds")
    except UnicodeDecodeError:
        raise OptionError(f"{setting('target', label)}: not UTF-8 text") from None
    except OSError as e:
        raise OptionError(f"{setting('target', label)}: cannot read it: {e.strerror or e}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise OptionError(f"{setting('target', label)}: not valid JSON: {e.msg} "
                          f"(line {e.lineno}, column {e.colno})") from None
    except ValueError as e:
        raise OptionError(f"{setting('target', label)}: not valid JSON: {e}") from None
    except RecursionError:
        raise OptionError(f"{setting('target', label)}: nested too deeply to be a target "
                          "profile") from None
    try:
        check(doc)
        return _build(doc, os.path.abspath(path))
    except SchemaViolation as e:
        raise OptionError(f"{setting('target', label)}: {e}") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    # json keeps the last of two equal keys silently; in a profile that hides a typo'd edit.
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key '{key}' appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a profile can use")


def _build(doc: dict, path: str) -> Target:
    devices = tuple(_device(d, f"devices[{i}]") for i, d in enumerate(doc["devices"]))
    names = [d.name for d in devices]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SchemaViolation(f"devices[{i}].name", f"a second device named '{name}'")
    cpus = [d.name for d in devices if d.kind == "cpu"]
    for i, device in enumerate(devices):
        # The runtime, the advisor and the pre-packing choice take a partition of a device
        # named cpu for one the CPU provider runs: an NPU of that name would lose its provider.
        if device.name == "cpu" and device.kind != "cpu":
            raise SchemaViolation(f"devices[{i}].name", f"'cpu' names the host; a device of "
                                                        f"kind '{device.kind}' needs another name")
    if len(cpus) != 1:
        raise SchemaViolation("devices", f"needs exactly one device of kind 'cpu' (the host), "
                                         f"found {len(cpus)}")
    if doc["host"] != cpus[0]:
        raise SchemaViolation("host", f"must name the cpu device '{cpus[0]}', got '{doc['host']}'")
    if doc["primary"] not in names:
        raise SchemaViolation("primary", f"no device named '{doc['primary']}' "
                                         f"(devices: {', '.join(names)})")
    transfer = doc.get("transfer")
    if len(devices) > 1 and transfer is None:
        raise SchemaViolation("transfer", "missing: a target with two devices needs the "
                                          "host <-> device link")
    if len(devices) == 1 and transfer is not None:  # it would be dropped without a word
        raise SchemaViolation("transfer", "a target of one device has no host <-> device "
                                          "link: remove it")
    target = Target(
        name=doc["name"], description=doc.get("description", ""), path=path, devices=devices,
        primary=doc["primary"], host=doc["host"],
        transfer_bandwidth=float(transfer["bandwidth"]) if transfer else 0.0,
        transfer_latency_s=float(transfer["latency_s"]) if transfer else 0.0,
        sources=FrozenMap(dict(doc.get("sources", {}))))
    citable = set(target.figures()) | {f"{d.name}.ops" for d in devices}
    for key in target.sources:
        if key not in citable:
            raise SchemaViolation(key_path("sources", key), "cites no figure of this profile")
    return target


def _device(doc: dict, where: str) -> Device:
    kind = doc["kind"]
    if ("ops" in doc) == ("engines" in doc):
        raise SchemaViolation(where, "needs exactly one of 'engines' (ops listed per engine) or "
                                     "'ops': 'onnxruntime'")
    if "ops" in doc and kind != "cpu":
        raise SchemaViolation(f"{where}.ops",
                              "only a cpu device takes its kernels from onnxruntime")
    if "nchwc_block_size" in doc and kind != "cpu":
        raise SchemaViolation(f"{where}.nchwc_block_size", "only a cpu device has an NCHWc block")
    if doc.get("static_shapes") and kind == "cpu":
        # The host takes every node the other devices refuse, dynamic shapes among them:
        # nothing is left to run a node it would refuse too.
        raise SchemaViolation(f"{where}.static_shapes", "the cpu device is the host, which "
                                                        "runs every node the others cannot, "
                                                        "dynamic shapes included: only an npu "
                                                        "device takes true")
    if "ops" in doc:
        engines = {"cpu": "cpu"}
        kernels = {key: OpSupport(key, "cpu", dtypes, None, _FROZEN, None)
                   for key, dtypes in ort_cpu_kernels().items()}
    else:
        engines = {name: e["kind"] for name, e in doc["engines"].items()}
        kernels = _kernels(doc["engines"], engines, f"{where}.engines")
    # A cube engine's kernels are tiled against the cube's shape and the on-chip buffers.
    if "cube" in engines.values():
        for key in ("cube", "buffers", "ai_cores", "clock_hz"):
            if doc.get(key) is None:
                raise SchemaViolation(f"{where}.{key}", "missing or null: a device with a cube "
                                                        "engine needs it")
        if "float16" not in doc["cube"]:  # the shape tiling takes for a dtype not listed
            raise SchemaViolation(f"{where}.cube", "needs a 'float16' entry, the cube shape of "
                                                   "any dtype without one of its own")
        for buffer in ("L0A", "L0B", "L0C", "L1", "UB"):
            if buffer not in doc["buffers"]:
                raise SchemaViolation(f"{where}.buffers.{buffer}", "missing: a device with a "
                                                                   "cube engine needs it")
        _check_smallest_tiles(doc, where)
    host_ops = _host_ops(doc, kernels, f"{where}.host_ops")
    block = doc.get("nchwc_block_size", 0)
    if block not in ("auto", 0, 8, 16):  # MLAS's NCHWc kernels exist for these blocks only
        raise SchemaViolation(f"{where}.nchwc_block_size", f"expected 'auto', 0 (no NCHWc), 8 "
                                                          f"(AVX2) or 16 (AVX-512F), got {block}")
    return Device(
        name=doc["name"], kind=kind, providers=tuple(doc["providers"]),
        static_shapes_only=doc.get("static_shapes", False),
        engines=FrozenMap(engines),
        # JSON's 2.0 is an integer to the schema; the tiling code wants Python ints.
        cube=FrozenMap({t: tuple(int(d) for d in mkn) for t, mkn in doc["cube"].items()})
        if doc.get("cube") is not None else None,
        buffers=FrozenMap({b: int(v) for b, v in doc.get("buffers", {}).items()}),
        ai_cores=_int_or_none(doc.get("ai_cores")),
        aicpu_cores=_int_or_none(doc.get("aicpu_cores")),
        clock_hz=doc.get("clock_hz"),
        peak_ops_per_s=FrozenMap({t: float(v) for t, v in doc["peak_ops_per_s"].items()}),
        memory_bandwidth=float(doc["memory_bandwidth"]),
        launch_overhead_s=float(doc["launch_overhead_s"]),
        nchwc_block_size=nchwc_block_size() if block == "auto" else int(block),
        nchwc_auto=block == "auto",
        kernels=FrozenMap(kernels),
        kernel_source="onnxruntime" if "ops" in doc else "profile",
        host_ops=FrozenMap(host_ops))


def _host_ops(doc: dict, kernels: dict, where: str) -> dict[str, str]:
    """The ops the profile leaves to the host on purpose, each with why; an npu's only, and
    none that an engine lists too (the table would both run and refuse it)."""
    host_ops = doc.get("host_ops", {})
    if host_ops and doc["kind"] != "npu":
        raise SchemaViolation(where, "only an npu device leaves ops to the host")
    for key in host_ops:
        problem = _op_key_problem(key)
        if problem:
            raise SchemaViolation(key_path(where, key), problem)
        if key in kernels:
            raise SchemaViolation(key_path(where, key),
                                  f"also listed under engine '{kernels[key].engine}'")
    return dict(host_ops)


def _op_key_problem(key: str) -> str | None:
    """What is wrong with an op key of a profile ('Op' or 'domain::Op'), or None."""
    domain, _, name = key.rpartition("::")
    if not name or "::" in domain or key.startswith("::"):
        return "an op key is 'Op' or 'domain::Op'"
    if domain in ("", "ai.onnx") and key != name:
        return f"write the default-domain op as '{name}'"
    return None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _check_smallest_tiles(doc: dict, where: str) -> None:
    """Every cube kernel needs at least one cube-sized tile in each on-chip buffer (no double
    buffering, one K-step in L1): a profile whose buffers cannot hold it would be refused by
    every tiling the compiler or the tuner tries."""
    from graphopt.tuner.tiling import GemmShape, Tiling, buffer_use

    for dtype, (m, k, n) in doc["cube"].items():
        smallest = Tiling(m, n, k, l1_depth=1, double_buffer=False)
        for buffer, need in buffer_use(smallest, GemmShape(1, m, k, n, dtype)).items():
            have = doc["buffers"][buffer]
            if need > have:
                raise SchemaViolation(f"{where}.buffers.{buffer}",
                                      f"{have} bytes cannot hold the smallest {dtype} tile "
                                      f"({m}x{k}x{n} needs {need} bytes)")


@functools.cache
def known_ops() -> dict[str, frozenset[str]]:
    """Every op key ('Op', 'domain::Op') ONNX or the installed onnxruntime has a schema for,
    with the attribute names of any of its versions."""
    import onnx
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    names: dict[str, set[str]] = {}
    for schema in [*onnx.defs.get_all_schemas_with_history(), *ort_c.get_all_operator_schema()]:
        names.setdefault(op_key(schema.name, schema.domain), set()).update(schema.attributes)
    return {key: frozenset(attributes) for key, attributes in names.items()}


@functools.cache
def attribute_kinds() -> dict[str, dict[str, set[str]]]:
    """Per op key, the ONNX attribute types ("INT", "FLOATS", …) each attribute has in any of
    its schemas' versions."""
    import onnx
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    kinds: dict[str, dict[str, set[str]]] = {}
    for schema in [*onnx.defs.get_all_schemas_with_history(), *ort_c.get_all_operator_schema()]:
        of_op = kinds.setdefault(op_key(schema.name, schema.domain), {})
        for name, attribute in schema.attributes.items():
            of_op.setdefault(name, set()).add(attribute.type.name)
    return kinds


def _is_kind(value, kind: str) -> bool:
    """Whether a profile's allowed value (JSON, lists as tuples) has ONNX attribute type
    `kind`; a type a profile cannot spell (TENSOR, GRAPH) takes anything."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    # An INT attribute is an int64: a bound past it (2**70) matched every node, shown as 1.2e21.
    single = {"INT": lambda v: number(v) and float(v).is_integer() and -2 ** 63 <= v < 2 ** 63,
              "FLOAT": number, "STRING": lambda v: isinstance(v, str)}
    if kind in single:
        return single[kind](value)
    if kind.endswith("S") and kind[:-1] in single:
        return isinstance(value, (list, tuple)) and all(single[kind[:-1]](v) for v in value)
    return True


def _check_op_names(target: Target, label: str) -> None:
    """Refuse an op key no schema defines, or an attribute its schema does not have: a typo
    ('Reluu', 'storage_ordr') would silently match nothing."""
    for i, device in enumerate(target.devices):
        if device.kernel_source != "profile":
            continue
        for key, support in device.kernels.items():
            where = key_path(f"devices[{i}].engines.{support.engine}.ops", key)
            if key not in known_ops():
                raise OptionError(f"{setting('target', label)}: {where}: no ONNX or onnxruntime op of "
                                  "that name")
            limits = [(key_path(f"{where}.attributes", name), name, values)
                      for name, values in support.attributes.items()]
            limits += [(key_path(f"{where}.rank_attributes.{rank}", name), name, values)
                       for rank, of_rank in support.rank_attributes.items()
                       for name, values in of_rank.items()]
            limits += [(key_path(f"{where}.attribute_ranges", name), name, bounds)
                       for name, bounds in support.attribute_ranges.items()]
            for at, name, values in limits:
                if name not in known_ops()[key]:
                    has = ", ".join(sorted(known_ops()[key])) or "none"
                    raise OptionError(f"{setting('target', label)}: {at}: {key} has no "
                                      f"attribute of that name (it has: {has})")
                kinds = attribute_kinds()[key].get(name, set())
                for j, value in enumerate(values):
                    if kinds and not any(_is_kind(value, kind) for kind in kinds):
                        # A value of another type matches no node: `"1"` for an INT group
                        # made every Conv fall back, its reason reading like a real mismatch.
                        raise OptionError(
                            f"{setting('target', label)}: {at}[{j}]: {key}'s {name} is "
                            f"{' or '.join(sorted(kinds))}, got {value!r}")


def _kernels(doc: dict, engines: dict[str, str], where: str) -> dict[str, OpSupport]:
    kernels: dict[str, OpSupport] = {}
    for engine, spec in doc.items():
        defaults = spec.get("defaults", {})
        for key, op in spec["ops"].items():
            at = key_path(key_path(key_path(where, engine), "ops"), key)
            problem = _op_key_problem(key)
            if problem:
                raise SchemaViolation(at, problem)
            if key in kernels:
                raise SchemaViolation(at, f"also listed under engine '{kernels[key].engine}'")
            dtypes = op.get("dtypes", defaults.get("dtypes", ()))
            for dtype, other in op.get("engine_for", {}).items():
                if other not in engines:
                    raise SchemaViolation(key_path(f"{at}.engine_for", dtype),
                                          f"no engine '{other}' (engines: {', '.join(engines)})")
                if dtypes and dtype not in dtypes:  # the table would offer what it refuses
                    raise SchemaViolation(key_path(f"{at}.engine_for", dtype),
                                          f"not one of the op's dtypes ({', '.join(dtypes)})")
            for name, (low, high) in op.get("attribute_ranges", {}).items():
                if low > high:
                    raise SchemaViolation(key_path(f"{at}.attribute_ranges", name),
                                          f"the lowest value {low} is above the highest {high}")
            for rank in op.get("rank_attributes", {}):
                if not (rank.isdigit() and 1 <= int(rank) <= 64):  # a JSON key is a string
                    raise SchemaViolation(key_path(f"{at}.rank_attributes", rank),
                                          "a rank is a whole number from 1 to 64")
            kernels[key] = OpSupport(
                op=key, engine=engine,
                dtypes=frozenset(dtypes),
                max_rank=_int_or_none(op.get("max_rank", defaults.get("max_rank"))),
                attributes=FrozenMap({a: tuple(_hashable(v) for v in values)
                                      for a, values in op.get("attributes", {}).items()}),
                note=op.get("note"),
                dtype_engines=FrozenMap(dict(op.get("engine_for", {}))),
                max_outputs=_int_or_none(op.get("max_outputs")),
                rank_attributes=FrozenMap({
                    int(rank): FrozenMap({a: tuple(_hashable(v) for v in values)
                                          for a, values in limits.items()})
                    for rank, limits in op.get("rank_attributes", {}).items()}),
                attribute_ranges=FrozenMap({a: tuple(bounds) for a, bounds
                                            in op.get("attribute_ranges", {}).items()}),
                absent_inputs=tuple(int(i) for i in op.get("absent_inputs", ())),
                head_size=FrozenMap({k: int(v) for k, v in op.get("head_size", {}).items()}))
    return kernels


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
