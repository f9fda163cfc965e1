"""graphopt atc: an atc command line as it is, translated into graphopt optimize's flags."""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt.cli_atc import translate
from graphopt.errors import OptionError


def _args(**given) -> argparse.Namespace:
    fields = dict(model="m.onnx", framework="5", output="out/m", soc_version=None,
                  input_shape=None, input_format=None, precision_mode=None,
                  precision_mode_v2=None, out_nodes=None, insert_op_conf=None, keep_dtype=None,
                  input_fp16_nodes=None, output_type=None, fusion_switch_file=None,
                  dynamic_batch_size=None, dynamic_image_size=None, dynamic_dims=None, log=None,
                  mode="0")
    fields.update(given)
    return argparse.Namespace(**fields)


@pytest.mark.parametrize("given, expected", [
    ({}, ["optimize", "m.onnx", "-o", "out/m.om"]),
    ({"output": "out/m.om", "soc_version": "Ascend310"},
     ["optimize", "m.onnx", "-o", "out/m.om", "--target", "ascend310"]),
    ({"soc_version": "Ascend310B1"}, ["--target", "ascend310b"]),
    ({"soc_version": "Ascend910B3"}, ["--target", "ascend910b"]),
    ({"precision_mode": "force_fp16"}, ["--precision", "fp16"]),
    ({"precision_mode": "allow_mix_precision"}, ["--precision", "mixed-fp16"]),
    ({"precision_mode_v2": "origin"}, ["--precision", "keep"]),
    ({"out_nodes": "Conv_1:0", "output_type": "FP16", "log": "error"},
     ["--out-nodes", "Conv_1:0", "--output-type", "FP16", "-q"]),
    ({"input_shape": "x:-1,3,224,224", "dynamic_batch_size": "1,2,4"},
     ["--input-shape", "x:-1,3,224,224", "--dynamic-dims", "x[0]=1;x[0]=2;x[0]=4"]),
    ({"input_shape": "x:1,3,-1,-1", "dynamic_image_size": "224,224;448,320"},
     ["--dynamic-dims", "x[2]=224,x[3]=224;x[2]=448,x[3]=320"]),
    ({"input_shape": "ids:1,-1;mask:1,-1", "dynamic_dims": "16,16;64,64"},
     ["--dynamic-dims", "ids[1]=16,mask[1]=16;ids[1]=64,mask[1]=64"]),
])
def test_atc_flags_become_graphopts(given, expected):
    argv = translate(_args(**given))
    runs = [argv[i:i + len(expected)] for i in range(len(argv))]
    assert expected in runs, argv


@pytest.mark.parametrize("given, message", [
    ({"framework": "3"}, "--framework=3: graphopt reads ONNX models (--framework=5)"),
    ({"mode": "1"}, "ATC's --mode=1 is graphopt inspect x.om --json"),
    ({"soc_version": "Ascend310P3"}, "--soc_version=Ascend310P3: graphopt has target profiles "
                                     "for Ascend310, Ascend310B* and Ascend910B*"),
    ({"precision_mode": "allow_fp32_to_fp16"}, "--precision_mode=allow_fp32_to_fp16: graphopt "
                                               "atc takes force_fp16"),
    ({"precision_mode": "force_fp16", "precision_mode_v2": "fp16"}, "give one"),
    ({"input_format": "NC1HWC0"}, "--input_format=NC1HWC0: ATC takes NCHW or ND"),
    ({"input_shape": "x:1,3,8,8", "dynamic_batch_size": "1,2"},
     "--dynamic_batch_size: --input_shape gives no -1 dim"),
    ({"input_shape": "x:1,3,-1,-1", "dynamic_image_size": "224"},
     "each profile gives 2 whole number(s), one per -1 dim of --input_shape (x[2], x[3])"),
    ({"input_shape": "x:-1,3,8,8", "dynamic_batch_size": "1", "dynamic_dims": "2"},
     "--dynamic_batch_size and --dynamic_dims: ATC takes one of them"),
])
def test_what_has_no_counterpart_is_refused_by_name(given, message):
    with pytest.raises(OptionError) as refused:
        translate(_args(**given))
    assert message in str(refused.value)


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
           "ascend310 --input-shape x:-1,3,8,8 --dynamic-dims 'x[0]=1;x[0]=2'" in out
    with pytest.warns(RuntimeWarning, match="CANNExecutionProvider not installed"):
        session = graphopt.load(tmp_path / "net.om")
    for batch in (1, 2):
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        assert session.run({"x": x})["y"].shape == (batch, 4, 8, 8)
