"""What a process imports: `graphopt --help` and `import graphopt` stay light, loading and
running an .om imports neither the compiler nor onnx, and the lazy API names resolve to the
real objects."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, parse_model

import graphopt
from graphopt import numerics

# Modules only the compiler needs (passes, partitioner, tuner) and their heavy dependencies.
COMPILER = ("graphopt.compiler", "graphopt.passes", "graphopt.partition.partitioner",
            "graphopt.tuner", "networkx", "optuna")
RUNTIME = ("onnx", "onnxruntime", "numpy")
# What a small artifact's load does without: concurrent.futures (and logging with it) serves
# only the chunked hashing of large weights blobs, tempfile only writing files.
LOAD_SPARES = ("concurrent.futures", "logging", "tempfile")

SMALL = """
g (float[1, 4] x) => (float[1, 3] y) {
  y = MatMul(x, w)
}
"""


def imported_after(code: str, watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` a fresh interpreter has imported after running `code`."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps(sorted(m for m in {list(watched)!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_imports_neither_compiler_nor_runtime():
    code = ("import contextlib, io\nfrom graphopt.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass")
    assert imported_after(code, COMPILER + RUNTIME) == []


def test_import_graphopt_is_light():
    assert imported_after("import graphopt", COMPILER + RUNTIME) == []


def test_loading_an_om_leaves_the_compiler_out(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    model = parse_model(SMALL, w=w)
    source, om = tmp_path / "small.onnx", tmp_path / "small.om"
    onnx.save(model, source)
    graphopt.save(graphopt.optimize(str(source), target="cpu"), str(om))
    code = (f"import numpy as np, graphopt\n"
            f"s = graphopt.load({str(om)!r})\n"
            f"y = s.run({{'x': np.ones((1, 4), np.float32)}})['y']\n"
            f"assert np.allclose(y, np.ones((1, 4), np.float32) @ np.arange(12, dtype=np.float32)"
            f".reshape(4, 3)), y")
    assert imported_after(code, COMPILER + LOAD_SPARES) == []


def test_loading_an_om_with_string_inputs_needs_no_onnx(tmp_path):
    graph = onnx.helper.make_graph(
        # locale C: the default, en_US.UTF-8, may not be installed
        [onnx.helper.make_node("StringNormalizer", ["x"], ["y"], stopwords=["ab"], locale="C")],
        "strings", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.STRING, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [None])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)],
                                   ir_version=IR_VERSION)
    source, om = tmp_path / "strings.onnx", tmp_path / "strings.om"
    onnx.save(model, source)
    graphopt.save(graphopt.optimize(str(source), target="cpu"), str(om))
    code = (f"import numpy as np, graphopt\n"
            f"y = graphopt.load({str(om)!r}).run({{'x': np.array(['ab', 'Cd'])}})['y']\n"
            f"assert y.tolist() == ['Cd'], y")
    assert imported_after(code, COMPILER + ("onnx", "ml_dtypes")) == []


def test_loading_a_blocked_conv_with_mapped_weights_needs_no_onnx(tmp_path):
    # 2.4 MB of conv weights: a weights blob whose references the runtime repoints, and an
    # NCHWc conv whose block it checks against onnxruntime's.
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 256, 3, 3)) / 50).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         onnx.helper.make_node("Relu", ["c"], ["y"])], "conv",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 256, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 256, 8, 8])],
        [onnx.numpy_helper.from_array(w, "w")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)],
                                   ir_version=IR_VERSION)
    source, om, out = tmp_path / "conv.onnx", tmp_path / "conv.om", tmp_path / "y.npy"
    onnx.save(model, source)
    graphopt.save(graphopt.optimize(str(source), target="cpu"), str(om))
    x = rng.standard_normal((1, 256, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = (f"import numpy as np, graphopt\n"
            f"s = graphopt.load({str(om)!r})\n"
            f"np.save({str(out)!r}, s.run({{'x': np.load({str(tmp_path / 'x.npy')!r})}})['y'])")
    assert imported_after(code, COMPILER + ("onnx", "ml_dtypes", "google.protobuf")) == []
    expected = numerics.run(model, {"x": x})["y"]
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-4, atol=1e-4)
    np.savez(tmp_path / "x.npz", x=x)
    run = ["run", str(om), "--inputs", str(tmp_path / "x.npz")]  # inspect parses, with onnx
    cli = ("import contextlib, io\nfrom graphopt.cli import main\n"
           f"with contextlib.redirect_stdout(io.StringIO()):\n    assert main({run!r}) == 0")
    assert imported_after(cli, COMPILER + ("onnx",)) == []


@pytest.mark.parametrize("package, names", [
    ("graphopt", ["load", "optimize", "save", "OptimizeResult", "load_onnx", "to_onnx"]),
    ("graphopt.codegen", ["OmArtifact", "OmPartition", "OmProfile", "OmSession", "is_om",
                          "load_om", "write_om"]),
    ("graphopt.partition", ["Device", "OpSupport", "Partition", "Partitioning", "Placement",
                            "Target", "builtin_targets", "load_target", "partition", "place"]),
])
def test_lazy_names_resolve(package, names):
    module = __import__(package, fromlist=["_"])
    assert len(set(module.__all__)) == len(module.__all__)
    for name in names:
        assert name in module.__all__ and name in dir(module)
        value = getattr(module, name)
        assert getattr(value, "__name__", name) == name
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        getattr(module, "missing")


def test_a_compile_without_a_knowledge_base_leaves_optuna_out(tmp_path):
    source = tmp_path / "small.onnx"
    onnx.save(parse_model(SMALL, w=np.ones((4, 3), np.float32)), source)
    code = (f"import graphopt\n"
            f"graphopt.save(graphopt.optimize({str(source)!r}, target='ascend310'), "
            f"{str(tmp_path / 'small.om')!r})")
    assert imported_after(code, ("optuna",)) == []


def test_importing_the_tuner_keeps_no_frame_of_its_caller_alive():
    # optuna keeps the ImportError of its optional redis backend, whose traceback held every
    # frame above the first import: a compile's model, for the life of the process.
    code = ("import gc\n"
            "class Model: pass\n"
            "def compile_():\n"
            "    model = Model()\n"
            "    import graphopt.tuner.subgraph\n"
            "compile_()\n"
            "gc.collect()\n"
            "print(sum(isinstance(o, Model) for o in gc.get_objects()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["0"], done.stdout + done.stderr


def test_run_with_input_shape_needs_neither_onnx_nor_the_ir(tmp_path):
    # Pinning the random inputs' dims reads the artifact's signature: the IR (and onnx with
    # it) came in only for input_shapes' type annotation of Model.
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "relu",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    om = tmp_path / "relu.om"
    graphopt.save(graphopt.optimize(model), str(om))
    run = ["run", str(om), "--input-shape", "x:2,4"]
    cli = ("import contextlib, io\nfrom graphopt.cli import main\n"
           f"with contextlib.redirect_stdout(io.StringIO()):\n    assert main({run!r}) == 0")
    assert imported_after(cli, COMPILER + ("onnx", "graphopt.ir")) == []
