"""Shape inference's types on the IR: read back from protobuf bytes, kept from the input check,
and not inferred again for a model they type in full."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from helpers import IR_VERSION, parse_model

from graphopt import numerics, zoo
from graphopt.compile_checks import check_input
from graphopt.compiler import optimize
from graphopt.ir import DType, load_onnx
from graphopt.ir.onnx_io import read_type
from graphopt.passes.infer_shapes import (
    VECTOR_PROP_LIMIT,
    _type_bytes,
    fully_typed,
    infer_shapes,
    record_types,
    weightless_proto,
)


def _infos() -> list[onnx.ValueInfoProto]:
    sequence = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2, "n"])
    optional = onnx.ValueInfoProto(name="opt")
    optional.type.optional_type.elem_type.tensor_type.elem_type = TensorProto.INT64
    empty_type = onnx.ValueInfoProto(name="empty")
    empty_type.type.SetInParent()
    unnamed = helper.make_tensor_value_info("", TensorProto.FLOAT, [1])
    unnamed.ClearField("name")  # the type comes first: the fallback reads it
    documented = helper.make_tensor_value_info("doc", TensorProto.FLOAT16, [3], doc_string="d")
    return [
        helper.make_tensor_value_info("static", TensorProto.FLOAT, [1, 8, 16]),
        helper.make_tensor_value_info("symbolic", TensorProto.INT64, ["batch", None, 300]),
        helper.make_tensor_value_info("n" * 300, TensorProto.BOOL, [2**40]),  # 2-byte lengths
        helper.make_tensor_value_info("ünïcode", TensorProto.DOUBLE, None),
        helper.make_tensor_value_info("scalar", TensorProto.FLOAT, []),
        onnx.ValueInfoProto(name="untyped"),
        sequence, optional, empty_type, unnamed, documented,
    ]


@pytest.mark.parametrize("info", _infos(), ids=lambda i: i.name[:12] or "unnamed")
def test_type_bytes_are_the_type_submessage(info):
    expected = info.type.SerializeToString() if info.HasField("type") else None
    assert _type_bytes(info) == expected


def _types(model) -> dict[str, tuple]:
    return {v.name: (v.dtype, v.shape, v.type_proto) for v in model.graph.all_values()}


@pytest.mark.parametrize("name", ["gpt2_small", "mobilenetv2"])
def test_record_types_reads_what_read_type_reads(name):
    """The byte path and its memo give every value the type the plain protobuf walk gives."""
    proto = zoo.build(name)
    model, reference = load_onnx(proto), load_onnx(proto)
    inferred = onnx.shape_inference.infer_shapes(weightless_proto(model), data_prop=True)
    assert record_types(model, inferred) > 0
    by_name = {info.name: read_type(info.type)
               for info in (*inferred.graph.value_info, *inferred.graph.output)}
    for value in reference.graph.all_values():
        if value.producer is not None and value.name in by_name:
            value.dtype, value.shape, value.type_proto = by_name[value.name]
    assert _types(model) == _types(reference)


def _counting_inference(monkeypatch) -> list[bool]:
    calls: list[bool] = []
    real = onnx.shape_inference.infer_shapes

    def counted(proto, *args, **kwargs):
        calls.append(kwargs.get("strict_mode", False))
        return real(proto, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    return calls


def _static_cnn() -> onnx.ModelProto:
    """Conv, BatchNorm, Relu, pooling and a MatMul head over a [1, 3, 8, 8] input: every shape
    follows from the input's and the weights' alone."""
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((4, 3, 3, 3)), "scale": rng.standard_normal(4),
              "bias": rng.standard_normal(4), "mean": rng.standard_normal(4),
              "var": rng.uniform(0.5, 2.0, 4), "fc": rng.standard_normal((4, 2))}
    weights = [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items()]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
         helper.make_node("Relu", ["b"], ["r"]),
         helper.make_node("GlobalAveragePool", ["r"], ["p"]),
         helper.make_node("Flatten", ["p"], ["f"]),
         helper.make_node("MatMul", ["f", "fc"], ["y"])],
        "static_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def _counting_kind_inference(monkeypatch) -> list[bool]:
    """Whether each input check typed its model node by node (kind_inference), not whole."""
    import graphopt.kind_inference as kind_inference

    typed: list[bool] = []
    real = kind_inference.infer_by_kind

    def counted(*args, **kwargs):
        result = real(*args, **kwargs)
        typed.append(result is not None)
        return result

    monkeypatch.setattr(kind_inference, "infer_by_kind", counted)
    return typed


def test_a_static_model_is_inferred_once_by_the_input_check(monkeypatch):
    calls = _counting_inference(monkeypatch)
    result = optimize(_static_cnn(), target="cpu")
    assert calls == [True]  # the input check's strict run; -O2's three InferShapes skip
    assert fully_typed(result.model)
    assert [r.name for r in result.log.records].count("InferShapes") == 3


def _repeated_blocks(blocks: int) -> onnx.ModelProto:
    """`blocks` times MatMul, Add (bias), Relu on a [1, 8] activation: 3 nodes per block, each
    block alike but for its weights."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(blocks):
        weights += [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32),
                                            f"w{i}"),
                    numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), f"b{i}")]
        y = "y" if i == blocks - 1 else f"r{i}"
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [y])]
        x = y
    graph = helper.make_graph(nodes, "blocks", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8])], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [1, 8])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_a_large_graph_of_repeated_blocks_is_inferred_by_kind(monkeypatch):
    """From BY_KIND_NODES nodes the input check asks ONNX once per kind of node: here three
    kinds, MatMul and Add asked with their small weights as data and without (which shows the
    data does not matter to them). No whole-model inference runs."""
    from graphopt.opcheck import BY_KIND_NODES

    asked = []
    real = onnx.shape_inference.infer_node_outputs
    monkeypatch.setattr(onnx.shape_inference, "infer_node_outputs",
                        lambda schema, node, *a, **k: asked.append(node.op_type) or
                        real(schema, node, *a, **k))
    calls, by_kind = _counting_inference(monkeypatch), _counting_kind_inference(monkeypatch)
    proto = _repeated_blocks(BY_KIND_NODES // 3 + 1)
    model = load_onnx(proto)
    check_input(model, "m.onnx")
    assert by_kind == [True] and calls == [] and fully_typed(model)
    assert sorted(asked) == ["Add", "Add", "MatMul", "MatMul", "Relu"]


def test_a_small_graph_keeps_the_whole_model_run(monkeypatch):
    """Below BY_KIND_NODES one whole-model run costs less than asking ONNX per kind."""
    calls, by_kind = _counting_inference(monkeypatch), _counting_kind_inference(monkeypatch)
    check_input(load_onnx(_repeated_blocks(10)), "m.onnx")
    assert by_kind == [] and calls == [True]


def test_shapes_only_data_propagation_finds_are_inferred_once_more(monkeypatch):
    """The tiny net's Reshape reads a computed shape: strict inference cannot type what follows
    it, -O2's first InferShapes (with data propagation) does, and the two after it skip."""
    calls = _counting_inference(monkeypatch)
    optimize(zoo.build("tiny"), target="cpu")
    assert calls == [True, False]


def test_a_model_with_symbolic_dims_is_still_inferred_by_the_passes(monkeypatch):
    calls = _counting_inference(monkeypatch)
    optimize(zoo.build("gpt2_small"), target="cpu")  # batch and sequence are symbolic
    assert calls[0] is True and calls.count(False) >= 2


def test_check_input_keeps_static_types_and_declared_dim_names():
    """Strict inference runs without the declared value infos, so it names an unknown dim
    afresh: only its static types are kept, a declared "nnz" stays."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    nz = helper.make_tensor_value_info("nz", TensorProto.INT64, [2, "nnz"])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"]),
         helper.make_node("NonZero", ["r"], ["nz"])],
        "g", [x], [y, nz])
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                        ir_version=IR_VERSION))
    values = {v.name: v for v in model.graph.all_values()}
    assert values["r"].shape is None  # no value info for it in the file
    check_input(model, "m.onnx")
    assert (values["r"].dtype.name, values["r"].shape) == ("FLOAT", (3, 4))
    assert values["nz"].shape == (2, "nnz")
    assert not fully_typed(model)


def _position_range(length: int) -> onnx.ModelProto:
    """y = x + Range(0, length): positions of a sequence pinned to `length` tokens."""
    nodes = [helper.make_node("Range", ["zero", "limit", "one"], ["positions"]),
             helper.make_node("Cast", ["positions"], ["p"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "p"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [length])],
        [numpy_helper.from_array(np.array(v, np.int64), name)
         for name, v in (("zero", 0), ("limit", length), ("one", 1))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_long_range_is_not_spelled_out_by_data_propagation():
    # onnx's data propagation lists a constant Range element by element: 1e8 positions took
    # 14 GB and 95 s. Past VECTOR_PROP_LIMIT its bound goes in as a typed input instead.
    long = weightless_proto(load_onnx(_position_range(VECTOR_PROP_LIMIT + 1)))
    assert "limit" in {i.name for i in long.graph.input}
    assert "limit" not in {t.name for t in long.graph.initializer}
    short = weightless_proto(load_onnx(_position_range(VECTOR_PROP_LIMIT)))
    assert "limit" in {t.name for t in short.graph.initializer}


def test_model_with_a_huge_vector_compiles_quickly():
    start = time.perf_counter()
    result = optimize(_position_range(10**8))  # minutes and gigabytes without the guards
    assert result.model.graph.outputs[0].shape == (10**8,)
    assert time.perf_counter() - start < 20  # ~0.1 s; the unguarded inference takes minutes


def test_a_static_dim_the_inputs_do_not_imply_is_not_folded_in(tmp_path):
    # The exporter's value_info says d is [3, 7]; the inputs make it [3, N]. Folding Shape(d)
    # on the declaration returned [3, 7] for every N.
    import graphopt
    from graphopt import numerics

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["d"]), helper.make_node("Shape", ["d"], ["ds"])],
        "stale", [vi("x", TensorProto.FLOAT, ["N", 3])], [vi("ds", TensorProto.INT64, [2])],
        value_info=[vi("d", TensorProto.FLOAT, [3, 7])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    result = graphopt.optimize(proto)
    (d,) = [v for v in result.model.graph.all_values() if v.name == "d"] or [None]
    assert d is None or list(d.shape) == [3, "N"]
    x = np.zeros((2, 3), np.float32)
    assert numerics.run(result.to_onnx(), {"x": x})["ds"].tolist() == [3, 2]
    graphopt.save(graphopt.optimize(proto, target="cpu"), tmp_path / "m.om")
    assert graphopt.load(tmp_path / "m.om").run({"x": x})["ds"].tolist() == [3, 2]


def test_a_static_declaration_whose_rank_the_inputs_do_not_imply_is_not_folded_in():
    # Traced at N = 1, the Squeeze (no axes) of [N, 1, 4] was declared [4]; inference from
    # the inputs finds no rank. Folding Shape(y) on the declaration returned [4] for every N.
    import graphopt
    from graphopt import numerics

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Squeeze", ["x"], ["y"]), helper.make_node("Shape", ["y"], ["ys"])],
        "stale", [vi("x", TensorProto.FLOAT, ["N", 1, 4])], [vi("ys", TensorProto.INT64, [None])],
        value_info=[vi("y", TensorProto.FLOAT, [4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    x = np.zeros((2, 1, 4), np.float32)
    for level in (2, 3):
        result = graphopt.optimize(proto, level=level)
        assert numerics.run(result.to_onnx(), {"x": x})["ys"].tolist() == [2, 4]


def test_a_graph_outputs_unfounded_declaration_is_not_folded_in_where_a_node_reads_it():
    # As above with the Squeeze's [4] a graph output too: its declaration is the signature,
    # but a Shape that reads it folded to [4] for every N.
    import graphopt
    from graphopt import numerics

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Squeeze", ["x"], ["y"]), helper.make_node("Shape", ["y"], ["ys"])],
        "stale", [vi("x", TensorProto.FLOAT, ["N", 1, 4])],
        [vi("y", TensorProto.FLOAT, [4]), vi("ys", TensorProto.INT64, [None])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    x = np.zeros((2, 1, 4), np.float32)
    for level in (2, 3):
        outputs = numerics.run(graphopt.optimize(proto, level=level).to_onnx(), {"x": x})
        assert outputs["ys"].tolist() == [2, 4] and outputs["y"].shape == (2, 4)


def test_a_graph_output_read_by_a_node_keeps_its_declared_rank_for_the_checker():
    # Found by tests/test_fuzz_rewrites.py: a graph output [2, 4, 6] computed by a Reshape to
    # Concat(Shape → Gather, [4, 6]), read by another Reshape, lost its whole declaration at
    # import (inference finds no rank); onnx.checker refuses a main graph's output without a
    # shape. The dims go (nothing may fold from them), the rank stays.
    import graphopt

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
         helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
         helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
         helper.make_node("Reshape", ["x", "target"], ["y"]),
         helper.make_node("Reshape", ["y", "back"], ["z"])],
        "read_output", [vi("x", TensorProto.FLOAT, [2, 3, 8])],
        [vi("y", TensorProto.FLOAT, [2, 4, 6]), vi("z", TensorProto.FLOAT, [2, 3, 8])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array([0], np.int64), "zero1"),
         numpy_helper.from_array(np.array([4, 6], np.int64), "rest"),
         numpy_helper.from_array(np.array([-1, 3, 8], np.int64), "back")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=IR_VERSION)
    for level in (0, 1, 2):
        compiled = graphopt.optimize(proto, level=level).to_onnx()
        onnx.checker.check_model(compiled, full_check=True)
        (y,) = [o for o in compiled.graph.output if o.name == "y"]
        assert len(y.type.tensor_type.shape.dim) == 3


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("precision", ["keep", "fp16", "mixed-fp16"])
def test_a_graph_output_a_node_reads_keeps_a_declaration_inference_cannot_found(level,
                                                                                 precision):
    # A Reshape to a target ONNX inference cannot read (ReduceProd does not propagate data)
    # has no inferred rank: its declaration was forgotten at import, as the MatMul reads it,
    # and -O0/-O1 (which fold nothing) exported the output without a shape, which
    # onnx.checker refuses in a main graph.
    proto = parse_model("""
        g (float[1,2,4,4] x) => (float[1,2,8] y, float[1,2,16] r) {
            s = Shape(x)
            head = Slice(s, zero, two)
            tail = Slice(s, two, four)
            rest = ReduceProd <axes = [0], keepdims = 1> (tail)
            target = Concat <axis = 0> (head, rest)
            r = Reshape(x, target)
            y = MatMul(r, w)
        }""", '<ir_version: 8, opset_import: ["" : 13]>\n', zero=np.array([0]),
        two=np.array([2]), four=np.array([4]), w=np.ones((16, 8), np.float32))
    out = optimize(proto, level=level, precision=precision).to_onnx()
    onnx.checker.check_model(out, full_check=True)
    assert [len(read_type(o.type)[1]) for o in out.graph.output] == [3, 3]


@pytest.mark.parametrize("declared", [[1, 24], ["a", "b"]])
def test_a_declared_rank_the_node_does_not_compute_gives_way(tmp_path, declared):
    # A Softmax of [1,2,3,4] declared as output [1,24]: onnxruntime warns and returns
    # [1,2,3,4]. The .om's signature (and any Shape of it) must say what is returned.
    import graphopt

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)], "stale",
        [vi("x", TensorProto.FLOAT, [1, 2, 3, 4])], [vi("y", TensorProto.FLOAT, declared)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=IR_VERSION)
    result = graphopt.optimize(proto, target="cpu")
    assert result.model.graph.outputs[0].shape == (1, 2, 3, 4)
    graphopt.save(result, tmp_path / "m.om")
    session = graphopt.load(tmp_path / "m.om")
    assert session.outputs[0]["shape"] == [1, 2, 3, 4]
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    assert session.run({"x": x})["y"].shape == (1, 2, 3, 4)


@pytest.mark.parametrize("precision", ["fp16", "mixed-fp16"])
def test_a_stale_output_declaration_gives_way_behind_the_cast_back_to_float32(tmp_path,
                                                                             precision):
    # ddddocr's form: [1, seqlen] declared for a Reshape to [T, 1, 6] whose target is built
    # at run time. -O2 corrects it (the rank is the target's length); in a half-precision
    # compile the Cast back to float32 took the output's name and the declaration with it,
    # inference of that Cast alone found the two agreeing, and the .om refused to load.
    import graphopt

    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[T, 1, 4] x) => (float[1, seqlen] y) {
            s = Shape (x)
            d0 = Gather <axis = 0> (s, i0)
            d1 = Gather <axis = 0> (s, i1)
            u0 = Unsqueeze (d0, axes)
            u1 = Unsqueeze (d1, axes)
            target = Concat <axis = 0> (u0, u1, six)
            flat = Reshape (x, rows)
            g = Gemm <transB = 1> (flat, w, b)
            y = Reshape (g, target)
        }""", i0=np.array(0, np.int64), i1=np.array(1, np.int64),
        axes=np.array([0], np.int64), six=np.array([6], np.int64),
        rows=np.array([-1, 4], np.int64), w=rng.standard_normal((6, 4)).astype(np.float32),
        b=rng.standard_normal(6).astype(np.float32),
        header='<ir_version: 7, opset_import: ["" : 13]>\n')
    result = graphopt.optimize(proto, target="cpu", precision=precision)
    assert len(result.model.graph.outputs[0].shape) == 3
    graphopt.save(result, tmp_path / "m.om")
    x = np.ones((5, 1, 4), np.float32)
    assert graphopt.load(tmp_path / "m.om").run({"x": x})["y"].shape == (5, 1, 6)


@pytest.mark.parametrize("dim", ["N", 2])
def test_a_declared_dtype_the_node_does_not_compute_gives_way(tmp_path, dim):
    # The exporter's value_info says r is int64[1]; Relu computes float. Kept, the .om's
    # partition did not load ("Type (tensor(int64)) of output arg (r) does not match").
    import graphopt

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        "stale", [vi("x", TensorProto.FLOAT, [dim, 3])], [vi("y", TensorProto.FLOAT, [dim, 3])],
        value_info=[vi("r", TensorProto.INT64, [1])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    graphopt.save(graphopt.optimize(proto, target="cpu"), tmp_path / "m.om")
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    np.testing.assert_array_equal(graphopt.load(tmp_path / "m.om").run({"x": x})["y"],
                                  -np.maximum(x, 0))


def test_types_are_carried_past_contrib_ops():
    """ONNX shape inference types no com.microsoft op: InferShapes types FusedMatMul,
    Attention and the elementwise ones itself and infers on from there."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 32)).astype(np.float32), "w")
    qkv = numpy_helper.from_array(rng.standard_normal((8, 24)).astype(np.float32), "qkv")
    bias = numpy_helper.from_array(np.zeros(24, np.float32), "bias")
    nodes = [
        helper.make_node("FusedMatMul", ["x", "w"], ["f"], domain="com.microsoft", transA=0,
                         transB=0, alpha=0.5),
        helper.make_node("FastGelu", ["f"], ["g"], domain="com.microsoft"),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("Attention", ["x", "qkv", "bias"], ["a"], domain="com.microsoft",
                         num_heads=2),
        helper.make_node("Relu", ["a"], ["y2"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 5, 8])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)], [w, qkv, bias])
    model = load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSION))
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    for name, shape in (("f", ("B", 5, 32)), ("g", ("B", 5, 32)), ("r", ("B", 5, 32)),
                        ("a", ("B", 5, 8)), ("y2", ("B", 5, 8))):
        assert (values[name].dtype, values[name].shape) == (DType.FLOAT, shape), name


@pytest.mark.parametrize("attrs, size", [
    ({"pads": [1, 1, 1, 1]}, 16), ({"strides": [2, 2]}, 7),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, 8),
    ({"dilations": [2, 2], "pads": [0, 0, 0, 0]}, 12)])
def test_a_fused_convs_output_is_typed_as_a_convs(attrs, size):
    """onnxruntime's extended level saves Conv + Relu as com.microsoft::FusedConv: typed as
    the Conv it is, everything after it keeps its static shape, as onnxruntime computes it."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("FusedConv", ["x", "w"], ["c"], domain="com.microsoft",
                              activation="Relu", **attrs),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    proto = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSION)
    model = load_onnx(proto)
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    assert values["c"].shape == (1, 8, size, size)
    assert values["y"].shape == (1, 8, size - 1, size - 1)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    assert numerics.run(proto, {"x": x})["y"].shape == values["y"].shape


def test_the_sum_a_skip_layer_norm_passes_on_is_typed():
    # Its fourth output carries the residual path on; untyped, a partition boundary on it
    # made a graph input without a type.
    gamma = numpy_helper.from_array(np.ones(8, np.float32), "gamma")
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"],
                              ["y", "", "", "sum"], domain="com.microsoft", epsilon=1e-5),
             helper.make_node("Relu", ["sum"], ["r"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", 5, 8])
                     for name in ("x", "skip")],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "r")],
        [gamma])
    model = load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSION))
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    for name in ("y", "sum", "r"):
        assert (values[name].dtype, values[name].shape) == (DType.FLOAT, ("B", 5, 8)), name


def test_embed_layer_norm_and_qlinear_ops_are_typed():
    # onnxruntime's BERT optimizer starts the model with EmbedLayerNormalization, and its
    # QOperator quantizer writes QLinearAdd: untyped, nothing after them was quantized,
    # converted or planned, and a partition boundary made an untyped graph input.
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "words")
    positions = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "pos")
    gamma = numpy_helper.from_array(np.ones(8, np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(8, np.float32), "beta")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(128, np.uint8), "zero")
    nodes = [helper.make_node("EmbedLayerNormalization",
                              ["ids", "", "words", "pos", "", "gamma", "beta"],
                              ["e", "mask_index"], domain="com.microsoft", epsilon=1e-5),
             helper.make_node("QuantizeLinear", ["e", "scale", "zero"], ["q"]),
             helper.make_node("QLinearAdd", ["q", "scale", "zero", "q", "scale", "zero",
                                             "scale", "zero"], ["s"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["s", "scale", "zero"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT32, ["B", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("mask_index", TensorProto.INT32, None)],
        [table, positions, gamma, beta, scale, zero])
    model = load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSION))
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    for name, dtype, shape in (("e", DType.FLOAT, ("B", 16, 8)), ("mask_index", DType.INT32,
                                                                  ("B",)),
                               ("s", DType.UINT8, ("B", 16, 8)), ("y", DType.FLOAT,
                                                                  ("B", 16, 8))):
        assert (values[name].dtype, values[name].shape) == (dtype, shape), name


@pytest.mark.parametrize("direction, directions", [("forward", 1), ("bidirectional", 2)])
def test_a_dynamically_quantized_lstm_is_typed_as_an_lstm(direction, directions):
    # onnxruntime's dynamic quantizer writes DynamicQuantizeLSTM (ddddocr's OCR model): left
    # untyped, the compile planned no memory and declared its static output [?, ?, ?].
    rng = np.random.default_rng(0)
    hidden, features = 6, 4
    weights = [numpy_helper.from_array(rng.integers(-8, 8, (directions, features, 4 * hidden))
                                       .astype(np.int8), "w"),
               numpy_helper.from_array(rng.integers(-8, 8, (directions, hidden, 4 * hidden))
                                       .astype(np.int8), "r"),
               numpy_helper.from_array(np.full(directions, 0.05, np.float32), "w_scale"),
               numpy_helper.from_array(np.zeros(directions, np.int8), "w_zero"),
               numpy_helper.from_array(np.full(directions, 0.05, np.float32), "r_scale"),
               numpy_helper.from_array(np.zeros(directions, np.int8), "r_zero")]
    node = helper.make_node(
        "DynamicQuantizeLSTM", ["x", "w", "r", "", "", "", "", "", "w_scale", "w_zero",
                                "r_scale", "r_zero"], ["y", "h", "c"], domain="com.microsoft",
        hidden_size=hidden, direction=direction)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 2, features])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "yhc"],
        weights)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=IR_VERSION)
    model = load_onnx(proto)
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    assert values["y"].shape == (7, directions, 2, hidden)
    assert values["h"].shape == values["c"].shape == (directions, 2, hidden)
    x = {"x": rng.standard_normal((7, 2, features)).astype(np.float32)}
    got = numerics.run(proto, x)
    assert got["y"].shape == (7, directions, 2, hidden) and got["h"].shape == (directions, 2,
                                                                            hidden)


def test_ai_onnx_ml_outputs_are_typed_and_the_casts_after_them_go():
    """ONNX's inference types no Normalizer, Scaler, regressor or classifier score: typed by
    their spec, the float Casts skl2onnx writes after them are no-ops and go, and the ops
    after them are typed too."""
    ml = "ai.onnx.ml"
    nodes = [helper.make_node("Normalizer", ["x"], ["n"], domain=ml, norm="L2"),
             helper.make_node("Scaler", ["n"], ["s"], domain=ml, offset=[0.5] * 4,
                              scale=[2.0] * 4),
             helper.make_node("Cast", ["s"], ["sc"], to=TensorProto.FLOAT),
             helper.make_node("LinearRegressor", ["sc"], ["r"], domain=ml,
                              coefficients=[1.0, 2, 3, 4, 4, 3, 2, 1], targets=2),
             helper.make_node("Cast", ["r"], ["rc"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["rc"], ["y"]),
             helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ml,
                              nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2],
                              nodes_featureids=[1, 0, 0], nodes_values=[0.0, 0.0, 0.0],
                              nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
                              nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                              class_treeids=[0, 0, 0, 0], class_nodeids=[1, 1, 2, 2],
                              class_ids=[0, 1, 0, 1], class_weights=[0.8, 0.2, 0.3, 0.7],
                              classlabels_int64s=[3, 5]),
             helper.make_node("Cast", ["scores"], ["z"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(name, dtype, None) for name, dtype in (
            ("y", TensorProto.FLOAT), ("label", TensorProto.INT64), ("z", TensorProto.FLOAT))])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ml, 1)],
                              ir_version=IR_VERSION)
    model = load_onnx(proto)
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    for name, dtype, shape in (("n", DType.FLOAT, ("N", 4)), ("s", DType.FLOAT, ("N", 4)),
                               ("r", DType.FLOAT, ("N", 2)), ("y", DType.FLOAT, ("N", 2)),
                               ("label", DType.INT64, ("N",)),
                               ("scores", DType.FLOAT, ("N", None))):
        assert (values[name].dtype, values[name].shape) == (dtype, shape), name
    optimized = optimize(proto).to_onnx()
    assert [n.op_type for n in optimized.graph.node] == [
        "Normalizer", "Scaler", "LinearRegressor", "Relu", "TreeEnsembleClassifier"]
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL

    def run(model):
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        return session.run(None, feeds)

    for expected, actual in zip(run(proto), run(optimized)):
        np.testing.assert_array_equal(actual, expected)


def test_an_l2_normalizers_input_is_written_without_its_shape():
    """onnxruntime's L2 Normalizer may run in place and writes x² before it reads x's sign:
    with its input's and output's sizes both known, every output came out positive. The
    written model declares their types alone (an Add's output, which onnxruntime sizes itself,
    as input: a differential fuzz found that form)."""
    ml = "ai.onnx.ml"
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]),
             helper.make_node("Normalizer", ["s"], ["n"], domain=ml, norm="L2"),
             helper.make_node("LinearRegressor", ["n"], ["y"], domain=ml,
                              coefficients=[1.0, -2, 3, -4], targets=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ml, 1)],
                              ir_version=IR_VERSION)
    optimized = optimize(proto).to_onnx()
    declared = {v.name: v.type.tensor_type for v in optimized.graph.value_info}
    for name in ("s", "n"):
        assert not declared[name].HasField("shape")
        assert declared[name].elem_type == TensorProto.FLOAT
    x = np.random.default_rng(4).standard_normal((5, 4)).astype(np.float32)
    scaled = x + x
    normalized = scaled / np.linalg.norm(scaled, axis=1, keepdims=True)
    expected = normalized @ np.array([1.0, -2, 3, -4], np.float32)
    got = numerics.run(optimized, {"x": x})["y"]
    np.testing.assert_allclose(got.reshape(-1), expected, rtol=1e-5, atol=1e-6)


_LABELLED_SCORES = """
import onnx
from onnx import TensorProto as T, helper as h
from graphopt.compiler import optimize

ml = "ai.onnx.ml"
first = ({op!r} == "Scaler" and h.make_node("Scaler", ["x"], ["d"], domain=ml,
                                            offset=[0.5, 0.0], scale=[2.0, 1.0])
         or h.make_node("TreeEnsembleRegressor", ["x"], ["d"], domain=ml, n_targets=1,
                        nodes_featureids=[0, 0, 0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
                        nodes_nodeids=[0, 1, 2], nodes_treeids=[0, 0, 0],
                        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                        nodes_values=[0.5, 0.0, 0.0], target_ids=[0, 0],
                        target_nodeids=[1, 2], target_treeids=[0, 0],
                        target_weights=[1.0, 2.0]))
label = h.make_node("LabelEncoder", ["d"], ["s"], domain=ml, keys_floats=[1.0, 2.0],
                    values_strings=["one", "two"], default_string="?")
graph = h.make_graph([first, label], "g", [h.make_tensor_value_info("x", T.FLOAT, [None, 2])],
                     [h.make_tensor_value_info("s", T.STRING, [None, 1])])
proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(ml, 2)],
                     ir_version=8)
onnx.save(proto, {path!r})  # a file: the import check runs strict inference on it
print(optimize({path!r}, verify=True).max_abs_error)
"""


@pytest.mark.parametrize("op", ["TreeEnsembleRegressor", "Scaler"])
def test_a_label_encoder_reading_an_ml_output_onnx_leaves_untyped_compiles(op, tmp_path):
    # scikit-learn's RandomForest exported with decision_path=True: onnx 1.23's inference
    # died of SIGSEGV on the LabelEncoder, killing the compile without a word (exit 139). A
    # child process, so that a crash fails this test rather than ending the session.
    import subprocess
    import sys

    script = _LABELLED_SCORES.format(op=op, path=str(tmp_path / "labels.onnx"))
    done = subprocess.run([sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def test_an_empty_string_label_list_leaves_a_classifier_int64_labels(tmp_path):
    # onnxruntime takes an empty classlabels_strings as none and gives int64 labels; read as
    # strings, the declared type made the import check refuse a model it runs.
    ml = "ai.onnx.ml"
    tree = helper.make_node(
        "TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ml,
        classlabels_int64s=[1, 2], nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_nodeids=[0, 1, 2],
        nodes_treeids=[0, 0, 0], nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        nodes_values=[0.5, 0.0, 0.0], class_ids=[0, 1], class_nodeids=[1, 2],
        class_treeids=[0, 0], class_weights=[1.0, 1.0])
    tree.attribute.append(helper.make_attribute("classlabels_strings", [],
                                                attr_type=onnx.AttributeProto.STRINGS))
    after = [helper.make_node("Cast", ["label"], ["label64"], to=TensorProto.INT64),
             helper.make_node("Add", ["label64", "label64"], ["y"])]
    graph = helper.make_graph(
        [tree, *after], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ml, 1)],
                              ir_version=IR_VERSION)
    x = np.array([[0.0, 0.0], [1.0, 0.0]], np.float32)
    expected = numerics.run(proto, {"x": x})["y"]
    onnx.save(proto, tmp_path / "tree.onnx")  # a file: the import check runs on it
    compiled = optimize(str(tmp_path / "tree.onnx"), level=2).to_onnx()
    np.testing.assert_array_equal(numerics.run(compiled, {"x": x})["y"], expected)


def test_static_inputs_replace_a_contrib_outputs_declared_symbolic_dims():
    """A model onnxruntime's optimizer saved declares its contrib outputs with symbolic dims
    ("unk__3"); pinned inputs make them static, and the values after them too."""
    w = numpy_helper.from_array(np.ones((8, 32), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("FastGelu", ["m"], ["g"], domain="com.microsoft"),
             helper.make_node("Relu", ["g"], ["r"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)], [w],
        value_info=[helper.make_tensor_value_info("g", TensorProto.FLOAT, ["unk__3", 5, 32])])
    model = load_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSION))
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    assert values["g"].shape == values["r"].shape == (2, 5, 32)


def test_a_bert_onnxruntime_already_optimized_is_typed_and_fuses_every_attention(tmp_path):
    """onnxruntime's extended level saves FusedMatMul and BiasGelu with `unk__N` dims: pinned,
    InferShapes types everything past them, so every attention block still fuses."""
    proto = zoo.build("bert_base", layers=2, hidden=64, heads=2, intermediate=128, vocab=100,
                      max_positions=32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    saved = onnx.load(str(tmp_path / "ort.onnx"))
    assert any(n.domain == "com.microsoft" for n in saved.graph.node)
    result = optimize(saved, input_shapes={"input_ids": [1, 16], "attention_mask": [1, 16]})
    assert not [v.name for v in result.model.graph.all_values()
                if v.producer is not None and v.dtype is None]
    assert [n.op_type for n in result.model.graph].count("Attention") == 2



def _stale_output_declaration() -> onnx.ModelProto:
    """A Reshape of x [1, S, 8] to [S, 1, -1], declared [1, seqlen]: a stale export whose
    output onnxruntime runs (warning) as what it computes."""
    nodes = [helper.make_node("Transpose", ["x"], ["h"], perm=[1, 0, 2]),
             helper.make_node("Shape", ["h"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
             helper.make_node("Unsqueeze", ["d0"], ["u0"], axes=[0]),
             helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0),
             helper.make_node("Unsqueeze", ["d1"], ["u1"], axes=[0]),
             helper.make_node("Concat", ["u0", "u1", "last"], ["target"], axis=0),
             helper.make_node("Reshape", ["h", "target"], ["y"])]
    graph = helper.make_graph(
        nodes, "stale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])],
        [numpy_helper.from_array(np.array(0, np.int64), "i0"),
         numpy_helper.from_array(np.array(1, np.int64), "i1"),
         numpy_helper.from_array(np.array([-1], np.int64), "last")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)],
                             ir_version=IR_VERSION)


def test_a_stale_output_declaration_is_found_from_its_node_alone():
    # The whole model's inference keeps a graph output's declaration; where nothing else
    # corrects it (a captcha recognizer's LSTM: [1, seqlen] for [20, 1, 8210]), its .om
    # recorded the declaration as its signature and refused to load, the partition returning
    # the real shape. The output's node, inferred alone, tells.
    from graphopt.passes.output_declarations import correct_output_declarations

    model = load_onnx(_stale_output_declaration())
    infer_shapes(model)  # types the Reshape's inputs; the declared output stays
    assert correct_output_declarations(model) == ["'y' declared [1, seqlen] computes [?, ?, ?]"]
    assert len(model.graph.outputs[0].shape) == 3
    assert correct_output_declarations(model) == []  # as computed now
    # Pinned and folded, the target is a constant: inference then gives the sizes too.
    folded = helper.make_model(helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["y"])], "folded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])],
        [numpy_helper.from_array(np.array([5, 1, -1], np.int64), "target")]),
        opset_imports=[helper.make_opsetid("", 12)], ir_version=IR_VERSION)
    model = load_onnx(folded)
    assert correct_output_declarations(model) == ["'y' declared [1, seqlen] computes [5, 1, 8]"]



@pytest.mark.parametrize("level", [0, 1])
def test_the_pieces_of_an_uneven_split_to_sequence_share_no_made_up_dim(level):
    # ONNX's inference names the split dim of a sequence's element type once (unk__0), and
    # every SequenceAt copies it: the [1, 8, 5] and [1, 64, 5] pieces read as one size, their
    # declared shapes gave way to it, and onnxruntime reused a buffer of one for the other in
    # a YOLO head cut by --out-nodes ("Shape mismatch attempting to re-use buffer").
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["s"], axis=1),
             helper.make_node("SequenceAt", ["s", "one"], ["a"]),
             helper.make_node("SequenceAt", ["s", "zero"], ["b"]),
             helper.make_node("Relu", ["a"], ["ya"]), helper.make_node("Relu", ["b"], ["yb"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 72, 5])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("ya", "yb")],
        [numpy_helper.from_array(np.array([64, 8], np.int64), "sizes"),
         numpy_helper.from_array(np.array(1, np.int64), "one"),
         numpy_helper.from_array(np.array(0, np.int64), "zero")],
        value_info=[helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, 5]),
                    helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 64, 5])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=IR_VERSION)
    out = optimize(proto, level=level).to_onnx()
    dims = {info.name: [d.dim_value or d.dim_param or None
                        for d in info.type.tensor_type.shape.dim]
            for info in [*out.graph.value_info, *out.graph.output]
            if info.type.tensor_type.HasField("shape")}
    pieces = [dims[name][1] for name in ("a", "b", "ya", "yb") if name in dims]
    assert pieces and not any(isinstance(d, str) for d in pieces), dims
    x = np.random.default_rng(0).standard_normal((1, 72, 5)).astype(np.float32)
    ya, yb = ort.InferenceSession(out.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(ya, np.maximum(x[:, 64:], 0))
    np.testing.assert_array_equal(yb, np.maximum(x[:, :64], 0))


@pytest.mark.parametrize("level", [1, 2])
def test_a_named_dim_that_inference_sizes_0_keeps_its_name(level):
    # onnx 1.23 infers a 3-D Attention-23's output as [B, S, 0] from named widths: the compile
    # wrote the 0 over the declared name, and onnxruntime reported it against every run of an
    # output that is [2, 4, 24].
    proto = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 23]> g (float[B, S, E] q, float[B, T, E] k, '
        'float[B, T, E] v) => (float[B, S, D] y) '
        '{ y = Attention <q_num_heads = 3, kv_num_heads = 3> (q, k, v) }')
    written = optimize(proto, level=level).to_onnx()
    onnx.checker.check_model(written, full_check=True)
    dims = [d.dim_param or d.dim_value for d in written.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["B", "S", "D"], dims
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((2, 4, 24)).astype(np.float32),
             "k": rng.standard_normal((2, 5, 24)).astype(np.float32),
             "v": rng.standard_normal((2, 5, 24)).astype(np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    run = [ort.InferenceSession(m.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for m in (proto, written)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-6)


def test_the_qoperator_quantizers_contrib_ops_are_typed_as_onnxruntime_computes_them(tmp_path):
    # quantize_static in QOperator form writes QGemm, QLinearAveragePool, QLinearConcat,
    # QLinearGlobalAveragePool and QLinearSoftmax: untyped, a quantized CNN planned no memory
    # and `graphopt partition` called its static tensors dynamic.
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat,
                                          quantize_static)

    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((6, 4, 3, 3)), "w2": rng.standard_normal((2, 4, 1, 1)),
               "fc": rng.standard_normal((5, 8)), "bias": rng.standard_normal(5)}
    proto = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 9, 9] x) => (float[1, 5] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        r1 = Relu(c1)
        c2 = Conv(x, w2)
        a = AveragePool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (r1)
        b = AveragePool <kernel_shape = [3, 3], strides = [2, 2], auto_pad = "SAME_UPPER"> (c2)
        j = Concat <axis = 1> (a, b)
        p = GlobalAveragePool(j)
        f = Flatten(p)
        z = Gemm <transB = 1> (f, fc, bias)
        y = Softmax(z)
    }""")
    proto.graph.initializer.extend(numpy_helper.from_array(v.astype(np.float32), k)
                                   for k, v in weights.items())
    source, quantized = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(proto, source)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": rng.standard_normal((1, 4, 9, 9)).astype(np.float32)}
                                 for _ in range(2)])

        def get_next(self):
            return next(self.samples, None)

    quantize_static(str(source), str(quantized), Reader(), quant_format=QuantFormat.QOperator)
    written = onnx.load(quantized)
    contrib = {n.op_type for n in written.graph.node if n.domain == "com.microsoft"}
    assert {"QGemm", "QLinearAveragePool", "QLinearConcat", "QLinearGlobalAveragePool",
            "QLinearSoftmax"} <= contrib
    model = load_onnx(written)
    infer_shapes(model)
    computed = [v for node in model.graph for v in node.outputs if v is not None]
    # What onnxruntime computes for every value, each made an output.
    exposed = onnx.load(quantized)
    exposed.graph.output.extend(onnx.ValueInfoProto(name=v.name) for v in computed
                                if v.name != "y")
    feeds = {"x": rng.standard_normal((1, 4, 9, 9)).astype(np.float32)}
    results = numerics.run(exposed, feeds)
    for value in computed:
        actual = results[value.name]
        assert (value.dtype, value.shape) == (DType.from_numpy(actual.dtype), actual.shape), \
            value.name


def test_a_qgemm_without_an_output_zero_point_is_float():
    # onnxruntime writes float32 without y_zero_point, even given a y_scale: typed uint8, the
    # compile had declared the wrong output type and was refused.
    weights = [numpy_helper.from_array(np.array(0.1, np.float32), "xs"),
               numpy_helper.from_array(np.array(3, np.int8), "xz"),
               numpy_helper.from_array(np.ones((4, 3), np.int8), "w"),
               numpy_helper.from_array(np.array(0.1, np.float32), "ws"),
               numpy_helper.from_array(np.array(0, np.int8), "wz"),
               numpy_helper.from_array(np.array(0.5, np.float32), "ys")]
    graph = helper.make_graph(
        [helper.make_node("QGemm", ["x", "xs", "xz", "w", "ws", "wz", "", "ys"], ["y"],
                          domain="com.microsoft"),
         helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], weights)
    proto = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    model = load_onnx(proto)
    infer_shapes(model)
    y = next(v for v in model.graph.all_values() if v.name == "y")
    assert (y.dtype, y.shape) == (DType.FLOAT, (2, 3))
    assert numerics.run(proto, {"x": np.ones((2, 4), np.int8)})["z"].dtype == np.float32
    optimize(proto, verify=True)


def test_an_image_scaler_is_typed_as_its_input():
    # ImageScaler (opsets 1-9, experimental), which onnxruntime runs and ONNX's inference does
    # not type: an opset-8 model's static tensors after it had been called dynamic.
    graph = helper.make_graph(
        [helper.make_node("ImageScaler", ["x"], ["s"], scale=0.5, bias=[1.0, 2.0, 3.0]),
         helper.make_node("Relu", ["s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=4)
    model = load_onnx(proto)
    infer_shapes(model)
    values = {v.name: v for v in model.graph.all_values()}
    for name in ("s", "y"):
        assert (values[name].dtype, values[name].shape) == (DType.FLOAT, (1, 3, 4, 4)), name


@pytest.mark.parametrize("op, labels", [("TreeEnsembleClassifier", 3), ("LinearClassifier", 3),
                                        ("TreeEnsembleClassifier", 2)])
def test_a_classifiers_scores_have_a_column_per_label_past_two(op, labels):
    # Pinned to 64 rows, an xgboost-style 3-class ensemble's scores had read [64, ?], and its
    # memory plan was refused for a shape "computed at run time". A binary classifier's column
    # count differs between runtimes: it stays open.
    ml = "ai.onnx.ml"
    if op == "TreeEnsembleClassifier":
        attrs = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                     nodes_values=[0.0, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
                     nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                     class_treeids=[0] * 2 * labels, class_nodeids=[1] * labels + [2] * labels,
                     class_ids=list(range(labels)) * 2,
                     class_weights=list(np.linspace(0.1, 0.9, 2 * labels)))
    else:
        attrs = dict(coefficients=list(np.linspace(-1, 1, 4 * labels)),
                     intercepts=[0.1] * labels)
    labelled = "classlabels_int64s" if op == "TreeEnsembleClassifier" else "classlabels_ints"
    node = helper.make_node(op, ["x"], ["label", "scores"], domain=ml,
                            **{labelled: list(range(labels))}, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [64, 4])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, None),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ml, 1)],
                              ir_version=IR_VERSION)
    model = load_onnx(proto)
    infer_shapes(model)
    scores = next(v for v in model.graph.all_values() if v.name == "scores")
    assert scores.shape == (64, labels if labels > 2 else None)
    ran = numerics.run(proto, {"x": np.zeros((64, 4), np.float32)})["scores"]
    assert labels == 2 or ran.shape == (64, labels)


@pytest.mark.parametrize("stops_early", [False, True])
def test_a_loop_that_runs_every_trip_has_scan_outputs_of_its_trip_count(stops_early):
    # torch's EmbeddingBag: a Loop of one iteration per bag whose condition stays true. Pinned,
    # a DLRM's bag sums had kept an unknown length and gone to the host as a dynamic shape.
    # A condition the body computes may stop the loop early: the length stays open.
    cond_out = (helper.make_node("Less", ["i", "limit"], ["cond_out"]) if stops_early
                else helper.make_node("Cast", ["keep"], ["cond_out"], to=TensorProto.BOOL))
    body = helper.make_graph(
        [cond_out, helper.make_node("Gather", ["table", "i"], ["row"])], "bag",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [3])])
    graph = helper.make_graph(
        [helper.make_node("Shape", ["offsets"], ["n"]),
         helper.make_node("Squeeze", ["n"], ["trips"]),
         helper.make_node("Loop", ["trips", "keep"], ["rows"], body=body),
         helper.make_node("Relu", ["rows"], ["y"])], "g",
        [helper.make_tensor_value_info("offsets", TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((8, 3), np.float32), "table"),
         numpy_helper.from_array(np.array(True), "keep"),
         numpy_helper.from_array(np.array(2, np.int64), "limit")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    compiled = optimize(proto, level=2)
    values = {v.name: v for v in compiled.model.graph.all_values()}
    leading = values["y"].shape[0]
    if stops_early:
        assert not isinstance(leading, int)
    else:
        assert leading == 5
    feeds = {"offsets": np.arange(5, dtype=np.int64)}
    expected = numerics.run(proto, feeds)["y"]
    assert expected.shape == ((3 if stops_early else 5), 3)
    np.testing.assert_array_equal(numerics.run(compiled.to_onnx(), feeds)["y"], expected)
