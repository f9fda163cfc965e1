"""ReadShapesUpstream: a dim picked from a value's Shape is read where it comes from, and the
outputs hold."""

from __future__ import annotations

import numpy as np
import pytest
from test_fold import assert_same_outputs, ops, parse, run_passes

from graphopt.ir import load_onnx
from graphopt.passes.cleanup import EliminateDeadNodes
from graphopt.passes.fold_constants import FoldConstants
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.shape_upstream import ReadShapesUpstream

UPSTREAM_CASES = {
    # name: (nodes from x [B,S,8] to t, the Gather's indices, where they land: (value, dims))
    "transpose": ("t = Transpose<perm = [0, 2, 1]>(x)", "{2, 0}", ("x", [1, 0])),
    "reshape 0": ("t = Reshape(x, split)", "{1}", ("x", [1])),
    "reshape -1": ("""b = Unsqueeze(g0, ax)
                      target = Concat<axis = 0>(b, m1, c2, c4)
                      t = Reshape(x, target)""", "{1}", ("x", [1])),
    "head split": ("""r = Reshape(x, split)
                      t = Transpose<perm = [0, 2, 1, 3]>(r)""", "{2}", ("x", [1])),
    "projection": ("""p = MatMul(x, w)
                      t = Add(p, bias)""", "{0, 1}", ("x", [0, 1])),
    "product of two batches": ("""xt = Transpose<perm = [0, 2, 1]>(x)
                                  t = MatMul(x, xt)""", "{1}", ("t", [1])),
    "merged dims": ("""flat = Concat<axis = 0>(m1, c2, c4)
                       t = Reshape(x, flat)""", "{0}", ("t", [0])),
    # A transformer layer's output, read for each layer's attention mask: through its
    # LayerNormalization, its residual Add, to the sequence the first layer read.
    "layer norm": ("t = LayerNormalization<axis = -1>(x, g8, b8)", "{1}", ("x", [1])),
    # Its Mean output has 1s from the axis on: not x's dims.
    "layer norm mean": ("z, t = LayerNormalization<axis = -1>(x, g8, b8)", "{1, 2}",
                        ("t", [1, 2])),
    "residual add": ("""r = Relu(x)
                        t = Add(r, x)""", "{0, 1}", ("x", [0, 1])),
    "broadcast add": ("""v = ReduceMean<axes = [1]>(x)
                         t = Add(v, x)""", "{1}", ("x", [1])),  # v's 1 is not the sequence
    "gather": ("t = Gather<axis = 1>(x, rows)", "{0, 3}", ("x", [0, 2])),
    # nn.MultiheadAttention's piece of its packed projection: the columns are cut, not the
    # batch or the sequence; a Slice of the sequence itself keeps the read.
    "slice of the columns": ("t = Slice(x, c2, c4, m1)", "{0, 1}", ("x", [0, 1])),
    "slice of the sequence": ("t = Slice(x, c2, c4, ax1)", "{1}", ("t", [1])),
}


@pytest.mark.parametrize("case", UPSTREAM_CASES)
def test_a_symbolic_dim_is_read_where_it_comes_from(case):
    # Gather(Shape(t), i) reads t's dims from the value they copy: once nothing else reads t,
    # the head split (or a projection) that computed it can go, as attention fusion needs.
    nodes, indices, (source, dims) = UPSTREAM_CASES[case]
    proto = parse(f"""
        g (float[B,S,8] x) => (int64[{len(dims)}] y)
        <int64[4] split = {{0, 0, 2, 4}}, int64[1] m1 = {{-1}}, int64[1] c2 = {{2}},
         int64[1] c4 = {{4}}, int64[1] ax = {{0}}, int64[1] ax1 = {{1}}, int64 i0 = {{0}},
         int64[{len(dims)}] at = {indices},
         float[8, 16] w = {{{", ".join(["0.5"] * 128)}}},
         float[16] bias = {{{", ".join(["1.0"] * 16)}}},
         float[8] g8 = {{{", ".join(["1.5"] * 8)}}}, float[8] b8 = {{{", ".join(["0.5"] * 8)}}},
         int64[2, 1] rows = {{1, 0}}>
        {{
          s0 = Shape(x)
          g0 = Gather(s0, i0)
          {nodes}
          s = Shape(t)
          y = Gather(s, at)
        }}""")
    model = load_onnx(proto)
    infer_shapes(model)
    stats = run_passes(model, ReadShapesUpstream(), FoldConstants(), EliminateDeadNodes())
    (shape,) = [n for n in model.graph if n.op_type == "Shape"]
    gather = shape.output.consumers()[0]
    assert (shape.input(0).name, gather.input(1).constant().tolist()) == (source, dims)
    assert bool(stats["Gather"]) == (source == "x")
    if source == "x":
        assert ops(model) == ["Shape", "Gather"]
    for batch, seq in [(1, 3), (3, 5)]:
        assert_same_outputs(proto, model, {"x": np.ones((batch, seq, 8), np.float32)})


def test_every_bert_layer_reads_one_attention_mask():
    # Each layer expanded the mask to Shape(its input)[1]: read back through the layers'
    # LayerNormalizations, residual Adds, projections and attention to the ids, the sequence
    # is one dim, and the layers' Shape → Gather → Concat → Expand become one.
    import graphopt
    from graphopt import numerics, zoo

    proto = zoo.build("bert_base", layers=3, hidden=64, heads=2, intermediate=128, vocab=100)
    out = graphopt.optimize(proto).to_onnx()
    masks = {n.input[5] for n in out.graph.node if n.op_type == "Attention"}
    assert len([n for n in out.graph.node if n.op_type == "Attention"]) == 3 and len(masks) == 1
    feeds = zoo.sample_inputs(proto, seed=0, dims={"batch_size": 2, "sequence_length": 7})
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-4, 1e-5)
