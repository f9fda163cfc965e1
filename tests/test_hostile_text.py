"""Text read from a model (names, dims) shown to a person: unambiguous, and never acting on the
terminal or breaking the file it is written into."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, run_cli
from onnx import TensorProto, helper, numpy_helper

from graphopt.cli_paths import check_output_path
from graphopt.errors import OptionError
from graphopt.ir import load_onnx
from graphopt.ir.printer import format_node, quote_name
from graphopt.table import display_width, format_table
from graphopt.terminal_text import EscapingStream
from graphopt.tools.diff import diff_models

EVIL = "mm\x1b]0;pwned\x07\x1b[2J\nFAKE LINE \u202e"


def concat_model(inputs: list[str], declared: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Concat", inputs, ["y"], axis=1, name="cat")], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2]) for n in declared],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def evil_model(activation: str = "Relu") -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], [EVIL], name=f"node {EVIL}"),
         helper.make_node(activation, [EVIL], ["y"], name="act")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def test_names_holding_syntax_are_quoted_so_a_printed_line_reads_one_way():
    one = load_onnx(concat_model(["p, %q"], ["p, %q"]))
    two = load_onnx(concat_model(["p", "q"], ["p", "q"]))
    assert format_node(next(iter(one.graph))) == '%y<f32> = Concat(%"p, %q") {axis=1}  # cat'
    assert format_node(next(iter(two.graph))) == "%y<f32> = Concat(%p, %q) {axis=1}  # cat"
    assert len(diff_models(one, two).changed) == 1
    assert quote_name("/layer1/Conv_output_0") == "/layer1/Conv_output_0"
    assert quote_name("onnx::Add_7") == "onnx::Add_7"
    assert quote_name("") == '""'
    assert quote_name('a"b\\c\n\x1b') == '"a\\"b\\\\c\\n\\x1b"'


def test_dim_names_holding_syntax_are_quoted_too():
    def relu(dims):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
        return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                           ir_version=IR_VERSION))

    one, two = relu(["a,b"]), relu(["a", "b"])  # rank 1 against rank 2
    assert format_node(next(iter(one.graph))) == '%y<f32["a,b"]> = Relu(%x)  # r'
    assert not diff_models(one, two).empty


def test_the_cli_shows_control_characters_in_names_escaped(tmp_path, capsys):
    source, other = tmp_path / "evil.onnx", tmp_path / "evil_sigmoid.onnx"
    onnx.save(evil_model(), source)
    onnx.save(evil_model("Sigmoid"), other)
    rc, out, err = run_cli(capsys, "diff", source, other)
    assert rc == 0 and "Sigmoid(%" in out
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "\u202e" not in out and "\\u202e" in out
    assert not any(line.startswith("FAKE LINE") for line in out.splitlines())


def test_inspect_of_an_onnx_shows_its_producer_opsets_and_data_files_escaped(tmp_path, capsys):
    # The header's values are the model's text: a line break in one printed a line of the
    # model's making under `format` or `opsets`.
    model = evil_model()
    model.producer_name = EVIL
    model.opset_import.add(domain=EVIL, version=1)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")  # a file that is not there: inspect names it
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=EVIL)
    path = tmp_path / "evil.onnx"
    onnx.save(model, path)
    rc, out, err = run_cli(capsys, "inspect", path)
    assert rc == 0, err
    assert not any(line.startswith("FAKE LINE") for line in out.splitlines())
    head = out.splitlines()[1:5]
    assert head[0].endswith("produced by mm\\x1b]0;pwned\\x07\\x1b[2J\\nFAKE LINE \\u202e")
    assert head[1].endswith(", mm\\x1b]0;pwned\\x07\\x1b[2J\\nFAKE LINE \\u202e 1")
    assert "missing beside the model: mm\\x1b]0;pwned\\x07\\x1b[2J\\nFAKE LINE" in head[3]


def test_run_names_the_outputs_it_wrote_escaped(tmp_path, capsys):
    # The output's name is the model's: its line break printed a line of the model's making.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], [EVIL])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(EVIL, TensorProto.FLOAT, [2])])
    source, om = tmp_path / "evil_out.onnx", tmp_path / "evil_out.om"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=IR_VERSION), source)
    assert run_cli(capsys, "optimize", source, "-o", om, "-q")[0] == 0
    rc, out, err = run_cli(capsys, "run", om, "--outputs", tmp_path / "y.npz")
    assert rc == 0, err
    assert not any(line.startswith("FAKE LINE") for line in out.splitlines())
    (wrote,) = [line for line in out.splitlines() if line.startswith("wrote ")]
    assert wrote.endswith("y.npz: mm\\x1b]0;pwned\\x07\\x1b[2J\\nFAKE LINE \\u202e")


def test_the_hint_to_pin_dynamic_inputs_stays_one_line(tmp_path, capsys):
    # The hint quotes the input's name and its dims' names, which printed a line break as is.
    graph = helper.make_graph(
        [helper.make_node("Relu", [EVIL], ["y"])], "g",
        [helper.make_tensor_value_info(EVIL, TensorProto.FLOAT, [EVIL, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [EVIL, 4])])
    source = tmp_path / "evil_dims.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=IR_VERSION), source)
    for command in (("partition", source), ("optimize", source, "-o", tmp_path / "m.om")):
        rc, out, err = run_cli(capsys, *command, "--target", "ascend310")
        assert rc == 0, err
        assert "fell back to the cpu for dynamic shapes" in out + err
        assert not any(line.startswith("FAKE LINE") for line in (out + err).splitlines())


def test_an_escaping_stream_keeps_line_breaks_tabs_and_carriage_returns():
    class Sink:
        text = ""

        def write(self, text):
            self.text += text

    sink = Sink()
    stream = EscapingStream(sink)
    assert stream.write("a\tb\r\nc\x1b[31m\x9b\u2066") == 13
    assert sink.text == "a\tb\r\nc\\x1b[31m\\x9b\\u2066"


def test_a_memory_plot_of_such_names_is_well_formed_svg(tmp_path, capsys):
    source, plot = tmp_path / "evil.onnx", tmp_path / "plan.svg"
    onnx.save(evil_model(), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "e.om",
                         "--memory-plot", plot, "-q")
    assert rc == 0, err
    text = plot.read_text(encoding="utf-8")
    ET.fromstring(text)  # XML refuses the control characters a raw name would bring
    assert "\x1b" not in text


def test_the_html_report_writes_line_breaks_in_names_escaped(tmp_path, capsys):
    # A raw one read as two names in a table cell, and as a line of its own in a tooltip.
    model = evil_model()
    model.graph.node[0].output[0] = model.graph.node[1].input[0] = "mid"
    model.graph.node[1].output[0] = model.graph.output[0].name = EVIL
    source, om, page = tmp_path / "evil.onnx", tmp_path / "e.om", tmp_path / "r.html"
    onnx.save(model, source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", om, "-q")
    assert rc == 0, err
    rc, _, err = run_cli(capsys, "report", om, "-o", page, "--reference", source)
    assert rc == 0, err
    text = page.read_text(encoding="utf-8")
    assert "\nFAKE LINE" not in text and "\\nFAKE LINE" in text
    assert "<title>model output mm\\x1b]0;pwned\\x07\\x1b[2J\\nFAKE LINE" in text


def test_an_output_folder_that_takes_no_file_is_refused_before_the_work():
    with pytest.raises(OptionError, match=r"--plot /proc/h\.png: cannot create a file in /proc"):
        check_output_path("--plot", "/proc/h.png")


def test_tables_pad_wide_characters_by_the_columns_they_take():
    assert display_width("卷积") == 4 and display_width("e\u0301") == 1
    lines = format_table(["name", "n"], [["卷积层", 1], ["conv", 22]]).splitlines()
    assert [display_width(line) for line in lines] == [10, 10, 10, 10]


def test_wrapped_cells_of_wide_characters_fit_the_width_in_columns():
    # A 25-character CJK name (50 columns) was cut by characters into a 25-column slot: the
    # line ran 38 columns past the terminal.
    name = "漢字" * 12 + "漢"
    lines = format_table(["name", "op", "n"], [[name, "Conv", 1], ["x", "Relu", 22]],
                         width=30).splitlines()
    assert max(display_width(line) for line in lines) <= 30, lines
    assert "".join(line.split()[0] for line in lines[2:-1]) == name


def test_file_names_with_line_breaks_or_odd_bytes_stay_one_line(tmp_path, capsys):
    import os

    from graphopt import zoo

    source = tmp_path / "tiny.onnx"
    onnx.save(zoo.build("tiny"), source)
    forged = tmp_path / "x\nverified: all outputs match\ny.om"
    rc, out, err = run_cli(capsys, "optimize", source, "-o", forged)
    assert rc == 0, err
    assert not any(line.startswith("verified: all") for line in out.splitlines())
    rc, out, _ = run_cli(capsys, "inspect", forged)
    assert rc == 0 and not any(line.startswith("verified: all") for line in out.splitlines())
    # A name that is not UTF-8 (Latin-1 bytes): the report writes it escaped, not a crash.
    latin = tmp_path / os.fsdecode(b"mod\xe8le.om")
    assert run_cli(capsys, "optimize", source, "-o", latin, "-q")[0] == 0
    rc, out, err = run_cli(capsys, "report", latin, "-o", tmp_path / "r.html")
    assert rc == 0, err
    assert "\\udce8" in (tmp_path / "r.html").read_text(encoding="utf-8")


def _graphopt(*argv, env=None, shell_redirect: str = "",
              encoding: str = "utf-8") -> subprocess.CompletedProcess:
    """`python -m graphopt ARGV` in a subprocess (with `shell_redirect` applied by a shell)."""
    command = " ".join(shlex.quote(os.fspath(a))
                       for a in (sys.executable, "-m", "graphopt", *argv))
    return subprocess.run(f"{command} {shell_redirect}", shell=True,
                          capture_output=not shell_redirect, encoding=encoding, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("encoding", ["ascii", "cp1252", "ascii:surrogateescape"])
def test_an_encoding_without_graphopts_characters_escapes_them(tmp_path, encoding):
    # µ, ×, ≥ and a model's non-ASCII names: a Windows console or PYTHONIOENCODING=ascii.
    model = tmp_path / "modèle_µ.onnx"
    onnx.save(evil_model(), model)
    env = {"PYTHONIOENCODING": encoding}
    codec = encoding.split(":")[0]  # PYTHONIOENCODING's error handler after the colon
    done = _graphopt("optimize", model, "-o", tmp_path / "m.om", env=env, encoding=codec)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    # cp1252 has è and µ; ASCII shows them escaped.
    name = "modèle_µ.onnx" if encoding == "cp1252" else "mod\\xe8le_\\xb5.onnx"
    assert f"{name} -> " in done.stdout, done.stdout
    shown = _graphopt("optimize", "--help", env=env, encoding=codec)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "\\u2265 16" in shown.stdout  # "≥ 16" of --int4-group-size's help


def test_a_closed_stdout_or_stdin_is_a_one_line_error(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(evil_model(), model)
    err = tmp_path / "err.txt"
    done = _graphopt("optimize", model, "-o", tmp_path / "m.om", shell_redirect=f">&- 2>{err}")
    # Refused before the work: a failed command leaves no file (it used to write the .om and
    # then fail to print its report).
    assert done.returncode == 1 and not (tmp_path / "m.om").exists()
    assert err.read_text() == "graphopt: error: standard output is closed\n"
    done = _graphopt("optimize", model, "-o", tmp_path / "m.om", "-q", shell_redirect=">&-")
    assert done.returncode == 0 and (tmp_path / "m.om").exists()  # -q prints nothing
    done = _graphopt("kb", "import", "-", "--tuning-db", tmp_path / "kb.db",
                     shell_redirect=f"<&- 2>{err}")
    assert done.returncode == 1
    assert err.read_text() == "graphopt: error: standard input is closed\n"
    done = _graphopt("--help", shell_redirect=f">&- 2>{err}")  # argparse swallows OSErrors
    assert done.returncode == 1 and err.read_text() == ("graphopt: error: standard output is "
                                                        "closed\n")


def _graphopt_reader_gone(*argv, env: dict) -> tuple[int, str]:
    """`python -m graphopt ARGV` whose standard output's reader has gone before it writes:
    (exit status, standard error)."""
    process = subprocess.Popen([sys.executable, "-m", "graphopt", *map(os.fspath, argv)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, **env})
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    return process.returncode, err.decode()


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_reader_that_goes_away_ends_the_command_as_sigpipe_would(tmp_path, unbuffered):
    # `graphopt … | head -1`: no "Exception ignored" at exit (status 120), no status 0 that
    # hides a failed check, and the files the command writes are written first.
    model = tmp_path / "m.onnx"
    onnx.save(evil_model(), model)
    assert _graphopt("optimize", model, "-o", tmp_path / "m.om").returncode == 0
    env = {"PYTHONUNBUFFERED": unbuffered}
    for argv in (["passes"], ["--help"], ["inspect", tmp_path / "m.om"]):
        assert _graphopt_reader_gone(*argv, env=env) == (141, ""), argv
    status, err = _graphopt_reader_gone("run", tmp_path / "m.om", "--outputs",
                                        tmp_path / "y.npz", "--inputs", _feeds(tmp_path),
                                        env=env)
    assert (status, err) == (141, "") and (tmp_path / "y.npz").exists()


def _feeds(folder) -> str:
    import numpy as np

    from graphopt import numerics

    path = os.path.join(folder, "x.npz")
    np.savez(path, **numerics.random_feeds(evil_model(), seed=0))
    return path


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_disk_behind_stdout_is_a_one_line_error(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(evil_model(), model)
    err = tmp_path / "err.txt"
    done = _graphopt("inspect", model, shell_redirect=f">/dev/full 2>{err}")
    assert done.returncode == 1
    assert err.read_text() == ("graphopt: error: cannot write to standard output: No space left "
                               "on device\n")
