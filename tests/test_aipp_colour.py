"""--insert-op-conf with YUV420SP frames and colour conversion (csc_switch): the compiled
model against ATC's formula, ((M · (in - input_bias)) >> 8) + output_bias, done in integers."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt import numerics
from graphopt.errors import InputError, OptionError
from graphopt.tools.compare import compare_models

# ATC's manual: YUV420SP to RGB for BT.601 narrow range, and RGB to YUV (BT.601 narrow).
BT601_NARROW = (298, 0, 409, 298, -100, -208, 298, 516, 0)
RGB_TO_YUV = (66, 129, 25, -38, -74, 112, 112, -94, -18)
FRAME = (12, 16)  # h, w of the source frames


def _config(tmp_path, input_format="YUV420SP_U8", matrix=BT601_NARROW, input_bias=(16, 128, 128),
            output_bias=(0, 0, 0), swap=False, crop=None, extra="") -> str:
    lines = [f"input_format: {input_format}", f"rbuv_swap_switch: {str(swap).lower()}",
             f"src_image_size_h: {FRAME[0]}", f"src_image_size_w: {FRAME[1]}"]
    if matrix is not None:
        lines.append("csc_switch: true")
        lines += [f"matrix_r{i // 3}c{i % 3}: {v}" for i, v in enumerate(matrix)]
        lines += [f"input_bias_{i}: {v}" for i, v in enumerate(input_bias)]
        lines += [f"output_bias_{i}: {v}" for i, v in enumerate(output_bias)]
    if crop is not None:
        (top, left), (h, w) = crop
        lines += ["crop: true", f"load_start_pos_h: {top}", f"load_start_pos_w: {left}",
                  f"crop_size_h: {h}", f"crop_size_w: {w}"]
    path = tmp_path / "aipp.cfg"
    path.write_text("aipp_op {\n  " + "\n  ".join(lines) + "\n" + extra + "}\n")
    return path


def _passthrough(size, layout="NCHW", batch="N") -> onnx.ModelProto:
    """A model that returns the image it is fed: what the preprocessing made, exactly."""
    h, w = size
    shape = f"[{batch},3,{h},{w}]" if layout == "NCHW" else f"[{batch},{h},{w},3]"
    return parse_model(f"g (float{shape} x) => (float{shape} y) {{ y = Identity (x) }}")


def _frames(batch=2, seed=0, input_format="YUV420SP_U8") -> np.ndarray:
    h, w = FRAME
    shape = (batch, h * 3 // 2, w, 1) if input_format == "YUV420SP_U8" else (batch, h, w, 3)
    return np.random.default_rng(seed).integers(0, 256, shape, np.uint8)


def _yuv444(frames: np.ndarray, swap: bool) -> np.ndarray:
    """NV12 (NV21 when `swap`) frames as [N, H, W, 3] Y, U, V: each chroma pair for 2x2 pixels."""
    h, w = FRAME
    luma = frames[:, :h, :, 0]
    chroma = frames[:, h:, :, 0].reshape(len(frames), h // 2, w // 2, 2)
    if swap:
        chroma = chroma[..., ::-1]
    chroma = chroma.repeat(2, axis=1).repeat(2, axis=2)
    return np.concatenate([luma[..., None], chroma], axis=-1)


def _converted(pixels: np.ndarray, matrix, input_bias, output_bias) -> np.ndarray:
    """ATC's colour conversion in integers: the shift floors, the 8-bit result saturates."""
    mixed = (pixels.astype(np.int64) - np.array(input_bias)) @ np.array(matrix).reshape(3, 3).T
    return np.clip((mixed >> 8) + np.array(output_bias), 0, 255)


@pytest.mark.parametrize("swap", [False, True], ids=["NV12", "NV21"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("crop", [None, ((2, 4), (7, 9))], ids=["whole", "odd-crop"])
def test_yuv420sp_frames_convert_exactly_as_atcs_formula(tmp_path, swap, layout, crop):
    size = FRAME if crop is None else crop[1]
    model = _passthrough(size, layout)
    config = _config(tmp_path, swap=swap, crop=crop)
    compiled = graphopt.optimize(model, insert_op_conf=config).to_onnx()
    onnx.checker.check_model(compiled, full_check=True)
    frames = _frames()
    pixels = _yuv444(frames, swap)
    if crop is not None:
        (top, left), (h, w) = crop
        pixels = pixels[:, top:top + h, left:left + w]
    expected = _converted(pixels, BT601_NARROW, (16, 128, 128), (0, 0, 0)).astype(np.float32)
    assert expected.min() == 0 and expected.max() == 255  # both ends saturate
    if layout == "NCHW":
        expected = expected.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(numerics.run(compiled, {"x": frames})["y"], expected)


@pytest.mark.parametrize("precision, target", [("fp16", "ascend310"), ("bf16", "ascend910b")])
@pytest.mark.parametrize("input_format", ["YUV420SP_U8", "RGB888_U8"])
def test_the_conversion_stays_exact_under_a_half_precision_mode(tmp_path, precision, target,
                                                                input_format):
    # ATC's AIPP converts colours in integers whatever --precision_mode says. Converted to
    # float16 with the rest, a product of an 8-bit value and M/256 was rounded and the Floor
    # after it landed one off (bfloat16: two off), for 3% of the values (25% in bf16).
    # onnxruntime's CPU provider computes float16 Muls in float32, which hid it; onnx's
    # reference evaluator computes in the dtype the model says.
    from onnx.reference import ReferenceEvaluator

    rgb = input_format == "RGB888_U8"
    matrix, bias = (RGB_TO_YUV, (0, 0, 0)) if rgb else (BT601_NARROW, (16, 128, 128))
    config = _config(tmp_path, input_format=input_format, matrix=matrix, input_bias=bias)
    compiled = graphopt.optimize(_passthrough(FRAME), insert_op_conf=config, target=target,
                                 precision=precision).to_onnx()
    frames = _frames(batch=4, input_format=input_format)
    pixels = frames if rgb else _yuv444(frames, swap=False)
    expected = _converted(pixels, matrix, bias, (0, 0, 0)).transpose(0, 3, 1, 2)
    got = ReferenceEvaluator(compiled).run(None, {"x": frames})[0]
    np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))


def test_yuv420sp_without_conversion_feeds_yuv444_normalized(tmp_path):
    config = _config(tmp_path, matrix=None, swap=True,
                     extra="  mean_chn_0: 16\n  mean_chn_1: 128\n  var_reci_chn_2: 0.5\n")
    compiled = graphopt.optimize(_passthrough(FRAME), insert_op_conf=config).to_onnx()
    frames = _frames(seed=1)
    expected = (_yuv444(frames, swap=True).astype(np.float32) - np.float32([16, 128, 0])) \
        * np.float32([1, 1, 0.5])
    np.testing.assert_array_equal(numerics.run(compiled, {"x": frames})["y"],
                                  expected.transpose(0, 3, 1, 2))


def test_bgr_frames_convert_to_yuv_with_an_output_bias(tmp_path):
    config = _config(tmp_path, input_format="RGB888_U8", matrix=RGB_TO_YUV,
                     input_bias=(0, 0, 0), output_bias=(16, 128, 128), swap=True)
    compiled = graphopt.optimize(_passthrough(FRAME, "NHWC"), insert_op_conf=config).to_onnx()
    frames = _frames(input_format="RGB888_U8")
    expected = _converted(frames[..., ::-1], RGB_TO_YUV, (0, 0, 0), (16, 128, 128))
    np.testing.assert_array_equal(numerics.run(compiled, {"x": frames})["y"],
                                  expected.astype(np.float32))


def _classifier() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    return parse_model("""
        g (float[N,3,12,16] x) => (float[N,10] y) {
            c = Conv <pads = [1,1,1,1]> (x, w, b)
            r = Relu (c)
            p = GlobalAveragePool (r)
            f = Flatten (p)
            y = Gemm <transB = 1> (f, wf, bf)
        }""", w=(rng.standard_normal((8, 3, 3, 3)) * 0.02).astype(np.float32),
        b=rng.standard_normal(8).astype(np.float32),
        wf=(rng.standard_normal((10, 8)) * 0.3).astype(np.float32),
        bf=rng.standard_normal(10).astype(np.float32))


@pytest.mark.parametrize("level", [0, 3])
def test_a_classifier_verifies_inspects_and_compares_with_the_recorded_conversion(
        tmp_path, capsys, level):
    source, om = tmp_path / "net.onnx", tmp_path / "net.om"
    onnx.save(_classifier(), source)
    config = _config(tmp_path, swap=True, extra="  mean_chn_0: 104\n  var_reci_chn_0: 0.017\n")
    rc, out, err = run_cli(capsys, "optimize", source, "-o", om, "--insert-op-conf", config,
                           f"-O{level}", "--verify")
    assert rc == 0, err
    assert "'x' takes uint8 [N,18,16,1] (YUV420SP_U8)" in out + err
    frames = _frames()
    pixels = _converted(_yuv444(frames, swap=True), BT601_NARROW, (16, 128, 128), (0, 0, 0))
    pixels = (pixels.astype(np.float32) - np.float32([104, 0, 0])) * np.float32([0.017, 1, 1])
    expected = numerics.run(_classifier(), {"x": pixels.transpose(0, 3, 1, 2)})["y"]
    np.testing.assert_allclose(graphopt.load(om).run({"x": frames})["y"], expected,
                               rtol=1e-4, atol=1e-5)
    assert compare_models(source, om).passed  # the source runs with the recorded conversion
    rc, out, _ = run_cli(capsys, "inspect", om)
    assert ("'x': YUV420SP_U8 12x16, U/V swapped, colour matrix [298, 0, 409, 298, -100, -208, "
            "298, 516, 0] / 256 on (x - [16, 128, 128]), floored, + [0, 0, 0], (x - [104, 0, 0]"
            in out)


def test_int8_keeps_the_first_conv_float_behind_the_conversion(tmp_path):
    # The Slice, Concat, Gather and Floor of the preprocessing hid that the conv reads the
    # input: int8 quantized it as a middle layer.
    calibration = tmp_path / "frames.npz"
    np.savez(calibration, x=_frames(batch=8, seed=2))
    result = graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path), quantize="int8",
                               calibration=calibration)
    assert any("kept in float: 2 × a first or last layer" in note for note in result.notes)


@pytest.mark.parametrize("extra, message", [
    ("csc_switch: true", ":3: csc_switch: true, but no matrix_r*c* is given"),
    ("csc_switch: true\n matrix_r0c0: 0", "every matrix_r*c* is 0"),
    ("csc_switch: true\n matrix_r1c0: 32767\n matrix_r1c1: 32767\n matrix_r1c2: 32767",
     "matrix_r1c0 to c2 add up to 98301 in magnitude, past 65536"),
    ("csc_switch: true\n matrix_r0c0: 40000", "matrix_r0c0: 40000 is outside -32768 to 32767"),
    ("csc_switch: true\n matrix_r0c0: 256\n input_bias_1: 256",
     "input_bias_1: 256 is outside 0 to 255"),
    ("csc_switch: true\n matrix_r0c0: 256\n output_bias_0: -1", "output_bias_0: -1 is negative"),
])
def test_conversions_graphopt_cannot_make_exactly_are_refused_by_line_and_key(tmp_path, extra,
                                                                               message):
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n input_format: RGB888_U8\n " + extra + "\n}\n")
    with pytest.raises(OptionError) as caught:
        graphopt.optimize(_passthrough(FRAME), insert_op_conf=config)
    assert message in str(caught.value)


@pytest.mark.parametrize("text, size, message", [
    ("input_format: YUV400_U8\n csc_switch: true", FRAME, ":3: csc_switch: YUV400_U8 has one "
                                                          "channel"),
    ("input_format: YUV420SP_U8", (12, 15), "the model's w (src_image_size_w by default) 15 is "
                                            "odd: a YUV420SP_U8 image is even in both dims"),
    ("input_format: YUV420SP_U8\n src_image_size_h: 13\n crop: true", (12, 16),
     "src_image_size_h 13 is odd"),
    ("input_format: YUV420SP_U8\n src_image_size_w: 20\n crop: true\n load_start_pos_w: 3",
     (12, 16), "load_start_pos_w 3 is odd: a crop of a YUV420SP_U8 image starts at an even "
               "pixel"),
])
def test_yuv420sp_frames_the_model_cannot_take_are_refused(tmp_path, text, size, message):
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n " + text + "\n}\n")
    with pytest.raises(OptionError) as caught:
        graphopt.optimize(_passthrough(size), insert_op_conf=config)
    assert message in str(caught.value)


@pytest.mark.parametrize("converted", [True, False], ids=["csc", "yuv444"])
@pytest.mark.parametrize("opset", [7, 9, 10, 11, 13])
def test_models_of_opsets_before_slice_and_clip_took_inputs(tmp_path, opset, converted):
    # Slice-10's inputs went into an opset-9 model: onnxruntime refused the compiled model.
    # The chroma's repeat is Upsample-7, Upsample-9, Resize-10, or Resize-11 with its roi.
    header = f'<ir_version: 7, opset_import: ["" : {opset}]>\n'
    model = parse_model("g (float[N,3,7,9] x) => (float[N,3,7,9] y) { y = Identity (x) }",
                        header)
    config = _config(tmp_path, crop=((2, 4), (7, 9)), matrix=BT601_NARROW if converted else None)
    compiled = graphopt.optimize(model, insert_op_conf=config).to_onnx()
    onnx.checker.check_model(compiled, full_check=True)
    frames = _frames()
    pixels = _yuv444(frames, swap=False)[:, 2:9, 4:13]
    expected = (_converted(pixels, BT601_NARROW, (16, 128, 128), (0, 0, 0)) if converted
                else pixels).astype(np.float32)
    np.testing.assert_array_equal(numerics.run(compiled, {"x": frames})["y"],
                                  expected.transpose(0, 3, 1, 2))


def test_a_model_before_opset_7_is_refused(tmp_path):
    header = '<ir_version: 3, opset_import: ["" : 6]>\n'
    model = parse_model("g (float[1,3,12,16] x) => (float[1,3,12,16] y) { y = Identity (x) }",
                        header)
    with pytest.raises(OptionError, match="imports opset 6 of the default domain; the "
                                          "preprocessing's ops need opset 7 or later"):
        graphopt.optimize(model, insert_op_conf=_config(tmp_path))


@pytest.mark.parametrize("field, value", [
    ("csc_matrix", [0] * 9), ("csc_matrix", [40000, 0, 0, 0, 256, 0, 0, 0, 256]),
    ("input_bias", [999, 0, 0]), ("swap_rb", "no"), ("crop", 1),
    # int() took "12" and float() "NaN"; 1e39 is inf in the model's float32 constants; no
    # configuration moves an X byte of a YUV420SP frame.
    ("input_bias", ["12", 0, 0]), ("mean", [float("nan"), 0, 0]), ("var_reci", [1e39, 1, 1]),
    ("x_last", True),
])
def test_compare_refuses_a_recorded_conversion_no_config_could_make(tmp_path, field, value):
    # An all-zero matrix made a Floor of nothing, blamed on the source ("onnxruntime cannot run
    # it"); a bias of 999 or a matrix past int16 compared as a plain FAIL; "no" read as a swap.
    compiled = graphopt.optimize(_passthrough(FRAME), insert_op_conf=_config(tmp_path)).to_onnx()
    (prop,) = [p for p in compiled.metadata_props if p.key == "graphopt.preprocess"]
    recorded = json.loads(prop.value)
    recorded["x"][field] = value
    prop.value = json.dumps(recorded)
    with pytest.raises(InputError, match="its recorded preprocessing of input 'x' does not fit "
                                         r"the reference \(another model, or a damaged record\)"):
        compare_models(_passthrough(FRAME), compiled)


def test_compare_refuses_a_recorded_conversion_of_one_channel(tmp_path):
    # The colour conversion's Gather of channels 1 and 2 failed in onnxruntime, blamed on the
    # reference ("onnxruntime cannot run <reference>").
    grey = parse_model("g (float[1,1,12,16] x) => (float[1,1,12,16] y) { y = Identity (x) }")
    config = tmp_path / "grey.cfg"
    config.write_text("aipp_op {\n  input_format: YUV400_U8\n}\n")
    compiled = graphopt.optimize(grey, insert_op_conf=config).to_onnx()
    (prop,) = [p for p in compiled.metadata_props if p.key == "graphopt.preprocess"]
    recorded = json.loads(prop.value)
    recorded["x"]["csc_matrix"] = [256, 0, 0, 0, 256, 0, 0, 0, 256]
    prop.value = json.dumps(recorded)
    with pytest.raises(InputError, match="its recorded preprocessing of input 'x' does not fit "
                                         r"the reference \(another model, or a damaged record\)"):
        compare_models(grey, compiled)


@pytest.mark.parametrize("input_format", ["XRGB8888_U8", "ARGB8888_U8"])
@pytest.mark.parametrize("x_last", [False, True], ids=["XRGB", "RGBX"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_four_byte_pixels_drop_their_x_byte(tmp_path, input_format, x_last, layout):
    config = _config(tmp_path, input_format=input_format, matrix=None, swap=True,
                     crop=((2, 3), (7, 9)),
                     extra=f"  ax_swap_switch: {str(x_last).lower()}\n  mean_chn_2: 4\n")
    compiled = graphopt.optimize(_passthrough((7, 9), layout), insert_op_conf=config).to_onnx()
    frames = np.random.default_rng(4).integers(0, 256, (2, *FRAME, 4), np.uint8)
    rgb = frames[:, 2:9, 3:12, :3] if x_last else frames[:, 2:9, 3:12, 1:]
    expected = rgb[..., ::-1].astype(np.float32) - np.float32([0, 0, 4])
    if layout == "NCHW":
        expected = expected.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(numerics.run(compiled, {"x": frames})["y"], expected)


def test_four_byte_pixels_convert_and_compare_from_the_record(tmp_path, capsys):
    source, om = tmp_path / "net.onnx", tmp_path / "net.om"
    onnx.save(_classifier(), source)
    config = _config(tmp_path, input_format="XRGB8888_U8", matrix=RGB_TO_YUV,
                     input_bias=(0, 0, 0), output_bias=(16, 128, 128),
                     extra="  ax_swap_switch: true\n")
    rc, out, err = run_cli(capsys, "optimize", source, "-o", om, "--insert-op-conf", config,
                           "--verify")
    assert rc == 0, err
    assert "'x' takes uint8 [N,12,16,4] (XRGB8888_U8)" in out + err
    frames = np.random.default_rng(5).integers(0, 256, (2, *FRAME, 4), np.uint8)
    pixels = _converted(frames[..., :3], RGB_TO_YUV, (0, 0, 0), (16, 128, 128))
    expected = numerics.run(_classifier(), {"x": pixels.astype(np.float32).transpose(0, 3, 1, 2)})
    np.testing.assert_allclose(graphopt.load(om).run({"x": frames})["y"], expected["y"],
                               rtol=1e-4, atol=1e-5)
    assert compare_models(source, om).passed
    rc, out, _ = run_cli(capsys, "inspect", om)
    assert "'x': XRGB8888_U8 12x16, X byte last, colour matrix" in out


def test_ax_swap_switch_needs_a_four_byte_format(tmp_path):
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n input_format: RGB888_U8\n ax_swap_switch: true\n}\n")
    with pytest.raises(OptionError, match=":3: ax_swap_switch moves the X or alpha byte of "
                                          "XRGB8888_U8 and ARGB8888_U8; RGB888_U8 has none"):
        graphopt.optimize(_passthrough(FRAME), insert_op_conf=config)
