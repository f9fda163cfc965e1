"""FuseMatMul: MatMul + bias into Gemm, transposes into Gemm/FusedMatMul, scalar scales into
FusedMatMul's alpha — what fires, what must not, and that outputs never change."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx.parser
import pytest
from helpers import node, ops, parse_model

from graphopt import numerics, zoo
from graphopt.compiler import optimize
from graphopt.ir import Model, load_onnx, to_onnx, verify
from graphopt.passes.base import PASSES, PassContext
from graphopt.passes.fusion.matmul import FuseMatMul
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.partition.target import load_target
from graphopt.passes.options import Options
from graphopt.passes.rules import Tracer

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
RNG = np.random.default_rng(7)


def build(text: str, **weights: np.ndarray) -> onnx.ModelProto:
    return parse_model(text, HEADER, **weights)


def weight(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def fuse(proto: onnx.ModelProto | Model, rounds: int = 4,
         target: str | None = None) -> tuple[Model, Counter]:
    """FuseMatMul to a fixed point (as the pipeline runs it), verifying the IR after each run."""
    model = load_onnx(proto) if isinstance(proto, onnx.ModelProto) else proto
    infer_shapes(model)
    stats: Counter = Counter()
    for _ in range(rounds):
        result = FuseMatMul().run(model, PassContext(
            Options(), target=load_target(target) if target else None))
        verify(model)
        assert result.changed == bool(result.stats)
        stats.update(result.stats)
        if not result.changed:
            break
    return model, stats


def same_outputs(original: onnx.ModelProto, model: Model, atol: float = 1e-5) -> None:
    rewritten = to_onnx(model)
    onnx.checker.check_model(rewritten)
    feeds = numerics.random_feeds(original, seed=0)
    expected, actual = numerics.run(original, feeds), numerics.run(rewritten, feeds)
    assert not numerics.compare(expected, actual, rtol=1e-4, atol=atol)


LINEAR = "g (float[4,8] x, float[8,16] w, float[{bias}] b) => (float[4,16] y) {{ {body} }}"


# -- MatMulAddToGemm --------------------------------------------------------------------------

@pytest.mark.parametrize("body,bias", [("m = MatMul(x, w)\n y = Add(m, b)", "16"),
                                       ("m = MatMul(x, w)\n y = Add(b, m)", "16"),
                                       ("m = MatMul(x, w)\n y = Add(m, b)", "1,16")])
def test_matmul_add_becomes_gemm(body, bias):
    proto = build(LINEAR.format(bias=bias, body=body), w=weight(8, 16),
                  b=weight(*map(int, bias.split(","))))
    model, stats = fuse(proto)
    assert stats == {"MatMulAddToGemm": 1}
    assert ops(model) == ["Gemm"]
    x, w, c = node(model, "Gemm").inputs
    assert (x.name, w.name) == ("x", "w")
    # A bias row becomes the vector it broadcasts as, the bias QuantizeInt8 takes.
    assert c.name == "b" if bias == "16" else c.constant().shape == (16,)
    same_outputs(proto, model)


def test_a_gemm_from_a_bias_row_is_quantized_to_int8(tmp_path):
    # skl2onnx's MLPs add [1, N] rows: the Gemm they fused into had stayed float.
    proto = build("g (float[4,8] x) => (float[4,16] y) "
                  "{ m = MatMul(x, w)\n a = Add(m, b)\n r = Relu(a)\n h = MatMul(r, w2)\n"
                  " y = Add(h, b2) }",
                  w=weight(8, 16), b=weight(1, 16), w2=weight(16, 16), b2=weight(1, 16))
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).standard_normal((8, 4, 8))
             .astype(np.float32))
    result = optimize(proto, pass_options={"quantize": "int8", "quant_keep_ends": False,
                                           "calibration": str(tmp_path / "c.npz")})
    counts = Counter(n.op_type for n in result.model.graph)
    assert counts["Gemm"] == 2 and counts["DequantizeLinear"] >= 4, counts


def refusal(proto: onnx.ModelProto, rule: str) -> str:
    """Run FuseMatMul tracing `rule`; nothing may change. Returns the tracer's report."""
    model = load_onnx(proto)
    infer_shapes(model)
    tracer = Tracer({rule})
    assert not FuseMatMul().run(model, PassContext(Options(), tracer=tracer)).changed
    same_outputs(proto, model)  # the negatives are valid models, refused for their own reason
    return "\n".join(tracer.report())


MATMUL_ADD_NEGATIVES = {
    # A of rank 3: onnxruntime fuses MatMul + Add itself; Gemm takes matrices only.
    "rank-3 A": (lambda: build(
        "g (float[2,4,8] x, float[8,16] w, float[16] b) => (float[2,4,16] y) "
        "{ m = MatMul(x, w)\n y = Add(m, b) }", w=weight(8, 16), b=weight(16)),
        "A %x has rank 3"),
    "fed bias": (lambda: build(LINEAR.format(bias="16", body="m = MatMul(x, w)\n y = Add(m, b)"),
                               w=weight(8, 16)),
                 "'b' must be a constant"),
    "product read twice": (lambda: build(
        "g (float[4,8] x, float[8,16] w, float[16] b) => (float[4,16] y, float[4,16] z) "
        "{ m = MatMul(x, w)\n y = Add(m, b)\n z = Relu(m) }", w=weight(8, 16), b=weight(16)),
        "is also read by Relu"),
    "full addend": (lambda: build(LINEAR.format(bias="4,16",
                                                body="m = MatMul(x, w)\n y = Add(m, b)"),
                                  w=weight(8, 16), b=weight(4, 16)),
                    "bias shape [4, 16] is not [16] or [1, 16]"),
    "float16": (lambda: build(
        "g (float16[4,8] x, float16[8,16] w, float16[16] b) => (float16[4,16] y) "
        "{ m = MatMul(x, w)\n y = Add(m, b) }",
        w=weight(8, 16, dtype=np.float16), b=weight(16, dtype=np.float16)),
        "does not take f16"),
}


@pytest.mark.parametrize("case", MATMUL_ADD_NEGATIVES)
def test_matmul_add_negatives(case):
    make, reason = MATMUL_ADD_NEGATIVES[case]
    assert reason in refusal(make(), "MatMulAddToGemm")


# -- TransposeIntoGemmA / TransposeIntoGemmB ----------------------------------------------------

def test_transpose_into_gemm_a_and_b():
    proto = build("g (float[8,4] x, float[8,16] v, float[16] c) => (float[4,16] y) {"
                  " xt = Transpose<perm=[1,0]>(x)\n vt = Transpose(v)\n"
                  " y = Gemm<alpha=0.5, beta=2.0, transB=1>(xt, vt, c) }", c=weight(16))
    model, stats = fuse(proto)
    assert stats == {"TransposeIntoGemmA": 1, "TransposeIntoGemmB": 1}
    assert ops(model) == ["Gemm"]
    gemm = node(model, "Gemm")
    assert (gemm.attr("transA"), gemm.attr("transB")) == (1, 0)
    assert (gemm.attr("alpha"), gemm.attr("beta")) == (0.5, 2.0)
    same_outputs(proto, model)


def test_linear_on_transposed_input_is_one_gemm():
    proto = build("g (float[8,4] x, float[8,16] w, float[16] b) => (float[4,16] y) {"
                  " xt = Transpose<perm=[1,0]>(x)\n m = MatMul(xt, w)\n y = Add(m, b) }",
                  w=weight(8, 16), b=weight(16))
    model, stats = fuse(proto)
    assert stats == {"MatMulAddToGemm": 1, "TransposeIntoGemmA": 1}
    assert ops(model) == ["Gemm"] and node(model, "Gemm").attr("transA") == 1
    same_outputs(proto, model)


def test_transpose_read_twice_stays():
    proto = build("g (float[8,4] x, float[8,16] w) => (float[4,16] y, float[4,8] z) {"
                  " t = Transpose<perm=[1,0]>(x)\n y = Gemm(t, w)\n z = Relu(t) }",
                  w=weight(8, 16))
    assert "%t (from '') is also read by Relu" in refusal(proto, "TransposeIntoGemmA")


# -- Transposes and scales into FusedMatMul -----------------------------------------------------

ATTENTION = ("g (float[2,4,8,16] q, float[2,4,8,16] k) => (float[2,4,8,8] y) {{"
             " kt = Transpose<perm=[0,1,3,2]>(k)\n s = MatMul(q, kt)\n {tail} }}")


def test_q_k_transposed_becomes_fused_matmul():
    proto = build(ATTENTION.format(tail="y = Identity(s)"))
    model, stats = fuse(proto)
    assert stats == {"TransposeIntoMatMulB": 1}
    assert ops(model) == ["com.microsoft::FusedMatMul", "Identity"]
    fused = node(model, "FusedMatMul")
    assert [v.name for v in fused.inputs] == ["q", "k"]
    assert (fused.attr("transA"), fused.attr("transB"), fused.attr("alpha")) == (0, 1, 1.0)
    same_outputs(proto, model)


@pytest.mark.parametrize("tail,rule", [("y = Div(s, d)", "DividedFusedMatMul"),
                                       ("y = Mul(d, s)", "ScaledFusedMatMul")])
def test_attention_scores_with_scale_are_one_fused_matmul(tail, rule):
    proto = build(ATTENTION.format(tail=tail).replace("(float[2,4,8,16] q,",
                                                      "(float d, float[2,4,8,16] q,"),
                  d=np.array(4.0, np.float32))
    model, stats = fuse(proto)
    assert stats == {"TransposeIntoMatMulB": 1, rule: 1}
    assert ops(model) == ["com.microsoft::FusedMatMul"]
    alpha = node(model, "FusedMatMul").attr("alpha")
    assert alpha == pytest.approx(0.25 if rule.startswith("Divided") else 4.0)
    same_outputs(proto, model)


@pytest.mark.parametrize("op,rule,alpha", [("Mul", "ScaledMatMul", 0.125),
                                           ("Div", "DividedMatMul", 8.0)])
def test_scaled_matmul(op, rule, alpha):
    proto = build("g (float[3,4,5] a, float[5,6] b, float[1] s) => (float[3,4,6] y) {"
                  f" m = MatMul(a, b)\n y = {op}(m, s) }}", s=np.array([0.125], np.float32))
    model, stats = fuse(proto)
    assert stats == {rule: 1}
    assert ops(model) == ["com.microsoft::FusedMatMul"]
    assert node(model, "FusedMatMul").attr("alpha") == pytest.approx(alpha)
    same_outputs(proto, model)


def test_both_operands_transposed():
    proto = build("g (float[2,5,4] a, float[2,6,5] b) => (float[2,4,6] y) {"
                  " at = Transpose<perm=[0,2,1]>(a)\n bt = Transpose<perm=[0,2,1]>(b)\n"
                  " m = MatMul(at, bt)\n y = Mul(m, s) }", s=np.array(0.5, np.float32))
    model, stats = fuse(proto)
    assert stats == {"TransposeIntoMatMulA": 1, "ScaledFusedMatMul": 1,
                     "TransposeIntoFusedMatMulB": 1}
    fused = node(model, "FusedMatMul")
    assert ops(model) == ["com.microsoft::FusedMatMul"]
    assert (fused.attr("transA"), fused.attr("transB"), fused.attr("alpha")) == (1, 1, 0.5)
    same_outputs(proto, model)


FUSED_MATMUL_NEGATIVES = {
    # The transpose moves a batch axis, not only the last two.
    "batch perm": (lambda: build(ATTENTION.format(tail="y = Identity(s)").replace(
        "perm=[0,1,3,2]>(k)", "perm=[0,2,1,3]>(k)").replace("float[2,4,8,16] k",
                                                            "float[2,16,4,8] k")),
        "TransposeIntoMatMulB", "does not swap the last two axes only"),
    # The transposed key is a graph output too.
    "kt kept": (lambda: build(ATTENTION.format(tail="y = Identity(s)").replace(
        "=> (float[2,4,8,8] y)", "=> (float[2,4,8,8] y, float[2,4,16,8] kt)")),
        "TransposeIntoMatMulB", "%kt (from '') is a graph output"),
    # A vector is not FusedMatMul's scalar alpha; a rank-5 scalar would broadcast the product.
    "vector scale": (lambda: build("g (float[4,5] a, float[5,6] b) => (float[4,6] y) {"
                                   " m = MatMul(a, b)\n y = Mul(m, s) }", s=weight(6)),
                     "ScaledMatMul", "constant (predicate), got"),
    "rank-5 scale": (lambda: build("g (float[4,5] a, float[5,6] b) => (float[1,1,1,4,6] y) {"
                                   " m = MatMul(a, b)\n y = Mul(m, s) }",
                                   s=weight(1, 1, 1, 1, 1)),
                     "ScaledMatMul", "the one-element constant %s of rank 5 meets %m of rank 2"),
    # 1/1e-40 overflows float32, 1/3e38 keeps few bits: the Div stays.
    "denormal divisor": (lambda: build("g (float[4,5] a, float[5,6] b) => (float[4,6] y) {"
                                       " m = MatMul(a, b)\n y = Div(m, s) }",
                                       s=np.array(1e-40, np.float32)),
                         "DividedMatMul", "the composed alpha 1.00001e+40 is not a finite float32"),
    "huge divisor": (lambda: build("g (float[4,5] a, float[5,6] b) => (float[4,6] y) {"
                                   " m = MatMul(a, b)\n y = Div(m, s) }",
                                   s=np.array(3e38, np.float32)),
                     "DividedMatMul", "is below float32's normal range"),
    "fed divisor": (lambda: build("g (float[4,5] a, float[5,6] b, float s) => (float[4,6] y) {"
                                  " m = MatMul(a, b)\n y = Div(m, s) }"),
                    "DividedMatMul", "%s is not constant"),
    # The scaling rules' own check (shared with DividedMatMul, which alone had reached it): a
    # vector operand is no FusedMatMul operand, and a scale below float32's normal range, or
    # one that takes an existing alpha there, is no alpha.
    "vector operand": (lambda: build("g (float[5] a, float[5,6] b) => (float[6] y) {"
                                     " m = MatMul(a, b)\n y = Mul(m, s) }",
                                     s=np.array(0.5, np.float32)),
                       "ScaledMatMul", "operand ranks (1, 2) are not both known and at least 2"),
    "denormal scale": (lambda: build("g (float[4,5] a, float[5,6] b) => (float[4,6] y) {"
                                     " m = MatMul(a, b)\n y = Mul(m, s) }",
                                     s=np.array(1e-40, np.float32)),
                       "ScaledMatMul", "is below float32's normal range"),
    "denormal composed alpha": (lambda: parse_model(
        "g (float[4,5] a, float[5,6] b) => (float[4,6] y) {"
        " m = com.microsoft.FusedMatMul<alpha=1e-30>(a, b)\n y = Mul(m, s) }",
        '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n',
        s=np.array(1e-10, np.float32)), "ScaledFusedMatMul", "is below float32's normal range"),
}


def test_transpose_into_existing_fused_matmul():
    # A FusedMatMul already reading Aᵀ (transA=1) meets another swap of A: the two cancel.
    proto = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
        "g (float[2,4,5] a, float[2,5,6] b) => (float[2,4,6] y) {"
        " at = Transpose<perm=[0,2,1]>(a)\n"
        " y = com.microsoft.FusedMatMul<transA=1, alpha=0.5>(at, b) }")
    model, stats = fuse(proto)
    assert stats == {"TransposeIntoFusedMatMulA": 1}
    fused = node(model, "FusedMatMul")
    assert ops(model) == ["com.microsoft::FusedMatMul"]
    assert (fused.attr("transA"), fused.attr("transB"), fused.attr("alpha")) == (0, 0, 0.5)
    same_outputs(proto, model)


@pytest.mark.parametrize("case", FUSED_MATMUL_NEGATIVES)
def test_fused_matmul_negatives(case):
    make, rule, reason = FUSED_MATMUL_NEGATIVES[case]
    assert reason in refusal(make(), rule)


def test_bert_attention_scale_is_fused():
    proto = zoo.build("bert_base", layers=2, hidden=64, heads=4, intermediate=128, vocab=100,
                      max_positions=32)
    # FuseMatMul is the pass under test; FuseAttention would take the scores it fuses
    model = optimize(proto, disable_passes=["FuseMatMul", "FuseAttention"]).model
    before = Counter(ops(model))
    model, stats = fuse(model)
    # The exporter's key Transpose is perm (0,2,3,1): head split and kᵀ in one, which
    # FusedMatMul's transposes cannot express, so only the 1/√d scale folds; the 3-D
    # projections stay MatMul + Add for onnxruntime.
    assert stats == {"DividedMatMul": 2}
    after = Counter(ops(model))
    assert after["com.microsoft::FusedMatMul"] == 2
    assert after["MatMul"] == before["MatMul"] - 2 and after["Div"] == before["Div"] - 2
    feeds = zoo.sample_inputs(proto, dims={"batch_size": 2, "sequence_length": 8})
    rewritten = to_onnx(model)
    onnx.checker.check_model(rewritten)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(rewritten, feeds),
                                rtol=1e-4, atol=1e-4)


# -- Scales on the operands into FusedMatMul -----------------------------------------------------

SDPA = ("g (float[2,4,8,16] q, float[2,4,16,8] kt, float s, float[1] d) => (float[2,4,8,8] y) "
        "{{ {body} }}")
SCALES = {"s": np.array(0.5, np.float32), "d": np.array([8.0], np.float32)}


@pytest.mark.parametrize("body,alpha", [
    # torch's sdpa decomposition as the dynamo exporter writes it: √scale on each side.
    ("qs = Mul(q, s)\n ks = Mul(kt, s)\n y = MatMul(qs, ks)", 0.25),
    ("qs = Mul(s, q)\n y = MatMul(qs, kt)", 0.5),
    # DeBERTa: kᵀ divided by √(d·scale_factor).
    ("ks = Div(kt, d)\n y = MatMul(q, ks)", 0.125),
    ("qs = Mul(q, s)\n ks = Div(kt, d)\n y = MatMul(qs, ks)", 0.0625),
])
def test_scaled_operands_become_alpha(body, alpha):
    proto = build(SDPA.format(body=body), **SCALES)
    model, stats = fuse(proto)
    assert stats == {"ScaledOperandsMatMul": 1}
    assert ops(model) == ["com.microsoft::FusedMatMul"]
    fused = node(model, "FusedMatMul")
    assert [v.name for v in fused.inputs] == ["q", "kt"]
    assert (fused.attr("transA"), fused.attr("transB")) == (0, 0)
    assert fused.attr("alpha") == pytest.approx(alpha)
    same_outputs(proto, model)


def test_llama_scores_scaled_on_both_sides_are_one_fused_matmul():
    """Llama's dynamo export: Mul(q, s) and Mul(Transpose(k), s): both scales go into alpha,
    then the transpose into transB."""
    proto = build("g (float[2,4,8,16] q, float[2,4,8,16] k, float s) => (float[2,4,8,8] y) {"
                  " kt = Transpose<perm=[0,1,3,2]>(k)\n qs = Mul(q, s)\n ks = Mul(kt, s)\n"
                  " y = MatMul(qs, ks) }", s=np.array(0.5, np.float32))
    model, stats = fuse(proto)
    assert stats == {"ScaledOperandsMatMul": 1, "TransposeIntoFusedMatMulB": 1}
    assert ops(model) == ["com.microsoft::FusedMatMul"]
    fused = node(model, "FusedMatMul")
    assert [v.name for v in fused.inputs] == ["q", "k"]
    assert (fused.attr("transB"), fused.attr("alpha")) == (1, 0.25)
    same_outputs(proto, model)


def test_scaled_operands_of_a_fused_matmul():
    """k scaled before its Transpose: the transpose makes the FusedMatMul, then the scales fold."""
    proto = build("g (float[2,4,8,16] q, float[2,4,8,16] k, float s) => (float[2,4,8,8] y) {"
                  " ks = Mul(k, s)\n kt = Transpose<perm=[0,1,3,2]>(ks)\n qs = Mul(q, s)\n"
                  " y = MatMul(qs, kt) }", s=np.array(0.5, np.float32))
    model, stats = fuse(proto)
    assert stats == {"TransposeIntoMatMulB": 1, "ScaledOperandsFusedMatMul": 1}
    fused = node(model, "FusedMatMul")
    assert ops(model) == ["com.microsoft::FusedMatMul"]
    assert [v.name for v in fused.inputs] == ["q", "k"]
    assert (fused.attr("transB"), fused.attr("alpha")) == (1, 0.25)
    same_outputs(proto, model)


def test_a_scaled_operand_read_elsewhere_keeps_its_scale():
    """q·s is also a graph output: only kᵀ's scale folds."""
    proto = build(SDPA.format(body="qs = Mul(q, s)\n ks = Mul(kt, s)\n y = MatMul(qs, ks)")
                  .replace("=> (float[2,4,8,8] y)", "=> (float[2,4,8,8] y, float[2,4,8,16] qs)"),
                  **SCALES)
    model, stats = fuse(proto)
    assert stats == {"ScaledOperandsMatMul": 1}
    assert sorted(ops(model)) == ["Mul", "com.microsoft::FusedMatMul"]
    fused = node(model, "FusedMatMul")
    assert [v.name for v in fused.inputs] == ["qs", "kt"] and fused.attr("alpha") == 0.5
    same_outputs(proto, model)


SCALED_OPERAND_NEGATIVES = {
    # A weight's MatMul stays one, for the quantizers and onnxruntime's MatMul fusions.
    "weight operand": (lambda: build("g (float[2,8,16] x, float s) => (float[2,8,4] y) {"
                                     " xs = Mul(x, s)\n y = MatMul(xs, w) }",
                                     s=np.array(0.5, np.float32), w=weight(16, 4)),
                       "%w is a constant"),
    "vector scale": (lambda: build(SDPA.replace("float s,", "float[16] s,").format(
        body="qs = Mul(q, s)\n y = MatMul(qs, kt)"), s=weight(16), d=SCALES["d"]),
        "neither operand is scaled by a scalar constant"),
    "fed scale": (lambda: build(SDPA.format(body="qs = Mul(q, s)\n y = MatMul(qs, kt)"),
                                d=SCALES["d"]),
                  "neither operand is scaled by a scalar constant"),
    "division by zero": (lambda: build(SDPA.format(body="ks = Div(kt, d)\n y = MatMul(q, ks)"),
                                       s=SCALES["s"], d=np.array([0.0], np.float32)),
                         "division by zero"),
    "alpha below float32's range": (lambda: build(
        SDPA.format(body="qs = Mul(q, s)\n ks = Mul(kt, s)\n y = MatMul(qs, ks)"),
        s=np.array(1e-30, np.float32), d=SCALES["d"]),
        "the composed alpha 1e-60 is below float32's normal range"),
}


@pytest.mark.parametrize("target", ["ascend310", "cpu", None])
def test_float16_scores_scaled_on_both_sides_fuse(target):
    # The NPUs run FusedMatMul in float16, onnxruntime's CPU provider its float32 one between
    # Casts; one rounding where the ops round three times.
    proto = build(SDPA.format(body="qs = Mul(q, s)\n ks = Mul(kt, s)\n y = MatMul(qs, ks)")
                  .replace("float", "float16"), s=np.array(0.5, np.float16),
                  d=np.array([8.0], np.float16))
    model, stats = fuse(proto, target=target)
    assert stats == {"ScaledOperandsMatMul": 1} and ops(model) == ["com.microsoft::FusedMatMul"]
    rewritten = to_onnx(model)
    onnx.checker.check_model(rewritten)
    feeds = numerics.random_feeds(proto, seed=0)
    (expected,), (actual,) = (numerics.run(m, feeds).values() for m in (proto, rewritten))
    assert actual.dtype == np.float16
    step = float(np.abs(expected).max()) * 2.0 ** -10
    assert np.abs(actual.astype(np.float32) - expected.astype(np.float32)).max() <= 2 * step


@pytest.mark.parametrize("case", SCALED_OPERAND_NEGATIVES)
def test_scaled_operand_negatives(case):
    make, reason = SCALED_OPERAND_NEGATIVES[case]
    proto = make()
    if case == "alpha below float32's range":
        # One scale alone is a normal float32 and folds; the second would take alpha below
        # the normal range, so it stays a Mul.
        model, stats = fuse(proto)
        assert stats == {"ScaledOperandsMatMul": 1} and "Mul" in ops(model)
        same_outputs(proto, model)
        tracer = Tracer({"ScaledOperandsFusedMatMul"})
        assert not FuseMatMul().run(model, PassContext(Options(), tracer=tracer)).changed
        assert reason in "\n".join(tracer.report())
        return
    assert reason in refusal(proto, "ScaledOperandsMatMul")


def test_pass_is_registered():
    assert PASSES["FuseMatMul"] is FuseMatMul


@pytest.mark.parametrize("equation, w_shape, transposed", [
    ("abc,cd->abd", (8, 6), False),      # jax2onnx's x @ W for a rank-3 x
    ("bsh, hk -> bsk", (8, 6), False),   # spaces, as hand-written
    ("abc,dc->abd", (6, 8), True),       # a torch-style weight [out, in]
])
def test_an_einsum_by_a_constant_matrix_becomes_a_matmul(equation, w_shape, transposed):
    proto = build(f"""
        g (float[2,5,8] x) => (float[2,5,6] y) {{
            y = Einsum <equation = "{equation}"> (x, w)
        }}""", w=weight(*w_shape))
    out = optimize(proto).to_onnx()
    assert [n.op_type for n in out.graph.node] == ["MatMul"]
    weights = {t.name: list(t.dims) for t in out.graph.initializer}
    assert weights[out.graph.node[0].input[1]] == ([8, 6])
    feeds = numerics.random_feeds(proto, seed=3)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-5, 1e-5)


@pytest.mark.parametrize("equation, x_shape, w_shape, y_shape", [
    ("abc,cd->adb", (2, 5, 8), (8, 6), (2, 6, 5)),   # the output in another order
    ("abc,cd->abcd", (2, 5, 8), (8, 6), (2, 5, 8, 6)),  # no contraction
    ("abc,bd->acd", (2, 8, 5), (8, 6), (2, 5, 6)),   # contracts an inner axis
    ("aab,bc->ac", (3, 3, 8), (8, 6), (3, 6)),       # a diagonal
])
def test_an_einsum_that_is_no_plain_product_stays(equation, x_shape, w_shape, y_shape):
    dims = lambda shape: ",".join(map(str, shape))  # noqa: E731
    proto = build(f"""
        g (float[{dims(x_shape)}] x) => (float[{dims(y_shape)}] y) {{
            y = Einsum <equation = "{equation}"> (x, w)
        }}""", w=weight(*w_shape))
    assert ops(optimize(proto).model) == ["Einsum"]
