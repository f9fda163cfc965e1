"""Numeric checks with onnxruntime: seeded inputs, sessions at a chosen level, output comparison;
sequences, maps and optionals, and the tensor types numpy knows only through ml_dtypes."""

from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import EncodeError
from onnx import ModelProto, TensorProto

from graphopt.codegen.feeds import random_array, random_value, typed_entry, value_label
from graphopt.codegen.om_manifest import dtype_name
from graphopt.codegen.partition_sessions import QDQ_MATMULNBITS_ACCURACY
from graphopt.dims import read_dim
from graphopt.random_seeds import seeded_copy
from graphopt.errors import GraphoptError, InputError
from graphopt.interrupts import interrupts_deferred
from graphopt.lent_weights import session_initializers
from graphopt.option_names import from_command_line, option
from graphopt.ort_messages import without_source_location
from graphopt.tools import metrics

LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def serialized(model: ModelProto) -> bytes | None:
    """The model's bytes; None past protobuf's 2 GiB, which no one message serializes to
    (onnx.load of a model with more external data than that gives such a proto). Serialized
    once: ByteSize would serialize it too, to tell."""
    try:
        return model.SerializeToString()
    except (EncodeError, ValueError):
        return None


def session(model: ModelProto | bytes | str, level: str = "disable", threads: int = 1,
            providers: list[str] | None = None, config: dict[str, str] | None = None,
            disabled_optimizers: list[str] | None = None) -> ort.InferenceSession:
    """A CPU session for `model` at optimization `level`, with session `config` entries and
    onnxruntime's `disabled_optimizers` (as an .om partition's session has them)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # failures raise; their log lines would only repeat them
    # As an .om partition's session (partition_sessions.QDQ_MATMULNBITS_ACCURACY) has it
    for key, value in {QDQ_MATMULNBITS_ACCURACY: "0", **(config or {})}.items():
        options.add_session_config_entry(key, value)
    if isinstance(model, ModelProto):  # its samplers draw the same noise as its compile's
        model = seeded_copy(model) or model
        # The weights lent_weights.lean_onnx kept out of the proto, as OrtValues over graphopt's
        # arrays, which the session copies as it is made (`lent` keeps them alive till then).
        names, lent = session_initializers(model)
        if names:
            options.add_external_initializers(names, lent)
    data = serialized(model) if isinstance(model, ModelProto) else model
    if data is None:
        # Past protobuf's 2 GiB one message cannot be serialized: onnxruntime reads the model
        # from a file with its weights beside it, which it keeps mapped once the session is
        # built (the folder can go then).
        from graphopt.ir.external_data import save_onnx

        from graphopt.atomic import scratch_writes

        with tempfile.TemporaryDirectory(prefix="graphopt-ort-") as folder, scratch_writes():
            path = os.path.join(folder, "model.onnx")
            save_onnx(model, path, external=True)
            return ort.InferenceSession(path, options,
                                        providers=providers or ["CPUExecutionProvider"],
                                        disabled_optimizers=disabled_optimizers or None)
    return ort.InferenceSession(data, options, providers=providers or ["CPUExecutionProvider"],
                                disabled_optimizers=disabled_optimizers or None)


# Advice onnxruntime ends some errors with, after the line that says what is wrong.
_BOILERPLATE = ("Please fix either the inputs/outputs or the model.",)


def load_refusal(model: bytes, level: str = "disable") -> str | None:
    """Why onnxruntime's CPU provider refuses to load the serialized `model` at optimization
    `level` (no graph optimizations by default; one line), or None when it loads it."""
    try:
        session(model, level)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's refusals have no common type
        return ort_reason(exc)
    return None


def ort_reason(error: Exception, limit: int = 400) -> str:
    """onnxruntime's error as one line: its lines joined (an invalid-dimension error names the
    index and both sizes on lines of their own), without the advice it ends some with."""
    lines = [line.strip() for line in str(error).strip().splitlines()]
    text = without_source_location(" ".join(line for line in lines
                                            if line and line not in _BOILERPLATE))
    # A model loaded from its file: the caller names the file already.
    text = re.sub(r"Load model from .*? failed:\s*", "", text, count=1)
    if not text:
        return type(error).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def optimized_by_onnxruntime(model: ModelProto, level: str,
                             disabled_optimizers: list[str] | None = None) -> ModelProto:
    """`model` as onnxruntime's CPU provider rewrites it at `level`, without the
    `disabled_optimizers` (its optimized model, read back; weights included, so only for
    models small enough to copy)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 4  # a refusal is the caller's to report, not a log line
    # Not TemporaryDirectory: a Ctrl-C landing in its creation or its cleanup left the folder
    # (a copy of the model in it) in the temporary directory, and a descriptor open.
    folder = None
    try:
        with interrupts_deferred():
            folder = tempfile.mkdtemp(prefix="graphopt-ort-")
        options.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"],
                             disabled_optimizers=disabled_optimizers or None)
        return onnx.load(options.optimized_model_filepath)
    finally:
        if folder is not None:
            with interrupts_deferred():
                shutil.rmtree(folder, ignore_errors=True)


def _concrete_shape(info: onnx.ValueInfoProto, dims: dict[str, int],
                    pinned: list[int] | None, feeds_keyword: str = "inputs") -> list[int]:
    if not info.type.tensor_type.HasField("shape"):  # unknown rank: a guess would be rank 0
        if pinned is not None and all(d >= 0 for d in pinned):
            return [int(d) for d in pinned]
        if from_command_line():
            ways = f"inputs (--inputs x.npz) or its whole shape (--input-shape \"{info.name}:…\")"
        else:
            ways = (f"{feeds_keyword}= (a dict or an .npz path) or its whole shape in "
                    f"input_shapes={{{info.name!r}: […]}}")
        raise InputError(f"input {info.name!r} has an unknown rank, so random data cannot be "
                         f"made for it; pass {ways}")
    shape = []
    for axis, dim in enumerate(info.type.tensor_type.shape.dim):
        if pinned is not None and axis < len(pinned) and pinned[axis] >= 0:
            shape.append(int(pinned[axis]))
        else:  # a size, else the size a name is bound to, else 1 (-1 and "?" are unknown)
            read = read_dim(dim)
            shape.append(read if isinstance(read, int) else int(dims.get(read, 1)))
    return shape


# onnxruntime's words for a model it cannot run on any input: an op or kernel it lacks.
# onnxruntime's words for a failure while running, which other inputs may avoid; a model it
# cannot load (a missing kernel or op, two nodes of one name, no outputs) fails on any input.
_WHILE_RUNNING = ("RUNTIME_EXCEPTION", "while running", "INVALID_ARGUMENT")


def random_inputs_hint(source: str, pinned: bool, feeds: str | None = None,
                       reason: str = "", signature: list[dict] | None = None,
                       made: dict | None = None, sizes: str | None = None) -> str:
    """What to say when the original model cannot run on `source` (seeded random) inputs:
    their open dims are 1 unless `pinned` (or `signature`, the inputs' entries, has none), so
    real inputs, or sizes, are the way out. `feeds` names the caller's option for real inputs
    (by default optimize's), `sizes` its option for sizes (by default input_shapes'); `made`,
    the arrays that ran, names the inputs whose open dims the pins left at 1 (a dynamo export
    gives each input its own batch symbol: a profile sizing one ran the others at 1).
    Nothing when onnxruntime's `reason` is not a failure while running (a model it cannot
    load fails on any input)."""
    if not any(words in reason for words in _WHILE_RUNNING) or "Invalid model" in reason:
        return ""
    feeds, sizes = feeds or option("inputs"), sizes or option("input_shapes")
    opened = signature is None or any(
        entry.get("shape") is None or not all(isinstance(d, int) for d in entry["shape"])
        for entry in signature)
    left = left_at_one(signature, made) if pinned and made and signature else []
    if left:
        return (f" (on {source} inputs, open dims left at 1: {', '.join(left[:3])}: give real "
                f"inputs with {feeds}, or sizes for those dims with {sizes})")
    if pinned or not opened:
        return f" (on {source} inputs: give real inputs with {feeds})"
    cache = _kv_cache_inputs(signature)
    named = f"{cache[0]}{' …' if len(cache) > 1 else ''}" if cache else ""
    if cache and "head" in reason.lower():
        # The cache's heads, which a fused kernel (GroupQueryAttention) checks against its
        # attribute: a size the seeded 1 does not meet, not the mask's length.
        return (f" (on {source} inputs, open dims 1, the KV cache's ({named}) too: give a "
                f"real step's inputs with {feeds}, or sizes with {sizes})")
    if cache:  # its mask spans past + new tokens, a relation seeded dims of 1 do not keep
        return (f" (on {source} inputs, open dims 1: a decoder with a KV cache ({named}) "
                "needs its attention mask as long as the past and the new tokens together: "
                f"give a real step's inputs with {feeds}, or sizes with {sizes} that keep that "
                "sum)")
    return (f" (on {source} inputs, open dims 1: give real inputs with {feeds}, or "
            f"sizes with {sizes})")


def _kv_cache_inputs(signature: list[dict] | None) -> list[str]:
    """The inputs of rank 3 or more whose names say they hold past keys or values."""
    return [entry["name"] for entry in signature or ()
            if "past" in entry["name"].lower() and entry.get("shape") is not None
            and len(entry["shape"]) >= 3]


def left_at_one(signature: list[dict], made: dict, pins: dict | None = None) -> list[str]:
    """`x [2,1] (S=1)` for each input whose open dims the arrays that ran hold at 1, but for
    the dims `pins` (name → dims, -1 where open) sized on purpose."""
    left = []
    for entry in signature:
        array, shape = made.get(entry["name"]), entry.get("shape")
        if shape is None or not hasattr(array, "shape") or len(array.shape) != len(shape):
            continue
        pinned = (pins or {}).get(entry["name"]) or []
        named = [f"{d}=1" if isinstance(d, str) else "?=1"
                 for axis, (d, size) in enumerate(zip(shape, array.shape))
                 if not isinstance(d, int) and size == 1
                 and not (axis < len(pinned) and pinned[axis] != -1)]
        if named:
            dims = ",".join(map(str, array.shape))
            left.append(f"{entry['name']} [{dims}] ({', '.join(named)})")
    return left


def random_feeds(model: ModelProto, seed: int = 0, dims: dict[str, int] | None = None,
                 shapes: dict[str, list[int]] | None = None,
                 feeds_keyword: str = "inputs") -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input that has no initializer: normal floats, small
    non-negative integers (safe as indices into any non-empty axis), random booleans.
    A dim comes from `shapes[input][axis]` (ATC-style pins, -1 = not pinned), else the model,
    else `dims[symbol]`, else 1. An input of unknown rank is an InputError that names the
    caller's keyword for real inputs, `feeds_keyword` (optimize's by default)."""
    from graphopt.source_marks import inserted_preprocessing

    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    initialized = {t.name for t in model.graph.initializer}
    images = inserted_preprocessing(model.metadata_props)
    # A symbol pinned on one input binds it on every other input too (as --input-shape does).
    for info in model.graph.input:
        for dim, pinned in zip(info.type.tensor_type.shape.dim, (shapes or {}).get(info.name, ())):
            name = read_dim(dim)
            if isinstance(name, str) and pinned >= 0:
                dims.setdefault(name, int(pinned))
    feeds = {}
    for info in model.graph.input:
        if info.name in initialized:
            continue
        tensor_type = info.type.tensor_type
        if not info.type.HasField("tensor_type"):
            feeds[info.name] = _random_held(info, rng, dims)
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        shape = _concrete_shape(info, dims, (shapes or {}).get(info.name), feeds_keyword)
        feeds[info.name] = random_array(info.name, shape, dtype, rng,
                                        pixels=info.name in images)
    return feeds


def _random_held(info: onnx.ValueInfoProto, rng: np.random.Generator,
                 dims: dict[str, int]) -> Any:
    """A random sequence of tensors, or a present optional tensor, for a graph input whose
    element dims come from the model, else `dims[symbol]`, else 1 (as a tensor's do)."""
    entry = typed_entry(info)
    element = entry.get("element")
    if element is not None and element["shape"] is not None:
        shape = [d if isinstance(d, int) else int(dims.get(d, 1)) if isinstance(d, str) else 1
                 for d in element["shape"]]
        entry["element"] = {**element, "shape": shape}
    try:
        return random_value(entry, rng)
    except InputError as exc:
        if entry.get("type", "").startswith("optional"):  # an .npz holds the tensor it holds
            raise ValueError(f"{exc}; pass explicit inputs") from None
        raise NoTensorFeed(f"{exc}; pass explicit inputs from Python (a dict or a list where "
                           "the input takes one), since an .npz holds tensors only") from None


class NoTensorFeed(ValueError):
    """random_feeds cannot make a value for an input no .npz can hold either (a map, or a
    sequence whose tensors have no shape)."""


def run(model: ModelProto | bytes, feeds: dict[str, Any], level: str = "disable",
        **settings) -> dict[str, Any]:
    """Every output of `model` on `feeds`: arrays (bfloat16 and float8 as ml_dtypes arrays),
    lists for sequences, dicts for maps, None for an empty optional. `settings`: session's
    config and disabled_optimizers."""
    sess = session(model, level, **settings)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, (typed_runner(sess) or sess.run)(names, feeds)))


# --- element types numpy knows only through ml_dtypes ---------------------------------------

# onnxruntime's Python binding converts none of these to or from numpy, but takes and returns a
# tensor of the ones here as an OrtValue of its bits (ml_dtypes keeps the same bits).
_BITS = {TensorProto.BFLOAT16: np.uint16, TensorProto.FLOAT8E4M3FN: np.uint8,
         TensorProto.FLOAT8E4M3FNUZ: np.uint8, TensorProto.FLOAT8E5M2: np.uint8,
         TensorProto.FLOAT8E5M2FNUZ: np.uint8, TensorProto.FLOAT8E8M0: np.uint8}
_BITS_BY_NAME = {dtype_name(elem_type): (elem_type, np.dtype(bits))
                 for elem_type, bits in _BITS.items()}


def _ml_dtypes() -> dict[np.dtype, str]:
    found = {}
    for elem_type in TensorProto.DataType.values():
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
        except (KeyError, TypeError, ValueError):
            continue
        if dtype.type.__module__.split(".")[0] == "ml_dtypes":
            found[dtype] = dtype_name(elem_type)
    return found


# Every element type numpy has through ml_dtypes only (bfloat16, float8, int4, …), by dtype.
_ML_DTYPES = _ml_dtypes()
_NUMPYLESS = frozenset(_ML_DTYPES.values())


def widened(array: np.ndarray) -> np.ndarray:
    """`array` with an ml_dtypes element type (bfloat16, float8, int4) as float32 or int64, which
    numpy's own functions handle; any other array as it is."""
    name = _ML_DTYPES.get(array.dtype)
    if name is None:
        return array
    return array.astype(np.int64 if "int" in name else np.float32)


def _arg_dtype(ort_type: str) -> str | None:
    """The element type of onnxruntime's `tensor(bfloat16)`; None for any other spelling."""
    if ort_type.startswith("tensor(") and ort_type.endswith(")"):
        return ort_type[len("tensor("):-1]
    return None


def _mentions_numpyless(ort_type: str) -> bool:
    return any(f"({name})" in ort_type for name in _NUMPYLESS)


class TypedRunner:
    """Runs a session that takes or returns tensors of an element type numpy knows only through
    ml_dtypes: a bfloat16 or float8 tensor goes in and comes out as an OrtValue of its bits, as
    a `session.run(output_names, feeds)` that takes and returns ml_dtypes arrays. Any other such
    value (an int4 tensor, a sequence of bfloat16) is refused naming it."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session
        args = [*session.get_inputs(), *session.get_outputs()]
        self._bits = {arg.name: _BITS_BY_NAME[_arg_dtype(arg.type)] for arg in args
                      if _arg_dtype(arg.type) in _BITS_BY_NAME}
        inputs = {arg.name for arg in session.get_inputs()}
        self._refused = {arg.name: f"{'input' if arg.name in inputs else 'output'} "
                                   f"{arg.name!r} is a {arg.type}"
                         for arg in args
                         if _mentions_numpyless(arg.type) and arg.name not in self._bits}
        self._outputs = [o.name for o in session.get_outputs()]

    def __call__(self, output_names: list[str] | None, feeds: Mapping[str, Any]) -> list:
        names = list(output_names or self._outputs)
        for name in (*feeds, *names):
            if name in self._refused:
                raise GraphoptError(
                    f"{self._refused[name]}, which onnxruntime's Python binding cannot pass "
                    "(graphopt passes only bfloat16 and float8 tensors, as their bits)")
        fed = {name: self._fed(name, value) for name, value in feeds.items()}
        if not any(name in self._bits for name in names):
            return self._session.run(names, fed)
        fed = {name: _ort_value(name, value) for name, value in fed.items()}
        values = self._session.run_with_ort_values(names, fed)
        return [self._returned(name, value) for name, value in zip(names, values)]

    def _fed(self, name: str, value: Any) -> Any:
        if name not in self._bits:
            return value
        elem_type, bits = self._bits[name]
        # Not ascontiguousarray, which makes a 0-d array 1-d: a scalar came back as [1].
        array = np.asarray(value, order="C")
        plain_bits = array.dtype.kind == "V" and array.dtype.names is None  # from an .npz
        if array.dtype.itemsize != bits.itemsize or not (plain_bits or array.dtype in _ML_DTYPES):
            raise GraphoptError(f"input {name!r} has dtype {array.dtype}, expected "
                                f"{dtype_name(elem_type)}")
        # The OrtValue reads the array's memory, which `fed` keeps alive through the run.
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(bits), elem_type)

    def _returned(self, name: str, value: ort.OrtValue) -> Any:
        if name in self._bits:
            elem_type = self._bits[name][0]
            return _from_bits(value, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
        if not value.is_tensor():
            raise GraphoptError(f"output {name!r} is a {value.data_type()}, which onnxruntime's "
                                "Python binding cannot return beside a bfloat16 or float8 output "
                                "of the same model")
        return value.numpy()


def _ort_value(name: str, value: Any) -> ort.OrtValue:
    if isinstance(value, ort.OrtValue):
        return value
    if not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
        raise GraphoptError(f"input {name!r} is {value_label(value)}, which onnxruntime's "
                            "Python binding cannot take beside a bfloat16 or float8 output of "
                            "the same model")
    return ort.OrtValue.ortvalue_from_numpy(np.asarray(value, order="C"))  # keeps 0-d 0-d


def _from_bits(value: ort.OrtValue, dtype: np.dtype) -> np.ndarray:
    """A copy of a CPU tensor's bits as an array of `dtype`."""
    shape, size = value.shape(), value.tensor_size_in_bytes()
    if size == 0:
        return np.empty(shape, dtype)
    raw = (ctypes.c_uint8 * size).from_address(value.data_ptr())
    return np.frombuffer(raw, np.uint8).copy().view(dtype).reshape(shape)


def typed_runner(session: ort.InferenceSession) -> TypedRunner | None:
    """A TypedRunner for a session that takes or returns an ml_dtypes element type; None for
    any other session, which `session.run` serves as it is."""
    args = [*session.get_inputs(), *session.get_outputs()]
    return TypedRunner(session) if any(_mentions_numpyless(a.type) for a in args) else None


@dataclass
class Mismatch:
    output: str
    problem: str
    max_abs: float = 0.0
    max_rel: float = 0.0

    def __str__(self) -> str:
        return f"output '{self.output}': {self.problem}"


def compare(expected: dict[str, Any], actual: dict[str, Any], rtol: float = 1e-4,
            atol: float = 1e-5) -> list[Mismatch]:
    """Outputs that differ: missing, different dtype or shape, or values beyond
    |a - e| <= atol + rtol * |e| (NaN equals NaN). A sequence matches when its length does and
    every element matches, a map when its keys do and every value matches."""
    problems = []
    for name, exp in expected.items():
        if name not in actual:
            problems.append(Mismatch(name, "missing"))
            continue
        for pair in paired(name, exp, actual[name]):
            problem = pair if isinstance(pair, Mismatch) else _compare_tensors(*pair, rtol, atol)
            if problem is not None:
                problems.append(problem)
    return problems


def paired(name: str, exp: Any, got: Any
           ) -> Iterator[Mismatch | tuple[str, np.ndarray, np.ndarray]]:
    """(name, expected, actual) for every tensor inside two output values, named like `seq[1]`,
    as far as their structure agrees; where it does not, a Mismatch. A map's values, in the
    expected map's key order, are one tensor."""
    if isinstance(exp, (list, tuple)) or isinstance(got, (list, tuple)):
        yield from _paired_sequences(name, exp, got)
    elif isinstance(exp, Mapping) or isinstance(got, Mapping):
        yield from _paired_maps(name, exp, got)
    elif exp is None or got is None:
        if exp is not None or got is not None:
            yield Mismatch(name, f"{value_label(got)} != expected {value_label(exp)}")
    else:
        yield name, np.asarray(exp), np.asarray(got)


def _paired_sequences(name: str, exp: Any, got: Any) -> Iterator:
    if not (isinstance(exp, (list, tuple)) and isinstance(got, (list, tuple))):
        yield Mismatch(name, f"{value_label(got)} != expected {value_label(exp)}")
    elif len(exp) != len(got):
        yield Mismatch(name, f"sequence length {len(got)} != expected {len(exp)}")
    else:
        for index, (e, g) in enumerate(zip(exp, got)):
            yield from paired(f"{name}[{index}]", e, g)


def _paired_maps(name: str, exp: Any, got: Any) -> Iterator:
    if not (isinstance(exp, Mapping) and isinstance(got, Mapping)):
        yield Mismatch(name, f"{value_label(got)} != expected {value_label(exp)}")
    elif set(exp) != set(got):
        yield Mismatch(name, f"map keys differ: {len(set(exp) ^ set(got))} key(s) in one only")
    elif any(isinstance(v, (list, tuple, Mapping)) or v is None for v in exp.values()):
        for key, e in exp.items():
            yield from paired(f"{name}[{key!r}]", e, got[key])
    else:  # a map of numbers (ZipMap's class scores) is one vector, in the reference's key order
        yield name, _vector(list(exp.values())), _vector([got[key] for key in exp])


def _vector(values: list) -> np.ndarray:
    # Strings as objects, as onnxruntime returns string tensors: '<U3' and '<U5' are no
    # different dtypes to compare.
    strings = any(isinstance(v, str) for v in values)
    return np.asarray(values, dtype=object if strings else None)


def _compare_tensors(name: str, exp: np.ndarray, got: np.ndarray, rtol: float,
                     atol: float) -> Mismatch | None:
    if got.dtype != exp.dtype:
        return Mismatch(name, f"dtype {got.dtype} != expected {exp.dtype}")
    if got.shape != exp.shape:
        return Mismatch(name, f"shape {got.shape} != expected {exp.shape}")
    exp, got = widened(exp), widened(got)
    if exp.dtype == object or exp.dtype == np.bool_ or np.issubdtype(exp.dtype, np.integer):
        if not np.array_equal(got, exp):
            bad = int(np.sum(got != exp))
            return Mismatch(name, f"{bad} element(s) differ")
        return None
    bad = metrics.beyond_tolerance(exp, got, rtol, atol)
    if not bad.any():
        return None
    e, a = exp.astype(np.float64).reshape(-1), got.astype(np.float64).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is judged by the mask
        # NaN against NaN agrees; NaN against a number is infinitely off (nanmax would drop
        # it, and the message read "max abs err 0" beside elements beyond the tolerances).
        one_nan = np.isnan(e) != np.isnan(a)
        diff = np.where(np.isnan(e) & np.isnan(a), 0.0, np.where(one_nan, np.inf, np.abs(a - e)))
        rel = np.where(one_nan, np.inf, diff / np.maximum(np.abs(e), 1e-30))
    # Where NaN stands on one side only, how many on each: an all-NaN reference (a float16
    # model onnxruntime overflows) had read as "max abs err inf" alone.
    nans = (f"; NaN in {int(np.isnan(e).sum())} expected and {int(np.isnan(a).sum())} computed "
            "element(s)" if one_nan.any() else "")
    return Mismatch(
        name, f"{int(bad.sum())}/{bad.size} element(s) beyond "
        f"rtol={metrics.effective_rtol(exp, got, rtol):.3g} atol={atol:.3g} "
        f"(max abs err {float(np.nanmax(diff)):.3g}{nans})",
        float(np.nanmax(diff)), float(np.nanmax(np.where(bad, rel, 0.0))))


def largest_magnitude(value: Any) -> float:
    """The largest finite magnitude of a float tensor; 0 for anything else or none finite."""
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        return 0.0
    finite = np.abs(value[np.isfinite(value)].astype(np.float64))
    return float(finite.max()) if finite.size else 0.0


def max_abs_error(expected: Any, actual: Any) -> float:
    """The largest |actual - expected| over the float tensors inside two outputs of the same
    structure (0 where there are none)."""
    largest = 0.0
    for pair in paired("", expected, actual):
        if isinstance(pair, Mismatch):
            continue
        _, exp, got = pair
        exp, got = widened(exp), widened(got)
        if exp.dtype.kind in "fc" and exp.size and exp.shape == got.shape:
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN
                diff = np.abs(got.astype(np.complex128 if exp.dtype.kind == "c" else np.float64)
                              - exp)
                # Equal infinities and NaN against NaN agree; a NaN against a number is
                # infinitely off (max() would drop it: max(0.0, nan) is 0.0).
                diff = np.where((got == exp) | (np.isnan(got) & np.isnan(exp)), 0.0, diff)
            if np.isnan(diff).any():
                return math.inf
            largest = max(largest, float(np.max(diff)))
    return largest
