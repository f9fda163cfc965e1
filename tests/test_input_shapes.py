"""--input-shape: a pinned symbolic dim propagates to every input, intermediate and output that
shares it, and unlocks shape folding."""

from __future__ import annotations

import numpy as np
import onnx.parser
import pytest
from helpers import parse_model
from onnx import numpy_helper

import graphopt
from graphopt import numerics
from graphopt.errors import GraphoptError

MODEL = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, seq, 8] x, float[batch, seq] mask) => (float[batch, seq8] y) {
    m = Unsqueeze(mask, axes)
    h = Mul(x, m)
    s = Shape(x)  # x's dims, not the Reshape's own h: open, they stay read at run time
    b = Gather <axis = 0> (s, zero)
    b1 = Unsqueeze(b, axes0)
    shape = Concat <axis = 0> (b1, minus_one)
    y = Reshape(h, shape)
}
""")
AXES = {"axes": [2], "zero": 0, "axes0": [0], "minus_one": [-1]}


def _model() -> onnx.ModelProto:
    proto = onnx.ModelProto.FromString(MODEL.SerializeToString())
    for name, data in AXES.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(data, np.int64), name))
    return proto


def test_pinned_symbol_propagates_to_other_inputs_and_outputs():
    result = graphopt.optimize(_model(), input_shapes="x:2,5,8", verify=True)
    graph = result.model.graph
    assert [v.shape for v in graph.inputs] == [(2, 5, 8), (2, 5)]  # mask shares batch and seq
    assert graph.outputs[0].shape == (2, 40)


def test_an_exporters_expression_of_a_pinned_dim_is_evaluated():
    # YOLOv8's exports declare value_info dims as `floor(floor(width/2 - 1/2)/2) + 1`: pinning
    # width left them, and -O1's placement sent their readers to the host for "dynamic shape:
    # [floor(width/2)]", a dim the pin had fixed.
    from graphopt.dims import bound_dim

    assert bound_dim("floor(floor(width/2 - 1/2)/2) + 1", {"width": 320}) == 80
    assert bound_dim("floor(width/2)", {"width": 8}) == 4
    assert bound_dim("height*2", {"width": 8}) == "height*2"  # nothing of it pinned
    assert bound_dim("floor(width/height)", {"width": 8}) is None  # half known: unknown
    assert bound_dim("__import__('os')", {"os": 1}) is None
    assert bound_dim("width*1e400", {"width": 8}) is None  # inf: int() raised
    assert bound_dim("width*1e308*10 - width*1e308*10", {"width": 8}) is None  # nan
    proto = parse_model("""
        g (float[batch, width] x) => (float[batch, width] y) {
            s = Shape(x)
            w = Gather <axis = 0> (s, one)
            wf = Cast <to = 1> (w)
            r = Range(zero, wf, two)
            rs = ReduceSum <keepdims = 1> (r)
            y = Add(x, rs)
        }""", one=np.array(1, np.int64), zero=np.float32(0), two=np.float32(2))
    proto.graph.value_info.append(onnx.helper.make_tensor_value_info(
        "r", onnx.TensorProto.FLOAT, ["floor(width/2)"]))
    result = graphopt.optimize(proto, level=1, input_shapes="x:1,8")
    (r,) = [v for v in result.model.graph.all_values() if v.name == "r"]
    assert r.shape == (4,)


def test_pins_unlock_shape_subgraph_folding():
    dynamic = graphopt.optimize(_model())
    pinned = graphopt.optimize(_model(), input_shapes={"x": [2, 5, 8]})
    dynamic_ops = [n.op_type for n in dynamic.model.graph]
    pinned_ops = [n.op_type for n in pinned.model.graph]
    assert "Shape" in dynamic_ops
    assert pinned_ops == ["Unsqueeze", "Mul", "Reshape"]
    reshape = pinned.model.graph.nodes()[-1]
    assert reshape.inputs[1].constant().tolist() == [2, -1]
    feeds = numerics.random_feeds(_model(), seed=3, shapes={"x": [2, 5, 8], "mask": [2, 5]})
    expected = numerics.run(_model(), feeds)
    assert not numerics.compare(expected, numerics.run(pinned.to_onnx(), feeds))


def test_a_pin_the_graph_cannot_take_is_refused_naming_the_node():
    # Only a batch of 1 or 2 broadcasts against b [2, 4]: a pin of 3 used to compile (shape
    # inference after a pin is best effort) into an artifact onnxruntime would not load.
    import pytest

    from graphopt.errors import InputError

    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) { y = Add(x, b) }""")
    proto.graph.node[0].name = "add"
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((2, 4), np.float32), "b"))
    with pytest.raises(InputError, match=r"^<model>: node 'add' \(Add\): shape inference refuses "
                                         r"it: .*Incompatible dimensions \(with the pinned shapes "
                                         r"x:3,4\)$"):
        graphopt.optimize(proto, input_shapes="x:3,4")
    # The profile pins N alone: x's dim 1 is the model's own 4, not an open -1.
    with pytest.raises(InputError, match=r"^shape profile profile1 \(N=3\): <model>: node 'add'"
                                         r".*\(with the pinned shapes x:3,4\)$"):
        graphopt.optimize(proto, dynamic_dims="N:2,3")
    assert graphopt.optimize(proto, input_shapes="x:2,4").model.graph.outputs[0].shape == (2, 4)


def _paddle_style_model() -> onnx.ModelProto:
    """A paddle2onnx export's input: -1 for the batch and "?" for every other unknown axis."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])
    graph = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)],
                              "g", [x], [y], [numpy_helper.from_array(np.array([2, 3]), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_question_mark_dims_are_unknown_not_one_shared_name(tmp_path, capsys):
    # "?" axes take different sizes (rapidocr's classifier runs 48 x 192), as onnxruntime
    # reads them; -1 is unknown too, in the .om's signature and in compare's reference.
    from helpers import run_cli

    source, om, feeds = tmp_path / "m.onnx", tmp_path / "m.om", tmp_path / "x.npz"
    onnx.save(_paddle_style_model(), source)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 6)).astype(np.float32)
    np.savez(feeds, x=x)
    graphopt.save(graphopt.optimize(str(source)), om)
    session = graphopt.load(om)
    assert session.inputs[0]["shape"] == [None, 3, None, None]
    np.testing.assert_allclose(session.run({"x": x})["y"], x.mean(axis=(2, 3)), rtol=1e-6)
    rc, out, err = run_cli(capsys, "compare", source, om, "--inputs", feeds)
    assert rc == 0 and "result: PASS" in out, err
    pinned = graphopt.optimize(str(source), input_shapes={"x": [2, 3, 4, 6]})
    assert [v.shape for v in pinned.model.graph.inputs] == [(2, 3, 4, 6)]


def _branchy_model() -> onnx.ModelProto:
    """An If whose then-branch takes x of 768 samples ([3, 256] rows, plus a [3, 4] bias) and
    whose else-branch takes 512 (a [512, 4] weight), as silero-vad's per-sample-rate branches
    do: onnxruntime loads it with x's length open, and runs each branch on its own length."""
    from onnx import TensorProto, helper

    def weight(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    then = helper.make_graph([
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["n"]),
        helper.make_node("Div", ["n", "k"], ["q"]),
        helper.make_node("Concat", ["q", "k"], ["rows"], axis=0),
        helper.make_node("Reshape", ["x", "rows"], ["r"]),
        helper.make_node("MatMul", ["r", "w256"], ["m"]),
        helper.make_node("Add", ["m", "bias"], ["yt"])], "then", [],
        [helper.make_tensor_value_info("yt", TensorProto.FLOAT, None)],
        [weight("one", [1]), weight("k", [256]), weight("w256", np.ones((256, 4), np.float32)),
         weight("bias", np.ones((3, 4), np.float32))])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w512"], ["ye"])], "else", [],
                              [helper.make_tensor_value_info("ye", TensorProto.FLOAT, None)],
                              [weight("w512", np.ones((512, 4), np.float32))])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("target", ["constant", "computed"])
def test_a_pin_a_fixed_reshape_cannot_take_is_refused_naming_the_node(target):
    # A classifier head reshaped to a fixed [1, 512]: inference and onnxruntime's load let a
    # batch of 3 through, and the first run failed. A target computed from constants (a
    # dynamo export's Concat) is seen once folding made it one.
    from graphopt.errors import InputError

    shape = ("shape = Concat <axis = 0> (one, width)" if target == "computed"
             else "shape = Identity (fixed)")
    proto = parse_model(f"""
        g (float[N, 512, 1, 1] x) => (float[1, 512] y) {{
            {shape}
            y = Reshape (x, shape)
        }}""", one=np.array([1], np.int64), width=np.array([512], np.int64),
        fixed=np.array([1, 512], np.int64))
    proto.graph.node[-1].name = "node_view"
    if target == "constant":  # the target an initializer from the start
        proto.graph.node[-1].input[1] = "fixed"
        del proto.graph.node[0]
    with pytest.raises(InputError, match=r"^<model>: node 'node_view' \(Reshape\) cannot make "
                                         r"its input of shape \[3,512,1,1\] \(1536 elements\) "
                                         r"into \[1,512\] with the pinned shapes x:3,512,1,1"):
        graphopt.optimize(proto, input_shapes="x:3,512,1,1")
    with pytest.raises(InputError, match=r"^shape profile profile1 \(N=3\): "):
        graphopt.optimize(proto, dynamic_dims="N:1,3")
    graphopt.optimize(proto, input_shapes="x:1,512,1,1", verify=True)  # the size it takes


def test_a_pin_that_leaves_onnxruntime_unable_to_load_the_compile_is_refused():
    # Pinned to 512 samples, the folded then-branch adds a [2, 4] product to its [3, 4] bias:
    # ONNX's inference, before the folding, cannot see it; onnxruntime refuses the compile.
    import pytest

    from graphopt.errors import InputError

    with pytest.raises(InputError, match=r"with the pinned shapes x:1,512, onnxruntime cannot "
                                         r"load the compiled model: .*Incompatible dimensions"):
        graphopt.optimize(_branchy_model(), input_shapes={"x": [1, 512]})
    graphopt.optimize(_branchy_model())  # open, it compiles


def test_a_refused_profile_pin_names_dynamic_dims_and_the_dims_the_model_fixes(tmp_path,
                                                                               capsys):
    # The pin came from --dynamic-dims alone: advice about --input-shape, which the user never
    # gave, misled; and x's fixed dim 0 was quoted as -1 (x:-1,512), as if left open.
    from graphopt.errors import InputError
    from helpers import run_cli

    source = tmp_path / "branchy.onnx"
    onnx.save(_branchy_model(), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "b.om",
                         "--dynamic-dims", "n:512")
    assert rc == 1 and "with the pinned shapes x:1,512, onnxruntime cannot load" in err, err
    assert err.rstrip().endswith("leave such an input's dims open (no --dynamic-dims key on "
                                 "its dims)"), err
    with pytest.raises(InputError, match=r"\(no dynamic_dims key on its dims, nor "
                                         r"input_shapes\)$"):
        graphopt.optimize(_branchy_model(), dynamic_dims="n:512", input_shapes="x:1,-1")
    with pytest.raises(InputError, match=r"\(no input_shapes for it\)$"):  # as it was
        graphopt.optimize(_branchy_model(), input_shapes="x:-1,512")


def test_pins_make_valid_a_model_whose_dynamic_form_shape_inference_refuses():
    # Resize's `sizes` of unknown length: ONNX shape inference cannot tell its axes.
    proto = parse_model("""
        g (float[N, C, H, W] x, int64[S] sizes) => (float[N, C, A, B] y) {
            y = Resize <mode = "nearest"> (x, , , sizes)
        }""")
    with pytest.raises(GraphoptError, match="shape inference refuses it"):
        graphopt.optimize(proto)
    pins = "x:1,1,2,4;sizes:4"
    result = graphopt.optimize(proto, input_shapes=pins)
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4),
             "sizes": np.array([1, 1, 1, 2], np.int64)}
    (y,) = numerics.run(result.to_onnx(), feeds).values()
    np.testing.assert_array_equal(y, [[[[0.0, 2.0]]]])


def test_a_pin_a_model_without_branches_cannot_take_names_the_sizes_it_fixes():
    # An export traced at batch 1 (a Reshape to [1, -1] before a MatMul): pinned to batch 2,
    # onnxruntime refuses the compile. The advice was about branches the inputs never take,
    # which this model has none of.
    from graphopt.errors import InputError

    proto = parse_model("""
        g (float[N, 4] x) => (float[1, 3] y) {
            shape = Concat <axis = 0> (one, rest)
            r = Reshape (x, shape)
            y = MatMul (r, w)
        }""", one=np.array([1], np.int64), rest=np.array([-1], np.int64),
        w=np.ones((4, 3), np.float32))
    with pytest.raises(InputError) as caught:
        graphopt.optimize(proto, input_shapes="x:2,4")
    message = str(caught.value)
    assert "with the pinned shapes x:2,4, onnxruntime cannot load the compiled model" in message
    assert "branch" not in message and "The model fixes a size these pins change" in message
    graphopt.optimize(proto, input_shapes="x:1,4", verify=True)  # the size it was traced at


def test_a_static_model_whose_reshape_cannot_take_its_input_is_refused_naming_the_node():
    # onnxruntime loads it and fails at every run: the compile wrote an artifact that never
    # ran, with exit 0 and no note.
    from graphopt.errors import InputError

    proto = parse_model("""
        g (float[1, 4] x) => (float[3, 5] y) { y = Reshape (x, shape) }""",
        shape=np.array([3, 5], np.int64))
    proto.graph.node[0].name = "rs"
    with pytest.raises(InputError, match=r"^<model>: node 'rs' \(Reshape\) cannot make its "
                                         r"input of shape \[1,4\] \(4 elements\) into \[3,5\], so "
                                         "the model cannot run"):
        graphopt.optimize(proto)


def test_a_minus_one_on_a_dim_the_model_fixes_is_noted():
    # ATC's -1 asks for a dynamic dim; on a batch-1 export the batch silently stayed 1.
    proto = parse_model("g (float[1,4] x, float[N,4] z) => (y, w) { y = Relu(x) w = Relu(z) }")
    notes = graphopt.optimize(proto, input_shapes="x:-1,4;z:-1,4").notes
    assert "input_shapes: -1 keeps a dynamic dim dynamic, and the model fixes x[0] = 1: " \
           "those stay as the model fixes them" in notes
    assert not any("x[1]" in note or "z[0]" in note for note in notes)  # pinned, or dynamic
    profiled = graphopt.optimize(proto, input_shapes="x:-1,4", dynamic_dims="z[0]:1,2")
    assert sum("-1 keeps a dynamic dim" in note for note in profiled.notes) == 1


def test_a_range_onnxruntime_refuses_once_pinned_is_named_as_such(tmp_path, capsys):
    # At -O0/-O1 the refusal read "the model fixes a size these pins change", false here: the
    # pins fit, and onnxruntime's inference refuses Range's [1]-shaped bound once it is static.
    from helpers import run_cli

    proto = parse_model("""
        g (float[N,3] x) => (r) {
            s = Shape(x)
            n = Gather(s, i)
            nf = Cast <to = 1> (n)
            r = Range(zero, nf, step)
        }""", header='<ir_version: 8, opset_import: ["" : 18]>\n', i=np.array([0], np.int64),
        zero=np.float32(0), step=np.float32(0.3))
    onnx.save(proto, tmp_path / "m.onnx")
    rc, _, err = run_cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx",
                         "-O1", "--input-shape", "x:5,3")
    assert rc == 1 and "refuses a Range whose bounds have shape [1] once the pins make them " \
        "static" in err and "fixes a size" not in err, err
    rc, _, err = run_cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "o.onnx",
                         "-O2", "--input-shape", "x:5,3")
    assert rc == 0, err


def test_trtexec_spellings_of_shapes_get_the_atc_spelling_back():
    # trtexec and onnxruntime's tools write 1x3x224x224 and part inputs by commas: "dims must
    # be integers" and "the model has no input 'ids:1,128,mask'" said nothing of either.
    from graphopt.errors import OptionError
    from graphopt.input_shapes import parse_input_shapes

    with pytest.raises(OptionError, match=r"dims must be integers, got '1x3x224x224' \(dims "
                                          r"are separated by commas: x:1,3,224,224\)"):
        parse_input_shapes("x:1x3x224x224")
    with pytest.raises(OptionError, match="inputs are separated by ';', as in "
                                          "'ids:1,128;mask:1,128;tok:1,128'"):
        parse_input_shapes("ids:1,128,mask:1,128,tok:1,128")
    # trtexec's --shapes itself: both at once.
    with pytest.raises(OptionError, match="as in 'a:2,8;b:2,4'"):
        parse_input_shapes("a:2x8,b:2x4")
    # A TensorFlow export's tensor name keeps its ':0'.
    assert parse_input_shapes("input:0:1,3,8,8") == {"input:0": [1, 3, 8, 8]}


def test_a_sequence_or_optional_input_is_not_pinned_and_says_so():
    # --input-shape on a sequence was taken and ignored (the .om still held [2,n] tensors,
    # whatever the pin gave, a wrong rank too), and --dynamic-dims called it of unknown rank.
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ConcatFromSequence", ["xs"], ["y"], axis=1)], "g",
        [helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, [2, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "m"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    with pytest.raises(GraphoptError, match="^input_shapes: input 'xs' is a sequence, not a "
                                            "tensor: only tensor inputs can be pinned$"):
        graphopt.optimize(model, input_shapes="xs:9,9,9")
    with pytest.raises(GraphoptError, match=r"has no dynamic input dim 'n' \(input 'xs' is a "
                                            r"sequence, whose tensors' dims no key can name\)"):
        graphopt.optimize(model, dynamic_dims="n:3,5")
