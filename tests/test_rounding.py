"""The rounding allowances of --verify and compare judge a detector's output slice by slice
along axis 1: class scores (up to 0.006) beside box coordinates (up to 545) are held to their
own scale, so an error the coordinates' rounding would excuse is not excused on the scores. An
output the original computes in 16-bit floats is judged at that type's precision."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

from graphopt import numerics, rounding

JUDGE = {"rtol": 1e-4, "atol": 1e-5, "min_cosine": None}


def _detections() -> np.ndarray:
    """[1, 12, 525]: 4 box coordinates up to 545, then 8 class scores up to 0.006."""
    rng = np.random.default_rng(0)
    out = np.empty((1, 12, 525), np.float32)
    out[0, :4] = rng.uniform(0, 545, (4, 525))
    out[0, 4:] = rng.uniform(0, 0.006, (8, 525))
    out[0, 0, 7] = 0.01  # a coordinate near 0, from terms of hundreds
    return out


def test_the_scale_allowance_takes_each_slice_at_its_own_scale():
    expected = _detections()
    rounded = expected.copy()
    rounded[0, 0, 7] += 0.0166  # a reordered sum's rounding on the coordinate near 0
    assert rounding._rounding_at_scale(expected, rounded, JUDGE) == pytest.approx(
        (0.0166, float(expected.max())), rel=1e-3)
    corrupted = rounded.copy()
    corrupted[0, 9, 100] += 0.05  # a score: 8x its slice's largest value
    assert rounding._rounding_at_scale(expected, corrupted, JUDGE) is None
    # Rank 2 has no slices: the whole tensor's scale, as before.
    assert rounding._rounding_at_scale(expected[0], corrupted[0], JUDGE) is not None


@pytest.mark.parametrize("shifted, excused", [("coordinates", True), ("scores", False)])
def test_onnxruntimes_own_rounding_excuses_only_the_slices_it_moves(monkeypatch, shifted,
                                                                     excused):
    expected = _detections()
    own = expected.copy()
    own[0, :4] += 0.0027  # onnxruntime's optimizer moves the coordinates, not the scores
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: {"y": own})
    actual = expected.copy()
    if shifted == "coordinates":
        actual[0, :4] += 0.004  # within twice onnxruntime's own
    else:
        actual[0, 4:] += 0.005  # every score: under 2 x 0.0027, but at 1x the scores' scale
    note = rounding._within_onnxruntimes_own(_own_outputs, {"y": expected}, {"y": actual}, ["y"],
                                             JUDGE)
    assert (note is not None) == excused


def _own_outputs() -> dict:
    """The original at ORT_ENABLE_ALL, as within_rounding runs it (the tests stub the run)."""
    return rounding.numerics.run(None, {}, "all")


def _own_run(monkeypatch, own: np.ndarray, original: np.ndarray | None = None) -> None:
    """Runs at ORT_ENABLE_ALL give `own`; others (the original run again, to see that it
    reproduces itself) `original`, or `own` too."""
    base = own if original is None else original
    monkeypatch.setattr(rounding.numerics, "run",
                        lambda model, feeds, level="disable", **kwargs:
                        {"y": own if level == "all" else base})


def test_a_slice_near_zero_excuses_no_other_slice(monkeypatch):
    # Channel 0 holds values near 0 that onnxruntime's own optimizer moves by half their size
    # (a Conv + BatchNorm cancelling 1e4): that excuses its own error, not 10% on channel 1.
    rng = np.random.default_rng(1)
    expected = np.stack([rng.uniform(-1e-3, 1e-3, (9, 9)), rng.uniform(-18, 18, (9, 9))])[None]
    expected = expected.astype(np.float32)
    own = expected.copy()
    own[0, 0] += 4.9e-4
    _own_run(monkeypatch, own)
    judged = dict(expected={"y": expected}, failing=["y"], judge=JUDGE)
    near_zero = expected.copy()
    near_zero[0, 0] += 8e-4  # within twice onnxruntime's own error in that channel
    assert rounding._within_onnxruntimes_own(_own_outputs, actual={"y": near_zero}, **judged)
    scaled = expected.copy()
    scaled[0, 1] *= 1.1
    assert rounding._within_onnxruntimes_own(_own_outputs, actual={"y": scaled}, **judged) is None


def test_logits_of_one_element_slices_off_by_a_percent_fail(monkeypatch):
    # [1, 64, 1, 1] logits: each slice is one logit, and one near 0 has a relative error near
    # 1 from onnxruntime's rounding; every logit 1% off is still a miscompile.
    rng = np.random.default_rng(2)
    expected = rng.uniform(-3, 3, (1, 64, 1, 1)).astype(np.float32)
    expected[0, 5] = 2e-8
    own = expected.copy()
    own[0, 5] += 4.8e-7
    _own_run(monkeypatch, own)
    actual = expected * np.float32(1.01)
    assert rounding.within_rounding(None, {}, {"y": expected}, {"y": actual}, ["y"],
                                    JUDGE) is None


def _cancelling(fold: float = 1.0):
    """(the original, a compile of it): y = Sigmoid(x·W1 − x·W2) with W1 and W2 near 100 apart
    by ~0.01, which the compile folds into one MatMul by W1 − W2 (times `fold`, a miscompile
    when not 1). The original's sums of terms of hundreds round by ~1e-5, past rtol on outputs
    near 0.5: rounding that neither onnxruntime's optimizer (which folds nothing here) nor the
    outputs' own scale accounts for."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w1 = rng.uniform(90, 110, (64, 16)).astype(np.float32)
    w2 = (w1 + rng.normal(0, 0.01, w1.shape)).astype(np.float32)

    def model(nodes, weights):
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
            [numpy_helper.from_array(w, name) for name, w in weights.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    original = model([helper.make_node("MatMul", ["x", "w1"], ["a"]),
                      helper.make_node("MatMul", ["x", "w2"], ["b"]),
                      helper.make_node("Sub", ["a", "b"], ["d"]),
                      helper.make_node("Sigmoid", ["d"], ["y"])], {"w1": w1, "w2": w2})
    compiled = model([helper.make_node("MatMul", ["x", "w"], ["d"]),
                      helper.make_node("Sigmoid", ["d"], ["y"])],
                     {"w": ((w1 - w2) * np.float32(fold)).astype(np.float32)})
    feeds = {"x": rng.uniform(0, 1, (8, 64)).astype(np.float32)}
    return original, compiled, feeds


@pytest.mark.parametrize("fold, excused", [(1.0, True), (1.5, False)])
def test_the_originals_sensitivity_to_its_weights_rounding_excuses_rounding_alone(fold, excused):
    # A sigmoid's outputs near 0.5 computed from terms of hundreds: the fold's rounding shows
    # at 1e-4 of the outputs' scale (the dynamo YOLO export's class scores), and a one-ulp move
    # of the original's weights moves them as much (1.8e-4 here, where a fold 1% off moves
    # them by 1e-4: this model cannot tell that from rounding). A fold 50% off is a miscompile.
    from graphopt import numerics

    original, compiled, feeds = _cancelling(fold)
    expected, actual = numerics.run(original, feeds), numerics.run(compiled, feeds)
    assert numerics.compare(expected, actual, JUDGE["rtol"], JUDGE["atol"])  # past allclose
    assert rounding._within_onnxruntimes_own(lambda: numerics.run(original, feeds, "all"),
                                             expected, actual, ["y"], JUDGE) is None
    assert rounding._within_output_scale(expected, actual, ["y"], JUDGE) is None
    note = rounding.within_rounding(original, feeds, expected, actual, ["y"], JUDGE)
    assert (note is not None) == excused, note
    if excused:
        assert "one unit in the last place" in note


def test_weight_rounding_moves_every_float_weight_by_one_ulp_but_sizes():
    from onnx import TensorProto, helper, numpy_helper

    weight = np.linspace(-2, 3, 12, dtype=np.float32).reshape(3, 4)
    scales = np.array([1, 1, 2, 2], np.float32)
    bias = np.linspace(0.5, 1, 4, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mw"]),
         helper.make_node("Constant", [], ["bias"], value=numpy_helper.from_array(bias)),
         helper.make_node("Add", ["mw", "bias"], ["m"]),
         helper.make_node("Resize", ["m4", "", "scales"], ["y"]),
         helper.make_node("Reshape", ["m", "shape"], ["m4"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scales, "scales"),
         numpy_helper.from_array(np.array([1, 1, 2, 4], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    copy = rounding._nudged(model, 0)
    nudged = {t.name: numpy_helper.to_array(t) for t in copy.graph.initializer}
    nudged["bias"] = numpy_helper.to_array(copy.graph.node[1].attribute[0].t)
    assert all(n != b and np.nextafter(b, n) == n for b, n in zip(bias, nudged["bias"]))
    steps = nudged["w"].astype(np.float64) - weight
    assert all(n != w and np.nextafter(w, n) == n for w, n in zip(weight.flat, nudged["w"].flat))
    assert (steps > 0).any() and (steps < 0).any()  # both directions, seeded
    np.testing.assert_array_equal(nudged["scales"], scales)  # a size, not a weight
    np.testing.assert_array_equal(nudged["shape"], [1, 1, 2, 4])
    moved = rounding.weight_rounding(model, {"x": np.ones((2, 3), np.float32)})
    assert moved["y"].shape == (1, 1, 4, 8) and 0 < moved["y"].max() < 1e-5


@pytest.mark.parametrize("got", [-np.inf, 0.0, 1e30])
def test_a_lost_or_sign_flipped_infinity_is_never_rounding(got, capsys, tmp_path):
    # rtol·|inf| is inf: any value passed for an infinity, and 1 element in 4 off read as
    # "under 1% of the elements" (compare PASSed +inf against -inf, exit 0).
    expected = np.zeros(400, np.float32)
    expected[0] = np.inf
    actual = expected.copy()
    actual[0] = got
    assert rounding._rounding_at_scale(expected, actual, JUDGE) is None
    assert rounding._rounding_at_scale(expected, expected.copy(), JUDGE) is not None


def test_a_nan_where_the_original_has_a_number_is_never_rounding():
    expected = np.ones((1, 2, 4), np.float32)
    actual = expected.copy()
    actual[0, 1, 2] = np.nan
    moved = {"y": np.full((1, 2, 4), 1e-3)}
    assert rounding._within_weight_rounding(lambda: moved, {"y": expected}, {"y": actual},
                                            ["y"], JUDGE) is None
    actual[0, 1, 2] = 1.002  # within 4x the movement
    assert rounding._within_weight_rounding(lambda: moved, {"y": expected}, {"y": actual},
                                            ["y"], JUDGE) is not None


def test_an_overflow_onnxruntimes_own_optimizer_makes_too_is_no_rounding(tmp_path):
    # MatMul(a·s, b·s) as FusedMatMul(a, b, alpha=s²): a·b overflows where the original's
    # product of scaled operands does not. onnxruntime's optimizer fuses alike, so its own
    # error was inf, and --verify, compare and bisect passed the inf as its rounding.
    from onnx import TensorProto, helper, numpy_helper

    import graphopt
    from graphopt import numerics
    from graphopt.errors import VerificationError

    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "s"], ["as"]), helper.make_node("Mul", ["b", "s"], ["bs"]),
         helper.make_node("MatMul", ["as", "bs"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(np.array(1e-10, np.float32), "s")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"a": np.full((1, 2), 1e20, np.float32), "b": np.full((2, 1), 1e20, np.float32)}
    expected = numerics.run(proto, feeds)
    assert np.isfinite(expected["y"]).all()
    assert np.isinf(numerics.run(proto, feeds, "all")["y"]).all()
    with pytest.raises(VerificationError, match="output 'y'.*max abs err inf"):
        graphopt.optimize(proto, verify=True, inputs=feeds)
    # Nor does an infinity where the original has NaN, or -inf for +inf, pass.
    for want, got in [(np.nan, np.inf), (-np.inf, np.inf)]:
        assert rounding.within_rounding(proto, feeds, {"y": np.array([want])},
                                        {"y": np.array([got])}, ["y"], JUDGE) is None


def test_infinite_and_largest_weights_keep_their_values():
    # A mask of -inf, or of float32's lowest (-3.4e38), stepped to a finite value or past it
    # (with numpy's overflow warning), is another mask, not rounding.
    import warnings

    from onnx import TensorProto, helper, numpy_helper

    mask = np.array([-np.inf, np.finfo(np.float32).min, np.finfo(np.float32).max, 1.0],
                    np.float32)
    graph = helper.make_graph([helper.make_node("Add", ["x", "m"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(mask, "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(4):
            nudged = numpy_helper.to_array(rounding._nudged(model, seed).graph.initializer[0])
            np.testing.assert_array_equal(nudged[:3], mask[:3])
            assert nudged[3] != 1.0 and np.nextafter(np.float32(1.0), nudged[3]) == nudged[3]


def test_onnxruntimes_own_miscompile_is_no_rounding_allowance(monkeypatch):
    # onnxruntime's LayerNormFusion read a Pow of 4 as a square, on the original as on the
    # .om: the .om's 0.8 off on outputs of magnitude 3 passed --verify as "within what
    # onnxruntime's own optimizer gives the original".
    rng = np.random.default_rng(3)
    expected = rng.uniform(-3, 1, (2, 3, 8)).astype(np.float32)
    wrong = expected + rng.uniform(-0.8, 0.8, expected.shape).astype(np.float32)
    _own_run(monkeypatch, wrong)
    assert rounding.within_rounding(None, {}, {"y": expected}, {"y": wrong}, ["y"],
                                    JUDGE) is None
    # A summation order's error of 1e-5 relative still excuses one twice its size.
    close = expected + np.float32(3e-5)
    _own_run(monkeypatch, close)
    assert rounding.within_rounding(None, {}, {"y": expected}, {"y": expected + np.float32(5e-5)},
                                    ["y"], JUDGE) is not None


def test_a_bfloat16_outputs_rounding_is_judged_at_its_own_scale(monkeypatch):
    # ml_dtypes' bfloat16 arrays are of numpy kind 'V': the limit took them for float32 (1e-3)
    # and their scale for 1, so one bfloat16 step on outputs of magnitude 4 (0.0156) refused
    # a compile off by what onnxruntime's optimizer moves the original.
    import ml_dtypes

    rng = np.random.default_rng(4)
    base = rng.uniform(-4, 4, (1, 8, 16)).astype(np.float32)
    expected = base.astype(ml_dtypes.bfloat16)
    moved = (base + np.float32(0.012)).astype(ml_dtypes.bfloat16)
    _own_run(monkeypatch, moved)
    assert rounding.within_rounding(None, {}, {"y": expected}, {"y": moved}, ["y"],
                                    JUDGE) is not None


def _detector_with_nms():
    """boxes → NonMaxSuppression → Gather of the kept boxes: 'kept' follows the selection,
    'boxes2' (the boxes doubled) does not."""
    import onnx.parser

    return onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 6, 4] boxes, float[1, 1, 6] scores) => (float[3, 4] kept, float[1, 6, 4] boxes2)
          <int64 top = {3}, float iou = {0.5}, float floor = {0.0}, int64[1] col = {2}> {
            picked = NonMaxSuppression (boxes, scores, top, iou, floor)
            index = Gather <axis = 1> (picked, col)
            flat = Squeeze (boxes)
            kept = Gather (flat, index)
            boxes2 = Add (boxes, boxes)
        }''')


def test_outputs_after_a_selection_that_match_onnxruntimes_own_are_not_the_compiles_error():
    # A RetinaNet's near-tied scores chose other boxes under onnxruntime's own optimizer as
    # under graphopt's compile: --verify failed a compile that matched ORT_ENABLE_ALL exactly.
    disabled = {"kept": np.array([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]],
                                 np.float32)}
    enabled = {"kept": np.array([[0, 0, 10, 10], [60, 60, 70, 70], [40, 40, 50, 50]],
                                np.float32)}
    note = rounding._reordered_selection(_detector_with_nms(), lambda: enabled, disabled,
                                         dict(enabled), ["kept"], JUDGE)
    assert note is not None and "'kept' follow a NonMaxSuppression" in note, note
    assert "not an error of the compile" in note
    # Off from onnxruntime's own result too: the compile's doing.
    other = {"kept": enabled["kept"] + 1}
    assert rounding._reordered_selection(_detector_with_nms(), lambda: enabled, disabled,
                                         other, ["kept"], JUDGE) is None
    # Where onnxruntime's optimizer changes nothing, a difference is the compile's.
    assert rounding._reordered_selection(_detector_with_nms(), lambda: disabled, disabled,
                                         dict(enabled), ["kept"], JUDGE) is None
    # An output no selection reaches is never excused so.
    boxes = {"boxes2": np.ones((1, 6, 4), np.float32)}
    assert rounding._reordered_selection(_detector_with_nms(), lambda: boxes,
                                         {"boxes2": boxes["boxes2"] * 2}, dict(boxes),
                                         ["boxes2"], JUDGE) is None


def test_a_selection_the_original_does_not_reproduce_itself_is_named_in_the_failure(
        monkeypatch):
    # SSDlite's near-tied scores: the .om chose other boxes than ORT_DISABLE_ALL, and so did
    # the original at ORT_ENABLE_ALL (a third choice): --verify failed, and sent the user to
    # --inputs, which cannot help. The failure now says where the difference comes from.
    disabled = {"kept": np.array([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]],
                                 np.float32)}
    enabled = {"kept": disabled["kept"][::-1].copy()}
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: enabled)
    hint = rounding.unstable_selection_hint(_detector_with_nms(), {}, disabled, ["kept"], JUDGE)
    assert "'kept' follow a NonMaxSuppression" in hint, hint
    assert "out_nodes" in hint.replace("-", "_"), hint  # the option, as the caller spells it
    # The original stable at ORT_ENABLE_ALL: the difference is the compile's, no hint.
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: disabled)
    assert rounding.unstable_selection_hint(_detector_with_nms(), {}, disabled, ["kept"],
                                            JUDGE) == ""
    # An output no selection reaches gets none either.
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: enabled)
    assert rounding.unstable_selection_hint(_detector_with_nms(), {}, disabled,
                                            ["kept", "boxes2"], JUDGE) == ""


def _half_layernorm(tmp_path):
    """A LayerNorm computed in float16 between float32 Casts, as onnxconverter-common's
    keep_io_types writes it: FuseLayerNorm makes it one float16 LayerNormalization."""
    rng = np.random.default_rng(3)
    path = tmp_path / "ln.onnx"
    onnx.save(parse_model("""
        g (float[2,8,64] x) => (float[2,8,64] y) {
            xh = Cast <to = 10> (x)
            m = ReduceMean <axes = [-1]> (xh)
            d = Sub (xh, m)
            sq = Pow (d, two)
            v = ReduceMean <axes = [-1]> (sq)
            ve = Add (v, eps)
            s = Sqrt (ve)
            n = Div (d, s)
            ng = Mul (n, gamma)
            yh = Add (ng, beta)
            y = Cast <to = 1> (yh)
        }""", '<ir_version: 8, opset_import: ["" : 13]>\n', two=np.array(2, np.float16),
        eps=np.array(1e-5, np.float16),
        gamma=(1 + 0.2 * rng.standard_normal(64)).astype(np.float16),
        beta=(0.1 * rng.standard_normal(64)).astype(np.float16)), path)
    return path


def test_an_output_computed_in_float16_is_judged_at_float16s_precision(tmp_path, capsys):
    # Its float32 output had been judged at float32's rtol: 727 of 1024 elements "beyond
    # rtol=0.0001" (0.0015 on values up to 3.6) refused a compile closer to the exact result.
    path = _half_layernorm(tmp_path)
    rc, out, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "ln.om", "--verify")
    assert rc == 0, err
    assert "output(s) y computed in 16-bit floats in the original" in out, out
    # A difference past float16's precision is still one.
    from graphopt.rounding import within_half_precision

    proto = onnx.load(path)
    x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    y = numerics.run(proto, {"x": x})["y"]
    assert within_half_precision(proto, {"y": y}, {"y": y + 5e-4 * np.abs(y).max()}, ["y"])
    assert within_half_precision(proto, {"y": y}, {"y": y * 1.01}, ["y"]) is None


def test_a_model_that_quantizes_activations_may_move_by_a_step(monkeypatch):
    # A QDQ BERT: FuseLayerNorm's float rounding moved some activations to the neighbouring
    # int8 step, 0.07 on hidden states up to 4.5, and onnxruntime's own optimizer moves the
    # original by 0.109: --verify refused a lossless compile. A float model is held to 1e-3 of
    # the largest magnitude, and a quantized one still to 5e-2.
    import onnx.parser

    def model(body: str):
        return onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 16] x) => (float[1, 8, 16] y) <float s = {0.05}, uint8 z = {128}> {
        """ + body + "}")

    quantized = model("q = QuantizeLinear(x, s, z)\n y = DequantizeLinear(q, s, z)\n")
    plain = model("y = Relu(x)\n")
    assert rounding.after_quantization(quantized) == {"y"}
    assert rounding.after_quantization(plain) == set()
    # An output beside the quantized path keeps the float bound.
    beside = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 16] x) => (float[1, 8, 16] y, float[1, 8, 16] r)
          <float s = {0.05}, uint8 z = {128}> {
            q = QuantizeLinear(x, s, z)
            y = DequantizeLinear(q, s, z)
            r = Relu(x)
        }""")
    assert rounding.after_quantization(beside) == {"y"}
    rng = np.random.default_rng(6)
    expected = rng.uniform(-4.5, 4.5, (1, 8, 16)).astype(np.float32)
    own, actual = expected.copy(), expected.copy()
    own[0, :, 3] += 0.109   # a step, carried through the layers after it
    actual[0, :, 5] -= 0.07
    _own_run(monkeypatch, own, expected)
    judged = ({}, {"y": expected}, {"y": actual}, ["y"], JUDGE)
    note = rounding.within_rounding(quantized, *judged)
    assert note is not None and "neighbouring step" in note
    assert rounding.within_rounding(plain, *judged) is None
    wrong = expected + rng.uniform(-0.8, 0.8, expected.shape).astype(np.float32)
    _own_run(monkeypatch, wrong)
    assert rounding.within_rounding(quantized, {}, {"y": expected}, {"y": wrong}, ["y"],
                                    JUDGE) is None


def test_outputs_the_original_does_not_reproduce_get_no_allowance(monkeypatch):
    # A sliding KV cache fed longer than its window: onnxruntime leaves part of the present
    # keys unwritten, so the original gives other garbage on every run, and the allowances
    # measured from its runs (its weights' sensitivity read 3.9e38) excused 1.9e25 of error.
    expected = _detections()
    garbage = expected.copy()
    garbage[0, :4] = 1e25
    runs = iter([{"y": garbage}, {"y": expected}])
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: next(runs))
    actual = expected + np.float32(3e-3)
    note = rounding.within_rounding(onnx.ModelProto(), {}, {"y": expected}, {"y": actual}, ["y"],
                                    JUDGE, own=lambda: {"y": garbage},
                                    sensitivity=lambda: {"y": np.full_like(expected, 1e38)})
    assert note is None
    # Reproduced bit for bit, the same allowance stands.
    monkeypatch.setattr(rounding.numerics, "run", lambda *args, **kwargs: {"y": expected})
    assert rounding.within_rounding(onnx.ModelProto(), {}, {"y": expected}, {"y": actual}, ["y"],
                                    JUDGE, own=lambda: {"y": garbage},
                                    sensitivity=lambda: {"y": np.full_like(expected, 1e38)})
    assert "gives other values for 'y' on a second run" in rounding.unreproduced_hint(
        onnx.ModelProto(), {}, {"y": garbage}, ["y"])


def _cancelling_half_model() -> onnx.ModelProto:
    """y = float16(x + 100) − 100: the sum rounds to float16's step at 100 (1/16), so the
    original is up to 0.031 off the float32 result x, ten steps of float16 at |y| ≤ 3."""
    from onnx import TensorProto, helper, numpy_helper

    hundred = numpy_helper.from_array(np.array(100, np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["s"]),
         helper.make_node("Cast", ["s"], ["h"], to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["h"], ["w"], to=TensorProto.FLOAT),
         helper.make_node("Sub", ["w", "c"], ["y"])],
        "cancel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])], [hundred])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_float16_output_nearer_the_float32_result_than_the_original_passes():
    # A compile whose kernels sum in float32 moves a float16 model's outputs by more than a
    # step (a float16 GPT-2: 0.0093 on logits of 6.8, refused), nearer the float32 result.
    from graphopt.rounding import within_half_precision

    proto = _cancelling_half_model()
    feeds = {"x": np.random.default_rng(0).standard_normal(64).astype(np.float32)}
    y = numerics.run(proto, feeds)["y"]
    nearer = feeds["x"]  # the float32 result, x itself
    assert within_half_precision(proto, {"y": y}, {"y": nearer}, ["y"]) is None  # past a step
    note = within_half_precision(proto, {"y": y}, {"y": nearer}, ["y"], feeds)
    assert note and "judged against the same model computed in float32" in note
    # Farther from it than the original, by more than a step: an error all the same.
    farther = feeds["x"] * 1.05
    assert within_half_precision(proto, {"y": y}, {"y": farther}, ["y"], feeds) is None
    off = nearer.copy()
    off[0] = np.nan
    assert within_half_precision(proto, {"y": y}, {"y": off}, ["y"], feeds) is None


def test_widening_makes_every_16_bit_float_float32():
    from onnx import TensorProto, helper, numpy_helper

    from graphopt.widened import widened_to_float32

    half = numpy_helper.from_array(np.array([1.5, 2.5], np.float16))
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=half),
         helper.make_node("Add", ["x", "c"], ["s"]),
         helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("ReduceSum", ["f"], ["z"], keepdims=0)],
        "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    wide = widened_to_float32(proto)
    onnx.checker.check_model(wide, full_check=True)
    assert [i.type.tensor_type.elem_type for i in (*wide.graph.input, *wide.graph.output)] \
        == [TensorProto.FLOAT] * 3
    assert wide.graph.node[0].attribute[0].t.data_type == TensorProto.FLOAT
    assert wide.graph.node[2].attribute[0].i == TensorProto.FLOAT
    out = numerics.run(wide, {"x": np.array([0.1, 0.2], np.float32)})
    np.testing.assert_allclose(out["y"], [1.6, 2.7], rtol=1e-7)
    assert proto.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16  # a copy
