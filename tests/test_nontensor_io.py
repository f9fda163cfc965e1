"""Models whose inputs or outputs are not plain numpy tensors: sequences (ragged too), maps,
optionals, and bfloat16 tensors, through the runtime, compare, verify, bisect, profile and run."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import IR_VERSION, run_cli
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import graphopt
from graphopt import numerics
from graphopt.errors import GraphoptError
from graphopt.tools.bisect import bisect
from graphopt.tools.compare import compare_models
from graphopt.tools.compare_format import format_report
from graphopt.tools.profile import profile_model

X = np.arange(10, dtype=np.float32).reshape(5, 2) - 4.5


def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 18),)) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs,
                         initializer=[numpy_helper.from_array(a, n) for n, a in initializers])
    model = h.make_model(graph, opset_imports=[h.make_opsetid(d, v) for d, v in opsets],
                         ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def _ragged(split=(2, 3)) -> onnx.ModelProto:
    """x [5,2] split into a sequence of [2,2] and [3,2] (elements of different shapes)."""
    return _model([h.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=0),
                   h.make_node("Relu", ["x"], ["r"])],
                  [h.make_tensor_value_info("x", T.FLOAT, [5, 2])],
                  [h.make_tensor_sequence_value_info("seq", T.FLOAT, None),
                   h.make_tensor_value_info("r", T.FLOAT, [5, 2])],
                  [("split", np.array(split, np.int64))])


def _zipmap(scale=1.0) -> onnx.ModelProto:
    """A uniform sequence, ZipMap's sequence of maps and an empty optional, as outputs."""
    map_type = h.make_sequence_type_proto(h.make_map_type_proto(
        T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))
    return _model([h.make_node("Mul", ["x", "k"], ["xk"]),
                   h.make_node("SequenceConstruct", ["xk", "x"], ["seq"]),
                   h.make_node("ZipMap", ["xk"], ["zm"], domain="ai.onnx.ml",
                               classlabels_int64s=[0, 1]),
                   h.make_node("Optional", [], ["none"],
                               type=h.make_tensor_type_proto(T.FLOAT, [2]))],
                  [h.make_tensor_value_info("x", T.FLOAT, [3, 2])],
                  [h.make_tensor_sequence_value_info("seq", T.FLOAT, [3, 2]),
                   h.make_value_info("zm", map_type),
                   h.make_value_info("none", h.make_optional_type_proto(
                       h.make_tensor_type_proto(T.FLOAT, [2])))],
                  [("k", np.array(scale, np.float32))],
                  opsets=(("", 18), ("ai.onnx.ml", 3)))


def _seq_input(element_shape=(2,)) -> onnx.ModelProto:
    return _model([h.make_node("ConcatFromSequence", ["sin"], ["cat"], axis=0),
                   h.make_node("SequenceLength", ["sin"], ["n"])],
                  [h.make_tensor_sequence_value_info("sin", T.FLOAT, list(element_shape))],
                  [h.make_tensor_value_info("cat", T.FLOAT, [None]),
                   h.make_tensor_value_info("n", T.INT64, [])])


def _bf16() -> onnx.ModelProto:
    """bfloat16 in, bfloat16 out, float32 inside."""
    return _model([h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
                   h.make_node("Relu", ["xf"], ["r"]),
                   h.make_node("Cast", ["r"], ["y"], to=T.BFLOAT16)],
                  [h.make_tensor_value_info("x", T.BFLOAT16, [4])],
                  [h.make_tensor_value_info("y", T.BFLOAT16, [4])], opsets=(("", 17),))


def _reference(model: onnx.ModelProto, feeds: dict) -> list:
    """onnxruntime's own outputs at ORT_DISABLE_ALL, fed as it documents: plain run."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _bf16_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """onnxruntime's bfloat16 output, its input and output bound as OrtValues over the bits
    (the output's over a numpy buffer onnxruntime writes into)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    out = np.zeros(x.shape, np.uint16)
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        x.view(np.uint16), T.BFLOAT16))
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        out, T.BFLOAT16))
    session.run_with_iobinding(binding)
    return out.view(ml_dtypes.bfloat16)


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, path)
    return str(path)


def _om(model: onnx.ModelProto, path) -> str:
    graphopt.save(graphopt.optimize(model, target="cpu"), path)
    return str(path)


# --- 1. sequences of tensors of different shapes -------------------------------------------


@pytest.fixture
def ragged(tmp_path):
    return _save(_ragged(), tmp_path / "ragged.onnx"), _om(_ragged(), tmp_path / "ragged.om")


def test_ragged_sequence_output_runs_element_by_element(ragged, capsys):
    onnx_path, om_path = ragged
    got = graphopt.load(om_path).run({"x": X})
    expected = _reference(_ragged(), {"x": X})
    assert [e.shape for e in got["seq"]] == [(2, 2), (3, 2)]
    for element, want in zip(got["seq"], expected[0]):
        np.testing.assert_array_equal(element, want)
    rc, out, err = run_cli(capsys, "run", om_path)
    assert rc == 0, err
    (line,) = [row for row in out.splitlines() if row.startswith("seq ")]
    assert "seq(float32)" in line and "[2,2], [3,2]" in line


def test_ragged_sequence_output_compares_verifies_bisects_and_profiles(ragged, tmp_path, capsys):
    onnx_path, om_path = ragged
    report = compare_models(onnx_path, om_path, per_tensor=True)
    assert report.passed
    seq = report.outputs[0]
    assert (seq.name, seq.dtype, seq.shape, seq.mismatches) == ("seq", "seq(float32)", (2,), 0)
    assert "seq(float32)[2]" in format_report(report)
    rc, out, err = run_cli(capsys, "optimize", onnx_path, "-o", tmp_path / "v.onnx", "--verify")
    assert rc == 0, err
    assert "verified: 2 output(s)" in out
    assert not bisect(onnx_path).found
    assert profile_model(om_path, repeat=1, warmup=0).kernels
    rc, _, err = run_cli(capsys, "report", om_path, "-o", tmp_path / "r.html",
                         "--reference", onnx_path)
    assert rc == 0, err


def test_ragged_sequences_that_differ_fail_naming_the_element(tmp_path):
    reference = _save(_ragged((2, 3)), tmp_path / "a.onnx")
    candidate = _save(_ragged((3, 2)), tmp_path / "b.onnx")
    (row, _) = compare_models(reference, candidate).outputs
    assert not row.passed
    assert row.note.startswith("seq[0]: shape [3,2] vs reference [2,2]")
    expected = numerics.run(_ragged((2, 3)), {"x": X})
    actual = numerics.run(_ragged((3, 2)), {"x": X})
    problems = numerics.compare(expected, actual)
    assert [str(p) for p in problems] == [
        "output 'seq[0]': shape (3, 2) != expected (2, 2)",
        "output 'seq[1]': shape (2, 2) != expected (3, 2)"]
    shorter = {**actual, "seq": actual["seq"][:1]}
    assert str(numerics.compare(expected, shorter)[0]) == \
        "output 'seq': sequence length 1 != expected 2"


# --- 2. --verify of sequence (and sequence-of-maps) outputs ---------------------------------


def test_verify_passes_on_sequence_and_zipmap_outputs(tmp_path, capsys):
    path = _save(_zipmap(), tmp_path / "zm.onnx")
    rc, out, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "v.onnx", "--verify")
    assert rc == 0, err
    assert "verified: 3 output(s) match the original" in out


def test_sequence_and_map_outputs_that_differ_fail_verification():
    expected = numerics.run(_zipmap(1.0), {"x": X[:3]})
    actual = numerics.run(_zipmap(2.0), {"x": X[:3]})
    problems = {p.output for p in numerics.compare(expected, actual)}
    assert problems == {"seq[0]", "zm[0]", "zm[1]", "zm[2]"}
    assert numerics.compare(expected, expected) == []
    assert numerics.max_abs_error(expected["seq"], actual["seq"]) == pytest.approx(4.5)


# --- 3. a sequence as a graph input ---------------------------------------------------------


@pytest.fixture
def seq_om(tmp_path):
    return _om(_seq_input(), tmp_path / "s.om")


def test_sequence_input_takes_a_list_of_arrays(seq_om):
    session = graphopt.load(seq_om)
    (entry,) = session.inputs
    assert entry["type"] == "seq(float32)" and entry["element"] == {"dtype": "float32",
                                                                    "shape": [2]}
    a, b = np.array([1, 2], np.float32), np.array([3, 4], np.float32)
    got = session.run({"sin": [a, b]})
    cat, n = _reference(_seq_input(), {"sin": [a, b]})
    np.testing.assert_array_equal(got["cat"], cat)
    assert got["n"] == n == 2


@pytest.mark.parametrize("feed, message", [
    (np.ones((2, 2), np.float32),
     r"input 'sin' takes a seq\(float32\) \(a list\), not a float32 array"),
    ([np.ones(2, np.float64)], "input 'sin' element 0 has dtype float64, expected float32"),
    ([np.ones(3, np.float32)], r"input 'sin' element 0 has shape \[3\].*dim 0 must be 2"),
])
def test_sequence_input_refuses_what_does_not_fit(seq_om, feed, message):
    with pytest.raises(GraphoptError, match=message):
        graphopt.load(seq_om).run({"sin": feed})


def test_sequence_input_is_inspected_and_run_on_random_elements(seq_om, capsys):
    rc, out, err = run_cli(capsys, "inspect", seq_om)
    assert rc == 0, err
    (line,) = [row for row in out.splitlines() if row.startswith("input")]
    assert line.split()[2:] == ["seq(float32)", "[2]", "each"]
    rc, out, err = run_cli(capsys, "run", seq_om)
    assert rc == 0, err
    (line,) = [row for row in out.splitlines() if row.startswith("n ")]
    assert line.split()[3] == "2"  # two random elements


def test_sequence_input_of_unknown_element_shape_is_a_clear_error(tmp_path, capsys):
    om = _om(_seq_input(element_shape=("N",)), tmp_path / "dyn.om")
    rc, out, err = run_cli(capsys, "run", om)
    assert rc == 1 and "internal error" not in err
    assert "input 'sin' is a seq(float32) and its elements have no static shape" in err
    assert "feed it from Python" in err and "--inputs FILE.npz" not in err
    assert "size the tensors it holds with --input-shape NAME:DIMS" in err
    rc, out, err = run_cli(capsys, "run", om, "--input-shape", "sin:3")
    assert rc == 0, err


def _optional_input() -> onnx.ModelProto:
    """y = x @ W, plus the optional `opt` when it holds a tensor; x and opt both name dim B."""
    then = h.make_graph([h.make_node("OptionalGetElement", ["opt"], ["held"]),
                         h.make_node("Add", ["xw", "held"], ["sum"])], "then", [],
                        [h.make_tensor_value_info("sum", T.FLOAT, None)])
    other = h.make_graph([h.make_node("Identity", ["xw"], ["same"])], "else", [],
                         [h.make_tensor_value_info("same", T.FLOAT, None)])
    held = h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, ["B", 4]))
    return _model([h.make_node("MatMul", ["x", "w"], ["xw"]),
                   h.make_node("OptionalHasElement", ["opt"], ["has"]),
                   h.make_node("If", ["has"], ["y"], then_branch=then, else_branch=other)],
                  [h.make_tensor_value_info("x", T.FLOAT, ["B", 4]),
                   h.make_value_info("opt", held)],
                  [h.make_tensor_value_info("y", T.FLOAT, ["B", 4])],
                  [("w", np.arange(16, dtype=np.float32).reshape(4, 4) / 8)])


def test_an_optional_input_left_out_is_empty_as_onnxruntime_takes_it(tmp_path, capsys):
    om = _om(_optional_input(), tmp_path / "opt.om")
    session = graphopt.load(om)
    x, held = X[:3, :1].repeat(4, 1), np.ones((3, 4), np.float32)
    (empty,) = _reference(_optional_input(), {"x": x})
    np.testing.assert_array_equal(session.run({"x": x})["y"], empty)
    np.testing.assert_array_equal(session.run({"x": x, "opt": None})["y"], empty)
    np.testing.assert_array_equal(session.run({"x": x, "opt": held})["y"], empty + 1)
    # A list for the tensor it holds, as a plain tensor input takes one (it was refused as
    # "takes a tensor, not a list").
    np.testing.assert_array_equal(session.run({"x": x, "opt": held.tolist()})["y"], empty + 1)
    # The tensor an optional holds names dim B as x does: both must give it one size.
    with pytest.raises(GraphoptError, match="input 'opt' has shape \\[2, 4\\]: its dim 0 is 'B', "
                       "which input 'x' gives as 3"):
        session.run({"x": x, "opt": held[:2]})
    # From the command line: an .npz without it runs it empty; random inputs pin the tensor
    # it holds like any input, by its own name or through a dim another input pins.
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=x)
    rc, out, err = run_cli(capsys, "run", om, "--inputs", str(inputs))
    assert rc == 0, err
    for pins in ("x:2,4;opt:2,4", "opt:2,4", "x:2,4"):
        rc, out, err = run_cli(capsys, "run", om, "--input-shape", pins)
        assert rc == 0, (pins, err)
        (line,) = [row for row in out.splitlines() if row.startswith("y ")]
        assert "[2,4]" in line, (pins, out)
    rc, out, err = run_cli(capsys, "run", om, "--input-shape", "x:2,4;opt:3,4")
    assert rc == 1 and "dim 'B' pinned to both 2 and 3" in err, err
    from graphopt.codegen.feeds import random_value

    entry = {"name": "opt", "type": "optional(float32)",
             "element": {"dtype": "float32", "shape": ["C", 4]}}
    with pytest.raises(GraphoptError, match=r"input 'opt' is an optional\(float32\) and the "
                       "tensor it holds has no static shape"):
        random_value(entry, np.random.default_rng(0))


# --- 4. bfloat16 inputs and outputs ---------------------------------------------------------


BF16_X = np.array([1.5, -2, 3.25, -4], ml_dtypes.bfloat16)


@pytest.fixture
def bf16(tmp_path):
    return _save(_bf16(), tmp_path / "bf16.onnx"), _om(_bf16(), tmp_path / "bf16.om")


def test_bf16_runs_in_the_runtime_and_numerics_as_onnxruntime_does(bf16):
    onnx_path, om_path = bf16
    expected = _bf16_reference(_bf16(), BF16_X)
    session = graphopt.load(om_path)
    assert session._plain is not None  # the plain-feeds shortcut still applies
    got = session.run({"x": BF16_X})["y"]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(numerics.run(_bf16(), {"x": BF16_X})["y"].view(np.uint16),
                                  expected.view(np.uint16))
    # An .npz gives bfloat16 back as numpy's plain 2-byte void type: the same bits.
    again = session.run({"x": BF16_X.view("V2")})["y"]
    np.testing.assert_array_equal(again.view(np.uint16), expected.view(np.uint16))
    with pytest.raises(GraphoptError, match=r"input 'x' has dtype float32, expected bfloat16\[4\]"):
        session.run({"x": BF16_X.astype(np.float32)})


def test_bf16_scalars_keep_their_shape(tmp_path):
    # A 0-d bfloat16 feed, and a 0-d float32 one beside a bfloat16 output, went to onnxruntime
    # as [1] (numpy's ascontiguousarray makes 0-d arrays 1-d), so the scalar came back as [1].
    model = _model([h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
                    h.make_node("Mul", ["xf", "s"], ["m"]),
                    h.make_node("Cast", ["m"], ["y"], to=T.BFLOAT16)],
                   [h.make_tensor_value_info("x", T.BFLOAT16, []),
                    h.make_tensor_value_info("s", T.FLOAT, [])],
                   [h.make_tensor_value_info("y", T.BFLOAT16, [])])
    feeds = {"x": np.array(1.5, ml_dtypes.bfloat16), "s": np.array(2, np.float32)}
    got = graphopt.load(_om(model, tmp_path / "scalar.om")).run(feeds)["y"]
    assert got.shape == () and got.dtype == ml_dtypes.bfloat16 and float(got) == 3.0
    assert numerics.run(model, feeds)["y"].shape == ()


def test_bf16_verifies_compares_profiles_and_bisects(bf16, tmp_path, capsys):
    onnx_path, om_path = bf16
    rc, out, err = run_cli(capsys, "optimize", onnx_path, "-o", tmp_path / "v.onnx", "--verify")
    assert rc == 0, err
    assert "verified: 1 output(s)" in out
    report = compare_models(onnx_path, om_path)
    assert report.passed and report.outputs[0].dtype == "bf16"
    assert profile_model(om_path, repeat=1, warmup=0).kernels
    assert profile_model(onnx_path, repeat=1, warmup=0).kernels
    assert not bisect(onnx_path).found
    rc, out, err = run_cli(capsys, "run", om_path, "--outputs", tmp_path / "y.npz")
    assert rc == 0, err
    assert "bfloat16" in out


def test_float8_round_trips_through_numerics():
    model = _model([h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
                    h.make_node("Neg", ["xf"], ["n"]),
                    h.make_node("Cast", ["n"], ["y"], to=T.FLOAT8E4M3FN)],
                   [h.make_tensor_value_info("x", T.FLOAT8E4M3FN, [3])],
                   [h.make_tensor_value_info("y", T.FLOAT8E4M3FN, [3])], opsets=(("", 19),))
    x = np.array([1, 2, 0.5], ml_dtypes.float8_e4m3fn)
    y = numerics.run(model, {"x": x})["y"]
    assert y.dtype == ml_dtypes.float8_e4m3fn and y.astype(np.float32).tolist() == [-1, -2, -0.5]


def test_float8e8m0_runs_through_numerics_and_an_om(tmp_path):
    # The exponent-only float8 had no bits path: an .om casting to it compiled, and its run
    # was refused with a message that called float8 passable.
    model = _model([h.make_node("Cast", ["x"], ["y"], to=T.FLOAT8E8M0)],
                   [h.make_tensor_value_info("x", T.FLOAT, [4])],
                   [h.make_tensor_value_info("y", T.FLOAT8E8M0, [4])], opsets=(("", 24),))
    x = np.array([0.25, 1.0, 3.0, 64.0], np.float32)
    expected = numerics.run(model, {"x": x})["y"]
    assert expected.dtype == ml_dtypes.float8_e8m0fnu
    assert expected.astype(np.float32).tolist() == [0.25, 1.0, 4.0, 64.0]  # rounds to 2^k
    om = _om(model, tmp_path / "e8m0.om")
    with graphopt.load(om) as session:
        np.testing.assert_array_equal(session.run({"x": x})["y"].view(np.uint8),
                                      expected.view(np.uint8))


def test_an_element_type_onnxruntime_cannot_pass_is_refused_naming_the_input(tmp_path, capsys):
    # int4 packs two values a byte in onnxruntime, one in ml_dtypes: there are no bits to share.
    model = _model([h.make_node("DequantizeLinear", ["x", "s"], ["y"])],
                   [h.make_tensor_value_info("x", T.INT4, [2])],
                   [h.make_tensor_value_info("y", T.FLOAT, [2])],
                   [("s", np.array(0.5, np.float32))], opsets=(("", 21),))
    path = _save(model, tmp_path / "int4.onnx")
    rc, _, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "v.onnx", "--verify")
    assert rc == 1 and "internal error" not in err and "Numpy_type" not in err
    assert "input 'x' is a tensor(int4), which onnxruntime's Python binding cannot pass" in err


# --- 5. compare's labels for values that are not tensors ------------------------------------


def test_compare_labels_sequences_maps_and_empty_optionals(tmp_path):
    reference = _save(_zipmap(), tmp_path / "zm.onnx")
    report = compare_models(reference, _om(_zipmap(), tmp_path / "zm.om"))
    assert report.passed
    text = format_report(report)
    assert "seq(float32)[2]" in text
    assert "seq(map(int64,float32))[3]" in text
    (line,) = [row for row in text.splitlines() if row.startswith("none ")]
    assert line.split()[1] == "optional(None)"
    rows = {row.name: row for row in report.outputs}
    assert rows["none"].to_dict()["shape"] is None
    assert rows["zm"].cosine == pytest.approx(1.0)


def test_the_accuracy_report_judges_a_sequence_output_element_by_element(tmp_path):
    from graphopt.tools.accuracy import accuracy_report

    path = tmp_path / "r16.onnx"
    graphopt.save(graphopt.optimize(_ragged(), precision="fp16"), path)
    report = accuracy_report(_ragged(), path)
    kinds = {o.name: (o.shape, o.kind) for o in report.outputs}
    sequence = next(name for name, (shape, _) in kinds.items() if shape is None)
    assert kinds[sequence][1].startswith("seq(float32)")
    assert all(o.cosine > 0.999 for o in report.outputs)
    assert "seq(float32)" in report.format()


def test_shape_profiles_with_a_sequence_input(tmp_path):
    # A sequence feed has no shape: profile selection goes by the tensor inputs alone.
    model = _model([h.make_node("ConcatFromSequence", ["s"], ["c"], axis=0),
                    h.make_node("Relu", ["x"], ["y"])],
                   [h.make_tensor_value_info("x", T.FLOAT, ["N", 2]),
                    h.make_tensor_sequence_value_info("s", T.FLOAT, [2, 2])],
                   [h.make_tensor_value_info("y", T.FLOAT, ["N", 2]),
                    h.make_tensor_value_info("c", T.FLOAT, [None, 2])])
    path = str(tmp_path / "seq.om")
    graphopt.save(graphopt.optimize(model, dynamic_dims={"N": [1, 5]}), path)
    session = graphopt.load(path)
    sequence = [X[:2], X[2:4], X[3:]]
    for rows in (1, 5):
        out = session.run({"x": X[:rows], "s": sequence})
        np.testing.assert_array_equal(out["y"], np.maximum(X[:rows], 0))
        np.testing.assert_array_equal(out["c"], np.concatenate(sequence))
        assert session.profile_for({"x": X[:rows], "s": sequence}) is not None
    with pytest.raises(GraphoptError, match=r"input shapes x\[3, 2\] fit none of the model's 2 "
                                            r"shape profiles"):
        session.run({"x": X[:3], "s": sequence})


def test_verify_of_a_map_input_points_to_python_not_to_an_npz(tmp_path, capsys):
    # A DictVectorizer's map input: --verify said "give --inputs", which no .npz can answer.
    model = _model([h.make_node("DictVectorizer", ["d"], ["v"], domain="ai.onnx.ml",
                                string_vocabulary=["a", "b"])],
                   [h.make_value_info("d", h.make_map_type_proto(
                       T.STRING, h.make_tensor_type_proto(T.FLOAT, [])))],
                   [h.make_tensor_value_info("v", T.FLOAT, [1, 2])],
                   opsets=(("", 18), ("ai.onnx.ml", 1)))
    source = tmp_path / "dv.onnx"
    onnx.save(model, source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "dv.om", "--verify")
    assert rc == 1 and "input 'd' is a map(string,float32), so random data cannot be made for " \
        "it; pass explicit inputs from Python" in err and "--inputs" not in err, err
    result = graphopt.optimize(str(source), verify=True, inputs={"d": {"a": 1.0, "b": 2.0}})
    assert result.max_abs_error == {"v": 0.0}
