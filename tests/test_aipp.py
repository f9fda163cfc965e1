"""--insert-op-conf: ATC's static AIPP (crop, R/B swap, normalization of packed uint8 images)
compiled in front of the model, checked against the same preprocessing done in numpy."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt import numerics
from graphopt.aipp_config import read_aipp_config
from graphopt.codegen.feeds import load_npz, random_feeds
from graphopt.errors import InputError, OptionError
from graphopt.tools.compare import compare_models

MEAN, VAR_RECI = (124.0, 117.0, 104.0), (0.0171, 0.0175, 0.0174)
CONFIG = """# an ImageNet classifier fed BGR frames of 36x40, cropped to 32x32
aipp_op {
    aipp_mode: static
    related_input_rank: 0
    input_format : RGB888_U8
    src_image_size_w: 40
    src_image_size_h: 36
    crop: true
    load_start_pos_h: 2
    load_start_pos_w: 5
    rbuv_swap_switch: true
    csc_switch: false
    mean_chn_0: 124
    mean_chn_1: 117
    mean_chn_2: 104
    min_chn_0: 0.5
    var_reci_chn_0: 0.0171
    var_reci_chn_1: 0.0175
    var_reci_chn_2: 0.0174
}
"""


def _classifier(channels: int = 3, batch="1", dtype: str = "float",
                layout: str = "NCHW") -> onnx.ModelProto:
    """A padded 3x3 conv net over a [batch, channels, 32, 32] image (NHWC: transposed in)."""
    rng = np.random.default_rng(3)
    shape = f"[{batch},{channels},32,32]" if layout == "NCHW" else f"[{batch},32,32,{channels}]"
    into = "xc = Identity (x)" if layout == "NCHW" else "xc = Transpose <perm = [0,3,1,2]> (x)"
    cast_in, cast_out = ("xf = Cast <to = 1> (xc)", "y = Cast <to = 10> (yf)") \
        if dtype == "float16" else ("xf = Identity (xc)", "y = Identity (yf)")
    return parse_model(f"""
        g ({dtype}{shape} x) => ({dtype}[{batch},10] y) {{
            {into}
            {cast_in}
            c = Conv <pads = [1,1,1,1]> (xf, w, b)
            r = Relu (c)
            p = GlobalAveragePool (r)
            f = Flatten (p)
            yf = Gemm <transB = 1> (f, wf, bf)
            {cast_out}
        }}""", w=(rng.standard_normal((8, channels, 3, 3)) * 0.3).astype(np.float32),
        b=rng.standard_normal(8).astype(np.float32),
        wf=(rng.standard_normal((10, 8)) * 0.3).astype(np.float32),
        bf=rng.standard_normal(10).astype(np.float32))


def _config(tmp_path, text: str = CONFIG):
    path = tmp_path / "aipp.cfg"
    path.write_text(text)
    return path


def _images(batch: int = 1, channels: int = 3, size=(36, 40), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (batch, *size, channels), np.uint8)


def _preprocessed(images: np.ndarray) -> np.ndarray:
    """CONFIG's preprocessing in numpy: crop, swap R and B, normalize, NHWC to NCHW."""
    x = images[:, 2:34, 5:37, ::-1].astype(np.float32)
    x = (x - np.array(MEAN, np.float32) - np.array([0.5, 0, 0], np.float32)) \
        * np.array(VAR_RECI, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def test_the_config_is_read_as_atc_writes_it(tmp_path):
    (op,) = read_aipp_config(_config(tmp_path))
    assert (op.input_format, op.src_size, op.crop, op.crop_start, op.swap_rb) == \
        ("RGB888_U8", (36, 40), True, (2, 5), True)
    assert op.mean == MEAN and op.minimum == (0.5, 0.0, 0.0) and op.var_reci == VAR_RECI
    # "aipp_op: {", quoted enums and defaults for everything left out.
    (op,) = read_aipp_config(_config(tmp_path, 'aipp_op: { input_format: "YUV400_U8" }'))
    assert (op.channels, op.mean, op.var_reci, op.crop) == (1, (0.0,), (1.0,), False)


@pytest.mark.parametrize("level", [0, 2, 3])
def test_the_compiled_model_takes_images_as_numpy_preprocessing_feeds_the_original(tmp_path,
                                                                                    level):
    model = _classifier()
    result = graphopt.optimize(model, level=level, insert_op_conf=_config(tmp_path))
    compiled = result.to_onnx()
    onnx.checker.check_model(compiled, full_check=True)
    (image_input,) = compiled.graph.input
    assert image_input.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    images = _images()
    expected = numerics.run(model, {"x": _preprocessed(images)})["y"]
    actual = numerics.run(compiled, {"x": images})["y"]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    assert "'x' takes uint8 [1,36,40,3] (RGB888_U8)" in " ".join(result.notes)


def test_the_artifact_verifies_inspects_and_compares_against_the_source(tmp_path, capsys):
    source = tmp_path / "net.onnx"
    onnx.save(_classifier(batch="N"), source)
    om = tmp_path / "net.om"
    rc, out, err = run_cli(capsys, "optimize", source, "-o", om, "--insert-op-conf",
                           _config(tmp_path), "--verify")
    assert rc == 0, err
    session = graphopt.load(om)
    assert session.inputs[0]["dtype"] == "uint8" and session.inputs[0]["shape"] == \
        ["N", 36, 40, 3]
    images = _images(batch=2)  # the batch stays open
    expected = numerics.run(_classifier(batch="N"), {"x": _preprocessed(images)})["y"]
    np.testing.assert_allclose(session.run({"x": images})["y"], expected, rtol=1e-4, atol=1e-5)
    rc, out, _ = run_cli(capsys, "inspect", om)
    assert "preprocess  --insert-op-conf: 'x': RGB888_U8 36x40, crop 32x32 at 2,5, R/B " \
           "swapped, (x - [124, 117, 104] - [0.5, 0, 0]) * [0.0171, 0.0175, 0.0174], to NCHW" \
           in out
    report = compare_models(source, om)  # the source runs with the recorded preprocessing
    assert report.passed
    assert any("takes uint8 images (insert_op_conf)" in note for note in report.notes)
    # Preprocessed float tensors: the refusal named the source, with the .om's dtype.
    rc, _, err = run_cli(capsys, "compare", source, om, "--inputs",
                         _npz(tmp_path, x=_preprocessed(images)))
    assert rc == 2 and f"input 'x' has dtype float32, but {om} takes uint8 there (its " \
                       "compile's --insert-op-conf)" in err, err


def test_a_lossy_compiles_note_says_its_images_got_every_pixel_value(tmp_path, capsys):
    # The note said "standard normal floats, integers 0 and 1" of uint8 images drawn 0-255.
    source = tmp_path / "net.onnx"
    onnx.save(_classifier(), source)
    rc, out, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "net.om",
                           "--insert-op-conf", _config(tmp_path), "--precision", "fp16")
    assert rc == 0, err
    assert "note: measured on seeded random inputs (standard normal floats, integers 0 and 1, " \
           "pixels 0-255 in --insert-op-conf's images), unlike a deployment's" in out, out


def test_compare_with_a_reference_the_recorded_preprocessing_cannot_feed(tmp_path):
    om = tmp_path / "net.om"
    graphopt.save(graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path)), om)
    other = parse_model("g (float[1,3,30,30] x) => (float[1,3,30,30] y) { y = Relu (x) }")
    with pytest.raises(InputError) as refused:
        compare_models(other, om)
    assert str(refused.value) == (
        f"{om} was compiled with insert_op_conf, and its recorded preprocessing does not fit "
        "the reference: crop_size_h 32, but input 'x' is 30 along h (graphopt does not resize)")


def test_nhwc_inputs_grayscale_and_float16_models(tmp_path):
    gray = _config(tmp_path, "aipp_op { input_format: YUV400_U8 mean_chn_0: 128 "
                             "var_reci_chn_0: 0.0078125 }")
    images = _images(channels=1, size=(32, 32))
    scaled = (images.astype(np.float32) - 128) * 0.0078125
    for layout, feed in (("NHWC", scaled), ("NCHW", scaled.transpose(0, 3, 1, 2))):
        model = _classifier(channels=1, layout=layout)
        compiled = graphopt.optimize(model, insert_op_conf=gray).to_onnx()
        np.testing.assert_allclose(numerics.run(compiled, {"x": images})["y"],
                                   numerics.run(model, {"x": np.ascontiguousarray(feed)})["y"],
                                   rtol=1e-4, atol=1e-5)
    half = _classifier(dtype="float16")
    compiled = graphopt.optimize(half, insert_op_conf=_config(tmp_path)).to_onnx()
    images = _images()
    np.testing.assert_allclose(
        numerics.run(compiled, {"x": images})["y"].astype(np.float32),
        numerics.run(half, {"x": _preprocessed(images).astype(np.float16)})["y"]
        .astype(np.float32), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("crop, swap", [("1", "0"), ("True", "False"), ("t", "f")])
def test_booleans_and_field_ends_are_read_as_protobufs_text_format_reads_them(tmp_path, crop,
                                                                              swap):
    # ATC parses the file with protobuf, which takes these spellings and a ';' or ',' after a
    # field; `crop: 1` was refused.
    text = (f"aipp_op {{ input_format: RGB888_U8; crop: {crop}, rbuv_swap_switch: {swap};\n"
            "  load_start_pos_h: 2 load_start_pos_w: 4; src_image_size_h: 40, "
            "src_image_size_w: 44 }")
    (op,) = read_aipp_config(_config(tmp_path, text))
    assert op.crop and not op.swap_rb and op.crop_start == (2, 4)


@pytest.mark.parametrize("text, message", [
    ("aipp_op { input_format: RGB888_U8 padding: true }",
     ":1: padding: true: graphopt does not implement this AIPP step"),
    ("aipp_op { input_format: RGB888_U8 matrix_r0c0: x }",
     "matrix_r0c0: expected a whole number, found 'x'"),
    ("aipp_op { input_format: RGB888_U8 csc_switch: true }",
     ":1: csc_switch: true, but no matrix_r*c* is given"),
    ("aipp_op { input_format: YUYV_U8 }",
     "input_format YUYV_U8 is an ATC format graphopt does not implement"),
    ("aipp_op { input_format: RGB }", "input_format RGB is not an AIPP input format"),
    ("aipp_op { aipp_mode: dynamic input_format: RGB888_U8 }", "graphopt compiles static AIPP"),
    # A dynamic block's own key was reported as an unknown key before its mode.
    ("aipp_op {\n aipp_mode: dynamic\n max_src_image_size: 752128\n}",
     ":2: aipp_mode dynamic: graphopt compiles static AIPP"),
    ("aipp_op {\n input_format: RGB888_U8\n mean_chn0: 1 }", ":3: mean_chn0: not an AIPP key"),
    ("aipp_op { input_format: RGB888_U8 crop: yes }", "crop: expected true or false"),
    ("aipp_op { input_format: RGB888_U8 mean_chn_0: 1 mean_chn_0: 2 }", "set twice"),
    ("aipp_op { input_format: RGB888_U8 mean_chn_0: x }", "expected a number, found 'x'"),
    ("aipp_op { input_format: RGB888_U8 crop: true load_start_pos_w: 1_0 }",
     "load_start_pos_w: expected a whole number, found '1_0'"),
    ("aipp_op { input_format: RGB888_U8", "aipp_op block is not closed"),
    ("aipp_op { input_format: YUV400_U8 mean_chn_1: 3 }", "YUV400_U8 has 1 channel"),
    ("aipp_op { input_format: RGB888_U8 load_start_pos_w: 3 }", "applies with crop: true"),
    ("aipp_op { input_format: RGB888_U8 crop: true load_start_pos_w: 99999999999999999999 }",
     "load_start_pos_w: 99999999999999999999 is too large"),
    ("aipp_op { input_format: RGB888_U8 }\naipp_op { input_format: RGB888_U8 }",
     "aipp.cfg:2: related_input_rank 0 has an aipp_op block already (line 1); one block per "
     "input"),
    ("aipp_op { input_format: RGB888_U8 }\naipp_op {\n input_format: RGB888_U8\n"
     " related_input_rank: 0 }", "aipp.cfg:4: related_input_rank 0 has an aipp_op block already"),
    ("", "no aipp_op block"),
    ('aipp_op {\n input_format: "RGB888_U8\n}', ':2: a quote that is not closed on its line'),
])
def test_configurations_graphopt_cannot_honour_are_refused_by_line_and_key(tmp_path, text,
                                                                           message):
    with pytest.raises(OptionError) as caught:
        graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path, text))
    assert message in str(caught.value)


@pytest.mark.parametrize("text, model, message", [
    ("aipp_op { input_format: YUV400_U8 }", None, "neither its dim 1 (NCHW) nor its dim 3"),
    ("aipp_op { input_format: RGB888_U8 related_input_rank: 1 }", None,
     "related_input_rank 1, but the model has 1 input(s)"),
    ("aipp_op { input_format: RGB888_U8 src_image_size_w: 40 src_image_size_h: 32 }", None,
     "src_image_size_w 40, but input 'x' is 32 along w (graphopt does not resize; crop: true "
     "takes a part of the image)"),
    ("aipp_op { input_format: RGB888_U8 crop: true load_start_pos_w: 9 "
     "src_image_size_w: 40 }", None,
     "aipp.cfg:1: the crop from load_start_pos_w 9 takes 32 along w, past the source image's 40"),
    ("aipp_op { input_format: RGB888_U8 crop: true crop_size_w: 30 }", None,
     "crop_size_w 30, but input 'x' is 32 along w"),
    ("aipp_op { input_format: RGB888_U8 }", "dynamic",
     "has a dynamic h ('H'); give src_image_size_h"),
])
def test_inputs_the_preprocessing_cannot_feed_are_refused_naming_them(tmp_path, text, model,
                                                                      message):
    if model == "dynamic":
        proto = parse_model("g (float[1,3,H,W] x) => (float[1,3,H,W] y) { y = Relu (x) }")
    else:
        proto = _classifier()
    with pytest.raises(OptionError) as caught:
        graphopt.optimize(proto, insert_op_conf=_config(tmp_path, text))
    assert message in str(caught.value)


def test_an_unreadable_file_is_an_input_error_and_the_cli_names_the_flag(tmp_path, capsys):
    with pytest.raises(InputError, match="cannot read it"):
        graphopt.optimize(_classifier(), insert_op_conf=tmp_path / "missing.cfg")
    binary = tmp_path / "model.onnx"  # a model given for the configuration file
    onnx.save(_classifier(), binary)
    with pytest.raises(InputError, match=r"model.onnx: not an ATC configuration file \(not "
                                         r"UTF-8 text: byte \d+\)$"):
        graphopt.optimize(_classifier(), insert_op_conf=binary)
    source = tmp_path / "net.onnx"
    onnx.save(_classifier(), source)
    bad = _config(tmp_path, "aipp_op { input_format: RGB888_U8 resize: true }")
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "o.om",
                         "--insert-op-conf", bad)
    assert rc == 1 and f"graphopt: error: {bad}:1: resize: true: graphopt does not " in err
    assert not (tmp_path / "o.om").exists()


def test_int8_calibrates_on_the_images_the_model_now_takes(tmp_path, capsys):
    source = tmp_path / "net.onnx"
    onnx.save(_classifier(), source)
    calibration = tmp_path / "frames.npz"
    np.savez(calibration, x=_images(batch=8, seed=1))
    rc, out, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "q.onnx",
                           "--insert-op-conf", _config(tmp_path), "--quantize", "int8",
                           "--calibration", calibration)
    assert rc == 0, err
    assert f"accuracy vs {source} with --insert-op-conf's preprocessing on" in out
    row = next(line for line in out.splitlines() if line.startswith("y "))
    assert float(row.split()[3]) > 0.99


def test_compare_feeds_images_of_every_pixel_value(tmp_path):
    # Seeded uint8 inputs were 0/1 (safe as indices): a compile that clipped the pixels at 1
    # passed compare and --verify alike.
    model = _classifier()
    compiled = graphopt.optimize(model, level=0, insert_op_conf=_config(tmp_path)).to_onnx()
    (crop,) = [n for n in compiled.graph.node if n.op_type == "Slice"]
    compiled.graph.node.insert(0, onnx.helper.make_node("Min", ["x", "one"], ["x_clipped"]))
    compiled.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1, np.uint8), "one"))
    crop.input[0] = "x_clipped"
    assert not compare_models(model, compiled).passed


def test_a_shape_profiles_artifact_records_its_preprocessing(tmp_path, capsys):
    source = tmp_path / "net.onnx"
    onnx.save(_classifier(batch="N"), source)
    om = tmp_path / "net.om"
    rc, _, err = run_cli(capsys, "optimize", source, "-o", om, "--insert-op-conf",
                         _config(tmp_path), "--dynamic-dims", "N:1,2")
    assert rc == 0, err
    assert compare_models(source, om).passed  # refused the uint8 input without the record
    rc, out, _ = run_cli(capsys, "inspect", om)
    assert "preprocess  --insert-op-conf: 'x': RGB888_U8 36x40" in out


def test_shape_profiles_verify_on_an_inputs_file_of_images(tmp_path, capsys):
    source, om, images = tmp_path / "net.onnx", tmp_path / "net.om", tmp_path / "frames.npz"
    onnx.save(_classifier(batch="N"), source)
    np.savez(images, x=_images(batch=2))
    rc, _, err = run_cli(capsys, "optimize", source, "-o", om, "--insert-op-conf",
                         _config(tmp_path), "--dynamic-dims", "N:1,2", "--verify",
                         "--inputs", images)
    assert rc == 0, err  # the file was checked against the float input the images replace


def test_the_settings_of_a_switched_off_step_are_read_and_ignored_as_in_atc(tmp_path):
    # ATC's sample files keep a colour matrix beside csc_switch: false.
    text = CONFIG.replace("csc_switch: false", "csc_switch: false\n matrix_r0c0: 298\n "
                          "matrix_r1c1: -100\n input_bias_0: 16\n padding_value: 3")
    plain = graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path)).to_onnx()
    with_matrix = graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path, text))
    images = _images()
    np.testing.assert_array_equal(numerics.run(with_matrix.to_onnx(), {"x": images})["y"],
                                  numerics.run(plain, {"x": images})["y"])


def test_the_note_shows_the_input_as_input_shape_pins_it(tmp_path):
    # It showed [N,36,40,3] while the .om took [2,36,40,3].
    result = graphopt.optimize(_classifier(batch="N"), insert_op_conf=_config(tmp_path),
                               input_shapes={"x": [2, 36, 40, 3]})
    assert "'x' takes uint8 [2,36,40,3] (RGB888_U8)" in " ".join(result.notes)


def test_a_pin_of_the_models_own_shape_on_a_frame_input_says_what_it_pins(tmp_path, capsys):
    # ATC's --input_shape names the model's shape; optimize's pins the frame, and its refusal
    # blamed the model for the frame's size ("fixed to 36 by the model").
    onnx.save(_classifier(batch="N"), tmp_path / "m.onnx")
    rc, _, err = run_cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "m.om",
                         "--insert-op-conf", _config(tmp_path), "--input-shape", "x:2,3,32,32")
    assert rc == 1 and "input 'x' dim 1 is fixed to 36 by --insert-op-conf's uint8 frame, " \
        "cannot pin it to 3 (with --insert-op-conf, --input-shape pins the frame such an input " \
        "takes, not the model's own shape)" in err, err


def test_the_source_size_defaults_to_the_models_as_in_atc(tmp_path):
    # A crop needs the frame's size: by default it is the model's, which leaves no room.
    text = "aipp_op { input_format: RGB888_U8 crop: true load_start_pos_h: 2 }"
    with pytest.raises(OptionError, match=r"past the source image's 32 \(src_image_size_h, by "
                                          r"default the model's\)"):
        graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path, text))
    fitting = "aipp_op { input_format: RGB888_U8 crop: true }"  # from (0, 0): the whole image
    compiled = graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path, fitting))
    assert compiled.to_onnx().graph.input[0].type.tensor_type.shape.dim[1].dim_value == 32


def test_an_open_size_the_file_leaves_out_is_the_pinned_images_as_in_atc(tmp_path):
    # ATC takes a source size the file leaves out from --input_shape; graphopt refused the
    # model's open height ("give src_image_size_h") whatever the pin of the image said.
    model = parse_model("""
        g (float[1,3,H,W] x) => (y) { y = Conv <pads = [1,1,1,1]> (x, w) }""",
                        w=np.random.default_rng(4).standard_normal((4, 3, 3, 3)).astype(np.float32))
    config = _config(tmp_path, "aipp_op { input_format: RGB888_U8 mean_chn_0: 124 }")
    result = graphopt.optimize(model, insert_op_conf=config, input_shapes={"x": [1, 24, 20, 3]})
    images = _images(size=(24, 20))
    expected = images.transpose(0, 3, 1, 2).astype(np.float32) - \
        np.array([124, 0, 0], np.float32)[:, None, None]
    np.testing.assert_allclose(numerics.run(result.to_onnx(), {"x": images})["y"],
                               numerics.run(model, {"x": expected})["y"], rtol=1e-5, atol=1e-4)
    yuv = _config(tmp_path, "aipp_op { input_format: YUV420SP_U8 csc_switch: false }")
    result = graphopt.optimize(model, insert_op_conf=yuv, input_shapes={"x": [1, 36, 20, 1]})
    assert "'x' takes uint8 [1,36,20,1] (YUV420SP_U8)" in " ".join(result.notes)
    with pytest.raises(OptionError, match=r"give src_image_size_h, or the image's size in "
                                          r"input_shapes \(x:N,H\*3/2,W,1\)"):
        graphopt.optimize(model, insert_op_conf=yuv)


def test_the_pinned_image_size_holds_across_batch_profiles_and_verification(tmp_path, capsys):
    # The pin sized the images of one compile; shape profiles (a dynamic batch) and the
    # references --verify and the accuracy report build dropped it, and refused the model.
    model = parse_model("""
        g (float[N,3,H,W] x) => (y) { y = Conv <pads = [1,1,1,1]> (x, w) }""",
                        w=np.random.default_rng(4).standard_normal((4, 3, 3, 3)).astype(np.float32))
    path = tmp_path / "open.onnx"
    onnx.save(model, path)
    config = _config(tmp_path, "aipp_op { input_format: RGB888_U8 mean_chn_0: 124 }")
    for extra in ((), ("--dynamic-dims", "N:1,2")):
        rc, out, err = run_cli(capsys, "optimize", path, "-o", tmp_path / "open.om",
                               "--insert-op-conf", config, "--input-shape", "x:-1,24,20,3"
                               if extra else "x:1,24,20,3", "--verify", *extra)
        assert rc == 0, err
        assert "verified" in out and "shape profiles" in out if extra else "verified" in out
    with graphopt.load(tmp_path / "open.om") as session:
        for batch in (1, 2):
            images = _images(batch=batch, size=(24, 20))
            expected = images.transpose(0, 3, 1, 2).astype(np.float32) - \
                np.array([124, 0, 0], np.float32)[:, None, None]
            want = numerics.run(model, {"x": expected})["y"]
            np.testing.assert_allclose(session.run({"x": images})["y"], want, rtol=1e-5,
                                       atol=1e-6 * np.abs(want).max())


def test_calibration_data_of_the_preprocessed_form_are_refused_with_the_reason(tmp_path):
    calibration = tmp_path / "tensors.npz"
    np.savez(calibration, x=np.zeros((4, 3, 32, 32), np.float32))
    with pytest.raises(OptionError, match="insert_op_conf makes the model take uint8 images"):
        graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path), quantize="int8",
                          calibration=calibration)


def test_profile_draws_random_images_of_every_pixel_value(tmp_path, monkeypatch):
    from graphopt.tools import profile as profile_module

    om = tmp_path / "net.om"
    graphopt.save(graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path)), om)
    drawn = []
    feeds_of = profile_module._feeds

    def kept(*args, **kwargs):
        drawn.append(feeds_of(*args, **kwargs))
        return drawn[-1]

    monkeypatch.setattr(profile_module, "_feeds", kept)
    profile_module.profile_model(str(om), repeat=1, warmup=0)
    assert drawn[0]["x"].max() > 200


def test_run_draws_random_images_of_every_pixel_value(tmp_path, capsys):
    om = tmp_path / "net.om"
    graphopt.save(graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path)), om)
    out = tmp_path / "y.npz"
    rc, _, err = run_cli(capsys, "run", om, "--outputs", out)
    assert rc == 0, err
    images = random_feeds(graphopt.load(om).inputs, seed=0, images={"x"})["x"]
    assert images.max() > 200  # not the 0/1 of an index input
    expected = numerics.run(_classifier(), {"x": _preprocessed(images)})["y"]
    np.testing.assert_allclose(load_npz(out)["y"], expected, rtol=1e-4, atol=1e-5)


def test_inspect_shows_the_preprocessing_of_an_onnx_output_too(tmp_path, capsys):
    written = tmp_path / "net.onnx"
    graphopt.save(graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path),
                                    out_nodes="r"), written)
    rc, out, _ = run_cli(capsys, "inspect", written)
    assert rc == 0
    assert "  cut         --out-nodes: the source's output(s) y are no longer outputs" in out
    assert "  preprocess  --insert-op-conf: 'x': RGB888_U8 36x40, crop 32x32 at 2,5" in out
    rc, out, _ = run_cli(capsys, "inspect", written, "--json")
    summary = json.loads(out)
    assert summary["outputs_cut"] == ["y"] and summary["preprocess"]["x"]["swap_rb"] is True
    om = tmp_path / "net.om"
    graphopt.save(graphopt.optimize(_classifier(), insert_op_conf=_config(tmp_path),
                                    out_nodes="r"), om)
    rc, _, err = run_cli(capsys, "report", om, "-o", tmp_path / "net.html")
    assert rc == 0, err
    page = (tmp_path / "net.html").read_text()
    assert "<th>preprocess</th><td>--insert-op-conf: &#x27;x&#x27;: RGB888_U8 36x40" in page
    assert "<th>cut</th><td>--out-nodes: the source&#x27;s output(s) y are no longer outputs" in page



@pytest.mark.parametrize("text, message", [
    ("var_reci_chn_0: 1e39", ":3: var_reci_chn_0: 1e39 is past float32's largest value"),
    ("mean_chn_1: -4e38", ":3: mean_chn_1: -4e38 is past float32's largest value"),
    ("mean_chn_0: 3e38\n min_chn_0: 3e38", ":1: aipp_op: channel 0's (pixel - mean_chn_0 - "
                                           "min_chn_0) * var_reci_chn_0 reaches past float32's "
                                           "largest value"),
    ("mean_chn_2: 1e38\n var_reci_chn_2: 10", ":1: aipp_op: channel 2's (pixel - mean_chn_2 - "
                                              "min_chn_2) * var_reci_chn_2 reaches past "
                                              "float32's largest value"),
])
def test_normalization_past_float32_is_refused(tmp_path, text, message):
    # Finite as Python reads them, 1e39 and a sum of two 3e38 became inf in the float32
    # constants: the compiled model returned inf and NaN for every pixel.
    config = _config(tmp_path, "aipp_op {\n input_format: RGB888_U8\n " + text + "\n}\n")
    with pytest.raises(OptionError) as caught:
        graphopt.optimize(_classifier(), insert_op_conf=config)
    assert message in str(caught.value)


@pytest.mark.parametrize("value", ["1_04", "١٠٤", "+104", "１０４"])
def test_normalization_numbers_are_read_as_atc_reads_them(tmp_path, value):
    # float() read "1_04" as 104 and Arabic-Indic or full-width digits as their values, which
    # ATC's parser refuses: the whole numbers were checked so, the normalization's were not.
    config = _config(tmp_path, f"aipp_op {{\n input_format: RGB888_U8\n mean_chn_0: {value}\n}}")
    with pytest.raises(OptionError) as caught:
        graphopt.optimize(_classifier(), insert_op_conf=config)
    assert f":3: mean_chn_0: expected a number, found {value!r}" in str(caught.value)
    fine = _config(tmp_path, "aipp_op { input_format: RGB888_U8 mean_chn_0: -1.5e1 min_chn_0: .5 "
                             "var_reci_chn_0: 2. }")
    assert read_aipp_config(fine)[0].mean[0] == -15.0


def test_float32s_largest_value_as_printed_is_read(tmp_path):
    # 3.4028235e38 is FLT_MAX rounded for printing, a little above it as a Python float.
    config = _config(tmp_path, "aipp_op { input_format: YUV400_U8 min_chn_0: 3.4028235e38 "
                               "var_reci_chn_0: 0 }")
    assert read_aipp_config(config)[0].minimum == (3.4028235e38,)


def test_an_input_of_both_layouts_reads_as_nchw_and_the_note_says_so(tmp_path):
    model = parse_model("g (float[1,3,8,3] x) => (float[1,3,8,3] y) { y = Identity (x) }")
    result = graphopt.optimize(model, insert_op_conf=_config(
        tmp_path, "aipp_op { input_format: RGB888_U8 rbuv_swap_switch: true }"))
    assert "'x' takes uint8 [1,8,3,3] (RGB888_U8), its input read as NCHW (dims 1 and 3 are " \
        "both 3)" in " ".join(result.notes)
    images = _images(size=(8, 3))
    np.testing.assert_array_equal(numerics.run(result.to_onnx(), {"x": images})["y"],
                                  images[..., ::-1].transpose(0, 3, 1, 2).astype(np.float32))


@pytest.mark.parametrize("profiles", [None, "N:1,2"])
def test_verify_inputs_of_preprocessed_tensors_are_refused_saying_frames_are_taken(
        tmp_path, capsys, profiles):
    source, tensors = tmp_path / "net.onnx", tmp_path / "tensors.npz"
    onnx.save(_classifier(batch="N"), source)
    np.savez(tensors, x=_preprocessed(_images()))
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "net.om",
                         "--insert-op-conf", _config(tmp_path), "--verify", "--inputs", tensors,
                         *(["--dynamic-dims", profiles] if profiles else []))
    assert rc == 1 and "input 'x' has dtype float32, expected uint8[N,36,40,3] " \
        "(--insert-op-conf makes the model take uint8 frames: give them, not preprocessed " \
        "tensors)" in err


def _npz(folder, **arrays) -> str:
    path = folder / "feeds.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("lines, line, message", [
    (["input_format: YUYV_U8"], 3, "input_format YUYV_U8 is an ATC format graphopt does not"),
    (["input_format: YUV400_U8"], 3, "neither its dim 1 (NCHW) nor its dim 3 (NHWC) is the 1"),
    (["input_format: RGB888_U8", "related_input_rank: 1"], 4,
     "related_input_rank 1, but the model has 1 input(s)"),
    (["input_format: YUV420SP_U8", "crop: true", "load_start_pos_h: 3", "load_start_pos_w: 4",
      "crop_size_h: 32", "crop_size_w: 32", "src_image_size_h: 40", "src_image_size_w: 40"], 5,
     "load_start_pos_h 3 is odd")])
def test_a_refusal_made_against_the_model_cites_the_keys_line(tmp_path, lines, line, message):
    # They cited the block's first line (`aipp_op {`).
    config = _config(tmp_path, "aipp_op {\n  aipp_mode: static\n" +
                     "".join(f"  {text}\n" for text in lines) + "}\n")
    with pytest.raises(OptionError) as caught:
        graphopt.optimize(_classifier(), insert_op_conf=str(config))
    assert f"{config}:{line}: " in str(caught.value) and message in str(caught.value), \
        str(caught.value)


def test_a_failed_verify_says_the_seeded_frames_held_pixel_values():
    # It said "standard normal values" of the uint8 frames, which are drawn from 0 to 255.
    from graphopt.compile_verify import _seeded_inputs_hint
    from graphopt.passes import Options

    hint = _seeded_inputs_hint(None, Options(), frames=True)
    assert "uniform pixel values, 0 to 255, for the frames insert_op_conf made the inputs" \
        in hint and "standard normal" not in hint
    assert "standard normal values" in _seeded_inputs_hint(None, Options())
