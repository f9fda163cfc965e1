"""The speed line under a lossy compile's accuracy report: interleaved rounds, medians, and
when it warns; the timing itself is faked here (no test depends on how fast anything runs)."""

from __future__ import annotations

import re

import numpy as np
import onnx
from helpers import parse_model, run_cli

from graphopt.tools import speed_check as module
from graphopt.tools.speed_check import MAX_ROUNDS, MIN_ROUNDS, SpeedCheck


RNG = np.random.default_rng(0)
MODEL = """
g (float[2, 8] x) => (float[2, 8] y) {
  a = MatMul(x, w1)
  r = Relu(a)
  y = MatMul(r, w2)
}"""


def _model():
    return parse_model(MODEL, w1=RNG.standard_normal((8, 8)).astype(np.float32),
                       w2=RNG.standard_normal((8, 8)).astype(np.float32))


class FakeClock:
    """perf_counter for _timed: each fake run advances it by its own cost."""

    def __init__(self):
        self.now = 0.0
        self.order: list[str] = []

    def runner(self, name: str, seconds: float):
        def run(feeds):
            self.order.append(name)
            self.now += seconds
        return run


def _timed(monkeypatch, source_cost, output_cost, budget=2.0):
    clock = FakeClock()
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock.now)
    check = module._timed(clock.runner("source", source_cost),
                          clock.runner("output", output_cost), {}, budget)
    return check, clock.order


def test_rounds_alternate_which_runs_first_and_medians_compare(monkeypatch):
    check, order = _timed(monkeypatch, 0.125, 0.25)
    assert check.source_seconds == 0.125 and check.output_seconds == 0.25
    assert check.ratio == 2.0 and check.slower
    # One untimed run each, then 2 s / (0.375 s a round) = 5 rounds, every other one the
    # output first.
    assert check.rounds == 5 and order[:2] == ["source", "output"]
    assert order[2:6] == ["source", "output", "output", "source"]
    assert len(order) == 2 + 2 * check.rounds


def test_the_budget_sets_the_rounds_within_their_bounds(monkeypatch):
    assert _timed(monkeypatch, 1e-4, 1e-4)[0].rounds == MAX_ROUNDS
    assert _timed(monkeypatch, 5.0, 5.0)[0].rounds == MIN_ROUNDS
    within, _ = _timed(monkeypatch, 0.125, 0.13)
    assert not within.slower  # 4%: inside the noise of a few runs on a shared machine


def test_the_line_names_both_models_and_how_they_ran():
    line = SpeedCheck(0.00114, 0.00186, 25).format("m.onnx", "m8.om")
    assert line == ("speed: m8.om takes 1.63× the time of m.onnx on this machine (1.86 ms "
                    "against 1.14 ms a run; 1 thread, ORT_ENABLE_ALL, the .om at the levels it "
                    "records, medians of 25 interleaved runs)")
    # Three digits each, zeros kept: "33.2 µs against 31 µs" had read as less precise.
    assert "(33.2 µs against 31.0 µs a run" in SpeedCheck(31e-6, 33.2e-6, 9).format("a", "b")
    assert "(1234 ms against 1200 ms a run" in SpeedCheck(1.2, 1.234, 9).format("a", "b")


def test_a_lossy_compile_prints_the_speed_line_and_skips_it_where_it_would_mislead(tmp_path,
                                                                                    capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    for out in (tmp_path / "m16.onnx", tmp_path / "m16.om"):
        rc, stdout, err = run_cli(capsys, "optimize", src, "-o", out, "--precision", "fp16")
        assert rc == 0, err
        line = next(l for l in stdout.splitlines() if l.startswith("speed: "))
        assert re.fullmatch(rf"speed: {re.escape(str(out))} takes \d+\.\d\d× the time of "
                            rf"{re.escape(str(src))} on this machine "
                            r"\(.* [mµ]s against .* [mµ]s a run; 1 thread, .*, medians of \d+ "
                            r"interleaved runs\)", line), line
        if "runs slower" in stdout:  # fp16 on this CPU may well be
            assert "half-precision ops through casts to float32" in stdout
    # Written over its input, the source is the model as it was read, and says so.
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", src, "--precision", "fp16")
    assert rc == 0 and f"the time of {src} as it was before -o replaced it on" in stdout, err
    onnx.save(_model(), src)
    # An NPU target's partitions run on a stand-in here: their time says nothing.
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "n.om", "--precision",
                              "fp16", "--target", "ascend310")
    assert rc == 0 and "accuracy vs" in stdout and "speed:" not in stdout, err
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--precision",
                              "fp16", "--no-accuracy-report")
    assert rc == 0 and "speed:" not in stdout


def test_a_model_the_check_cannot_run_gets_a_warning_not_a_traceback(tmp_path, capsys,
                                                                     monkeypatch):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)

    def refuse(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : out of memory")

    monkeypatch.setattr(module, "_onnx_runner", refuse)
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "q.onnx", "--precision",
                              "fp16")
    assert rc == 0 and "accuracy vs" in stdout
    assert "graphopt: warning: no speed check: RuntimeError: [ONNXRuntimeError] : 1 : FAIL : " \
        "out of memory" in err


def test_a_slower_compile_is_blamed_on_the_precision_pass_only_where_it_changed_the_model(
        tmp_path, capsys, monkeypatch):
    # A max-pool model with no weight "ran slower" under --quantize int4 by timing noise, and
    # the warning blamed the unpacking of 4-bit weights it did not have.
    from graphopt import cli_accuracy

    monkeypatch.setattr(module, "speed_check", lambda *a, **k: SpeedCheck(1e-3, 2e-3, 25))
    args = type("Args", (), {"output": "q.onnx", "model": "m.onnx", "quantize": "int4"})()
    cli_accuracy.print_speed(args, "m.onnx", {}, ["QuantizeInt4Weights"])
    # The speed line on standard output, its warning on standard error.
    assert "4-bit weights save memory" in capsys.readouterr().err
    cli_accuracy.print_speed(args, "m.onnx", {}, [])
    err = capsys.readouterr().err
    assert "4-bit" not in err and "no precision pass changed the model" in err
    cli_accuracy.print_speed(args, "m.onnx", {}, ["ConvertPrecision"])  # int4 with fp16: fp16's doing
    assert "half-precision ops through casts" in capsys.readouterr().err


def test_the_int8_slowdown_advice_leaves_out_a_flag_already_given(capsys, monkeypatch):
    # --quantize-ends was suggested to a compile that had given it.
    from graphopt import cli_accuracy

    monkeypatch.setattr(module, "speed_check", lambda *a, **k: SpeedCheck(1e-3, 2e-3, 25))
    for given, advised in ((False, True), (True, False)):
        args = type("Args", (), {"output": "q.onnx", "model": "m.onnx", "quantize": "int8",
                                 "quantize_ends": given})()
        cli_accuracy.print_speed(args, "m.onnx", {}, ["QuantizeInt8"])
        err = capsys.readouterr().err
        assert err.startswith("graphopt: warning: q.onnx runs slower than m.onnx")
        assert "--quant-skip keeps more layers float" in err
        assert ("--quantize-ends quantizes" in err) == advised


def test_a_model_returning_float8_gets_its_speed_line(tmp_path, capsys):
    # onnxruntime's binding has no numpy type for float8: the speed check had ended in
    # "no speed check: RuntimeError: No corresponding Numpy type for Tensor Type".
    src = tmp_path / "f8.onnx"
    onnx.save(parse_model("""g (float[2, 8] x) => (float8e5m2[2, 8] y) {
        a = MatMul(x, w1)
        y = Cast <to = 19> (a)
    }""", w1=RNG.standard_normal((8, 8)).astype(np.float32)), src)
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", tmp_path / "f16.onnx",
                              "--precision", "fp16")
    assert rc == 0, err
    assert "no speed check" not in err, err
    assert any(line.startswith("speed: ") for line in stdout.splitlines()), stdout
