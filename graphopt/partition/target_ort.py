"""The host CPU's kernel table, read from the installed onnxruntime, and its NCHWc block size.

A cpu device that says `"ops": "onnxruntime"` gets exactly the kernels the installed onnxruntime
registers for CPUExecutionProvider, so the table can never drift from the runtime that will
execute the partition. An op's dtypes are those its kernels bind to the type parameter of the
op's first input and first output (for FusedConv, T = float: no float16 kernel).

An ONNX op that onnxruntime has no kernel for but defines by a function body (HardSwish is
HardSigmoid and Mul) runs too: the session inlines the body. Such an op is in the table with
the dtypes every op of its body has a kernel for; one whose body depends on the node
(GroupNormalization's) is not, since its ops cannot be listed ahead.
"""

from __future__ import annotations

import functools
import platform

from graphopt.partition.target_schema import DTYPES

CPU_PROVIDER = "CPUExecutionProvider"


def op_key(op: str, domain: str = "") -> str:
    """The kernel-table key: "Conv" in the default domain, "com.microsoft::FusedConv" elsewhere."""
    return op if domain in ("", "ai.onnx") else f"{domain}::{op}"


@functools.cache
def ort_cpu_kernels() -> dict[str, frozenset[str]]:
    """Op key -> dtypes of the op's data input/output over all its CPU kernels (empty = any)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    params = _data_type_params(ort_c.get_all_operator_schema())
    table: dict[str, set[str]] = {}
    for kernel in ort_c.get_all_opkernel_def():
        if kernel.provider != CPU_PROVIDER:
            continue
        key = op_key(kernel.op_name, kernel.domain)
        dtypes = table.setdefault(key, set())
        for param in params.get(key, ()):
            for type_str in kernel.type_constraints.get(param, [param]):
                name = _dtype(type_str)
                if name is not None:
                    dtypes.add(name)
    kernels = {key: frozenset(dtypes) for key, dtypes in table.items()}
    kernels.update(_inlined_functions(kernels))
    return dict(sorted(kernels.items()))


def _inlined_functions(kernels: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """ONNX ops without a CPU kernel whose fixed function body onnxruntime inlines: op key ->
    the dtypes all the body's ops take (empty = any), where that leaves any."""
    import onnx.defs

    found = {}
    for schema in onnx.defs.get_all_schemas():
        key = op_key(schema.name, schema.domain)
        if key in kernels or schema.domain not in ("", "ai.onnx") or not schema.has_function:
            continue
        body = {op_key(node.op_type, node.domain) for node in schema.function_body.node}
        if any(op not in kernels for op in body):
            continue
        dtypes = None  # any, until a body op narrows it
        for op in body:
            if kernels[op]:
                dtypes = kernels[op] if dtypes is None else dtypes & kernels[op]
        if dtypes is None or dtypes:
            found[key] = dtypes or frozenset()
    return found


def ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def _data_type_params(schemas) -> dict[str, tuple[str, ...]]:
    """Op key -> the type strings of its first input and first output, from its newest schema."""
    newest: dict[str, object] = {}
    for schema in schemas:
        key = op_key(schema.name, schema.domain)
        if key not in newest or schema.since_version > newest[key].since_version:
            newest[key] = schema
    params = {}
    for key, schema in newest.items():
        formal = [p for p in (schema.inputs[:1] + schema.outputs[:1])]
        params[key] = tuple(dict.fromkeys(p.typeStr for p in formal))
    return params


def _dtype(type_str: str) -> str | None:
    """'tensor(float)' -> 'float32'; None for sequences, maps and unbound type parameters."""
    if not (type_str.startswith("tensor(") and type_str.endswith(")")):
        return None
    name = {"float": "float32", "double": "float64"}.get(type_str[7:-1], type_str[7:-1])
    return name if name in DTYPES else None


def nchwc_block_size(cpuinfo: str = "/proc/cpuinfo") -> int:
    """onnxruntime's NCHWc channel block on this CPU: 16 with AVX-512F, 8 with AVX2, else 0.

    MLAS has NCHWc kernels only for x86; elsewhere (and where /proc/cpuinfo is unreadable) the
    layout is not used, which 0 says.
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "i386"):
        return 0
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return 0
    if "avx512f" in flags:
        return 16
    return 8 if "avx2" in flags else 0


@functools.cache
def ort_cpu_kernel_versions() -> dict[str, tuple[tuple[int, int], ...]]:
    """Op key -> the op versions (first, last) CPUExecutionProvider has kernels for."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    table: dict[str, set[tuple[int, int]]] = {}
    for kernel in ort_c.get_all_opkernel_def():
        if kernel.provider == CPU_PROVIDER:
            table.setdefault(op_key(kernel.op_name, kernel.domain), set()).add(
                tuple(kernel.version_range))
    return {key: tuple(sorted(ranges)) for key, ranges in table.items()}


def cpu_kernel_gap(op: str, domain: str, since_version: int) -> str | None:
    """Why onnxruntime's CPU provider cannot run the op's schema version `since_version` when it
    has kernels for other versions (None when it can, or when it has none at all: that op is
    judged elsewhere, e.g. one onnxruntime expands from its schema's function body)."""
    ranges = ort_cpu_kernel_versions().get(op_key(op, domain))
    if not ranges or any(kernel_takes_version(first, last, since_version)
                         for first, last in ranges):
        return None
    # A kernel registered without a last version runs its own schema version alone (see
    # kernel_takes_version): "25+" had read as covering 28.
    spans = ", ".join(f"{a}" if a == b or b == OPEN_ENDED else f"{a}-{b}" for a, b in ranges)
    return (f"onnxruntime {ort_version()} has no CPU kernel for {op_key(op, domain)} version "
            f"{since_version} (its kernels cover versions {spans})")


# The last version of a kernel registered without one ("version 25 on").
OPEN_ENDED = 2 ** 31 - 1


def kernel_takes_version(first: int, last: int, since_version: int) -> bool:
    """Whether a kernel registered for versions first..last runs a node whose schema dates from
    `since_version`, as onnxruntime's kernel registry decides: a kernel without a last version
    runs only the schema version it was written for, as that schema may have been replaced
    since (DequantizeLinear's kernel "25 on" does not run DequantizeLinear-28)."""
    return first == since_version or first < since_version <= last != OPEN_ENDED


def ort_since_version(op: str, domain: str, opset: int) -> int | None:
    """The schema version onnxruntime resolves the op to at the model's opset, by its own
    schema registry (None when it has no schema for the op up to that opset)."""
    schema = runtime_schema(op, domain, opset)
    return schema.since_version if schema is not None else None


def runtime_schema(op: str, domain: str, opset: int):
    """The schema onnxruntime's registry resolves the op to at the model's opset (None when
    it has none up to that opset)."""
    schemas = [s for s in _schemas().get(op_key(op, domain), ()) if s.since_version <= opset]
    return schemas[-1] if schemas else None


# Ops onnxruntime runs with no kernel: it turns Constant nodes into initializers at load.
_NO_KERNEL_NEEDED = {"Constant"}


def cpu_kernel_absent(op: str, domain: str) -> str | None:
    """Why onnxruntime's CPU provider cannot run the op at any version (None when it has a
    kernel for some version, or needs none): a session of a model holding it fails to load."""
    if op in _NO_KERNEL_NEEDED and domain in ("", "ai.onnx") \
            or ort_cpu_kernel_versions().get(op_key(op, domain)):
        return None
    return f"onnxruntime {ort_version()} has no CPU kernel for {op_key(op, domain)}"


@functools.cache
def _cpu_kernel_defs() -> dict[str, tuple[tuple[int, int, dict[str, frozenset[str]]], ...]]:
    """Op key -> each CPU kernel's (first version, last version, {type param: dtypes})."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    table: dict[str, list] = {}
    for kernel in ort_c.get_all_opkernel_def():
        if kernel.provider != CPU_PROVIDER:
            continue
        first, last = kernel.version_range
        bound = {param: frozenset(filter(None, map(_dtype, types)))
                 for param, types in kernel.type_constraints.items()}
        table.setdefault(op_key(kernel.op_name, kernel.domain), []).append((first, last, bound))
    return {key: tuple(defs) for key, defs in table.items()}


@functools.cache
def _schemas() -> dict[str, tuple]:
    """Op key -> its onnxruntime schemas, oldest first."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    table: dict[str, list] = {}
    for schema in ort_c.get_all_operator_schema():
        table.setdefault(op_key(schema.name, schema.domain), []).append(schema)
    return {key: tuple(sorted(s, key=lambda x: x.since_version)) for key, s in table.items()}


def schema_type_problem(op: str, domain: str, opset: int,
                        inputs: list[str | None]) -> str | None:
    """Why onnxruntime's schema check refuses a node with these input dtypes (names as in
    DTYPES; None for an absent or untyped input) before it looks for any kernel, or None: a
    type parameter two inputs bind to two dtypes (a float16 LayerNormalization with float32
    Scale, which the op's function body would not rescue), or an input dtype the parameter
    does not take at the version the opset resolves the op to. Outputs are left to type
    inference, as onnxruntime leaves them (it loads a Cast-13 to float8, which that version's
    schema does not list). None too when the op has no schema here."""
    schema = runtime_schema(op, domain, opset)
    if schema is None or not schema.inputs:
        return None
    allowed = {c.type_param_str: {_dtype(t) for t in c.allowed_type_strs}
               for c in schema.type_constraints}
    formals = schema.inputs
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (dtype, the input binding it)
    for index, dtype in enumerate(inputs):
        # A variadic last formal parameter takes every input from its position on.
        formal = formals[min(index, len(formals) - 1)]
        variadic = "Variadic" in str(formal.option)
        if dtype is None or index >= len(formals) and not variadic:
            continue
        param = formal.typeStr
        if param not in allowed:  # a fixed type ('tensor(int64)'): left to other checks
            continue
        where = f"input #{index} ({formal.name})" if variadic else f"input {formal.name}"
        if dtype not in allowed[param]:
            takes = ", ".join(sorted(filter(None, allowed[param])))
            return (f"its {where} is {dtype}, which {op}-{schema.since_version}'s type "
                    f"parameter {param} does not take ({takes})")
        first = bound.setdefault(param, (dtype, where))
        if first[0] != dtype and formal.isHomogeneous:
            return (f"its type parameter {param} is bound to {first[0]} by its {first[1]} "
                    f"and to {dtype} by its {where}")
    return None


def cpu_kernel_binds(op: str, domain: str, opset: int, inputs: list[str | None],
                     outputs: list[str | None]) -> bool | None:
    """Whether onnxruntime's CPU provider has a kernel for the op at the model's `opset` whose
    inputs and outputs have these dtypes (names as in DTYPES; None for an absent or untyped
    value), matched as its kernel registry matches: every type parameter of one kernel
    definition takes the dtypes bound to it. The union of dtypes over all versions and
    kernels says too much: OneHot has a bfloat16 kernel only from version 28 on, and there
    only for integer indices and depth. None when the op has no CPU kernel or schema at all
    (onnxruntime may expand it from its schema's function body)."""
    key = op_key(op, domain)
    defs = _cpu_kernel_defs().get(key)
    schema = runtime_schema(op, domain, opset)
    if not defs or schema is None:
        return None
    bound: dict[str, set[str]] = {}
    for formals, dtypes in ((schema.inputs, inputs), (schema.outputs, outputs)):
        for index, dtype in enumerate(dtypes):
            if not formals or dtype is None:
                continue
            # A variadic last formal parameter takes every value from its position on.
            formal = formals[min(index, len(formals) - 1)]
            if index >= len(formals) and "Variadic" not in str(formal.option):
                continue
            bound.setdefault(formal.typeStr, set()).add(dtype)

    def fits(allowed: dict[str, frozenset[str]]) -> bool:
        return all(param not in allowed or dtypes <= allowed[param]
                   for param, dtypes in bound.items())

    return any(kernel_takes_version(first, last, schema.since_version) and fits(allowed)
               for first, last, allowed in defs)
