"""The CPU cost model: exact work per node, monotonic times, calibration on this machine (runs,
round-trips, warns when stale), `graphopt calibrate`, and the Spearman helper."""

from __future__ import annotations

import json
import math
import os

import onnx
import onnxruntime as ort
import pytest
from helpers import run_cli

from graphopt.errors import OptionError
from graphopt.ir import load_onnx
from graphopt.tuner.calibrate import (
    CalibrationResult,
    StaleCalibrationWarning,
    calibrate,
)
from graphopt.tuner.cpu_model import (
    OP_CLASSES,
    ClassConstants,
    CpuCostModel,
    default_constants,
    node_work,
    op_class,
    ranks,
    spearman,
)


def _graph(text: str):
    """The IR of an onnx.parser model text with shapes inferred."""
    proto = onnx.shape_inference.infer_shapes(onnx.parser.parse_model(text))
    return load_onnx(proto)


def _node(text: str):
    (node,) = list(_graph(text).graph)
    return node


HEADER = '<ir_version: 9, opset_import: ["" : 17]>\n'


def test_matmul_work():
    node = _node(HEADER + "g (float[2,3,4] a, float[4,5] b) => (float[2,3,5] y) { y = MatMul(a, b) }")
    assert op_class(node) == "gemm"
    assert node_work(node) == (2 * 2 * 3 * 5 * 4, 4 * (24 + 20 + 30))


def test_gemm_work_reads_k_from_transposed_a():
    node = _node(HEADER + "g (float[4,3] a, float[4,5] b, float[5] c) => (float[3,5] y) "
                 "{ y = Gemm <transA = 1> (a, b, c) }")
    assert node_work(node) == (2 * 3 * 5 * 4, 4 * (12 + 20 + 5 + 15))


def test_conv_work():
    node = _node(HEADER + "g (float[1,2,5,5] x, float[4,2,3,3] w, float[4] b) => "
                 "(float[1,4,5,5] y) { y = Conv <pads = [1,1,1,1]> (x, w, b) }")
    assert op_class(node) == "conv"
    assert node_work(node) == (2 * 100 * 18, 4 * (50 + 72 + 4 + 100))


def test_elementwise_work_counts_one_op_per_output_element():
    node = _node(HEADER + "g (float[2,3] a, float[3] b) => (float[2,3] y) { y = Add(a, b) }")
    assert op_class(node) == "elementwise"
    assert node_work(node) == (6, 4 * (6 + 3 + 6))


@pytest.mark.parametrize("frame, flops", [(400, 2 * (1 * 36 * 201 * 2) * 400),
                                          (512, 5 * 1 * 35 * 512 * 9)])
def test_stft_work_is_a_plain_dft_or_an_fft(frame, flops):
    # onnxruntime sums a frame length other than a power of two as a plain DFT: priced as one
    # op an output element, a keyword spotter's STFT was estimated at 9 µs of its 2.5 ms.
    node = _node(HEADER + f"g (float[1,6000,1] x) => (float[1,?,?,2] y) <int64 step = {{160}}, "
                 f"float[{frame}] w = {{{', '.join(['1.0'] * frame)}}}> "
                 "{ y = STFT <onesided = 1> (x, step, w) }")
    assert node_work(node)[0] == flops


def test_reshape_is_free():
    node = _node(HEADER + "g (float[2,6] x, int64[2] s) => (float[3,4] y) { y = Reshape(x, s) }")
    assert op_class(node) == "view"
    assert node_work(node) == (0, 0)
    assert CpuCostModel().node_seconds(node) == pytest.approx(
        CpuCostModel().constants["view"].overhead_us * 1e-6)


def test_gather_reads_only_the_rows_it_outputs():
    node = _node(HEADER + "g (float[1000,8] t, int64[2,3] i) => (float[2,3,8] y) "
                 "{ y = Gather(t, i) }")
    assert node_work(node) == (0, 2 * 4 * 48 + 8 * 6)


def test_unknown_shapes_count_no_work():
    node = _node(HEADER + "g (float[N,4] a, float[4,5] b) => (float[N,5] y) { y = MatMul(a, b) }")
    assert node_work(node) == (0, 4 * 20)


QDQ_CONV = HEADER + """g (uint8[1,8,6,6] xq, float xs, uint8 xz, int8[8,8,3,3] wq, float ws,
                          float ys, uint8 yz) => (uint8[1,8,6,6] yq) {
    x = DequantizeLinear(xq, xs, xz)
    w = DequantizeLinear(wq, ws)
    y = Conv <pads = [1,1,1,1]> (x, w)
    yq = QuantizeLinear(y, ys, yz)
}"""


def _nodes(text: str) -> dict:
    return {n.op_type: n for n in _graph(text).graph}


def test_a_qdq_conv_is_priced_as_the_int8_kernel_onnxruntime_fuses_it_into():
    nodes = _nodes(QDQ_CONV)
    conv = nodes["Conv"]
    assert op_class(conv) == "conv_int8"
    # The flops of the float conv; the bytes of the uint8/int8 tensors it reads and writes.
    assert node_work(conv) == (2 * 288 * 72, 288 + 576 + 288)
    cost = CpuCostModel()
    for absorbed in ("DequantizeLinear", "QuantizeLinear"):  # no kernel of their own
        assert node_work(nodes[absorbed]) == (0, 0)
        assert cost.node_seconds(nodes[absorbed]) == 0
    # The same conv in float costs more: the profile's int8 peak is twice its float32 one.
    float_conv = _node(HEADER + "g (float[1,8,6,6] x, float[8,8,3,3] w) => (float[1,8,6,6] y) "
                       "{ y = Conv <pads = [1,1,1,1]> (x, w) }")
    assert op_class(float_conv) == "conv"
    c, c8 = cost.constants["conv"], cost.constants["conv_int8"]
    assert c8.peak_gflops == pytest.approx(2 * c.peak_gflops)
    assert cost.node_seconds(conv) < cost.node_seconds(float_conv)


def test_a_conv_reading_a_float_tensor_stays_float():
    # Only the weight is dequantized (a layer the INT8 pass skipped keeps a float input): no
    # QLinearConv, so the float class, and the DequantizeLinear runs as its own kernel.
    nodes = _nodes(HEADER + """g (float[1,8,6,6] x, int8[8,8,3,3] wq, float ws)
                                 => (float[1,8,6,6] y) {
        w = DequantizeLinear(wq, ws)
        y = Conv <pads = [1,1,1,1]> (x, w)
    }""")
    assert op_class(nodes["Conv"]) == "conv"
    assert node_work(nodes["DequantizeLinear"])[1] > 0


def test_integer_ops_take_the_int8_classes():
    node = _node(HEADER + "g (uint8[4,8] a, int8[8,5] b) => (int32[4,5] y) "
                 "{ y = MatMulInteger(a, b) }")
    assert op_class(node) == "gemm_int8"
    assert node_work(node) == (2 * 20 * 8, 32 + 40 + 4 * 20)
    node = _node(HEADER + """g (uint8[4,8] a, float sa, uint8 za, int8[8,5] b, float sb, int8 zb,
                             float sy, uint8 zy) => (uint8[4,5] y)
                             { y = QLinearMatMul(a, sa, za, b, sb, zb, sy, zy) }""")
    assert op_class(node) == "gemm_int8"
    assert node_work(node)[0] == 2 * 20 * 8  # K read from b, the fourth input


def test_defaults_are_the_cpu_profile_figures():
    c = CpuCostModel().constants["gemm"]
    assert (c.peak_gflops, c.bandwidth_gbs, c.overhead_us) == pytest.approx((160, 20, 1))
    with pytest.raises(ValueError, match="unknown op class"):
        CpuCostModel({"matmul": c})


@pytest.mark.parametrize("op", ["MatMul", "Add", "Transpose", "Softmax"])
def test_time_grows_with_work(op, calibration):
    for model in (CpuCostModel(), calibration.cost_model()):
        times = []
        for n in (8, 64, 512):
            node = _node(HEADER + f"g (float[{n},{n}] a, float[{n},{n}] b) => (float[{n},{n}] y) "
                         "{ " + {"MatMul": "y = MatMul(a, b)", "Add": "y = Add(a, b)",
                                 "Transpose": "y = Transpose(a)",
                                 "Softmax": "y = Softmax(a)"}[op] + " }")
            times.append(model.node_seconds(node))
        assert times == sorted(times) and times[0] < times[-1], times


def test_model_seconds_sums_its_nodes():
    model = _graph(HEADER + "g (float[64,64] a, float[64,64] b) => (float[64,64] y) "
                   "{ h = MatMul(a, b) \n r = Relu(h) \n y = Add(r, a) }")
    cost = CpuCostModel()
    assert cost.model_seconds(model) == pytest.approx(sum(cost.node_seconds(n) for n in model.graph))
    longer = _graph(HEADER + "g (float[64,64] a, float[64,64] b) => (float[64,64] y) "
                    "{ h = MatMul(a, b) \n r = Relu(h) \n s = Add(r, a) \n y = Relu(s) }")
    assert cost.model_seconds(longer) > cost.model_seconds(model)


# --- calibration ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calibration() -> CalibrationResult:
    return calibrate(threads=1, seconds_budget=0.3, quick=True)


def test_calibration_yields_positive_finite_constants(calibration):
    assert set(calibration.constants) == set(OP_CLASSES)
    for c in calibration.constants.values():
        for v in (c.peak_gflops, c.bandwidth_gbs, c.overhead_us):
            assert math.isfinite(v) and v > 0
    assert calibration.run_overhead_us >= 0
    assert calibration.onnxruntime_version == ort.__version__
    assert calibration.threads == 1 and calibration.quick
    assert {m.name.split()[0] for m in calibration.measurements} >= {"MatMul", "Conv", "Add"}
    assert {m.name for m in calibration.measurements} >= {
        "QDQ MatMul 256x512x512", "QDQ Conv 3x3 32->32 28x28"}


def test_calibration_round_trips_through_json(calibration, tmp_path):
    path = calibration.save(tmp_path / "calib.json")
    loaded = CalibrationResult.load(path)
    assert loaded.constants == calibration.constants
    assert loaded.to_json() == calibration.to_json()


def test_default_path_is_the_user_cache(calibration, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = calibration.save()
    assert path == os.path.join(tmp_path, "graphopt", "calibration-cpu.json")
    assert CalibrationResult.load().constants == calibration.constants


def test_other_onnxruntime_version_warns(calibration, tmp_path):
    doc = calibration.to_json()
    doc["onnxruntime_version"] = "0.0.1"
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    with pytest.warns(StaleCalibrationWarning, match=r"onnxruntime 0\.0\.1.*graphopt calibrate"):
        loaded = CalibrationResult.load(path)
    assert loaded.constants == calibration.constants  # still usable: the best figures at hand


def test_broken_calibration_is_an_option_error(calibration, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format_version": 1}))
    with pytest.raises(OptionError, match="missing key 'constants'.*graphopt calibrate"):
        CalibrationResult.load(path)
    path.write_text(json.dumps({**calibration.to_json(), "format_version": 9}))
    with pytest.raises(OptionError, match="format_version 9"):
        CalibrationResult.load(path)
    path.write_text(json.dumps({**calibration.to_json(), "constants": {"gemm16": {}}}))
    with pytest.raises(OptionError, match="unknown op class 'gemm16'"):
        CalibrationResult.load(path)
    with pytest.raises(OptionError, match="cannot read"):
        CalibrationResult.load(tmp_path / "missing.json")
    # Malformed fields are named, not left to Python's words for them ('list' object has no
    # attribute 'get', Measurement() argument after ** must be a mapping).
    for edit, message in ((lambda d: [], r"\(a list, not an object\)"),
                          (lambda d: {**d, "measurements": ["x"]},
                           r"\(measurements\[0\]: a string, not an object\)"),
                          (lambda d: {**d, "constants": {"gemm": {**d["constants"]["gemm"],
                                                                  "peak_gflops": None}}},
                           r"\(constants.gemm.peak_gflops: null, not a number\)"),
                          (lambda d: {**d, "threads": "x"}, r"\(threads: a string 'x', not a "
                                                            r"number\)"),
                          # an internal error (OverflowError) each
                          (lambda d: {**d, "threads": float("inf")},
                           r"\(threads: not a finite number\)"),
                          (lambda d: {**d, "run_overhead_us": 10 ** 400},
                           r"\(run_overhead_us: not a finite number\)")):
        path.write_text(json.dumps(edit(calibration.to_json())))
        with pytest.raises(OptionError, match=message):
            CalibrationResult.load(path)
    # A rate of 0 would price a side of the roofline at nothing: refused like a negative one.
    for key, value, message in (("peak_gflops", 0, "must be above 0"),
                                ("bandwidth_gbs", 0, "must be above 0"),
                                ("overhead_us", -1, "finite and ≥ 0")):
        doc = calibration.to_json()
        doc["constants"]["gemm"][key] = value
        path.write_text(json.dumps(doc))
        with pytest.raises(OptionError, match=f"constants.gemm: .*{message}"):
            CalibrationResult.load(path)
    # These loaded, and a profile then said it priced with a calibration it did not use.
    for key, value, message in (("run_overhead_us", float("nan"), "run_overhead_us: not a finite number"),
                                ("run_overhead_us", -100, "run_overhead_us must be"),
                                ("threads", 0, "threads must be at least 1"),
                                ("target", "ascend310", "target 'ascend310', not cpu"),
                                ("constants", {}, "no op class constants")):
        path.write_text(json.dumps({**calibration.to_json(), key: value}))
        with pytest.raises(OptionError, match=f"not a graphopt CPU calibration \\({message}"):
            CalibrationResult.load(path)


def test_an_npz_given_as_the_cost_models_calibration_says_inputs_go_in_inputs(tmp_path):
    # profile's --calibration is the cost model's fit, optimize's the model's data: an .npz
    # meant as inputs was told to re-run `graphopt calibrate`.
    import numpy as np

    np.savez(tmp_path / "c.npz", x=np.zeros(3))
    with pytest.raises(OptionError, match=r"not valid JSON \(not UTF-8 text\) \(an \.npz: the "
                                          r"model's inputs go in --inputs"):
        CalibrationResult.load(tmp_path / "c.npz")


def test_a_calibration_without_int8_classes_derives_them(calibration, tmp_path):
    # Files written before the int8 classes existed: their float peaks at the profile's ratio.
    doc = calibration.to_json()
    for cls in ("gemm_int8", "conv_int8"):
        del doc["constants"][cls]
    path = tmp_path / "older.json"
    path.write_text(json.dumps(doc))
    loaded = CalibrationResult.load(path)
    assert set(loaded.constants) == set(OP_CLASSES)
    for int8, float_class in (("gemm_int8", "gemm"), ("conv_int8", "conv")):
        assert loaded.constants[int8].peak_gflops == pytest.approx(
            2 * calibration.constants[float_class].peak_gflops)
        assert loaded.constants[int8].bandwidth_gbs == calibration.constants[float_class].bandwidth_gbs


def test_calibrated_model_uses_the_calibration(calibration):
    model = calibration.cost_model()
    assert model.constants == calibration.constants
    assert CpuCostModel({"gemm": ClassConstants(1, 1, 0)}).constants["gemm"].peak_gflops == 1


# --- the CLI -------------------------------------------------------------------------------


def cli(capsys, *argv) -> tuple[int, str, str]:
    return run_cli(capsys, *argv)


def test_cli_calibrates_and_writes_json(capsys, tmp_path):
    out_path = tmp_path / "tmp.json"
    rc, out, err = cli(capsys, "calibrate", "--target", "cpu", "--quick", "-o", out_path)
    assert rc == 0, err
    for key in ("overhead-1", "gemm", "conv", "gemm_int8", "conv_int8", "elementwise", "softmax",
                "transpose"):
        assert key in err  # one progress line per benchmark
    for cls in OP_CLASSES:
        assert cls in out
    assert f"wrote {out_path}" in out
    assert set(CalibrationResult.load(out_path).constants) == set(OP_CLASSES)


def test_cli_refuses_an_npu_target(capsys, tmp_path):
    rc, _out, err = cli(capsys, "calibrate", "--target", "ascend310", "-o", tmp_path / "x.json")
    assert rc == 1 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("graphopt: error: --target ascend310: only the cpu target")
    assert "no NPU device" in line
    assert not (tmp_path / "x.json").exists()


# --- Spearman ------------------------------------------------------------------------------


def test_ranks_share_ties():
    assert ranks([10, 30, 20, 30]).tolist() == [1, 3.5, 2, 3.5]


def test_spearman_hand_computed():
    # ranks of y: 1, 2, 3.5, 5, 3.5; deviations from 3 against -2..2:
    # Σdxdy = 4 + 1 + 0 + 2 + 1 = 8, Σdx² = 10, Σdy² = 9.5 → ρ = 8 / √95
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))
    assert spearman([1, 2, 3], [10, 200, 3000]) == pytest.approx(1)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert math.isnan(spearman([1, 2, 3], [4, 4, 4]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_the_cpu_target_estimates_with_this_machines_calibration(calibration, tmp_path,
                                                                 monkeypatch):
    # Subgraph tuning's estimates on --target cpu read the calibration, when there is one, as
    # `graphopt profile` does; an NPU board's host keeps its profile's figures.
    from graphopt.partition import load_target
    from graphopt.tuner.cpu_model import host_cost_model

    cpu = load_target("cpu")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert host_cost_model(cpu, cpu.device("cpu")).constants == default_constants(cpu.device("cpu"))
    calibration.save()
    assert host_cost_model(cpu, cpu.device("cpu")).constants == calibration.constants
    board = load_target("ascend310")
    assert host_cost_model(board, board.device("cpu")).constants == \
        default_constants(board.device("cpu"))
    with open(os.path.join(tmp_path, "graphopt", "calibration-cpu.json"), "w") as f:
        f.write("{broken")  # a damaged file: the profile's figures, not a failed compile
    assert host_cost_model(cpu, cpu.device("cpu")).constants == default_constants(cpu.device("cpu"))


def test_subgraph_tuning_says_when_its_cpu_figures_are_not_this_machines(calibration, tmp_path,
                                                                          monkeypatch, capsys):
    # A calibration from another onnxruntime priced every trial without a word (the warning was
    # silenced), and a new calibration stopped the study's resumption with an error blaming
    # op tuning, which the cpu target has none of.
    from helpers import parse_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = tmp_path / "m.onnx"
    onnx.save(parse_model("g (float[1,64] x) => (float[1,64] y) { r = Relu(x) y = Sigmoid(r) }"),
              model)
    tune = ["tune", model, "--target", "cpu", "--job", "subgraph", "--trials", "1", "-q",
            "--tuning-db", tmp_path / "kb.db"]
    doc = calibration.to_json()
    doc["onnxruntime_version"] = "0.0.1"
    path = calibration.save()
    with open(path, "w") as f:
        json.dump(doc, f)
    rc, out, err = run_cli(capsys, *tune)
    assert rc == 0 and f"note: calibration {path} was measured with onnxruntime 0.0.1" in out, err
    calibration.save()  # calibrated again: the study's default is priced otherwise now
    with open(path) as f:
        doc = json.load(f)
    doc["constants"]["elementwise"]["overhead_us"] *= 2
    with open(path, "w") as f:
        json.dump(doc, f)
    rc, out, err = run_cli(capsys, *tune)
    assert rc == 1 and "the CPU cost model now at" in err and "graphopt calibrate --target " \
        "cpu since?" in err and "op tuning" not in err, err
    with open(path, "w") as f:
        f.write("{broken")
    rc, out, err = run_cli(capsys, *tune[:-2], "--tuning-db", tmp_path / "other.db")
    assert rc == 0 and "note: the cpu profile's figures price the host, not the calibration: " \
        f"calibration {path}: not valid JSON" in out, err


def test_a_requantized_qdq_add_is_priced_as_qlinearadd():
    nodes = _nodes(HEADER + """g (uint8[1,8] aq, uint8[1,8] bq, float s, uint8 z) => (uint8[1,8] yq) {
        a = DequantizeLinear(aq, s, z)
        b = DequantizeLinear(bq, s, z)
        y = Add(a, b)
        yq = QuantizeLinear(y, s, z)
    }""")
    assert node_work(nodes["Add"]) == (8, 8 + 8 + 8)  # uint8 in, uint8 out
    assert node_work(nodes["QuantizeLinear"]) == (0, 0)
    # Without the QuantizeLinear after it, onnxruntime runs a float Add between DequantizeLinears.
    plain = _nodes(HEADER + """g (uint8[1,8] aq, uint8[1,8] bq, float s, uint8 z) => (float[1,8] y) {
        a = DequantizeLinear(aq, s, z)
        b = DequantizeLinear(bq, s, z)
        y = Add(a, b)
    }""")
    assert node_work(plain["Add"]) == (8, 4 * 24)
    assert node_work(plain["DequantizeLinear"])[1] > 0
