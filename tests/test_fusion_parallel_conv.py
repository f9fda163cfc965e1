"""MergeParallelConvs: added Conv branches over one input (and an identity or BatchNorm of it)
become one Conv; each rule's firing, refusals and numerics, then a RepVGG-style net end to end.

Tolerance: rtol 1e-4, atol 1e-5 in float32: the merged conv sums the branches' products in one
accumulation instead of adding two rounded results, which moves the last bits (seen: ≤ 2e-6
on unit-scale data); a misplaced tap or a lost bias moves outputs by > 1e-1.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt import numerics, to_onnx
from graphopt.ir import load_onnx
from graphopt.passes import Options, PassContext
from graphopt.passes.fusion import parallel_conv
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.rules import Tracer

RTOL, ATOL = 1e-4, 1e-5


def _f32(*shape, seed=0, low=None, high=None):
    rng = np.random.default_rng(seed)
    data = rng.uniform(low, high, shape) if low is not None else rng.standard_normal(shape)
    return data.astype(np.float32)


def _model(text: str, **arrays: np.ndarray) -> onnx.ModelProto:
    """Parse `text`, the graph inputs named in `arrays` made initializers; checked."""
    proto = parse_model(text, **arrays)
    onnx.checker.check_model(proto)
    return proto


def _merge(proto: onnx.ModelProto, trace: str | None = None):
    """The IR model after InferShapes and the pass (to a fixed point), its stats, the trace."""
    model = load_onnx(proto)
    infer_shapes(model)
    tracer = Tracer({trace}) if trace else None
    stats: dict[str, int] = {}
    while True:
        result = parallel_conv.MergeParallelConvs().run(model, PassContext(Options(),
                                                                           tracer=tracer))
        for rule, n in result.stats.items():
            stats[rule] = stats.get(rule, 0) + n
        if not result.changed:
            break
    return model, stats, tracer.report() if tracer else []


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph]


def _same_numerics(proto: onnx.ModelProto, model) -> None:
    after = to_onnx(model)
    onnx.checker.check_model(after, full_check=True)
    feeds = numerics.random_feeds(proto, seed=0)
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(after, feeds), RTOL,
                                ATOL)
    assert not problems, [str(p) for p in problems]


def _bn(c: int, seed: int = 1) -> dict[str, np.ndarray]:
    return {"scale": 1 + 0.2 * _f32(c, seed=seed), "shift": 0.1 * _f32(c, seed=seed + 1),
            "mean": 0.1 * _f32(c, seed=seed + 2), "var": _f32(c, seed=seed + 3, low=0.5, high=1.5)}


REPVGG = """
g (float[1, 8, 10, 12] x) => (float[1, 8, 10, 12] y) {
    a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, w3, b3)
    b = Conv <kernel_shape = [1, 1]> (x, w1, b1)
    s = Add(a, b)
    n = BatchNormalization (x, scale, shift, mean, var)
    t = Add(s, n)
    y = Relu(t)
}"""


def _repvgg(**override):
    arrays = {"w3": _f32(8, 8, 3, 3, seed=1), "b3": _f32(8, seed=2),
              "w1": _f32(8, 8, 1, 1, seed=3), "b1": _f32(8, seed=4), **_bn(8)}
    arrays.update(override)
    return _model(REPVGG, **arrays)


def test_repvgg_block_becomes_one_conv():
    proto = _repvgg()
    model, stats, _ = _merge(proto)
    assert stats == {"ParallelConvs": 1, "ConvPlusIdentity": 1}
    assert _ops(model) == ["Conv", "Relu"]
    conv = next(iter(model.graph))
    assert conv.attr("kernel_shape") == [3, 3] and conv.attr("pads") == [1, 1, 1, 1]
    _same_numerics(proto, model)


@pytest.mark.parametrize("case, body, arrays, merges", [
    # Stride 2: the 1×1 reads each output's centre tap, as the 3×3 padded by 1 does.
    ("stride", """
     g (float[1, 4, 9, 11] x) => (float[1, 6, 5, 6] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]> (x, w3)
         b = Conv <kernel_shape = [1, 1], strides = [2, 2]> (x, w1, b1)
         y = Add(b, a)
     }""", {"w3": _f32(6, 4, 3, 3, seed=1), "w1": _f32(6, 4, 1, 1, seed=2),
            "b1": _f32(6, seed=3)}, {"ParallelConvs": 1}),
    # MobileOne: depthwise k×k and 1×1 branches and a BatchNorm identity.
    ("depthwise", """
     g (float[1, 6, 7, 7] x) => (float[1, 6, 7, 7] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 6> (x, w3, b3)
         c = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 6> (x, w3b, b3)
         b = Conv <kernel_shape = [1, 1], group = 6> (x, w1)
         s = Add(a, c)
         u = Add(s, b)
         n = BatchNormalization (x, scale, shift, mean, var)
         y = Add(n, u)
     }""", {"w3": _f32(6, 1, 3, 3, seed=1), "w3b": _f32(6, 1, 3, 3, seed=5),
            "b3": _f32(6, seed=2), "w1": _f32(6, 1, 1, 1, seed=3), **_bn(6)},
     {"ParallelConvs": 2, "ConvPlusIdentity": 1}),
    # Grouped (2 groups of 3 channels) with a bare identity.
    ("grouped identity", """
     g (float[1, 6, 5, 5] x) => (float[1, 6, 5, 5] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], group = 2> (x, w3, b3)
         y = Add(x, a)
     }""", {"w3": _f32(6, 3, 3, 3, seed=1), "b3": _f32(6, seed=2)}, {"ConvPlusIdentity": 1}),
    # Dilation 2: the 1×1 sits at the dilated 3×3's centre tap (pad 2 = one tap of 2).
    ("dilated", """
     g (float[1, 4, 9, 9] x) => (float[1, 5, 9, 9] y) {
         a = Conv <kernel_shape = [3, 3], pads = [2, 2, 2, 2], dilations = [2, 2]> (x, w3)
         b = Conv <kernel_shape = [1, 1], dilations = [2, 2]> (x, w1)
         y = Add(a, b)
     }""", {"w3": _f32(5, 4, 3, 3, seed=1), "w1": _f32(5, 4, 1, 1, seed=2)},
     {"ParallelConvs": 1}),
    # Padded at the end only: the 1×1 is the 2×2's first tap.
    ("asymmetric pads", """
     g (float[1, 3, 6, 6] x) => (float[1, 4, 6, 6] y) {
         a = Conv <kernel_shape = [2, 2], pads = [0, 0, 1, 1]> (x, w2)
         b = Conv <kernel_shape = [1, 1]> (x, w1)
         y = Add(a, b)
     }""", {"w2": _f32(4, 3, 2, 2, seed=1), "w1": _f32(4, 3, 1, 1, seed=2)},
     {"ParallelConvs": 1}),
    # 1-D convs: Conv1d branches (a TDNN's).
    ("1-D", """
     g (float[1, 4, 16] x) => (float[1, 4, 16] y) {
         a = Conv <kernel_shape = [5], pads = [2, 2]> (x, w5, b5)
         b = Conv <kernel_shape = [3], pads = [1, 1]> (x, w3)
         y = Add(a, b)
     }""", {"w5": _f32(4, 4, 5, seed=1), "b5": _f32(4, seed=2), "w3": _f32(4, 4, 3, seed=3)},
     {"ParallelConvs": 1}),
])
def test_branches_merge(case, body, arrays, merges):
    proto = _model(body, **arrays)
    model, stats, _ = _merge(proto)
    assert stats == merges, case
    assert _ops(model) == ["Conv"], case
    _same_numerics(proto, model)


@pytest.mark.parametrize("case, body, arrays, reason", [
    # 1×3 + 3×1 (ACNet) would be a 3×3: more work than both branches.
    ("kernel grows", """
     g (float[1, 3, 6, 6] x) => (float[1, 4, 6, 6] y) {
         a = Conv <kernel_shape = [1, 3], pads = [0, 1, 0, 1]> (x, wa)
         b = Conv <kernel_shape = [3, 1], pads = [1, 0, 1, 0]> (x, wb)
         y = Add(a, b)
     }""", {"wa": _f32(4, 3, 1, 3, seed=1), "wb": _f32(4, 3, 3, 1, seed=2)},
     "the merged 3×3 kernel is larger than either branch's"),
    # Equal kernels, shifted by a pad: together they would span 4 taps.
    ("shifted", """
     g (float[1, 3, 6, 6] x) => (float[1, 4, 6, 6] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, wa)
         b = Conv <kernel_shape = [3, 3], pads = [2, 2, 0, 0]> (x, wb)
         y = Add(a, b)
     }""", {"wa": _f32(4, 3, 3, 3, seed=1), "wb": _f32(4, 3, 3, 3, seed=2)},
     "one kernel does not fit inside the other"),
    # Same output size, other taps: a 3×3 and a 3×3 dilated by 2.
    ("dilations differ", """
     g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, wa)
         b = Conv <kernel_shape = [3, 3], pads = [2, 2, 2, 2], dilations = [2, 2]> (x, wb)
         y = Add(a, b)
     }""", {"wa": _f32(4, 3, 3, 3, seed=1), "wb": _f32(4, 3, 3, 3, seed=2)},
     "differ in strides, dilations, group or channels"),
    ("a branch through a pool", """
     g (float[1, 3, 8, 8] x) => (float[1, 4, 4, 4] y) {
         a = Conv <kernel_shape = [2, 2], strides = [2, 2]> (x, wa)
         b = Conv <kernel_shape = [1, 1], strides = [2, 2]> (x, wb)
         c = MaxPool <kernel_shape = [1, 1]> (b)
         y = Add(a, c)
     }""", {"wa": _f32(4, 3, 2, 2, seed=1), "wb": _f32(4, 3, 1, 1, seed=2)},
     "are not two Convs of one input"),
    # A 1-channel conv broadcast over x's 4 channels: x is no conv with the Conv's channels.
    ("broadcast identity", """
     g (float[1, 4, 5, 5] x) => (float[1, 4, 5, 5] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, w)
         y = Add(a, x)
     }""", {"w": _f32(1, 4, 3, 3, seed=1)}, "changes the channel count"),
    ("different inputs", """
     g (float[1, 3, 6, 6] x, float[1, 3, 6, 6] z) => (float[1, 4, 6, 6] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, wa)
         b = Conv <kernel_shape = [1, 1]> (z, wb)
         y = Add(a, b)
     }""", {"wa": _f32(4, 3, 3, 3, seed=1), "wb": _f32(4, 3, 1, 1, seed=2)},
     "are not two Convs of one input"),
    ("branch read elsewhere", """
     g (float[1, 3, 6, 6] x) => (float[1, 4, 6, 6] y, float[1, 4, 6, 6] b) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, wa)
         b = Conv <kernel_shape = [1, 1]> (x, wb)
         y = Add(a, b)
     }""", {"wa": _f32(4, 3, 3, 3, seed=1), "wb": _f32(4, 3, 1, 1, seed=2)},
     "are not two Convs of one input"),
    ("overflow", """
     g (float[1, 2, 4, 4] x) => (float[1, 2, 4, 4] y) {
         a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, wa)
         b = Conv <kernel_shape = [1, 1]> (x, wb)
         y = Add(a, b)
     }""", {"wa": np.full((2, 2, 3, 3), 3e38, np.float32),
            "wb": np.full((2, 2, 1, 1), 3e38, np.float32)}, "may not be finite"),
])
def test_branches_that_cannot_merge_stay(case, body, arrays, reason):
    proto = _model(body, **arrays)
    rule = "ConvPlusIdentity" if "identity" in case else "ParallelConvs"
    model, stats, report = _merge(proto, trace=rule)
    assert stats == {}, case
    assert any(reason in line for line in report), report


def test_training_mode_batchnorm_identity_stays():
    body = REPVGG.replace("BatchNormalization (x,", "BatchNormalization <training_mode = 1> (x,")
    body = body.replace("n = BatchNormalization", "n, rm, rv = BatchNormalization")
    arrays = {"w3": _f32(8, 8, 3, 3, seed=1), "b3": _f32(8, seed=2),
              "w1": _f32(8, 8, 1, 1, seed=3), "b1": _f32(8, seed=4), **_bn(8)}
    model, stats, _ = _merge(_model(body, **arrays))
    assert stats == {"ParallelConvs": 1}


def test_repvgg_net_compiles_to_one_conv_per_block():
    """Four RepVGG blocks (a stride-2 one without identity, three with) at -O2 and on an NPU
    target: one Conv and one Relu each, outputs unchanged."""
    lines, arrays, c_in, prev = [], {}, 3, "x"
    for i, (c, stride) in enumerate([(8, 2), (8, 1), (8, 1), (16, 2)]):
        scale = np.float32(1 / np.sqrt(9 * c_in))  # keeps the activations near unit scale
        arrays.update({f"w3_{i}": scale * _f32(c, c_in, 3, 3, seed=10 * i),
                       f"w1_{i}": scale * _f32(c, c_in, 1, 1, seed=10 * i + 1),
                       f"b_{i}": _f32(c, seed=10 * i + 2)})
        lines += [f"a{i} = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1], "
                  f"strides = [{stride}, {stride}]> ({prev}, w3_{i}, b_{i})",
                  f"b{i} = Conv <kernel_shape = [1, 1], strides = [{stride}, {stride}]> "
                  f"({prev}, w1_{i}, b_{i})",
                  f"s{i} = Add(a{i}, b{i})"]
        last = f"s{i}"
        if stride == 1 and c == c_in:
            arrays.update({f"{k}_{i}": v for k, v in _bn(c, seed=10 * i + 3).items()})
            lines += [f"n{i} = BatchNormalization ({prev}, scale_{i}, shift_{i}, mean_{i}, "
                      f"var_{i})", f"t{i} = Add(s{i}, n{i})"]
            last = f"t{i}"
        lines.append(f"r{i} = Relu({last})")
        prev, c_in = f"r{i}", c
    lines[-1] = lines[-1].replace("r3 =", "y =")
    body = "g (float[1, 3, 32, 32] x) => (float[1, 16, 8, 8] y) {\n" + "\n".join(lines) + "\n}"
    proto = _model(body, **arrays)
    feeds = numerics.random_feeds(proto, seed=0)
    expected = numerics.run(proto, feeds)
    for target in ("cpu", "ascend310"):
        result = graphopt.optimize(proto, target=target)
        ops = [n.op_type for n in result.model.graph]
        assert ops.count("BatchNormalization") == 0 and ops.count("Add") == 0, (target, ops)
        assert sum(op.endswith("Conv") for op in ops) == 4, (target, ops)
        out = result.to_onnx()
        onnx.checker.check_model(out)
        assert not numerics.compare(expected, numerics.run(out, feeds), RTOL, ATOL), target
