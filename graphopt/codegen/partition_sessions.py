"""One onnxruntime session per .om partition: its options and providers, its references and
signature checked before and after onnxruntime loads it, and how a run calls it."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import onnxruntime as ort

from graphopt.api_args import THREAD_LIMIT, is_integer
from graphopt.codegen import om_refs
from graphopt.codegen.om_read import OmArtifact, may_reference_files, routing_mismatch
from graphopt.codegen.om_weights import BadReference, external_tensors, point_into
from graphopt.errors import ArtifactError, OptionError, StandInError
from graphopt.nchwc_block import METADATA_KEY, block_mismatch
from graphopt.ort_messages import without_source_location
from graphopt.random_seeds import SEEDING, seeded_bytes

if TYPE_CHECKING:
    import onnx


CPU_PROVIDER = "CPUExecutionProvider"
CANN_PROVIDER = "CANNExecutionProvider"


OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class Step(NamedTuple):
    """A partition's session, the tensors routed into and out of it, and how a run calls it."""

    name: str
    session: ort.InferenceSession
    inputs: list[str]
    outputs: list[str]
    call: Any  # (output names, feeds) -> outputs: the session's run, see runner


def runner(session: ort.InferenceSession, providers: list[str]):
    """How a partition is run. On the CPU provider alone, straight through onnxruntime's
    binding: OmSession has checked the feeds already, and InferenceSession.run's own Python
    checks cost ~10 µs a call, a tenth of a small model's run. With an accelerator provider,
    the public run, which can fall back to the CPU when the accelerator fails. A partition
    that takes or returns bfloat16 or float8 tensors, which the binding cannot convert, through
    numerics.TypedRunner."""
    if not _numpy_types_only(session):
        from graphopt.numerics import typed_runner  # imports onnx, for ml_dtypes' types

        typed = typed_runner(session)
        if typed is not None:
            return typed
    binding = getattr(session, "_sess", None)
    if providers == [CPU_PROVIDER] and binding is not None and hasattr(binding, "run"):
        def call(outputs: list[str], feeds: Mapping[str, Any]) -> list:
            return binding.run(outputs, feeds, None)

        call.binding = binding  # for run()'s direct path (_direct)
        return call
    return session.run


# onnxruntime's element type names that its binding converts to and from numpy by itself.
_NUMPY_TYPES = frozenset({"float", "double", "float16", "int8", "int16", "int32", "int64",
                          "uint8", "uint16", "uint32", "uint64", "bool", "string", "complex64",
                          "complex128"})
_ELEMENT = re.compile(r"tensor\((\w+)\)")


def _numpy_types_only(session: ort.InferenceSession) -> bool:
    """Whether every tensor a session takes or returns (alone, or inside a sequence, map or
    optional) has an element type numpy has: then no TypedRunner is needed."""
    return all(set(_ELEMENT.findall(arg.type)) <= _NUMPY_TYPES and "tensor(" in arg.type
               or arg.type in _NUMPY_TYPES
               for arg in (*session.get_inputs(), *session.get_outputs()))


# onnxruntime fuses a 4-bit DequantizeLinear -> MatMul of the model's own (opset 21's int4
# weights) into MatMulNBits at accuracy_level 4 unless told otherwise, which rounds the
# activations to int8: the .om differed from the model by 2% of its outputs. Level 0 keeps
# them float, as graphopt's own MatMulNBits (whose level --int4-accuracy-level sets) do.
QDQ_MATMULNBITS_ACCURACY = "session.qdq_matmulnbits_accuracy_level"


def session_options(intra_op_num_threads: int | None, optimization_level: str,
                     inter_op_num_threads: int | None = None,
                     session_config: Mapping[str, str] | None = None) -> ort.SessionOptions:
    if optimization_level not in OPTIMIZATION_LEVELS:
        raise OptionError(
            f"optimization_level {optimization_level!r} is not one of: {', '.join(OPTIMIZATION_LEVELS)}"
        )
    for name, threads in (("intra_op_num_threads", intra_op_num_threads),
                          ("inter_op_num_threads", inter_op_num_threads)):
        # Bounded as --threads is (api_args.THREAD_LIMIT): onnxruntime starts every thread.
        if threads is not None and (not is_integer(threads)
                                    or not 0 <= threads <= THREAD_LIMIT):
            raise OptionError(f"{name} must be an integer from 0 to {THREAD_LIMIT} (onnxruntime "
                              f"starts every thread it is asked for), not {threads!r}")
    if session_config is not None and not (isinstance(session_config, Mapping) and all(
            isinstance(key, str) for key in session_config)):
        raise OptionError("session_config must map onnxruntime config keys (strings) to values, "
                          f"not {type(session_config).__name__}")
    for key, value in (session_config or {}).items():
        # onnxruntime reads "1", not "True": a bool or float would be a setting it ignores.
        if isinstance(value, bool) or not (isinstance(value, str) or hasattr(value, "__index__")):
            raise OptionError(f"session_config[{key!r}] = {value!r}: onnxruntime's config values "
                              "are strings (\"1\" or \"0\" for a switch)")
    options = ort.SessionOptions()
    options.graph_optimization_level = OPTIMIZATION_LEVELS[optimization_level]
    if intra_op_num_threads is not None:
        options.intra_op_num_threads = int(intra_op_num_threads)  # 0: onnxruntime chooses
    if inter_op_num_threads is not None:
        options.inter_op_num_threads = int(inter_op_num_threads)
    config = {QDQ_MATMULNBITS_ACCURACY: "0", **{key: str(value) for key, value
                                                 in (session_config or {}).items()}}
    for key, value in config.items():  # e.g. session.force_spinning_stop
        options.add_session_config_entry(key, value)
    # Fatal only: graphopt raises every failure with onnxruntime's message, which its log would
    # print again first, in colour, on stderr (a run-time error such as an id out of range).
    options.log_severity_level = 4
    return options


def _providers(part: dict, available: list[str]) -> tuple[list[str], list[str]]:
    """The providers for a partition (its manifest entry), and the accelerator providers it
    wanted but lacks when the CPU provider stands in for its device (empty otherwise).

    A partition names its providers (from the target profile), preferred first; installed ones
    are used in that order with the CPU provider last, which takes any op the accelerator lacks.
    """
    if part["device"] == "cpu":
        return [CPU_PROVIDER], []
    wanted = [p for p in (part.get("providers") or [CANN_PROVIDER]) if p != CPU_PROVIDER]
    chosen = [p for p in wanted if p in available]
    return chosen + [CPU_PROVIDER], ([] if chosen else wanted)


# Where onnxruntime looks for external data when a model comes as bytes (no path of its own).
_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"

DISABLE_PREPACKING = "session.disable_prepacking"
# Where a partition's "prepack_weights": false was measured to cost its runs nothing
# (prepacking.py): MLAS's x86-64 kernels. Elsewhere (Arm's packed GEMMs) sessions pack as usual.
_UNPACKED_MEASURED = platform.machine().lower() in ("x86_64", "amd64")


def skips_prepacking(part: dict, session_config: Mapping[str, str] | None) -> bool:
    """Whether partition `part`'s session should skip pre-packing weights: its compile found
    that no kernel gains from it, it runs on the CPU, and the caller did not choose."""
    return (part.get("prepack_weights") is False and part["device"] == "cpu"
            and _UNPACKED_MEASURED and DISABLE_PREPACKING not in (session_config or {}))


def partition_session_config(part) -> dict[str, str]:
    """The session config an OmSession gives partition `part` (an OmPartition) by default, for
    a caller that runs a partition model on its own and must compute what the session does:
    weights left unpacked where the compile found packing pays nowhere (MLAS's packed and
    plain GEMMs differ in their last bits)."""
    entry = {"prepack_weights": part.prepack_weights, "device": part.device}
    return {DISABLE_PREPACKING: "1"} if skips_prepacking(entry, None) else {}


class _Checked(NamedTuple):
    """A partition's external references, checked: from a parse of its model (`model`), from
    its protobuf wire (`references`), or neither when its bytes cannot hold any."""

    model: onnx.ModelProto | None = None
    references: list[om_refs.Reference] | None = None


# Whether a load reads partitions' external references on the protobuf wire first (om_refs);
# tests turn it off to exercise the onnx parse that takes whatever the wire reader leaves.
WIRE_REFERENCES = True


def _checked(artifact: OmArtifact, name: str, data: bytes) -> _Checked:
    """Partition `name`'s external references, checked (ArtifactError otherwise) before
    onnxruntime reads any of its bytes.

    References of graphopt's own form are read from the protobuf wire (om_refs): in half the
    time of onnx's parse even once onnx is imported, and a process that only loads .om files
    never imports it (~0.1 s). Anything else is parsed with onnx. Neither copy is kept:
    onnxruntime gets the stored bytes, and a second parsed copy of the weights would live as
    long as the session."""
    if WIRE_REFERENCES:
        references = om_refs.plain_references(data)
        if references is not None:
            try:
                om_refs.check(references, {member: size for member, (_, size)
                                           in artifact.spans.items()})
            except BadReference as exc:
                raise ArtifactError(f"{artifact.path}: partition {name!r}: {exc}") from None
            return _Checked(references=references)
    return _Checked(model=artifact.models.parse(name) if may_reference_files(data) else None)


def _session(artifact: OmArtifact, part: dict, data: bytes, checked: _Checked,
             options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """A session for `part` whose weights onnxruntime maps from the artifact file itself."""
    def session(data: bytes) -> ort.InferenceSession:
        if SEEDING.get():  # outputs being compared: its samplers draw the reference's noise
            data = seeded_bytes(data)
        return ort.InferenceSession(data, options, providers=providers,
                                    disabled_optimizers=part.get("disabled_optimizers") or None,
                                    **_NO_FALLBACK if providers == [CPU_PROVIDER] else {})

    model, references = checked
    if not artifact.spans or (not references and (model is None
                                                  or not external_tensors(model))):
        return session(data)
    path = artifact.location
    offsets = {name: offset for name, (offset, _) in artifact.spans.items()}
    options.add_session_config_entry(_EXTERNAL_FOLDER, os.path.dirname(path))
    if references:
        located = om_refs.repointed(data, references, os.path.basename(path), offsets)
    else:  # a parse of the runtime's own is rewritten in place; a kept one is copied
        located = point_into(model, path, offsets,
                             copy=artifact.models.is_kept(part["name"])).SerializeToString()
    try:
        return session(located)
    except Exception:  # noqa: BLE001 - an onnxruntime without that config entry: copy instead
        return session(artifact.partition_model(part["name"]).SerializeToString())


# onnxruntime's Python wrapper retries a session that failed with a ValueError or RuntimeError
# on the CPU provider, printing four lines to stdout first: for a partition that runs on the
# CPU provider already, a second failure and noise in the caller's output.
_NO_FALLBACK = {"enable_fallback": 0}


def load_failure(exc: Exception) -> str:
    """What onnxruntime said when it could not load a partition, in one line."""
    if isinstance(exc, UnicodeDecodeError):  # its message quoted a name that is not UTF-8
        return "a name or string in the model is not valid UTF-8"
    return first_line(exc)


def _check_signature(artifact: OmArtifact, part: dict, session: ort.InferenceSession) -> None:
    """The partition's model, as onnxruntime loaded it, takes and returns what the manifest
    routes, every input it takes is routed to it, and the model's inputs and outputs that are
    the artifact's have the element type and static dims the manifest declares for them."""
    inputs = [i.name for i in session.get_inputs()]
    problem = routing_mismatch(part, inputs, {o.name for o in session.get_outputs()})
    if problem:
        raise ArtifactError(f"{artifact.path}: {problem}")
    unfed = [tensor for tensor in inputs if tensor not in part["inputs"]]
    if unfed:
        raise ArtifactError(f"{artifact.path}: partition {part['name']!r} needs input "
                            f"{unfed[0]!r}, which nothing routes to it")
    for kind, declared, args in (("input", artifact.inputs, session.get_inputs()),
                                 ("output", artifact.outputs, session.get_outputs())):
        entries = {e["name"]: e for e in declared}
        for arg in args:
            entry = entries.get(arg.name)
            problem = entry and _declared_otherwise(entry, arg)
            if problem:
                raise ArtifactError(f"{artifact.path}: the manifest declares {kind} "
                                    f"{arg.name!r} {problem}, but partition {part['name']!r} "
                                    f"{'takes' if kind == 'input' else 'returns'} "
                                    f"{_arg_label(arg)}")


# onnxruntime's names of element types whose manifest name differs (the rest are the same).
_ORT_DTYPE_NAMES = {"float": "float32", "double": "float64"}


def _declared_otherwise(entry: dict, arg) -> str:
    """How the manifest's signature `entry` disagrees with onnxruntime's `arg` (its dtype, its
    rank, a dim both give as a number), or "" when it does not."""
    element = _ELEMENT.fullmatch(arg.type)
    shape = entry.get("shape")
    label = f"{entry.get('dtype')}{list(shape) if shape is not None else ''}"
    if entry.get("dtype") is None or element is None:  # a sequence, map or optional
        return ""
    if _ORT_DTYPE_NAMES.get(element[1], element[1]) != entry["dtype"]:
        return f"as {label}"
    dims = arg.shape
    if shape is None or dims is None:
        return ""
    if len(dims) != len(shape) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                      for a, b in zip(dims, shape)):
        return f"as {label}"
    return ""


def _arg_label(arg) -> str:
    element = _ELEMENT.fullmatch(arg.type)
    dtype = _ORT_DTYPE_NAMES.get(element[1], element[1]) if element else arg.type
    dims = "" if arg.shape is None else \
        "[" + ",".join("?" if d is None else str(d) for d in arg.shape) + "]"
    return f"{dtype}{dims}"


def _check_blocking(artifact: OmArtifact, name: str, metadata: Mapping[str, str]) -> None:
    """Refuse a partition blocked into NCHWc for another CPU: onnxruntime would run it, wrongly."""
    if METADATA_KEY not in metadata:
        return
    value = metadata[METADATA_KEY]
    if not (isinstance(value, str) and value.isascii() and value.isdigit()):
        raise ArtifactError(f"{artifact.path}: partition {name!r}: metadata "
                            f"{METADATA_KEY} is {value!r}, not a block size")
    problem = block_mismatch(metadata)
    if problem:
        raise ArtifactError(f"{artifact.path}: partition {name!r}: {problem}")


def first_line(exc: BaseException) -> str:
    """The first line of an error, without onnxruntime's C++ source location."""
    text = without_source_location(str(exc).strip())
    return text.splitlines()[0] if text else type(exc).__name__


def open_steps(artifact: OmArtifact, options, profile_dir: str | None, fallback: list[str],
               wanted: set[str]) -> list[Step]:
    """One onnxruntime session per partition, in execution order, each with the options
    `options(part)` makes (profiling into `profile_dir` when given); notes the partitions
    whose device's providers are missing in `fallback` and those providers in `wanted`."""
    available = ort.get_available_providers()
    steps: list[Step] = []
    by_name = {p["name"]: p for p in artifact.manifest["partitions"]}
    for name in artifact.execution_order:
        part = by_name[name]
        providers, missing = _providers(part, available)
        if missing:
            fallback.append(f"{name} ({part['device']})")
            wanted.update(missing)
        data = artifact.members[part["member"]]
        checked = _checked(artifact, name, data)  # before onnxruntime reads any of it
        part_options = options(part)
        if profile_dir is not None:
            part_options.enable_profiling = True
            part_options.profile_file_prefix = os.path.join(profile_dir, name)
        try:
            session = _session(artifact, part, data, checked, part_options, providers)
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            if checked.model is None:
                artifact.models.parse(name)  # a model that does not parse says so
            # E.g. bfloat16 ops compiled for an NPU, which the CPU provider has no kernel for.
            message = f"{artifact.path}: onnxruntime cannot load partition {name!r}: " \
                      f"{load_failure(exc)}"
            if not missing:
                raise ArtifactError(message) from None
            raise StandInError(
                f"{message} (the CPU provider stands in for {' or '.join(missing)}, which "
                "is not installed, and cannot run every op compiled for the device)") from None
        del checked  # onnxruntime has its own copy
        _check_signature(artifact, part, session)
        try:
            metadata = session.get_modelmeta().custom_metadata_map
        except UnicodeDecodeError:  # onnxruntime's binding decodes every value as UTF-8
            raise ArtifactError(f"{artifact.path}: partition {name!r}: its metadata is not "
                                "valid UTF-8") from None
        _check_blocking(artifact, name, metadata)
        steps.append(Step(name, session, list(part["inputs"]), list(part["outputs"]),
                           runner(session, providers)))
    return steps
