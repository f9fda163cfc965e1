"""graphopt atc: an atc command line as it is, translated into graphopt optimize's flags."""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt.cli_atc import translate
from graphopt.errors import OptionError, UsageError


def _args(**given) -> argparse.Namespace:
    fields = dict(model="m.onnx", framework="5", output="out/m", soc_version="Ascend310",
                  input_shape=None, input_format=None, precision_mode=None,
                  precision_mode_v2=None, out_nodes=None, insert_op_conf=None, keep_dtype=None,
                  input_fp16_nodes=None, output_type=None, fusion_switch_file=None,
                  dynamic_batch_size=None, dynamic_image_size=None, dynamic_dims=None, log=None,
                  mode="0", om=None, json=None)
    fields.update(given)
    return argparse.Namespace(**fields)


@pytest.mark.parametrize("given, expected", [
    ({}, ["optimize", "m.onnx", "-o", "out/m.om", "--target", "ascend310"]),
    ({"output": "out/m.om"}, ["optimize", "m.onnx", "-o", "out/m.om"]),
    ({"soc_version": "Ascend310B1"}, ["--target", "ascend310b"]),
    ({"soc_version": "Ascend910B3"}, ["--target", "ascend910b"]),
    ({"soc_version": "Ascend910B2C"}, ["--target", "ascend910b"]),
    ({"soc_version": "ascend910b"}, ["--target", "ascend910b"]),
    ({}, ["--precision", "fp16"]),  # ATC's default precision mode, force_fp16
    ({"precision_mode": "force_fp16"}, ["--precision", "fp16"]),
    ({"precision_mode": "allow_mix_precision"}, ["--precision", "mixed-fp16"]),
    ({"precision_mode_v2": "origin"}, ["--precision", "keep"]),
    ({"out_nodes": "Conv_1:0", "output_type": "FP16", "log": "error"},
     ["--out-nodes", "Conv_1:0", "--output-type", "FP16", "-q"]),
    # A trailing ';' names nothing, as ATC reads it.
    ({"out_nodes": "Conv_1:0;", "input_fp16_nodes": "x;"},
     ["--out-nodes", "Conv_1:0", "--input-fp16-nodes", "x"]),
    ({"input_shape": "x:-1,3,224,224", "dynamic_batch_size": "1,2,4"},
     ["--input-shape", "x:-1,3,224,224", "--precision", "fp16", "--dynamic-dims",
      "x[0]=1;x[0]=2;x[0]=4"]),
    ({"input_shape": "x:1,3,-1,-1", "dynamic_image_size": "224,224;448,320"},
     ["--dynamic-dims", "x[2]=224,x[3]=224;x[2]=448,x[3]=320"]),
    # One H,W per profile for every input, as ATC's own example has it.
    ({"input_shape": "data:8,3,-1,-1;img_info:8,4,-1,-1", "dynamic_image_size": "416,416;832,832"},
     ["--dynamic-dims", "data[2]=416,data[3]=416,img_info[2]=416,img_info[3]=416;"
                        "data[2]=832,data[3]=832,img_info[2]=832,img_info[3]=832"]),
    ({"input_shape": "v:1,1,4,-1,-1", "input_format": "NCDHW", "dynamic_image_size": "8,6"},
     ["--dynamic-dims", "v[3]=8,v[4]=6"]),
    ({"input_shape": "ids:1,-1;mask:1,-1", "dynamic_dims": "16,16;64,64", "input_format": "ND"},
     ["--dynamic-dims", "ids[1]=16,mask[1]=16;ids[1]=64,mask[1]=64"]),
])
def test_atc_flags_become_graphopts(given, expected):
    argv = translate(_args(**given))
    runs = [argv[i:i + len(expected)] for i in range(len(argv))]
    assert expected in runs, argv


@pytest.mark.parametrize("given, message", [
    ({"framework": "3"}, "--framework=3: graphopt reads ONNX models (--framework=5)"),
    # --mode=1 and 6 show --om as it is: a compile flag there does nothing in ATC.
    ({"mode": "1", "om": "m.om", "json": "m.json"}, "--model, --output: compile flags; "
                                                   "--mode=1 shows --om as it is"),
    ({"mode": "6", "om": "m.om", "json": "m.json", "model": None, "output": None},
     "--json: --mode=6 prints the summary; --mode=1 writes the JSON"),
    ({"om": "m.om"}, "--om: for --mode=1 and 6, which show a model; --mode=0 compiles"),
    ({"mode": "2"}, "--mode=2: graphopt atc takes --mode=0 (compile), 1 (a model as JSON) and 6"),
    ({"soc_version": "Ascend310P3"}, "--soc_version=Ascend310P3: graphopt has target profiles "
                                     "for Ascend310, Ascend310B* and Ascend910B*"),
    ({"soc_version": "Ascend310B1x"}, "--soc_version=Ascend310B1x: graphopt has target "
                                      "profiles for"),
    ({"soc_version": "Ascend910Bx2"}, "--soc_version=Ascend910Bx2: graphopt has target "
                                      "profiles for"),
    ({"precision_mode": "allow_fp32_to_fp16"}, "--precision_mode=allow_fp32_to_fp16: ATC runs "
                                               "cube ops in fp16 there and keeps every other op "
                                               "in float32 where its kernel takes it, which "
                                               "graphopt has no mode for: allow_mix_precision "
                                               "is nearest"),
    ({"precision_mode": "allow_fp32_to_bf16"}, "allow_mix_precision_bf16 is nearest"),
    ({"framework": "ONNX"}, "--framework=ONNX: ATC names the framework by number; ONNX is "
                            "--framework=5"),
    ({"mode": "3"}, "its --mode=3 (a pre-check of the model's ops) is graphopt partition MODEL "
                    "--target NAME"),
    ({"precision_mode": "allow_fp16_to_fp32"}, "--precision_mode=allow_fp16_to_fp32: graphopt "
                                               "atc takes force_fp16"),
    ({"precision_mode": "force_fp32"}, "--precision_mode=force_fp32: ATC computes cube ops from "
                                       "float16 inputs into float32 there, which graphopt has "
                                       "no mode for: must_keep_origin_dtype keeps float32"),
    ({"precision_mode_v2": "cube_fp16in_fp32out"}, "origin keeps float32 throughout"),
    ({"precision_mode": "force_fp16", "precision_mode_v2": "fp16"}, "give one"),
    ({"input_format": "NC1HWC0"}, "--input_format=NC1HWC0: ATC takes NCHW (its default), NCDHW "
                                  "or ND for an ONNX model"),
    ({"input_format": "NHWC"}, "ATC takes NCHW (its default), NCDHW or ND"),
    ({"log": "verbose"}, "--log=verbose: ATC's levels are debug, info, warning, error, null"),
    ({"input_shape": "x:1~4,3,8,8"}, "shape ranges (1~10) are not taken: -1 with --dynamic_dims"),
    ({"input_shape": "x:0,3,8,8"}, "'x:0,3,8,8': ATC takes no dim of 0"),
    ({"input_shape": "x:-2"}, "'x:-2': -2 is ATC's unknown rank, which graphopt does not take"),
    ({"input_shape": "x:1,3,8,8", "dynamic_batch_size": "1,2"},
     "--dynamic_batch_size: --input_shape gives no -1 dim"),
    # A -1 that is not a batch dim got the batch size: 1×1 images at batch 1.
    ({"input_shape": "x:-1,3,-1,-1", "dynamic_batch_size": "1,2"},
     "--dynamic_batch_size: --input_shape gives -1 at x[2], x[3], not a first dim"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": "1,0"}, "sizes of 1 or more"),
    ({"input_shape": "x:1,3,-1,-1", "dynamic_image_size": "224"},
     "each profile gives a height and a width (H,W), for every input's -1 height and width "
     "(x[2], x[3])"),
    # graphopt's former spelling, a value per -1 dim, is no ATC line.
    ({"input_shape": "a:1,3,-1,-1;b:1,4,-1,-1", "dynamic_image_size": "8,8,8,8"},
     "each profile gives a height and a width (H,W)"),
    ({"input_shape": "x:-1,3,-1,-1", "dynamic_image_size": "8,8"},
     "takes -1 as an input's height and width, dims 2 and 3 of its --input_format"),
    ({"input_shape": "x:1,-1", "input_format": "ND", "dynamic_image_size": "8,8"},
     "--input_format=ND has no height or width"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": "1", "dynamic_dims": "2"},
     "--dynamic_batch_size and --dynamic_dims: ATC takes one of them"),
    # Each compiled a fully dynamic model without a word (a script's unset variable).
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": ""}, "--dynamic_batch_size=: an "
                                                              "empty value"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": ","}, "an empty value"),
    ({"input_shape": "ids:1,-1", "dynamic_dims": ";"}, "--dynamic_dims=;: an empty value"),
    ({"input_shape": ";;"}, "--input_shape=;;: an empty value"),
    ({"input_format": ""}, "--input_format=: an empty value"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": "1,,2"}, "sizes of 1 or more"),
    # The last of the two was taken, where graphopt optimize refuses the pins.
    ({"input_shape": "x:1,3,8,8;x:2,3,8,8"}, "input 'x' is given twice"),
    ({"input_shape": "x:00,3,8,8"}, "ATC takes no dim of 0"),
    # Translated into a --dynamic-dims its own parser read as 'in' and 'put[0]=1'.
    ({"input_shape": "in=put:-1,4", "dynamic_batch_size": "1,2"},
     "input 'in=put' has a -1 dim, and graphopt's --dynamic-dims cannot name an input whose "
     "name holds '='"),
])
def test_what_has_no_counterpart_is_refused_by_name(given, message):
    with pytest.raises(OptionError) as refused:
        translate(_args(**given))
    assert message in str(refused.value)


def test_atc_requires_what_atc_requires():
    with pytest.raises(UsageError, match=r"atc: the following arguments are required: "
                                         r"--soc_version \(Ascend310, Ascend310B\*, "
                                         r"Ascend910B\*; for the CPU: graphopt optimize"):
        translate(_args(soc_version=None))


def test_an_atc_command_line_compiles_and_says_what_it_ran(tmp_path, capsys):
    rng = np.random.default_rng(0)
    model = tmp_path / "net.onnx"
    onnx.save(parse_model("g (float[N,3,8,8] x) => (y) { y = Conv <pads = [1,1,1,1]> (x, w) }",
                          w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32)), model)
    rc, out, err = run_cli(capsys, "atc", f"--model={model}", "--framework=5",
                           f"--output={tmp_path / 'net'}", "--soc_version=Ascend310",
                           "--input_shape=x:-1,3,8,8", "--dynamic_batch_size=1,2")
    assert rc == 0, err
    assert f"graphopt atc: running graphopt optimize {model} -o {tmp_path / 'net.om'} --target " \
           "ascend310 --input-shape x:-1,3,8,8 --precision fp16 --dynamic-dims " \
           "'x[0]=1;x[0]=2'" in out
    with pytest.warns(RuntimeWarning, match="CANNExecutionProvider not installed"):
        session = graphopt.load(tmp_path / "net.om")
    for batch in (1, 2):
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        assert session.run({"x": x})["y"].shape == (batch, 4, 8, 8)


def test_a_batch_that_inputs_share_takes_atcs_dynamic_batch_size(tmp_path, capsys):
    # Both -1 dims get the batch size, naming one dim N twice: that was refused as a dim given
    # twice, on the commonest multi-input model.
    rng = np.random.default_rng(1)
    model = tmp_path / "two.onnx"
    onnx.save(parse_model("g (float[N,4] a, float[N,4] b) => (y) { y = Add(a, b) }"), model)
    rc, out, err = run_cli(capsys, "atc", f"--model={model}", "--framework=5",
                           f"--output={tmp_path / 'two'}", "--soc_version=Ascend310",
                           "--input_shape=a:-1,4;b:-1,4", "--dynamic_batch_size=1,4",
                           "--precision_mode=must_keep_origin_dtype", "--log=error")
    assert rc == 0, err
    with pytest.warns(RuntimeWarning, match="CANNExecutionProvider not installed"):
        session = graphopt.load(tmp_path / "two.om")
    for batch in (1, 4):
        a, b = (rng.standard_normal((batch, 4)).astype(np.float32) for _ in range(2))
        np.testing.assert_array_equal(session.run({"a": a, "b": b})["y"], a + b)


def _aipp_line(tmp_path) -> list[str]:
    """An atc line compiling a [N,3,8,8] conv net with a static RGB888 AIPP of 8×8 images."""
    model = tmp_path / "net.onnx"
    onnx.save(parse_model("""
        g (float[N,3,8,8] x) => (y) { y = Conv <pads = [1,1,1,1]> (x, w) }""",
        w=np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32)), model)
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n  aipp_mode: static\n  input_format: RGB888_U8\n"
                      "  src_image_size_w: 8\n  src_image_size_h: 8\n}\n")
    return ["atc", f"--model={model}", "--framework=5", f"--output={tmp_path / 'net'}",
            "--soc_version=Ascend310", f"--insert_op_conf={config}"]


def test_atcs_input_shape_of_an_aipp_input_is_the_models_and_keeps_its_batch(tmp_path, capsys):
    # ATC's --input_shape describes the model's NCHW input, AIPP or not; graphopt's pins the fed
    # uint8 image, so the line was refused: "dim 1 is fixed to 32 …, cannot pin it to 3".
    rc, out, err = run_cli(capsys, *_aipp_line(tmp_path), "--input_shape=x:2,3,8,8")
    assert rc == 0, err
    assert "--input-shape x:2,-1,-1,-1" in out
    with pytest.warns(RuntimeWarning, match="CANNExecutionProvider not installed"):
        session = graphopt.load(tmp_path / "net.om")
    assert [(e["name"], e["dtype"], e["shape"]) for e in session.inputs] == \
        [("x", "uint8", [2, 8, 8, 3])]


def test_errors_name_the_flags_as_the_atc_line_wrote_them(tmp_path, capsys):
    model = tmp_path / "net.onnx"
    onnx.save(parse_model("g (float[1,3,8,8] x) => (y) { y = Relu(x) }"), model)
    line = ["atc", f"--model={model}", "--framework=5", f"--output={tmp_path / 'net'}",
            "--soc_version=Ascend310", "--input_shape=x:1,4,8,8"]
    rc, out, err = run_cli(capsys, *line)
    assert rc == 1 and "error: --input_shape: input 'x' dim 1 is fixed to 3" in err, err
    # --log=error hides the translation; a failure shows it, for the graphopt flags it names.
    rc, out, err = run_cli(capsys, *line, "--log=error")
    assert rc == 1 and out == "" and f"graphopt atc: ran graphopt optimize {model}" in err, err
    assert not (tmp_path / "net.om").exists()
    # A value optimize's own parser refuses: atc's flag, and atc's help.
    line[-1] = "--input_shape=x:a,3"
    rc, out, err = run_cli(capsys, *line)
    assert rc == 2 and "error: atc: --input_shape: 'x:a,3': dims must be integers" in err, err
    assert err.rstrip().endswith("(see graphopt atc --help)") and "optimize" not in err, err


def test_atcs_input_shape_of_an_aipp_inputs_size_is_checked_against_the_aipp_file(tmp_path,
                                                                                  capsys):
    # The height and width were dropped: the line asked for 6×6 and got the file's 8×8.
    model = tmp_path / "open.onnx"
    onnx.save(parse_model("""
        g (float[N,3,H,W] x) => (y) { y = Relu (x) }"""), model)
    line = [arg.replace(str(tmp_path / "net.onnx"), str(model)) for arg in _aipp_line(tmp_path)]
    rc, out, err = run_cli(capsys, *line, "--input_shape=x:1,3,6,6")
    assert rc == 1 and "input 'x' is 6×6 there, but --insert_op_conf's preprocessing makes " \
        "8×8 images" in err, err
    rc, out, err = run_cli(capsys, *line, "--input_shape=x:1,3,8,8")
    assert rc == 0, err


def test_atcs_input_shape_of_an_nhwc_aipp_input_finds_its_size_after_the_channels(tmp_path,
                                                                                  capsys):
    # A tf2onnx export takes NHWC: the line's 24,40 was read at NCHW's dims 2 and 3 (40, 3),
    # and the model's own shape refused against the file's 24×40 images.
    model = tmp_path / "nhwc.onnx"
    onnx.save(parse_model("""
        g (float[1,24,40,3] x) => (y) { y = Transpose <perm = [0, 3, 1, 2]> (x) }"""), model)
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n  aipp_mode: static\n  input_format: RGB888_U8\n"
                      "  src_image_size_w: 40\n  src_image_size_h: 24\n}\n")
    line = ["atc", f"--model={model}", "--framework=5", f"--output={tmp_path / 'nhwc'}",
            "--soc_version=Ascend310", f"--insert_op_conf={config}"]
    rc, out, err = run_cli(capsys, *line, "--input_shape=x:1,24,40,3")
    assert rc == 0, err
    rc, out, err = run_cli(capsys, *line, "--input_shape=x:1,20,40,3")
    assert rc == 1 and "input 'x' is 20×40 there, but --insert_op_conf's preprocessing makes " \
        "24×40 images" in err, err


@pytest.mark.parametrize("given, expected", [
    ({"mode": "1", "om": "m.om", "json": "m.json"},
     ["inspect", "m.om", "--json", "--nodes", "-o", "m.json"]),
    # ATC's line for an ONNX model's JSON names its framework; the chip changes nothing.
    ({"mode": "1", "framework": "5", "soc_version": "Ascend310", "om": "m.onnx",
      "json": "m.json"}, ["inspect", "m.onnx", "--json", "--nodes", "-o", "m.json"]),
    ({"mode": " 6", "om": "m.om"}, ["inspect", "m.om"]),
])
def test_atcs_showing_modes_are_graphopt_inspect(given, expected):
    fields = {"model": None, "framework": None, "output": None, "soc_version": None, **given}
    assert translate(_args(**fields)) == expected


def test_atcs_mode_1_needs_the_model_and_the_file():
    with pytest.raises(UsageError, match="--mode=1 needs --om and --json"):
        translate(_args(mode="1", model=None, framework=None, output=None, soc_version=None))


def test_atc_mode_1_writes_every_node_as_json(tmp_path, capsys):
    # ATC's --mode=1 JSON lists each op with its inputs and attributes (for --out_nodes and
    # to check fusions); graphopt atc refused the line, and inspect --json gave op counts.
    model = tmp_path / "net.onnx"
    onnx.save(parse_model("g (float[1,3,8,8] x) => (y) { t = Relu(x)\n"
                          "y = LeakyRelu <alpha = 0.5> (t) }"), model)
    rc, out, err = run_cli(capsys, "optimize", str(model), "-o", str(tmp_path / "net.om"))
    assert rc == 0, err
    for source in ("net.om", "net.onnx"):
        shown = tmp_path / f"{source}.json"
        rc, out, err = run_cli(capsys, "atc", "--mode=1", f"--om={tmp_path / source}",
                               f"--json={shown}")
        assert rc == 0 and f"wrote {shown}" in out, err
        data = json.loads(shown.read_text())
        graph = data["partition_ops"][0]["graph"] if source == "net.om" else data["graph"]
        leaky = next(node for node in graph if node["op"] == "LeakyRelu")
        assert leaky["attributes"] == {"alpha": 0.5} and leaky["outputs"] == ["y"]
    rc, out, err = run_cli(capsys, "atc", "--mode=6", f"--om={tmp_path / 'net.om'}")
    assert rc == 0 and "partitions (1, in execution order)" in out, err
    # The summary is stdout alone, for a script to read; the translation goes to stderr
    assert "graphopt atc: running graphopt inspect" in err and "graphopt atc" not in out


def test_atc_crop_sized_by_an_open_model_names_the_sizes_to_write(tmp_path, capsys):
    # ATC sizes a crop without crop_size from --input_shape; graphopt's pin is of the fed
    # image, which does not reach behind the crop: the compile asked for crop_size_h alone.
    model = tmp_path / "open.onnx"
    onnx.save(parse_model("g (float[1,3,H,W] x) => (y) { y = Relu (x) }"), model)
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n  input_format: RGB888_U8\n  src_image_size_w: 16\n"
                      "  src_image_size_h: 16\n  crop: true\n  load_start_pos_w: 2\n"
                      "  load_start_pos_h: 2\n}\n")
    rc, out, err = run_cli(capsys, "atc", f"--model={model}", "--framework=5",
                           f"--output={tmp_path / 'open'}", "--soc_version=Ascend310",
                           f"--insert_op_conf={config}", "--input_shape=x:1,3,12,10")
    assert rc == 1 and "input 'x' is cropped to the model's size, which the model leaves open; " \
        "ATC takes 12×10 from --input_shape, graphopt from the file: add crop_size_h: 12 and " \
        "crop_size_w: 10 to its aipp_op block" in err, err


def test_atcs_input_shape_sizes_an_open_image_the_aipp_file_leaves_to_the_model(tmp_path,
                                                                                capsys):
    # ATC takes the source size from --input_shape where the file gives none; the line
    # pinned the image to 1,-1,-1,-1 and the compile asked for src_image_size_h.
    model = tmp_path / "open.onnx"
    onnx.save(parse_model("g (float[N,3,H,W] x) => (y) { y = Relu (x) }"), model)
    config = tmp_path / "aipp.cfg"
    config.write_text("aipp_op {\n  aipp_mode: static\n  input_format: RGB888_U8\n}\n")
    line = ["atc", f"--model={model}", "--framework=5", f"--output={tmp_path / 'open'}",
            "--soc_version=Ascend310", f"--insert_op_conf={config}", "--input_shape=x:2,3,6,10"]
    rc, out, err = run_cli(capsys, *line)
    assert rc == 0 and "--input-shape x:2,6,10,3" in out, err
    with pytest.warns(RuntimeWarning, match="CANNExecutionProvider not installed"):
        session = graphopt.load(tmp_path / "open.om")
    assert session.inputs[0]["shape"] == [2, 6, 10, 3]
    # Left open, the error shows the size in the model's layout, as --input_shape takes it
    # (it showed the image's, x:N,H,W,3, which the line then refused).
    rc, out, err = run_cli(capsys, *line[:-1], "--input_shape=x:2,3,-1,-1")
    assert rc == 1 and "give src_image_size_h, or the image's size in --input_shape " \
        "(x:N,3,H,W)" in err, err


def test_file_errors_name_the_flags_as_the_atc_line_wrote_them(tmp_path, capsys):
    # They said --keep-dtype and --fusion-switch-file, flags the atc line did not give; an
    # --output ending in / wrote out/.om.
    model = tmp_path / "net.onnx"
    onnx.save(parse_model("g (float[1,3,8,8] x) => (y) { y = Relu(x) }"), model)
    line = ["atc", f"--model={model}", "--framework=5", f"--output={tmp_path / 'net'}",
            "--soc_version=Ascend310"]
    missing = tmp_path / "missing.cfg"
    for flag, extra in (("--keep_dtype", ["--precision_mode=allow_mix_precision"]),
                        ("--fusion_switch_file", [])):
        rc, _, err = run_cli(capsys, *line, *extra, f"{flag}={missing}")
        # "no such file", as every input file's (the switch file's had been the OS's words)
        assert rc == 1 and err.startswith(f"graphopt: error: {flag} {missing}: no such file"), err
    rc, _, err = run_cli(capsys, *line[:3], f"--output={tmp_path}/", line[4])
    assert rc == 1 and "names a directory; ATC's --output is the artifact's path" in err, err
    assert not (tmp_path / ".om").exists()


def test_keep_dtype_under_must_keep_origin_dtype_is_redundant_not_refused(tmp_path, capsys):
    # ATC takes the list, which changes nothing there; graphopt refused it ("--keep_dtype
    # adjust a precision mode"), naming a fix in graphopt's own spelling.
    model = tmp_path / "net.onnx"
    onnx.save(parse_model("g (float[1,3,8,8] x) => (y) { y = Relu(x) }"), model)
    keep = tmp_path / "keep.cfg"
    keep.write_text("Relu_0\n")
    rc, out, err = run_cli(capsys, "atc", f"--model={model}", "--framework=5",
                           f"--output={tmp_path / 'net'}", "--soc_version=Ascend310",
                           "--precision_mode=must_keep_origin_dtype", f"--keep_dtype={keep}")
    assert rc == 0, err
    assert "--keep_dtype lists nodes to keep in their dtype, which --precision keep " \
           "(--precision_mode=must_keep_origin_dtype) keeps every node in: not passed on" in out
    assert "--keep-dtype" not in out
    # Not passed on, but a list file that does not exist is still named.
    rc, out, err = run_cli(capsys, "atc", f"--model={model}", "--framework=5",
                           f"--output={tmp_path / 'net2'}", "--soc_version=Ascend310",
                           "--precision_mode=must_keep_origin_dtype",
                           f"--keep_dtype={tmp_path / 'missing.cfg'}")
    assert rc == 1 and f"--keep_dtype {tmp_path / 'missing.cfg'}: no such file" in err, err


def test_atcs_input_shape_of_an_aipp_input_is_checked_against_the_model(tmp_path, capsys):
    # Only its batch carries over to the fed image: a wrong rank or channel count passed as
    # the batch of a compile that then ran.
    for shape in ("x:1,3,8", "x:1,4,8,8"):
        rc, out, err = run_cli(capsys, *_aipp_line(tmp_path), f"--input_shape={shape}")
        assert rc == 1 and f"input 'x' is [?,3,8,8] in the model, the input " \
               f"--insert_op_conf's preprocessing feeds, not {shape[2:]}" in err, err
