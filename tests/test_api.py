"""The library API: graphopt.optimize / save / load_onnx on paths, bytes and ModelProtos, the
result's log, typed errors for bad input, and output preservation at every level."""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, PerturbWeights
from onnx import TensorProto, helper, numpy_helper, parser

import graphopt
from graphopt import numerics
from graphopt.codegen import OmSession, is_om, load_om
from graphopt.errors import GraphoptError, InputError, OptionError, VerificationError
from graphopt.ir import Model, Tensor
from graphopt.passes import PASSES, PIPELINES, PassResult, Pipeline

# Constant nodes, an Identity, a Mul by 1, a foldable Constant+Constant Add, and a
# Shape->Gather->Unsqueeze->Concat->Reshape chain over a symbolic batch dim.
FOLDABLE = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
  one = Constant <value = float[1] {1.0}> ()
  a = Mul(x, one)
  i = Identity(a)
  s = Shape(x)
  idx = Constant <value = int64 {1}> ()
  d = Gather <axis = 0> (s, idx)
  minus1 = Constant <value = int64[1] {-1}> ()
  axes = Constant <value = int64[1] {0}> ()
  du = Unsqueeze(d, axes)
  shape = Concat <axis = 0> (minus1, du)
  r = Reshape(i, shape)
  y = Relu(r)
  c1 = Constant <value = float[4] {1.0, 2.0, 3.0, 4.0}> ()
  c2 = Constant <value = float[4] {0.5, 0.5, 0.5, 0.5}> ()
  c3 = Add(c1, c2)
  z = Mul(r, c3)
}
"""
FOLDABLE_NODES = 16

AFFINE = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 4] x) => (float[N, 4] y) <float[1] w = {2.0}, float[1] b = {3.0}> {
  t = Mul(x, w)
  y = Add(t, b)
}
"""


@pytest.fixture
def proto() -> onnx.ModelProto:
    model = parser.parse_model(FOLDABLE)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture
def path(proto, tmp_path) -> str:
    p = os.fspath(tmp_path / "model.onnx")
    onnx.save(proto, p)
    return p


def _assert_same_outputs(original: onnx.ModelProto, optimized: onnx.ModelProto, seed=0) -> None:
    feeds = numerics.random_feeds(original, seed=seed, dims={"N": 3})
    expected = numerics.run(original, feeds)
    actual = numerics.run(optimized, feeds)
    assert set(expected) == set(actual)
    problems = numerics.compare(expected, actual)
    assert not problems, problems


# ---------------------------------------------------------------------------------------------
# optimize on every source kind
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["path", "pathlike", "bytes", "proto"])
def test_optimize_sources(proto, path, kind):
    source = {"path": path, "pathlike": __import__("pathlib").Path(path),
              "bytes": proto.SerializeToString(), "proto": proto}[kind]
    result = graphopt.optimize(source)
    assert isinstance(result, graphopt.OptimizeResult)
    assert isinstance(result.model, Model)
    assert result.nodes_before == FOLDABLE_NODES
    assert result.model.graph.count_nodes() < FOLDABLE_NODES
    assert result.source_label == (os.fspath(source) if kind in ("path", "pathlike") else "<model>")
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    _assert_same_outputs(proto, out)


def test_optimize_does_not_mutate_the_callers_proto(proto):
    before = proto.SerializeToString()
    for level in range(4):
        graphopt.optimize(proto, level=level)
        assert proto.SerializeToString() == before


def test_result_log(proto):
    result = graphopt.optimize(proto)
    log = result.log
    assert log.pipeline == "O2"
    assert log.records
    for record in log.records:
        assert record.name in PASSES
        assert isinstance(record.seconds, float) and record.seconds >= 0
        assert isinstance(record.stats, dict)
        assert all(isinstance(n, int) and n > 0 for n in record.stats.values())
        assert record.changed == bool(record.stats)
        assert record.nodes_before >= 0 and record.nodes_after >= 0
    names = [r.name for r in log.records]
    assert names[0] == "InferShapes"
    assert set(names) == set(PIPELINES[2].pass_names())
    # rewrites: the six Constant nodes become initializers, the Identity goes away
    totals = log.totals()
    assert totals["ConstantToInitializer"]["rewrites"]["Constant"] == 6
    assert sum(totals["EliminateIdentity"]["rewrites"].values()) >= 1
    assert totals["InferShapes"]["runs"] >= 1
    # the records chain: each pass starts where the previous one stopped
    for prev, nxt in zip(log.records, log.records[1:]):
        assert nxt.nodes_before == prev.nodes_after
    assert log.records[-1].nodes_after == result.model.graph.count_nodes()
    as_json = log.to_json()
    assert as_json["pipeline"] == "O2"
    assert [p["pass"] for p in as_json["passes"]] == names
    assert {"seconds", "rewrites", "iteration", "changed"} <= set(as_json["passes"][0])
    assert result.seconds > 0
    assert result.max_abs_error is None


def test_level_0_log_is_empty_and_model_unchanged(proto):
    result = graphopt.optimize(proto, level=0)
    assert result.log.records == []
    assert result.model.graph.count_nodes() == FOLDABLE_NODES
    out = result.to_onnx()
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in proto.graph.node]


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_every_level_preserves_outputs(proto, level):
    result = graphopt.optimize(proto, level=level, verify=True)
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    _assert_same_outputs(proto, out, seed=level)
    ops = [n.op_type for n in out.graph.node]
    if level == 0:
        assert len(ops) == FOLDABLE_NODES
    else:
        assert "Constant" not in ops and "Identity" not in ops
        assert ops.count("Mul") == 1  # Mul by 1 removed, the other Mul stays
    assert set(result.max_abs_error) == {"y", "z"}
    assert all(err <= 1e-5 for err in result.max_abs_error.values())


def test_higher_levels_never_have_more_nodes(proto):
    counts = [graphopt.optimize(proto, level=level).model.graph.count_nodes() for level in range(4)]
    assert counts[0] == FOLDABLE_NODES
    assert counts[1] <= counts[0] and counts[2] <= counts[1] and counts[3] <= counts[2], counts


def test_disable_passes_and_options(proto):
    result = graphopt.optimize(proto, disable_passes=["EliminateIdentity", "FoldConstants"],
                               fold_size_limit=0, verify_structure=True)
    names = {r.name for r in result.log.records}
    assert "EliminateIdentity" not in names and "FoldConstants" not in names
    assert "Identity" in [n.op_type for n in result.to_onnx().graph.node]
    assert not any("disable_passes" in note for note in result.notes)


def test_switching_off_what_the_compile_does_not_run_is_noted(proto):
    # FuseAttention (and its rules) runs from -O2, WinogradConv at -O3, QuantizeInt8 when asked.
    notes = graphopt.optimize(proto, level=1, disable_passes=[
        "FuseAttention", "PackedSelfAttention", "WinogradConv", "QuantizeInt8",
        "EliminateIdentity"]).notes
    assert "disable_passes FuseAttention, PackedSelfAttention, QuantizeInt8, WinogradConv: not " \
           "in this compile's pipeline (O1), so switching them off changes nothing" in notes, notes
    notes = graphopt.optimize(proto, level=2, disable_passes=["PackedSelfAttention"]).notes
    assert not any("disable_passes" in note for note in notes), notes


@pytest.mark.parametrize("options,message", [
    ({"quantize": "int4", "quant_skip": "Gemm"}, "'quant_skip' takes a list or set of names, "
                                                 "not 'Gemm'"),
    ({"quantize": "int4", "int4_embeddings": "no"}, "'int4_embeddings' takes True or False"),
    ({"quantize": "int4", "int4_accuracy_level": True}, "'int4_accuracy_level' takes an integer"),
    ({"dump_dir": 3}, "'dump_dir' takes a path or None, not 3"),
    ({"int4_embeddings": True}, "int4_embeddings applies to quantize='int4'"),
    ({"int4_accuracy_level": 4}, "int4_accuracy_level applies to quantize='int4'"),
    ({"quant_keep_ends": False}, "quant_keep_ends applies to quantize='int8'"),
    ({"quantize": "int4", "calibration_method": "mse"},
     "calibration_method applies to quantize='int8'"),
    ({"per_channel": False}, "per_channel applies to quantize='int8'"),
    # ConvertPrecision runs first: MatMulNBits takes no bfloat16, and nothing was quantized.
    ({"quantize": "int4", "precision": "mixed-bf16"},
     "quantize='int4' with precision='mixed-bf16': MatMulNBits takes float32 or float16"),
])
def test_pass_options_of_the_wrong_type_or_without_their_mode_are_refused(proto, options,
                                                                           message):
    # A mistyped value would pass unnoticed: a string of names read as its characters, "no"
    # as true, an int4 or int8 option ignored without its scheme (as the command line refuses
    # its flags).
    with pytest.raises(OptionError, match=re.escape(message)):
        graphopt.optimize(proto, pass_options=options)


def test_pass_options_take_lists_for_sets_ints_for_floats_and_paths_for_strings(tmp_path):
    from graphopt.passes.options import Options

    assert Options.coerce("quant_skip", ["Add", "Add"]) == {"Add"}
    percentile = Options.coerce("calibration_percentile", 99)
    assert percentile == 99.0 and isinstance(percentile, float)
    assert Options.coerce("calibration", tmp_path / "c.npz") == os.fspath(tmp_path / "c.npz")
    assert Options.coerce("calibration", None) is None


def test_input_shapes_as_string_and_dict(proto):
    for shapes in ("x:3,4", {"x": [3, 4]}):
        out = graphopt.optimize(proto, input_shapes=shapes, verify=True).to_onnx()
        dims = out.graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_value for d in dims] == [3, 4]
        for output in out.graph.output:
            assert [d.dim_value for d in output.type.tensor_type.shape.dim] == [3, 4]


def test_dump_dir(proto, tmp_path):
    dump = tmp_path / "dump"
    result = graphopt.optimize(proto, dump_dir=os.fspath(dump))
    files = sorted(os.listdir(dump))
    assert files[0] == "000_import.txt" and "passes.json" in files
    assert len(files) == len(result.log.records) + 2


# ---------------------------------------------------------------------------------------------
# save and load
# ---------------------------------------------------------------------------------------------
def test_save_onnx(proto, tmp_path):
    result = graphopt.optimize(proto)
    target = tmp_path / "out.onnx"
    graphopt.save(result, target)
    written = onnx.load(os.fspath(target))
    onnx.checker.check_model(written, full_check=True)
    assert written.SerializeToString() == result.to_onnx().SerializeToString()
    _assert_same_outputs(proto, written)
    # a Model and a ModelProto save too
    graphopt.save(result.model, tmp_path / "model.onnx")
    graphopt.save(proto, os.fspath(tmp_path / "proto.onnx"))
    assert onnx.load(os.fspath(tmp_path / "proto.onnx")) == proto


def test_save_om_runs(proto, tmp_path):
    result = graphopt.optimize(proto)
    target = tmp_path / "out.om"
    graphopt.save(result, target)
    assert is_om(target)
    artifact = load_om(target)
    assert [o["name"] for o in artifact.outputs] == ["y", "z"]
    feeds = numerics.random_feeds(proto, seed=7, dims={"N": 2})
    expected = numerics.run(proto, feeds)
    got = OmSession(os.fspath(target)).run(feeds)
    assert not numerics.compare(expected, got)


def test_save_om_of_a_plain_model(proto, tmp_path):
    target = tmp_path / "plain.om"
    graphopt.save(graphopt.load_onnx(proto), target)
    feeds = numerics.random_feeds(proto, seed=1)
    assert not numerics.compare(numerics.run(proto, feeds), OmSession(os.fspath(target)).run(feeds))


@pytest.mark.parametrize("kind", ["path", "bytes", "proto"])
def test_load_onnx_round_trips(proto, path, kind):
    source = {"path": path, "bytes": proto.SerializeToString(), "proto": proto}[kind]
    model = graphopt.load_onnx(source)
    assert isinstance(model, Model)
    assert model.graph.count_nodes() == FOLDABLE_NODES
    assert model.opset_imports == {"": 17}
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert [v.name for v in model.graph.outputs] == ["y", "z"]
    back = graphopt.to_onnx(model)
    onnx.checker.check_model(back, full_check=True)
    _assert_same_outputs(proto, back)


# ---------------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------------
def test_verify_with_inputs_dict(proto):
    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    result = graphopt.optimize(proto, verify=True, inputs={"x": x})
    assert set(result.max_abs_error) == {"y", "z"}
    # Another mapping passed the check and was then opened as an .npz path (a TypeError).
    from types import MappingProxyType

    result = graphopt.optimize(proto, verify=True, inputs=MappingProxyType({"x": x}))
    assert set(result.max_abs_error) == {"y", "z"}


def test_verify_on_seeded_inputs_says_which_open_dims_were_1(proto):
    # FOLDABLE's x is [N, 4]: on seeded inputs N is 1, which the note names; a pin or real
    # inputs size it, and the note goes.
    result = graphopt.optimize(proto, verify=True)
    assert "open dims at 1: x [1,4] (N=1)" in result.verify_note
    assert "give real inputs (inputs) or sizes (input_shapes)" in result.verify_note
    for sized in ({"input_shapes": {"x": [1, 4]}},
                  {"inputs": {"x": np.ones((3, 4), np.float32)}}):
        assert "open dims" not in graphopt.optimize(proto, verify=True, **sized).verify_note


def test_verify_with_npz_path(proto, tmp_path):
    npz = tmp_path / "feeds.npz"
    np.savez(npz, x=np.ones((2, 4), np.float32))
    for inputs in (os.fspath(npz), npz):
        result = graphopt.optimize(proto, verify=True, inputs=inputs)
        assert set(result.max_abs_error) == {"y", "z"}


def test_verify_inputs_that_do_not_fit(proto, tmp_path):
    with pytest.raises(InputError, match="verify: inputs: unknown input 'nope'; the "
                                         "model's inputs are: x"):
        graphopt.optimize(proto, verify=True, inputs={"nope": np.ones((2, 4), np.float32)})
    with pytest.raises(OptionError, match="^inputs .*missing.npz: no such file"):
        graphopt.optimize(proto, verify=True, inputs=os.fspath(tmp_path / "missing.npz"))


def test_verify_inputs_npy_is_an_option_error(proto, tmp_path):
    # BUG: compiler._load_inputs assumes np.load returns an NpzFile; for a .npy it is an ndarray
    # and `with np.load(...)` raises TypeError.
    npy = tmp_path / "x.npy"
    np.save(npy, np.ones((2, 4), np.float32))
    with pytest.raises(OptionError):
        graphopt.optimize(proto, verify=True, inputs=os.fspath(npy))


def test_verify_raises_on_a_wrong_optimization(monkeypatch):
    import graphopt.compiler

    monkeypatch.setitem(PASSES, PerturbWeights.name, PerturbWeights)
    monkeypatch.setitem(graphopt.compiler.PIPELINES, 3,
                        Pipeline("O3-broken", "miscompiles", (PerturbWeights.name,)))
    model = parser.parse_model(AFFINE)
    with pytest.raises(VerificationError, match="differs.*'y'"):
        graphopt.optimize(model, level=3, verify=True)
    result = graphopt.optimize(model, level=3)  # without verify the miscompile goes through
    assert result.log.records[0].stats == {"perturbed": 2}


def test_verify_takes_onnxruntimes_own_rounding_as_the_bound(monkeypatch):
    """A compile whose outputs are off by no more than onnxruntime's own optimizer takes the
    original (its NCHWc convs accumulate in another order) passes, saying so; twice that
    fails."""
    import graphopt.compiler
    from graphopt import numerics

    class Nudge(PerturbWeights):
        name = "TestNudgeWeights"

        def run(self, model, ctx):
            for value in model.graph.initializers.values():
                array = value.constant()
                if array is not None and array.dtype.kind == "f":
                    value.const = Tensor((array * (1 + self.scale)).astype(array.dtype))
            return PassResult()

    monkeypatch.setitem(PASSES, Nudge.name, Nudge)
    monkeypatch.setitem(graphopt.compiler.PIPELINES, 3,
                        Pipeline("O3-nudged", "rounds", (Nudge.name,)))
    model = parser.parse_model(AFFINE)
    nudged_by = {}
    real_run = numerics.run

    def run(proto, feeds, level="disable", **settings):
        if level != "all":
            return real_run(proto, feeds, level, **settings)
        Nudge.scale = nudged_by["onnxruntime"]  # the original as onnxruntime optimizes it
        try:
            return real_run(graphopt.optimize(proto, level=3).to_onnx(), feeds)
        finally:
            Nudge.scale = nudged_by["graphopt"]

    monkeypatch.setattr(graphopt.compiler.numerics, "run", run)
    nudged_by.update(graphopt=5e-4, onnxruntime=5e-4)  # past rtol, under rounding's limit
    Nudge.scale = 5e-4
    result = graphopt.optimize(model, level=3, verify=True)
    assert "within twice what onnxruntime's own optimizer gives the original" in result.verify_note
    # An optimizer error past 1e-3 of the output is no rounding, and excuses nothing.
    nudged_by.update(graphopt=3e-3, onnxruntime=3e-3)
    Nudge.scale = 3e-3
    with pytest.raises(VerificationError, match="differs.*'y'"):
        graphopt.optimize(model, level=3, verify=True)
    nudged_by.update(graphopt=5e-4, onnxruntime=5e-4)
    Nudge.scale = 5e-4
    # Tolerances given apply as given, as in compare and bisect, even at the defaults' values.
    with pytest.raises(VerificationError, match="differs.*'y'"):
        graphopt.optimize(model, level=3, verify=True, rtol=1e-4, atol=1e-5)
    nudged_by.update(onnxruntime=1e-5)
    with pytest.raises(VerificationError, match="differs.*'y'"):
        graphopt.optimize(model, level=3, verify=True)


# ---------------------------------------------------------------------------------------------
# typed errors
# ---------------------------------------------------------------------------------------------
def _graph_model(nodes, opsets=(("", 17),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, ir_version=9,
                             opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


BAD_MODELS = {
    "cycle": (_graph_model([helper.make_node("Add", ["x", "b"], ["a"]),
                            helper.make_node("Relu", ["a"], ["b"]),
                            helper.make_node("Neg", ["a"], ["y"])]), "cycle"),
    "undefined": (_graph_model([helper.make_node("Relu", ["ghost"], ["y"])]), "ghost"),
    "twice": (_graph_model([helper.make_node("Relu", ["x"], ["y"]),
                            helper.make_node("Neg", ["x"], ["y"])]), "defined twice"),
    "unknown-op": (_graph_model([helper.make_node("Frobnicate", ["x"], ["y"])]), "unknown op"),
    "custom": (_graph_model([helper.make_node("F", ["x"], ["y"], domain="my.custom")],
                            (("", 17), ("my.custom", 1))), "allow_custom_ops=True"),
    "not-imported": (_graph_model([helper.make_node("F", ["x"], ["y"], domain="my.custom")]),
                     "opset_import"),
}


@pytest.mark.parametrize("name", list(BAD_MODELS))
def test_bad_models_raise_input_error(name, tmp_path):
    model, needle = BAD_MODELS[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, os.fspath(path))
    for source in (model, model.SerializeToString(), os.fspath(path)):
        with pytest.raises(InputError, match=needle):
            graphopt.optimize(source)



def _sparse_model(count: int, indices: list[int], dims: list[int]) -> onnx.ModelProto:
    values = numpy_helper.from_array(np.ones(count, np.float32), "sp")
    where = numpy_helper.from_array(np.array(indices, np.int64), "")
    model = _graph_model([helper.make_node("Shape", ["sp"], ["s"]),
                          helper.make_node("Relu", ["x"], ["y"])])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, where, dims))
    return model


@pytest.mark.parametrize("count, indices, dims, needle", [
    (3, [0], [8], "has 1 values, but NNZ is 3"),
    (2, [0, 2 ** 40], [8], "out of range"),
    (1, [0], [0], "hold no element"),
], ids=["short-indices", "index-out-of-range", "values-in-empty"])
def test_a_malformed_sparse_initializer_is_refused_at_import(count, indices, dims, needle):
    # onnxruntime 1.23 aborts the process on these rather than raising, so graphopt must
    # never hand one on (the .om's loader opens a session on it).
    with pytest.raises(InputError, match=needle):
        graphopt.optimize(_sparse_model(count, indices, dims))
    graphopt.optimize(_sparse_model(0, [], [0]))  # empty, as onnxruntime reads a dim 0


def test_allow_custom_ops(tmp_path):
    model, _ = BAD_MODELS["custom"]
    result = graphopt.optimize(model, allow_custom_ops=True)
    assert [n.qualified_op for n in result.model.graph] == ["my.custom::F"]
    # graphopt's runtime registers no custom-op library: the compile says so.
    assert any(note.startswith("custom op(s) my.custom::F kept as they are") and
               "an .om holding them cannot run there" in note for note in result.notes)
    with pytest.raises(VerificationError):  # onnxruntime has no kernel for it
        graphopt.optimize(model, allow_custom_ops=True, verify=True)


@pytest.mark.parametrize("data", [b"\x00" * 16, b"not a model at all\n", np.random.default_rng(1).bytes(512),
                                  b""], ids=["zeros", "text", "random", "empty"])
def test_garbage_bytes_raise_input_error(data, tmp_path):
    with pytest.raises(InputError, match="not a valid ONNX model"):
        graphopt.optimize(data)
    with pytest.raises(InputError, match="not a valid ONNX model"):
        graphopt.load_onnx(data)
    path = tmp_path / "junk.onnx"
    path.write_bytes(data)
    with pytest.raises(InputError, match="junk.onnx"):
        graphopt.optimize(os.fspath(path))


def test_every_truncation_raises_input_error(proto):
    data = proto.SerializeToString()
    for n in range(len(data)):
        with pytest.raises(InputError):
            graphopt.load_onnx(data[:n])


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        graphopt.optimize(os.fspath(tmp_path / "nope.onnx"))
    with pytest.raises(InputError, match="directory"):
        graphopt.optimize(os.fspath(tmp_path))
    with pytest.raises(InputError, match="no such file"):
        graphopt.load_onnx(tmp_path / "nope.onnx")


@pytest.mark.parametrize("kwargs, needle", [
    ({"level": 4}, "level 4"),
    ({"level": -1}, "level -1"),
    ({"disable_passes": ["NoSuchPass"]}, "NoSuchPass"),
    ({"input_shapes": "x"}, "^input_shapes: "),
    ({"input_shapes": "x:a,b"}, "integers"),
    ({"input_shapes": "nosuch:1,2"}, "no input 'nosuch'"),
    ({"input_shapes": "x:1,2,3"}, "rank"),
    ({"input_shapes": "x:3,5"}, "fixed to 4"),
    ({"input_shapes": "x:-5,4"}, "-1"),
    ({"input_shapes": {"nosuch": [1, 2]}}, "no input 'nosuch'"),
    ({"fold_size_limit": -1}, "^fold_size_limit must be"),
    # Wrong types are named by argument, not met deep inside as a TypeError.
    ({"level": True}, "level: expected an integer"),
    ({"disable_passes": 3}, "disable_passes: expected a name or a list of names"),
    ({"disable_passes": [1]}, "disable_passes: expected a name"),
    ({"trace_rules": 3}, "trace_rules: expected a name"),
    ({"input_shapes": [1, 4]}, "input_shapes: expected a dict"),
    ({"fold_size_limit": "lots"}, "'lots' is not a size"),
    ({"switch_file": 3}, "switch_file: expected a path"),
    ({"dump_dir": 3}, "dump_dir: expected a path"),
    ({"target": 3}, "target: expected a target name"),
    ({"calibration": 3, "quantize": "int8"}, "calibration: expected a path"),
    ({"pass_options": ["x"]}, "pass_options: expected a dict"),
    ({"instruments": 3}, "instruments: expected a list"),
    ({"verify": True, "inputs": [np.ones(1)]}, "inputs: expected a dict of arrays"),
    ({"verify": True, "rtol": -1.0}, "rtol: expected a finite number ≥ 0"),
    ({"verify": True, "atol": float("nan")}, "atol: expected a finite number"),
    ({"verify": True, "atol": float("inf")}, "atol: expected a finite number"),
    ({"verify": True, "rtol": "1e-3"}, "rtol: expected a number"),
    # What the command line refuses as meaningless is refused alike, not silently ignored.
    ({"inputs": {"x": np.ones((2, 4), np.float32)}}, "inputs: only used with verify=True"),
    ({"rtol": 1e-3}, "rtol: only used with verify=True"),
    ({"atol": 1e-3}, "atol: only used with verify=True"),
    ({"memory_reorder": True}, "memory_reorder=True .* give target="),
    # A flag takes True or False: "no" would read as true, [] as false.
    ({"verify": "no"}, "^verify: expected True or False"),
    ({"verify_structure": "no"}, "^verify_structure: expected True or False"),
    ({"allow_custom_ops": "false"}, "^allow_custom_ops: expected True or False"),
    ({"memory_reorder": "no", "target": "cpu"}, "^memory_reorder: expected True or False"),
    ({"instruments": [1]}, "^instruments: expected a list of Instrument objects"),
    ({"rewrite_gate": 5}, "^rewrite_gate: expected a function"),
    ({"calibration": {"x": np.zeros((64, 64))}, "quantize": "int8"},
     r"^calibration: expected a path \(str or os.PathLike\), got a dict \("),
    # pass_options meet the keywords' value checks, and cannot pick another level.
    ({"pass_options": {"level": 3}}, "'level' is optimize's own keyword"),
    ({"pass_options": {"fold_size_limit": -5}}, "^fold_size_limit must be ≥ 0 bytes, got -5$"),
    ({"pass_options": {"max_iterations": 0}}, "^max_iterations must be ≥ 1"),
    ({"pass_options": {"elementwise_max_group": -3}}, "^elementwise_max_group must be ≥ 1"),
    ({"pass_options": {"dump_format": "bogus"}}, "unknown format"),
    ({"pass_options": {"trace_rules": ["Nope"]}}, "unknown rule Nope"),
    ({"pass_options": {"input_shapes": {"x": [-5, 4]}}}, "a dim must be ≥ 0 or -1"),
    # An unknown key: optimize's own keyword is named as such, a misspelling gets its match,
    # and the options listed are ones pass_options takes (not level).
    ({"pass_options": {"disable_passes": ["FoldConstants"]}},
     "^pass_options: 'disable_passes' is optimize's own keyword; give disable_passes=$"),
    ({"pass_options": {"quant_skp": ["Conv"]}},
     r"^pass_options: no compile option 'quant_skp' \(did you mean 'quant_skip'\?\); the "
     "options: disabled_passes, fold_size_limit, "),
])
def test_bad_options_raise_option_error(proto, kwargs, needle):
    with pytest.raises(OptionError, match=needle):
        graphopt.optimize(proto, **kwargs)


@pytest.mark.parametrize("dims", [[-5, 4], [3.5, 4], ["a", 4]])
def test_bad_input_shapes_dict_raises_option_error(proto, dims):
    # BUG: compiler._options validates only the string form; a dict goes straight to
    # pin_input_shapes, which writes dim_value -5 (or a float, or a new symbol) into the model.
    with pytest.raises(OptionError):
        graphopt.optimize(proto, input_shapes={"x": dims})


def test_switch_file_errors(proto, tmp_path):
    bad_state = tmp_path / "state.txt"
    bad_state.write_text("FoldConstants: sometimes\n")
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"NoSuchPass": "off"}')
    for switch, needle in [(bad_state, "on or off"), (unknown, "NoSuchPass"),
                           (tmp_path / "missing.txt", "missing.txt")]:
        with pytest.raises(OptionError, match=needle):
            graphopt.optimize(proto, switch_file=os.fspath(switch))


def test_switch_file_off(proto, tmp_path):
    switch = tmp_path / "switches.txt"
    switch.write_text("EliminateIdentity: off\nFoldConstants: on\n")
    result = graphopt.optimize(proto, switch_file=os.fspath(switch))
    names = {r.name for r in result.log.records}
    assert "EliminateIdentity" not in names and "FoldConstants" in names


def test_all_errors_are_graphopt_errors():
    for cls in (InputError, OptionError, VerificationError):
        assert issubclass(cls, GraphoptError)


def test_int8_calibration_as_a_keyword(tmp_path):
    from helpers import conv_classifier

    proto = conv_classifier("out = Relu (scores)", "out", batch="N")
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 8, 32, 32), np.float32))
    by_keyword = graphopt.optimize(proto, quantize="int8", calibration=calib)
    by_option = graphopt.optimize(proto, quantize="int8",
                                  pass_options={"calibration": str(calib)})
    assert by_keyword.to_onnx().SerializeToString() == by_option.to_onnx().SerializeToString()
    assert any(n.op_type == "QuantizeLinear" for n in by_keyword.to_onnx().graph.node)
    with pytest.raises(OptionError, match="needs calibration="):
        graphopt.optimize(proto, quantize="int8")


@pytest.mark.parametrize("source", [None, 3, "bytearray", "memoryview"])
def test_optimize_takes_paths_protos_and_bytes_only(proto, source):
    if source in ("bytearray", "memoryview"):  # buffers of serialized bytes are bytes too
        data = proto.SerializeToString()
        result = graphopt.optimize(bytearray(data) if source == "bytearray" else memoryview(data))
        assert result.source_sha256 is not None
        return
    with pytest.raises(OptionError, match="optimize takes a path, an onnx.ModelProto or "
                                          f"serialized bytes, not {type(source).__name__}"):
        graphopt.optimize(source)


def test_load_and_save_name_what_they_take(proto, tmp_path):
    with pytest.raises(OptionError, match="load takes the path of an .om file, not bytes"):
        graphopt.load(b"PK\x03\x04")
    with pytest.raises(OptionError, match=r"x.txt: save writes .onnx .* or .om"):
        graphopt.save(graphopt.optimize(proto), tmp_path / "x.txt")
    assert not (tmp_path / "x.txt").exists()


def test_a_size_text_is_a_fold_size_limit_as_on_the_command_line(proto):
    by_text = graphopt.optimize(proto, fold_size_limit="1K").to_onnx()
    by_int = graphopt.optimize(proto, fold_size_limit=1024).to_onnx()
    assert by_text.SerializeToString() == by_int.SerializeToString()


def test_a_switch_file_given_as_a_descriptor_is_refused_and_left_open(proto, tmp_path):
    with open(tmp_path / "log.txt", "w") as log:
        with pytest.raises(OptionError, match="switch_file: expected a path"):
            graphopt.optimize(proto, switch_file=log.fileno())
        log.write("still open")  # optimize must not have read or closed the caller's file


@pytest.mark.parametrize("model, needle", [
    (b"serialized", "got bytes"), ("model.onnx", "got str"), (None, "got NoneType")])
def test_save_names_a_model_it_cannot_write(tmp_path, model, needle):
    with pytest.raises(OptionError, match=f"save: expected an OptimizeResult.*{needle}"):
        graphopt.save(model, tmp_path / "o.onnx")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("path", [b"o.om", None, 3, ""])
def test_save_names_a_path_it_cannot_take(proto, path):
    with pytest.raises(OptionError, match="save: the output path must be"):
        graphopt.save(graphopt.optimize(proto), path)


def test_save_refuses_a_proto_whose_weights_it_cannot_locate(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        [onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.save(proto, source / "m.onnx", save_as_external_data=True, location="m.bin",
              size_threshold=0)
    references = onnx.load(source / "m.onnx", load_external_data=False)
    for name in ("m.onnx", "m.om"):
        with pytest.raises(InputError, match="keeps its data in an external file"):
            graphopt.save(references, tmp_path / name)
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_load_onnx_refuses_a_proto_whose_weights_it_cannot_locate(tmp_path, monkeypatch):
    # It had taken the reference as one to the working directory: a file of that name there
    # became the weights, and without one the first read failed in onnx's own checker.
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    (tmp_path / "src").mkdir()
    onnx.save(proto, tmp_path / "src" / "m.onnx", save_as_external_data=True,
              location="m.bin", size_threshold=0)
    references = onnx.load(tmp_path / "src" / "m.onnx", load_external_data=False)
    (tmp_path / "m.bin").write_bytes(np.full(16, 7, np.float32).tobytes())  # a decoy
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="initializer 'W' keeps its data in an external file"):
        graphopt.load_onnx(references)
    assert graphopt.load_onnx(tmp_path / "src" / "m.onnx").graph.initializers["W"].constant() \
        .tolist() == np.ones((4, 4)).tolist()


def test_load_onnx_and_to_onnx_name_what_they_take(proto):
    assert graphopt.load_onnx(bytearray(proto.SerializeToString())).graph.nodes()
    with pytest.raises(OptionError, match="load_onnx takes a path.* not NoneType"):
        graphopt.load_onnx(None)
    result = graphopt.optimize(proto)
    with pytest.raises(OptionError, match=r"not OptimizeResult \(an OptimizeResult has "):
        graphopt.to_onnx(result)
    with pytest.raises(OptionError, match="a ModelProto is ONNX already"):
        graphopt.to_onnx(proto)


def test_the_errors_are_reachable_from_the_package():
    import subprocess
    import sys

    # A fresh interpreter: any earlier test may have imported graphopt.errors already.
    code = ("import graphopt\n"
            "try:\n    raise OSError('x')\n"
            "except (graphopt.errors.GraphoptError, OSError):\n    print('caught')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout == "caught\n"


def test_verify_inputs_that_contradict_a_pin_are_the_inputs_fault(proto):
    pinned = {"x": [1, 4]}  # the fixture's x is [N, 4]
    with pytest.raises(OptionError, match=r"pins input 'x' to \[1, 4\], but inputs gives it "
                                          r"shape \[3, 4\]"):
        graphopt.optimize(proto, input_shapes=pinned, verify=True,
                          inputs={"x": np.ones((3, 4), np.float32)})


def test_the_zoo_is_reachable_from_the_package():
    assert graphopt.zoo.build("tiny").graph.node


def test_overridable_initializers_are_named_and_what_each_output_does_with_them(tmp_path):
    # IR >= 4 lets a caller override an initializer listed among the inputs: optimized ONNX
    # keeps that, the .om fixes the value; the compile says both.
    import onnxruntime as ort
    from onnx import numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.zeros(4, np.float32), "b")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    result = graphopt.optimize(proto)
    (note,) = [n for n in result.notes if "override" in n]
    assert note.startswith("b: initializer(s) the model also lists as inputs")
    x, b = np.ones(4, np.float32), np.full(4, 10, np.float32)
    graphopt.save(result, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x, "b": b})[0], x + b)
    graphopt.save(result, tmp_path / "m.om")
    om = graphopt.load(tmp_path / "m.om")
    assert [i["name"] for i in om.inputs] == ["x"]
    np.testing.assert_array_equal(om.run({"x": x})["y"], x)
    # A feed of it was "unknown", an input the source model declares.
    with pytest.raises(InputError, match="^input 'b' is an initializer the source model lets a "
                                         "caller override, which the .om fixed at its value"):
        om.run({"x": x, "b": b})
    proto.ir_version = 3  # before IR 4 every initializer is listed as an input: plain weights
    proto.opset_import[0].version = 8
    assert not [n for n in graphopt.optimize(proto).notes if "override" in n]


def test_a_feed_of_an_overridable_initializer_is_explained_by_verify_calibration_and_profile(
        tmp_path):
    # Each said "unknown input 'w'" (or "not an input of the model") of an input the source
    # model declares.
    from onnx import numpy_helper

    from graphopt.tools.profile import profile_model

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.ones((4, 4), np.float32), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": np.ones((2, 4), np.float32), "w": np.full((4, 4), 2, np.float32)}
    np.savez(tmp_path / "feeds.npz", **feeds)
    overridden = "'w' is an initializer the model lets a caller override"
    with pytest.raises(InputError, match=f"^verify: inputs: {overridden}; verify checks"):
        graphopt.optimize(proto, verify=True, inputs=feeds)
    with pytest.raises(OptionError, match=f"feeds.npz: {overridden}; calibration runs"):
        graphopt.optimize(proto, quantize="int8", calibration=tmp_path / "feeds.npz")
    graphopt.save(graphopt.optimize(proto), tmp_path / "m.om")
    with pytest.raises(InputError, match="input 'w' is an initializer the source model lets a "
                                         "caller override, which the .om fixed"):
        profile_model(tmp_path / "m.om", feeds=tmp_path / "feeds.npz", repeat=1)
    # Without the override all three run.
    del feeds["w"]
    graphopt.optimize(proto, verify=True, inputs=feeds)
    assert profile_model(tmp_path / "m.om", feeds=feeds, repeat=1)


@pytest.mark.parametrize("level, filler", [(1, 0), (2, 0), (3, 0), (2, 2100)])
def test_an_overridable_shape_is_not_taken_at_its_default(level, filler):
    # Inference sized y from the default [2, 3]: the Reshape looked like a no-op and went,
    # and Shape(y) folded, although the optimized model still takes `shape` as an input.
    # 2100 more nodes: the input check types a large model kind by kind, which read it too.
    from onnx import numpy_helper

    chain = [helper.make_node("Relu" if i % 2 else "Neg", [f"f{i}"], [f"f{i + 1}"])
             for i in range(filler)]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"]),
         helper.make_node("Shape", ["y"], ["dims"]), *chain], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
         *([helper.make_tensor_value_info("f0", TensorProto.FLOAT, [4])] if filler else [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"]),
         helper.make_tensor_value_info("dims", TensorProto.INT64, [2]),
         *([helper.make_tensor_value_info(f"f{filler}", TensorProto.FLOAT, [4])]
           if filler else [])],
        [numpy_helper.from_array(np.array([2, 3], np.int64), "shape")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "shape": np.array([3, 2])}
    if filler:
        feeds["f0"] = np.ones(4, np.float32)
    optimized = graphopt.optimize(proto, level=level).to_onnx()
    assert [i.name for i in optimized.graph.input][:2] == ["x", "shape"]
    assert numerics.compare(numerics.run(proto, feeds), numerics.run(optimized, feeds), 0, 0) == []


# An If whose branches read an outer value, so that uses cross graph boundaries.
BRANCHES = """
<ir_version: 9, opset_import: ["" : 17]>
g (bool c, float[4] x) => (float[4] y) {
  t = Relu(x)
  y = If(c) <then_branch = g1 () => (float[4] a) { a = Neg(t) },
             else_branch = g2 () => (float[4] b) { b = Abs(t) }>
}
"""


def _uses(model: Model) -> dict:
    return {value.name: [(use.node.name, use.node.op_type, use.index) for use in value.uses]
            for value in model.graph.all_values()}


@pytest.mark.parametrize("source", ["foldable", "branches", "chain"])
def test_a_result_pickles_with_its_model_as_it_was(source, tmp_path):
    """A pipeline may hand a compile to another process: the result pickles, and what comes
    back saves the same bytes, with every use list in its order (a 5000-node chain once
    overflowed the stack: pickle followed the links node by node)."""
    import pickle

    from graphopt.ir.verify import verify

    if source == "chain":
        nodes = [helper.make_node("Neg" if i % 2 else "Relu", [f"v{i}"], [f"v{i + 1}"])
                 for i in range(5000)]
        proto = helper.make_model(helper.make_graph(
            nodes, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("v5000", TensorProto.FLOAT, [4])]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    else:
        proto = parser.parse_model(FOLDABLE if source == "foldable" else BRANCHES)
    for kwargs in ({"level": 0}, {"target": "ascend310"}):
        result = graphopt.optimize(proto, **kwargs)
        copy = pickle.loads(pickle.dumps(result))
        verify(copy.model)
        assert _uses(copy.model) == _uses(result.model)
        assert copy.log.to_json() == result.log.to_json()
        for name, suffix in (("a", ".onnx"), ("b", ".onnx"), ("a", ".om"), ("b", ".om")):
            graphopt.save(result if name == "a" else copy, str(tmp_path / (name + suffix)))
        for suffix in (".onnx", ".om"):
            assert (tmp_path / ("a" + suffix)).read_bytes() == \
                (tmp_path / ("b" + suffix)).read_bytes(), suffix


def test_a_stale_declared_output_shape_is_not_the_models_fault():
    # onnxruntime overrides such an annotation with a warning; the input check judges nodes.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    assert [n.op_type for n in graphopt.optimize(proto).model.graph] == ["Relu"]


def test_verify_excuses_reordered_rounding_at_the_output_scale_only():
    # A detector's box decoding: a few elements near 0 computed from terms of hundreds, off by
    # a reordered sum's rounding, under rtol of the output's largest magnitude.
    from graphopt.rounding import _rounding_at_scale

    judge = {"rtol": 1e-4, "atol": 1e-5, "min_cosine": None}
    expected = np.linspace(-896, 896, 6300).astype(np.float32)
    expected[::500] = 0.01
    actual = expected.copy()
    actual[::500] += 0.0166
    assert _rounding_at_scale(expected, actual, judge) == pytest.approx((0.0166, 896), rel=1e-3)
    # A miscompile's systematic error: many elements off.
    assert _rounding_at_scale(expected, expected * 1.001, judge) is None
    # One element off by more than rtol of the scale.
    far = expected.copy()
    far[7] += 0.1
    assert _rounding_at_scale(expected, far, judge) is None
    # A NaN where the original has a number.
    broken = expected.copy()
    broken[3] = np.nan
    assert _rounding_at_scale(expected, broken, judge) is None


def test_numpy_integers_are_integers(proto, tmp_path):
    # A shape or a count read from an array arrives as a NumPy integer.
    result = graphopt.optimize(proto, level=np.int64(2), fold_size_limit=np.int64(1 << 20),
                               input_shapes={"x": list(np.array([3, 4]))},
                               pass_options={"max_iterations": np.int32(4)})
    assert result.model.graph.inputs[0].static_shape == (3, 4)
    assert all(type(d) is int for d in result.model.graph.inputs[0].static_shape)
    graphopt.save(result, tmp_path / "m.om")
    with graphopt.load(tmp_path / "m.om", intra_op_num_threads=np.int64(1)) as session:
        assert session.run({"x": np.ones((3, 4), np.float32)})["y"].shape == (3, 4)


def test_a_generator_of_instruments_serves_every_profile(proto):
    from graphopt.passes.instruments import Instrument

    class Count(Instrument):
        starts = 0

        def start(self, model) -> None:
            Count.starts += 1

    graphopt.optimize(proto, instruments=(Count() for _ in range(1)),
                      dynamic_dims={"N": [1, 2]})
    assert Count.starts == 2  # one per profile: the generator was read once, up front


def test_an_empty_model_path_is_named(proto):
    with pytest.raises(OptionError, match="^optimize: the model path is empty$"):
        graphopt.optimize("")


def test_save_refuses_flags_it_cannot_use(proto, tmp_path):
    result = graphopt.optimize(proto)
    with pytest.raises(OptionError, match="^external_data: expected True or False"):
        graphopt.save(result, tmp_path / "m.onnx", external_data="yes")
    with pytest.raises(OptionError, match="external_data is for ONNX files"):
        graphopt.save(result, tmp_path / "m.om", external_data=True)
    assert not os.listdir(tmp_path)


def test_results_and_sessions_print_in_one_line(proto, tmp_path):
    result = graphopt.optimize(proto, target="cpu")
    text = repr(result)
    assert text.startswith("<OptimizeResult <model>, O2") and "\n" not in text, text
    assert f"nodes {FOLDABLE_NODES} -> " in text and "partitions p0_cpu" in text
    graphopt.save(result, tmp_path / "m.om")
    session = graphopt.load(tmp_path / "m.om")
    assert repr(session) == (f"<OmSession {os.fspath(tmp_path / 'm.om')!r}: (x: float32[N,4]) "
                             "-> (y: float32[N,4], z: float32[N,4]), partitions p0_cpu>")
    session.close()
    assert repr(session).endswith(", closed>")


def test_a_bad_feed_is_an_input_error(proto, tmp_path):
    graphopt.save(graphopt.optimize(proto), tmp_path / "m.om")
    with graphopt.load(tmp_path / "m.om") as session:
        for feeds in ({}, {"x": np.ones((2, 4), np.int64)}, {"x": np.ones((2, 5), np.float32)},
                      {"x": np.ones(4, np.float32)}, {"x": np.ones((2, 4)), "w": 1}):
            with pytest.raises(InputError):
                session.run(feeds)
        with pytest.raises(OptionError, match="unknown output 'nope'"):
            session.run({"x": np.ones((2, 4), np.float32)}, output_names=["nope"])
        # A bare TypeError escaped: 'int' object is not iterable.
        with pytest.raises(OptionError, match="output_names must be a list of names, not int"):
            session.run({"x": np.ones((2, 4), np.float32)}, output_names=3)


def test_public_calls_check_their_keywords_as_optimize_does(proto, tmp_path):
    # compare_models read "no" as true (per-tensor rows on, the rounding allowance forced),
    # to_onnx let a size text reach a comparison with bytes, and pass_options refused the "4M"
    # its keyword takes.
    from graphopt.tools.compare import compare_models

    onnx.save(proto, tmp_path / "m.onnx")
    for keyword in ("per_tensor", "rounding"):
        with pytest.raises(OptionError, match=f"^{keyword}: expected True or False, got 'no'"):
            compare_models(tmp_path / "m.onnx", tmp_path / "m.onnx", **{keyword: "no"})
    model = graphopt.optimize(proto, pass_options={"fold_size_limit": "4M"}).model
    assert len(graphopt.to_onnx(model, weights_as_inputs_above="1K").graph.input) >= 1
    with pytest.raises(OptionError, match="^weights_as_inputs_above: expected a number of bytes"):
        graphopt.to_onnx(model, weights_as_inputs_above=[1])
    # A NUL in a path: a bare ValueError (embedded null byte) from the first os call.
    result = graphopt.optimize(proto)
    for call, what in ((lambda: graphopt.optimize("a\x00b.onnx"), "model"),
                       (lambda: graphopt.load("a\x00b.om"), "load"),
                       (lambda: graphopt.save(result, tmp_path / "a\x00b.om"), "save")):
        with pytest.raises(OptionError, match=f"^{what}: .* holds a NUL character"):
            call()


def _merged_decoder(cached: str = "Relu") -> onnx.ModelProto:
    """y = If(Not(use_cache_branch), Tanh(x·w), cached(x·w)), the switch through a Not as
    optimum's merged decoders may have it: one boolean input chooses the branch."""
    def branch(name, activation):
        nodes = [helper.make_node("MatMul", ["x", "w"], [f"m_{name}"]),
                 helper.make_node(activation, [f"m_{name}"], [f"y_{name}"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(
            f"y_{name}", TensorProto.FLOAT, [2, 8])])

    rng = np.random.default_rng(4)
    graph = helper.make_graph(
        [helper.make_node("Not", ["use_cache_branch"], ["no_cache"]),
         helper.make_node("If", ["no_cache"], ["y"], then_branch=branch("a", "Tanh"),
                          else_branch=branch("b", cached))],
        "g", [helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_verify_on_seeded_inputs_runs_both_branches_a_boolean_input_selects():
    # Seeded inputs draw one value for an optimum-style decoder's use_cache_branch: its other
    # branch (the first decoding step, without a cache) went unchecked while the summary said
    # every output matched.
    from graphopt.branch_switches import branch_switches
    from graphopt.compile_verify import verify_outputs
    from graphopt.passes import Options

    original = _merged_decoder()
    assert branch_switches(original) == ["use_cache_branch"]
    # Seed 0 draws False: through the Not, the then branch runs, the cached one not.
    assert numerics.random_feeds(original, seed=0)["use_cache_branch"].tolist() == [False]
    judge = {"rtol": 1e-4, "atol": 1e-5, "min_cosine": None}
    notes = []
    verify_outputs(original, original, None, Options(), judge, notes)
    assert notes[-1] == ("both branches verified: the seeded inputs ran with use_cache_branch "
                         "= False and again with True")
    # A compile wrong in the cached branch alone is caught on the second run.
    with pytest.raises(VerificationError, match="with use_cache_branch = True"):
        verify_outputs(original, _merged_decoder("Sigmoid"), None, Options(), judge, [])
    assert graphopt.optimize(original, verify=True).max_abs_error["y"] < 1e-5


def test_verify_flips_a_rank_0_boolean_switch_too():
    # np.logical_not of a 0-d array is a numpy scalar, which onnxruntime refused: the note
    # said the original could not run the other branch.
    then = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t"])], "t", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Add", ["x", "x"], ["e"])], "e", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=IR_VERSION)
    note = graphopt.optimize(model, verify=True).verify_note
    assert "both branches verified" in note, note
