"""Errors and notes name options as the caller gave them: the keyword argument (input_shapes)
under the Python API, the flag (--input-shape) under the command line."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import graphopt
from graphopt.errors import GraphoptError
from graphopt.option_names import FLAGS, command_line, from_command_line, option, setting, usage
from helpers import IR_VERSION, run_cli

F = onnx.TensorProto.FLOAT


def _model(shape, op="Relu", domain="", opsets=()):
    graph = oh.make_graph([oh.make_node(op, ["x"], ["y"], domain=domain)], "g",
                          [oh.make_tensor_value_info("x", F, shape)],
                          [oh.make_tensor_value_info("y", F, shape)])
    return oh.make_model(graph, ir_version=IR_VERSION,
                         opset_imports=[oh.make_opsetid("", 17), *opsets])


@pytest.fixture
def models(tmp_path):
    paths = {}
    for name, proto in {
        "static": _model([1, 4]),
        "dynamic": _model(["batch", 4]),
        "norank": _model(None),
        "custom": _model([1, 4], "MyOp", "my.domain", [oh.make_opsetid("my.domain", 1)]),
    }.items():
        paths[name] = tmp_path / f"{name}.onnx"
        onnx.save(proto, paths[name])
    np.savez(tmp_path / "wrong.npz", zz=np.zeros((1, 4), np.float32))
    return paths


# (model, API keywords, the API message's start or part, CLI arguments, the CLI's part)
CASES = {
    "input_shapes": ("static", {"input_shapes": {"bogus": [1]}},
                     "input_shapes: the model has no input 'bogus'",
                     ["--input-shape", "bogus:1"], "--input-shape: the model has no input"),
    "dynamic_dims": ("dynamic", {"dynamic_dims": {"seq": [1, 2]}},
                     "dynamic_dims: ", ["--dynamic-dims", "seq:1,2"],
                     "--dynamic-dims: "),
    "precision": ("static", {"precision": "fp8"}, "precision='fp8': unknown mode", None, None),
    "precision_allow": ("static", {"precision": "fp16", "pass_options": {
                            "precision_allow": ["Conv"], "precision_deny": ["Conv"]}},
                        "precision_allow and precision_deny both name Conv",
                        ["--precision", "fp16", "--precision-allow", "Conv", "--precision-deny",
                         "Conv"], "--precision-allow and --precision-deny both name Conv"),
    "keep_dtype_op_type": ("static", {"precision": "fp16", "pass_options": {
                               "precision_allow": ["Conv"], "keep_dtype": ["OpType::Conv"]}},
                           "precision_allow names Conv, which keep_dtype keeps (OpType::Conv)",
                           ["--precision", "fp16", "--precision-allow", "Conv", "--keep-dtype",
                            "OpType::Conv"],
                           "--precision-allow names Conv, which --keep-dtype keeps"),
    "quantize": ("static", {"quantize": "int8"},
                 "quantize='int8' needs calibration=FILE.npz|DIR",
                 ["--quantize", "int8"], "--quantize int8 needs --calibration FILE.npz|DIR"),
    "calibration": ("static", {"calibration": "{tmp}/wrong.npz"},
                    "calibration applies to quantize", ["--calibration", "{tmp}/wrong.npz"],
                    "--calibration applies to --quantize"),
    "disable_passes": ("static", {"disable_passes": ["NoSuchPass"]},
                       "disable_passes: unknown pass or rule NoSuchPass",
                       ["--disable-pass", "NoSuchPass"], "--disable-pass: unknown pass"),
    "disable_passes_needed": ("static", {"quantize": "int4", "disable_passes":
                                         ["QuantizeInt4Weights"]},
                              "which disable_passes or a switch file turns off",
                              ["--quantize", "int4", "--disable-pass", "QuantizeInt4Weights"],
                              "which --disable-pass or a switch file turns off"),
    "dump_dir": ("static", {"dump_dir": "{tmp}/static.onnx"},
                 "dump_dir='{tmp}/static.onnx': exists and is not a directory",
                 ["--dump-dir", "{tmp}/static.onnx"], "--dump-dir {tmp}/static.onnx: exists"),
    "dump_format": ("static", {"dump_dir": "{tmp}/dump", "dump_format": "xml"},
                    "dump_format='xml': unknown format",
                    ["--dump-dir", "{tmp}/dump", "--dump-format", "xml"],
                    "--dump-format xml: unknown format"),
    "trace_rules": ("static", {"trace_rules": ["nope"]}, "trace_rules: unknown rule nope",
                    ["--trace-rule", "nope"], "--trace-rule: unknown rule nope"),
    "target": ("static", {"target": "{tmp}/static.onnx"}, "target='{tmp}/static.onnx': ",
               ["--target", "{tmp}/static.onnx"], "--target {tmp}/static.onnx: "),
    "tuning_db": ("static", {"target": "cpu", "tuning_db": "{tmp}/none.db"},
                  "tuning_db='{tmp}/none.db': no such knowledge base (`graphopt tune` creates",
                  ["--target", "cpu", "--tuning-db", "{tmp}/none.db"],
                  "--tuning-db {tmp}/none.db: no such knowledge base (`graphopt tune "
                  "--tuning-db FILE`"),
    "verify_inputs": ("static", {"verify": True, "inputs": "{tmp}/wrong.npz"},
                      "verify: inputs='{tmp}/wrong.npz': unknown input 'zz'",
                      ["--verify", "--inputs", "{tmp}/wrong.npz"],
                      "--verify: --inputs {tmp}/wrong.npz: unknown input 'zz'"),
    "verify_inputs_missing": ("static", {"verify": True, "inputs": "{tmp}/none.npz"},
                              "inputs {tmp}/none.npz: no such file",
                              ["--verify", "--inputs", "{tmp}/none.npz"],
                              "--inputs {tmp}/none.npz: no such file"),
    "unknown_rank": ("norank", {"verify": True},
                     "pass inputs= (a dict or an .npz path) or its whole shape in "
                     "input_shapes={'x': […]}", ["--verify"],
                     "pass inputs (--inputs x.npz) or its whole shape (--input-shape \"x:…\")"),
    "allow_custom_ops": ("custom", {}, "pass allow_custom_ops=True to keep custom ops",
                         [], "pass --allow-custom-ops to keep custom ops"),
    "switch_file": ("static", {"switch_file": "{tmp}/none.txt"}, "switch_file {tmp}/none.txt: ",
                    ["--switch-file", "{tmp}/none.txt"], "--switch-file {tmp}/none.txt: "),
    "fold_size_limit": ("static", {"fold_size_limit": "4Q"}, "fold_size_limit: '4Q' is not",
                        None, None),
    "profiles_and_pins": ("dynamic", {"dynamic_dims": {"batch": [1, 2]},
                                      "input_shapes": {"x": [3, 4]}},
                          "input_shapes pins input 'x' dim 0 to 3, and dynamic_dims's profile "
                          "batch=1 makes it 1: size it with one of them",
                          ["--dynamic-dims", "batch:1,2", "--input-shape", "x:3,4"],
                          "--input-shape pins input 'x' dim 0 to 3, and --dynamic-dims's "
                          "profile batch=1 makes it 1"),
}


def _fill(value, tmp):
    if isinstance(value, str):
        return value.replace("{tmp}", str(tmp))
    if isinstance(value, dict):
        return {k: _fill(v, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, tmp) for v in value]
    return value


@pytest.mark.parametrize("case", CASES)
def test_api_errors_name_the_keyword(models, tmp_path, case):
    model, kwargs, needle, _, _ = CASES[case]
    with pytest.raises(GraphoptError) as info:
        graphopt.optimize(models[model], **_fill(kwargs, tmp_path))
    message = str(info.value)
    assert _fill(needle, tmp_path) in message
    assert "--" not in message
    assert not from_command_line()


@pytest.mark.parametrize("case", [name for name, c in CASES.items() if c[3] is not None])
def test_the_cli_still_names_the_flag(models, tmp_path, capsys, case):
    model, _, _, argv, needle = CASES[case]
    output = tmp_path / ("out.om" if "--dynamic-dims" in argv else "out.onnx")
    rc, _, err = run_cli(capsys, "optimize", models[model], "-o", output, *_fill(argv, tmp_path))
    assert rc != 0
    assert (_fill(needle, tmp_path) if needle else f"{argv[0]} {argv[1]}") in err
    assert not from_command_line()  # the CLI's context ends with its command


def test_save_of_profiles_to_onnx_names_the_keyword(models, tmp_path):
    result = graphopt.optimize(models["dynamic"], dynamic_dims={"batch": [1, 2]})
    with pytest.raises(GraphoptError) as info:
        graphopt.save(result, tmp_path / "p.onnx")
    message = str(info.value)
    assert "shape profiles (dynamic_dims)" in message and "save to a path ending in .om" in message
    assert "--" not in message and "-o " not in message
    with command_line(), pytest.raises(GraphoptError, match=r"\(--dynamic-dims\).*write -o "
                                                             r"model\.om"):
        graphopt.save(result, tmp_path / "p.onnx")


def test_notes_name_the_keyword(models, tmp_path):
    proto = _model([1, 4], "MatMul")
    proto.graph.node[0].input.append("w")
    proto.graph.initializer.append(onnx.numpy_helper.from_array(
        np.eye(4, dtype=np.float32), "w"))
    result = graphopt.optimize(proto, precision="mixed-fp16",
                               pass_options={"keep_dtype": {"nope"}})
    notes = [n for n in result.notes if "nope" in n]
    assert notes and "keep_dtype 'nope' names nothing in the model" in notes[0]
    assert not any("--" in n for n in result.notes)


def test_winograd_hint_names_options_by_caller():
    from graphopt.passes.winograd import tolerance_hint

    hint = tolerance_hint(2)
    assert "looser atol" in hint and "disable_passes=['WinogradConv']" in hint
    assert "--" not in hint
    with command_line():
        assert tolerance_hint(2) == ("-O3 rewrote 2 conv(s) as Winograd, exact to ~2e-5 of each "
                                     "one's largest output; pass a looser --atol, or compile "
                                     "with --disable-pass WinogradConv")


def test_option_setting_usage():
    assert (option("input_shapes"), setting("precision", "fp8"), setting("verify"),
            usage("calibration", "FILE")) == \
        ("input_shapes", "precision='fp8'", "verify=True", "calibration=FILE")
    with command_line():
        assert (option("input_shapes"), setting("precision", "fp8"), setting("verify"),
                usage("calibration", "FILE")) == \
            ("--input-shape", "--precision fp8", "--verify", "--calibration FILE")
    assert all(flag.startswith("--") for flag in FLAGS.values())


def test_an_artifact_is_the_same_bytes_from_python_and_from_the_command_line(tmp_path, capsys):
    # The .om stores the reason a partition has no memory plan: it names the option both ways,
    # not in the spelling of the caller that compiled it.
    import zipfile

    source = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model("""
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) { y = Relu(x) }"""), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "cli.om", "-q")
    assert rc == 0, err
    graphopt.save(graphopt.optimize(source, target="cpu"), tmp_path / "api.om")
    members = []
    for name in ("cli.om", "api.om"):
        with zipfile.ZipFile(tmp_path / name) as z:
            members.append({info.filename: z.read(info) for info in z.infolist()})
    assert members[0] == members[1]
    assert b"(--input-shape, or input_shapes in Python)" in members[0]["details.json"]
