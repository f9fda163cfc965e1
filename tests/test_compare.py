"""graphopt compare / graphopt.tools.compare: outputs and intermediates judged against a reference."""

from __future__ import annotations

import csv
import json

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, parse_model, run_cli
from onnx import numpy_helper

from graphopt.compile_save import save
from graphopt.compiler import optimize
from graphopt.errors import InputError, OptionError
from graphopt.tools.compare import compare_arrays, compare_models
from graphopt.tools.compare_format import format_report

# Relu -> Mul(scale) -> Add(bias) -> Softmax: an output that is a distribution, and named nodes.
MODEL = """
agraph (float[2,8] x) => (float[2,8] probs) {
  [relu] act = Relu(x)
  [scale] scaled = Mul(act, w)
  [shift] shifted = Add(scaled, bias)
  [softmax] probs = Softmax <axis = -1> (shifted)
}
"""
W = np.linspace(0.5, 1.5, 8, dtype=np.float32)
BIAS = np.linspace(-1, 1, 8, dtype=np.float32)


def _model(w=W) -> onnx.ModelProto:
    return parse_model(MODEL, w=w, bias=BIAS)


@pytest.fixture
def files(tmp_path):
    """reference.onnx, its -O2 optimization, an .om of it, and a copy with the Mul weight perturbed."""
    paths = {name: tmp_path / name for name in ("ref.onnx", "opt.onnx", "model.om", "bad.onnx")}
    onnx.save(_model(), paths["ref.onnx"])
    save(optimize(str(paths["ref.onnx"])), str(paths["opt.onnx"]))
    save(optimize(str(paths["ref.onnx"]), target="cpu"), str(paths["model.om"]))
    onnx.save(_model(W + 0.05), paths["bad.onnx"])
    return paths


def test_optimized_model_passes_with_every_metric(files, capsys):
    rc, out, err = run_cli(capsys, "compare", files["ref.onnx"], files["opt.onnx"])
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.startswith("probs"))
    cells = row.split()
    assert cells[1] == "f32[2,8]" and cells[-1] == "pass"
    assert float(cells[2]) > 0.999999  # cosine
    assert all(c != "—" for c in cells[2:9])  # a softmax output gets a KL value too
    assert "result: PASS" in out
    # The header says how each side ran.
    assert f"candidate: {files['opt.onnx']} (onnxruntime, optimizations disabled)\n" in out
    rc, out, err = run_cli(capsys, "compare", files["ref.onnx"], files["model.om"], "--json")
    assert json.loads(out)["candidate_run"] == "graphopt's .om runtime", err


def test_models_as_bytes_are_taken_and_other_types_named_in_one_line(files):
    # Bytes had been taken for a path: an InputError holding the model's whole repr (7.9 MB
    # for BERT) or a raw TypeError; None and a loaded OmSession raised TypeErrors.
    from graphopt import load

    data = files["ref.onnx"].read_bytes()
    assert compare_models(data, files["model.om"]).passed
    assert compare_models(files["ref.onnx"], data).passed
    for reference, candidate, message in (
            (None, files["model.om"], "^reference: expected an .onnx path, a ModelProto or its "
                                      "bytes, not NoneType$"),
            (files["ref.onnx"], load(files["model.om"]),
             "^candidate: expected .* not OmSession$"),
            (files["ref.onnx"], 3, "^candidate: .* not int$")):
        with pytest.raises(OptionError, match=message):
            compare_models(reference, candidate)
    with pytest.raises(InputError, match=r"^reference: the 9 bytes given are not an ONNX model "
                                         r"\([^\n]+\)$"):
        compare_models(b"\xff garbage", files["model.om"])
    # b"" and stray bytes parse into an empty ModelProto, which onnxruntime then blamed.
    for junk in (b"", b"\x08\x01"):
        with pytest.raises(InputError, match=r"^reference: the \d bytes given are not an ONNX "
                                             r"model"):
            compare_models(junk, files["model.om"])
    with pytest.raises(OptionError, match="^reference: expected .*, got an empty path$"):
        compare_models("", files["model.om"])
    with pytest.raises(OptionError, match=r"^feeds: expected a dict of input arrays or an "
                                          r"\.npz path, got \[1\]$"):
        compare_models(files["ref.onnx"], files["model.om"], [1])


@pytest.mark.parametrize("keywords, message", [
    # numpy's TypeError had come through, and a negative seed blamed the reference model
    ({"seed": "1"}, r"^seed: expected an integer ≥ 0, got '1'$"),
    ({"seed": 1.5}, r"^seed: expected an integer ≥ 0, got 1\.5$"),
    ({"seed": -1}, r"^seed: expected an integer ≥ 0, got -1$"),
    # an AttributeError ('list' object has no attribute 'items') had come through
    ({"input_shapes": [1, 4]}, r"^input_shapes: expected a dict, got \[1, 4\]$"),
])
def test_seed_and_input_shapes_of_the_wrong_kind_are_named(files, keywords, message):
    with pytest.raises(OptionError, match=message):
        compare_models(files["ref.onnx"], files["model.om"], **keywords)
    assert compare_models(files["ref.onnx"], files["model.om"], seed=np.int64(3)).passed


def test_perturbed_copy_fails_and_names_the_perturbed_node(files, capsys):
    rc, out, _ = run_cli(capsys, "compare", files["ref.onnx"], files["bad.onnx"], "--per-tensor")
    assert rc == 1
    assert "result: FAIL (probs)" in out
    assert "first failure in graph order: scaled (Mul 'scale')" in out
    report = compare_models(files["ref.onnx"], files["bad.onnx"], per_tensor=True)
    assert [(r.name, r.passed) for r in report.rows] == [
        ("probs", False), ("act", True), ("scaled", False), ("shifted", False)]
    assert report.first_failing_intermediate.name == "scaled"
    assert not report.passed


def test_samples_report_over_every_sample_and_name_those_the_rule_fails_on(tmp_path, capsys):
    # A held-out set: the accuracy report over all samples, and the samples compare's rule
    # fails on. The candidate differs only where x is positive in the first column.
    ref = parse_model("agraph (float[1,4] x) => (float[1,4] y) { y = Relu(x) }")
    cand = parse_model("agraph (float[1,4] x) => (float[1,4] y) { r = Relu(x)\n y = Mul(r, k) }",
                       k=np.array([1.5, 1, 1, 1], np.float32))
    onnx.save(ref, tmp_path / "r.onnx")
    onnx.save(cand, tmp_path / "c.onnx")
    x = np.ones((5, 1, 4), np.float32)
    x[[0, 2, 4], 0, 0] = -1.0  # samples 2 and 4 have a positive first column
    np.savez(tmp_path / "held.npz", x=x)
    rc, out, _ = run_cli(capsys, "compare", tmp_path / "r.onnx", tmp_path / "c.onnx",
                         "--samples", tmp_path / "held.npz")
    assert rc == 1
    assert "samples 1-5 of 5" in out
    assert out.rstrip().endswith("fails allclose(rtol=0.0001, atol=1e-05) on 2 of 5 sample(s): "
                                 "2 ('y'), 4 ('y')"), out
    rc, out, _ = run_cli(capsys, "compare", tmp_path / "r.onnx", tmp_path / "r.onnx",
                         "--samples", tmp_path / "held.npz")
    assert rc == 0 and out.rstrip().endswith(
        "passes allclose(rtol=0.0001, atol=1e-05) on all 5 sample(s)"), out
    rc, _, err = run_cli(capsys, "compare", tmp_path / "r.onnx", tmp_path / "c.onnx",
                         "--samples", tmp_path / "held.npz", "--json")
    assert rc == 2 and "--json applies to a comparison on one input" in err
    # Data that does not fit is named by the flag that gave it (it read --calibration).
    np.savez(tmp_path / "wrong.npz", z=x)
    rc, _, err = run_cli(capsys, "compare", tmp_path / "r.onnx", tmp_path / "c.onnx",
                         "--samples", tmp_path / "wrong.npz")
    assert rc == 2 and err.startswith(f"graphopt: error: --samples {tmp_path / 'wrong.npz'}: "
                                      "no array for model input 'x'"), err


def test_a_failing_intermediate_alone_does_not_fail_the_exit_status(tmp_path, capsys):
    # The candidate's intermediate `t` differs, but Relu makes both outputs 0 on negative inputs.
    ref = parse_model("agraph (float[4] x) => (float[4] y) { t = Neg(x)\n y = Relu(t) }")
    cand = parse_model("agraph (float[4] x) => (float[4] y) { t = Mul(x, k)\n y = Relu(t) }",
                       k=np.full(4, -2, np.float32))
    onnx.save(ref, tmp_path / "r.onnx")
    onnx.save(cand, tmp_path / "c.onnx")
    np.savez(tmp_path / "x.npz", x=np.array([1, 2, 3, 4], np.float32))
    rc, out, _ = run_cli(capsys, "compare", tmp_path / "r.onnx", tmp_path / "c.onnx",
                         "--per-tensor", "--inputs", tmp_path / "x.npz")
    assert rc == 0
    assert "intermediates: 0/1 pass; first failure in graph order: t (Mul)" in out
    assert "result: PASS" in out


def test_om_candidate_per_tensor(files, capsys):
    report = compare_models(files["ref.onnx"], files["model.om"], per_tensor=True, seed=3)
    assert report.passed and report.candidate == str(files["model.om"])
    assert report.inputs == "seeded random (seed 3)"
    inner = report.intermediates
    assert inner and all(r.passed and r.partition for r in inner)
    assert report.outputs[0].kl is not None and report.outputs[0].kl < 1e-6
    rc, out, _ = run_cli(capsys, "compare", files["ref.onnx"], files["model.om"], "--per-tensor")
    assert rc == 0 and "intermediates (the candidate's graph order)" in out


def test_intermediates_without_a_counterpart_are_counted(tmp_path):
    # The candidate computes `scaled` under another name: it and what follows it from there
    # cannot be paired, and the note says how many the reference had that were not compared.
    cand = parse_model("""
agraph (float[2,8] x) => (float[2,8] probs) {
  [relu] act = Relu(x)
  [scale] renamed = Mul(act, w)
  [shift] shifted = Add(renamed, bias)
  [softmax] probs = Softmax <axis = -1> (shifted)
}
""", w=W + 0.05, bias=BIAS)
    onnx.save(_model(), tmp_path / "ref.onnx")
    onnx.save(cand, tmp_path / "cand.onnx")
    report = compare_models(tmp_path / "ref.onnx", tmp_path / "cand.onnx", per_tensor=True)
    assert [r.name for r in report.intermediates] == ["act", "shifted"]
    assert report.first_failing_intermediate.name == "shifted"  # downstream of the real one
    (note,) = [n for n in report.notes if "intermediates of" in n]
    assert note.startswith("1 of the 3 intermediates of ") and "not compared; the first " \
        "failing one compared may lie downstream" in note
    same = compare_models(tmp_path / "ref.onnx", tmp_path / "ref.onnx", per_tensor=True)
    assert not [n for n in same.notes if "intermediates of" in n]
    # Models given in memory get their intermediates as outputs for the run only.
    before = [cand.SerializeToString(deterministic=True), _model()]
    given = compare_models(before[1], cand, per_tensor=True)
    assert [r.name for r in given.intermediates] == ["act", "shifted"]
    assert cand.SerializeToString(deterministic=True) == before[0]
    assert [o.name for o in before[1].graph.output] == ["probs"]


def test_om_candidate_intermediates_fail_where_the_weights_changed(files, tmp_path):
    save(optimize(str(files["bad.onnx"]), level=0, target="cpu"), str(tmp_path / "bad.om"))
    report = compare_models(files["ref.onnx"], tmp_path / "bad.om", per_tensor=True)
    assert not report.passed
    assert report.first_failing_intermediate.name == "scaled"


def test_npu_om_runs_on_the_cpu_stand_in_with_a_note(files, tmp_path):
    save(optimize(str(files["ref.onnx"]), target="ascend310"), str(tmp_path / "npu.om"))
    report = compare_models(files["ref.onnx"], tmp_path / "npu.om", per_tensor=True)
    assert report.passed and report.intermediates
    assert any("run on the CPU provider as a functional stand-in" in n for n in report.notes)


def test_intermediates_are_computed_as_the_om_session_computes_them(tmp_path):
    # The .om runs this MatMul's partition with its weights unpacked (nothing gains from
    # packing), which rounds differently from a packed session: y, which z = Relu(y) reads,
    # must carry at least z's error, not pass exactly beside a failing output.
    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    proto = parse_model("""
        g (float[1,64] x) => (float[1,64] z) {
            y = MatMul (x, w)
            z = Relu (y)
        }""", w=w)
    path = tmp_path / "mm.om"
    save(optimize(proto), path)
    report = compare_models(proto, path, per_tensor=True, rtol=0, atol=0)
    rows = {row.name: row for row in report.rows}
    assert rows["y"].max_abs >= rows["z"].max_abs


def test_om_profiles_compare_the_intermediates_of_the_profile_the_feeds_run(tmp_path):
    # A crop to 8x8 is a no-op, removed, at 8x8 and a Slice at 12x12: only profile1 has it.
    rng = np.random.default_rng(4)
    proto = parse_model("""
        g (float[1,3,H,W] x) => (float[1,4] y) {
            c = Conv <pads = [1,1,1,1]> (x, w)
            r = Relu (c)
            crop = Slice (r, starts, ends, axes)
            p = GlobalAveragePool (crop)
            y = Flatten (p)
        }""", w=rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        starts=np.array([0, 0]), ends=np.array([8, 8]), axes=np.array([2, 3]))
    path = tmp_path / "crop.om"
    save(optimize(proto, dynamic_dims="H=8,W=8;H=12,W=12"), path)
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    report = compare_models(proto, path, {"x": x}, per_tensor=True)
    rows = {row.name: row for row in report.rows if row.role == "intermediate"}
    assert "crop" in rows and rows["crop"].partition.startswith("profile1.")
    assert all(row.passed for row in report.rows)


def test_csv_holds_the_same_rows_at_full_precision(files, tmp_path, capsys):
    out_csv = tmp_path / "report.csv"
    rc, out, _ = run_cli(capsys, "compare", files["ref.onnx"], files["bad.onnx"], "--per-tensor",
                         "--csv", out_csv)
    assert rc == 1 and f"wrote {out_csv}" in out
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["role"], r["tensor"], r["result"]) for r in rows] == [
        ("output", "probs", "FAIL"), ("intermediate", "act", "pass"),
        ("intermediate", "scaled", "FAIL"), ("intermediate", "shifted", "FAIL")]
    scaled = rows[2]
    assert scaled["producer"] == "Mul 'scale'" and scaled["shape"] == "2x8"
    # Mul by w+0.05 instead of w: the error is exactly 0.05·act, so max abs = 0.05·max(act).
    report = compare_models(files["ref.onnx"], files["bad.onnx"], per_tensor=True)
    assert float(scaled["max_abs"]) == report.rows[2].max_abs
    assert rows[1]["kl"] == "" and float(rows[0]["kl"]) > 0  # KL only for the softmax output
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left


def test_json_output(files, capsys):
    rc, out, _ = run_cli(capsys, "compare", files["ref.onnx"], files["bad.onnx"], "--json",
                         "--per-tensor")
    data = json.loads(out)
    assert rc == 1 and data["passed"] is False
    assert data["first_failing_intermediate"] == "scaled"
    assert data["rows"][0]["name"] == "probs" and data["rows"][0]["shape"] == [2, 8]


def test_min_cosine_rule_replaces_allclose(files, capsys):
    report = compare_models(files["ref.onnx"], files["bad.onnx"], min_cosine=0.99)
    (row,) = report.rows
    assert report.passed and row.mismatches > 0  # beyond rtol/atol, but close in direction
    assert report.rule == "cosine >= 0.99, norm within ±14.2%"
    # The count of elements outside rtol/atol is shown but is not called a mismatch there.
    text = format_report(report)
    assert "beyond tol" in text.splitlines()[6] and "mismatch" not in text
    assert "note: beyond tol: the elements outside rtol=0.0001, atol=1e-05" in text
    assert "mismatch" in format_report(compare_models(files["ref.onnx"], files["bad.onnx"]))
    assert not compare_models(files["ref.onnx"], files["bad.onnx"], min_cosine=0.999999).passed
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["bad.onnx"],
                         "--min-cosine", "0.9", "--atol", "1")
    assert rc == 2 and "--min-cosine replaces the --rtol/--atol rule" in err
    with pytest.raises(OptionError, match="^min_cosine must be between -1 and 1"):
        compare_models(files["ref.onnx"], files["bad.onnx"], min_cosine=2)


def test_a_threshold_reads_as_given_and_a_failing_cosine_below_it(files):
    # :g printed 0.9999999 as 1 and .6f a failing cosine as 1.000000: a FAIL nobody could read.
    cosine = compare_models(files["ref.onnx"], files["bad.onnx"]).rows[0].cosine
    threshold = cosine + 1e-12  # a hair above: 6 decimals read the same for both
    assert f"{cosine:.6f}" == f"{threshold:.6f}"
    report = compare_models(files["ref.onnx"], files["bad.onnx"], min_cosine=threshold)
    assert not report.passed and report.rule.startswith(f"cosine >= {threshold!r}, norm within ±")
    row = format_report(report).splitlines()[8].split()
    assert row[-1] == "FAIL" and float(row[2]) < threshold, row
    assert compare_models(files["ref.onnx"], files["ref.onnx"], min_cosine=1.0).rule == \
        "cosine >= 1"
    assert compare_models(files["ref.onnx"], files["ref.onnx"], rtol=1.5e-7,
                          atol=0.00012345678).rule == "allclose(rtol=1.5e-07, atol=0.00012345678)"


def test_an_all_zero_reference_is_judged_by_tolerance_under_a_cosine_rule():
    # Its cosine against zeros + 1e-6 is 0: the row failed any --min-cosine with no word why.
    zero = np.zeros((2, 4), np.float32)
    row = compare_arrays("z", zero, zero + 1e-6, min_cosine=0.99)
    assert row.passed and row.cosine == 0.0
    assert "the reference is all zeros, where a cosine measures nothing" in row.note
    assert not compare_arrays("z", zero, zero + 1.0, min_cosine=0.99).passed


def test_intermediates_off_by_rounding_pass_as_the_outputs_do(tmp_path):
    # NCHWc convs sum in onnxruntime's order: the outputs passed as rounding, and --per-tensor
    # named the first conv "first failure in graph order" (0/2 intermediates passed).
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[1,16,32,32] x) => (float[1,16,32,32] y) {
            c = Conv <pads = [1,1,1,1]> (x, w1)
            s = Softmax <axis = 1> (c)
            y = Conv <pads = [1,1,1,1]> (s, w2)
        }""", w1=rng.standard_normal((16, 16, 3, 3)).astype(np.float32),
        w2=rng.standard_normal((16, 16, 3, 3)).astype(np.float32))
    save(optimize(proto, target="cpu"), str(tmp_path / "m.om"))
    feeds = {"x": (rng.standard_normal((1, 16, 32, 32)) * 100).astype(np.float32)}
    report = compare_models(proto, str(tmp_path / "m.om"), feeds, per_tensor=True)
    assert [(r.name, r.passed, r.note) for r in report.intermediates] == \
        [("c", True, "rounding"), ("s", True, "rounding")]
    assert report.first_failing_intermediate is None and report.outputs[0].mismatches
    # Without the allowance (tolerances given on the command line), as at the outputs.
    strict = compare_models(proto, str(tmp_path / "m.om"), feeds, per_tensor=True,
                            rounding=False)
    assert strict.first_failing_intermediate.name == "c"


def test_api_takes_protos_and_feed_dicts():
    x = np.array([[1.0, -1.0] * 4, [0.5] * 8], np.float32)
    report = compare_models(_model(), _model(W + 0.05), {"x": x}, per_tensor=True)
    assert report.reference == "<reference>" and report.inputs == "feeds"
    assert [r.name for r in report.rows if not r.passed] == ["probs", "scaled", "shifted"]
    # Mul by w + 0.05 instead of w: scaled differs by exactly 0.05·relu(x).
    assert report.rows[2].max_abs == pytest.approx(0.05, rel=1e-6)


def test_loose_tolerances_pass_the_perturbed_copy(files, capsys):
    rc, _, _ = run_cli(capsys, "compare", files["ref.onnx"], files["bad.onnx"], "--atol", "0.1")
    assert rc == 0


# --- single tensors: the edge cases -------------------------------------------------------


def test_shape_and_dtype_mismatches_fail_with_a_note():
    row = compare_arrays("y", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert not row.passed and row.note == "shape [3,2] vs reference [2,3]" and row.cosine is None
    row = compare_arrays("y", np.zeros(3, np.float32), np.zeros(3, np.int64))
    assert not row.passed and row.note == "dtype i64 vs reference f32"
    # Two float widths are compared on values (an f16 candidate against its f32 reference).
    ref = np.array([1.0, 2.0, 3.0], np.float32)
    row = compare_arrays("y", ref, ref.astype(np.float16), min_cosine=0.999)
    assert row.passed and row.note == "dtype f16 vs reference f32" and row.cosine == 1.0


def test_nan_and_inf_unlike_the_reference_fail_and_are_counted():
    ref = np.array([1.0, 2.0, np.nan, 4.0], np.float32)
    cand = np.array([1.0, np.inf, np.nan, 4.0], np.float32)
    row = compare_arrays("y", ref, cand)
    assert not row.passed
    assert row.note == ("reference has 1 NaN; candidate has 1 NaN and 1 Inf; 1 disagree, first "
                        "at [1]: reference 2.0, candidate inf")
    # The NaN both have counts as alike; the Inf against 2.0 does not.
    assert row.mismatches == 1 and row.max_abs == 0.0 and row.cosine == 1.0  # over [1, 4]


def test_nan_and_inf_alike_on_both_sides_pass():
    # A log of 0, a mask's -inf: reproduced exactly, as allclose(equal_nan=True) judges it.
    ref = np.array([1.0, -np.inf, np.nan, np.inf], np.float32)
    row = compare_arrays("y", ref, ref.copy())
    assert row.passed and row.mismatches == 0 and row.note == "3 NaN/Inf in both, alike"
    flipped = ref.copy()
    flipped[1] = np.inf  # the sign of an infinity matters
    row = compare_arrays("y", ref, flipped)
    assert not row.passed and row.mismatches == 1
    # Counts alone ("reference has 2 Inf; candidate has 2 Inf") read as agreement.
    assert row.note.endswith("1 disagree, first at [1]: reference -inf, candidate inf")


def test_a_lost_infinity_fails_at_the_default_tolerances(tmp_path, capsys):
    # The default tolerances' rounding allowance excused it: rtol·|inf| takes any value.
    def model(first):
        return parse_model("g (float[4] x) => (float[4] y) { y = Add (x, a) }",
                           a=np.array([first, 0, 0, 0], np.float32))

    for name, first in (("ref", np.inf), ("flipped", -np.inf), ("finite", 0.0)):
        onnx.save(model(first), tmp_path / f"{name}.onnx")
    for candidate in ("flipped", "finite"):
        rc, out, _ = run_cli(capsys, "compare", tmp_path / "ref.onnx",
                             tmp_path / f"{candidate}.onnx")
        assert rc == 1 and "result: FAIL (y)" in out and "rounding" not in out, out


def test_integer_and_bool_outputs_need_exact_equality():
    row = compare_arrays("idx", np.array([1, 2, 3]), np.array([1, 5, 3]))
    assert not row.passed and row.mismatches == 1 and row.max_abs == 3.0 and row.cosine is None
    assert compare_arrays("idx", np.array([7]), np.array([7]), atol=100).passed
    row = compare_arrays("m", np.array([True, False]), np.array([True, True]))
    assert not row.passed and row.mismatches == 1 and row.max_abs is None


def test_zero_and_empty_tensors():
    row = compare_arrays("z", np.zeros(4, np.float32), np.zeros(4, np.float32))
    assert row.passed and row.cosine == 1.0 and row.max_rel is None
    row = compare_arrays("z", np.zeros(4, np.float32), np.full(4, 1e-3, np.float32))
    assert not row.passed and row.cosine == 0.0
    row = compare_arrays("e", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    assert row.passed and row.cosine is None and row.mismatches == 0


def test_table_shows_a_dash_where_a_metric_is_not_meaningful(tmp_path, capsys):
    model = parse_model("agraph (float[2,3] x) => (int64[2] i) { i = ArgMax <axis = 1, keepdims = 0> (x) }")
    onnx.save(model, tmp_path / "m.onnx")
    rc, out, _ = run_cli(capsys, "compare", tmp_path / "m.onnx", tmp_path / "m.onnx")
    row = next(line for line in out.splitlines() if line.startswith("i "))
    assert rc == 0 and row.split() == ["i", "i64[2]", "—", "0", "0", "—", "—", "—", "—", "0", "pass"]


# --- errors -------------------------------------------------------------------------------


def test_missing_files_are_named(files, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "compare", tmp_path / "nope.onnx", files["opt.onnx"])
    assert rc == 2 and f"{tmp_path / 'nope.onnx'}: no such file" in err
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], tmp_path / "nope.om")
    assert rc == 2 and f"{tmp_path / 'nope.om'}: no such file" in err
    # Which of the three files: the feeds' file is named by its option.
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["opt.onnx"], "--inputs",
                         tmp_path / "nope.npz")
    assert rc == 2 and f"--inputs {tmp_path / 'nope.npz'}: no such file" in err
    with pytest.raises(InputError, match=r"^feeds \S*nope.npz: no such file"):
        compare_models(files["ref.onnx"], files["opt.onnx"], feeds=tmp_path / "nope.npz")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(InputError, match="junk.onnx"):
        compare_models(files["ref.onnx"], tmp_path / "junk.onnx")
    with pytest.raises(InputError, match="the reference must be an .onnx model"):
        compare_models(files["model.om"], files["ref.onnx"])
    # The reference is an .onnx only: a bad one is not called "neither an .om nor …".
    with pytest.raises(InputError, match=r"junk.onnx: not a valid ONNX model \("):
        compare_models(tmp_path / "junk.onnx", files["ref.onnx"])


def test_a_model_without_outputs_is_refused_on_either_side(files, tmp_path, capsys):
    # As the reference it had passed: the candidate's output was met among its intermediates.
    proto = _model()
    del proto.graph.output[:]
    none = tmp_path / "none.onnx"
    onnx.save(proto, none)
    for reference, candidate in ((none, files["opt.onnx"]), (files["ref.onnx"], none)):
        rc, out, err = run_cli(capsys, "compare", reference, candidate)
        assert rc == 2 and not out, out
        assert f"error: {none}: graph 'agraph' has no outputs (nothing to compute)" in err, err
    with pytest.raises(InputError, match="^<reference>: graph 'agraph' has no outputs"):
        compare_models(proto, files["opt.onnx"])


def test_npz_lacking_an_input(files, tmp_path, capsys):
    np.savez(tmp_path / "x.npz", other=np.zeros((2, 8), np.float32))
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["model.om"],
                         "--inputs", tmp_path / "x.npz")
    assert rc == 2 and f"{tmp_path / 'x.npz'}: unknown input 'other'" in err
    # An .om given for the .npz had said "model.om: unknown input 'manifest.json' … (for
    # ref.onnx)", naming neither --inputs nor what the file is.
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["model.om"],
                         "--inputs", files["model.om"])
    assert rc == 2 and f"--inputs {files['model.om']}: not an .npz archive of named arrays " \
                       "(it is a graphopt .om artifact; " in err, err
    with pytest.raises(InputError, match="feeds: missing input 'x'"):
        compare_models(files["ref.onnx"], files["opt.onnx"], feeds={})
    with pytest.raises(InputError, match=r"input 'x' has shape \[2, 4\]"):
        compare_models(files["ref.onnx"], files["opt.onnx"], feeds={"x": np.zeros((2, 4), np.float32)})


def test_models_with_different_inputs_are_refused(files, tmp_path):
    onnx.save(parse_model("agraph (float[2,8] z) => (float[2,8] probs) { probs = Relu(z) }"),
              tmp_path / "renamed.onnx")
    with pytest.raises(InputError, match=r"input 'x' of .*ref.onnx is not an input of .*renamed.onnx"):
        compare_models(files["ref.onnx"], tmp_path / "renamed.onnx")
    onnx.save(parse_model("agraph (float[4,8] x) => (float[4,8] probs) { probs = Relu(x) }"),
              tmp_path / "wide.onnx")
    with pytest.raises(InputError, match=r"input 'x' has shape float32\[2,8\] in .* but float32\[4,8\]"):
        compare_models(files["ref.onnx"], tmp_path / "wide.onnx")


def test_shared_names_with_other_shapes_are_skipped(tmp_path):
    ref = parse_model("agraph (float[2,8] x) => (float[2,8] y) { t = Transpose(x)\n y = Transpose(t) }")
    cand = parse_model("agraph (float[2,8] x) => (float[2,8] y) { t = Identity(x)\n y = Identity(t) }")
    report = compare_models(ref, cand, per_tensor=True)
    assert report.passed and report.intermediates == []
    assert report.notes == ["1 shared name(s) skipped, the shapes differ: t"]


def test_missing_output_fails_its_row(files, tmp_path):
    onnx.save(parse_model("agraph (float[2,8] x) => (float[2,8] other) { other = Relu(x) }"),
              tmp_path / "other.onnx")
    report = compare_models(files["ref.onnx"], tmp_path / "other.onnx")
    (row,) = report.rows
    assert row.name == "probs" and not row.passed and "not an output of" in row.note
    assert any("other" in note for note in report.notes)


def test_random_inputs_follow_dims_the_candidate_pinned(tmp_path):
    dynamic = parse_model("agraph (float[N,4] x) => (float[N,4] y) { y = Relu(x) }")
    onnx.save(dynamic, tmp_path / "dyn.onnx")
    save(optimize(str(tmp_path / "dyn.onnx"), input_shapes="x:3,4", target="cpu"),
         str(tmp_path / "pinned.om"))
    report = compare_models(tmp_path / "dyn.onnx", tmp_path / "pinned.om")
    assert report.passed and report.rows[0].shape == (3, 4)
    # Pins that do not fit are named as such: "pin the dims" would not help who pinned them.
    with pytest.raises(InputError, match=r"^input_shapes shapes inputs that do not fit \S*"
                                         r"pinned.om: input 'x' has shape \[5, 4\]"):
        compare_models(tmp_path / "dyn.onnx", tmp_path / "pinned.om", input_shapes="x:5,4")


def test_option_errors(files, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["opt.onnx"],
                         "--csv", tmp_path / "no" / "r.csv")
    assert rc == 2 and "directory" in err and "does not exist" in err
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["opt.onnx"], "--rtol", "-1")
    assert rc == 2 and "argument --rtol: -1.0 is negative" in err
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["opt.onnx"],
                         "--min-cosine", "2")
    assert rc == 2 and "argument --min-cosine: 2.0 is not a cosine; give -1 to 1" in err
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["opt.onnx"],
                         "--input-shape", "y:1")
    assert rc == 2 and "has no input 'y'" in err  # well formed, but not this model's
    rc, _, err = run_cli(capsys, "compare", files["ref.onnx"], files["opt.onnx"],
                         "--input-shape", "y=1")
    assert rc == 2 and "argument --input-shape: 'y=1' is not NAME:D0,D1,…" in err


def test_a_feed_overriding_an_initializer_is_judged_per_side(tmp_path, capsys):
    # The reference and an optimized .onnx take the override; an .om fixed the value, which
    # the error says, instead of "unknown input … for the reference".
    from onnx import TensorProto, helper, numpy_helper

    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])], "g",
        [vi("x", TensorProto.FLOAT, [3]), vi("k", TensorProto.FLOAT, [3])],
        [vi("y", TensorProto.FLOAT, [3])], [numpy_helper.from_array(np.ones(3, np.float32), "k")])
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=IR_VERSION), source)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.ones(3, np.float32), k=np.full(3, 2, np.float32))
    for suffix in (".onnx", ".om"):
        save(optimize(str(source)), tmp_path / f"opt{suffix}")
    rc, out, err = run_cli(capsys, "compare", source, tmp_path / "opt.onnx", "--inputs", feeds)
    assert rc == 0 and "result: PASS" in out, err
    rc, _, err = run_cli(capsys, "compare", source, tmp_path / "opt.om", "--inputs", feeds)
    assert rc == 2 and f"'k' overrides an initializer of {source}, which {tmp_path / 'opt.om'} " \
        "holds fixed at its value" in err


def test_a_slice_the_whole_tensor_cosine_hides_is_a_note():
    # A detector's head: 4 box channels in pixels, 2 class-score channels of ~0.01, the last
    # one off; the whole-output cosine still reads above 0.9999.
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 3, 1)).astype(np.float32)
    w[:4] *= 300.0
    w[4:] *= 0.01
    noisy = w.copy()
    noisy[5] += rng.standard_normal((3, 1)).astype(np.float32) * 0.01
    text = "g (float[1,3,16] x) => (float[1,6,16] out) { out = Conv(x, w) }"
    report = compare_models(parse_model(text, w=w), parse_model(text, w=noisy),
                            {"x": rng.standard_normal((1, 3, 16)).astype(np.float32)})
    (row,) = report.rows
    assert row.cosine > 0.9999
    (note,) = [n for n in report.notes if n.startswith("out: cosine")]
    assert "over [:,5] alone" in note


def test_random_inputs_the_reference_cannot_run_get_a_hint(tmp_path):
    # Open dims become 1 in random inputs; a reflect pad of 2 needs 3: the inputs are at fault.
    import graphopt
    from graphopt.errors import GraphoptError, VerificationError

    model = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 18]>\n'
                                    'g (float[1,n] x) => (float[1,m] y) '
                                    '{ p = Constant<value = int64[4] {0, 2, 0, 2}>()\n'
                                    '  y = Pad<mode = "reflect">(x, p) }')
    hint = r"\(on seeded random .*inputs, open dims 1: give real inputs with {}, or sizes "
    with pytest.raises(VerificationError, match=hint.format("inputs")):  # optimize's keyword
        graphopt.optimize(model, verify=True)
    source, om = tmp_path / "m.onnx", tmp_path / "m.om"
    onnx.save(model, source)
    graphopt.save(graphopt.optimize(model), om)
    with pytest.raises(GraphoptError, match=hint.format("feeds")):  # compare_models' keyword
        compare_models(str(source), str(om))
    from graphopt.tools.report_data import gather

    with pytest.raises(GraphoptError, match=hint.format("inputs")):  # the report's keyword
        gather(str(om), reference=str(source))
    x = {"x": np.arange(6, dtype=np.float32).reshape(1, 6)}
    assert compare_models(str(source), str(om), x).passed


def test_a_kv_cache_decoder_the_seeded_inputs_cannot_run_gets_told_why():
    # Its mask spans past + new tokens: seeded dims of 1 give a mask of 1 beside a past of 1,
    # which the decoder refuses; the hint had named sizes without the relation they must keep.
    import graphopt
    from graphopt.errors import VerificationError

    # The mask's entry at the first new token, past_key's length along the sequence.
    model = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 18]>\n'
                                    'g (float[1,2,past,4] past_key, float[1,total] mask) '
                                    '=> (float[1] y) {\n'
                                    '  s = Shape(past_key)\n'
                                    '  p = Gather(s, two)\n'
                                    '  y = Gather<axis = 1>(mask, p) }')
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2, np.int64), "two"))
    with pytest.raises(VerificationError, match=r"a decoder with a KV cache \(past_key\) needs "
                                                r"its attention mask as long as the past and"):
        graphopt.optimize(model, verify=True)


def test_a_model_whose_external_weights_are_missing_is_named(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)
    proto = parse_model("g (float[2,64] x) => (float[2,64] y) { y = MatMul (x, w) }",
                        w=rng.standard_normal((64, 64)).astype(np.float32))
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.bin",
              size_threshold=0)
    (tmp_path / "m.bin").unlink()  # a dump copied without its weights file
    rc, _, err = run_cli(capsys, "compare", tmp_path / "m.onnx", tmp_path / "m.onnx")
    assert rc == 2 and "internal error" not in err
    assert "m.onnx: cannot load the model's external data" in err


def test_an_output_without_elements_is_said_to_be_uncompared(tmp_path, capsys):
    import graphopt

    proto = parse_model("g (float[N,4] x) => (float[N,4] y) { y = Relu (x) }")
    onnx.save(proto, tmp_path / "m.onnx")
    result = graphopt.optimize(tmp_path / "m.onnx", input_shapes="x:0,4", verify=True)
    assert "output(s) y hold no element at these input shapes" in result.verify_note
    assert result.empty_outputs == ["y"]
    # The summary's headline counts only what was compared (it read "1 output(s) match").
    rc, out, err = run_cli(capsys, "optimize", tmp_path / "m.onnx", "-o", tmp_path / "v.onnx",
                           "--input-shape", "x:0,4", "--verify")
    assert rc == 0 and "verified: 0 output(s) match the original, 1 held no element to " \
        "compare (max abs error 0" in out, (out, err)
    onnx.save(result.to_onnx(), tmp_path / "o.onnx")
    rc, out, _ = run_cli(capsys, "compare", tmp_path / "m.onnx", tmp_path / "o.onnx",
                         "--input-shape", "x:0,4")
    assert rc == 0 and "note: output(s) y hold no element at these input shapes: nothing " \
        "of them was compared" in out


def test_a_model_onnxruntime_has_no_op_for_gets_no_hint_about_inputs(tmp_path, capsys):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Foo", ["r"], ["y"], domain="my.dom")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("my.dom", 1)]),
              tmp_path / "custom.onnx")
    rc, _, err = run_cli(capsys, "compare", tmp_path / "custom.onnx", tmp_path / "custom.onnx")
    assert rc == 2 and "my.dom:Foo(-1) is not a registered function/op" in err
    assert "random" not in err  # no input would make it run


def test_a_reference_that_is_not_the_oms_source_is_named(files):
    # An .om records its source's sha256: judged against another model, a FAIL says nothing
    # about the compile, and the report said "model source ref.onnx" beside it.
    report = compare_models(files["bad.onnx"], files["model.om"])
    note = f"{files['bad.onnx']} is not the model {files['model.om']} was compiled from (its " \
           "manifest records ref.onnx with sha256 "
    assert any(n.startswith(note) for n in report.notes), report.notes
    assert not any("is not the model" in n
                   for n in compare_models(files["ref.onnx"], files["model.om"]).notes)
    assert not any("is not the model" in n  # an .onnx candidate records no source
                   for n in compare_models(files["bad.onnx"], files["opt.onnx"]).notes)


def test_a_reference_whose_external_weights_differ_from_the_oms_source_is_named(tmp_path):
    # Two models with their weights in external data differ only in those files: the .om had
    # recorded the .onnx file's sha256 alone, and compare took the other model for its source.
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 64)).astype(np.float32)
    for folder, scale in (("a", 1.0), ("b", 2.0)):
        (tmp_path / folder).mkdir()
        proto = parse_model("g (float[1, 64] x) => (float[1, 64] y) { y = MatMul (x, w) }",
                            w=weight * scale)
        onnx.save(proto, tmp_path / folder / "m.onnx", save_as_external_data=True,
                  location="m.bin", size_threshold=0)
    assert (tmp_path / "a/m.onnx").read_bytes() == (tmp_path / "b/m.onnx").read_bytes()
    save(optimize(str(tmp_path / "a/m.onnx")), str(tmp_path / "a.om"))
    notes = compare_models(str(tmp_path / "b/m.onnx"), str(tmp_path / "a.om")).notes
    assert any("reads other external data than the model" in n for n in notes), notes
    notes = compare_models(str(tmp_path / "a/m.onnx"), str(tmp_path / "a.om")).notes
    assert not any("external data" in n or "is not the model" in n for n in notes), notes


def test_the_default_rule_passes_outputs_off_by_rounding_alone_as_verify_does(tmp_path, capsys):
    # A compile's NCHWc convolutions sum in another order: PaddleOCR's text detector compiled
    # at -O2 failed compare (228 of 307,200 elements past 1e-4, by 1.3e-4) where --verify, on
    # the same artifact, passed it with a note. One element off at the output's scale stands
    # for that here; tolerances given are applied as given.
    values = np.linspace(-900, 900, 200, dtype=np.float32).reshape(1, 200)
    reference = parse_model("g (float[1, 200] x) => (float[1, 200] y) { y = Add(x, v) }",
                            v=values)
    nudged = values.copy()
    nudged[0, 100] += 0.01  # an element near 0 off by 1.1e-5 of the largest magnitude
    candidate = parse_model("g (float[1, 200] x) => (float[1, 200] y) { y = Add(x, v) }",
                            v=nudged)
    feeds = {"x": np.zeros((1, 200), np.float32)}
    report = compare_models(reference, candidate, feeds)
    assert report.passed and report.outputs[0].note == "rounding (see note)"
    assert any("within rtol of the output's largest magnitude" in n for n in report.notes)
    strict = compare_models(reference, candidate, feeds, rtol=1e-5, atol=1e-6)
    assert not strict.passed and not strict.outputs[0].note
    # Tolerances given equal to the defaults are given too: the command line applies them as
    # given (compare_models could not tell them from the defaults; `rounding` says).
    onnx.save(reference, tmp_path / "ref.onnx")
    onnx.save(candidate, tmp_path / "cand.onnx")
    np.savez(tmp_path / "x.npz", **feeds)
    argv = ["compare", tmp_path / "ref.onnx", tmp_path / "cand.onnx", "--inputs",
            tmp_path / "x.npz"]
    assert run_cli(capsys, *argv)[0] == 0
    assert run_cli(capsys, *argv, "--rtol", "1e-4", "--atol", "1e-5")[0] == 1
    assert not compare_models(reference, candidate, feeds, rounding=False).passed
    far = values.copy()
    far[0, 100] += 5.0  # beyond rounding at any scale
    assert not compare_models(reference, parse_model(
        "g (float[1, 200] x) => (float[1, 200] y) { y = Add(x, v) }", v=far), feeds).passed


def test_a_nan_against_a_number_is_never_rounding():
    # max() dropped a NaN difference (max(0.0, nan) is 0.0): an output with a NaN where the
    # reference has a number passed as "rounding" under the default tolerances.
    from graphopt.numerics import max_abs_error

    assert max_abs_error(np.array([1.0, 2.0]), np.array([1.0, np.nan])) == float("inf")
    # And --verify's message said "max abs err 0" beside the element it found beyond.
    from graphopt.numerics import compare

    (problem,) = compare({"y": np.array([1.0, 2.0], np.float32)},
                         {"y": np.array([1.0, np.nan], np.float32)}, 1e-4, 1e-5)
    assert "1/2 element(s) beyond" in str(problem) and \
        "(max abs err inf; NaN in 0 expected and 1 computed element(s))" in str(problem)
    assert max_abs_error(np.array([np.nan, np.inf]), np.array([np.nan, np.inf])) == 0.0
    values = np.linspace(-900, 900, 200, dtype=np.float32).reshape(1, 200)
    reference = parse_model("g (float[1, 200] x) => (float[1, 200] y) { y = Add(x, v) }",
                            v=values)
    broken = values.copy()
    broken[0, 100] = np.nan
    candidate = parse_model("g (float[1, 200] x) => (float[1, 200] y) { y = Add(x, v) }",
                            v=broken)
    report = compare_models(reference, candidate, {"x": np.zeros((1, 200), np.float32)})
    assert not report.passed and report.outputs[0].note != "rounding (see note)"


def test_an_onnx_compiled_for_an_npu_that_the_cpu_cannot_run_says_so(tmp_path):
    # bf16 for the 910B: the CPU provider has no bfloat16 Relu, and the error named the Relu
    # alone, where an .om's partition says the CPU provider stands in for the device's.
    import graphopt
    from graphopt.errors import GraphoptError

    proto = parse_model("g (float[1, 8] x) => (float[1, 4] y) { h = MatMul(x, w) y = Relu(h) }",
                        w=np.ones((8, 4), np.float32))
    path = tmp_path / "bf.onnx"
    graphopt.save(graphopt.optimize(proto, target="ascend910b", precision="bf16"), path)
    with pytest.raises(GraphoptError, match=r"NOT_IMPLEMENTED .* \(compiled for an NPU target: "
                                            r"onnxruntime's CPU provider here has no kernel"):
        compare_models(proto, path)


def test_no_open_dims_hint_for_a_model_without_any_or_one_that_cannot_load(tmp_path):
    # The hint spoke of open dims set to 1 for a model whose dims are all numbers, and asked
    # for real inputs where onnxruntime refused the model itself ("Invalid model").
    import graphopt
    from graphopt.errors import GraphoptError

    fixed = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 18]>\n'
                                    'g (float[1,2] x) => (float[1,6] y) '
                                    '{ p = Constant<value = int64[4] {0, 2, 0, 2}>()\n'
                                    '  y = Pad<mode = "reflect">(x, p) }')
    source, om = tmp_path / "m.onnx", tmp_path / "m.om"
    onnx.save(fixed, source)
    graphopt.save(graphopt.optimize(fixed, level=0), om)
    with pytest.raises(GraphoptError, match=r"\(on seeded random \(seed 0\) inputs: give real "
                                            r"inputs with feeds\)$"):
        compare_models(str(source), str(om))
    dangling = parse_model("g (float[1,4] x) => (float[1,4] y) { y = Add (x, nope) }")
    onnx.save(dangling, tmp_path / "d.onnx")
    with pytest.raises(GraphoptError) as caught:
        compare_models(str(tmp_path / "d.onnx"), str(tmp_path / "d.onnx"))
    assert "Invalid model" in str(caught.value) and "seeded random" not in str(caught.value)


def test_a_lossy_candidate_says_why_it_runs_at_enable_all_by_what_it_holds(tmp_path):
    # An fp16 candidate was said to run "where its int8 kernels run": it has none.
    import graphopt

    source, half = tmp_path / "m.onnx", tmp_path / "half.onnx"
    onnx.save(graphopt.zoo.build("tiny"), source)
    graphopt.save(graphopt.optimize(str(source), precision="fp16"), str(half))
    report = compare_models(str(source), str(half))
    assert report.candidate_run == ("onnxruntime at ORT_ENABLE_ALL, as a compile a lossy "
                                    "precision pass changed is deployed")


def test_tolerances_are_checked_as_optimize_checks_them():
    # compare had a check of its own: True passed as rtol=1, a numpy float was refused.
    from graphopt import zoo
    from graphopt.tools.compare import compare_models

    model = zoo.build("tiny")
    assert compare_models(model, model, rtol=np.float32(1e-3)).rule.startswith(
        "allclose(rtol=0.001, ")
    for bad in (True, None, -1, float("nan")):
        with pytest.raises(OptionError, match="^rtol: expected a"):
            compare_models(model, model, rtol=bad)


def test_an_om_candidate_runs_on_one_onnxruntime_thread_as_the_reference(files, monkeypatch):
    # It ran on its sessions' default threads: a dynamically quantized LSTM's batch of 2 gives
    # results 0.2 apart at 1 and 2 threads on the original alone, which failed --verify.
    import graphopt.codegen.loader as loader

    opened = []
    real_load = loader.load

    def load(path, **options):
        opened.append(options)
        return real_load(path, **options)

    monkeypatch.setattr(loader, "load", load)
    assert compare_models(str(files["ref.onnx"]), str(files["model.om"])).passed
    assert opened == [{"intra_op_num_threads": 1, "inter_op_num_threads": 1}]


def _rng_weight(rng, *shape) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def test_a_name_the_source_had_is_never_given_to_other_contents(tmp_path):
    # EliminateIdentity removed the Identity's output `conv` before any new name was made, and
    # the Conv fused with its BatchNormalization then took that name: compare failed the fused
    # Conv's output against the Identity's as the first wrong intermediate.
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[1,8,6,6] x) => (float[1,8,6,6] y) {
            conv = Identity(x)
            relu_in = Relu(conv)
            c_out = Conv <pads = [1,1,1,1]> (relu_in, w)
            bn_out = BatchNormalization(c_out, s, b, m, v)
            y = Relu(bn_out)
        }""", w=_rng_weight(rng, 8, 8, 3, 3), s=rng.uniform(0.5, 2, 8).astype(np.float32),
        b=_rng_weight(rng, 8), m=_rng_weight(rng, 8), v=rng.uniform(0.5, 2, 8).astype(np.float32))
    compiled = optimize(proto).to_onnx()
    assert "conv" not in {out for node in compiled.graph.node for out in node.output}
    report = compare_models(proto, compiled, per_tensor=True)
    assert report.passed and all(row.passed for row in report.intermediates)


def test_a_value_sunk_below_a_transpose_is_not_paired_with_its_old_layout(tmp_path):
    # SinkTransposes computed the Relu in NCHW under the NHWC tensor's name; at C = H = W the
    # shapes agree and compare failed `r` (cosine 0.35) though the output was exact.
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[1,8,8,8] x) => (float[1,8,8,8] y) {
            c = Conv <pads = [1,1,1,1]> (x, w)
            t = Transpose <perm = [0,2,3,1]> (c)
            r = Relu(t)
            s = Sigmoid(r)
            back = Transpose <perm = [0,3,1,2]> (s)
            y = Conv <pads = [1,1,1,1]> (back, w)
        }""", w=_rng_weight(rng, 8, 8, 3, 3))
    compiled = optimize(proto).to_onnx()
    assert [n.op_type for n in compiled.graph.node].count("Transpose") == 0
    report = compare_models(proto, compiled, per_tensor=True)
    assert report.passed and all(row.passed for row in report.intermediates)


def test_channels_equalization_scaled_are_not_paired_with_the_float_tensors(tmp_path):
    # INT8's channel equalization multiplies a region's channels by s_c and divides them back
    # in its readers: the tensors hold other values, under their names they read as the
    # float stem's Relu gone wrong (cosine 0.995, "first failure").
    from graphopt import zoo

    proto = zoo.build("tiny")
    calibration = tmp_path / "calib.npz"
    rng = np.random.default_rng(0)
    np.savez(calibration, input=rng.standard_normal((4, 1, 3, 32, 32)).astype(np.float32))
    result = optimize(proto, quantize="int8", calibration=str(calibration))
    assert result.log.totals()["QuantizeInt8"]["rewrites"]["equalized channel region"] >= 1
    report = compare_models(proto, result.to_onnx(), per_tensor=True, min_cosine=0.999)
    assert report.passed and all(row.passed for row in report.intermediates)


def test_a_cosine_rule_holds_the_scale_too():
    # A MOS model's three scores all 30% high read cosine 1.0 and passed a lossy compile's
    # cosine rule; a cosine of 0.999 is an error of 4.5% in direction, and now in scale.
    reference = np.array([[3.55, 2.17, 2.36]], np.float32)
    high = compare_arrays("mos", reference, reference * 1.3, min_cosine=0.999)
    assert high.cosine > 0.999999 and not high.passed
    assert high.note == ("norm 1.3× the reference's (a cosine of 0.999 holds the scale to "
                         "±4.5%, which a cosine alone does not see)")
    assert compare_arrays("mos", reference, reference * 1.04, min_cosine=0.999).passed
    assert compare_arrays("mos", reference, reference * 1.3, min_cosine=0.9).passed
    from graphopt.tools.accuracy_rule import below_cosine

    assert below_cosine({"mos": reference}, {"mos": reference * 1.3},
                        {"rtol": 1e-4, "atol": 1e-5, "min_cosine": 0.999}) == [
        f"output 'mos': {high.note}"]
    # The header's rule says so.
    report = compare_models(_model(), _model(), min_cosine=0.999)
    assert "rule:      cosine >= 0.999, norm within ±4.5%\n" in format_report(report)


def test_verify_says_which_outputs_hold_nan_it_could_not_measure(tmp_path):
    # A Log of seeded normal inputs is NaN for half of them: --verify said "max abs error 0"
    # and nothing else, where compare counts them.
    import graphopt

    proto = parse_model("g (float[1,64] x) => (float[1,64] y) { l = Log (x) y = Relu (l) }")
    result = graphopt.optimize(proto, verify=True)
    assert "NaN or Inf in both models alike, where no error is measured: y: " in \
        result.verify_note and " of 64 element(s)" in result.verify_note
    finite = graphopt.optimize(parse_model(
        "g (float[1,64] x) => (float[1,64] y) { y = Relu (x) }"), verify=True)
    assert "NaN" not in (finite.verify_note or "")


def test_a_candidate_onnxruntime_refuses_is_named_once(tmp_path, capsys):
    # "bad.onnx: onnxruntime cannot run bad.onnx: …"
    onnx.save(parse_model("g (float[2] x) => (float[2] y) { y = Relu (x) }"), tmp_path / "a.onnx")
    bad = parse_model("g (float[2] x) => (float[2] y) { y = Relu (x) }")
    bad.graph.node[0].input[0] = "ghost"
    onnx.save(bad, tmp_path / "bad.onnx")
    rc, _, err = run_cli(capsys, "compare", tmp_path / "a.onnx", tmp_path / "bad.onnx")
    assert rc != 0 and err.count(str(tmp_path / "bad.onnx")) == 1, err


def test_a_long_tensor_name_is_elided_in_the_table_and_kept_in_csv(tmp_path):
    # A 290-character name made the table 400 columns wide.
    name = "/encoder/" + "block/" * 45 + "Relu_output_0"
    proto = parse_model(f"""
        g (float[2,8] x) => (float[2,8] y) {{
            "{name}" = Relu (x)
            y = Neg ("{name}")
        }}""")
    report = compare_models(proto, proto, per_tensor=True)
    table = format_report(report)
    assert max(map(len, table.splitlines())) < 200 and name[:20] in table and "…" in table
    assert any(row.name == name for row in report.intermediates)


def test_a_kv_cache_whose_heads_onnxruntime_refuses_is_not_blamed_on_the_mask():
    from graphopt.numerics import random_inputs_hint

    signature = [{"name": "past_key_values.0.key", "shape": ["batch", "kv_heads", "past", 16]},
                 {"name": "attention_mask", "shape": ["batch", "total"]}]
    heads = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running "
             "GroupQueryAttention node. Status Message: past_key dimension 3 should match the "
             "packed KV head dimension, got 1 expected 16")
    hint = random_inputs_hint("seeded", False, reason=heads, signature=signature)
    assert "the KV cache's (past_key_values.0.key) too" in hint and "mask" not in hint


def _near_tied_selection(shift: float, in_body: bool) -> onnx.ModelProto:
    """Scores of 64 near-tied columns select 10 boxes by TopK; `shift` moves every selected
    box. `in_body` selects inside an If, as torchvision's detectors do."""
    rng = np.random.default_rng(0)
    columns = 64
    weights = (np.repeat(rng.standard_normal((8, 1)), columns, axis=1)
               + rng.standard_normal((8, columns)) * 1e-6).astype(np.float32)
    boxes = (rng.random((columns, 4)) * 300).astype(np.float32)
    select = [onnx.helper.make_node("TopK", ["flat", "k"], ["top", "idx"]),
              onnx.helper.make_node("Gather", ["boxes", "idx"], ["chosen"], axis=0)]
    if in_body:
        branch = onnx.helper.make_graph(
            select, "select", [],
            [onnx.helper.make_tensor_value_info("chosen", onnx.TensorProto.FLOAT, [10, 4])])
        select = [onnx.helper.make_node("If", ["cond"], ["chosen"], then_branch=branch,
                                        else_branch=branch)]
    nodes = [onnx.helper.make_node("MatMul", ["x", "w"], ["scores"]),
             onnx.helper.make_node("Reshape", ["scores", "flat_shape"], ["flat"]), *select,
             onnx.helper.make_node("Add", ["chosen", "shift"], ["y"])]
    graph = onnx.helper.make_graph(
        nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [10, 4])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(boxes, "boxes"),
         numpy_helper.from_array(np.array([columns], np.int64), "flat_shape"),
         numpy_helper.from_array(np.array([10], np.int64), "k"),
         numpy_helper.from_array(np.array(shift, np.float32), "shift"),
         numpy_helper.from_array(np.array(True), "cond")])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)],
                                  ir_version=IR_VERSION)


@pytest.mark.parametrize("in_body", [False, True])
def test_boxes_shifted_after_a_selection_are_no_rounding(in_body):
    # A one-ulp move of the weights flips a near-tie of the TopK, so the selected boxes move by
    # a box's size; four times that had excused every box shifted by 200 pixels as rounding.
    feeds = {"x": np.abs(np.random.default_rng(1).standard_normal((1, 8))).astype(np.float32)}
    report = compare_models(_near_tied_selection(0.0, in_body), _near_tied_selection(200.0,
                                                                                     in_body),
                            feeds)
    assert not report.passed and "rounding" not in (report.rows[0].note or "")


def test_a_lossy_failure_after_a_selection_points_to_the_scores_before_it():
    from graphopt.rounding import lossy_selection_hint

    model = _near_tied_selection(0.0, in_body=True)
    model.graph.output.append(onnx.helper.make_tensor_value_info(
        "scores", onnx.TensorProto.FLOAT, None))
    assert "output(s) 'y' follow a TopK: a lossy precision moves near-tied scores" \
        in lossy_selection_hint(model, ["y"])
    assert "out_nodes" in lossy_selection_hint(model, ["y"])  # the API names it so
    assert lossy_selection_hint(model, ["scores"]) == ""  # before the selection
