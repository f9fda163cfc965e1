"""The inspection tools' errors and notes name options as the caller gave them: the tool
function's own keyword argument from Python (profile_model's repeat, compare_models' feeds),
the flag of its command under `graphopt …` (--repeat, --inputs)."""

from __future__ import annotations

import inspect
import re

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from graphopt import optimize, save
from graphopt.errors import GraphoptError, OptionError
from graphopt.option_names import command_line, from_command_line
from graphopt.tools.accuracy import accuracy_report
from graphopt.tools.accuracy_rule import LOSSY_KEY, accuracy_rule
from graphopt.tools.bisect import bisect
from graphopt.tools.compare import compare_models
from graphopt.tools.diff import load_for_diff
from graphopt.tools.diff_pass import diff_pass
from graphopt.tools.profile import profile_model
from helpers import IR_VERSION, parse_model, run_cli

F = onnx.TensorProto.FLOAT
RUNS = {"repeat": 1, "warmup": 0}


def _relu(shape) -> onnx.ModelProto:
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", F, shape)],
                          [oh.make_tensor_value_info("y", F, shape)])
    return oh.make_model(graph, ir_version=IR_VERSION, opset_imports=[oh.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    """Paths of small models and feeds, by name."""
    tmp = tmp_path_factory.mktemp("tool_names")
    lossy = _relu([1, 4])
    lossy.metadata_props.add(key=LOSSY_KEY, value="QuantizeInt8")
    protos = {
        "static": _relu([1, 4]), "dynamic": _relu(["N", 4]), "fixed3": _relu([3, 4]),
        "norank": _relu(None), "lossy": lossy,
        # Random inputs leave N at 1, which [2, -1] cannot take: the reference refuses them.
        "reshape": parse_model("g (float[N] x) => (float[2, M] y) { y = Reshape (x, s) }",
                               s=np.array([2, -1], np.int64)),
        # x·300 squared passes float16's 65504 wherever |x| > 0.86.
        "big": parse_model("g (float[1, 64] x) => (float[1, 64] y) { t = Mul (x, k) "
                           "y = Mul (t, t) }", k=np.array(300.0, np.float32)),
    }
    paths = {"tmp": tmp}
    for name, proto in protos.items():
        paths[name] = tmp / f"{name}.onnx"
        onnx.save(proto, paths[name])
    save(optimize(paths["big"], precision="fp16"), tmp / "big16.onnx")
    paths["big16"] = tmp / "big16.onnx"
    save(optimize(paths["static"], target="cpu"), tmp / "static.om")
    paths["om"] = tmp / "static.om"
    save(optimize(paths["dynamic"], dynamic_dims={"N": [1, 2]}, target="cpu"),
         tmp / "profiles.om")
    paths["profiles_om"] = tmp / "profiles.om"
    np.savez(tmp / "wrong.npz", zz=np.zeros((1, 4), np.float32))
    np.savez(tmp / "static.npz", x=np.ones((1, 4), np.float32))
    np.savez(tmp / "x2.npz", x=np.ones((2, 4), np.float32))
    (tmp / "dump.txt").write_text("%y = Relu(%x)\n")
    return paths


def _subgraph_note() -> str:
    """The report's note on subgraph studies it cannot match without the source model."""
    from graphopt.tools.report_data import Tuning, _gather_subgraph
    from graphopt.tuner.optuna_import import optuna, optuna_quiet

    store = optuna.storages.InMemoryStorage()
    with optuna_quiet():
        optuna.create_study(study_name="subgraph/cpu/0123", storage=store)
    tuning = Tuning(storage="memory")
    _gather_subgraph(tuning, store, "cpu", None)
    return tuning.subgraph_note


def _gather(m):
    from graphopt.tools.report_data import gather

    return gather(str(m["om"]), tuning_db=str(m["tmp"] / "none.db"))


def _calibrate(m):
    from graphopt.tuner.calibrate import calibrate

    with pytest.raises(OptionError, match="from 1 to 1024, got 3000"):  # as the runtime's
        calibrate(threads=3000)
    for odd in (2.5, "4", True):  # onnxruntime's TypeError, or True taken for 1
        with pytest.raises(OptionError, match=f"from 1 to 1024, got {odd!r}$"):
            calibrate(threads=odd)
    return calibrate(threads=0)


# name: (the Python call of `m`, which raises or returns the text, the part of its message,
#        graphopt's arguments (of `m`) or None where argparse refuses the value before the tool
#        sees it (then the call runs under command_line()), the part of the CLI's message)
CASES = {
    "profile_repeat": (lambda m: profile_model(m["static"], repeat=0),
                       "repeat must be an integer of at least 1, got 0", None,
                       "--repeat must be an integer of at least 1, got 0"),
    "profile_warmup": (lambda m: profile_model(m["static"], warmup=-1),
                       "warmup must be an integer of 0 or more, got -1", None,
                       "--warmup must be an integer of 0 or more, got -1"),
    "profile_threads": (lambda m: profile_model(m["static"], threads=-2),
                        "threads must be 0 (onnxruntime chooses) to 1024, got -2", None,
                        "--threads must be 0 (onnxruntime chooses) to 1024, got -2"),
    "profile_level": (lambda m: profile_model(m["static"], level="fast"),
                      "level 'fast' is not one of: disable, basic, extended, all", None,
                      "--level 'fast' is not one of: disable, basic, extended, all"),
    "profile_feeds_and_shapes": (
        lambda m: profile_model(m["static"], {"x": np.ones((1, 4), np.float32)},
                                input_shapes={"x": [1, 4]}),
        "input_shapes shapes random inputs; drop it or feeds",
        lambda m: ["profile", m["static"], "--inputs", m["tmp"] / "static.npz",
                   "--input-shape", "x:1,4"],
        "--input-shape shapes random inputs; drop it or --inputs"),
    "profile_dynamic_dim": (lambda m: profile_model(m["dynamic"], **RUNS),
                            "pin it with input_shapes or pass feeds",
                            lambda m: ["profile", m["dynamic"], "--repeat", "1"],
                            "pin it with --input-shape or pass --inputs"),
    "profile_shape_profile": (
        lambda m: profile_model(m["profiles_om"], input_shapes={"x": [2, 4]},
                                **RUNS).shape_profile["how"],
        "the first that input_shapes fits",
        lambda m: ["profile", m["profiles_om"], "--input-shape", "x:2,4", "--repeat", "1",
                   "--warmup", "0"],
        "the first that --input-shape fits"),
    "compare_rtol": (lambda m: compare_models(m["static"], m["static"], rtol=-1),
                     "rtol: expected a finite number ≥ 0, got -1", None,
                     "--rtol: expected a finite number ≥ 0, got -1"),
    "compare_min_cosine": (lambda m: compare_models(m["static"], m["static"], min_cosine=2),
                           "min_cosine must be between -1 and 1, got 2", None,
                           "--min-cosine must be between -1 and 1, got 2"),
    "compare_pins": (lambda m: compare_models(m["dynamic"], m["fixed3"],
                                              input_shapes={"x": [5, 4]}),
                     "input_shapes shapes inputs that do not fit",
                     lambda m: ["compare", m["dynamic"], m["fixed3"], "--input-shape", "x:5,4"],
                     "--input-shape shapes inputs that do not fit"),
    "compare_random_refused": (lambda m: compare_models(m["reshape"], m["reshape"]),
                               "give real inputs with feeds, or sizes with input_shapes",
                               lambda m: ["compare", m["reshape"], m["reshape"]],
                               "give real inputs with --inputs, or sizes with --input-shape"),
    "compare_unknown_rank": (lambda m: compare_models(m["norank"], m["norank"]),
                             "pass feeds= (a dict or an .npz path) or its whole shape in "
                             "input_shapes={'x': […]}",
                             lambda m: ["compare", m["norank"], m["norank"]],
                             "pass inputs (--inputs x.npz) or its whole shape "
                             "(--input-shape \"x:…\")"),
    "compare_lossy_rule": (lambda m: accuracy_rule([{"pass": "QuantizeInt8",
                                                     "changed": True}])[1],
                           "; min_cosine=C or rtol/atol choose the rule",
                           lambda m: ["compare", m["static"], m["lossy"]],
                           "; --min-cosine C or --rtol/--atol choose the rule"),
    "accuracy_pins": (lambda m: accuracy_report(m["dynamic"], m["fixed3"],
                                                input_shapes={"x": [5, 4]}),
                      "input_shapes shapes inputs that do not fit", None,
                      "--input-shape shapes inputs that do not fit"),
    "accuracy_overflow": (lambda m: " ".join(accuracy_report(m["big"], m["big16"]).warnings),
                          "list the nodes that make them in keep_dtype, or use a bf16 mode",
                          lambda m: ["optimize", m["big"], "-o", m["tmp"] / "out16.onnx",
                                     "--precision", "fp16"],
                          "--keep-dtype the nodes that make them, or use a bf16 mode"),
    "bisect_missing_feeds": (lambda m: bisect(m["static"], feeds=m["tmp"] / "none.npz"),
                             "feeds {tmp}/none.npz: no such file",
                             lambda m: ["bisect", m["static"], "--inputs", m["tmp"] / "none.npz"],
                             "--inputs {tmp}/none.npz: no such file"),
    "bisect_wrong_feeds": (lambda m: bisect(m["static"], feeds=m["tmp"] / "wrong.npz"),
                           "feeds='{tmp}/wrong.npz': ",
                           lambda m: ["bisect", m["static"], "--inputs", m["tmp"] / "wrong.npz"],
                           "--inputs {tmp}/wrong.npz: "),
    "bisect_feeds_dict": (lambda m: bisect(m["static"], feeds={"zz": np.zeros((1, 4))}),
                          "feeds: ", None, "--inputs: "),
    "bisect_pins_and_feeds": (
        lambda m: bisect(m["dynamic"], feeds=m["tmp"] / "x2.npz", input_shapes={"x": [1, 4]}),
        "input_shapes pins input 'x' to [1, 4], but feeds='{tmp}/x2.npz' gives it shape [2, 4]",
        lambda m: ["bisect", m["dynamic"], "--inputs", m["tmp"] / "x2.npz",
                   "--input-shape", "x:1,4"],
        "--input-shape pins input 'x' to [1, 4], but --inputs {tmp}/x2.npz gives it shape "
        "[2, 4]"),
    "bisect_unknown_rank": (lambda m: bisect(m["norank"]),
                            "pass feeds= (a dict or an .npz path) or its whole shape in "
                            "input_shapes={'x': […]}",
                            lambda m: ["bisect", m["norank"]],
                            "pass inputs (--inputs x.npz) or its whole shape "
                            "(--input-shape \"x:…\")"),
    "diff_no_such_pass": (lambda m: diff_pass(m["static"], "NoSuchPass"),
                          "pass_name='NoSuchPass': no such pass (`graphopt passes` lists them; "
                          "passes that ran: ",
                          lambda m: ["diff", m["static"], "--pass", "NoSuchPass"],
                          "--pass NoSuchPass: no such pass (`graphopt passes` lists them; "
                          "passes that ran: "),
    "diff_not_run": (lambda m: diff_pass(m["static"], "FuseConvBatchNorm", level=1,
                                         target="cpu"),
                     "pass_name='FuseConvBatchNorm': did not run at level=1, target='cpu'; "
                     "it runs at level=2, level=3 (",
                     lambda m: ["diff", m["static"], "--pass", "FuseConvBatchNorm", "-O", "1",
                                "--target", "cpu"],
                     "--pass FuseConvBatchNorm: did not run at -O1 --target cpu; it runs at "
                     "-O2, -O3 ("),
    "diff_not_run_quantize": (lambda m: diff_pass(m["static"], "QuantizeInt8"),
                              "did not run at level=2; it runs only with quantize='int8' (",
                              lambda m: ["diff", m["static"], "--pass", "QuantizeInt8"],
                              "did not run at -O2; it runs only with --quantize int8 ("),
    "diff_text_dump": (lambda m: load_for_diff(m["tmp"] / "dump.txt"),
                       "dump with `dump_format='onnx'` (or both)",
                       lambda m: ["diff", m["tmp"] / "dump.txt", m["static"]],
                       "dump with `--dump-format onnx` (or both)"),
    "report_tuning_db": (_gather, "tuning_db {tmp}/none.db: no such knowledge base",
                         lambda m: ["report", m["om"], "-o", m["tmp"] / "r.html",
                                    "--tuning-db", m["tmp"] / "none.db"],
                         "--tuning-db {tmp}/none.db: no such knowledge base"),
    "report_subgraph_note": (lambda m: _subgraph_note(),
                             "give reference=MODEL.onnx (or put the source model", None,
                             "give --reference MODEL.onnx (or put the source model"),
    "calibrate_threads": (_calibrate, "threads must be from 1 to 1024, got 0", None,
                          "--threads must be from 1 to 1024, got 0"),
}


def _message(call, m) -> str:
    """What the call raised, or the text it returned."""
    try:
        return str(call(m))
    except GraphoptError as e:
        return str(e)


def _fill(text: str, m) -> str:
    return text.replace("{tmp}", str(m["tmp"]))


def _outside_code(text: str) -> str:
    """The message without its `…` spans: a shell command it suggests may name flags."""
    return re.sub(r"`[^`]*`", "``", text)


@pytest.mark.parametrize("case", CASES)
def test_python_calls_name_the_keyword(m, case):
    call, needle, _, _ = CASES[case]
    message = _message(call, m)
    assert _fill(needle, m) in message
    assert not re.search(r"(^|[\s(])--?[A-Za-z]", _outside_code(message)), message
    assert not from_command_line()


@pytest.mark.parametrize("case", CASES)
def test_the_cli_names_the_flag(m, capsys, case):
    call, _, argv, needle = CASES[case]
    if argv is None:
        with command_line():
            text = _message(call, m)
    else:
        _, out, err = run_cli(capsys, *argv(m))
        text = out + err
    assert _fill(needle, m) in text, text
    assert not from_command_line()


# Each table against its function's signature and its command's parser.
TABLES = {
    "COMPARE_FLAGS": (compare_models, "compare"),
    "BISECT_FLAGS": (bisect, "bisect"),
    "PROFILE_FLAGS": (profile_model, "profile"),
    "DIFF_PASS_FLAGS": (diff_pass, "diff"),
    "REPORT_FLAGS": ("graphopt.tools.report_data:gather", "report"),
    "CALIBRATE_FLAGS": ("graphopt.tuner.calibrate:calibrate", "calibrate"),
}


@pytest.mark.parametrize("table", TABLES)
def test_each_tool_table_maps_its_keywords_to_its_commands_flags(table):
    import importlib

    from graphopt import option_names
    from graphopt.cli import build_parser

    function, command = TABLES[table]
    if isinstance(function, str):
        module, name = function.split(":")
        function = getattr(importlib.import_module(module), name)
    flags = getattr(option_names, table)
    parameters = inspect.signature(function).parameters
    subparsers = next(a for a in build_parser()._actions if a.choices and command in a.choices)
    options = {s for a in subparsers.choices[command]._actions for s in a.option_strings}
    assert set(flags) <= set(parameters), set(flags) - set(parameters)
    assert set(flags.values()) <= options, set(flags.values()) - options
