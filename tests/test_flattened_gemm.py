"""FlattenedGemm: a Linear over rows flattened for a Gemm and split back becomes x·W + b again,
exactly where the rows depend on nothing but themselves."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import ops, parse_model

import graphopt
from graphopt import numerics

RNG = np.random.default_rng(0)
W = RNG.standard_normal((6, 8)).astype(np.float32)  # [N, K], read with transB = 1
B = RNG.standard_normal(6).astype(np.float32)

# onnxsim's form at open dims: the split's target built from Shape(x); one flattening read by
# two Gemms, as for a layer's Q and K.
ONNXSIM = """
g (float[batch, seq, 8] x) => (float[batch, seq, 6] q, float[batch, seq, 6] k) {
  flat = Reshape(x, rows)
  gq = Gemm <transB = 1> (flat, w, b)
  gk = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (flat, w, b)
  shape = Shape(x)
  lead = Slice(shape, zero, two)
  target = Concat <axis = 0> (lead, n)
  q = Reshape(gq, target)
  k = Reshape(gk, target)
}"""


def _onnxsim_form():
    return parse_model(ONNXSIM, w=W, b=B, rows=np.array([-1, 8], np.int64),
                       zero=np.array([0], np.int64), two=np.array([2], np.int64),
                       n=np.array([6], np.int64))


def _matches(proto, out, dims=None):
    feeds = numerics.random_feeds(proto, seed=3, dims=dims or {})
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-5, 1e-5)
    assert not problems, problems


def test_onnxsims_flattened_linears_become_matmuls_again():
    proto = _onnxsim_form()
    result = graphopt.optimize(proto, level=2)
    assert ops(result.model) == ["MatMul", "Add", "MatMul", "Add"], ops(result.model)
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    _matches(proto, out, {"batch": 2, "seq": 5})
    # Gemm's alpha and beta are folded into the weight and the bias.
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    matmuls = [n for n in out.graph.node if n.op_type == "MatMul"]
    assert sorted(float(np.abs(weights[n.input[1]]).max()) for n in matmuls) == pytest.approx(
        [0.5 * float(np.abs(W).max()), float(np.abs(W).max())])


@pytest.mark.parametrize("bias, split, why", [
    (RNG.standard_normal((10, 6)).astype(np.float32), [2, 5, 6],
     "the bias differs from row to row"),
    (B, [5, 2, 6], "does not split the rows back")])
def test_rows_that_depend_on_their_place_stay_a_gemm(bias, split, why):
    proto = parse_model("""
g (float[2, 5, 8] x) => (float[a, b, 6] y) {
  flat = Reshape(x, rows)
  g = Gemm <transB = 1> (flat, w, c)
  y = Reshape(g, split)
}""".replace("float[a, b, 6]", f"float[{', '.join(map(str, split))}]"), w=W, c=bias,
        rows=np.array([10, 8], np.int64), split=np.array(split, np.int64))
    result = graphopt.optimize(proto, level=2, trace_rules=["FlattenedGemm"])
    assert "Gemm" in ops(result.model)
    assert any(why in line for line in result.traces), result.traces
    _matches(proto, result.to_onnx())


def test_a_batch_first_row_swap_goes_through_a_flattened_linear():
    # nn.MultiheadAttention's output projection in a batch-first module: [B, L, E] swapped to
    # [L, B, E], flattened, a Linear, split and swapped back. As a MatMul the swaps meet.
    proto = parse_model("""
g (float[2, 5, 8] x) => (float[2, 5, 6] y) {
  t = Transpose <perm = [1, 0, 2]> (x)
  flat = Reshape(t, rows)
  g = Gemm <transB = 1> (flat, w, b)
  s = Reshape(g, split)
  y = Transpose <perm = [1, 0, 2]> (s)
}""", w=W, b=B, rows=np.array([10, 8], np.int64), split=np.array([5, 2, 6], np.int64))
    result = graphopt.optimize(proto, level=2)
    assert ops(result.model) == ["MatMul", "Add"]
    _matches(proto, result.to_onnx())


@pytest.mark.parametrize("split, fuses", [
    ([5, -1, 6], True),    # nn.MultiheadAttention's out_proj(x).view(tgt_len, -1, embed)
    ([-1, 2, 6], False),   # the -1 is the batch only where it is 2: the rows move
    ([5, -1, 3], False),   # not the Gemm's width
])
def test_a_split_with_a_minus_one_for_an_open_dim(split, fuses):
    proto = parse_model("""
g (float[5, batch, 8] x) => (float[?, ?, ?] y) {
  flat = Reshape(x, rows)
  g = Gemm <transB = 1> (flat, w, b)
  y = Reshape(g, split)
}""", w=W, b=B, rows=np.array([-1, 8], np.int64), split=np.array(split, np.int64))
    result = graphopt.optimize(proto, level=2, trace_rules=["FlattenedGemm"])
    if fuses:
        assert ops(result.model) == ["MatMul", "Add"]
    else:
        assert "Gemm" in ops(result.model)
        assert any("does not split the rows back" in line for line in result.traces)
    for batch in (2, 3) if split[1] == -1 else (2,):
        _matches(proto, result.to_onnx(), {"batch": batch})


def test_a_bias_of_one_value_per_row_stays_a_gemm():
    # [4, 1] over 4 rows of 4 columns: one value per row, which a differential fuzz found
    # taken for a [4] bias of one value per column.
    proto = parse_model("""
g (float[2, 2, 3] x) => (float[2, 2, 4] y) {
  flat = Reshape(x, rows)
  g = Gemm(flat, w, c)
  y = Reshape(g, split)
}""", w=RNG.standard_normal((3, 4)).astype(np.float32),
        c=np.arange(4, dtype=np.float32).reshape(4, 1),
        rows=np.array([-1, 3], np.int64), split=np.array([2, 2, 4], np.int64))
    result = graphopt.optimize(proto, level=2)
    assert "Gemm" in ops(result.model)
    _matches(proto, result.to_onnx())


def test_a_flattening_read_earlier_stays_ahead_of_its_reader():
    # Another Gemm reads the flattening before the one rewritten: the flattening kept for it
    # is made at the rewrite, which must not leave that reader ahead of it (a differential
    # fuzz found the written graph out of order, refused by onnx.checker).
    proto = parse_model("""
g (float[2, 3, 4] x) => (float[6, 5] y1, float[2, 3, 3] y2) {
  flat = Reshape(x, rows)
  y1 = Gemm(flat, w1)
  g2 = Gemm(flat, w2)
  y2 = Reshape(g2, split)
}""", w1=RNG.standard_normal((4, 5)).astype(np.float32),
        w2=RNG.standard_normal((4, 3)).astype(np.float32),
        rows=np.array([-1, 4], np.int64), split=np.array([2, 3, 3], np.int64))
    out = graphopt.optimize(proto, level=2).to_onnx()
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node].count("MatMul") == 1
    _matches(proto, out)


def test_onnxsims_shared_flattenings_compile_without_sorting_the_graph_per_layer(monkeypatch):
    # Each layer's flattening is read by two Gemms: the first rewrite keeps it for the second,
    # whose read came before the op that makes it now. The rule framework had sorted the whole
    # graph after every such rewrite (quadratic: 51 s at 1000 layers, 3 s now); the new
    # flattening moves ahead of its reader instead.
    from graphopt.ir.graph import Graph

    layers, lines, weights, prev = 12, [], {}, "x"
    for i in range(layers):
        lines += [f"f{i} = Reshape({prev}, rows)", f"g{i} = Gemm <transB = 1> (f{i}, w{i}, b)",
                  f"k{i} = Gemm <transB = 1> (f{i}, v{i}, b)", f"h{i} = Reshape(g{i}, split)",
                  f"j{i} = Reshape(k{i}, split)", f"s{i} = Add(h{i}, j{i})"]
        weights[f"w{i}"] = (RNG.standard_normal((8, 8)) * 0.3).astype(np.float32)
        weights[f"v{i}"] = (RNG.standard_normal((8, 8)) * 0.3).astype(np.float32)
        prev = f"s{i}"
    proto = parse_model(
        "g (float[2, 5, 8] x) => (float[2, 5, 8] s%d) {\n%s\n}" % (layers - 1, "\n".join(lines)),
        rows=np.array([-1, 8], np.int64), split=np.array([2, 5, 8], np.int64),
        b=np.zeros(8, np.float32), **weights)
    sorts = []
    sort = Graph.sort
    monkeypatch.setattr(Graph, "sort", lambda graph: sorts.append(1) or sort(graph))
    result = graphopt.optimize(proto, level=2)
    assert "Gemm" not in ops(result.model) and len(sorts) < layers, len(sorts)
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    _matches(proto, out)
