"""Output names: the extension decides the format in any case, and a name that is only the
extension (a hidden file named `.om`) is refused."""

from __future__ import annotations

import zipfile

import numpy as np
import onnx
import pytest
from helpers import parse_model, run_cli

import graphopt
from graphopt.errors import OptionError

MODEL = "g (float[1,4] x) => (float[1,4] y) { y = Relu (x) }"


def test_an_upper_case_om_is_an_artifact(tmp_path, capsys):
    # save(…, "X.OM") was refused as neither .onnx nor .om.
    source = tmp_path / "net.onnx"
    onnx.save(parse_model(MODEL), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "NET.OM")
    assert rc == 0, err
    assert zipfile.is_zipfile(tmp_path / "NET.OM")
    x = np.array([[1.0, -1.0, 2.0, -2.0]], np.float32)
    assert graphopt.load(tmp_path / "NET.OM").run({"x": x})["y"].tolist() == \
        [[1.0, 0.0, 2.0, 0.0]]
    graphopt.save(graphopt.optimize(parse_model(MODEL)), tmp_path / "net.ONNX")
    onnx.checker.check_model(onnx.load(tmp_path / "net.ONNX"))


@pytest.mark.parametrize("name", [".om", ".onnx", ".OM"])
def test_a_name_that_is_the_extension_alone_is_refused(tmp_path, capsys, name):
    source = tmp_path / "net.onnx"
    onnx.save(parse_model(MODEL), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / name)
    assert rc == 2 and "the name is the extension alone; give the file a name, such as " \
        f"model{name}" in err
    assert not (tmp_path / name).exists()
    with pytest.raises(OptionError, match="the name is the extension alone"):
        graphopt.save(graphopt.optimize(parse_model(MODEL)), tmp_path / name)


def test_a_memory_plot_named_by_its_extension_alone_is_refused(tmp_path, capsys):
    # It wrote a hidden file named .png.
    source = tmp_path / "net.onnx"
    onnx.save(parse_model(MODEL), source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "net.om",
                         "--memory-plot", tmp_path / ".png")
    assert rc == 2 and "--memory-plot" in err and "such as memory.png" in err, err
    assert not (tmp_path / ".png").exists() and not (tmp_path / "net.om").exists()
