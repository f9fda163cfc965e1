"""The rewrite gate: single rewrites held back by (pass, rule, anchor node), the rest unchanged."""

from __future__ import annotations

import numpy as np
import onnx

from graphopt.compiler import optimize
from graphopt.ir import to_onnx
from graphopt.numerics import random_feeds, run
from graphopt.passes.base import anchor_key
from tests.helpers import parse_model

TWO_CONV_BN = """
agraph (float[1,3,8,8] x) => (float[1,4,8,8] y) {
    c1 = Conv <pads=[1,1,1,1], kernel_shape=[3,3]> (x, w1)
    b1 = BatchNormalization (c1, s, bias, mean, var)
    r1 = Relu (b1)
    c2 = Conv <kernel_shape=[1,1]> (r1, w2)
    y = BatchNormalization (c2, s, bias, mean, var)
}
"""


def _model():
    rng = np.random.default_rng(0)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    return parse_model(TWO_CONV_BN, w1=f(4, 3, 3, 3), w2=f(4, 4, 1, 1), s=f(4), bias=f(4),
                       mean=f(4), var=np.abs(f(4)) + 0.5)


def test_gate_sees_every_rewrite_and_holds_back_only_the_one_denied():
    seen = []

    def record(pass_name, rule, node):
        seen.append((pass_name, rule, anchor_key(node)))
        return True

    optimize(_model(), rewrite_gate=record)
    folds = [s for s in seen if s[1] == "ConvBatchNorm"]
    assert len(folds) == 2 and all(s[0] == "FuseConvBatchNorm" for s in folds)
    assert folds[0][2] == "%b1"  # unnamed nodes go by their first output
    held = folds[0][2]

    result = optimize(_model(), rewrite_gate=lambda p, rule, node: anchor_key(node) != held)
    assert [n.op_type for n in result.model.graph].count("BatchNormalization") == 1
    assert sum(r.stats.get("ConvBatchNorm", 0) for r in result.log.records) == 1
    proto = to_onnx(result.model)
    onnx.checker.check_model(proto)
    feeds = random_feeds(_model(), seed=1)
    expected, actual = run(_model(), feeds), run(proto, feeds)
    np.testing.assert_allclose(actual["y"], expected["y"], rtol=1e-4, atol=1e-5)


def test_elementwise_group_size_and_gate_reach_fuse_elementwise():
    model = parse_model("""
agraph (float[4] x) => (float[4] y) {
    a = Relu (x)
    b = Sigmoid (a)
    c = Neg (b)
    y = Abs (c)
}
""")
    whole = optimize(model, level=3)
    assert [n.op_type for n in whole.model.graph] == ["elementwise_0"]
    pairs = optimize(model, level=3, pass_options={"elementwise_max_group": 2})
    assert len(list(pairs.model.graph)) == 2
    none = optimize(model, level=3, rewrite_gate=lambda p, rule, n: p != "FuseElementwise")
    assert [n.op_type for n in none.model.graph] == ["Relu", "Sigmoid", "Neg", "Abs"]


def test_anchor_keys_of_named_and_unnamed_nodes_keep_apart():
    from graphopt.ir import Graph, Node, Value

    graph = Graph()
    unnamed = graph.append(Node("Relu", inputs=[Value("x")], outputs=[Value("y")]))
    named = graph.append(Node("Relu", inputs=[Value("x")], outputs=[Value("z")], name="%y"))
    odd = graph.append(Node("Relu", inputs=[Value("x")], outputs=[Value("w")], name="\\%y"))
    plain = graph.append(Node("Relu", inputs=[Value("x")], outputs=[Value("v")], name="conv1"))
    keys = [anchor_key(n) for n in (unnamed, named, odd, plain)]
    assert keys == ["%y", "\\%y", "\\\\%y", "conv1"]
