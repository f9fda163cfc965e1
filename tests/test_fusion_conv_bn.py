"""FuseConvBatchNorm: BatchNorm, per-channel Add/Mul and zero Pads folded into Conv, ConvTranspose,
Gemm, MatMul and AveragePool; each rule's firing, refusals and numerics, then zoo nets."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

import graphopt
from graphopt import numerics, to_onnx, zoo
from graphopt.ir import format_model, load_onnx
from graphopt.passes import Options, PassContext
from graphopt.passes.fusion import conv_bn
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.rules import Tracer

HEADER = '<ir_version: 8, opset_import: ["" : 18]>\n'
RTOL, ATOL = 1e-4, 1e-5


def _model(text: str, named: bool = True, **arrays: np.ndarray) -> onnx.ModelProto:
    """Parse `text`; the graph inputs named in `arrays` become initializers with that data, the
    rest stay runtime inputs. Nodes are named after their first output, as exporters name them."""
    proto = onnx.parser.parse_model(HEADER + text)
    for node in proto.graph.node if named else ():
        node.name = node.name or f"/{node.output[0]}/{node.op_type}"
    keep = [i for i in proto.graph.input if i.name not in arrays]
    del proto.graph.input[:]
    proto.graph.input.extend(keep)
    proto.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), n)
                                   for n, a in arrays.items())
    onnx.checker.check_model(proto)
    return proto


def _f32(*shape, seed=0, low=None, high=None):
    rng = np.random.default_rng(seed)
    data = rng.uniform(low, high, shape) if low is not None else rng.standard_normal(shape)
    return data.astype(np.float32)


def _bn(c: int, seed: int = 1) -> dict[str, np.ndarray]:
    return {"scale": 1 + 0.2 * _f32(c, seed=seed), "shift": 0.1 * _f32(c, seed=seed + 1),
            "mean": 0.1 * _f32(c, seed=seed + 2), "var": _f32(c, seed=seed + 3, low=0.5, high=1.5)}


def _fuse(proto: onnx.ModelProto, trace: str | None = None):
    """The IR model after InferShapes and the pass, the pass's stats, the trace lines."""
    model = load_onnx(proto)
    infer_shapes(model)
    tracer = Tracer({trace}) if trace else None
    result = conv_bn.FuseConvBatchNorm().run(model, PassContext(Options(), tracer=tracer))
    return model, result, tracer.report() if tracer else []


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph]


def _printed_nodes(model) -> list[str]:
    """The node lines of the printed IR, without initializers and the trailing name comment."""
    lines = format_model(model).splitlines()
    return [line.split("  #")[0].strip() for line in lines
            if " = " in line and "= initializer" not in line]


def _same_numerics(proto: onnx.ModelProto, model, rtol=RTOL, atol=ATOL) -> None:
    after = to_onnx(model)
    onnx.checker.check_model(after, full_check=True)
    feeds = numerics.random_feeds(proto, seed=0)
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(after, feeds), rtol, atol)
    assert not problems, [str(p) for p in problems]


def _fires(proto, rule: str, ops_after: list[str]):
    model, result, _ = _fuse(proto)
    assert result.changed and dict(result.stats) == {rule: 1}
    assert _ops(model) == ops_after
    _same_numerics(proto, model)
    return model


def _refuses(proto, rule: str, reason: str) -> None:
    before = [n.op_type for n in proto.graph.node]
    model, result, report = _fuse(proto, trace=rule)
    assert not result.changed and not result.stats
    assert _ops(model) == before
    assert any(reason in line for line in report), report


# -- Conv + BatchNormalization ---------------------------------------------------------------------

CONV_BN = """
g (float[2, {cin}, 6, 6] x, float[{cout}, {cing}, 3, 3] w{bdecl}, float[{cout}] scale,
   float[{cout}] shift, float[{cout}] mean, float[{cout}] var) => (float[2, {cout}, 6, 6] y) {{
    c = Conv(x, w{buse}) <group = {group}, pads = [1, 1, 1, 1]>
    y = BatchNormalization(c, scale, shift, mean, var) <epsilon = 0.001>
}}"""


def _conv_bn(cin=4, cout=6, group=1, bias=True, **overrides):
    text = CONV_BN.format(cin=cin, cout=cout, cing=cin // group, group=group,
                          bdecl=f", float[{cout}] b" if bias else "", buse=", b" if bias else "")
    arrays = {"w": _f32(cout, cin // group, 3, 3, seed=5), **_bn(cout)}
    if bias:
        arrays["b"] = _f32(cout, seed=6)
    arrays.update(overrides)
    return _model(text, **{k: v for k, v in arrays.items() if v is not None})


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cin,cout,group", [(4, 6, 1), (4, 6, 2), (6, 6, 6)],
                         ids=["dense", "grouped", "depthwise"])
def test_conv_bn_folds_into_weight_and_bias(bias, cin, cout, group):
    model = _fires(_conv_bn(cin, cout, group, bias), "ConvBatchNorm", ["Conv"])
    conv = model.graph.nodes()[0]
    assert len(conv.inputs) == 3 and all(v.is_constant for v in conv.inputs[1:])
    assert conv.attr("group") == group and conv.attr("pads") == [1, 1, 1, 1]


MIXED = """
g (float[2, 6, 6, 6] x, float[2, 1, 3, 3] w3, float[2] b3, float[4, 1, 5, 5] w5,
   float[6] scale, float[6] shift, float[6] mean, float[6] var) => (float[2, 6, 6, 6] y) {{
    a = Slice(x, s0, s2, one)
    c = Slice(x, s2, s6, one)
    p = Conv(a, w3, b3) <group = 2, pads = [1, 1, 1, 1]>
    q = Conv(c, w5) <group = 4, pads = [2, 2, 2, 2]>
    j = Concat(p, q) <axis = {axis}>
    y = BatchNormalization(j, scale, shift, mean, var) <epsilon = 0.001>{extra}
}}"""


def _mixed_arrays(**overrides) -> dict[str, np.ndarray]:
    arrays = {"w3": _f32(2, 1, 3, 3, seed=5), "b3": _f32(2, seed=6),
              "w5": _f32(4, 1, 5, 5, seed=7), **_bn(6),
              **{name: np.array([v], np.int64) for name, v in
                 (("s0", 0), ("s2", 2), ("s6", 6), ("one", 1))}}
    arrays.update(overrides)
    return {name: array for name, array in arrays.items() if array is not None}


def _mixed(axis=1):
    # MixNet's mixed depthwise conv: kernels of two sizes over two slices of the channels.
    return _model(MIXED.format(axis=axis, extra=""), **_mixed_arrays())


def test_a_batchnorm_after_a_concat_of_convs_splits_into_them():
    model = _fires(_mixed(), "ConcatBatchNorm", ["Slice", "Slice", "Conv", "Conv", "Concat"])
    first, second = (n for n in model.graph if n.op_type == "Conv")
    assert all(v.is_constant for conv in (first, second) for v in conv.inputs[1:])
    assert len(second.inputs) == 3  # the shift gave the bias-free conv a bias
    assert _fires(_mixed(axis=-3), "ConcatBatchNorm", _ops(model))


def test_a_batchnorm_after_a_concat_refuses_what_it_cannot_split():
    # A conv read elsewhere too would run twice; statistics given at run time cannot fold.
    read_twice = MIXED.replace("float[2, 6, 6, 6] y)", "float[2, 6, 6, 6] y, float[2, 2, 6, 6] z)")
    _refuses(_model(read_twice.format(axis=1, extra="\n    z = Relu(p)"), **_mixed_arrays()),
             "ConcatBatchNorm", "is read by more than the Concat")
    _refuses(_model(MIXED.format(axis=1, extra=""), **_mixed_arrays(scale=None)),
             "ConcatBatchNorm", "BatchNormalization scale %scale is not a constant")


def test_conv_bn_structure_and_originals_untouched():
    proto = _conv_bn()
    model = load_onnx(proto)
    assert _printed_nodes(model) == [
        "%c<?> = Conv(%x, %w, %b) {group=1, pads=[1,1,1,1]}",
        ("%y<f32[2,6,6,6]> = BatchNormalization(%c, %scale, %shift, %mean, %var) "
         "{epsilon=0.0010000000474974513}")]  # the float32 attribute, printed exactly
    model, _, _ = _fuse(proto)
    assert _printed_nodes(model) == [
        "%y<f32[2,6,6,6]> = Conv(%x, %w_fused, %w_b) {group=1, pads=[1,1,1,1]}"]
    w = numpy_helper.to_array(proto.graph.initializer[0])
    np.testing.assert_array_equal(model.graph.initializers["w"].constant(), w)
    conv = model.graph.nodes()[0]
    bn = _bn(6)
    s = bn["scale"].astype(np.float64) / np.sqrt(bn["var"].astype(np.float64) + 1e-3)
    np.testing.assert_allclose(conv.inputs[1].constant(), w * s[:, None, None, None], rtol=1e-6)


def test_conv_bn_shared_weight_gets_its_own_initializer():
    text = """
    g (float[1, 4, 5, 5] x, float[6, 4, 3, 3] w, float[6] scale, float[6] shift, float[6] mean,
       float[6] var) => (float[1, 6, 3, 3] y, float[1, 6, 3, 3] z) {
        c = Conv(x, w)
        y = BatchNormalization(c, scale, shift, mean, var)
        z = Conv(x, w)
    }"""
    proto = _model(text, w=_f32(6, 4, 3, 3, seed=5), **_bn(6))
    model = _fires(proto, "ConvBatchNorm", ["Conv", "Conv"])
    first, second = model.graph.nodes()
    assert second.inputs[1].name == "w" and first.inputs[1] is not second.inputs[1]
    np.testing.assert_array_equal(second.inputs[1].constant(),
                                  numpy_helper.to_array(proto.graph.initializer[0]))


def test_conv_bn_two_convs_sharing_a_weight_both_fold():
    text = """
    g (float[1, 4, 5, 5] x, float[6, 4, 3, 3] w, float[6] scale, float[6] shift, float[6] mean,
       float[6] var, float[6] scale2) => (float[1, 6, 3, 3] y, float[1, 6, 3, 3] z) {
        c = Conv(x, w)
        y = BatchNormalization(c, scale, shift, mean, var)
        d = Conv(x, w)
        z = BatchNormalization(d, scale2, shift, mean, var)
    }"""
    proto = _model(text, w=_f32(6, 4, 3, 3, seed=5), scale2=_f32(6, seed=9), **_bn(6))
    model, result, _ = _fuse(proto)
    assert dict(result.stats) == {"ConvBatchNorm": 2} and _ops(model) == ["Conv", "Conv"]
    first, second = model.graph.nodes()
    assert len({id(first.inputs[1]), id(second.inputs[1]), id(model.graph.initializers["w"])}) == 3
    _same_numerics(proto, model)


def test_conv_bn_refuses_non_constant_weight():
    _refuses(_conv_bn(w=None), "ConvBatchNorm", "weight %w is not a constant")


def test_conv_bn_refuses_statistics_given_as_graph_inputs():
    _refuses(_conv_bn(mean=None, var=None), "ConvBatchNorm",
             "BatchNormalization mean %mean is not a constant")


def test_conv_bn_refuses_extra_consumer_of_the_conv_output():
    text = """
    g (float[1, 4, 5, 5] x, float[6, 4, 3, 3] w, float[6] scale, float[6] shift, float[6] mean,
       float[6] var) => (float[1, 6, 3, 3] y, float[1, 6, 3, 3] z) {
        c = Conv(x, w)
        y = BatchNormalization(c, scale, shift, mean, var)
        z = Relu(c)
    }"""
    _refuses(_model(text, w=_f32(6, 4, 3, 3), **_bn(6)), "ConvBatchNorm", "is also read by Relu")


def test_two_unnamed_folds_get_distinct_node_names():
    text = """
    g (float[1, 4, 5, 5] x, float[6, 4, 3, 3] w, float[6] scale, float[6] shift, float[6] mean,
       float[6] var) => (float[1, 6, 3, 3] y, float[1, 6, 3, 3] z) {
        c = Conv(x, w)
        y = BatchNormalization(c, scale, shift, mean, var)
        d = Conv(x, w)
        z = BatchNormalization(d, scale, shift, mean, var)
    }"""
    proto = _model(text, named=False, w=_f32(6, 4, 3, 3, seed=5), **_bn(6))
    model, result, _ = _fuse(proto)
    assert result.stats["ConvBatchNorm"] == 2
    names = [n.name for n in model.graph]
    assert len(set(names)) == 2, names  # onnxruntime refuses two nodes with one name
    _same_numerics(proto, model)


@pytest.mark.parametrize("producer,wshape", [("ConvTranspose", "4, 6, 3, 3"),
                                             ("Gemm", "6, 4"), ("MatMul", "4, 6")])
def test_other_producers_refuse_a_non_constant_weight(producer, wshape):
    rank4 = producer == "ConvTranspose"
    text = f"""
    g (float[{"2, 4, 5, 5" if rank4 else "2, 6"}] x, float[{wshape}] w, float[6] scale,
       float[6] shift, float[6] mean, float[6] var) => (float[2, 6{", 7, 7" if rank4 else ""}] y) {{
        c = {producer}(x, w)
        y = BatchNormalization(c, scale, shift, mean, var)
    }}"""
    _refuses(_model(text, **_bn(6)), f"{producer}BatchNorm", "weight %w is not a constant")


def test_conv_bn_refuses_training_mode():
    text = """
    g (float[2, 4, 5, 5] x, float[6, 4, 3, 3] w, float[6] scale, float[6] shift, float[6] mean,
       float[6] var) => (float[2, 6, 3, 3] y) {
        c = Conv(x, w)
        y = BatchNormalization(c, scale, shift, mean, var) <training_mode = 1>
    }"""
    _refuses(_model(text, w=_f32(6, 4, 3, 3), **_bn(6)), "ConvBatchNorm", "training mode")


# -- ConvTranspose + BatchNormalization -----------------------------------------------------------

@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_bn_scales_each_groups_output_block(group, bias):
    cin, cout = 6, 4 * group  # W is [6, 4, 3, 3]: group g's outputs are columns 4g … 4g+3
    text = f"""
    g (float[2, {cin}, 4, 4] x, float[{cin}, 4, 3, 3] w{f", float[{cout}] b" if bias else ""},
       float[{cout}] scale, float[{cout}] shift, float[{cout}] mean, float[{cout}] var)
      => (float[2, {cout}, 9, 9] y) {{
        c = ConvTranspose(x, w{", b" if bias else ""}) <group = {group}, strides = [2, 2]>
        y = BatchNormalization(c, scale, shift, mean, var)
    }}"""
    arrays = {"w": _f32(cin, 4, 3, 3, seed=5), **_bn(cout)}
    if bias:
        arrays["b"] = _f32(cout, seed=6)
    _fires(_model(text, **arrays), "ConvTransposeBatchNorm", ["ConvTranspose"])


# -- Gemm / MatMul + BatchNormalization -----------------------------------------------------------

@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_gemm_bn_folds_along_the_output_column(trans_b, bias):
    wshape = "5, 8" if trans_b else "8, 5"
    text = f"""
    g (float[3, 8] a, float[{wshape}] w, float[5] c, float[5] scale, float[5] shift,
       float[5] mean, float[5] var) => (float[3, 5] y) {{
        g = Gemm(a, w{", c" if bias else ""}) <transB = {trans_b}, alpha = 0.5, beta = 0.7>
        y = BatchNormalization(g, scale, shift, mean, var)
    }}"""
    w = _f32(5, 8, seed=5) if trans_b else _f32(8, 5, seed=5)
    arrays = {"w": w, "c": _f32(5, seed=6), **_bn(5)}
    if not bias:
        text = text.replace("float[5] c, ", "")
        del arrays["c"]
    model = _fires(_model(text, **arrays), "GemmBatchNorm", ["Gemm"])
    gemm = model.graph.nodes()[0]
    assert gemm.attr("beta") == 1.0 and gemm.attr("alpha") == 0.5 and gemm.attr("transB") == trans_b


MATMUL_BN = """
g (float[{xshape}] x, float[8, 4] w, float[4] scale, float[4] shift, float[4] mean, float[4] var)
  => (float[{yshape}] y) {{
    m = MatMul(x, w)
    y = BatchNormalization(m, scale, shift, mean, var)
}}"""


def test_matmul_bn_on_a_2d_product_folds():
    proto = _model(MATMUL_BN.format(xshape="3, 8", yshape="3, 4"), w=_f32(8, 4, seed=5), **_bn(4))
    _fires(proto, "MatMulBatchNorm", ["MatMul", "Add"])


def test_matmul_bn_on_a_3d_product_is_refused():
    # [2, 4, 8] × [8, 4] → [2, 4, 4]: BN's axis 1 has 4 channels, like the weight's columns, but
    # it is the sequence axis, not the weight's output axis.
    proto = _model(MATMUL_BN.format(xshape="2, 4, 8", yshape="2, 4, 4"), w=_f32(8, 4), **_bn(4))
    _refuses(proto, "MatMulBatchNorm", "of a rank-3 MatMul")


FLATTENED_BN = """
g (float[2, 5, 8] x, float[8, 4] w, float[4] scale, float[4] shift, float[4] mean,
   float[4] var) => (float[10, 4] y) {{
    m = MatMul(x, w)
    f = Flatten(m) <axis = {axis}>
    y = BatchNormalization(f, scale, shift, mean, var) <epsilon = 0.001>
}}"""


def test_matmul_bn_behind_a_flatten_of_the_tokens_folds():
    # LeViT's Linear + BatchNorm1d: the tokens flattened into the batch, the features normalized.
    proto = _model(FLATTENED_BN.format(axis=2), w=_f32(8, 4, seed=5), **_bn(4))
    _fires(proto, "MatMulFlattenBatchNorm", ["MatMul", "Add", "Flatten"])


def test_matmul_bn_behind_a_flatten_of_the_features_is_refused():
    # Flatten at axis 1 mixes the tokens into the features: BN's axis is no weight column.
    proto = _model(FLATTENED_BN.format(axis=1).replace("=> (float[10, 4] y)",
                                                     "=> (float[2, 20] y)").replace(
        "float[4] scale, float[4] shift, float[4] mean,\n   float[4] var",
        "float[20] scale, float[20] shift, float[20] mean,\n   float[20] var"),
        w=_f32(8, 4, seed=5), **_bn(20))
    _refuses(proto, "MatMulFlattenBatchNorm", "does not keep the MatMul's last axis alone")


RESHAPED_BN = """
g (float[2, 5, 8] x, float[8, 4] w, float[4] scale, float[4] shift, float[4] mean,
   float[4] var) => (float[{rows}, {cols}] y) {{
    m = MatMul(x, w)
    f = Reshape <allowzero = 1> (m, shape)
    y = BatchNormalization(f, scale, shift, mean, var) <epsilon = 0.001>
}}"""


def test_matmul_bn_behind_a_reshape_of_the_tokens_folds():
    # The dynamo exporter writes LeViT's flatten(0, 1) as a Reshape to [10, 4]: none of timm
    # levit_128s's 46 BatchNorms had folded in its dynamo export.
    proto = _model(RESHAPED_BN.format(rows=10, cols=4), w=_f32(8, 4, seed=5),
                   shape=np.array([10, 4]), **_bn(4))
    _fires(proto, "MatMulReshapeBatchNorm", ["MatMul", "Add", "Reshape"])


def test_matmul_bn_behind_a_reshape_that_moves_the_features_is_refused():
    proto = _model(RESHAPED_BN.format(rows=20, cols=2).replace("float[4] scale, float[4] shift, "
                                                               "float[4] mean,\n   float[4] var",
                                                               "float[2] scale, float[2] shift, "
                                                               "float[2] mean,\n   float[2] var"),
                   w=_f32(8, 4, seed=5), shape=np.array([20, 2]), **_bn(2))
    _refuses(proto, "MatMulReshapeBatchNorm", "does not merge the MatMul's leading axes")


# -- Conv + Add / Mul ---------------------------------------------------------------------------

CONV_AFFINE = """
g (float[1, 4, 5, 5] x, float[6, 4, 3, 3] w{bdecl}, float[{cshape}] c) => (float[1, 6, 5, 5] y) {{
    v = Conv(x, w{buse}) <pads = [1, 1, 1, 1]>
    y = {op}({order})
}}"""


def _conv_affine(op, cshape, bias=True, swap=False, **overrides):
    text = CONV_AFFINE.format(bdecl=", float[6] b" if bias else "", buse=", b" if bias else "",
                              cshape=", ".join(map(str, cshape)), op=op,
                              order="c, v" if swap else "v, c")
    arrays = {"w": _f32(6, 4, 3, 3, seed=5), "c": _f32(*cshape, seed=7) + 1.5}
    if bias:
        arrays["b"] = _f32(6, seed=6)
    arrays.update(overrides)
    return _model(text, **{k: v for k, v in arrays.items() if v is not None})


@pytest.mark.parametrize("cshape", [(1, 6, 1, 1), (6, 1, 1), (1,), (1, 1, 1, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_add_goes_into_the_bias(cshape, bias):
    model = _fires(_conv_affine("Add", cshape, bias), "ConvAddBias", ["Conv"])
    assert model.graph.nodes()[0].inputs[1].name == "w"  # the weight is reused, not copied


def test_conv_add_in_either_operand_order():
    _fires(_conv_affine("Add", (1, 6, 1, 1), swap=True), "ConvAddBias", ["Conv"])


@pytest.mark.parametrize("cshape", [(1, 1, 1, 5), (6,), (1, 6, 5, 1), (1, 1, 6, 1, 1)])
def test_conv_add_broadcasting_along_other_axes_is_refused(cshape):
    # (6,) runs along the width axis of the [1, 6, 5, 5] output, not the channel axis; a
    # rank-5 constant would even change the output's rank.
    proto = _conv_affine("Add", cshape, c=_f32(*cshape, seed=7))
    _refuses(proto, "ConvAddBias", "is not [1, 6, 1…]")


def test_conv_add_refuses_a_non_constant_addend():
    _refuses(_conv_affine("Add", (1, 6, 1, 1), c=None), "ConvAddBias", "%c is not a constant")


@pytest.mark.parametrize("cshape", [(1, 6, 1, 1), (6, 1, 1), (1,)])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_mul_scales_weight_and_bias(cshape, bias):
    model = _fires(_conv_affine("Mul", cshape, bias), "ConvMulScale", ["Conv"])
    assert len([v for v in model.graph.nodes()[0].inputs if v is not None]) == (3 if bias else 2)


def test_conv_mul_refuses_non_constant_weight_and_wrong_axis():
    _refuses(_conv_affine("Mul", (1, 6, 1, 1), w=None), "ConvMulScale", "weight %w is not")
    _refuses(_conv_affine("Mul", (1, 1, 5, 1), c=_f32(1, 1, 5, 1)), "ConvMulScale",
             "is not [1, 6, 1…]")


@pytest.mark.parametrize("scale, reason", [
    (np.inf, "is not finite"), (3e38, "would overflow"), (1e-45, "below the normal range")])
def test_scales_that_fold_inexactly_are_refused(scale, reason):
    # An Inf scale made 0·∞ = NaN of a zero weight where the unfused Mul gives ±∞.
    weight = _f32(6, 4, 3, 3, seed=5)
    weight[0, 0, 0, 0] = 0.0
    _refuses(_conv_affine("Mul", (1,), bias=False, w=weight, c=np.array([scale], np.float32)),
             "ConvMulScale", reason)


def test_batch_norm_of_zero_variance_and_epsilon_is_refused():
    # γ/√(var + ε) is infinite.
    text = CONV_BN.replace("<epsilon = 0.001>", "<epsilon = 0.0>").format(
        cin=4, cout=6, cing=4, group=1, bdecl="", buse="")
    _refuses(_model(text, w=_f32(6, 4, 3, 3, seed=5), **{**_bn(6), "var": np.zeros(6, np.float32)}),
             "ConvBatchNorm", "is not finite")


# -- MatMul (+ bias) · per-column constant: LayerScale -----------------------------------------

LAYER_SCALE = """
g (float[{xshape}] x, float[8, 6] w{bdecl}, float[{cshape}] c) => (float[{yshape}] y) {{
    m = MatMul(x, w){badd}
    y = Mul({order})
}}"""


def _layer_scale(cshape, bias=False, xshape=(2, 5, 8), swap=False, **overrides):
    out = "a" if bias else "m"
    bshape = overrides["b"].shape if overrides.get("b") is not None else (6,)
    product = tuple(xshape[:-1]) + (6,)
    yshape = np.broadcast_shapes(product, bshape if bias else (), cshape)
    text = LAYER_SCALE.format(
        xshape=", ".join(map(str, xshape)), cshape=", ".join(map(str, cshape)),
        yshape=", ".join(map(str, yshape)),
        bdecl=f", float[{', '.join(map(str, bshape))}] b" if bias else "",
        badd="\n    a = Add(m, b)" if bias else "", order=f"c, {out}" if swap else f"{out}, c")
    arrays = {"w": _f32(8, 6, seed=5), "c": _f32(*cshape, seed=7)}
    if bias:
        arrays["b"] = _f32(6, seed=6)
    arrays.update(overrides)
    return _model(text, **{k: v for k, v in arrays.items() if v is not None})


@pytest.mark.parametrize("cshape", [(6,), (1, 6), (1, 1, 6)])
@pytest.mark.parametrize("swap", [False, True])
def test_a_layer_scale_after_a_matmul_goes_into_its_weight(cshape, swap):
    # ConvNeXt's (x·W + b)·γ kept one Mul per block at every level (1.04-1.07x the original's
    # time as an .om on a TorchScript export, where onnxruntime's layout work hid it).
    _fires(_layer_scale(cshape, swap=swap), "MatMulMulScale", ["MatMul"])
    model = _fires(_layer_scale(cshape, bias=True, swap=swap), "MatMulAddMulScale",
                   ["MatMul", "Add"])
    assert {v.name for n in model.graph for v in n.inputs if v is not None} >= {"w_fused", "w_b"}


def test_a_layer_scale_on_a_vector_input_and_a_bias_of_higher_rank():
    _fires(_layer_scale((6,), xshape=(8,)), "MatMulMulScale", ["MatMul"])
    # b·c keeps the axes a bias brings: (m + b[3,1,6])·c = m·(W·c) + b·c.
    proto = _layer_scale((6,), bias=True, xshape=(5, 8), b=_f32(3, 1, 6, seed=6))
    _fires(proto, "MatMulAddMulScale", ["MatMul", "Add"])


@pytest.mark.parametrize("cshape, reason", [
    ((1,), "is a scalar, not a scale per column"),
    ((5, 1), "does not scale the product's 6 columns alone"),
    ((1, 1, 1, 6), "has more axes than the rank-3 product")])
def test_a_mul_that_is_no_layer_scale_stays(cshape, reason):
    _refuses(_layer_scale(cshape), "MatMulMulScale", reason)


def test_a_layer_scale_of_a_computed_weight_or_scale_stays():
    _refuses(_layer_scale((6,), w=None), "MatMulMulScale", "weight %w is not a constant")
    _refuses(_layer_scale((6,), c=None), "MatMulMulScale", "%c is not a constant")
    _refuses(_layer_scale((6,), bias=True, b=None), "MatMulAddMulScale", "bias %b is not")
    _refuses(_layer_scale((6,), c=np.full(6, np.inf, np.float32)), "MatMulMulScale",
             "is not finite")


def _fp16_layer_scale(gamma: float) -> onnx.ModelProto:
    """A float16 Linear times a LayerScale γ, ConvNeXt's (its initial γ is 1e-6)."""
    rng = np.random.default_rng(1)
    return _model("""
        g (float16[4, 64] x, float16[64, 32] w, float16[32] b, float16[32] c) => (float16[4, 32] y) {
            m = MatMul(x, w)
            a = Add(m, b)
            y = Mul(a, c)
        }""", w=(0.02 * rng.standard_normal((64, 32))).astype(np.float16),
        b=(0.02 * rng.standard_normal(32)).astype(np.float16), c=np.full(32, gamma, np.float16))


def test_a_layer_scale_that_would_sink_float16_weights_stays():
    # W·γ in float16 flushed to 0 or kept a few bits: 0.79 off at γ = 1e-6 where the unfused
    # (x·W)·γ is 6e-3 off; float32 weights a later --precision fp16 converts alike.
    _refuses(_fp16_layer_scale(1e-6), "MatMulAddMulScale",
             "a column of the scaled weights would fall below float16's normal range")
    _fires(_fp16_layer_scale(0.5), "MatMulAddMulScale", ["MatMul", "Add"])
    proto = _layer_scale((6,), c=np.full(6, 1e-6, np.float32))
    _fires(proto, "MatMulMulScale", ["MatMul"])  # float32 keeps such weights normal
    model = load_onnx(proto)
    infer_shapes(model)
    for options in (Options(precision="fp16"), Options(precision="mixed-fp16")):
        result = conv_bn.FuseConvBatchNorm().run(model, PassContext(options))
        assert not result.changed, options.precision


def test_a_layer_scale_stays_in_an_int8_compile_for_an_npu():
    # The NPU's int8 MatMul weight takes one scale per tensor (AMCT), which a per-column γ
    # spanning decades coarsens: 0.035 → 1.02 mean error on the small-γ columns.
    from graphopt.partition.target import load_target

    model = load_onnx(_layer_scale((6,)))
    infer_shapes(model)
    ctx = PassContext(Options(quantize="int8"), target=load_target("ascend310"))
    assert not conv_bn.FuseConvBatchNorm().run(model, ctx).changed
    ctx = PassContext(Options(quantize="int8"), target=load_target("cpu"))
    assert dict(conv_bn.FuseConvBatchNorm().run(model, ctx).stats) == {"MatMulMulScale": 1}


# -- Pad into Conv / AveragePool ----------------------------------------------------------------

PAD_INTO = """
g (float[1, 3, 6, 6] x{wdecl}, int64[{npads}] pads, float fill{axes_decl})
  => (float[1, {cout}, ?, ?] y) {{
    p = Pad(x, pads, fill{axes_use}) <mode = "{mode}">
    y = {consumer}
}}"""
CONV = "Conv(p, w) <pads = [1, 0, 0, 1], strides = [2, 1]>"
AVG = "AveragePool(p) <kernel_shape = [3, 3], count_include_pad = {cip}, pads = [0, 1, 1, 0]>"


def _pad_into(consumer, pads=(0, 0, 1, 2, 0, 0, 2, 1), fill=0.0, axes=None, mode="constant",
              cout=4, **overrides):
    text = PAD_INTO.format(npads=len(pads), axes_decl=", int64[2] axes" if axes else "",
                           axes_use=", axes" if axes else "", mode=mode, consumer=consumer,
                           cout=cout, wdecl=", float[4, 3, 3, 3] w" if "Conv" in consumer else "")
    arrays = {"pads": np.array(pads, np.int64), "fill": np.array(fill, np.float32)}
    if "Conv" in consumer:
        arrays["w"] = _f32(4, 3, 3, 3, seed=5)
    if axes:
        arrays["axes"] = np.array(axes, np.int64)
    arrays.update(overrides)
    return _model(text, **arrays)


def test_pad_folds_into_conv_pads():
    proto = _pad_into(CONV)
    assert _printed_nodes(load_onnx(proto)) == [
        "%p<?> = Pad(%x, %pads, %fill) {mode='constant'}",
        "%y<f32[1,4,?,?]> = Conv(%p, %w) {pads=[1,0,0,1], strides=[2,1]}"]
    model = _fires(proto, "PadConv", ["Conv"])
    assert _printed_nodes(model) == ["%y<f32[1,4,4,8]> = Conv(%x, %w) {pads=[2,2,2,2], strides=[2,1]}"]


def test_pad_with_axes_input_folds_into_conv_pads():
    model = _fires(_pad_into(CONV, pads=(1, 0, 1, 3), axes=(-2, 3)), "PadConv", ["Conv"])
    assert model.graph.nodes()[0].attr("pads") == [2, 0, 1, 4]


@pytest.mark.parametrize("kwargs,reason", [
    ({"fill": 1.0}, "Pad value is 1.0, not 0"),
    ({"fill": -0.0}, "Pad value is -0.0, not 0"),  # Conv pads with +0.0
    ({"pads": (0, 1, 0, 0, 0, 1, 0, 0)}, "batch or channel axis"),
    ({"pads": (0, 0, -1, 0, 0, 0, 0, 0)}, "crops"),
    ({"mode": "reflect"}, "not constant"),
])
def test_pad_into_conv_refusals(kwargs, reason):
    _refuses(_pad_into(CONV, **kwargs), "PadConv", reason)


def test_pad_folds_into_average_pool_counting_pads():
    proto = _pad_into(AVG.format(cip=1), pads=(0, 0, 1, 0, 0, 0, 1, 1), cout=3)
    model = _fires(proto, "PadAveragePool", ["AveragePool"])
    assert model.graph.nodes()[0].attr("pads") == [1, 1, 2, 1]


def test_pad_not_folded_into_average_pool_excluding_its_own_pads():
    _refuses(_pad_into(AVG.format(cip=0), cout=3), "PadAveragePool",
             "without counting those pads (count_include_pad=0)")


def test_pad_folds_into_an_unpadded_average_pool_which_then_counts_pads():
    # Old exports pad explicitly before a count_include_pad=0 pool with no pads of its own:
    # the Pad's zeros count, and so do the pool's pads once it takes them.
    unpadded = "AveragePool(p) <kernel_shape = [3, 3], count_include_pad = 0>"
    model = _fires(_pad_into(unpadded, pads=(0, 0, 1, 0, 0, 0, 1, 1), cout=3),
                   "PadAveragePool", ["AveragePool"])
    pool = model.graph.nodes()[0]
    assert pool.attr("pads") == [1, 0, 1, 1] and pool.attr("count_include_pad") == 1


def test_pad_not_folded_into_average_pool_when_pads_would_reach_the_kernel():
    _refuses(_pad_into(AVG.format(cip=1), cout=3), "PadAveragePool", "pad < kernel")


def test_a_zero_pad_is_not_folded_into_max_pool():
    # MaxPool's own padding is −∞: a zero Pad changes every window that sees it.
    _refuses(_pad_into("MaxPool(p) <kernel_shape = [3, 3]>", cout=3), "PadMaxPool",
             "Pad value is 0.0, not -inf")


def test_a_minus_inf_pad_folds_into_max_pool():
    # timm's MaxPool2dSame: F.pad(x, …, value=-inf) and a MaxPool without padding.
    proto = _pad_into("MaxPool(p) <kernel_shape = [3, 3], strides = [2, 2]>", cout=3,
                      pads=(0, 0, 0, 1, 0, 0, 1, 1), fill=-np.inf)
    model = _fires(proto, "PadMaxPool", ["MaxPool"])
    assert model.graph.nodes()[0].attr("pads") == [0, 1, 1, 1]


@pytest.mark.parametrize("pool, reason", [
    ("MaxPool(p) <kernel_shape = [3, 3], ceil_mode = 1>", "ceil_mode"),
    ("MaxPool(p) <kernel_shape = [3, 3], dilations = [2, 2]>", "dilations"),
    ("MaxPool(p) <kernel_shape = [2, 2]>", "pad < kernel")])
def test_a_minus_inf_pad_stays_before_a_max_pool_it_would_change(pool, reason):
    _refuses(_pad_into(pool, cout=3, pads=(0, 0, 2, 1, 0, 0, 1, 2), fill=-np.inf), "PadMaxPool",
             reason)


# -- realistic nets -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,options", [
    ("resnet50", {"blocks": (1, 1, 1, 1), "width": 0.125, "image_size": 32, "num_classes": 10}),
    ("mobilenetv2", {"width": 0.25, "image_size": 32, "num_classes": 10}),
])
def test_zoo_nets_lose_every_batch_norm(name, options):
    proto = zoo.build(name, **options)
    # Without this pass, whether or not the pipelines run it by now.
    model = graphopt.optimize(proto, disable_passes=["FuseConvBatchNorm"]).model
    bns = sum(n.op_type == "BatchNormalization" for n in model.graph)
    assert bns > 0
    stats = conv_bn.FuseConvBatchNorm().run(model, PassContext(Options())).stats
    assert stats["ConvBatchNorm"] == bns
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.all_nodes())
    feeds = zoo.sample_inputs(proto, dims={"batch_size": 2})
    after = to_onnx(model)
    onnx.checker.check_model(after)
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(after, feeds),
                                rtol=1e-4, atol=1e-4)
    assert not problems, [str(p) for p in problems]


def test_float16_weights_fold_however_small():
    # float16 rounds coarser than its subnormals lose: a small first-layer weight scaled below
    # 6.1e-5 had refused the whole fold.
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((6, 4, 3, 3)) * 0.1).astype(np.float16)
    weight[0, 0, 0, 1] = np.float16(2e-4)
    text = CONV_BN.replace("float[", "float16[").format(
        cin=4, cout=6, cing=4, group=1, bdecl="", buse="")
    bn = {k: v.astype(np.float16) for k, v in _bn(6).items()}
    bn["var"] = rng.uniform(4, 9, 6).astype(np.float16)  # scales of 0.3 to 0.5
    model, result, _ = _fuse(_model(text, w=weight, **bn))
    assert dict(result.stats) == {"ConvBatchNorm": 1} and _ops(model) == ["Conv"]


# -- a crop within the Conv's own padding (a TCN's causal chomp) -----------------------------

def _cropped_conv(length="T", slice_args="zero, minus4, last",
                  attrs="pads = [4, 4], dilations = [2]", kernel=3):
    """Conv1d padded on both sides, then `y[..., :-4]`, as a temporal convolutional network
    chomps its causal convs; `slice_args`: starts, ends, axes (and steps) by name."""
    return _model(f"""
g (float[2, 3, {length}] x) => (float[2, 4, ?] y) {{
  c = Conv <{attrs}> (x, w, b)
  s = Slice({slice_args})
  y = Relu(s)
}}""".replace("Slice(", "Slice(c, "), w=_f32(4, 3, kernel), b=_f32(4, seed=2),
        zero=np.array([0], np.int64), one=np.array([1], np.int64),
        minus4=np.array([-4], np.int64), minus5=np.array([-5], np.int64),
        big=np.array([2 ** 62], np.int64), last=np.array([-1], np.int64),
        chan=np.array([1], np.int64), two=np.array([2], np.int64))


@pytest.mark.parametrize("length", ["T", "16"])
def test_a_causal_chomp_becomes_padding_on_one_side(length):
    proto = _cropped_conv(length)
    model, result, _ = _fuse(proto)
    assert result.stats == {"ConvCropPads": 1} and _ops(model) == ["Conv", "Relu"]
    assert list(model.graph)[0].attr("pads") == [4, 0]
    feeds = {"x": _f32(2, 3, 16, seed=5)}
    np.testing.assert_allclose(numerics.run(to_onnx(model), feeds)["y"],
                               numerics.run(proto, feeds)["y"], rtol=0, atol=0)


def test_a_crop_of_both_ends_takes_from_both_pads():
    proto = _cropped_conv("16", "one, big, last")  # x[..., 1:]: one column less in front
    model, result, _ = _fuse(proto)
    assert list(model.graph)[0].attr("pads") == [3, 4]
    _same_numerics(proto, model)


@pytest.mark.parametrize("slice_args, attrs, why", [
    ("zero, minus5, last", "pads = [4, 4], dilations = [2]", "crops past the Conv's padding"),
    ("zero, minus4, last", "pads = [4, 4], strides = [2]", "strides along a cropped axis"),
    ("zero, one, chan", "pads = [4, 4], dilations = [2]", "cuts the batch or the channels"),
    ("zero, minus4, last, two", "pads = [4, 4], dilations = [2]", "or steps"),
    ("minus4, big, last", "pads = [4, 4], dilations = [2]", "starts from the end"),
    ("zero, minus4, last", "pads = [4, 4]", "could fail where the Slice returns nothing")])
def test_crops_that_do_not_fold_stay(slice_args, attrs, why):
    # (the last: kernel 9 undilated, padding 4 + 0 < its span of 8, at an open length)
    proto = _cropped_conv("T", slice_args, attrs, kernel=9 if "dilations" not in attrs else 3)
    model, result, report = _fuse(proto, trace="ConvCropPads")
    assert "ConvCropPads" not in result.stats
    assert any(why in line for line in report), report


@pytest.mark.parametrize("level", [1, 2])
def test_a_float16_pair_left_unfolded_stays_so_in_the_oms_session(level, tmp_path):
    # FuseConvBatchNorm declines a float16 fold whose weights would pass 65504 (and -O1 folds
    # none), but the .om's session at "all" ran onnxruntime's ConvBNFusion, which folds in
    # float16: every output NaN, where the unfolded pair gives values up to 185.
    from onnx import TensorProto, helper

    from graphopt.codegen import OmSession

    rng = np.random.default_rng(1)
    channels = 4
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["bn"],
                          epsilon=1e-5),
         helper.make_node("Mul", ["bn", "small"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, channels, 8, 8])],
        [numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 50)
                                 .astype(np.float16), "W"),
         numpy_helper.from_array(np.full(channels, 2000.0, np.float16), "g"),
         numpy_helper.from_array(np.zeros(channels, np.float16), "b"),
         numpy_helper.from_array(np.zeros(channels, np.float16), "mu"),
         numpy_helper.from_array(np.full(channels, 0.5, np.float16), "var"),
         numpy_helper.from_array(np.array(1e-4, np.float16), "small")]),
        opset_imports=[helper.make_opsetid("", 17)])
    result = graphopt.optimize(proto, level=level)
    graphopt.save(result, tmp_path / "m.om")
    x = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float16)}
    expected = numerics.run(proto, x)["y"].astype(np.float32)
    actual = OmSession(tmp_path / "m.om").run(x)["y"].astype(np.float32)
    assert np.isfinite(expected).all() and np.isfinite(actual).all()
    np.testing.assert_allclose(actual, expected, rtol=2e-3, atol=2e-3 * np.abs(expected).max())


@pytest.mark.parametrize("joined", [False, True])
def test_a_batchnorm_declaring_its_training_outputs_is_not_folded(joined):
    # An old train-mode PyTorch export: BatchNormalization-9 with all five outputs, which
    # onnxruntime runs in training mode (the batch's own statistics) by their count. Folded
    # with the running statistics, the compile had been 2.2 off at -O2.
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    convs = [helper.make_node("Conv", ["x", "w"], ["c"])]
    if joined:
        convs += [helper.make_node("Conv", ["x", "w2"], ["c2"]),
                  helper.make_node("Concat", ["c", "c2"], ["j"], axis=1)]
    width = 8 if joined else 4
    nodes = convs + [
        helper.make_node("BatchNormalization", ["j" if joined else "c", "g", "be", "m", "v"],
                         ["bn", "rm", "rv", "sm", "sv"]),
        helper.make_node("Relu", ["bn"], ["y"])]
    weights = {"w": rng.standard_normal((4, 3, 1, 1)), "w2": rng.standard_normal((4, 3, 1, 1)),
               "g": rng.standard_normal(width), "be": rng.standard_normal(width),
               "m": rng.standard_normal(width), "v": np.abs(rng.standard_normal(width)) + 0.5}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, width, 4, 4])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()
         if joined or n != "w2"])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)
    x = {"x": rng.standard_normal((2, 3, 4, 4)).astype(np.float32)}
    expected = numerics.run(proto, x)["y"]
    for level in (2, 3):
        out = graphopt.optimize(proto, level=level).to_onnx()
        assert "BatchNormalization" in [n.op_type for n in out.graph.node]
        np.testing.assert_allclose(numerics.run(out, x)["y"], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("group", [1, 2])
def test_a_conv_transposes_bias_add_goes_into_its_bias(bias, group):
    # jax2onnx writes Flax's ConvTranspose without its bias, then adds it.
    text = f"""
g (float[1, 4, 5, 5] x, float[4, {6 // group}, 3, 3] w{", float[6] b" if bias else ""},
   float[1, 6, 1, 1] c) => (float[1, 6, 9, 9] y) {{
    v = ConvTranspose <strides = [2, 2], pads = [1, 1, 1, 1], group = {group}> (x, w{", b" if bias else ""})
    y = Add(v, c)
}}"""
    arrays = {"w": _f32(4, 6 // group, 3, 3, seed=5), "c": _f32(1, 6, 1, 1, seed=7)}
    if bias:
        arrays["b"] = _f32(6, seed=6)
    _fires(_model(text, **arrays), "ConvTransposeAddBias", ["ConvTranspose"])
