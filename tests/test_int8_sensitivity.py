"""INT8's sensitivity guard: layers whose int8 inputs and weights would drown their outputs
stay float (graphopt/quant/sensitivity.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt import numerics
from graphopt.errors import OptionError

# A conv whose first channel spans a hundredth of the others' range, then a depthwise conv that
# multiplies that channel by 400 (as a BatchNorm folded into it can): one uint8 step of the
# tensor is wider than the whole channel.
NET = """
    agraph (float[1, 3, 12, 12] x) => (float[1, 8, 12, 12] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        r1 = Relu(c1)
        c2 = Conv <pads = [1, 1, 1, 1], group = 8> (r1, w2)
        r2 = Relu(c2)
        c3 = Conv <pads = [1, 1, 1, 1]> (r2, w3)
        y = Relu(c3)
    }"""


def _model(gain: float):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.5).astype(np.float32)
    w1[0] *= 0.004
    w2 = np.abs(rng.standard_normal((8, 1, 3, 3))).astype(np.float32) * 0.3
    w2[0] *= gain
    w3 = (rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32)
    b1 = np.full(8, 0.1, np.float32)
    b1[0] = 0.001
    return parse_model(NET, w1=w1, b1=b1, w2=w2, w3=w3)


def _calibration(tmp_path) -> str:
    path = tmp_path / "calib.npz"
    np.savez(path, x=np.random.default_rng(1).standard_normal((8, 1, 3, 12, 12))
             .astype(np.float32))
    return str(path)


def _int8(proto, tmp_path, **options):
    # The guard on its own: channel equalization would scale the narrow channel up first
    # (test_channel_equalization_saves_the_drowned_layers).
    result = graphopt.optimize(proto, pass_options={
        "quantize": "int8", "calibration": _calibration(tmp_path), "quant_keep_ends": False,
        "quant_equalize": False, **options})
    out = graphopt.to_onnx(result.model)
    onnx.checker.check_model(out)
    return result, out


def _cosine(proto, out) -> float:
    feeds = numerics.random_feeds(proto, seed=5)
    a = numerics.run(proto, feeds)["y"].ravel().astype(np.float64)
    b = numerics.run(out, feeds, level="all")["y"].ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _float_convs(out) -> list[str]:
    """The convs reading their weight as it is, not through a DequantizeLinear."""
    initializers = {t.name for t in out.graph.initializer}
    return [n.output[0] for n in out.graph.node if n.op_type == "Conv"
            and n.input[1] in initializers]


def test_a_drowned_depthwise_conv_and_the_conv_feeding_it_stay_float(tmp_path):
    proto = _model(gain=400.0)
    result, guarded = _int8(proto, tmp_path)
    assert _float_convs(guarded) == ["c1", "c2"]
    notes = [n for n in result.notes if "int8 inputs and weights would drown" in n]
    assert len(notes) == 1 and "'c2'" in notes[0], result.notes
    assert any("1 × a layer computing such a layer's input" in n for n in result.notes)
    _, unguarded = _int8(proto, tmp_path, quant_keep_sensitive=False)
    assert _float_convs(unguarded) == []
    assert _cosine(proto, unguarded) < 0.99 < 0.999 < _cosine(proto, guarded)


def test_a_healthy_net_compiles_as_without_the_guard(tmp_path):
    proto = _model(gain=1.0)
    result, guarded = _int8(proto, tmp_path)
    _, unguarded = _int8(proto, tmp_path, quant_keep_sensitive=False)
    assert not any("would drown" in n for n in result.notes)
    assert guarded.SerializeToString() == unguarded.SerializeToString()


def test_the_command_line_quantizes_drowned_layers_on_request(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(_model(gain=400.0), model)
    calibration = _calibration(tmp_path)
    code, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "a.onnx", "--quantize",
                             "int8", "--calibration", calibration, "--quantize-ends",
                             "--no-equalize-channels")
    assert code == 0 and "--quantize-sensitive quantizes it" in out + err
    code, out, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "b.onnx", "--quantize",
                             "int8", "--calibration", calibration, "--quantize-ends",
                             "--quantize-sensitive", "--no-equalize-channels")
    assert code == 0 and "would drown" not in out + err
    assert _float_convs(onnx.load(tmp_path / "b.onnx")) == []
    code, _, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "c.onnx",
                           "--quantize-sensitive")
    assert code != 0 and "--quantize-sensitive applies to --quantize int8" in err


def test_channel_equalization_saves_the_drowned_layers(tmp_path):
    # Scaled up into c1's weights (and down in c2's, per channel), the narrow channel spans
    # the uint8 range like the others: nothing drowns, and every layer stays int8.
    proto = _model(gain=400.0)
    for guard in (True, False):
        result, out = _int8(proto, tmp_path, quant_equalize=True, quant_keep_sensitive=guard)
        assert _float_convs(out) == []
        rewrites = result.log.totals()["QuantizeInt8"]["rewrites"]
        assert rewrites["equalized channel region"] == 2  # c1 → c2 and c2 → c3
        assert not any("would drown" in n for n in result.notes)
        assert _cosine(proto, out) > 0.999


def test_weights_rounded_away_behind_an_equalized_channel_still_drown_the_layer(tmp_path):
    # A dense conv whose weights on the narrow channel are 600 times the others: equalization
    # lifts that channel off its input's rounding, but one weight scale per output channel
    # still rounds the rest of each row away, which the guard sees in its rounded copy.
    text = NET.replace("c2 = Conv <pads = [1, 1, 1, 1], group = 8> (r1, w2)",
                       "c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2)")
    weights = {t.name: onnx.numpy_helper.to_array(t).copy()
               for t in _model(gain=1.0).graph.initializer}
    rng = np.random.default_rng(5)
    weights["w1"][0] *= 1 / 75  # with the 0.004 already there: 300 times narrower
    weights["w2"] = (rng.standard_normal((8, 8, 3, 3)) * 0.1).astype(np.float32)
    weights["w2"][:, 0] *= 600
    proto = parse_model(text, **weights)
    result, out = _int8(proto, tmp_path, quant_equalize=True)
    assert "c2" in _float_convs(out), result.notes
    assert any("would drown 1 layer(s)" in n and "'c2'" in n for n in result.notes)
    assert _cosine(proto, out) > 0.999
    _, unguarded = _int8(proto, tmp_path, quant_equalize=True, quant_keep_sensitive=False)
    assert _cosine(proto, unguarded) < 0.999


def test_the_option_without_int8_is_refused():
    with pytest.raises(OptionError, match="quant_keep_sensitive applies to quantize='int8'"):
        graphopt.optimize(_model(gain=1.0), pass_options={"quant_keep_sensitive": False})


def test_the_layers_behind_a_concat_that_crush_the_channel_stay_float_too(tmp_path):
    # A Concat between the conv that quantizes the narrow channel and the depthwise conv that
    # amplifies it: the guard follows the chain through it.
    text = NET.replace("""        c2 = Conv <pads = [1, 1, 1, 1], group = 8> (r1, w2)""",
                       """        c0 = Conv <pads = [1, 1, 1, 1]> (x, w0)
        r0 = Relu(c0)
        cat = Concat <axis = 1> (r1, r0)
        c2 = Conv <pads = [1, 1, 1, 1], group = 16> (cat, w2)""")
    base = _model(gain=400.0)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in base.graph.initializer}
    rng = np.random.default_rng(4)
    weights["w0"] = (rng.standard_normal((8, 3, 3, 3)) * 0.5).astype(np.float32)
    weights["w2"] = np.concatenate([weights["w2"], weights["w2"][1:2].repeat(8, 0)])
    weights["w3"] = (rng.standard_normal((8, 16, 3, 3)) * 0.2).astype(np.float32)
    proto = parse_model(text, **weights)
    result, out = _int8(proto, tmp_path)
    assert {"c1", "c2"} <= set(_float_convs(out)), result.notes
    _, unguarded = _int8(proto, tmp_path, quant_keep_sensitive=False)
    assert _cosine(proto, unguarded) < 0.99 < 0.999 < _cosine(proto, out)


def test_names_like_the_copies_do_not_collide(tmp_path):
    text = NET.replace("y = Relu(c3)", "r1__local1 = Relu(c3)\n y = Identity(r1__local1)")
    proto = parse_model(text, **{t.name: onnx.numpy_helper.to_array(t)
                                 for t in _model(gain=400.0).graph.initializer})
    _, out = _int8(proto, tmp_path)
    assert _float_convs(out) == ["c1", "c2"]


def test_every_shape_profile_keeps_the_layers_the_measuring_one_found(tmp_path):
    text = NET.replace("float[1, 3, 12, 12] x", "float[1, 3, H, H] x").replace(
        "float[1, 8, 12, 12] y", "float[1, 8, H, H] y")
    proto = parse_model(text, **{t.name: onnx.numpy_helper.to_array(t)
                                 for t in _model(gain=400.0).graph.initializer})
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    # The guard on its own, as _int8 compiles (equalization would save the layers).
    result = graphopt.optimize(str(path), quantize="int8", calibration=_calibration(tmp_path),
                               pass_options={"quant_keep_ends": False, "quant_equalize": False},
                               dynamic_dims={"H": [12, 16]})
    for compiled in result.profiles:  # the data fits H=12; H=16 borrows its statistics
        assert _float_convs(compiled.result.to_onnx()) == ["c1", "c2"], compiled.profile.dims


def test_a_split_whose_halves_meet_again_is_copied_once(tmp_path):
    # YOLO's C2f blocks split a conv's output and concatenate both halves again before the
    # next conv: the chain of that conv's input reaches the Split twice.
    text = NET.replace("""        c2 = Conv <pads = [1, 1, 1, 1], group = 8> (r1, w2)""",
                       """        a, b = Split <axis = 1> (r1, halves)
        cat = Concat <axis = 1> (b, a)
        c2 = Conv <pads = [1, 1, 1, 1], group = 8> (cat, w2)""")
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in _model(gain=1.0).graph.initializer}
    proto = parse_model(text, halves=np.array([4, 4], np.int64), **weights)
    result, out = _int8(proto, tmp_path)
    assert not any("int8 inputs and weights would drown" in n for n in result.notes)
    assert _cosine(proto, out) > 0.999


def _npu_int8(proto, tmp_path, **options):
    result = graphopt.optimize(proto, target="ascend310", quantize="int8",
                               calibration=_calibration(tmp_path),
                               pass_options={"quant_keep_ends": False, "quant_equalize": False,
                                             **options})
    return result, graphopt.to_onnx(result.model)


def _npu_cosine(proto, out) -> float:
    # An NPU target's int8 model runs as the NPU computes it: the Q/DQ pairs in float.
    feeds = numerics.random_feeds(proto, seed=5)
    a = numerics.run(proto, feeds)["y"].ravel().astype(np.float64)
    b = numerics.run(out, feeds)["y"].ravel().astype(np.float64)
    if not b.any():
        return 0.0  # every weight that mattered rounded to 0
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_an_npu_target_keeps_the_drowned_layer_float_alone(tmp_path):
    # AMCT's form quantizes c2's input for c2 alone: c1's output stays float, so c1 may stay
    # int8 once c2 is float.
    proto = _model(gain=400.0)
    result, guarded = _npu_int8(proto, tmp_path)
    assert _float_convs(guarded) == ["c2"], result.notes
    assert any("int8 inputs and weights would drown 1 layer(s)" in n and "'c2'" in n
               for n in result.notes)
    _, unguarded = _npu_int8(proto, tmp_path, quant_keep_sensitive=False)
    assert _float_convs(unguarded) == []
    assert _npu_cosine(proto, unguarded) < 0.99 < 0.999 < _npu_cosine(proto, guarded)


def test_an_npu_target_measures_the_weights_as_amct_rounds_them(tmp_path):
    # One input row of h1's weight 4000 times the others, on a channel that is always 0: the
    # float output never sees it, but AMCT's one weight scale per MatMul rounds every other row
    # to 0. The input's Q/DQ pair alone would not show it.
    w0 = (np.random.default_rng(2).standard_normal((12, 16)) * 0.3).astype(np.float32)
    w0[:, 0] = 0.0
    w1 = (np.random.default_rng(3).standard_normal((16, 16)) * 0.3).astype(np.float32)
    w1[0] *= 4000.0
    w2 = (np.random.default_rng(4).standard_normal((16, 8)) * 0.3).astype(np.float32)
    proto = parse_model("""
        agraph (float[1, 3, 12, 12] x) => (float[1, 3, 12, 8] y) {
            h0 = MatMul (x, w0)
            r0 = Relu (h0)
            h1 = MatMul (r0, w1)
            r1 = Relu (h1)
            y = MatMul (r1, w2)
        }""", w0=w0, w1=w1, w2=w2)
    initializers = ("w0", "w1", "w2")

    def float_matmuls(out):
        return [n.output[0] for n in out.graph.node
                if n.op_type == "MatMul" and n.input[1] in initializers]

    result, guarded = _npu_int8(proto, tmp_path)
    assert float_matmuls(guarded) == ["h1"], result.notes
    _, unguarded = _npu_int8(proto, tmp_path, quant_keep_sensitive=False)
    assert float_matmuls(unguarded) == []
    assert _npu_cosine(proto, unguarded) < 0.99 < 0.999 < _npu_cosine(proto, guarded)


def test_a_drowned_layer_computing_anothers_input_is_counted_once():
    # The note counted it among the layers computing inputs too, where the kept-float note
    # (kept_float) counts it as drowned only: 20 in one note, 15 in the other.
    from graphopt.ir import Node
    from graphopt.quant.sensitivity import Drowned, drowned_note, kept_float

    a, b, c = (Node("Conv", [], name=name) for name in "abc")
    drowned = [Drowned(a, 3.0, [b]), Drowned(b, 2.0, [c])]
    assert "kept float, and 1 layer(s) computing their inputs" in drowned_note(drowned)
    assert sum("computing such a layer's input" in why for why in kept_float(drowned).values()) == 1
