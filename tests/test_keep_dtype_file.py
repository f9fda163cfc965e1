"""--keep-dtype: node names and OpType::Type entries, inline or as ATC's --keep_dtype list file."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import parse_model, run_cli

MODEL = """
g (float[2,8] x) => (float[2,8] y) {
  a = MatMul(x, w1)
  r = Relu(a)
  y = MatMul(r, w2)
}"""


def _model(tmp_path):
    rng = np.random.default_rng(0)
    proto = parse_model(MODEL, w1=rng.standard_normal((8, 8)).astype(np.float32),
                        w2=rng.standard_normal((8, 8)).astype(np.float32))
    proto.graph.node[0].name, proto.graph.node[2].name = "first", "second"
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    return path


def _dtypes(path) -> dict[str, int]:
    model = onnx.load(path)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    types.update({v.name: v.type.tensor_type.elem_type for v in model.graph.output})
    return {node.name or node.op_type: types.get(node.output[0]) for node in model.graph.node
            if node.op_type in ("MatMul", "Relu")}


def test_a_file_of_names_and_op_types_keeps_them_in_their_dtype(tmp_path, capsys):
    keep = tmp_path / "exceptionlist.cfg"
    keep.write_text("# kept float32\nsecond\nOpType::Relu\n\n")
    out = tmp_path / "o.onnx"
    rc, _, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", out, "--precision",
                         "fp16", "--keep-dtype", keep, "--verify", "--no-accuracy-report")
    assert rc == 0, err
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    assert _dtypes(out) == {"first": f16, "Relu": f32, "second": f32}


def test_an_empty_or_unreadable_list_is_refused_by_name(tmp_path, capsys):
    empty = tmp_path / "empty.cfg"
    empty.write_text("# nothing\n")
    rc, _, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", tmp_path / "o.onnx",
                         "--precision", "fp16", "--keep-dtype", empty)
    assert rc == 1 and f"--keep-dtype {empty}: the file names no node or op type" in err
    bad = tmp_path / "types.cfg"
    bad.write_text("OpType::\n")
    rc, _, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", tmp_path / "o.onnx",
                         "--precision", "fp16", "--keep-dtype", bad)
    assert rc == 1 and "'OpType::' names no op type" in err


def test_op_types_given_inline_are_kept_as_a_files_lines_are(tmp_path, capsys):
    # `--keep-dtype "second,OpType::Relu"` kept nothing of Relu: the entry was taken for a node
    # name, and the note said it matched nothing.
    out = tmp_path / "o.onnx"
    rc, _, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", out, "--precision",
                         "fp16", "--keep-dtype", "second,OpType::Relu", "--verify",
                         "--no-accuracy-report")
    assert rc == 0 and "matches nothing" not in err, err
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    assert _dtypes(out) == {"first": f16, "Relu": f32, "second": f32}
    rc, _, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", out, "--precision",
                         "fp16", "--keep-dtype", "OpType::")
    assert rc == 1 and "--keep-dtype: 'OpType::' names no op type" in err, err


def test_a_list_file_that_is_not_there_is_refused_by_name(tmp_path, capsys):
    # A missing list or a directory was read as a node name, which a note said matched nothing.
    (tmp_path / "lists").mkdir()
    for entry in ("missing_file.cfg", "KEEP.TXT", str(tmp_path / "lists" / "keep.json"),
                  f"first,{tmp_path / 'lists' / 'keep.lst'}"):
        rc, _, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", tmp_path / "o.onnx",
                             "--precision", "fp16", "--keep-dtype", entry)
        missing = entry.split(",")[-1]
        assert rc == 1 and f"--keep-dtype {missing}: no such file" in err, err
    rc, _, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", tmp_path / "o.onnx",
                         "--precision", "fp16", "--keep-dtype", tmp_path / "lists")
    assert rc == 1 and f"--keep-dtype {tmp_path / 'lists'}: is a directory" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o.onnx").exists()


def test_node_names_with_slashes_and_dots_stay_node_names(tmp_path, capsys):
    # Exporters name nodes like paths (`/backbone/conv1/Conv`, `/Relu` under an existing /)
    # and with dots (paddle2onnx's `p2o.Conv.0`): no extension after the last slash.
    proto = onnx.load(_model(tmp_path))
    proto.graph.node[0].name, proto.graph.node[2].name = "/backbone/fc1/MatMul", "p2o.MatMul.1"
    onnx.save(proto, tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    rc, out_text, err = run_cli(capsys, "optimize", tmp_path / "m.onnx", "-o", out,
                                "--precision", "fp16", "--keep-dtype",
                                "/backbone/fc1/MatMul,p2o.MatMul.1,/Relu", "--no-accuracy-report")
    assert rc == 0 and "'/Relu' names nothing in the model" in out_text, err
    f32 = onnx.TensorProto.FLOAT
    # the Relu between the two kept MatMuls stays float32 too: half would only round it
    assert _dtypes(out) == {"/backbone/fc1/MatMul": f32, "Relu": f32, "p2o.MatMul.1": f32}


def test_atcs_keep_dtype_flag_refuses_a_missing_list_too(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "atc", f"--model={_model(tmp_path)}", "--framework=5",
                           f"--output={tmp_path / 'm'}", "--precision_mode=force_fp16",
                           "--soc_version=Ascend310",
                           f"--keep_dtype={tmp_path / 'exceptionlist.cfg'}")
    assert rc == 1 and f"--keep_dtype {tmp_path / 'exceptionlist.cfg'}: no such file" in err, err
    assert not (tmp_path / "m.om").exists()


def test_an_op_type_that_matches_nothing_is_named_as_the_keep_dtype_entry_given(tmp_path,
                                                                               capsys):
    # The CLI merged OpType:: entries into --precision-deny, and the note named that option,
    # which the command line never gave.
    rc, out, err = run_cli(capsys, "optimize", _model(tmp_path), "-o", tmp_path / "o.onnx",
                           "--precision", "fp16", "--keep-dtype", "OpType::Nope",
                           "--no-accuracy-report")
    assert rc == 0 and "--keep-dtype 'OpType::Nope'" in out and "--precision-deny" not in out, \
        out + err
    # The API takes the same entries, as ATC's list writes them.
    import graphopt

    result = graphopt.optimize(str(_model(tmp_path)), precision="fp16",
                               pass_options={"keep_dtype": {"OpType::Relu", "second"}})
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    kinds = {n.name or n.op_type: n.output.dtype for n in result.model.graph
             if n.op_type in ("MatMul", "Relu")}
    assert {k: int(v) for k, v in kinds.items()} == {"first": f16, "Relu": f32, "second": f32}
