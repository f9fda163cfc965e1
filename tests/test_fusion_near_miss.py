"""Near misses: subgraphs that look like a fusible pattern but compute something else are left
as they are, and the outputs never change."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics

RNG = np.random.default_rng(21)


def _same_outputs(proto, feeds, fused_op: str | None = None):
    optimized = graphopt.optimize(proto).to_onnx()
    ops = [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in optimized.graph.node]
    expected, actual = numerics.run(proto, feeds), numerics.run(optimized, feeds)
    for name in expected:
        assert actual[name].shape == expected[name].shape, name
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-4, atol=1e-5)
    return ops


def _erf_gelu(x: str, y: str, half: np.ndarray) -> onnx.ModelProto:
    """x · (1 + erf(x / √2)) · `half`, GELU's erf form with its ½ given."""
    return parse_model(f"""
        g ({x}) => ({y}) {{
            d = Div(x, sqrt2)
            e = Erf(d)
            p = Add(e, one)
            m = Mul(x, p)
            y = Mul(m, half)
        }}""", sqrt2=np.array(np.sqrt(2), np.float32), one=np.array(1, np.float32), half=half)


def test_a_constant_near_but_not_at_the_patterns_value_is_not_fused():
    # ½ written as 0.5004 is not GELU's ½: fused, 13 of 16 elements moved by up to 3e-3.
    proto = _erf_gelu("float[16] x", "float[16] y", np.array(0.5004, np.float32))
    ops = _same_outputs(proto, {"x": RNG.standard_normal(16).astype(np.float32) * 3})
    assert "com.microsoft::Gelu" not in ops


def test_an_exponent_must_be_exact():
    # d^2.001 is NaN for a negative d: a LayerNorm built on it is not a LayerNorm.
    proto = parse_model("""
        g (float[2, 8] x) => (float[2, 8] y) {
            mu = ReduceMean <axes = [-1]> (x)
            d = Sub(x, mu)
            sq = Pow(d, two)
            var = ReduceMean <axes = [-1]> (sq)
            ve = Add(var, eps)
            sd = Sqrt(ve)
            y = Div(d, sd)
        }""", header='<ir_version: 8, opset_import: ["" : 17]>\n',
        two=np.array(2.001, np.float32), eps=np.array(1e-5, np.float32))
    feeds = {"x": RNG.standard_normal((2, 8)).astype(np.float32)}
    optimized = graphopt.optimize(proto).to_onnx()
    assert "LayerNormalization" not in [n.op_type for n in optimized.graph.node]
    expected, actual = numerics.run(proto, feeds)["y"], numerics.run(optimized, feeds)["y"]
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))


@pytest.mark.parametrize("case", ["quickgelu", "scalar_gelu", "attention_scale"])
def test_a_one_element_constant_of_a_higher_rank_keeps_its_broadcast(case):
    # x · sigmoid(x · a) with a of shape [1,1,1,1] is [1,2,3,8] for x [2,3,8]; a fused op on x
    # alone gives [2,3,8].
    if case == "quickgelu":
        proto = parse_model("""
            g (float[2, 3, 8] x) => (float[1, 2, 3, 8] y) {
                s = Mul(x, a)
                g = Sigmoid(s)
                y = Mul(x, g)
            }""", a=np.full((1, 1, 1, 1), 1.702, np.float32))
        feeds = {"x": RNG.standard_normal((2, 3, 8)).astype(np.float32)}
    elif case == "scalar_gelu":
        proto = _erf_gelu("float x", "float[1] y", np.full((1,), 0.5, np.float32))
        feeds = {"x": np.array(0.7, np.float32)}
    else:
        proto = parse_model("""
            g (float[2, 3, 4, 8] q, float[2, 3, 8, 4] kt, float[2, 3, 4, 8] v)
                => (float[1, 2, 3, 4, 8] y) {
                s = MatMul(q, kt)
                d = Div(s, c)
                p = Softmax <axis = -1> (d)
                y = MatMul(p, v)
            }""", c=np.full((1, 1, 1, 1, 1), np.sqrt(8), np.float32))
        feeds = {"q": RNG.standard_normal((2, 3, 4, 8)).astype(np.float32),
                 "kt": RNG.standard_normal((2, 3, 8, 4)).astype(np.float32),
                 "v": RNG.standard_normal((2, 3, 4, 8)).astype(np.float32)}
    ops = _same_outputs(proto, feeds)
    assert not any(op.startswith("com.microsoft::") for op in ops), ops


def test_a_mask_whose_key_dim_may_broadcast_is_expanded_to_the_keys():
    # [2,1,1,t] with t = 1 at run time is legal broadcasting; MultiHeadAttention takes a bias
    # of exactly T columns, so the fused form expands it.
    proto = parse_model("""
        g (float[2, 3, 4, 8] q, float[2, 3, 8, 4] kt, float[2, 3, 4, 8] v, float[2, 1, 1, t] m)
            => (float[2, 3, 4, 8] y) {
            s = MatMul(q, kt)
            d = Div(s, c)
            a = Add(d, m)
            p = Softmax <axis = -1> (a)
            y = MatMul(p, v)
        }""", c=np.array(np.sqrt(8), np.float32))
    feeds = {"q": RNG.standard_normal((2, 3, 4, 8)).astype(np.float32),
             "kt": RNG.standard_normal((2, 3, 8, 4)).astype(np.float32),
             "v": RNG.standard_normal((2, 3, 4, 8)).astype(np.float32)}
    for t in (1, 4):
        feeds["m"] = RNG.standard_normal((2, 1, 1, t)).astype(np.float32)
        ops = _same_outputs(proto, feeds)
        assert "com.microsoft::MultiHeadAttention" in ops
        onnx.checker.check_model(graphopt.optimize(proto).to_onnx())
