"""The input check's inference node by node, once per kind: the same verdicts and static types
as ONNX's whole-model strict inference, on the onnx wheel's corpus and on hand-made models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from helpers import IR_VERSION

from graphopt.errors import InputError
from graphopt.ir import load_onnx
from graphopt.kind_inference import infer_by_kind
from graphopt.opcheck import _schema_key, check_inference, check_ops
from graphopt.passes.infer_shapes import record_type_bytes

from corpus import corpus_models


def _static_types(model) -> dict[str, tuple]:
    return {v.name: (v.dtype, v.shape) for v in model.graph.all_values()}


def _checked(path_or_proto, whole: bool):
    """(verdict, static types) of the whole-model run or of inference by kind (which falls
    back to the whole-model run, as check_ops does): verdict None when the check passes, else
    its InputError. Inference by kind is asked directly, whatever the graph's size."""
    model = load_onnx(path_or_proto)
    try:
        types = None if whole else infer_by_kind(model, "m.onnx", _kinds(model))
        if types is None:
            types = check_inference(model, "m.onnx")
    except InputError as exc:
        return exc, None
    if types is not None:
        record_type_bytes(model, types, static_only=True)
    return None, _static_types(model)


def _kinds(model) -> list:
    return [_schema_key(node) for node in model.graph]


def test_the_corpus_gets_the_whole_model_inferences_types():
    """Every corpus model the kind inference takes on: accepted or refused alike, and the same
    static types recorded on every value."""
    taken = 0
    for entry in corpus_models():
        try:
            model = load_onnx(entry.path)
        except InputError:
            continue
        try:
            check_ops(model, "m.onnx")  # schema problems come first, on either path
        except InputError:
            pass
        try:
            by_kind = infer_by_kind(load_onnx(entry.path), "m.onnx", _kinds(model))
        except InputError:
            by_kind = "refused"
        if by_kind is None:
            continue  # nested graphs, functions, …: the whole-model run decides
        taken += 1
        whole_error, whole_types = _checked(entry.path, whole=True)
        if by_kind == "refused":
            assert whole_error is not None, entry.id
            continue
        assert whole_error is None, entry.id
        model = load_onnx(entry.path)
        record_type_bytes(model, by_kind, static_only=True)
        assert _static_types(model) == whole_types, entry.id
    assert taken > 100  # most of the corpus: a test of something


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=IR_VERSION)


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])


def _y(dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info("y", dtype, None)


@pytest.mark.parametrize("constant", [
    {"value_ints": [-1, -1]},
    {"value": numpy_helper.from_array(np.array([-1, -1], np.int64))},
], ids=["value_ints", "value"])
def test_a_constant_shape_is_data_as_in_the_whole_model_run(constant):
    proto = _model([helper.make_node("Constant", [], ["s"], **constant),
                    helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
                   [X], [_y()])
    error, _ = _checked(proto, whole=False)
    assert isinstance(error, InputError)
    assert "bad_reshape" in str(error) and "multiple -1" in str(error)
    assert _checked(proto, whole=True)[0] is not None


def test_a_small_weight_is_data_and_each_distinct_one_is_asked(monkeypatch):
    """Two Reshapes alike but for their target shapes: each gets its own type."""
    shapes = [numpy_helper.from_array(np.array(s, np.int64), n)
              for n, s in (("s1", [6, 4]), ("s2", [4, 6]))]
    proto = _model([helper.make_node("Reshape", ["x", "s1"], ["a"]),
                    helper.make_node("Reshape", ["x", "s2"], ["y"])], [X], [_y()], shapes)
    _, types = _checked(proto, whole=False)
    assert types["a"][1] == (6, 4) and types["y"][1] == (4, 6)
    assert types == _checked(proto, whole=True)[1]


def test_a_kind_that_ignores_its_data_is_asked_once(monkeypatch):
    """Adds of different biases: ONNX is asked with and without the first bias, sees no
    difference, and the other Adds take that answer."""
    calls = []
    real = onnx.shape_inference.infer_node_outputs

    def counted(schema, node, *args, **kwargs):
        calls.append(node.op_type)
        return real(schema, node, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_node_outputs", counted)
    biases = [numpy_helper.from_array(np.full(4, i, np.float32), f"b{i}") for i in range(5)]
    names = ["x", "t0", "t1", "t2", "t3", "y"]
    nodes = [helper.make_node("Add", [names[i], f"b{i}"], [names[i + 1]]) for i in range(5)]
    proto = _model(nodes, [X], [_y()], biases)
    _, types = _checked(proto, whole=False)
    assert calls == ["Add", "Add"]
    assert all(types[n][1] == (2, 3, 4) for n in names)


def test_a_declared_output_type_that_differs_is_refused():
    proto = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [X],
                   [_y(TensorProto.INT64)])
    error, _ = _checked(proto, whole=False)
    assert isinstance(error, InputError)
    assert "graph output 'y' is declared int64" in str(error) and "'r' (Relu)" in str(error)
    assert _checked(proto, whole=True)[0] is not None


def test_a_type_the_per_node_check_refuses_goes_to_the_whole_model_run():
    """Relu of int64 at opset 13: ONNX's per-node call checks input types, the whole-model run
    (check_type off) does not; the whole-model run decides, as before."""
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [3])
    proto = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [_y(TensorProto.INT64)],
                   opset=13)
    model = load_onnx(proto)
    assert infer_by_kind(model, "m.onnx", _kinds(model)) is None
    assert _checked(proto, whole=False) == _checked(proto, whole=True)


def test_a_custom_op_goes_to_the_whole_model_run():
    proto = _model([helper.make_node("Foo", ["x"], ["t"], domain="com.example"),
                    helper.make_node("Relu", ["t"], ["y"])], [X], [_y()])
    proto.opset_import.append(helper.make_opsetid("com.example", 1))
    model = load_onnx(proto)
    assert infer_by_kind(model, "m.onnx", [None, _schema_key(model.graph.nodes()[1])]) is None


def test_a_graph_whose_nodes_rarely_repeat_a_kind_goes_to_the_whole_model_run():
    """1,100 Pads, each output one element longer than its input: every node a new kind. At
    1,024 nodes the walk has asked ONNX about each, more than one in four, and gives up."""
    pads = numpy_helper.from_array(np.array([0, 1], np.int64), "p")
    names = ["x"] + [f"t{i}" for i in range(1099)] + ["y"]
    nodes = [helper.make_node("Pad", [names[i], "p"], [names[i + 1]]) for i in range(1100)]
    proto = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                   [_y()], [pads])
    model = load_onnx(proto)
    assert infer_by_kind(model, "m.onnx", _kinds(model)) is None
    _, types = _checked(proto, whole=True)
    assert types["y"][1] == (1101,)


@pytest.mark.parametrize("binarizers", [1, 2100])
def test_an_op_without_type_inference_does_not_fault_the_next(binarizers):
    # ai.onnx.ml's Scaler has no type inference: strict mode faulted the Binarizer reading its
    # untyped output, though onnx.checker and onnxruntime take the model.
    from graphopt import numerics
    from graphopt.compiler import optimize

    vi = helper.make_tensor_value_info
    names = ["s"] + [f"b{i}" for i in range(binarizers)]
    nodes = [helper.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[0.5, 0.5],
                              scale=[2.0, 2.0])]
    nodes += [helper.make_node("Binarizer", [names[i]], [names[i + 1]], domain="ai.onnx.ml",
                               threshold=0.0) for i in range(binarizers)]
    graph = helper.make_graph(nodes, "ml", [vi("x", TensorProto.FLOAT, [3, 2])],
                              [vi(names[-1], TensorProto.FLOAT, [3, 2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)],
                                                    ir_version=IR_VERSION)
    onnx.checker.check_model(proto, full_check=True)
    x = np.array([[1, 0], [0.2, 0.7], [-1, 3]], np.float32)
    out = optimize(proto, level=2).to_onnx()
    np.testing.assert_array_equal(numerics.run(out, {"x": x})[names[-1]],
                                  numerics.run(proto, {"x": x})[names[-1]])


def test_it_imports_as_the_first_graphopt_module():
    # kind_inference → passes.facts → passes → precision.policy → kind_inference: a process
    # whose first graphopt import was this module failed with an ImportError.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import graphopt.kind_inference"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
