"""Lean models: onnxruntime sessions, imports and --verify take the weights graphopt holds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.errors import InputError
from graphopt import numerics
from graphopt.ir import load_onnx, to_onnx
from graphopt.lent_weights import is_lent, lean_onnx, lending
from graphopt.rounding import weight_rounding
from graphopt.tools import compare_run
from graphopt.tools.compare import compare_models
from graphopt.widened import widened_to_float32
from tests.helpers import IR_VERSION, parse_model, run_cli

RNG = np.random.default_rng(5)


def branchy_model() -> onnx.ModelProto:
    """A MatMul weight and a bfloat16 table in the main graph, and an If whose branches hold
    a weight and a Constant of their own: the main graph's are lent, the branches' are not
    (onnxruntime replaces only the main graph's initializers)."""
    def branch(name: str, scale: float) -> onnx.GraphProto:
        weight = numpy_helper.from_array((scale * RNG.standard_normal((32, 32))).astype(
            np.float32), f"{name}_w")
        constant = helper.make_node("Constant", [], [f"{name}_c"], value=numpy_helper.from_array(
            RNG.standard_normal((1, 32)).astype(np.float32)))
        return helper.make_graph(
            [constant, helper.make_node("MatMul", ["h", f"{name}_w"], [f"{name}_m"]),
             helper.make_node("Add", [f"{name}_m", f"{name}_c"], [f"{name}_y"])], name, [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [4, 32])], [weight])

    w = numpy_helper.from_array(RNG.standard_normal((32, 32)).astype(np.float32), "w")
    bits = (RNG.standard_normal(1024).astype(np.float32).view(np.uint32) >> 16).astype("<u2")
    table = helper.make_tensor("table", TensorProto.BFLOAT16, [32, 32], bits.tobytes(),
                               raw=True)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h0"]),
         helper.make_node("Cast", ["table"], ["t"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["h0", "t"], ["h"]),
         helper.make_node("If", ["c"], ["y"], then_branch=branch("then", 1.0),
                          else_branch=branch("else", 2.0))], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], [w, table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


FEEDS = {"x": RNG.standard_normal((4, 32)).astype(np.float32), "c": np.array(True)}


def test_a_lean_model_runs_as_its_full_export_and_imports_its_own_tensors():
    model = load_onnx(branchy_model())
    full = to_onnx(model)
    with lending() as lent:
        lean = lean_onnx(model)
        assert [t.name for t in lean.graph.initializer if is_lent(t)] == ["w", "table"]
        assert len(lent) == 2 and not lean.graph.initializer[0].raw_data
        branches = [a.g for a in lean.graph.node[3].attribute]
        assert not any(is_lent(t) for g in branches for t in g.initializer)
        assert all(a.t.raw_data or a.t.float_data for g in branches for n in g.node
                   for a in n.attribute if n.op_type == "Constant")
        for c in (True, False):
            feeds = {**FEEDS, "c": np.array(c)}
            np.testing.assert_array_equal(numerics.run(lean, feeds)["y"],
                                          numerics.run(full, feeds)["y"])
        again = load_onnx(lean)  # no copy: the import takes the tensors lent
        assert again.graph.initializers["w"].const is model.graph.initializers["w"].const
    with pytest.raises(RuntimeError, match=r"initializer 'w' names lent weights .* that no "
                                           r"lending block in force holds"):
        numerics.run(lean, FEEDS)


def test_outside_a_lending_block_a_lean_model_is_the_full_export():
    model = load_onnx(branchy_model())
    assert lean_onnx(model) == to_onnx(model)


def test_nudging_and_widening_read_lent_weights():
    proto = parse_model("g (float16[2,64] x) => (float16[2,64] y) { y = MatMul (x, w) }",
                        w=RNG.standard_normal((64, 64)).astype(np.float16))
    feeds = {"x": RNG.standard_normal((2, 64)).astype(np.float16)}
    model = load_onnx(proto)
    with lending():
        lean = lean_onnx(model)
        assert is_lent(lean.graph.initializer[0])
        moved = weight_rounding(lean, feeds)["y"]
        widened = numerics.run(widened_to_float32(lean), {"x": feeds["x"].astype(np.float32)})
    np.testing.assert_array_equal(moved, weight_rounding(proto, feeds)["y"])
    np.testing.assert_array_equal(widened["y"], numerics.run(
        widened_to_float32(proto), {"x": feeds["x"].astype(np.float32)})["y"])


def test_verify_serializes_no_weight(tmp_path, monkeypatch):
    # Every session had been made from the whole model serialized: a 784 MB model's --verify
    # took 5 GB and 32 s, 3.4 GB and 20 s now.
    proto = parse_model("g (float[2,512] x) => (float[2,512] y) { y = MatMul (x, w) }",
                        w=RNG.standard_normal((512, 512)).astype(np.float32))
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.bin")
    sizes = []
    serialize = numerics.serialized

    def measured(model):
        data = serialize(model)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(numerics, "serialized", measured)
    result = graphopt.optimize(str(tmp_path / "m.onnx"), verify=True)
    assert result.max_abs_error == {"y": 0.0}
    assert sizes and max(sizes) < 64 * 1024, sizes  # the weight is 1 MiB


def test_compare_maps_the_references_weights_from_its_file(tmp_path, monkeypatch):
    proto = branchy_model()
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.bin",
              size_threshold=0)
    loaded = []
    load = compare_run.load_external_data_for_tensor

    def counted(tensor, base_dir):
        loaded.append(tensor.name)
        load(tensor, base_dir)

    monkeypatch.setattr(compare_run, "load_external_data_for_tensor", counted)
    report = compare_models(str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx"), FEEDS,
                            per_tensor=True)
    assert all(row.passed for row in report.outputs) and report.outputs[0].max_abs == 0
    # The branches' tensors are loaded (onnxruntime takes only the main graph's as OrtValues)
    assert "w" not in loaded and "table" not in loaded and "then_w" in loaded


def test_an_initializer_nothing_reads_is_not_lent():
    # onnxruntime drops it at load and refused the OrtValue handed in for it: --verify had
    # failed with "Failed to find existing initializer with name unused".
    proto = parse_model("g (float[2,64] x) => (float[2,64] y) { y = MatMul (x, w) }",
                        w=RNG.standard_normal((64, 64)).astype(np.float32),
                        unused=np.zeros(256, np.float32))
    result = graphopt.optimize(proto, verify=True)
    assert result.max_abs_error == {"y": 0.0}
    with lending():
        lean = lean_onnx(load_onnx(proto))
        assert [t.name for t in lean.graph.initializer if is_lent(t)] == ["w"]


def test_a_float8_weight_is_lent_as_its_bits():
    # ml_dtypes' float8_e5m2 says numpy kind "f": taken for a native array, it had failed.
    weight = helper.make_tensor("w8", TensorProto.FLOAT8E5M2, [64, 64],
                                RNG.integers(0, 120, 4096, dtype=np.uint8).tobytes(), raw=True)
    proto = parse_model("g (float[2,64] x) => (float[2,64] y) { w = Cast <to = 1> (w8) "
                        "y = MatMul (x, w) }", header='<ir_version: 10, opset_import: ["" : 19]>\n')
    proto.graph.initializer.append(weight)
    del proto.graph.input[1:]
    result = graphopt.optimize(proto, verify=True)
    assert result.max_abs_error == {"y": 0.0}


def test_the_compare_command_maps_the_references_weights(tmp_path, capsys, monkeypatch):
    proto = parse_model("g (float[2,64] x) => (float[2,64] y) { y = MatMul (x, w) }",
                        w=RNG.standard_normal((64, 64)).astype(np.float32))
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.bin",
              size_threshold=0)
    loaded = []
    monkeypatch.setattr(compare_run, "load_external_data_for_tensor",
                        lambda tensor, base_dir: loaded.append(tensor.name))
    rc, out, err = run_cli(capsys, "compare", tmp_path / "m.onnx", tmp_path / "m.onnx")
    assert rc == 0 and "result: PASS" in out, err
    assert loaded == []  # the CLI read the reference before compare_models' block had begun


def test_a_functions_constant_kept_in_a_data_file_is_read_at_import(tmp_path):
    # onnx.save(..., convert_attribute=True) moves a function's Constant out too; the function
    # went on as a proto naming that file, which onnxruntime, given the model as bytes, cannot
    # open: --verify had failed with "External data path ... escapes working directory".
    constant = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
        RNG.standard_normal((64, 64)).astype(np.float32), "k"))
    function = helper.make_function("local", "Lin", ["a"], ["b"], [
        constant, helper.make_node("MatMul", ["a", "k"], ["b"])],
        opset_imports=[helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Lin", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])])
    proto = helper.make_model(graph, functions=[function], ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("local", 1)])
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.bin",
              size_threshold=1024, convert_attribute=True)
    assert (tmp_path / "m.bin").stat().st_size == 64 * 64 * 4
    result = graphopt.optimize(str(tmp_path / "m.onnx"), verify=True)
    assert result.max_abs_error == {"y": 0.0}
    with pytest.raises(InputError, match=r"function local::Lin: tensor 'k' keeps its data "
                                                   r"in an external file"):
        graphopt.optimize(onnx.load(tmp_path / "m.onnx", load_external_data=False))
