"""Fuzzing the two doors hostile files come in by: the ONNX importer behind `graphopt.optimize`
and the `.om` loader behind `graphopt.load`. Every input must compile or load (and then run
sanely) or raise a GraphoptError with a message; no other exception, no hang, no crash.

CI runs a fixed, derandomized set of examples; GRAPHOPT_FUZZ_EXAMPLES=2000 runs more locally."""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import hashlib
import io
import json
import os
import re
import time
import warnings
import zipfile

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, parse_model, run_cli
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics
from graphopt.compile_save import save
from graphopt.compiler import optimize
from graphopt.errors import GraphoptError

EXAMPLES = int(os.environ.get("GRAPHOPT_FUZZ_EXAMPLES", "0")) or None
SLOW_EXAMPLE_SECONDS = 10.0  # one small model: a compile or load past this counts as a hang
HARD_TIMEOUT_SECONDS = 60.0  # a real hang would never return: dump the stacks and exit instead


def fuzz_settings(default_examples: int):
    return settings(max_examples=EXAMPLES or default_examples, deadline=None, derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def hang_guard():
    """Fail a slow example, and kill the process (with every thread's stack) on a real hang,
    which no exception could interrupt inside onnx's or onnxruntime's C++."""
    faulthandler.dump_traceback_later(HARD_TIMEOUT_SECONDS, exit=True)
    start = time.perf_counter()
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    elapsed = time.perf_counter() - start
    assert elapsed < SLOW_EXAMPLE_SECONDS, f"took {elapsed:.1f} s"


def outcome(fn, *args, **kwargs):
    """fn's result, or the GraphoptError it raised (one line of text); any other exception
    fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnx / onnxruntime notices about odd models
        try:
            return fn(*args, **kwargs)
        except GraphoptError as exc:
            message = str(exc).strip()
            assert message and "\n" not in message and "Traceback" not in message, repr(exc)
            return exc


# --- the seed model ----------------------------------------------------------------------------

# Small, but with what hostile input can reach: attributes (Conv, MaxPool, Transpose, Concat),
# a shape computed from constants (folded), weights, a Reshape and a broadcasting Add.
SEED_TEXT = """
g (float[1,3,8,8] x) => (float[1,32] y) {
    c = Conv <pads = [1,1,1,1], kernel_shape = [3,3], strides = [1,1]> (x, w, b)
    r = Relu (c)
    m = MaxPool <kernel_shape = [2,2], strides = [2,2]> (r)
    t = Transpose <perm = [0,1,3,2]> (m)
    shape = Concat <axis = 0> (batch, rest)
    f = Reshape (t, shape)
    y = Add (f, bias)
}"""


def seed_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    return parse_model(SEED_TEXT, w=rng.standard_normal((2, 3, 3, 3)).astype(np.float32),
                       b=np.zeros(2, np.float32), batch=np.array([1], np.int64),
                       rest=np.array([32], np.int64),
                       bias=rng.standard_normal(32).astype(np.float32))


SEED = seed_model()
SEED_BYTES = SEED.SerializeToString()
X = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)

# --- structured mutations of the seed: each takes (model, i, n), i picks a site, n a number ---

HUGE = 2 ** 40
ABSURD_INTS = [-1, 0, -(2 ** 31), 2 ** 31, HUGE, 2 ** 62, -(2 ** 63), 2 ** 63 - 1]


def _pick(seq, i):
    return seq[i % len(seq)] if len(seq) else None


def _values_with_type(model):
    g = model.graph
    return list(g.input) + list(g.output) + list(g.value_info)


def set_dim(model, i, n):
    vi = _pick(_values_with_type(model), i)
    dims = vi.type.tensor_type.shape.dim
    if dims:
        dims[i % len(dims)].dim_value = ABSURD_INTS[n % len(ABSURD_INTS)] % 2 ** 63


def negative_dim(model, i, n):
    # dim_value is int64 in the schema; a negative one is legal protobuf, nonsense ONNX.
    vi = _pick(_values_with_type(model), i)
    dims = vi.type.tensor_type.shape.dim
    if dims:
        dims[i % len(dims)].dim_value = -1 - n


def rank_100(model, i, n):
    vi = _pick(list(model.graph.input) + list(model.graph.output), i)
    vi.type.tensor_type.shape.Clear()
    for k in range(100):
        vi.type.tensor_type.shape.dim.add().dim_value = 1 + (k + n) % 2


def drop_shape(model, i, n):
    _pick(_values_with_type(model), i).type.tensor_type.ClearField("shape")


def set_elem_type(model, i, n):
    vi = _pick(_values_with_type(model), i)
    vi.type.tensor_type.elem_type = [0, TensorProto.STRING, TensorProto.INT64, TensorProto.BOOL,
                                     TensorProto.FLOAT16, 999, -5][n % 7]


def sequence_type(model, i, n):
    vi = _pick(list(model.graph.input), i)
    elem = TensorProto.FLOAT
    vi.type.CopyFrom(helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None)))


def _attr_nodes(model):
    return [node for node in model.graph.node if node.attribute]


def absurd_ints_attr(model, i, n):
    node = _pick(_attr_nodes(model), i)
    attr = _pick(node.attribute, n)
    value = ABSURD_INTS[n % len(ABSURD_INTS)]
    if attr.type == AttributeProto.INTS:
        del attr.ints[:]
        attr.ints.extend([value] * (1 + i % 5))
    else:
        attr.type, attr.i = AttributeProto.INT, value


def empty_ints_attr(model, i, n):
    node = _pick(_attr_nodes(model), i)
    attr = _pick(node.attribute, n)
    del attr.ints[:]
    attr.type = AttributeProto.INTS


def wrong_attr_type(model, i, n):
    node = _pick(_attr_nodes(model), i)
    attr = _pick(node.attribute, n)
    name = attr.name
    node.attribute.remove(attr)
    value = [1.5, "three", [0.5, 2.5], ["a"], numpy_helper.from_array(np.ones(2, np.float32)),
             helper.make_graph([], "empty", [], []), 7][n % 7]
    node.attribute.append(helper.make_attribute(name, value))


def undefined_attr(model, i, n):
    node = _pick(_attr_nodes(model), i)
    attr = _pick(node.attribute, n)
    attr.type = AttributeProto.UNDEFINED


def unknown_attr(model, i, n):
    _pick(model.graph.node, i).attribute.append(helper.make_attribute("bogus", n))


def drop_attr(model, i, n):
    node = _pick(_attr_nodes(model), i)
    node.attribute.remove(_pick(node.attribute, n))


def drop_input(model, i, n):
    node = _pick(model.graph.node, i)
    if node.input:
        del node.input[n % len(node.input)]


def blank_input(model, i, n):
    node = _pick(model.graph.node, i)
    if node.input:
        node.input[n % len(node.input)] = ""


def extra_inputs(model, i, n):
    _pick(model.graph.node, i).input.extend(["x"] * (1 + n % 4))


def undefined_input(model, i, n):
    node = _pick(model.graph.node, i)
    if node.input:
        node.input[n % len(node.input)] = "nowhere"


def extra_outputs(model, i, n):
    _pick(model.graph.node, i).output.extend([f"extra{k}" for k in range(1 + n % 3)])


def drop_outputs(model, i, n):
    del _pick(model.graph.node, i).output[:]


def duplicate_output(model, i, n):
    nodes = model.graph.node
    a, b = _pick(nodes, i), _pick(nodes, n)
    b.output[0] = a.output[0]


def output_shadows_input(model, i, n):
    _pick(model.graph.node, i).output[0] = ["x", "w", "bias"][n % 3]


def duplicate_input(model, i, n):
    model.graph.input.append(copy.deepcopy(_pick(model.graph.input, i)))


def duplicate_initializer(model, i, n):
    model.graph.initializer.append(copy.deepcopy(_pick(model.graph.initializer, i)))


def duplicate_node_name(model, i, n):
    for node in model.graph.node:
        node.name = "same"


def cycle(model, i, n):
    # A node reads a value computed after it, possibly its own output.
    nodes = model.graph.node
    early = nodes[i % len(nodes)]
    late = nodes[i % len(nodes) + n % (len(nodes) - i % len(nodes))]
    if early.input:
        early.input[0] = late.output[0]


def unknown_op(model, i, n):
    node = _pick(model.graph.node, i)
    node.op_type = ["NoSuchOp", "", "conv", "Conv\x00", "If", "Loop", "Scan", "Constant"][n % 8]


def foreign_domain(model, i, n):
    node = _pick(model.graph.node, i)
    node.domain = ["com.microsoft", "ai.onnx.ml", "custom.x", "ai.onnx"][n % 4]


def opset_version(model, i, n):
    model.opset_import[0].version = [0, 1, 6, 7, 11, 99, 10 ** 6, -3][n % 8]


def opset_domain(model, i, n):
    entry = model.opset_import.add()
    entry.domain, entry.version = ["", "com.microsoft", "ai.onnx.ml", "zzz"][n % 4], n % 30


def ir_version(model, i, n):
    model.ir_version = [1, 2, 3, 4, 100, -1, 2 ** 40][n % 7]


def raw_data_length(model, i, n):
    tensor = _pick(model.graph.initializer, i)
    try:
        data = numpy_helper.to_array(tensor).tobytes()
    except (TypeError, ValueError, OSError, onnx.checker.ValidationError):
        data = tensor.raw_data or bytes(8)  # an earlier mutation broke its dtype or location
    tensor.ClearField("float_data")
    tensor.ClearField("int64_data")
    tensor.raw_data = (data + data)[: max(0, len(data) + (n % 9) - 4)] if n % 9 != 4 else b"x"


def tensor_dims(model, i, n):
    tensor = _pick(model.graph.initializer, i)
    del tensor.dims[:]
    tensor.dims.extend([[-1], [HUGE], [HUGE, HUGE], [0], [2 ** 62, 4], [1] * 100][n % 6])


def tensor_dtype(model, i, n):
    _pick(model.graph.initializer, i).data_type = [0, TensorProto.STRING, 999, TensorProto.INT4,
                                                    TensorProto.BOOL, TensorProto.DOUBLE][n % 6]


def typed_data_count(model, i, n):
    tensor = _pick(model.graph.initializer, i)
    tensor.ClearField("raw_data")
    tensor.float_data.extend([1.0] * (n % 5))
    tensor.int64_data.extend([1] * (n % 3))


def external_data(model, i, n):
    tensor = _pick(model.graph.initializer, i)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    location = ["/etc/passwd", "../../x.bin", "missing.bin", "", "/dev/zero"][n % 5]
    tensor.external_data.add(key="location", value=location)
    if n % 2:
        tensor.external_data.add(key="length", value=str(HUGE))


def drop_graph_outputs(model, i, n):
    del model.graph.output[:]


def unproduced_output(model, i, n):
    model.graph.output.add().name = "never"


def drop_nodes(model, i, n):
    del model.graph.node[:]


def input_is_output(model, i, n):
    model.graph.output[0].name = "x"


def bad_subgraph(model, i, n):
    # An If whose branches read undefined values or produce nothing.
    empty = helper.make_graph([], "then", [], [helper.make_tensor_value_info("nope", 1, [1])])
    node = helper.make_node("If", ["cond"], ["iy"], then_branch=empty,
                            else_branch=helper.make_graph([], "else", [], []))
    model.graph.node.append(node)
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    model.graph.output.append(helper.make_tensor_value_info("iy", 1, None))


def recursive_function(model, i, n):
    # A model-local function that calls itself: anything that inlines it must stop.
    call = helper.make_node("Rec", ["a"], ["b"], domain="local")
    fn = helper.make_function("local", "Rec", ["a"], ["b"], [call], [helper.make_opsetid("", 17)])
    model.functions.append(fn)
    model.opset_import.append(helper.make_opsetid("local", 1))
    node = _pick(model.graph.node, i)
    node.op_type, node.domain = "Rec", "local"
    del node.input[1:]
    del node.attribute[:]


def sparse_initializer(model, i, n):
    values = numpy_helper.from_array(np.ones(3, np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, HUGE, -1][: 1 + n % 3], np.int64), "")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [n % 4]))


def huge_pads(model, i, n):
    conv = model.graph.node[0]
    for attr in conv.attribute:
        if attr.name == "pads":
            del attr.ints[:]
            attr.ints.extend([ABSURD_INTS[n % len(ABSURD_INTS)]] * 4)


STRUCTURED = [set_dim, negative_dim, rank_100, drop_shape, set_elem_type, sequence_type,
              absurd_ints_attr, empty_ints_attr, wrong_attr_type, undefined_attr, unknown_attr,
              drop_attr, drop_input, blank_input, extra_inputs, undefined_input, extra_outputs,
              drop_outputs, duplicate_output, output_shadows_input, duplicate_input,
              duplicate_initializer, duplicate_node_name, cycle, unknown_op, foreign_domain,
              opset_version, opset_domain, ir_version, raw_data_length, tensor_dims,
              tensor_dtype, typed_data_count, external_data, drop_graph_outputs,
              unproduced_output, drop_nodes, input_is_output, bad_subgraph, recursive_function,
              sparse_initializer, huge_pads]

mutation = st.tuples(st.sampled_from(STRUCTURED), st.integers(0, 63), st.integers(0, 63))


def mutate(mutations) -> onnx.ModelProto:
    model = copy.deepcopy(SEED)
    for fn, i, n in mutations:
        try:
            fn(model, i, n)
        except (AttributeError, IndexError, ValueError, ZeroDivisionError):
            pass  # nothing left for it to act on (an earlier mutation dropped the nodes)
    return model


def byte_mutations(data: bytes, edits) -> bytes:
    """Truncate, flip, insert or delete bytes at the positions `edits` name."""
    buf = bytearray(data)
    for kind, pos, value in edits:
        if not buf:
            break
        pos %= len(buf)
        if kind == "truncate":
            del buf[pos:]
        elif kind == "flip":
            buf[pos] ^= 1 << (value % 8)
        elif kind == "set":
            buf[pos] = value
        elif kind == "insert":
            buf[pos:pos] = bytes([value]) * (1 + value % 4)
        else:
            del buf[pos:pos + 1 + value % 8]
    return bytes(buf)


byte_edit = st.tuples(st.sampled_from(["truncate", "flip", "set", "insert", "delete"]),
                      st.integers(0, 2 ** 20), st.integers(0, 255))


# --- the property for ONNX input ------------------------------------------------------------


def _feeds(signature: list[dict]) -> dict | None:
    """Seeded feeds for a signature ([{"name", "dtype", "shape"}], as an .om's), or None when
    it has no small static shape of a dtype fed here."""
    rng = np.random.default_rng(2)
    feeds = {}
    for entry in signature:
        shape = entry["shape"]
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        if max(shape, default=0) > 1 << 16 or np.prod(shape, dtype=object) > 1 << 16 \
                or entry["dtype"] not in ("float32", "int64"):
            return None
        feeds[entry["name"]] = rng.standard_normal(shape).astype(entry["dtype"])
    return feeds


def _ort_session(data: bytes):
    """An onnxruntime session on the (mutated) original, or None if onnxruntime refuses it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal just means there is nothing to compare with
        return None


def _runs_in_onnxruntime(data: bytes) -> bool:
    """Whether onnxruntime runs the (mutated) original on seeded feeds of its declared
    signature (False also when it has no small static one to feed)."""
    session = _ort_session(data)
    if session is None:
        return False
    dtypes = {"tensor(float)": "float32", "tensor(int64)": "int64"}
    entries = [{"name": i.name, "dtype": dtypes.get(i.type), "shape": i.shape}
               for i in session.get_inputs()]
    feeds = _feeds(entries)
    return feeds is not None and _reference(data, feeds) is not None


def _reference(data: bytes, feeds: dict):
    """onnxruntime's outputs for the (mutated) original, or None if it refuses to run it."""
    session = _ort_session(data)
    try:
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(None, feeds)))
    except Exception:  # noqa: BLE001 - as above (None has no get_outputs either)
        return None


def check_compile(data: bytes, workdir) -> None:
    """optimize(bytes) → save(.om) → load → run: each step succeeds or raises GraphoptError
    (never a PassError: bad input must be refused at import, not found by a pass); what runs
    must agree with onnxruntime on the original wherever onnxruntime runs that."""
    result = outcome(optimize, data)
    if isinstance(result, GraphoptError):
        assert not isinstance(result, graphopt.errors.PassError), str(result)
        event(f"optimize refused it ({type(result).__name__})")
        return
    assert result.to_onnx().SerializeToString()
    path = os.path.join(workdir, "fuzz.om")
    saved = outcome(save, result, path)
    if isinstance(saved, GraphoptError):
        # A compile the artifact cannot hold is refused at save, and only for a model
        # onnxruntime cannot run either (the refusal had ended the example unchecked).
        assert not isinstance(saved, graphopt.errors.PassError), str(saved)
        assert not _runs_in_onnxruntime(data), f"onnxruntime runs the original: {saved}"
        event(f"compiled; save refused it ({type(saved).__name__})")
        return
    session = outcome(graphopt.load, path)
    if isinstance(session, GraphoptError):
        # onnxruntime may load a model it can never run (a Reshape to a size the data does
        # not have); once graphopt folded that shape, the loader sees the contradiction.
        assert not _runs_in_onnxruntime(data), f"onnxruntime runs the original: {session}"
        event("compiled; load refused it (onnxruntime cannot run the original)")
        return
    feeds = _feeds(session.inputs)
    if feeds is None:
        event("compiled and loaded; no small static inputs to run")
        return
    outputs = outcome(session.run, feeds)
    if isinstance(outputs, GraphoptError):
        assert _reference(data, feeds) is None, f"onnxruntime runs the original: {outputs}"
        event("compiled and loaded; run refused (as onnxruntime does on the original)")
        return
    assert list(outputs) == [o["name"] for o in session.outputs]
    expected = _reference(data, feeds)
    event("ran; " + ("matches onnxruntime" if expected is not None else
                     "onnxruntime refuses the original"))
    for name, array in (expected or {}).items():
        got = outputs[name]
        if got.dtype.kind == "f" and not (np.isfinite(got).all() and np.isfinite(array).all()):
            # A NaN or Inf (a mutated weight, an overflow) reaches different elements under
            # different kernels: onnxruntime's own ENABLE_ALL differs from its DISABLE_ALL
            # there. The elements finite in both must still agree.
            both = np.isfinite(got) & np.isfinite(array)
            got, array = got[both], array[both]
        np.testing.assert_allclose(got, array, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fuzz"))


def test_the_seed_compiles_and_matches_onnxruntime(workdir):
    # Without this the properties below could pass by refusing everything.
    result = optimize(SEED_BYTES)
    save(result, os.path.join(workdir, "seed.om"))
    y = graphopt.load(os.path.join(workdir, "seed.om")).run({"x": X})["y"]
    np.testing.assert_allclose(y, _reference(SEED_BYTES, {"x": X})["y"], rtol=1e-4, atol=1e-5)


@fuzz_settings(300)
@given(mutations=st.lists(mutation, min_size=1, max_size=3))
def test_structured_onnx_mutations_compile_or_fail_cleanly(workdir, mutations):
    with hang_guard():
        check_compile(mutate(mutations).SerializeToString(), workdir)


@fuzz_settings(300)
@given(edits=st.lists(byte_edit, min_size=1, max_size=4))
def test_corrupted_onnx_bytes_compile_or_fail_cleanly(workdir, edits):
    with hang_guard():
        check_compile(byte_mutations(SEED_BYTES, edits), workdir)


def negative_kernel() -> onnx.ModelProto:
    model = copy.deepcopy(SEED)
    (pool,) = [n for n in model.graph.node if n.op_type == "MaxPool"]
    pool.name = "pool1"
    (kernel,) = [a for a in pool.attribute if a.name == "kernel_shape"]
    kernel.ints[:] = [-1, -1]
    return model


def prelu_opset6() -> onnx.ModelProto:
    """A valid model onnxruntime cannot load: its CPU PRelu kernels start at version 7."""
    return parse_model("g (float[2,3] x) => (float[2,3] y) { y = PRelu (x, slope) }",
                       header='<ir_version: 3, opset_import: ["" : 6]>\n',
                       slope=np.full(3, 0.1, np.float32))


def training_gradient() -> onnx.ModelProto:
    """A valid training op: no onnxruntime kernel at any version, no function body."""
    return parse_model(
        "g (float[2] a, float[2] b) => (float[2] da) { da = ai.onnx.preview.training.Gradient "
        "<xs = [\"a\"], y = \"c\">(a, b) }",
        header='<ir_version: 8, opset_import: ["" : 17, "ai.onnx.preview.training" : 1]>\n')


def cast_to_float4() -> onnx.ModelProto:
    """A Cast onnxruntime has CPU kernels for, none of which writes float4e2m1."""
    return parse_model("g (float[4] x) => (float4e2m1[4] y) { y = Cast <to = 23> (x) }",
                       header='<ir_version: 11, opset_import: ["" : 23]>\n')


def layer_norm_of_two_types() -> onnx.ModelProto:
    """A float16 LayerNormalization with float32 Scale, as TorchScript exports it after
    .half(): its function body would run, but onnxruntime's schema check refuses the node."""
    return parse_model("g (float16[2,4] x, float[4] s) => (float16[2,4] y) { "
                       "y = LayerNormalization (x, s) }", s=np.ones(4, np.float32))


def concat_of_two_types() -> onnx.ModelProto:
    """A Concat of float32 and float64: onnxruntime has kernels for either, not for both."""
    return parse_model("g (float[4] a, double[4] b) => (float[8] y) { y = Concat <axis = 0> "
                       "(a, b) }")


def future_opset() -> onnx.ModelProto:
    """An opset newer than onnx (and so onnxruntime) knows: no schema to check its nodes."""
    model = copy.deepcopy(SEED)
    model.opset_import[0].version = 99
    return model


def untyped_input() -> onnx.ModelProto:
    """A graph input with a name and nothing else: onnxruntime refuses the model at load."""
    model = copy.deepcopy(SEED)
    model.graph.input[0].ClearField("type")
    return model


def output_declared_int64() -> onnx.ModelProto:
    """A float Relu whose graph output is declared int64: the message names both types."""
    return parse_model("g (float[2] x) => (int64[2] y) { y = Relu (x) }")


def sequence_into_relu() -> onnx.ModelProto:
    """A sequence input fed to Relu, which takes a tensor."""
    model = parse_model("g (float[2] x) => (float[2] y) { y = Relu (x) }")
    model.graph.input[0].type.CopyFrom(onnx.helper.make_sequence_type_proto(
        onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)))
    return model


def no_opset_import() -> onnx.ModelProto:
    """A model whose only fault is an empty opset_import: the message names the field."""
    model = copy.deepcopy(SEED)
    del model.opset_import[:]
    return model


def opset_zero() -> onnx.ModelProto:
    """Default-domain opset 0, which never was."""
    model = copy.deepcopy(SEED)
    model.opset_import[0].version = 0
    return model


def initializer_of_another_type() -> onnx.ModelProto:
    """A float input whose initializer holds int64."""
    model = parse_model("g (float[2] x) => (float[2] y) { y = Relu (x) }")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(2, np.int64), "x"))
    return model


def default_domain_twice() -> onnx.ModelProto:
    """'' at 13 and 'ai.onnx' at 1: onnxruntime reads the nodes at one, graphopt at the other
    (an fp16 compile's Casts then load as Cast-1)."""
    model = copy.deepcopy(SEED)
    model.opset_import.add(domain="ai.onnx", version=1)
    return model


def initializer_unlike_its_input() -> onnx.ModelProto:
    """A graph input whose initializer (its default value) has another shape."""
    model = parse_model("g (float[1,4] x) => (float[1,4] y) { y = Relu (x) }")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((2, 2), np.float32),
                                                                "x"))
    return model


def attribute_in_another_field() -> onnx.ModelProto:
    """LeakyRelu's alpha declared FLOAT, its value in the INT field: read as alpha 0, the
    node had compiled to a Relu, where onnx.checker and onnxruntime refuse it."""
    model = parse_model("g (float[2] x) => (float[2] y) { y = LeakyRelu <alpha = 0.1> (x) }")
    (alpha,) = model.graph.node[0].attribute
    alpha.ClearField("f")
    alpha.i = 3
    return model


def function_reading_an_undefined_name() -> onnx.ModelProto:
    """A model-local function whose Relu reads `zz`, which nothing in it defines: the main
    graph's and If bodies' undefined names were refused, a function's compiled to an .om
    that did not run."""
    h = onnx.helper
    body = h.make_function("local", "MyRelu", ["a"], ["b"], [h.make_node("Relu", ["zz"], ["b"])],
                           [h.make_opsetid("", 17)])
    graph = h.make_graph([h.make_node("MyRelu", ["x"], ["y"], domain="local")], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    return h.make_model(graph, functions=[body], ir_version=IR_VERSION,
                        opset_imports=[h.make_opsetid("", 17), h.make_opsetid("local", 1)])


def range_of_zero_step() -> onnx.ModelProto:
    """A Range of constant bounds and step 0, which folding runs: a pass found the fault, and
    its error had not named the file."""
    return parse_model("""
        g (float[1] x) => (float[1] y) <float a = {0.0}, float b = {4.0}, float d = {0.0}> {
            c = Range (a, b, d)
            s = ReduceSum <keepdims = 1> (c)
            y = Add (x, s)
        }""")


def attribute_twice() -> onnx.ModelProto:
    """Softmax with axis given twice: the later one had won silently."""
    model = parse_model("g (float[2,3] x) => (float[2,3] y) { y = Softmax <axis = 0> (x) }")
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("axis", 1))
    return model


@pytest.mark.parametrize("case, message", [
    ("truncated", "not a valid ONNX model"),
    ("attribute_in_another_field", r"node writing 'y' \(LeakyRelu\): attribute 'alpha' is "
                                   r"declared FLOAT but holds an integer \(field i\) "
                                   r"\(onnx.checker and onnxruntime refuse it"),
    ("attribute_twice", r"\(Softmax\): attribute 'axis' is given twice"),
    ("range_of_zero_step", r"node writing 'c' \(Range\) fails on its constant inputs"),
    ("function_reading_an_undefined_name", r"function local::MyRelu: node #0 \(Relu\) reads "
                                           r"undefined value 'zz'"),
    ("output_declared_int64", r"node writing 'y' \(Relu\): shape inference refuses it: "
                              r".*it computes float32 where the model declares int64 for its "
                              r"output"),
    ("sequence_into_relu", r"node writing 'y' \(Relu\): shape inference refuses it: .*it "
                           r"takes or computes a sequence where the model declares a tensor"),
    ("initializer_of_another_type", r"graph input 'x' is declared with element type float32, "
                                    r"its initializer int64"),
    ("no_opset_import", r"not a valid ONNX model: it has no opset_import \(an exporter "),
    ("opset_zero", r"opset_import of domain 'ai.onnx' has version 0"),
    ("default_domain_twice", r"opset_import names the default domain twice, as '' \(version "
                             r"\d+\) and 'ai.onnx' \(version 1\)"),
    ("initializer_unlike_its_input", r"graph input 'x' is declared with shape \[1, 4\], its "
                                     r"initializer \[2, 2\]"),
    ("future_opset", r"opset 99 of the default domain is newer than any this onnx \S+ knows"),
    ("untyped_input", r"graph input '\w+' has no type"),
    ("negative_kernel",
     r"node 'pool1' \(MaxPool\).*kernel_shape must only contain positive values"),
    ("prelu_opset6",
     r"node writing '\w+' \(PRelu\): onnxruntime \S+ has no CPU kernel for PRelu version 6 \(its "
     r"kernels cover versions 7-8, 9-15, 16\); onnx.version_converter can move the model"),
    ("cast_to_float4",
     r"node writing '\w+' \(Cast\): onnxruntime's CPU provider has no Cast-23 kernel for these dtypes "
     r"\(x float32, y float4e2m1\), so no session can load it"),
    ("layer_norm_of_two_types",
     r"node writing 'y' \(LayerNormalization\): its type parameter T is bound to float16 by its "
     r"input X and to float32 by its input Scale; onnxruntime refuses the model \(PyTorch's "
     r"TorchScript exporter writes this for a float16 model: export it in float32 and compile "
     r"with --precision fp16"),
    ("concat_of_two_types",
     r"\(Concat\): its type parameter T is bound to float32 by its input #0 \(inputs\) and "
     r"to float64 by its input #1 \(inputs\)"),
    ("training_gradient",
     r"\(ai.onnx.preview.training::Gradient\): onnxruntime \S+ has no CPU kernel for "
     r"ai.onnx.preview.training::Gradient \(no function body to expand either\)"),
])
def test_cli_names_the_file_and_writes_nothing(tmp_path, capsys, case, message):
    data = SEED_BYTES[:200] if case == "truncated" else globals()[case]().SerializeToString()
    source = tmp_path / "bad.onnx"
    source.write_bytes(data)
    out = tmp_path / "bad.om"
    rc, stdout, stderr = run_cli(capsys, "optimize", source, "-o", out)
    assert rc == 1 and stderr.startswith(f"graphopt: error: {source}: "), stderr
    assert re.search(message, stderr) and "Traceback" not in stderr, stderr
    assert os.listdir(tmp_path) == ["bad.onnx"]  # no output, no temporary file left behind


# --- .om artifacts ---------------------------------------------------------------------------

UNSAFE_NAMES = ["../evil.onnx", "/etc/evil", "partitions/../../x", "C:evil", "a\\b", "a//b",
                "./manifest.json", "partitions/", "x\x00y", "weights/../manifest.json"]
ABSURD_JSON = [None, 0, -1, 2 ** 70, "", "\udcff", "x" * 300, [], {}, True, 1.5, [None],
               {"name": None}, float("nan")]


def big_matmul() -> onnx.ModelProto:
    """A MatMul whose 1 MiB weight becomes a weights blob that onnxruntime maps from the .om."""
    w = np.random.default_rng(3).standard_normal((512, 512)).astype(np.float32)
    return parse_model("g (float[2,512] x) => (float[2,512] y) { y = MatMul (x, w) }", w=w)


def profiled_matmul() -> onnx.ModelProto:
    """big_matmul with a dynamic batch, compiled with two shape profiles sharing its blob."""
    w = np.random.default_rng(4).standard_normal((512, 512)).astype(np.float32)
    return parse_model("g (float[B,512] x) => (float[B,512] y) { y = MatMul (x, w) }", w=w)


def om_bytes(proto: onnx.ModelProto, path, **options) -> bytes:
    save(optimize(proto, target="cpu", **options), path)
    with open(path, "rb") as f:
        return f.read()


def read_zip(data: bytes) -> tuple[dict, dict[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    return json.loads(members.pop("manifest.json")), members


def write_zip(manifest, members: dict[str, bytes] | list, manifest_bytes: bytes | None = None):
    """An .om from parts: partitions and weights stored (as graphopt writes them), the rest
    deflated."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name" when a case asks for one
        with zipfile.ZipFile(buf, "w") as zf:
            if manifest_bytes is None:
                manifest_bytes = json.dumps(manifest).encode("utf-8", "surrogatepass")
            zf.writestr("manifest.json", manifest_bytes, zipfile.ZIP_DEFLATED)
            items = members.items() if isinstance(members, dict) else members
            for name, data in items:
                stored = name.startswith(("weights/", "partitions/"))  # as graphopt writes
                zf.writestr(name, data, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def resum(manifest, members: dict[str, bytes]) -> None:
    """Refresh every member's checksum, as a forger would."""
    for name, data in members.items():
        manifest["members"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def json_paths(value, prefix=()):
    """Every path (tuple of keys / indices) into a JSON value, the root excluded."""
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, child in items:
        yield prefix + (key,)
        yield from json_paths(child, prefix + (key,))


def edit_manifest(manifest, i: int, n: int) -> None:
    paths = list(json_paths(manifest))
    *parents, last = paths[i % len(paths)]
    target = manifest
    for key in parents:
        target = target[key]
    if n % 5 == 0 and isinstance(target, dict):
        del target[last]
    else:
        target[last] = copy.deepcopy(ABSURD_JSON[n % len(ABSURD_JSON)])


def forge_member(manifest, members, i: int, n: int) -> None:
    """Replace a partition's model with a hostile one and refresh the checksums: what reaches
    onnxruntime is then whatever the forger wrote."""
    name = sorted(k for k in members if k.startswith("partitions/"))[i % 1]
    fn = STRUCTURED[n % len(STRUCTURED)]
    members[name] = mutate([(fn, i, n)]).SerializeToString() if n % 3 else \
        byte_mutations(members[name], [("flip", i * 7919 + n, n)])
    resum(manifest, members)


def om_mutation(original: bytes, kind: str, i: int, n: int) -> tuple[bytes, bool]:
    """(the mutated artifact, whether its checksums were forged)."""
    if kind == "bytes":
        return byte_mutations(original, [("flip", i * 7919, n), ("flip", n * 104729, i)]), False
    if kind == "truncate":
        return original[: (i * 7919 + n) % len(original)], False
    manifest, members = read_zip(original)
    if kind == "manifest":
        edit_manifest(manifest, i, n)
        return write_zip(manifest, members), False
    if kind == "format_version":
        manifest["format_version"] = [0, 2, -1, "1", 1.0, None, 2 ** 63, True][n % 8]
        return write_zip(manifest, members), False
    if kind == "unsafe_name":
        name = UNSAFE_NAMES[n % len(UNSAFE_NAMES)]
        members[name] = b"payload"
        if i % 2:
            resum(manifest, members)
        return write_zip(manifest, members), bool(i % 2)
    if kind == "duplicate_member":
        name = sorted(members)[i % len(members)]
        return write_zip(manifest, list(members.items()) + [(name, b"other")]), False
    if kind == "bad_manifest_bytes":
        data = [b"\xff\xfe{}", b"[]", b"{", b"null", b'{"format": "graphopt-om"}',
                json.dumps(manifest).encode()[: n * 10]][n % 6]
        return write_zip(None, members, manifest_bytes=data), False
    if kind == "size":
        name = sorted(members)[i % len(members)]
        manifest["members"][name]["size"] = [2 ** 40, -1, 0, 2 ** 63][n % 4]
        return write_zip(manifest, members), False
    if kind == "metadata":  # what the runtime reads from a partition before onnxruntime does
        names = sorted(k for k in members if k.startswith("partitions/"))
        name = names[i % len(names)]
        model = onnx.ModelProto.FromString(members[name])
        entry = model.metadata_props.add()
        entry.key = ["graphopt.nchwc_block_size", "x"][i % 2]
        entry.value = ["x", "-1", "99", "", "8" * 400, "\u0668"][n % 6]
        members[name] = model.SerializeToString()
        resum(manifest, members)
        return write_zip(manifest, members), True
    assert kind == "forge"
    forge_member(manifest, members, i, n)
    return write_zip(manifest, members), True


OM_KINDS = ["bytes", "truncate", "manifest", "format_version", "unsafe_name", "duplicate_member",
            "bad_manifest_bytes", "size", "metadata", "forge"]


class Artifacts(dict):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"<artifacts {', '.join(self)}>"


@pytest.fixture(scope="module")
def artifacts(workdir):
    """name -> (valid .om bytes, seeded feeds, its outputs on them)."""
    made = Artifacts()
    for name, proto, options in (("seed", SEED, {}), ("blob", big_matmul(), {}),
                                 ("profiles", profiled_matmul(), {"dynamic_dims": "B:1,2"})):
        path = os.path.join(workdir, f"{name}.om")
        data = om_bytes(proto, path, **options)
        session = graphopt.load(path)
        # A profiled artifact's feeds: its second profile's shapes.
        feeds = _feeds(session.profiles[-1]["inputs"] if session.profiles else session.inputs)
        made[name] = (data, feeds, session.run(feeds))
    return made


def check_load(data: bytes, path: str, feeds: dict, expected: dict, forged: bool) -> None:
    """graphopt.load and run: each succeeds or raises GraphoptError. An artifact whose
    checksums were not forged is either refused or computes what the original did."""
    with open(path, "wb") as f:
        f.write(data)
    session = outcome(graphopt.load, path)
    if isinstance(session, GraphoptError):
        assert path in str(session), str(session)
        event(f"load refused it ({type(session).__name__})")
        return
    outputs = outcome(session.run, feeds)
    if isinstance(outputs, GraphoptError) or forged:
        event("loaded; forged or run refused")
        return
    event("loaded; same outputs as the original")
    assert sorted(outputs) == sorted(expected)
    for name, array in expected.items():
        np.testing.assert_allclose(outputs[name], array, rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_seed_artifacts_load(artifacts):
    assert all(expected for _, _, expected in artifacts.values())
    manifest, members = read_zip(artifacts["blob"][0])
    assert any(name.startswith("weights/") for name in members)  # the mapped-weights path
    manifest, members = read_zip(artifacts["profiles"][0])
    assert len(manifest["profiles"]) == 2 and artifacts["profiles"][1]["x"].shape == (2, 512)
    assert len([name for name in members if name.startswith("weights/")]) == 1


@fuzz_settings(400)
@given(which=st.sampled_from(["seed", "blob", "profiles"]), kind=st.sampled_from(OM_KINDS),
       i=st.integers(0, 2 ** 16), n=st.integers(0, 2 ** 16))
def test_mutated_artifacts_load_or_fail_cleanly(artifacts, workdir, which, kind, i, n):
    original, feeds, expected = artifacts[which]
    data, forged = om_mutation(original, kind, i, n)
    with hang_guard():
        check_load(data, os.path.join(workdir, "mutant.om"), feeds, expected, forged)


def _patch_central_sizes(data: bytes, name: str, size: int) -> bytes:
    """Rewrite `name`'s sizes in the zip's central directory, which zipfile trusts."""
    data = bytearray(data)
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        length = int.from_bytes(data[at + 28:at + 30], "little")
        if data[at + 46:at + 46 + length] == name.encode():
            data[at + 20:at + 28] = size.to_bytes(4, "little") * 2  # compressed, uncompressed
        at = data.find(b"PK\x01\x02", at + 4)
    return bytes(data)


def test_member_declaring_four_gigabytes_is_refused_without_reading_them(artifacts, workdir):
    manifest, members = read_zip(artifacts["seed"][0])
    (name,) = [m for m in members if m.startswith("partitions/")]
    manifest["members"][name]["size"] = 0xFFFFFFF0
    data = _patch_central_sizes(write_zip(manifest, members), name, 0xFFFFFFF0)
    path = os.path.join(workdir, "huge.om")
    with open(path, "wb") as f:
        f.write(data)
    with hang_guard(), pytest.raises(graphopt.errors.ArtifactError,
                                     match=f"{name}' is implausibly large"):
        graphopt.load(path)


def _with_bomb(artifacts, size: int) -> tuple[dict, dict[str, bytes]]:
    """The seed artifact's manifest and members with `size` zero bytes (deflating to next to
    nothing) added as tuning/bomb.bin, its size and sum declared."""
    manifest, members = read_zip(artifacts["seed"][0])
    members["tuning/bomb.bin"] = bytes(size)
    resum(manifest, members)
    return manifest, members


def _written(workdir, name: str, data: bytes) -> str:
    path = os.path.join(workdir, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_zip_bomb_member_is_inflated_only_to_its_declared_size(artifacts, workdir):
    # 32 MiB of zeros deflate to ~32 KiB; the manifest's size bounds what is inflated, and
    # the checksum then refuses it.
    manifest, members = _with_bomb(artifacts, 32 << 20)
    manifest["members"]["tuning/bomb.bin"]["sha256"] = "0" * 64
    path = _written(workdir, "bomb.om", write_zip(manifest, members))
    assert os.path.getsize(path) < 1 << 20
    with hang_guard(), pytest.raises(graphopt.errors.ArtifactError,
                                     match="'tuning/bomb.bin' fails its sha256"):
        graphopt.load(path)


def test_zip_bomb_member_declared_honestly_is_refused_by_its_size(artifacts, workdir,
                                                                  monkeypatch):
    # A 3 MB file whose details.json inflates to 3 GiB, declared as such with its true sum,
    # took 6 GB of memory to load; members other than partitions now stop at 256 MiB (here
    # lowered to 1 MiB to keep the test small).
    from graphopt.codegen import om_read

    monkeypatch.setattr(om_read, "_MAX_OTHER_BYTES", 1 << 20)
    path = _written(workdir, "honest_bomb.om", write_zip(*_with_bomb(artifacts, 2 << 20)))
    with pytest.raises(graphopt.errors.ArtifactError,
                       match=r"'tuning/bomb.bin' is implausibly large \(2097152 bytes"):
        graphopt.load(path)


def test_a_member_inflating_past_its_declared_size_is_cut_at_it(artifacts, workdir):
    # The zip directory and the manifest say 1000 bytes; the stream inflates to 64 MiB, which
    # zipfile's read() inflated whole (up to 2 GiB at once) before cutting it.
    import tracemalloc

    manifest, members = _with_bomb(artifacts, 64 << 20)
    manifest["members"]["tuning/bomb.bin"]["size"] = 1000
    data = bytearray(write_zip(manifest, members))
    entry = data.rfind(b"PK\x01\x02", 0, data.rfind(b"tuning/bomb.bin"))  # its directory entry
    data[entry + 24:entry + 28] = (1000).to_bytes(4, "little")  # the uncompressed size alone
    path = _written(workdir, "liar_bomb.om", bytes(data))
    tracemalloc.start()
    try:
        with pytest.raises(graphopt.errors.ArtifactError, match="'tuning/bomb.bin'"):
            graphopt.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_large_weight_of_the_wrong_length_is_refused_at_import():
    # Found by hand next to the fuzzer: compiled, it became an .om whose weights blob
    # disagreed with its own manifest ("tampered or corrupt") instead of naming the weight.
    model = big_matmul()
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    with pytest.raises(graphopt.errors.InputError,
                       match=r"initializer 'w': float32 tensor of shape \[512, 512\] needs "
                             r"1048576 bytes of data, has 1048572"):
        optimize(model.SerializeToString())
    # The typed field's form: counted in that field's entries, which it names.
    typed = onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    typed.dims[:] = [2, 3]
    model.graph.initializer[0].CopyFrom(typed)
    with pytest.raises(graphopt.errors.InputError,
                       match=r"initializer 'w': float32 tensor of shape \[2, 3\] needs 6 "
                             r"entries in its float_data field, has 2$"):
        optimize(model.SerializeToString())


def test_a_model_onnxruntime_cannot_load_compiles_with_a_note_saying_so():
    # A Pad mode no kernel takes: onnxruntime refuses the model at load, and would refuse the
    # compile; the compile says so rather than writing an artifact that silently cannot load.
    model = parse_model('g (float[2,3] x) => (float[4,5] y) { y = Pad <mode = "bogus"> (x, p) }',
                        p=np.array([1, 1, 1, 1], np.int64))
    result = graphopt.optimize(model)
    (note,) = [n for n in result.notes if "cannot load the model as given" in n]
    assert "Invalid 'mode' attribute value" in note and "will not load" in note


@pytest.mark.parametrize("target", [None, "cpu"])
def test_a_model_whose_kernel_onnxruntime_lacks_compiles_with_the_note_too(target):
    # A bf16 Attention-23 (one of onnx's node tests) expands to a bfloat16 Expand, which the
    # CPU provider has no kernel for: a missing kernel was taken for a device's gap and left to
    # the runtime, and the .om did not load.
    model = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 23]> g (bfloat16[1,4,8] q, bfloat16[1,4,8] k, '
        'bfloat16[1,4,8] v) => (bfloat16[1,4,8] y) '
        '{ y = Attention <q_num_heads = 2, kv_num_heads = 2, is_causal = 1> (q, k, v) }')
    if numerics.load_refusal(model.SerializeToString()) is None:
        pytest.skip("this onnxruntime has a CPU kernel for every op of the expansion")
    result = graphopt.optimize(model, target=target)
    (note,) = [n for n in result.notes if "cannot load the model as given" in n]
    assert "NOT_IMPLEMENTED" in note and "Expand" in note and "will not load" in note


def test_the_note_on_an_npu_targets_compile_names_the_devices_provider():
    # A bfloat16 Conv: no CPU kernel here, but ascend910b's artifact runs on CANN's provider
    model = parse_model("g (bfloat16[1,2,4,4] x) => (bfloat16[1,2,4,4] y) { y = Conv(x, w) }",
                        w=np.ones((2, 2, 1, 1), np.float32).astype(ml_dtypes.bfloat16))
    result = graphopt.optimize(model, target="ascend910b")
    (note,) = [n for n in result.notes if "cannot load the model as given" in n]
    assert note.endswith("(the output will not load on this onnxruntime's CPU provider; "
                         "CANNExecutionProvider may load it)"), note


def test_a_compile_onnxruntime_cannot_load_where_it_loads_the_original_is_refused(monkeypatch):
    import graphopt.compile_checks as compile_checks

    real = compile_checks.onnxruntime_refusal
    broken = "[ONNXRuntimeError] : 1 : FAIL : Node () Op (Add) Incompatible dimensions"
    monkeypatch.setattr(compile_checks, "onnxruntime_refusal",
                        lambda model, weightless=True: broken if model.graph.nodes() else
                        real(model, weightless))
    model = parse_model("g (float[2,3] x) => (float[2,3] y) { y = Relu (x) }")
    with pytest.raises(GraphoptError, match=r"^<model>: onnxruntime cannot load the compiled "
                                            r"model, where it loads the original: .*Incompatible"
                                            r" dimensions\. If the original runs, this is a "
                                            r"graphopt bug"):
        graphopt.optimize(model)


def test_the_load_check_sees_the_value_types_the_output_is_written_with():
    # The types the compile found are written with the model, and onnxruntime checks a model-
    # local function's body against them: an -O3 elementwise group over a Reshape whose shape
    # input only graphopt's inference sizes loaded in the check without them, and the .om it
    # wrote did not load. Here r's type [N, 2, 2] is such a type, which a Mul by [3] refuses.
    from graphopt.compile_checks import onnxruntime_refusal
    from graphopt.ir import load_onnx

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "t"], ["r"]), helper.make_node("Mul", ["r", "c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
              helper.make_tensor_value_info("t", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones(3, np.float32), "c")],
        value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 2, 2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    assert "Incompatible dimensions" in numerics.load_refusal(proto.SerializeToString())
    assert "Incompatible dimensions" in onnxruntime_refusal(load_onnx(proto))


def test_a_model_onnxruntime_loads_only_with_its_optimizer_off_is_blamed_not_the_compile():
    # The Reshape's rank is unknown until its shape folds (a Slice to a computed end); then the
    # LSTM in the If's branch reads rank 2. onnxruntime loads this only at ORT_DISABLE_ALL, its
    # optimizer folds the shape and refuses it, and so does the compile, which folds it too.
    hidden = 4
    lstm = helper.make_graph(
        [helper.make_node("LSTM", ["y", "W", "R"], ["h"], hidden_size=hidden)], "then", [],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)])
    same = helper.make_graph([helper.make_node("Identity", ["y"], ["e"])], "else", [],
                             [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    model = parse_model(
        "g (float[6] x, bool c, int64[3] vec, int64[1] one, int64[1] zero, float[1,16,3] W,"
        " float[1,16,4] R) => (float out) {"
        " end = Add (one, one) shape = Slice (vec, zero, end) y = Reshape (x, shape) }",
        vec=np.array([2, 3, 1], np.int64), one=np.array([1], np.int64),
        zero=np.array([0], np.int64), W=np.ones((1, 4 * hidden, 3), np.float32),
        R=np.ones((1, 4 * hidden, hidden), np.float32))
    model.graph.node.append(helper.make_node("If", ["c"], ["out"], then_branch=lstm,
                                             else_branch=same))
    with pytest.raises(GraphoptError, match=r"^<model>: onnxruntime loads the original only "
                                            r"with its graph optimizations off .*First input "
                                            r"tensor must have rank 3.*The model is at fault"):
        graphopt.optimize(model)


def test_optimize_quiet_still_warns_of_an_output_that_will_not_load(tmp_path, capsys):
    model = parse_model('g (float[2,3] x) => (float[4,5] y) { y = Pad <mode = "bogus"> (x, p) }',
                        p=np.array([1, 1, 1, 1], np.int64))
    onnx.save(model, tmp_path / "pad.onnx")
    rc, out, err = run_cli(capsys, "optimize", tmp_path / "pad.onnx", "-o", tmp_path / "pad.om",
                           "-q")
    assert rc == 0 and not out
    assert err.startswith("graphopt: warning: onnxruntime cannot load the model as given"), err
