"""SinkTransposes: Transposes moved below elementwise ops meet their inverse, exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics, zoo
from graphopt.ir import load_onnx, to_onnx, verify
from graphopt.passes import PASSES, Options, PassContext
from graphopt.passes.infer_shapes import infer_shapes

RNG = np.random.default_rng(0)


def ops(proto) -> list[str]:
    return [n.op_type for n in proto.graph.node]

# tf2onnx's form of Conv → BatchNorm → Relu → Conv: NHWC between the convs.
NHWC_BLOCK = """
g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) {
  c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
  t1 = Transpose <perm = [0, 2, 3, 1]> (c1)
  a = Add(t1, bias)
  s = Sub(a, mean)
  m = Mul(s, scale)
  r = Relu(m)
  t2 = Transpose <perm = [0, 3, 1, 2]> (r)
  y = Conv <pads = [1, 1, 1, 1]> (t2, w2)
}"""


def _block():
    return parse_model(NHWC_BLOCK, w1=RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
                       w2=RNG.standard_normal((4, 4, 3, 3)).astype(np.float32),
                       bias=RNG.standard_normal(4).astype(np.float32),
                       mean=RNG.standard_normal(4).astype(np.float32),
                       scale=RNG.standard_normal((1, 1, 4)).astype(np.float32))


def _sunk(proto, tolerance=0.0):
    """The model after SinkTransposes alone, checked to compute what it did: exactly, or
    within `tolerance` where a reduction now sums in another order."""
    model = load_onnx(proto)
    infer_shapes(model)
    ctx = PassContext(Options())
    stats = dict(PASSES["SinkTransposes"]().run(model, ctx).stats)
    verify(model)
    out = to_onnx(model)
    onnx.checker.check_model(out)
    feeds = numerics.random_feeds(proto, seed=0, dims={"N": 2})
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds),
                                tolerance, tolerance)
    return out, stats


def test_a_transpose_sinks_to_its_inverse_through_the_nhwc_arithmetic():
    out, stats = _sunk(_block())
    assert stats == {"Transpose": 4, "inverse bypassed": 1}  # past Add, Sub, Mul and Relu
    assert ops(out) == ["Conv", "Add", "Sub", "Mul", "Relu", "Conv"]
    # The constants now broadcast over NCHW: [C] → [C, 1, 1]; [1, 1, C] → [1, C, 1, 1].
    shapes = {t.name: list(t.dims) for t in out.graph.initializer}
    assert sorted(shapes[n.input[1]] for n in out.graph.node if n.op_type in ("Add", "Mul")) \
        == [[1, 4, 1, 1], [1, 4, 1, 1]]


def test_the_compile_folds_the_block_into_its_convs():
    proto = _block()
    result = graphopt.optimize(proto, level=2)
    assert ops(result.to_onnx()) == ["Conv", "Relu", "Conv"]
    feeds = numerics.random_feeds(proto, seed=1, dims={"N": 2})
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(result.to_onnx(), feeds),
                                1e-5, 1e-5)


def test_clip_bounds_stay_as_they_are():
    # A [1] bound brought to [1, 1, 1, 1] made onnxruntime refuse the Clip ("min should be a
    # scalar").
    out, stats = _sunk(parse_model("""
    g (float[2, 4, 5, 6] x) => (float[2, 4, 5, 6] y) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      c = Clip(t, low, high)
      y = Transpose <perm = [0, 3, 1, 2]> (c)
    }""", low=np.array([-0.5], np.float32), high=np.array([0.7], np.float32)))
    assert stats == {"Transpose": 1, "inverse bypassed": 1} and ops(out) == ["Clip"]
    clip = next(n for n in out.graph.node if n.op_type == "Clip")
    assert list(clip.input[1:]) == ["low", "high"]


def test_a_residual_add_of_two_transposed_branches_moves_them_as_one():
    # ... and an activation two convs read, in NHWC between them, loses both pairs.
    proto = parse_model("""
    g (float[2, 4, 5, 6] a, float[2, 4, 5, 6] b) => (float[2, 4, 5, 6] y, float[2, 4, 5, 6] z) {
      ta = Transpose <perm = [0, 2, 3, 1]> (a)
      tb = Transpose <perm = [0, 2, 3, 1]> (b)
      s = Add(ta, tb)
      r = Relu(s)
      u = Transpose <perm = [0, 3, 1, 2]> (r)
      v = Transpose <perm = [0, 3, 1, 2]> (r)
      y = Sigmoid(u)
      z = Tanh(v)
    }""")
    out, stats = _sunk(proto)
    assert stats == {"Transpose": 2, "inverse bypassed": 2}
    assert ops(out) == ["Add", "Relu", "Sigmoid", "Tanh"]


def test_a_conv_and_a_residual_add_reading_one_nhwc_activation():
    # MobileNet-style blocks exported from TFLite: the NHWC activation goes to the next conv
    # through the inverse Transpose and to the residual Add as it is. The conv's pair goes,
    # and then the Add's two Transposes move below it as one.
    rng = np.random.default_rng(0)
    out, stats = _sunk(parse_model("""
    g (float[1, 8, 8, 4] x) => (float[1, 8, 8, 4] y) {
      xc = Transpose <perm = [0, 3, 1, 2]> (x)
      c1 = Conv <pads = [1, 1, 1, 1]> (xc, w1)
      r1 = Relu(c1)
      a = Transpose <perm = [0, 2, 3, 1]> (r1)
      ac = Transpose <perm = [0, 3, 1, 2]> (a)
      c2 = Conv(ac, w2)
      c2h = Transpose <perm = [0, 2, 3, 1]> (c2)
      y = Add(a, c2h)
    }""", w1=rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
        w2=rng.standard_normal((4, 4, 1, 1)).astype(np.float32)))
    assert ops(out) == ["Transpose", "Conv", "Relu", "Conv", "Add", "Transpose"], ops(out)
    assert stats == {"inverse bypassed": 1, "Transpose": 1}


def test_a_transpose_that_would_not_meet_its_inverse_stays():
    # An attention's Q, transposed to heads and scaled: moving gains nothing there. Nor its
    # Kᵀ, split by (0,2,3,1) from a projection: no conv's output, though channels-last by
    # perm; moved past the scale, transformers 5's TorchScript BERT fused no attention.
    for perm, shape in (([0, 2, 1, 3], [2, 4, 5, 8]), ([0, 2, 3, 1], [2, 4, 8, 5])):
        out, stats = _sunk(parse_model(f"""
        g (float[2, 5, 4, 8] q) => (float{shape} y) {{
          t = Transpose <perm = {perm}> (q)
          y = Mul(t, scale)
        }}""", scale=np.array(0.35, np.float32)))
        assert stats == {} and ops(out) == ["Transpose", "Mul"], perm
    # Out of a conv to NHWC, past a per-channel constant and an activation it moves (those
    # then fold and fuse into the conv), but not past a constant over the other axes (a
    # position embedding, which a LayerNorm after it may fuse with).
    out, stats = _sunk(parse_model("""
    g (float[1, 3, 6] x) => (float[1, 6, 4] y) {
      c = Conv (x, w)
      t = Transpose <perm = [0, 2, 1]> (c)
      b = Add(t, bias)
      r = Relu(b)
      y = Add(r, position)
    }""", w=RNG.standard_normal((4, 3, 1)).astype(np.float32),
        bias=RNG.standard_normal(4).astype(np.float32),
        position=RNG.standard_normal((1, 6, 4)).astype(np.float32)))
    assert stats == {"Transpose": 2} and ops(out) == ["Conv", "Add", "Relu", "Transpose", "Add"]


def test_what_must_stay_in_place_stays():
    # A second reader needs the transposed tensor; an input in the other layout pins the op;
    # two perms cannot become one.
    for text in ("""
    g (float[2, 4, 5, 6] x) => (float[2, 5, 6, 4] y, float[2, 5, 6, 4] z) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      y = Relu(t)
      z = Sigmoid(t)
    }""", """
    g (float[2, 4, 5, 6] x, float[2, 5, 6, 4] b) => (float[2, 5, 6, 4] y) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      y = Add(t, b)
    }""", """
    g (float[2, 4, 4, 4] a, float[2, 4, 4, 4] b) => (float[2, 4, 4, 4] y) {
      ta = Transpose <perm = [0, 2, 3, 1]> (a)
      tb = Transpose <perm = [0, 3, 1, 2]> (b)
      y = Add(ta, tb)
    }"""):
        out, stats = _sunk(parse_model(text))
        assert stats == {}, text


def test_a_tensorflow_style_resnet_compiles_to_convs_without_their_transposes():
    # The zoo's ResNet as tf2onnx exports it: 2 Transposes around each conv and the max pool.
    proto = zoo.build("resnet50", blocks=(1, 1, 1, 1), width=0.125, image_size=64, nhwc=True)
    before = ops(proto).count("Transpose")
    result = graphopt.optimize(proto, target="cpu")
    out = result.to_onnx()
    assert before == 2 * 17 + 2 and ops(out).count("Transpose") == 1  # 17 convs; the input's
    assert "Sub" not in ops(out) and "Mul" not in ops(out)
    feeds = numerics.random_feeds(proto, seed=0, dims={"batch_size": 2})
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds, "all"),
                                1e-4, 1e-4)


def test_a_pad_moves_with_its_amounts_permuted():
    # BlazeFace pads the channels of its skip path in NHWC; before opset 11 the amounts are
    # an attribute.
    for text in ("""
    g (float[1, 3, 4, 5] x) => (float[1, 7, 4, 5] y) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      p = Pad(t, pads)
      y = Transpose <perm = [0, 3, 1, 2]> (p)
    }""", """
    g (float[1, 3, 4, 5] x) => (float[1, 7, 5, 5] y) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      p = Pad <pads = [0, 1, 0, 0, 0, 0, 0, 4]> (t)
      y = Transpose <perm = [0, 3, 1, 2]> (p)
    }"""):
        if "Pad(t, pads)" in text:
            proto = parse_model(text, pads=np.array([0, 0, 0, 0, 0, 0, 0, 4], np.int64))
        else:
            proto = parse_model(text, header='<ir_version: 7, opset_import: ["" : 10]>\n')
        out, stats = _sunk(proto)
        assert ops(out) == ["Pad"] and stats["Transpose"] == 1, text


def test_a_transpose_two_ops_read_is_copied_for_each_when_both_take_it_to_its_inverse():
    # An NHWC max pool's output that two residual Adds read (tf2onnx with its own transpose
    # optimizer off): each Add gets a copy, which moves below it and cancels.
    both = """
    g (float[1, 4, 6, 6] x, float[1, 4, 3, 3] a, float[1, 4, 3, 3] b)
        => (float[1, 4, 3, 3] y, float[1, 4, 3, 3] z) {
      p = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x)
      t = Transpose <perm = [0, 2, 3, 1]> (p)
      ta = Transpose <perm = [0, 2, 3, 1]> (a)
      tb = Transpose <perm = [0, 2, 3, 1]> (b)
      s1 = Add(t, ta)
      s2 = Add(t, tb)
      y = Transpose <perm = [0, 3, 1, 2]> (s1)
      z = Transpose <perm = [0, 3, 1, 2]> (s2)
    }"""
    out, stats = _sunk(parse_model(both))
    assert stats["Transpose copied for a reader"] == 1
    assert ops(out) == ["MaxPool", "Add", "Add"]
    # Where one reader keeps NHWC (a graph output), the other's copy would not cancel it.
    out, stats = _sunk(parse_model(both.replace("float[1, 4, 3, 3] z", "float[1, 3, 3, 4] s2")
                                   .replace("z = Transpose <perm = [0, 3, 1, 2]> (s2)", "")))
    assert "Transpose copied for a reader" not in stats
    assert ops(out).count("Transpose") == 4


def test_no_copy_is_made_for_readers_the_rewrite_gate_stops_short_of_the_inverse():
    # Each copy moved one op down and stopped before the op the gate held back: 3 Transposes
    # became 4.
    model = load_onnx(parse_model("""
    g (float[1, 4, 3, 3] x) => (float[1, 4, 3, 3] y, float[1, 4, 3, 3] z) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      r1 = Relu(t)
      q1 = Neg(r1)
      y = Transpose <perm = [0, 3, 1, 2]> (q1)
      r2 = Sigmoid(t)
      q2 = Neg(r2)
      z = Transpose <perm = [0, 3, 1, 2]> (q2)
    }"""))
    infer_shapes(model)
    gate = PassContext(Options(), gate=lambda pass_name, rule, node: node.op_type != "Neg")
    stats = dict(PASSES["SinkTransposes"]().run(model, gate).stats)
    assert stats == {} and [n.op_type for n in model.graph].count("Transpose") == 3


def test_a_reduction_over_the_transposed_axes_drops_the_transpose():
    # An NHWC global average pool reduces H and W of NHWC: reducing them in NCHW gives the
    # same [N, C]; so does reducing the channels (the same [N, H, W]). opset 18 takes the
    # axes as an input.
    for axes, keep, shape in (([1, 2], 0, "[1, 8]"), ([-1], 0, "[1, 5, 5]")):
        proto = parse_model(f"""
        g (float[1, 8, 5, 5] x) => (float{shape} y) {{
          r = Relu(x)
          t = Transpose <perm = [0, 2, 3, 1]> (r)
          y = ReduceMean <axes = {axes}, keepdims = {keep}> (t)
        }}""")
        out, stats = _sunk(proto, tolerance=1e-6)
        assert ops(out) == ["Relu", "ReduceMean"] and stats == {"Transpose": 1}, axes
    out, stats = _sunk(parse_model("""
    g (float[1, 8, 5, 5] x) => (float[1, 8] y) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      y = ReduceSum <keepdims = 0> (t, axes)
    }""", header='<ir_version: 8, opset_import: ["" : 18]>\n',
        axes=np.array([1, 2], np.int64)), tolerance=1e-5)
    assert ops(out) == ["ReduceSum"]
    given = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    assert list(given[out.graph.node[0].input[1]]) == [2, 3]


def test_a_reduction_keeping_its_axes_moves_the_transpose_only_to_its_inverse():
    text = """
    g (float[1, 8, 5, 5] x) => (float[1, 8, 1, 1] y) {
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      m = ReduceMax <axes = [1, 2]> (t)
      y = Transpose <perm = [0, 3, 1, 2]> (m)
    }"""
    out, _ = _sunk(parse_model(text))
    assert ops(out) == ["ReduceMax"]
    out, stats = _sunk(parse_model(text.replace("float[1, 8, 1, 1] y", "float[1, 1, 1, 8] m")
                                   .replace("y = Transpose <perm = [0, 3, 1, 2]> (m)", "")))
    assert stats == {} and ops(out) == ["Transpose", "ReduceMax"]


def test_a_concat_of_transposed_branches_joins_them_untransposed():
    out, stats = _sunk(parse_model("""
    g (float[1, 3, 4, 4] a, float[1, 5, 4, 4] b) => (float[1, 10, 4, 4] y) {
      ta = Transpose <perm = [0, 2, 3, 1]> (a)
      tb = Transpose <perm = [0, 2, 3, 1]> (b)
      c = Concat <axis = -1> (ta, tb, extra)
      y = Transpose <perm = [0, 3, 1, 2]> (c)
    }""", extra=RNG.standard_normal((1, 4, 4, 2)).astype(np.float32)))
    assert ops(out) == ["Concat"] and stats == {"Transpose": 1, "inverse bypassed": 1}
    concat = out.graph.node[0]
    assert concat.attribute[0].i == 1
    dims = {t.name: list(t.dims) for t in out.graph.initializer}
    assert dims[concat.input[2]] == [1, 2, 4, 4]


@pytest.mark.parametrize("branch", ["""
      r = Relu(t)
      o1 = Transpose <perm = [0, 3, 1, 2]> (r)""", """
      m = ReduceMean <axes = [1, 2]> (t)
      o1 = Transpose <perm = [0, 3, 1, 2]> (m)"""], ids=["elementwise", "reduction"])
def test_a_branch_reading_a_transpose_of_the_main_graph_leaves_it_there(branch):
    # The pass removed the moved Transpose from the branch's graph, where it is not
    # ("<Transpose> is not in graph 'then'"); it works within one graph.
    shape = "[1, 3, 1, 1]" if "Reduce" in branch else "[1, 3, 4, 5]"
    out, stats = _sunk(parse_model(f"""
    g (float[1, 3, 4, 5] x, float{shape} w, bool cond) => (float{shape} z) {{
      t = Transpose <perm = [0, 2, 3, 1]> (x)
      z = If (cond) <then_branch = then () => (float{shape} o1) {{{branch}
      }}, else_branch = else () => (float{shape} o2) {{
      o2 = Identity(w)
      }}>
    }}"""))
    assert ops(out) == ["Transpose", "If"]


BORROWED_LATER = """
g (float[1, 4, 5, 5] x, float[1, 5, 5, 4] u) => (float[1, 4, 5, 5] y) {
  v = Relu(u)
  c = Conv(x, w)
  t = Transpose <perm = [0, 2, 3, 1]> (c)
  a = Add(t, v)
  ta = Transpose <perm = [0, 3, 1, 2]> (a)
  tv = Transpose <perm = [0, 3, 1, 2]> (v)
  c2 = Conv(tv, w)
  y = Add(ta, c2)
}"""


def test_a_borrowed_nchw_copy_computed_after_the_add_keeps_the_graph_in_order():
    # The residual Add came before the conv branch that brings its skip input to NCHW: the
    # Add was left reading a value computed after it.
    w = np.random.default_rng(1).standard_normal((4, 4, 1, 1)).astype(np.float32)
    out, stats = _sunk(parse_model(BORROWED_LATER, w=w))
    assert stats["inverse borrowed"] == 1 and ops(out).count("Transpose") == 1  # u to NCHW


def test_an_op_the_rewrite_gate_holds_back_ends_the_pass():
    # Borrowed, not moved (the gate), bypassed, borrowed again: it never ended.
    import signal

    w = np.random.default_rng(1).standard_normal((4, 4, 1, 1)).astype(np.float32)
    model = load_onnx(parse_model(BORROWED_LATER, w=w))
    infer_shapes(model)

    def gate(pass_name, rule, node):
        return not (node.op_type == "Add" and node.output.name == "a")

    def stuck(*args):
        raise TimeoutError("SinkTransposes did not end")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(20)
    try:
        PASSES["SinkTransposes"]().run(model, PassContext(Options(), gate=gate))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    verify(model)
    assert "Add" in [n.op_type for n in model.graph]


@pytest.mark.parametrize("axes", [[-1], [3], [-2, -1]])
@pytest.mark.parametrize("level, shaped", [(2, True), (0, True), (1, True), (2, False)])
def test_a_pad_naming_its_axes_gets_amounts_for_every_axis_and_moves(tmp_path, axes, level,
                                                                      shaped):
    # Opset 18's Pad with an `axes` input stayed between its Transposes, and onnxruntime's
    # transpose optimizer, misreading its axes, made the .om fail in a Gather at run time
    # (the original failed so at ORT_ENABLE_ALL too): at -O2 SinkTransposes writes the amounts
    # out, and the .om's compile does at every level, also where no shape says the rank.
    pads = [1, 2] if len(axes) == 1 else [1, 0, 2, 1]
    proto = parse_model("""
        g (float[1,3,4,5] x) => (y) {
            t = Transpose <perm = [0, 2, 3, 1]> (x)
            p = Pad (t, pads, value, axes)
            y = Transpose <perm = [0, 3, 1, 2]> (p)
        }""", header='<ir_version: 8, opset_import: ["" : 18]>\n',
        pads=np.array(pads, np.int64), value=np.float32(0.5), axes=np.array(axes, np.int64))
    if not shaped:
        proto.graph.input[0].type.tensor_type.ClearField("shape")
    result = graphopt.optimize(proto, level=level, target="cpu")
    if level == 2 and shaped:
        assert [n.op_type for n in result.model.graph] == ["Pad"]
    path = tmp_path / "m.om"
    graphopt.save(result, path)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 4, 5)).astype(np.float32)}
    with graphopt.load(path) as session:
        np.testing.assert_array_equal(session.run(feeds)["y"], numerics.run(proto, feeds)["y"])


# A batch-first nn.MultiheadAttention's projections: swapped to sequence-first, projected by
# constant matrices, and swapped back where the fused attention wants them batch-first.
PROJECTED_ROWS = """
g (float[2, 5, 8] x) => (float[2, 5, 6] y) {
  t = Transpose <perm = [1, 0, 2]> (x)
  m = MatMul(t, w)
  a = Add(b, m)
  y = Transpose <perm = [1, 0, 2]> (a)
}"""


def test_a_row_transpose_sinks_through_a_projection_and_its_bias_to_its_inverse():
    proto = parse_model(PROJECTED_ROWS, w=RNG.standard_normal((8, 6)).astype(np.float32),
                        b=RNG.standard_normal(6).astype(np.float32))
    out, stats = _sunk(proto)
    assert ops(out) == ["MatMul", "Add"]
    assert stats["Transpose"] == 2
    # The bias keeps its shape [6]: onnxruntime fuses MatMul + Add into a Gemm only then.
    assert {t.name: list(t.dims) for t in out.graph.initializer}["b"] == [6]


def test_a_transpose_that_moves_the_last_axis_stays_above_a_matmul():
    text = PROJECTED_ROWS.replace("[1, 0, 2]", "[0, 2, 1]").replace("float[2, 5, 8] x",
                                                                   "float[2, 8, 5] x")
    text = text.replace("float[2, 5, 6] y", "float[2, 6, 5] y")
    proto = parse_model(text, w=RNG.standard_normal((8, 6)).astype(np.float32),
                        b=RNG.standard_normal(6).astype(np.float32))
    out, stats = _sunk(proto)
    assert ops(out) == ["Transpose", "MatMul", "Add", "Transpose"] and stats == {}


def test_a_packed_projections_slices_each_take_the_transpose_to_its_inverse():
    # The packed key-value projection of a decoder's cross-attention: two Slices of its
    # columns, each swapped back batch-first.
    proto = parse_model("""
g (float[2, 5, 8] x) => (float[2, 5, 4] k, float[2, 5, 4] v) {
  t = Transpose <perm = [1, 0, 2]> (x)
  m = MatMul(t, w)
  a = Add(m, b)
  ks = Slice(a, zero, four, last)
  vs = Slice(a, four, eight, last)
  k = Transpose <perm = [1, 0, 2]> (ks)
  v = Transpose <perm = [1, 0, 2]> (vs)
}""", w=RNG.standard_normal((8, 8)).astype(np.float32), b=RNG.standard_normal(8).astype(np.float32),
        zero=np.array([0], np.int64), four=np.array([4], np.int64),
        eight=np.array([8], np.int64), last=np.array([-1], np.int64))
    out, _ = _sunk(proto)
    assert ops(out) == ["MatMul", "Add", "Slice", "Slice"]
    # Their axes follow the data: the last axis, 2, in either layout.
    axes = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in out.graph.initializer}
    assert [axes[n.input[3]] for n in out.graph.node if n.op_type == "Slice"] == [[2], [2]]


def test_a_swish_between_nhwc_transposes_lets_them_meet():
    # tf2onnx's x · Sigmoid(x) in NHWC: the Transpose has two readers, and the Mul gets its
    # second transposed input only once the Sigmoid's Transpose has moved.
    proto = parse_model("""
g (float[N, 4, 8, 8] x) => (float[N, 8, 8, 8] y) {
  c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
  t1 = Transpose <perm = [0, 2, 3, 1]> (c1)
  s = Sigmoid(t1)
  m = Mul(t1, s)
  t2 = Transpose <perm = [0, 3, 1, 2]> (m)
  y = Conv(t2, w2)
}""", w1=RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
        w2=RNG.standard_normal((8, 8, 1, 1)).astype(np.float32))
    out, _ = _sunk(proto)
    assert ops(out) == ["Conv", "Sigmoid", "Mul", "Conv"]


# torchvision's and timm's ConvNeXt block: the MLP in NHWC, back to NCHW, then its LayerScale.
CONVNEXT_TAIL = """
g (float[N, 6, 5, 5] x) => (float[N, 4, 5, 5] y) {
  t = Transpose <perm = [0, 2, 3, 1]> (x)
  m = MatMul(t, w)
  a = Add(m, b)
  back = Transpose <perm = [0, 3, 1, 2]> (a)
  s = Mul(gamma, back)
  y = Add(s, skip)
}"""


def _convnext_tail(gamma_shape=(4, 1, 1)):
    return parse_model(CONVNEXT_TAIL, w=RNG.standard_normal((6, 4)).astype(np.float32),
                       b=RNG.standard_normal(4).astype(np.float32),
                       gamma=RNG.uniform(0.05, 0.15, gamma_shape).astype(np.float32),
                       skip=RNG.standard_normal((1, 4, 5, 5)).astype(np.float32))


def test_a_layer_scale_after_the_transpose_back_moves_above_it_and_folds():
    out, stats = _sunk(_convnext_tail())
    assert stats == {"Transpose": 1}
    assert ops(out) == ["Transpose", "MatMul", "Add", "Mul", "Transpose", "Add"]
    # Above the Transpose the scale varies along the last axis, the MatMul's columns.
    mul = next(n for n in out.graph.node if n.op_type == "Mul")
    shapes = {t.name: list(t.dims) for t in out.graph.initializer}
    assert [shapes[name] for name in mul.input if name in shapes] == [[1, 1, 1, 4]]
    proto = _convnext_tail()
    result = graphopt.optimize(proto, level=2).to_onnx()
    assert "Mul" not in ops(result)
    feeds = numerics.random_feeds(proto, seed=1, dims={"N": 2})
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(result, feeds),
                                1e-5, 1e-5)


@pytest.mark.parametrize("gamma_shape", [(1, 5, 1), (4, 5, 5), (1,)])
def test_a_scale_not_along_the_channels_alone_stays_below_the_transpose(gamma_shape):
    out, stats = _sunk(_convnext_tail(gamma_shape))
    assert stats == {} and ops(out)[3:5] == ["Transpose", "Mul"]


def test_a_channel_scale_after_a_transpose_of_no_linear_layer_stays():
    text = """
    g (float[N, 5, 5, 6] x) => (float[N, 6, 5, 5] y) {
      r = Relu(x)
      back = Transpose <perm = [0, 3, 1, 2]> (r)
      y = Mul(gamma, back)
    }"""
    proto = parse_model(text, gamma=RNG.uniform(0.05, 0.15, (6, 1, 1)).astype(np.float32))
    out, stats = _sunk(proto)
    assert stats == {}
