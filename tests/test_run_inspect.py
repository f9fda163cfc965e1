"""graphopt.load, `graphopt run` and `graphopt inspect`: results match onnxruntime on the source
model, outputs land in an .npz, latency is reported, the artifact is shown readably, and every
user error is one line with a non-zero exit."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import parse_model, run_cli
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.codegen import OmPartition, OmSession, write_om
from graphopt.codegen.feeds import check_feeds, load_npz, random_feeds, save_npz
from graphopt.codegen.inspect_om import op_counts, pass_totals
from graphopt.codegen.run_stats import LatencyStats, format_outputs, time_runs
from graphopt.errors import ArtifactError, InputError, OptionError

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)
RTOL, ATOL = 1e-5, 1e-6


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def _tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def exported(batch: int | str = 2) -> onnx.ModelProto:
    """Y = Relu(Identity(X * 1) @ W + B), with the leftovers an exporter leaves for passes to remove."""
    return _model(
        [
            helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(
                np.ones(1, np.float32))),
            helper.make_node("Mul", ["X", "one"], ["A"]),
            helper.make_node("Identity", ["A"], ["I"]),
            helper.make_node("MatMul", ["I", "W"], ["H"]),
            helper.make_node("Add", ["H", "B"], ["HB"]),
            helper.make_node("Relu", ["HB"], ["Y"]),
        ],
        [_tensor("X", [batch, 4])],
        [_tensor("Y", [batch, 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )


def two_partitions() -> list[OmPartition]:
    """Relu(X @ W) cut by hand between its nodes; H crosses the cut."""
    p0 = _model([helper.make_node("MatMul", ["X", "W"], ["H"])], [_tensor("X", [2, 4])],
                [_tensor("H", [2, 3])], [numpy_helper.from_array(W, "W")])
    p1 = _model([helper.make_node("Relu", ["H"], ["Y"])], [_tensor("H", [2, 3])], [_tensor("Y", [2, 3])])
    return [OmPartition("p0", "cpu", p0), OmPartition("p1", "cpu", p1)]


def reference(model: onnx.ModelProto, feeds: dict) -> dict:
    """The source model in onnxruntime with its own optimizations off, so none can hide a bug."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def x_batch(n: int = 2, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


@pytest.fixture
def compiled(tmp_path) -> str:
    """`exported()` through graphopt.optimize + graphopt.save: a one-partition .om with a pass log."""
    source = tmp_path / "model.onnx"
    onnx.save(exported(), source)
    path = tmp_path / "model.om"
    graphopt.save(graphopt.optimize(os.fspath(source)), path)
    return os.fspath(path)


@pytest.fixture
def dynamic(tmp_path) -> str:
    path = tmp_path / "dynamic.om"
    graphopt.save(graphopt.optimize(exported("N")), path)
    return os.fspath(path)


@pytest.fixture
def chained(tmp_path) -> str:
    path = tmp_path / "two.om"
    write_om(path, two_partitions(), pass_log=[{"pass": "FuseMatMul", "rewrites": {"Gemm": 2}}],
             extra={"memory_plan": {"arena": 96, "offsets": 3}, "tiling": [{"op": "MatMul"}]})
    return os.fspath(path)


@pytest.fixture
def npz(tmp_path):
    def write(name="x.npz", **arrays):
        path = tmp_path / name
        np.savez(path, **arrays)
        return os.fspath(path)
    return write


def cli(capsys, *argv) -> tuple[int, str, str]:
    return run_cli(capsys, *argv)


def assert_clean_error(rc, out: str, err: str, *needles: str) -> None:
    assert rc not in (0, None), f"expected failure, got rc={rc}; stderr={err!r}"
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphopt: error:"), err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


# --- graphopt.load -------------------------------------------------------------------------


def test_load_runs_like_onnxruntime_on_the_source(compiled):
    session = graphopt.load(compiled)
    assert isinstance(session, OmSession)
    assert session.inputs == [{"name": "X", "dtype": "float32", "shape": [2, 4]}]
    assert session.outputs == [{"name": "Y", "dtype": "float32", "shape": [2, 3]}]
    x = x_batch()
    got = session.run({"X": x})
    np.testing.assert_allclose(got["Y"], reference(exported(), {"X": x})["Y"], rtol=RTOL, atol=ATOL)


def test_load_two_partitions_with_session_options(chained):
    session = graphopt.load(chained, intra_op_num_threads=1, optimization_level="disable")
    x = x_batch()
    np.testing.assert_allclose(session.run({"X": x})["Y"], np.maximum(x @ W, 0), rtol=RTOL, atol=ATOL)
    with pytest.raises(OptionError, match="optimization_level 'fast'"):
        graphopt.load(chained, optimization_level="fast")


def test_load_is_public():
    assert "load" in graphopt.__all__ and graphopt.load is graphopt.codegen.loader.load


def test_load_refuses_an_onnx_model_naming_it(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(exported(), path)
    with pytest.raises(InputError, match=r"model\.onnx: not an \.om artifact .*graphopt optimize"):
        graphopt.load(path)
    renamed = tmp_path / "model.bin"  # judged by content, not only by name
    renamed.write_bytes(path.read_bytes())
    with pytest.raises(InputError, match=r"model\.bin: not an \.om artifact"):
        graphopt.load(renamed)


def test_load_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match=r"nope\.om: no such file"):
        graphopt.load(tmp_path / "nope.om")
    with pytest.raises(InputError, match="is a directory"):
        graphopt.load(tmp_path)


def tamper(path: str, dst: str) -> str:
    """Copy an .om with one byte of its partition flipped; the manifest's checksums left as they were."""
    with zipfile.ZipFile(path) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    data = bytearray(members["partitions/p0.onnx"])
    data[-1] ^= 0xFF
    members["partitions/p0.onnx"] = bytes(data)
    with zipfile.ZipFile(dst, "w") as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return dst


def test_load_tampered_artifact(compiled, tmp_path):
    bad = tamper(compiled, os.fspath(tmp_path / "bad.om"))
    with pytest.raises(ArtifactError, match=r"bad\.om: member 'partitions/p0\.onnx' fails its sha256"):
        graphopt.load(bad)


# --- feeds, npz and statistics -------------------------------------------------------------


SIGNATURE = [
    {"name": "x", "dtype": "float32", "shape": [2, 3]},
    {"name": "ids", "dtype": "int64", "shape": [4]},
    {"name": "mask", "dtype": "bool", "shape": []},
]


def test_random_feeds_are_seeded_and_shaped_by_the_signature():
    feeds = random_feeds(SIGNATURE, seed=3)
    assert {k: (v.dtype, v.shape) for k, v in feeds.items()} == {
        "x": (np.float32, (2, 3)), "ids": (np.int64, (4,)), "mask": (np.bool_, ())}
    assert set(np.unique(feeds["ids"])) <= {0, 1}
    again = random_feeds(SIGNATURE, seed=3)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert not np.array_equal(feeds["x"], random_feeds(SIGNATURE, seed=4)["x"])
    check_feeds(SIGNATURE, feeds)


@pytest.mark.parametrize("entry, message", [
    ({"name": "x", "dtype": "float32", "shape": ["N", 4]}, r"input 'x' .* dynamic dim 0 \('N'\)"),
    ({"name": "x", "dtype": "float32", "shape": [2, None]}, r"input 'x' .* dynamic dim 1 \(unknown\)"),
    ({"name": "x", "dtype": "float32", "shape": None}, "input 'x' has an unknown rank"),
    ({"name": "x", "dtype": None, "shape": [1]}, "input 'x' has dtype unknown"),
])
def test_random_feeds_need_a_static_signature(entry, message):
    with pytest.raises(InputError, match=message):
        random_feeds([entry])


@pytest.mark.parametrize("change, message", [
    ({"x": None}, r"missing input 'x' \(float32\[2,3\]\)"),
    ({"x": np.zeros((2, 3), np.float64)}, "input 'x' has dtype float64, expected float32"),
    ({"x": np.zeros((2, 3, 1), np.float32)}, r"input 'x' has shape \[2, 3, 1\] \(rank 3\)"),
    ({"x": np.zeros((2, 4), np.float32)}, r"dim 1 must be 3"),
    ({"y": np.zeros(1)}, "unknown input 'y'; the model's inputs are: x, ids, mask"),
])
def test_check_feeds_names_the_input(change, message):
    feeds = random_feeds(SIGNATURE)
    feeds.update(change)
    feeds = {name: array for name, array in feeds.items() if array is not None}
    with pytest.raises(InputError, match=message):
        check_feeds(SIGNATURE, feeds)


def test_check_feeds_holds_a_symbolic_dim_to_one_size_across_inputs():
    signature = [{"name": "ids", "dtype": "int64", "shape": ["batch", "seq"]},
                 {"name": "mask", "dtype": "int64", "shape": ["batch", "seq"]},
                 {"name": "pair", "dtype": "float32", "shape": ["seq", "seq", None]}]
    feeds = {"ids": np.zeros((2, 8), np.int64), "mask": np.zeros((2, 8), np.int64),
             "pair": np.zeros((8, 8, 3), np.float32)}
    check_feeds(signature, feeds)
    with pytest.raises(InputError, match=r"input 'mask' has shape \[2, 5\]: its dim 1 is 'seq', "
                                         r"which input 'ids' gives as 8 \(its dim 1\)"):
        check_feeds(signature, {**feeds, "mask": np.zeros((2, 5), np.int64)})
    with pytest.raises(InputError, match=r"input 'pair' .* its dim 1 is 'seq'"):
        check_feeds(signature, {**feeds, "pair": np.zeros((8, 1, 3), np.float32)})


def test_npz_round_trip_any_name(tmp_path):
    arrays = {"file": np.arange(3), "a/b:0": np.ones((2, 2), np.float16), "s": np.array(["x", "yz"], object)}
    path = tmp_path / "out.npz"
    save_npz(path, arrays)
    back = load_npz(path)
    assert list(back) == ["file", "a/b:0", "s"]
    assert back["a/b:0"].dtype == np.float16 and back["s"].tolist() == ["x", "yz"]
    assert sorted(os.listdir(tmp_path)) == ["out.npz"]  # no temporary left behind


def test_npz_stores_every_ml_dtype_as_raw_bits_numpy_reads_back(tmp_path):
    import ml_dtypes

    values = np.array([0.5, -2.0, 0.0], np.float32)
    arrays = {t.__name__: values.astype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                                      ml_dtypes.float8_e5m2)}
    path = tmp_path / "bits.npz"
    save_npz(path, arrays)
    with np.load(path) as stored:  # float8_e5m2 had the descr '<f1', which numpy refuses
        for name, array in arrays.items():
            assert stored[name].dtype.kind == "V"
            assert stored[name].tobytes() == array.tobytes()


def test_table_aligns_numbers_with_units_to_the_right():
    from graphopt.table import format_table

    text = format_table(["size", "name"], [["980.0 KiB", "a"], ["1.8 MiB", "12 B"],
                                           ["12,345 B", "1.5 ms"]])
    lines = text.splitlines()
    assert lines[2].startswith("980.0 KiB") and lines[3].startswith("  1.8 MiB")
    assert lines[4].startswith(" 12,345 B")
    # A column that also holds words stays left-aligned.
    assert lines[3].endswith("12 B") and lines[2].split()[-1] == "a"
    # One that holds numbers and "—" where a metric does not apply is numeric, its header too.
    text = format_table(["KL", "x"], [["—", "a"], ["0.00123", "b"]])
    assert text.splitlines()[:3] == ["     KL  x", "-------  -", "      —  a"]
    # Cells justified already (compare's columns): the header was left over the numbers.
    text = format_table(["KL", "x"], [["      —", "a"], ["0.00123", "b"]])
    assert text.splitlines()[0] == "     KL  x"
    # "<0.1" (partition's KiB of a 16-byte value, which read 0.0) is a number as well.
    assert format_table(["in KiB"], [["<0.1"], ["12.5"]]).splitlines()[2] == "  <0.1"


def test_format_bytes_past_gib_stays_readable(tmp_path, capsys):
    from graphopt.table import format_bytes

    assert format_bytes(3 << 30) == "3.00 GiB" and format_bytes(1536 << 30) == "1.50 TiB"
    assert format_bytes(16 << 60) == "16.00 EiB" and format_bytes(1 << 84) == "16.00 YiB"
    # Dims past a float's range: the division had failed inspect with an internal error.
    assert format_bytes(1 << 1240) == "2^1240+ B"
    # A model may declare any dims; inspect reads them, not the data: 2**40 × 2**40 floats.
    weight = onnx.TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1 << 40, 1 << 40],
                              data_location=TensorProto.EXTERNAL)
    weight.external_data.add(key="location", value="w.bin")
    giant = onnx.TensorProto(name="G", data_type=TensorProto.FLOAT, dims=[1 << 62] * 20,
                             data_location=TensorProto.EXTERNAL)
    giant.external_data.add(key="location", value="w.bin")
    graph = helper.make_graph(
        [helper.make_node("Add", ["W", "G"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight, giant])
    path = tmp_path / "huge.onnx"
    onnx.save(helper.make_model(graph), path)
    rc, out, err = run_cli(capsys, "inspect", path)
    assert rc == 0 and "2 initializers, 2^1242+ B (some in external data)" in out, err


def test_names_made_of_digits_stay_left_aligned(tmp_path, capsys):
    # Older PyTorch exports name outputs by number (`387`): run and compare right-aligned
    # such a name under the left-aligned "output"/"tensor" header, as a number.
    from graphopt.table import format_table

    text = format_table(["tensor", "n"], [["387", 5], ["12", 100]], names={0})
    assert text.splitlines() == ["tensor    n", "------  ---", "387       5", "12      100"]
    lines = format_outputs({"387": np.ones(2, np.float32)}).splitlines()
    assert lines[0].startswith("output  dtype") and lines[2].startswith("387     float32")
    source = parse_model("g (float[2] x) => (float[2] y) { y = Relu (x) }")
    source.graph.node[0].output[0] = source.graph.output[0].name = "387"
    onnx.save(source, tmp_path / "digits.onnx")
    rc, out, err = cli(capsys, "compare", tmp_path / "digits.onnx", tmp_path / "digits.onnx")
    assert rc == 0 and "\n387     f32[2]" in out, out
    rc, out, err = cli(capsys, "inspect", tmp_path / "digits.onnx")
    assert "\noutput  387     float32  [2]" in out, out


def test_table_wraps_its_last_column_to_a_terminal_width_only():
    from graphopt.table import format_table

    note = "float32 runs in float16 on the cube under ATC's default precision mode"
    rows = [["Conv", "5", note], ["Add", "8", "int64 on aicpu"]]
    text = format_table(["op", "rank", "note"], rows, width=40)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 40
    assert lines[2] == "Conv     5  float32 runs in float16 on"
    assert [line[:12] for line in lines[3:5]] == [" " * 12] * 2  # indented to the column
    assert " ".join(line.strip() for line in lines[2:5]).endswith(note)
    assert lines[-1] == "Add      8  int64 on aicpu"
    # Piped (no terminal), as tests and scripts read it: one line per row.
    assert format_table(["op", "rank", "note"], rows).splitlines()[2].endswith(note)
    # Too little room left for the column: lines stay whole rather than wrap into a sliver.
    assert format_table(["op", "rank", "note"], rows, width=20).splitlines()[2].endswith(note)
    # Two wide text columns: the widest gives way first, each cell wrapped in its column.
    rows = [["MatMul", "activation in Relu/LeakyRelu/Sigmoid/Tanh", note]]
    assert format_table(["op", "constraints", "note"], rows, width=60).splitlines() == [
        "op      constraints                note",
        "------  -------------------------  -------------------------",
        "MatMul  activation in              float32 runs in float16",
        "        Relu/LeakyRelu/Sigmoid/    on the cube under ATC's",
        "        Tanh                       default precision mode"]
    # A column of prose wraps before one of single names, however wide the names: at 80
    # columns optimize's pass table had cut "RenameOrtGeneratedInitialize" / "rs", names a
    # user copies into --disable-pass.
    rows = [["RenameOrtGeneratedInitializers", "1", "Gather=1, Unsqueeze=1, Concat=1, Add=2"]]
    assert format_table(["pass", "runs", "by rule"], rows, width=60).splitlines()[2:] == [
        "RenameOrtGeneratedInitializers     1  Gather=1, Unsqueeze=1,",
        "                                      Concat=1, Add=2"]
    # A name is cut after a separator where one falls in the line (it was cut mid-part:
    # "ascend310/conv/b" / "1_m1024_k27_n16/" / "float16").
    rows = [["ascend310/conv/b1_m1024_k27_n16/float16", "136.56", "14.97"]]
    assert format_table(["kernel signature", "default µs", "tuned µs"], rows, width=40,
                        names={0}).splitlines()[2:] == [
        "ascend310/conv/         136.56     14.97",
        "b1_m1024_k27_n16/",
        "float16"]
    # A part longer than the line breaks between its dims: at 80 columns `tune` cut
    # "b1_m3136_k576_n6" / "4/float16".
    from graphopt.table import _wrapped

    assert _wrapped("b1_m3136_k576_n64/float16", 16) == ["b1_m3136_k576_", "n64/float16"]


def test_inspect_names_the_precision_and_the_weights_by_type(tmp_path, capsys):
    rng = np.random.default_rng(0)
    model = parse_model("g (float[4,64] x, float[64,64] w) => (float[4,64] y) "
                        "{ y = MatMul (x, w) }",
                        w=rng.standard_normal((64, 64)).astype(np.float32))
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", x=rng.standard_normal((4, 64)).astype(np.float32))
    lines = {}
    for name, flags in (("float", []), ("int8", ["--quantize", "int8", "--quantize-ends",
                                                 "--calibration", tmp_path / "cal.npz"]),
                        ("mixed", ["--precision", "mixed-fp16", "--no-accuracy-report"])):
        path = tmp_path / f"{name}.om"
        rc, _, err = cli(capsys, "optimize", tmp_path / "m.onnx", "-o", path, *flags)
        assert rc == 0, err
        rc, out, err = cli(capsys, "inspect", path)
        lines[name] = next(line for line in out.splitlines() if line.startswith("  precision"))
    assert lines["float"].endswith("as the source (no lossy precision pass); weights f32 16.0 KiB")
    # The int8 weight and its zero points; float32 scales per column.
    assert lines["int8"].endswith("QuantizeInt8 (lossy); weights i8 4.1 KiB, f32 256 B")
    # The mode: fp16 and mixed-fp16 read alike ("ConvertPrecision (lossy)").
    assert "ConvertPrecision mixed-fp16 (lossy); weights f16 8.0 KiB" in lines["mixed"]


def test_table_cells_show_control_characters_escaped():
    from graphopt.table import format_table

    text = format_table(["tensor"], [["evil\x1b[2J\nline\ttab"]])
    assert "\x1b" not in text and "\t" not in text and text.count("\n") == 2
    assert "evil\\x1b[2J\\nline\\ttab" in text


def test_npz_refuses_pickles(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match="object arrays"):
        load_npz(path)


def test_latency_stats_and_time_runs():
    stats = LatencyStats.from_samples([float(i) for i in range(1, 101)])
    assert (stats.runs, stats.min, stats.max, stats.mean, stats.p50) == (100, 1.0, 100.0, 50.5, 50.5)
    assert stats.p90 == pytest.approx(90.1) and stats.p99 == pytest.approx(99.01)
    assert stats.to_json()["p50_ms"] == 50500.0
    calls = []
    samples = time_runs(lambda: calls.append(1), repeat=4, warmup=2)
    assert len(samples) == 4 and len(calls) == 6 and all(s >= 0 for s in samples)
    with pytest.raises(ValueError, match="repeat must be at least 1"):
        time_runs(lambda: None, repeat=0)


def test_format_outputs_summarizes_each_output():
    text = format_outputs({"y": np.array([[1.0, np.nan], [3.0, -1.0]], np.float32),
                           "ok": np.array([True, False]), "s": np.array(["a"], object)})
    lines = text.splitlines()
    assert lines[0].split() == ["output", "dtype", "shape", "min", "max", "mean", "nan/inf"]
    assert lines[2].split() == ["y", "float32", "[2,2]", "-1", "3", "1", "1"]
    assert lines[3].split()[:3] == ["ok", "bool", "[2]"]
    assert lines[4].split() == ["s", "string", "[1]"]  # ONNX's name, not numpy's object


# --- graphopt run --------------------------------------------------------------------------


def test_run_writes_the_outputs(compiled, npz, tmp_path, capsys):
    x = x_batch()
    out = tmp_path / "y.npz"
    rc, stdout, err = cli(capsys, "run", compiled, "--inputs", npz(X=x), "--outputs", out)
    assert rc == 0 and err == ""
    saved = load_npz(out)
    assert list(saved) == ["Y"]
    np.testing.assert_allclose(saved["Y"], reference(exported(), {"X": x})["Y"], rtol=RTOL, atol=ATOL)
    assert "loaded in" in stdout and "first run" in stdout
    assert f"wrote {out}: Y" in stdout
    assert "note:" not in stdout  # real inputs: nothing to say about them
    summary = next(line for line in stdout.splitlines() if line.startswith("Y "))
    assert summary.split()[:3] == ["Y", "float32", "[2,3]"]


def test_run_two_partitions_on_random_inputs_says_so(chained, tmp_path, capsys):
    out = tmp_path / "y.npz"
    rc, stdout, err = cli(capsys, "run", chained, "--outputs", out, "--seed", "7", "--threads", "1")
    assert rc == 0 and err == ""
    assert "note: no --inputs given: running on seeded random inputs (seed 7)" in stdout
    x = random_feeds(graphopt.load(chained).inputs, seed=7)["X"]
    np.testing.assert_allclose(load_npz(out)["Y"], np.maximum(x @ W, 0), rtol=RTOL, atol=ATOL)


def test_run_of_a_model_without_inputs_says_nothing_of_random_inputs(tmp_path, capsys):
    model = parse_model("g () => (float[3] c) { c = Constant <value = float[3] {1, 2, 3}> () }")
    om = tmp_path / "const.om"
    graphopt.save(graphopt.optimize(model), om)
    rc, stdout, err = cli(capsys, "run", om, "--outputs", tmp_path / "c.npz")
    assert rc == 0 and err == "", err
    assert "random" not in stdout
    np.testing.assert_array_equal(load_npz(tmp_path / "c.npz")["c"], [1, 2, 3])


def test_run_pins_the_dynamic_dims_of_its_random_inputs(tmp_path, capsys):
    # A dynamic artifact ran only on an --inputs file: random inputs had no size to take.
    model = parse_model("g (float[N, S] a, float[N, S] b) => (float[N, S] y) { y = Add (a, b) }")
    om = tmp_path / "add.om"
    graphopt.save(graphopt.optimize(model), om)
    out = tmp_path / "y.npz"
    rc, stdout, err = cli(capsys, "run", om, "--input-shape", "a:2,5", "--outputs", out)
    assert rc == 0, err
    feeds = random_feeds([{"name": n, "dtype": "float32", "shape": [2, 5]} for n in "ab"], seed=0)
    np.testing.assert_allclose(load_npz(out)["y"], feeds["a"] + feeds["b"], rtol=RTOL, atol=ATOL)
    rc, _, err = cli(capsys, "run", om)
    assert rc == 1 and "pin its dims with --input-shape, or pass --inputs" in err
    for pins, message in (("c:1,2", "add.om has no input 'c'"), ("a:2", "has rank 2"),
                          ("a:2,5;b:3,5", "dim 'N' pinned to both 2 and 3")):
        rc, _, err = cli(capsys, "run", om, "--input-shape", pins)
        assert rc == 1 and message in err, err
    np.savez(tmp_path / "x.npz", a=np.zeros((1, 1), np.float32), b=np.zeros((1, 1), np.float32))
    rc, _, err = cli(capsys, "run", om, "--input-shape", "a:2,5", "--inputs", tmp_path / "x.npz")
    assert rc == 1 and "--input-shape shapes random inputs" in err


def test_run_input_shape_sizes_what_a_profile_leaves_open(tmp_path, capsys):
    # --profile with --input-shape was refused outright, while a profile that leaves a dim
    # open asked for --input-shape: a profile of that kind could not be run on its own.
    model = parse_model("g (float[N, S] a, float[N, S] b) => (float[N, S] y) { y = Add (a, b) }")
    om, out = tmp_path / "add.om", tmp_path / "y.npz"
    graphopt.save(graphopt.optimize(model, dynamic_dims="N:1,2"), om)
    rc, _, err = cli(capsys, "run", om, "--profile", "profile1")
    assert rc == 1 and "pin its dims with --input-shape" in err, err
    rc, stdout, err = cli(capsys, "run", om, "--profile", "profile1", "--input-shape", "a:-1,5",
                          "--outputs", out)
    assert rc == 0 and "shape profile profile1 (N=2)" in stdout, err
    assert load_npz(out)["y"].shape == (2, 5)
    rc, _, err = cli(capsys, "run", om, "--profile", "profile1", "--input-shape", "a:1,5")
    assert rc == 1 and "input 'a' dim 0 is fixed to 2 by " in err and "profile profile1" in err


def test_run_repeat_prints_latency_percentiles(compiled, capsys):
    rc, stdout, err = cli(capsys, "run", compiled, "--repeat", "5", "--warmup", "1")
    assert rc == 0 and err == ""
    assert "latency of 5 run(s) after 1 warmup" in stdout
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("runs"))
    assert lines[header].split() == ["runs", "min", "ms", "mean", "ms", "p50", "ms", "p90", "ms",
                                     "p99", "ms", "max", "ms"]
    row = lines[header + 2].split()
    assert row[0] == "5"
    low, mean, p50, p90, p99, high = map(float, row[1:])
    assert low <= p50 <= p90 <= p99 <= high and low <= mean <= high
    assert "loaded in" in stdout and "first run" in stdout


def test_a_count_of_runs_past_ten_million_is_a_usage_error(compiled, capsys):
    # --repeat 99999999999999999999 ran until killed, keeping every sample in memory.
    for command, flag in (("run", "--repeat"), ("run", "--warmup"), ("profile", "--repeat"),
                          ("tune", "--repeat")):  # tune's: a measured subgraph trial's runs
        extra = ["--repeat", "2"] if flag == "--warmup" else []
        rc, _, err = cli(capsys, command, compiled, *extra, flag, "99999999999999999999")
        assert rc == 2 and "is too many; give" in err and "10,000,000" in err, (flag, err)


def test_run_dynamic_inputs_need_an_npz(dynamic, npz, capsys):
    rc, out, err = cli(capsys, "run", dynamic)
    assert_clean_error(rc, out, err, "dynamic.om", "input 'X'", "dynamic dim 0 ('N')", "--inputs")
    x = x_batch(5)
    rc, out, err = cli(capsys, "run", dynamic, "--inputs", npz(X=x))
    assert rc == 0 and "[5,3]" in out


def test_run_time_refusals_name_the_om_and_the_inputs_file(tmp_path, capsys):
    # "input shapes … fit none of …" and "partition 'p0' failed in onnxruntime" named
    # neither the artifact nor the --inputs file, as run, profile and compare printed them.
    source = parse_model("g (float[N,2] x) => (float[N,2] y) { y = Relu (x) }")
    onnx.save(source, tmp_path / "relu.onnx")
    om = tmp_path / "relu.om"
    graphopt.save(graphopt.optimize(source, dynamic_dims={"N": [1, 5]}), om)
    unfit = tmp_path / "three.npz"
    np.savez(unfit, x=np.ones((3, 2), np.float32))
    for argv, status in ((["run", om], 1), (["profile", om], 1),
                         (["compare", tmp_path / "relu.onnx", om], 2)):
        rc, _, err = cli(capsys, *argv, "--inputs", unfit)
        assert rc == status and f"error: {om} on --inputs {unfit}: input shapes x[3, 2] fit " \
                                "none of the model's 2 shape profiles" in err, (argv, err)
    reshape = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
                                [_tensor("x", [2, 3]), _tensor("shape", [2], TensorProto.INT64)],
                                [_tensor("y", None)])
    failing = tmp_path / "reshape.om"
    write_om(failing, [OmPartition("p0", "cpu", helper.make_model(
        reshape, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))])
    np.savez(tmp_path / "bad_shape.npz", x=np.ones((2, 3), np.float32),
             shape=np.array([4, 2], np.int64))
    rc, _, err = cli(capsys, "run", failing, "--inputs", tmp_path / "bad_shape.npz")
    assert rc == 1 and f"error: {failing} on --inputs {tmp_path / 'bad_shape.npz'}: partition " \
                       "'p0' failed in onnxruntime: " in err, err


def test_run_bad_inputs(compiled, npz, tmp_path, capsys):
    not_npz = tmp_path / "x.txt"
    not_npz.write_text("1 2 3\n")
    # Zips of other files: numpy read their members as bytes, "unknown input 'manifest.json'".
    other_zip = tmp_path / "notes.zip"
    with zipfile.ZipFile(other_zip, "w") as zf:
        zf.writestr("notes.txt", "X")
    cases = [
        (npz("empty.npz"), ["--inputs", "empty.npz: missing input 'X' (float32[2,4])"]),
        (npz("z.npz", Z=x_batch()), ["--inputs", "unknown input 'Z'; the model's inputs are: X"]),
        (npz("f64.npz", X=x_batch().astype(np.float64)), ["input 'X' has dtype float64, expected float32[2,4]"]),
        (npz("batch3.npz", X=x_batch(3)), ["input 'X' has shape [3, 4]", "dim 0 must be 2"]),
        (os.fspath(not_npz), ["--inputs ", "x.txt: not an .npz archive"]),
        (compiled, [f"--inputs {compiled}: not an .npz archive of named arrays (it is a "
                    "graphopt .om artifact; write one with np.savez("]),
        (os.fspath(other_zip), ["--inputs ", "notes.zip: not an .npz archive of named arrays "
                                "('notes.txt' in it is not an .npy array; write one"]),
        (os.fspath(tmp_path / "none.npz"), ["--inputs ", "none.npz: no such file"]),
    ]
    out_path = tmp_path / "y.npz"
    for inputs, needles in cases:
        rc, out, err = cli(capsys, "run", compiled, "--inputs", inputs, "--outputs", out_path)
        assert_clean_error(rc, out, err, *needles)
        assert not out_path.exists()


@pytest.mark.parametrize("argv, needles", [
    (["--repeat", "0"], ["run: argument --repeat: 0 is not allowed; give 1 or more"]),
    (["--warmup", "2"], ["--warmup is only used with --repeat"]),
    (["--repeat", "2", "--warmup", "-1"], ["argument --warmup: -1 is negative"]),
    (["--threads", "-2"], ["argument --threads: -2 is negative"]),
    (["--outputs", "no/such/dir/y.npz"], ["does not exist"]),
    (["--repeat", "many"], ["run: argument --repeat: 'many' is not an integer"]),
])
def test_run_bad_options(compiled, capsys, argv, needles):
    rc, out, err = cli(capsys, "run", compiled, *argv)
    assert_clean_error(rc, out, err, *needles)
    # A value of the wrong form does not parse (2); options that do not fit together, 1.
    assert rc == (1 if argv[0] in ("--warmup", "--outputs") else 2)


def test_run_bad_artifacts(compiled, tmp_path, capsys):
    source = tmp_path / "model.onnx"
    onnx.save(exported(), source)
    bad = tamper(compiled, os.fspath(tmp_path / "bad.om"))
    garbage = tmp_path / "garbage.om"
    garbage.write_bytes(b"\x00not an artifact")
    cases = [
        (tmp_path / "missing.om", ["missing.om: no such file"]),
        (source, ["model.onnx: not an .om artifact", "graphopt optimize"]),
        (bad, ["bad.om: member 'partitions/p0.onnx' fails its sha256 check"]),
        (garbage, ["garbage.om: not an .om artifact (not a zip archive)"]),
    ]
    for path, needles in cases:
        rc, out, err = cli(capsys, "run", path)
        assert_clean_error(rc, out, err, *needles)


def test_run_turns_the_cpu_stand_in_warning_into_a_note(tmp_path, capsys):
    p0, p1 = two_partitions()
    p1.device, p1.providers = "npu", ["CANNExecutionProvider"]
    path = tmp_path / "npu.om"
    write_om(path, [p0, p1], target="ascend310")
    rc, out, err = cli(capsys, "run", path)
    assert rc == 0 and err == ""  # no Python warning text on stderr
    assert "note: CANNExecutionProvider not installed: p1 (npu) run on the CPU provider" in out
    rc, out, err = cli(capsys, "inspect", path)
    assert rc == 0 and "target     ascend310" in out
    assert any(line.split()[:4] == ["1", "p1", "npu", "CANNExecutionProvider"]
               for line in out.splitlines())


# --- graphopt inspect ----------------------------------------------------------------------


def test_inspect_shows_partitions_routing_and_extras(chained, capsys):
    rc, out, err = cli(capsys, "inspect", chained)
    assert rc == 0 and err == ""
    assert "graphopt-om 1, written by graphopt" in out
    assert "3 verified against the manifest's sha256" in out  # two partitions, the details
    lines = out.splitlines()
    assert any(line.split()[:6] == ["0", "p0", "cpu", "1", "MatMul=1", "X"] for line in lines)
    assert any(line.split()[:6] == ["1", "p1", "cpu", "1", "Relu=1", "H"] for line in lines)
    routing = lines[lines.index("routing") + 3:][:3]
    assert [line.split() for line in routing] == [
        ["X", "(caller)", "p0"], ["H", "p0", "p1"], ["Y", "p1", "(caller)"]]
    assert "  memory_plan: 2 entries" in lines and "  tiling: 1 entries" in lines
    assert any(line.split() == ["FuseMatMul", "1", "2", "Gemm=2"] for line in lines)


def test_inspect_shows_how_each_partition_session_is_set_up(tmp_path, capsys):
    p0, p1 = two_partitions()
    p0.optimization_level = "disable"
    p1.disabled_optimizers = ["WeightBiasQuantization"]
    path = tmp_path / "levels.om"
    write_om(path, [p0, p1])
    rc, out, _ = cli(capsys, "inspect", os.fspath(path))
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("#  partition"))
    assert header.split()[:5] == ["#", "partition", "device", "session", "nodes"]
    assert any(line.split()[:5] == ["0", "p0", "cpu", "disable", "1"] for line in lines)
    assert any(line.split()[:6] == ["1", "p1", "cpu", "all", "without", "WeightBiasQuantization"]
               for line in lines)


def test_inspect_compiled_shows_the_pass_log(compiled, capsys):
    rc, out, err = cli(capsys, "inspect", compiled)
    assert rc == 0 and err == ""
    # Compiled without a target.
    assert "source     model.onnx  sha256 " in out and "target     none" in out
    assert "input   X       float32  [2,4]" in out
    assert "pass log:" in out and "nodes 6 -> " in out
    no_ops = next(line for line in out.splitlines() if line.startswith("EliminateNoOps"))
    assert "Mul=1" in no_ops
    assert "extra: none" in out


def test_inspect_json(chained, capsys):
    rc, out, err = cli(capsys, "inspect", chained, "--json")
    assert rc == 0 and err == ""
    data = json.loads(out)
    assert data["checksums_verified"] is True
    assert data["manifest"]["execution_order"] == ["p0", "p1"]
    assert data["manifest"]["extra"]["tiling"] == [{"op": "MatMul"}]
    assert data["partition_ops"] == [{"name": "p0", "nodes": 1, "ops": {"MatMul": 1}},
                                     {"name": "p1", "nodes": 1, "ops": {"Relu": 1}}]


def test_inspect_nodes_lists_each_partitions_nodes(chained, tmp_path, capsys):
    # What ATC's --mode=1 JSON gives: every node with its tensors and attributes.
    rc, out, err = cli(capsys, "inspect", chained, "--nodes")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert "nodes of p0 (1)" in lines and "nodes of p1 (1)" in lines
    header = lines[lines.index("nodes of p1 (1)") + 1]
    assert header.split() == ["#", "node", "op", "inputs", "outputs", "attributes"]
    assert lines[lines.index("nodes of p1 (1)") + 3].split() == ["0", "Relu", "H", "Y"]  # unnamed
    shown = tmp_path / "nodes.json"
    rc, out, err = cli(capsys, "inspect", chained, "--json", "--nodes", "-o", shown)
    assert rc == 0 and out == f"wrote {shown}\n", err
    graphs = [p["graph"] for p in json.loads(shown.read_text())["partition_ops"]]
    assert [[(n["op"], n["inputs"], n["outputs"]) for n in g] for g in graphs] == [
        [("MatMul", ["X", "W"], ["H"])], [("Relu", ["H"], ["Y"])]]
    rc, out, err = cli(capsys, "inspect", chained, "-o", chained)
    assert_clean_error(rc, out, err, "would overwrite the model")


def test_inspect_nodes_json_is_strict_and_describes_tensors_and_bodies(tmp_path, capsys):
    # Strict JSON has no NaN; a Constant's tensor and an If's bodies are described, not dumped.
    then = helper.make_graph([helper.make_node("Constant", [], ["T"], value_float=1.0)],
                             "then", [], [_tensor("T", [])])
    other = helper.make_graph([helper.make_node("Constant", [], ["E"], value_float=2.0)],
                              "else", [], [_tensor("E", [])])
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
                 np.zeros((2, 3), np.float32))),
             helper.make_node("Clip", ["x", "", ""], ["k"], name="clip"),
             helper.make_node("LeakyRelu", ["k"], ["l"], alpha=float("nan")),
             helper.make_node("If", ["b"], ["y"], then_branch=then, else_branch=other)]
    path = tmp_path / "m.onnx"
    onnx.save(_model(nodes, [_tensor("x", [2, 3]), _tensor("b", [], TensorProto.BOOL)],
                     [_tensor("y", []), _tensor("l", [2, 3])]), path)
    rc, out, err = cli(capsys, "inspect", path, "--json", "--nodes")
    assert rc == 0, err
    graph = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))["graph"]
    assert graph[0]["attributes"] == {"value": {"tensor": "float", "shape": [2, 3]}}
    assert graph[1]["inputs"] == ["x", "", ""] and graph[2]["attributes"] == {"alpha": "nan"}
    assert graph[3]["attributes"]["then_branch"]["nodes"][0]["outputs"] == ["T"]
    rc, out, err = cli(capsys, "inspect", path, "--nodes")
    assert rc == 0 and "then_branch=<body of 1 nodes>" in out and "value=<float [2, 3]>" in out


def test_inspect_nodes_text_elides_long_names_and_shows_binary_bytes(tmp_path, capsys):
    # Each column is as wide as its widest cell: one 5,000-character name had made a 100k-node
    # listing 503 MB. Binary bytes had been decoded with replacement characters.
    long = "n" * 5000
    nodes = [helper.make_node("Relu", ["x"], [long], name=long),
             helper.make_node("Tagged", [long], ["y"], name="id", domain="my.ops",
                              tag=b"\xff\xfe\x00bin")]
    model = helper.make_model(helper.make_graph(nodes, "g", [_tensor("x", [2])],
                                                [_tensor("y", [2])]),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("my.ops", 1)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    rc, out, err = cli(capsys, "inspect", path, "--nodes")
    assert rc == 0, err
    assert max(len(line) for line in out.splitlines()) < 400 and "tag=<6 bytes>" in out
    rc, out, err = cli(capsys, "inspect", path, "--nodes", "--json")
    graph = json.loads(out)["graph"]
    assert graph[0]["name"] == long and graph[1]["attributes"] == {"tag": {"bytes_hex":
                                                                            "fffe0062696e"}}


def test_inspect_onnx(tmp_path, capsys):
    path = tmp_path / "model.onnx"
    onnx.save(exported("N"), path)
    rc, out, err = cli(capsys, "inspect", path)
    assert rc == 0 and err == ""
    assert "ai.onnx 17" in out and "nodes    6 (6 op types)" in out
    assert f"2 initializers, 1 Constant node tensor(s), {W.nbytes + B.nbytes + 4} B\n" in out
    assert "input   X       float32  [N,4]" in out
    rc, out, err = cli(capsys, "inspect", path, "--json")
    data = json.loads(out)
    assert data["nodes"] == 6 and data["ops"]["MatMul"] == 1 and data["weight_bytes"] == 64
    assert data["opsets"] == {"ai.onnx": 17} and data["inputs"][0]["shape"] == ["N", 4]


def test_inspect_onnx_names_its_model_local_functions(tmp_path, capsys):
    # -O3's FuseElementwise calls local functions: `nodes 1` alone hid the body's 2 ops.
    body = helper.make_function("graphopt", "elementwise_0", ["a"], ["c"],
                                [helper.make_node("Relu", ["a"], ["b"]),
                                 helper.make_node("Neg", ["b"], ["c"])],
                                [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("elementwise_0", ["x"], ["y"], domain="graphopt")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "f.onnx"
    onnx.save(helper.make_model(graph, functions=[body], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("graphopt", 1)]), path)
    rc, out, err = cli(capsys, "inspect", path)
    assert rc == 0, err
    assert "  functions  1 model-local: graphopt::elementwise_0 (2 nodes)\n" in out
    rc, out, err = cli(capsys, "inspect", path, "--json")
    assert json.loads(out)["functions"] == [{"name": "graphopt::elementwise_0", "nodes": 2}]


def test_inspect_errors(compiled, tmp_path, capsys):
    bad = tamper(compiled, os.fspath(tmp_path / "bad.om"))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xff\xfe garbage")
    npz_path = tmp_path / "x.npz"
    np.savez(npz_path, x=np.zeros(1))
    cases = [
        (bad, ["bad.om: member 'partitions/p0.onnx' fails its sha256 check"]),
        (junk, ["junk.bin: neither an .om artifact nor a valid ONNX model"]),
        (npz_path, ["x.npz: no manifest.json"]),
        (tmp_path / "missing.om", ["missing.om: no such file"]),
    ]
    for path, needles in cases:
        rc, out, err = cli(capsys, "inspect", path)
        assert_clean_error(rc, out, err, *needles)


def test_inspect_counts_the_weights_inside_if_branches(tmp_path, capsys):
    # silero-vad keeps its 2.1 MiB of float weights in If branches: inspect said "0
    # initializers, 0 B" of the .onnx and "weights i64 8 B" of the .om.
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w_then")
    then = helper.make_graph([helper.make_node("MatMul", ["X", "w_then"], ["T"])], "then", [],
                             [_tensor("T", [4, 64])], [weight])
    other = helper.make_graph([
        helper.make_node("Constant", [], ["w_else"], value=numpy_helper.from_array(
            rng.standard_normal((64, 64)).astype(np.float32))),
        helper.make_node("MatMul", ["X", "w_else"], ["E"])], "else", [], [_tensor("E", [4, 64])])
    model = _model([helper.make_node("If", ["C"], ["Y"], then_branch=then, else_branch=other)],
                   [_tensor("C", [], TensorProto.BOOL), _tensor("X", [4, 64])],
                   [_tensor("Y", [4, 64])])
    onnx.save(model, tmp_path / "if.onnx")
    rc, out, err = cli(capsys, "inspect", tmp_path / "if.onnx")
    assert rc == 0, err
    assert "weights  1 initializers, 1 Constant node tensor(s), 32.0 KiB (32.0 KiB of it inside " \
           "If/Loop/Scan bodies)" in out
    rc, out, err = cli(capsys, "inspect", tmp_path / "if.onnx", "--json")
    data = json.loads(out)
    assert (data["initializers"], data["constant_tensors"], data["weight_bytes"],
            data["nested_weight_bytes"]) == (1, 1, 32768, 32768)
    rc, _, err = cli(capsys, "optimize", tmp_path / "if.onnx", "-o", tmp_path / "if.om")
    assert rc == 0, err
    rc, out, err = cli(capsys, "inspect", tmp_path / "if.om")
    assert rc == 0 and "(no lossy precision pass); weights f32 32.0 KiB\n" in out, out


def test_pass_totals_tolerate_a_free_form_log():
    totals = pass_totals([{"pass": "A", "rewrites": {"r": 2}}, {"pass": "A", "rewrites": {"r": 1, "s": True}},
                          "odd", {"changed": 1}])
    assert list(totals) == ["A", "(unnamed)"]
    assert totals["A"]["runs"] == 2 and dict(totals["A"]["rewrites"]) == {"r": 3}
    assert totals["(unnamed)"]["runs"] == 2


def test_op_counts_include_nested_graphs():
    then = helper.make_graph([helper.make_node("Relu", ["X"], ["T"])], "then", [], [_tensor("T", [2])])
    other = helper.make_graph([helper.make_node("Neg", ["X"], ["E"])], "else", [], [_tensor("E", [2])])
    model = _model([helper.make_node("If", ["C"], ["Y"], then_branch=then, else_branch=other)],
                   [_tensor("C", [], TensorProto.BOOL), _tensor("X", [2])], [_tensor("Y", [2])])
    assert op_counts(model) == {"If": 1, "Relu": 1, "Neg": 1}


# --- the command line itself ---------------------------------------------------------------


@pytest.mark.parametrize("command, needles", [
    ("run", ["--inputs NPZ", "--repeat N", "np.savez", "examples:"]),
    ("inspect", ["--json", "graphopt inspect model.onnx", "examples:"]),
])
def test_help(capsys, command, needles):
    rc, out, _ = cli(capsys, command, "--help")
    assert rc == 0
    for needle in needles:
        assert needle in out


def test_every_command_has_its_summary_on_its_own_line(capsys):
    from graphopt.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    commands = [line.split() for line in listing.splitlines() if line[4] != " "]
    assert {"optimize", "partition", "calibrate", "zoo"} <= {words[0] for words in commands}
    assert all(len(words) > 1 for words in commands), listing


def test_registered_with_graphopt_main(compiled, capsys):
    from graphopt.cli import main

    assert main(["inspect", compiled]) == 0
    assert main(["run", compiled, "--repeat", "2"]) == 0
    with pytest.raises(SystemExit) as exited:  # argparse exits 2 for it
        main(["run", compiled, "--repeat", "0"])
    assert exited.value.code == 2
    assert "--repeat: 0 is not allowed" in capsys.readouterr().err


def test_an_onnx_model_named_om_is_inspected_and_profiled_as_one(tmp_path, capsys):
    # inspect and profile trusted the suffix: "not an .om artifact (not a zip archive)".
    named_om = tmp_path / "model.om"
    onnx.save(exported(), named_om)
    rc, out, err = cli(capsys, "inspect", named_om)
    assert rc == 0 and "format   ONNX" in out, err
    rc, out, err = cli(capsys, "profile", named_om, "--repeat", "1")
    assert rc == 0 and "per run: wall" in out, err
    rc, _, err = cli(capsys, "run", named_om)
    assert rc == 1 and "not an .om artifact (it looks like an ONNX model)" in err
    # Bytes named .onnx that are no model were called one, with the advice to compile them.
    for name, data in (("random.onnx", bytes(range(7, 200))), ("empty.onnx", b""),
                       ("text.onnx", b"hello world")):
        (tmp_path / name).write_bytes(data)
        rc, _, err = cli(capsys, "run", tmp_path / name)
        assert rc == 1 and "neither an .om artifact nor an ONNX model" in err, err


def test_an_om_given_where_onnx_is_expected_is_named_as_such(compiled, capsys):
    rc, _, err = cli(capsys, "partition", compiled, "--target", "ascend310")
    assert rc == 1 and "a zip archive (a graphopt .om?), not an ONNX model" in err


def test_report_on_a_damaged_om_says_what_is_wrong_with_it(compiled, tmp_path, capsys):
    damaged = tmp_path / "damaged.om"
    damaged.write_bytes(open(compiled, "rb").read()[:300])
    rc, _, err = cli(capsys, "report", str(damaged), "-o", str(tmp_path / "r.html"))
    assert rc == 1 and "truncated or corrupt zip archive" in err and "compile it first" not in err


@pytest.mark.parametrize("elem_type, shown", [(99, "elem_type 99"), (-1, "elem_type -1")])
def test_inspect_of_an_onnx_with_an_undefined_element_type_says_so(tmp_path, capsys, elem_type,
                                                                   shown):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem_type, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    _inspect_refuses(tmp_path, capsys, graph,
                     f"value 'x' has an element type ONNX does not define ({shown})")


def test_inspect_of_an_onnx_with_a_negative_weight_dim_says_so(tmp_path, capsys):
    # Its weight bytes read "-16 B".
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[-4, 1])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1])],
                              [weight])
    _inspect_refuses(tmp_path, capsys, graph,
                     "weight 'w' has a negative dim [-4, 1]; not a valid ONNX model")


def _inspect_refuses(tmp_path, capsys, graph, message: str) -> None:
    """inspect of `graph` as an .onnx, text and --json, fails saying `message`."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    for extra in ([], ["--json"]):
        rc, out, err = run_cli(capsys, "inspect", tmp_path / "m.onnx", *extra)
        assert rc == 1 and not out
        assert message in err, err


def _float64_chain(blocks: int, width: int = 256, rows: int = 128) -> onnx.ModelProto:
    """MatMul -> Relu -> Cast(float64) -> Sqrt -> Cast(float32), `blocks` times: each float64
    node falls back to the host for its own reason (the value it reads is named in it)."""
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for i in range(blocks):
        weights.append(numpy_helper.from_array(
            (rng.standard_normal((width, width)) * 0.2).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
                  helper.make_node("Cast", [f"r{i}"], [f"d{i}"], to=TensorProto.DOUBLE),
                  helper.make_node("Sqrt", [f"d{i}"], [f"s{i}"]),
                  helper.make_node("Cast", [f"s{i}"], [f"f{i}"], to=TensorProto.FLOAT)]
        current = f"f{i}"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [rows, width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_inspect_lists_partitions_in_execution_order_and_says_what_it_leaves_out(tmp_path,
                                                                                  capsys):
    from graphopt.codegen.inspect_om import by_partition
    from graphopt.partition.report import format_partitioning

    assert [name for name, _ in by_partition({"p10_npu": 0, "p2_cpu": 0, "p1_npu": 0})] == \
        ["p1_npu", "p2_cpu", "p10_npu"]
    result = graphopt.optimize(_float64_chain(8), target="ascend310")
    graphopt.save(result, tmp_path / "chain.om")
    rc, out, err = run_cli(capsys, "inspect", tmp_path / "chain.om")
    assert rc == 0, err
    placement = out[out.index("placement: 40 node(s) fell back"):].splitlines()
    assert placement[13] == "… and 15 more reason(s) (--json lists every node's)", placement
    # The compile's summary points at the command that takes --all-fallbacks.
    text = format_partitioning(result.partitioning, more="graphopt partition m.onnx …")
    assert text.endswith("… and 5 more reason(s) (graphopt partition m.onnx …)")


def test_inspect_of_an_onnx_names_external_data_that_is_missing(tmp_path, capsys):
    # inspect reads the weights' dims only, so it showed such a model as whole, while
    # compare, diff and optimize refuse it.
    path = tmp_path / "m.onnx"
    onnx.save(graphopt.zoo.build("tiny"), path, save_as_external_data=True, location="m.bin",
              size_threshold=0)
    rc, out, err = run_cli(capsys, "inspect", path)
    assert rc == 0 and "missing beside the model" not in out, err
    (tmp_path / "m.bin").unlink()
    rc, out, err = run_cli(capsys, "inspect", path)
    assert rc == 0 and "; missing beside the model: m.bin (it will not load without them)" in out
    rc, out, _ = run_cli(capsys, "inspect", path, "--json")
    assert json.loads(out)["missing_external_files"] == ["m.bin"]
    # A location outside the folder is named so, existing or not (it read "missing beside the
    # model" for ../../etc/passwd).
    proto = onnx.load(path, load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../../etc/passwd"
    onnx.save(proto, path)
    rc, out, err = run_cli(capsys, "inspect", path)
    assert rc == 0 and "; outside the model's folder: ../../etc/passwd (compile and load " \
        "refuse external data there)" in out and "missing beside" not in out, (out, err)
