"""IR: use lists kept in sync by setters, graph edits, ordering, printer, verifier, round-trip."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper
from helpers import IR_VERSION

from graphopt import numerics
from graphopt.errors import InputError
from graphopt.ir import (DType, Graph, Node, Tensor, Value, VerifyError, format_model, load_onnx,
                         to_onnx, verify)
from graphopt.ir.attributes import Attr


def _model(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


CHAIN = _model("""
<ir_version: 8, opset_import: ["" : 17]>
chain (float[N, 4] x) => (float[N, 4] y) {
    a = Relu(x)
    b = Neg(a)
    y = Add(a, b)
}
""")


def test_use_lists_follow_set_input():
    model = load_onnx(CHAIN)
    relu, neg, add = model.graph.nodes()
    a = relu.output
    assert [(u.node, u.index) for u in a.uses] == [(neg, 0), (add, 0)]
    add.set_input(0, neg.output)
    assert [(u.node, u.index) for u in a.uses] == [(neg, 0)]
    assert [(u.node, u.index) for u in neg.output.uses] == [(add, 1), (add, 0)]
    verify(model)


def test_replace_all_uses_and_safe_remove():
    model = load_onnx(CHAIN)
    graph = model.graph
    relu, neg, add = graph.nodes()
    with pytest.raises(ValueError, match="still used"):
        graph.remove(neg)
    neg.output.replace_all_uses_with(relu.output)
    graph.remove(neg)
    assert len(graph) == 2 and add.inputs == (relu.output, relu.output)
    assert relu.output.consumers() == [add]
    verify(model)


def test_iteration_tolerates_removal_and_insertion():
    model = load_onnx(CHAIN)
    graph = model.graph
    seen = []
    for node in graph:
        seen.append(node.op_type)
        if node.op_type == "Relu":
            neg = node._next
            neg.output.replace_all_uses_with(node.output)
            graph.remove(neg)
            graph.insert_after(node, Node("Abs", [node.output]))
    assert seen == ["Relu", "Add"]
    assert [n.op_type for n in graph] == ["Relu", "Abs", "Add"]


def test_sort_restores_topological_order_and_detects_cycles():
    graph = Graph("g")
    x = graph.add_input(Value("x", DType.FLOAT, (2,)))
    first = Node("Relu", [x])
    second = Node("Neg", [first.output])
    graph.append(second)
    graph.append(first)
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(graph)
    graph.sort()
    assert [n.op_type for n in graph] == ["Relu", "Neg"]
    first.set_input(0, second.output)
    with pytest.raises(ValueError, match="cycle"):
        graph.sort()


def test_sort_sees_what_a_subgraph_reads_and_a_self_loop():
    """The in-order check counts a subgraph's reads of outer values, as the full sort does: an
    If placed before the producer of a value its branch reads is moved after it."""
    graph = Graph("g")
    x = graph.add_input(Value("x", DType.FLOAT, (2,)))
    cond = graph.add_input(Value("c", DType.BOOL, ()))
    producer = Node("Relu", [x])
    branch = Graph("then")
    inner = Node("Neg", [producer.output])
    branch.append(inner)
    branch.outputs.append(inner.output)
    other = Graph("else")
    ident = Node("Identity", [x])
    other.append(ident)
    other.outputs.append(ident.output)
    holder = Node("If", [cond], {"then_branch": branch, "else_branch": other})
    graph.append(holder)
    graph.append(producer)
    graph.sort()
    assert [n.op_type for n in graph] == ["Relu", "If"]
    graph.sort()  # already in order: unchanged
    assert [n.op_type for n in graph] == ["Relu", "If"]
    loop = Node("Abs", [x])
    graph.append(loop)
    loop.set_input(0, loop.output)
    with pytest.raises(ValueError, match="cycle"):
        graph.sort()


def test_reorder_follows_the_given_order_and_repairs_dependencies():
    graph = Graph("g")
    x = graph.add_input(Value("x", DType.FLOAT, (2,)))
    relu, neg, abs_ = Node("Relu", [x]), Node("Neg", [x]), Node("Abs", [x])
    tail = Node("Sum", [relu.output, neg.output, abs_.output])
    for node in (relu, neg, abs_, tail):
        graph.append(node)
    graph.reorder([abs_, relu, neg, tail])
    assert [n.op_type for n in graph] == ["Abs", "Relu", "Neg", "Sum"]
    graph.reorder([tail, neg, relu, abs_])  # Sum first is impossible: it moves after its inputs
    assert [n.op_type for n in graph] == ["Neg", "Relu", "Abs", "Sum"]
    with pytest.raises(ValueError, match="each of its 4 nodes once"):
        graph.reorder([abs_, relu, neg])


def test_fresh_names_are_unique_across_nested_graphs():
    model = load_onnx(_IF_MODEL)
    graph = model.graph
    names = {v.name for v in graph.all_values()}
    fresh = graph.fresh_name("y")
    assert fresh not in names and fresh.startswith("y_")
    node = graph.make_node("Relu", [graph.inputs[0]])
    assert node.output.name not in names


_IF_MODEL = _model("""
<ir_version: 8, opset_import: ["" : 17]>
branchy (bool cond, float[3] x) => (float[3] y) {
    k = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
    y = If (cond) <
        then_branch = then_g () => (float[3] t) { t = Add(x, k) },
        else_branch = else_g () => (float[3] e) { e = Sub(x, k) }
    >
}
""")


def test_subgraphs_capture_outer_values():
    model = load_onnx(_IF_MODEL)
    graph = model.graph
    k = graph.nodes()[0].output
    if_node = graph.nodes()[1]
    then_add = if_node.attrs["then_branch"].value.nodes()[0]
    assert then_add.inputs[1] is k
    assert {u.node.op_type for u in k.uses} == {"Add", "Sub"}
    assert if_node.attrs["then_branch"].value.parent is if_node
    verify(model)
    text = format_model(model)
    assert "graph then_g" in text and "graph else_g" in text


def test_whole_graph_walks_find_subgraphs_however_a_node_got_them():
    """The walks for nested graphs stop at a graph none of whose nodes holds one; a node gets
    noted as a holder when imported, linked or given a graph by set_attr, and forgotten when
    removed. A graph attribute written into the dict directly is a verify error."""
    model = load_onnx(_IF_MODEL)
    graph = model.graph
    if_node = graph.nodes()[1]
    assert [g.name for g in graph.all_graphs()] == ["branchy", "then_g", "else_g"]
    assert graph.count_nodes() == 4
    then_graph = if_node.attrs["then_branch"].value

    flat = load_onnx(CHAIN)
    main = flat.graph
    assert list(main.all_graphs()) == [main] and main.count_nodes() == 3
    body = Graph("body")
    relu = main.nodes()[0]
    relu.set_attr("body", body)  # not an ONNX attribute: the IR still has to find the graph
    assert [g.name for g in main.all_graphs()] == [main.name, "body"] and body.parent is relu
    linked = Node("Identity", [main.inputs[0]], {"branch": Graph("late")})
    main.insert_after(relu, linked)
    assert "late" in [g.name for g in main.all_graphs()]
    main.remove(linked)
    assert "late" not in [g.name for g in main.all_graphs()]

    graph.remove(if_node, safe=False)
    assert list(graph.all_graphs()) == [graph] and then_graph not in graph.all_graphs()

    sneaky = load_onnx(CHAIN)
    first = sneaky.graph.nodes()[0]
    first.attrs["g"] = Attr("g", onnx.AttributeProto.GRAPH, Graph("hidden"))
    with pytest.raises(VerifyError, match="does not know of"):
        verify(sneaky)


def test_printer_is_one_line_per_node_with_types_and_attributes():
    model = load_onnx(_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    conv (float[1, 3, 8, 8] x, float[4, 3, 3, 3] w) => (float[1, 4, 8, 8] y) {
        y = Conv <pads = [1, 1, 1, 1], strides = [1, 1]> (x, w)
    }
    """))
    text = format_model(model)
    assert "%y<f32[1,4,8,8]> = Conv(%x, %w) {pads=[1,1,1,1], strides=[1,1]}" in text


def test_printer_reads_sparse_dims_as_the_importer_does():
    """-1 and "?" say "unknown" on a sparse value as on a dense one, and print as ?."""
    from graphopt.ir.printer import format_type

    sparse = helper.make_sparse_tensor_value_info("s", TensorProto.FLOAT, [-1, "?", "n", 4])
    value = Value("s")
    value.type_proto = sparse.type
    assert format_type(value) == "sparse<f32[?,?,n,4]>"


@pytest.mark.parametrize("elem_type", [
    onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8, onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.BOOL,
    onnx.TensorProto.STRING, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT8E4M3FN,
])
def test_dtypes_round_trip_through_initializers(elem_type):
    np_type = helper.tensor_dtype_to_np_dtype(elem_type)
    if elem_type == onnx.TensorProto.STRING:
        data = np.array(["a", "bc"], dtype=object)
    elif elem_type == onnx.TensorProto.BOOL:
        data = np.array([True, False])
    else:
        data = np.array([1, 2, 3, 4], dtype=np.float32).astype(np_type)
    tensor = onnx.numpy_helper.from_array(data, "w")
    out = helper.make_tensor_value_info("y", elem_type, list(data.shape))
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [], [out], [tensor])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                              ir_version=IR_VERSION)
    model = load_onnx(proto)
    value = model.graph.initializers["w"]
    assert value.dtype == DType(elem_type)
    back = to_onnx(model)
    assert back.graph.initializer[0] == tensor  # untouched data is exported byte for byte
    assert format_model(load_onnx(back)) == format_model(model)
    assert np.array_equal(Tensor.from_proto(back.graph.initializer[0]).numpy().astype(object),
                          data.astype(object))


def test_symbolic_dims_metadata_and_doc_strings_survive():
    proto = CHAIN
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    proto.doc_string = "model doc"
    proto.producer_name = "exporter"
    helper.set_model_props(proto, {"author": "me"})
    proto.graph.node[0].doc_string = "node doc"
    proto.graph.input[0].doc_string = "input doc"
    back = to_onnx(load_onnx(proto))
    assert back.doc_string == "model doc" and back.producer_name == "exporter"
    assert {p.key: p.value for p in back.metadata_props} == {"author": "me"}
    assert back.graph.node[0].doc_string == "node doc"
    assert back.graph.input[0].doc_string == "input doc"
    assert back.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def test_a_graph_output_that_is_a_weight_keeps_its_doc_string_and_metadata():
    proto = _model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y, float[2] w) <float[2] w = {1.0, 2.0}> { y = Add(x, w) }
    """)
    proto.graph.output[1].doc_string = "the bias"
    proto.graph.output[1].metadata_props.add(key="unit", value="logit")
    out = to_onnx(load_onnx(proto)).graph.output[1]
    assert out.name == "w" and out.doc_string == "the bias"
    assert {p.key: p.value for p in out.metadata_props} == {"unit": "logit"}


def test_node_and_value_metadata_survive_and_the_shared_default_is_read_only():
    """Nodes and values without metadata share one read-only empty mapping (no dict apiece);
    metadata read from the file is each one's own, and round-trips."""
    proto = onnx.ModelProto.FromString(CHAIN.SerializeToString())
    proto.graph.node[0].metadata_props.add(key="origin", value="conv1")
    info = proto.graph.value_info.add()
    info.CopyFrom(helper.make_tensor_value_info(proto.graph.node[0].output[0], 1, None))
    info.metadata_props.add(key="note", value="kept")
    model = load_onnx(proto)
    first, second = list(model.graph)[:2]
    assert dict(first.metadata_props) == {"origin": "conv1"}
    assert dict(first.outputs[0].metadata_props) == {"note": "kept"}
    assert second.metadata_props is Node("Relu").metadata_props is Value("v").metadata_props
    with pytest.raises(TypeError):
        second.metadata_props["x"] = "y"  # type: ignore[index]
    back = to_onnx(model)
    assert {p.key: p.value for p in back.graph.node[0].metadata_props} == {"origin": "conv1"}
    assert not back.graph.node[1].metadata_props
    noted = [vi for vi in back.graph.value_info if vi.name == info.name]
    assert {p.key: p.value for p in noted[0].metadata_props} == {"note": "kept"}


def test_functions_and_opsets_are_preserved():
    proto = _model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    main (float[2] x) => (float[2] y) { y = local.Double(x) }
    <domain: "local", opset_import: ["" : 17]>
    Double (a) => (b) { b = Add(a, a) }
    """)
    model = load_onnx(proto)
    assert model.opset_imports == {"": 17, "local": 1}
    back = to_onnx(model)
    assert [f.name for f in back.functions] == ["Double"]
    onnx.checker.check_model(back)


def test_external_data_is_loaded(tmp_path):
    weights = np.arange(4096, dtype=np.float32).reshape(64, 64)
    init = onnx.numpy_helper.from_array(weights, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])], [init])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    path = tmp_path / "ext.onnx"
    onnx.save(proto, str(path), save_as_external_data=True, location="ext.bin",
              size_threshold=0)
    model = load_onnx(str(path))
    assert np.array_equal(model.graph.initializers["w"].const.numpy(), weights)
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(InputError, match="external data"):
        load_onnx(str(path))


def test_verifier_reports_broken_use_lists():
    model = load_onnx(CHAIN)
    relu = model.graph.nodes()[0]
    relu.output._uses.clear()  # simulate a pass that edited inputs behind the setters' back
    with pytest.raises(VerifyError, match="use list"):
        verify(model)


def test_verifier_reports_unproduced_graph_output():
    model = load_onnx(CHAIN)
    model.graph.outputs.append(Value("ghost", DType.FLOAT, (1,)))
    with pytest.raises(VerifyError, match="not produced"):
        verify(model)


def test_pre_ir4_weights_stay_fixed_when_export_moves_to_ir4():
    """IR 3 lists every weight as an input (runtimes treat them as fixed); once folding adds
    initializers the export is IR 4, where a listed initializer would become overridable, so
    the weights leave the input list."""
    import os

    import graphopt

    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        "light_squeezenet.onnx")
    assert onnx.load(path).ir_version == 3
    out = graphopt.optimize(path).to_onnx()
    assert out.ir_version == 4
    assert [i.name for i in out.graph.input] == ["data_0"]
    onnx.checker.check_model(out)


def _if_model(branch_nodes) -> onnx.ModelProto:
    from onnx import TensorProto

    vi = helper.make_tensor_value_info
    then = helper.make_graph(branch_nodes, "then", [], [vi("t_out", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["t_out2"])], "else", [],
                              [vi("t_out2", TensorProto.FLOAT, [2])])
    graph = helper.make_graph([
        helper.make_node("Relu", ["x"], ["t"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Add", ["y", "t"], ["out"]),
    ], "g", [vi("x", TensorProto.FLOAT, [2]), vi("c", TensorProto.BOOL, [])],
        [vi("out", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_a_segment_of_a_tensor_is_refused_at_import():
    # It failed deep inside a pass: "pass EliminateNoOps failed: ValueError: Currently not
    # supporting loading segments".
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    weight.segment.begin, weight.segment.end = 0, 2
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    with pytest.raises(InputError, match="initializer 'w' is a segment of a larger tensor"):
        load_onnx(model)


def test_a_subgraph_node_redefining_an_outer_value_is_refused():
    # SSA spans scopes: onnx.checker and onnxruntime refuse it; graphopt wrote it out invalid.
    bad = _if_model([helper.make_node("Neg", ["x"], ["t"]),
                     helper.make_node("Add", ["t", "x"], ["t_out"])])
    with pytest.raises(InputError, match=r"value 't' is defined twice: an unnamed node \(Neg\) of "
                                         r"subgraph 'then' redefines a value of an enclosing graph"):
        load_onnx(bad)
    good = _if_model([helper.make_node("Neg", ["x"], ["t2"]),
                      helper.make_node("Add", ["t2", "x"], ["t_out"])])
    onnx.checker.check_model(good, full_check=True)
    load_onnx(good)


@pytest.mark.parametrize("shadowed", ["x", "t"])  # a graph input, an outer node's output
def test_a_subgraph_weight_named_like_an_outer_value_is_refused(shadowed):
    # onnx.checker takes it; onnxruntime reads the outer value for a graph input's name and the
    # weight for a node output's, the ONNX reference evaluator the reverse of one of them.
    bad = _if_model([helper.make_node("Add", [shadowed, "x"], ["t_out"])])
    (then,) = [a.g for a in bad.graph.node[1].attribute if a.name == "then_branch"]
    then.initializer.append(onnx.numpy_helper.from_array(np.ones(2, np.float32), shadowed))
    onnx.checker.check_model(bad, full_check=True)
    with pytest.raises(InputError, match=f"initializer '{shadowed}' of subgraph 'then' has the "
                                         "name of a value of an enclosing graph"):
        load_onnx(bad)


def test_a_subgraph_weight_repeating_an_outer_weight_loads():
    # The same name and the same numbers: whichever a reader sees, it reads the same.
    proto = _if_model([helper.make_node("Add", ["w", "x"], ["t_out"])])
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(2, np.float32), "w"))
    (then,) = [a.g for a in proto.graph.node[1].attribute if a.name == "then_branch"]
    then.initializer.append(onnx.numpy_helper.from_array(np.ones(2, np.float32), "w"))
    load_onnx(proto)
    then.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.zeros(2, np.float32), "w"))
    with pytest.raises(InputError, match="initializer 'w' of subgraph 'then'"):
        load_onnx(proto)


@pytest.mark.parametrize("elem_type", [onnx.TensorProto.INT4, onnx.TensorProto.FLOAT4E2M1,
                                       onnx.TensorProto.FLOAT6E2M3, onnx.TensorProto.FLOAT6E3M2])
def test_sub_byte_tensors_load_as_onnx_helper_writes_them(elem_type):
    # int32_data packs 4-bit elements two to an entry, but holds one float6 element per entry.
    tensor = helper.make_tensor("w", elem_type, [5], vals=[0.5, -1.0, 2.0, 0.0, 3.0])
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", elem_type, [5])], [tensor])
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)],
                                        ir_version=IR_VERSION))
    data = model.graph.initializers["w"].constant()
    assert data.astype(np.float32).tolist() == \
        onnx.numpy_helper.to_array(tensor).astype(np.float32).tolist()


def test_strings_that_are_not_utf8_compile_and_keep_their_bytes():
    # onnx.proto asks for UTF-8, onnxruntime takes any bytes; numpy_helper cannot decode them.
    import graphopt

    odd = [b"\xff\xfe", b"c"]
    weights = [helper.make_tensor(name, onnx.TensorProto.STRING, [2], odd) for name in "ab"]
    nodes = [helper.make_node("Concat", ["a", "b"], ["ab"], axis=0),
             helper.make_node("Equal", ["ab", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.STRING, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.BOOL, [4])], weights)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                              ir_version=IR_VERSION)
    feeds = {"x": np.array(["c", "c", "x", "c"], dtype=object)}
    expected = numerics.run(proto, feeds)
    for level in (1, 2, 3):
        result = graphopt.optimize(proto, level=level)
        optimized = result.to_onnx()
        assert numerics.compare(expected, numerics.run(optimized, feeds), 0, 0) == []
        kept = {bytes(s) for t in optimized.graph.initializer for s in t.string_data}
        assert kept == set(odd), kept
    # -O2 merged the twin initializers, and left the Concat whose result Python cannot read.
    assert len(optimized.graph.initializer) == 1
    assert any("a string result is not UTF-8" in note for note in result.notes), result.notes


def test_a_node_name_used_twice_is_made_unique():
    # onnx.checker allows it; onnxruntime too for Constants, which it folds before it checks
    # (silero-vad's fifteen Constants named 'F0::anon'). A later holder gets a name of its own,
    # past any name the file already uses.
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Constant", [], ["c1"], name="anon", value_float=1.0),
         helper.make_node("Constant", [], ["c2"], name="anon", value_float=2.0),
         helper.make_node("Add", ["x", "c1"], ["a"], name="anon_1"),
         helper.make_node("Add", ["a", "c2"], ["y"], name="anon")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    model = load_onnx(proto)
    assert [n.name for n in model.graph] == ["anon", "anon_2", "anon_1", "anon_3"]
    exported = to_onnx(model)
    onnx.checker.check_model(exported)
    x = np.arange(2, dtype=np.float32)
    np.testing.assert_array_equal(numerics.run(exported, {"x": x})["y"], x + 3)


def test_a_long_attribute_list_is_encoded_once_and_again_when_it_changes():
    # A tree ensemble holds a value per node in each attribute; a compile exports the model
    # about nine times, and each export encoded every value again.
    values = [float(i) / 7 for i in range(5000)]
    modes = ["BRANCH_LEQ"] * 4999 + ["LEAF"]
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    (ir_node,) = model.graph
    ir_node.set_attr("values", values)
    ir_node.set_attr("modes", modes)
    ir_node.set_attr("ids", list(range(5000)))

    def exported():
        (proto,) = to_onnx(model).graph.node
        return {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}

    first = exported()
    assert first["values"] == [float(np.float32(v)) for v in values]
    assert first["modes"] == [m.encode() for m in modes] and first["ids"] == list(range(5000))
    assert exported() == first
    # The list as it is now, whether replaced or changed in place.
    ir_node.attrs["values"].value[3] = -1.0
    ir_node.set_attr("ids", list(range(1, 5001)))
    again = exported()
    assert again["values"][3] == -1.0 and again["ids"] == list(range(1, 5001))


def test_shape_inference_exports_leave_tree_tables_out():
    # InferShapes exports the model three times; ONNX's inference reads no split or leaf of a
    # tree ensemble, whose lists in a catboost model of 1,000 trees hold 255,000 values each.
    from graphopt.ir.onnx_export import without_tree_tables

    n = 2047
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=1, nodes_treeids=[0] * n, nodes_nodeids=list(range(n)),
                            nodes_values=[0.5] * n, classlabels_int64s=list(range(1100)))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                         None)])
    model = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                              helper.make_opsetid("ai.onnx.ml",
                                                                                  3)]))
    with without_tree_tables():
        (inferred,) = to_onnx(model).graph.node
    assert sorted(a.name for a in inferred.attribute) == ["classlabels_int64s", "n_targets"]
    (written,) = to_onnx(model).graph.node  # every other export keeps them all
    assert len(written.attribute) == 5
