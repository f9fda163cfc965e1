"""Feeds onnxruntime's Python API would not take faithfully are refused by name: bytes for a
string input (read past their buffer, or turned into the text of their repr), and inputs of
more dims than numpy arrays have."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, run_cli
from onnx import TensorProto, helper

import graphopt
from graphopt.codegen.feeds import load_npz
from graphopt.errors import GraphoptError, InputError


def _identity(tmp_path, elem_type, shape) -> tuple:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem_type, shape)],
                              [helper.make_tensor_value_info("y", elem_type, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    source, om = tmp_path / "m.onnx", tmp_path / "m.om"
    onnx.save(model, source)
    graphopt.save(graphopt.optimize(str(source)), str(om))
    return source, om


@pytest.mark.parametrize("value, message", [
    (np.array([b"a", b"b"]), r"takes strings, not bytes \(dtype \|S1\): give str, decoded"),
    (np.array([b"a", "b"], dtype=object), "takes strings; element 0 is of type bytes: give str"),
    (np.array(["a", 7], dtype=object), "takes strings; element 1 is of type int$")])
def test_bytes_or_numbers_for_a_string_input_are_refused(tmp_path, capsys, value, message):
    # A bytes array returned other strings, or failed, at random (exit 0 with garbage written
    # once in three runs); a bytes object came back as "b'a'".
    source, om = _identity(tmp_path, TensorProto.STRING, [2])
    session = graphopt.load(om)
    with pytest.raises(InputError, match=f"^input 'x' {message}"):
        session.run({"x": value})
    assert session.run({"x": np.array(["a", "b"])})["y"].tolist() == ["a", "b"]
    assert session.run({"x": np.array(["a", "b"], dtype=object)})["y"].tolist() == ["a", "b"]
    if value.dtype.kind == "S":  # what an .npz holds
        np.savez(tmp_path / "x.npz", x=value)
        for argv in (("run", om), ("compare", source, om)):
            rc, _, err = run_cli(capsys, *argv, "--inputs", tmp_path / "x.npz")
            assert rc in (1, 2) and "input 'x' takes strings, not bytes" in err, err


def test_an_input_past_numpys_rank_is_named_without_advice_that_cannot_help(tmp_path, capsys):
    # Rank 65 compiles (ONNX allows it), but no array can hold it: random data crashed run and
    # profile with an internal error, and --verify asked for --inputs, which no .npz holds.
    source, om = _identity(tmp_path, TensorProto.FLOAT, [1] * 65)
    expected = "input 'x' has rank 65: numpy arrays have at most 64 dims"
    for argv in (("run", om), ("profile", om), ("compare", source, om),
                 ("optimize", source, "-o", tmp_path / "v.om", "--verify")):
        rc, _, err = run_cli(capsys, *argv)
        assert rc in (1, 2) and expected in err and "--inputs" not in err, (argv, err)
        assert "internal error" not in err


def test_strings_with_a_nul_reach_the_model_whole(tmp_path, capsys):
    # onnxruntime reads a str array (dtype <U, what a list of str and an .npz give) only up to
    # an element's first NUL: "a\x00b" came back as "a" from run() and `graphopt run`.
    source, om = _identity(tmp_path, TensorProto.STRING, [2])
    session = graphopt.load(om)
    for value in (["a\x00b", "b"], np.array(["a\x00b", "b"])):
        assert session.run({"x": value})["y"].tolist() == ["a\x00b", "b"]
    np.savez(tmp_path / "x.npz", x=np.array(["a\x00b", "b"]))
    rc, _, err = run_cli(capsys, "run", om, "--inputs", tmp_path / "x.npz",
                         "--outputs", tmp_path / "y.npz")
    assert rc == 0, err
    assert np.load(tmp_path / "y.npz")["y"].tolist() == ["a\x00b", "b"]


def test_a_list_feed_takes_the_inputs_dtype_as_onnxruntime_gives_it(tmp_path):
    # numpy reads a list of floats as float64, which a float32 input refused with a message
    # about a float64 array the caller never made; onnxruntime casts a list to the input's type.
    (tmp_path / "f").mkdir(), (tmp_path / "u").mkdir()
    floats = graphopt.load(_identity(tmp_path / "f", TensorProto.FLOAT, [2])[1])
    assert floats.run({"x": [1.5, -2]})["y"].tolist() == [1.5, -2.0]
    assert floats.run({"x": [1.5, -2]})["y"].dtype == np.float32
    ints = graphopt.load(_identity(tmp_path / "u", TensorProto.UINT8, [2])[1])
    assert ints.run({"x": [1, 255]})["y"].tolist() == [1, 255]
    for value, numpy_reads in (([1.5, 2.0], "float64"), ([1, 300], "int64")):
        with pytest.raises(InputError, match=f"^input 'x' was given as a list that numpy reads "
                                             f"as {numpy_reads}, which does not cast to uint8"):
            ints.run({"x": value})
    # Overflow to inf, and an integer float32 rounds, were taken silently (with numpy's
    # overflow warning and its source line).
    for value, numpy_reads, target, elem_type in (
            ([70000.0, 1.0], "float64", "float16", TensorProto.FLOAT16),
            ([16777217, 1], "int64", "float32", TensorProto.FLOAT)):
        (tmp_path / target).mkdir()
        session = graphopt.load(_identity(tmp_path / target, elem_type, [2])[1])
        with pytest.raises(InputError, match=f"reads as {numpy_reads}, which does not cast to "
                                             f"{target} without loss"):
            session.run({"x": value})


@pytest.mark.parametrize("elem_type, dtype", [(TensorProto.INT64, np.int64),
                                               (TensorProto.STRING, object)])
def test_an_empty_list_feed_takes_the_inputs_dtype(tmp_path, elem_type, dtype):
    # numpy reads [[]] as float64, which an int64 input refused as a cast with loss (and a
    # string input as the wrong dtype); onnxruntime takes it, there being no value to lose.
    session = graphopt.load(_identity(tmp_path, elem_type, ["n", "s"])[1])
    result = session.run({"x": [[]]})["y"]
    assert result.shape == (1, 0) and result.dtype == dtype


def test_an_npz_naming_an_array_twice_is_refused_as_inputs_and_as_calibration(tmp_path):
    # numpy reads the last of two members of one name, and --inputs and --calibration used it.
    import io
    import zipfile

    from graphopt.errors import OptionError
    from graphopt.ir import load_onnx
    from graphopt.quant.calib_data import read_calibration

    buffer = io.BytesIO()
    np.save(buffer, np.ones((1, 2), np.float32))
    with pytest.warns(UserWarning, match="Duplicate name"), \
            zipfile.ZipFile(tmp_path / "dup.npz", "w") as archive:
        archive.writestr("x.npy", buffer.getvalue())
        archive.writestr("x.npy", buffer.getvalue())
    source, om = _identity(tmp_path, TensorProto.FLOAT, [1, 2])
    with pytest.raises(InputError, match="'x' is in it twice"):
        load_npz(tmp_path / "dup.npz")
    with pytest.raises(OptionError, match="'x' is in it twice"):
        read_calibration(tmp_path / "dup.npz", load_onnx(str(source)).graph)


def test_a_big_endian_array_is_refused_saying_so(tmp_path):
    session = graphopt.load(_identity(tmp_path, TensorProto.FLOAT, [2])[1])
    with pytest.raises(InputError, match=r"^input 'x' has dtype >f4 \(its bytes are big-endian: "
                       r"pass array.astype\('<f4'\)\), expected float32\[2\]"):
        session.run({"x": np.array([1, 2], ">f4")})
    assert session.run({"x": np.array([1, 2], ">f4").astype("<f4")})["y"].tolist() == [1, 2]


def test_a_lossy_python_int_is_named_with_its_article(tmp_path):
    session = graphopt.load(_identity(tmp_path, TensorProto.UINT8, [])[1])
    with pytest.raises(InputError, match="^input 'x' was given as an int that numpy reads as "):
        session.run({"x": 300})


def test_providers_after_close_says_closed(tmp_path):
    session = graphopt.load(_identity(tmp_path, TensorProto.FLOAT, [2])[1])
    assert session.run({"x": np.ones(2, np.float32)})["y"].tolist() == [1, 1]
    assert list(session.providers.values()) == [["CPUExecutionProvider"]]
    session.close()
    with pytest.raises(GraphoptError, match="closed"):
        session.providers


def test_a_float8_array_saved_as_it_is_says_how_to_store_it(tmp_path):
    # numpy writes an ml_dtypes float8 array with the descriptor '<f1', which it cannot read
    # back: its own message said nothing of what would work.
    import ml_dtypes

    np.savez(tmp_path / "f8.npz", x=np.ones(4, ml_dtypes.float8_e5m2))
    with pytest.raises(InputError, match=r"descr is not a valid dtype descriptor: '<f1'; numpy "
                                         r"cannot read such an array back, as an ml_dtypes "
                                         r"float8_e5m2 saved as it is: store its raw bits, "
                                         r"np\.savez\(path, x=array\.view\('V1'\)\)"):
        load_npz(str(tmp_path / "f8.npz"))


def test_str_subclass_elements_reach_the_model_as_the_str_they_hold(tmp_path):
    # onnxruntime takes each element's str(): a (str, Enum) member reached the model as
    # 'Color.RED', and in a list numpy read it as 'Colo'.
    import enum

    class Color(str, enum.Enum):
        RED = "red"
        BLUE = "blue"

    _, om = _identity(tmp_path, TensorProto.STRING, ["N"])
    session = graphopt.load(om)
    for feed in (np.array([Color.RED, Color.BLUE], dtype=object), [Color.RED, Color.BLUE],
                 np.array([np.str_("red"), "blue"], dtype=object)):
        assert session.run({"x": feed})["y"].tolist() == ["red", "blue"], feed
