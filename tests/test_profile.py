"""graphopt profile: onnxruntime's kernel profile of .onnx and .om, matched to the IR, priced by
the cost model, aggregated consistently, with advisor hints and a chrome trace."""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, conv_classifier, conv_topk_model, parse_model, run_cli

import graphopt
from graphopt import zoo
from graphopt.errors import InputError, OptionError
from graphopt.ir import load_onnx
from graphopt.tools.advisor import advise, find_patterns, whole_pattern
from graphopt.tools.profile import profile_model
from graphopt.tools.profile_match import Matcher, name_nodes
from graphopt.table import elide

RNG = np.random.default_rng(7)
RUNS = {"repeat": 3, "warmup": 1, "threads": 1}


@pytest.fixture(autouse=True)
def _no_calibration(tmp_path, monkeypatch):
    """The cost model's defaults, not whatever calibration this machine's cache holds."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The zoo's tiny conv net as .onnx and as a cpu .om."""
    root = tmp_path_factory.mktemp("tiny")
    onnx_path, om_path = root / "tiny.onnx", root / "tiny.om"
    onnx.save(zoo.build("tiny"), onnx_path)
    graphopt.save(graphopt.optimize(onnx_path, target="cpu"), om_path)
    return onnx_path, om_path


def weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.2).astype(np.float32)


MATMUL_ADD = """
    g (float[4,16] x) => (float[4,8] y) {
        m = MatMul (x, w)
        y = Add (m, b)
    }"""


def assert_consistent(profile):
    """Every aggregation sums to the same kernel total."""
    total = profile.total_us
    assert total > 0
    assert sum(r.total_us for r in profile.by_op()) == pytest.approx(total)
    assert sum(us for _, _, us, _ in profile.by_partition()) * profile.runs == pytest.approx(total)
    assert sum(r.share for r in profile.by_op()) == pytest.approx(1.0)
    assert sum(k.calls for k in profile.kernels) == sum(r.calls for r in profile.by_op())


def test_onnx_profile_matches_nodes_and_sums(tiny):
    profile = profile_model(tiny[0], **RUNS)
    assert profile.kind == "onnx" and profile.partitions[0].level == "all"
    assert_consistent(profile)
    assert all(k.calls == profile.runs for k in profile.kernels)  # one call per node per run
    ops = {r.op_type for r in profile.by_op()}
    assert "Conv" in ops and "Gemm" in ops
    # onnxruntime's NCHWc pass renames the fused convs after their Relu's output value;
    # the matcher still finds the Conv nodes they run.
    convs = [k for k in profile.kernels if k.op_type == "Conv"]
    assert sorted(k.node for k in convs) == ["/conv1/Conv", "/conv2/Conv"]
    assert {k.how for k in convs} == {"nchwc"}
    assert all(k.predicted_us > 0 for k in convs)
    assert 0.5 < profile.matched_share <= 1.0
    assert len(profile.wall_s) == profile.runs


def test_om_profile_is_what_run_runs(tiny):
    profile = profile_model(tiny[1], **RUNS)
    assert profile.kind == "om"
    (part,) = profile.partitions
    assert part.level == "disable"  # the level the -O2 compile recorded: nothing left to do
    assert part.providers == ["CPUExecutionProvider"]
    assert_consistent(profile)
    # graphopt's own names survive: every kernel is matched by name and priced.
    assert profile.matched_share == 1.0
    assert {k.how for k in profile.kernels} == {"name"}
    assert all(k.predicted_us is not None for k in profile.kernels)
    assert not math.isnan(profile.spearman())
    assert "ReorderOutput" in {k.op_type for k in profile.kernels}


def test_level_override_changes_what_runs(tiny):
    plain = profile_model(tiny[0], level="disable", **RUNS)
    assert plain.partitions[0].level == "disable"
    # Nothing is rewritten at "disable": one kernel per graph node that computes something.
    assert {k.how for k in plain.kernels} == {"name"}
    assert "BatchNormalization" in {k.op_type for k in plain.kernels}


def test_partitions_of_an_npu_om_with_a_fallback(tmp_path):
    proto = conv_topk_model(k=4)
    path = tmp_path / "npu.om"
    graphopt.save(graphopt.optimize(proto, target="ascend310"), path)
    profile = profile_model(path, **RUNS)
    devices = [p.device for p in profile.partitions]
    assert len(devices) >= 2 and "npu" in devices and "cpu" in devices
    assert_consistent(profile)
    assert all(n > 0 for _, n, _, _ in profile.by_partition())
    # Only host partitions are priced: the CPU model is not the NPU's.
    priced = {k.partition for k in profile.kernels if k.predicted_us is not None}
    assert priced <= {p.name for p in profile.partitions if p.device == "cpu"}
    assert any("stand-in" in note for note in profile.notes)
    (hint,) = [h for h in advise(profile) if h.kind == "fallback"]
    assert "TopK ×1" in hint.message and hint.numbers["nodes"] == 1
    assert hint.numbers["host_partitions"] >= 1
    # Conv + Relu is onnxruntime's CPU FusedConv: no advice for the NPU partition.
    npu = {p.name for p in profile.partitions if p.device == "npu"}
    assert not [h for h in advise(profile) if h.numbers.get("partition") in npu
                and h.numbers.get("pattern") == "Conv + activation"]


def test_an_all_npu_om_names_no_cost_model_and_no_predictions(tmp_path):
    from graphopt.tools.profile_report import format_profile

    path = tmp_path / "npu.om"
    graphopt.save(graphopt.optimize(conv_classifier("", "float[1,64] scores"),
                                    target="ascend310"), path)
    profile = profile_model(path, **RUNS)
    assert {p.device for p in profile.partitions} == {"npu"}
    text = format_profile(profile, advise(profile))
    assert "cost model: not used (it prices host partitions" in text
    assert "Spearman" not in text and "predicted" not in text


def test_advisor_finds_matmul_add_left_unfused_at_O0(tmp_path, monkeypatch):
    proto = parse_model(MATMUL_ADD, w=weight(16, 8), b=weight(8))
    path = tmp_path / "mm.om"
    graphopt.save(graphopt.optimize(proto, level=0, target="cpu"), path)
    profile = profile_model(path, **RUNS)
    (hint,) = [h for h in advise(profile) if h.kind == "unfused"]
    assert hint.numbers["pattern"] == "MatMul + Add" and hint.numbers["places"] == 1
    assert hint.numbers["pass"] == "FuseMatMul"
    # At its default level onnxruntime fuses the pair itself; at "disable" both kernels run.
    assert hint.numbers["separate"] == 0
    apart = profile_model(path, level="disable", **RUNS)
    (hint,) = [h for h in advise(apart) if h.kind == "unfused"]
    assert hint.numbers["separate"] == 1 and hint.numbers["us_per_run"] > 0
    assert "separate kernels" in hint.message and "FuseMatMul (-O2) fuses" in hint.message
    # On a terminal the line breaks at spaces, hanging under its text (it ran past the edge).
    from graphopt import table
    from graphopt.tools.profile_report import format_profile

    monkeypatch.setattr(table, "terminal_width", lambda: 60)
    advice = format_profile(apart, advise(apart)).split("advisor:")[1].splitlines()[1:]
    assert all(len(line) <= 60 for line in advice)
    first = next(i for i, line in enumerate(advice) if line.startswith("- MatMul + Add"))
    assert advice[first + 1].startswith("  ") and not advice[first + 1].startswith("  -")


def test_a_stalled_call_does_not_inflate_what_fusing_would_save(tmp_path):
    # The pattern hint summed every call: one Add call another process stalled by 20 ms had
    # made a ResNet's Conv + BatchNorm 40% of the kernel time (3% in a quiet rerun).
    proto = parse_model(MATMUL_ADD, w=weight(16, 8), b=weight(8))
    path = tmp_path / "mm.om"
    graphopt.save(graphopt.optimize(proto, level=0, target="cpu"), path)
    profile = profile_model(path, level="disable", **RUNS)
    (quiet,) = [h for h in advise(profile) if h.kind == "unfused"]
    (add,) = [k for k in profile.kernels if k.op_type == "Add"]
    add.total_us += 20000.0  # one call; its median is unchanged
    (stalled,) = [h for h in advise(profile) if h.kind == "unfused"]
    assert stalled.numbers["us_per_run"] == quiet.numbers["us_per_run"] < 1000


def test_advisor_names_the_level_that_runs_the_fusing_pass(tmp_path):
    # Every pattern's pass was called -O2's: FuseActivation runs at -O3 only.
    proto = parse_model("""
        g (float[1,3,32,32] x) => (float[1,8,32,32] y) {
            c = Conv <pads = [1,1,1,1]> (x, w)
            y = Relu (c)
        }""", w=weight(8, 3, 3, 3))
    path = tmp_path / "conv.onnx"
    onnx.save(proto, path)
    (hint,) = [h for h in advise(profile_model(str(path), level="disable", **RUNS))
               if h.kind == "unfused"]
    assert "graphopt's FuseActivation (-O3) fuses this pattern" in hint.message, hint.message
    # Fused by onnxruntime at load: the load level, not the -O level, in the other branch.
    (hint,) = [h for h in advise(profile_model(str(path), level="all", **RUNS))
               if h.kind == "unfused"]
    assert "when loading at level all" in hint.message, hint.message
    assert "FuseActivation (-O3) fuses this pattern offline where its checks" in hint.message


def test_advisor_does_not_suggest_a_pass_the_oms_compile_ran(tmp_path):
    # A rank-3 MatMul + Add, which FuseMatMul (-O2) refuses (Gemm takes matrices): the advice
    # for the .om was "FuseMatMul (-O2) would fuse offline", of a compile that ran it.
    proto = parse_model("""
        g (float[2,4,8] x) => (float[2,4,8] y) {
            m = MatMul (x, w)
            y = Add (m, b)
        }""", w=weight(8, 8), b=weight(8))
    graphopt.save(graphopt.optimize(proto), tmp_path / "m.om")
    profile = profile_model(str(tmp_path / "m.om"), level="disable", **RUNS)
    assert "FuseMatMul" in profile.compiled_passes
    (hint,) = [h for h in advise(profile) if h.kind == "unfused"]
    assert "graphopt's FuseMatMul (-O2) ran in this compile and its checks left them " \
           "(`graphopt optimize … --trace-rule MatMulAddToGemm` says why)" in hint.message
    assert "would fuse" not in hint.message and "fuses this pattern" not in hint.message


def test_a_stalled_call_does_not_make_its_op_a_bottleneck(tiny):
    import dataclasses

    profile = profile_model(tiny[1], **RUNS)
    bottlenecks = {h.numbers["op"] for h in advise(profile) if h.kind == "bottleneck"}
    smallest = min(profile.kernels, key=lambda k: k.total_us)
    assert smallest.op_type not in bottlenecks and smallest.median_us > 0
    # One of its calls took as long as all the other kernels together, ten times over.
    smallest.total_us += 10 * profile.total_us
    assert profile.by_op()[0].op_type == smallest.op_type  # the measured totals say so
    hints = [h for h in advise(profile) if h.kind == "bottleneck"]
    stalled = {h.numbers["op"] for h in hints}
    assert stalled == bottlenecks  # the advisor, counting each kernel at its median, does not
    # Its shares then part from the table's, which count every call: each says which it is.
    assert all(re.search(r"of kernel time, [\d.]+ µs/run at each kernel's median call \(\d+% "
                         r"and [\d.]+ µs/run counting every call, as the table does\)",
                         h.message) for h in hints), hints
    # A kernel without a median counts at its mean.
    kernel = dataclasses.replace(smallest, median_us=0.0)
    profile.kernels[profile.kernels.index(smallest)] = kernel
    assert smallest.op_type in {h.numbers["op"] for h in advise(profile) if h.kind == "bottleneck"}
    # The µs/run part where the shares stay within 5 points: it says so too.
    for kernel in profile.kernels:
        kernel.total_us = 3 * max(kernel.median_us, 1.0) * kernel.calls
    (hint, *_) = [h for h in advise(profile) if h.kind == "bottleneck"]
    assert "at each kernel's median call" in hint.message, hint.message


def test_advisor_leaves_fused_graphs_alone(tmp_path):
    proto = parse_model(MATMUL_ADD, w=weight(16, 8), b=weight(8))
    fused = graphopt.optimize(proto, level=2, target="cpu")
    assert not find_patterns(fused.model)
    # A bias that is not a constant is no MatMul+bias pattern.
    shared = parse_model("""
        g (float[4,16] x, float[4,8] z) => (float[4,8] y) {
            m = MatMul (x, w)
            y = Add (m, z)
        }""", w=weight(16, 8))
    assert not find_patterns(load_onnx(shared))


def test_a_bias_behind_an_identity_is_a_constant_bias():
    # TorchScript exports route 11 of BERT's 12 shared projection biases through an Identity,
    # which onnxruntime's MatMulAddFusion sees past: the advisor counted 1 place of 12.
    proto = parse_model("""
        g (float[4,16] x) => (float[4,8] y) {
            c = Identity (b)
            m = MatMul (x, w)
            y = Add (m, c)
        }""", w=weight(16, 8), b=weight(8))
    assert len(find_patterns(load_onnx(proto))["MatMul + Add"]) == 1


def test_patterns_in_decomposed_layernorm_and_gelu_and_what_fusing_them_saves():
    # The advisor priced the kernels after the first of the matched ones alone: a LayerNorm's
    # Sub and Pow of its 9 kernels, a Gelu's Add and Mul; 81.7 µs/run of BERT's 225.7.
    proto = parse_model("""
        g (float[2,8] x) => (float[2,8] y, float[2,8] z) {
            mu = ReduceMean <axes = [-1]> (x)
            d = Sub (x, mu)
            sq = Pow (d, two)
            var = ReduceMean <axes = [-1]> (sq)
            ve = Add (var, eps)
            sd = Sqrt (ve)
            n0 = Div (d, sd)
            n1 = Mul (n0, gamma)
            n = Add (n1, beta)
            h = Div (n, rt2)
            e = Erf (h)
            e1 = Add (e, one)
            g1 = Mul (n, e1)
            y = Mul (g1, half)
            p = Pow (n, three)
            m = Mul (p, c)
            s = Add (n, m)
            u = Mul (s, k)
            t = Tanh (u)
            t1 = Add (t, one)
            hx = Mul (n, half)
            z = Mul (hx, t1)
        }""", header='<ir_version: 8, opset_import: ["" : 13]>\n',
        two=np.float32(2), eps=np.float32(1e-5), rt2=np.float32(math.sqrt(2)),
        one=np.float32(1), half=np.float32(0.5), gamma=weight(8), beta=weight(8),
        three=np.float32(3), c=np.float32(0.044715), k=np.float32(math.sqrt(2 / math.pi)))
    found = find_patterns(load_onnx(proto))
    assert {label: len(places) for label, places in found.items()} == {
        "decomposed LayerNorm (ReduceMean, Sub, Pow…)": 1, "decomposed Gelu (Erf, Add, Mul)": 1,
        "decomposed tanh Gelu (Pow … Tanh)": 1}
    whole = {label: [n.op_type for n in whole_pattern(places[0])]
             for label, places in found.items()}
    assert whole == {
        "decomposed LayerNorm (ReduceMean, Sub, Pow…)":
            ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"],
        "decomposed Gelu (Erf, Add, Mul)": ["Div", "Erf", "Add", "Mul", "Mul"],
        "decomposed tanh Gelu (Pow … Tanh)":
            ["Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"]}


@pytest.mark.parametrize("inner, outer", [("Mul (c, p)", "Add (x, m)"),
                                          ("Mul (p, c)", "Add (m, x)")])
@pytest.mark.parametrize("constants", ["initializers", "Constant nodes"])
def test_tanh_gelu_is_found_in_either_operand_order(inner, outer, constants):
    # GPT-2's export: x comes from a MatMul + Add, its constants are Constant nodes, and the
    # Add's operands may come in either order; the walk follows the branch that reaches Pow.
    names = {"three": 3.0, "c": 0.044715, "k": math.sqrt(2 / math.pi)}
    header = '<ir_version: 8, opset_import: ["" : 13]>\n'
    if constants == "initializers":
        consts, kwargs = "", {n: np.float32(v) for n, v in names.items()}
    else:
        consts = "".join(f"{n} = Constant <value = float {{{v}}}> ()\n" for n, v in names.items())
        kwargs = {}
    proto = parse_model(f"""
        g (float[2,8] a) => (float[2,8] t) {{
            {consts}
            mm = MatMul (a, w)
            x = Add (mm, b)
            p = Pow (x, three)
            m = {inner}
            s = {outer}
            u = Mul (k, s)
            t = Tanh (u)
        }}""", header=header, w=weight(8, 8), b=weight(8), **kwargs)
    (chain,) = find_patterns(load_onnx(proto))["decomposed tanh Gelu (Pow … Tanh)"]
    assert [n.op_type for n in chain] == ["Pow", "Mul", "Add", "Mul", "Tanh"]


def test_matcher_names():
    model = load_onnx(parse_model(MATMUL_ADD, w=weight(16, 8), b=weight(8)))
    name_nodes(model)
    assert [n.name for n in model.graph] == ["MatMul_0", "Add_1"]
    matcher = Matcher(model)
    assert matcher.match("MatMul_0", "MatMul")[1] == "name"
    node, how = matcher.match("MatMul_0/MatMulAddFusion", "Gemm")
    assert node.name == "MatMul_0" and how == "fused"
    assert matcher.match("y_nchwc", "Add")[0].name == "Add_1"
    assert matcher.match("ReorderOutput", "ReorderOutput") == (None, "")


def test_feeds_and_dynamic_inputs(tmp_path):
    proto = parse_model("""
        g (float[N,16] x) => (float[N,8] y) {
            y = MatMul (x, w)
        }""", w=weight(16, 8))
    with pytest.raises(InputError, match="dynamic dim 0.*pin it with input_shapes or pass feeds"):
        profile_model(proto, **RUNS)
    pinned = profile_model(proto, input_shapes={"x": [5, 16]}, **RUNS)
    assert pinned.models["model"].graph.inputs[0].shape == (5, 16)
    (kernel,) = pinned.kernels
    assert kernel.predicted_us > 0  # the cost model saw the pinned shape
    given = profile_model(proto, {"x": np.ones((2, 16), np.float32)}, **RUNS)
    assert given.kernels[0].calls == RUNS["repeat"]
    with pytest.raises(InputError, match="dtype"):
        profile_model(proto, {"x": np.ones((2, 16), np.float64)}, **RUNS)
    with pytest.raises(OptionError, match="input_shapes.*no input 'q'"):
        profile_model(proto, input_shapes={"q": [1]}, **RUNS)


@pytest.mark.parametrize("options, message", [
    ({"level": "fast"}, "^level 'fast' is not one of"),
    ({"repeat": 0}, "^repeat must be an integer of at least 1"),
    ({"repeat": "3"}, "^repeat must be an integer of at least 1, got .3."),
    ({"warmup": -1}, "^warmup must be an integer of 0 or more"),
    ({"threads": -2}, "^threads must be 0"),
    ({"threads": 3000}, r"^threads must be 0 \(onnxruntime chooses\) to 1024, got 3000$"),
    ({"feeds": 5}, r"^feeds: expected a dict of input arrays or an \.npz path, got 5$"),
    # numpy's own TypeError and ValueError had come through, naming no argument
    ({"seed": "1"}, r"^seed: expected an integer ≥ 0, got '1'$"),
    ({"seed": -1}, r"^seed: expected an integer ≥ 0, got -1$"),
    # an AttributeError ('list' object has no attribute 'get') had come through
    ({"input_shapes": [1, 3, 32, 32]}, r"^input_shapes: expected a dict, got \[1, 3, 32, 32\]$"),
])
def test_bad_options(tiny, options, message):
    with pytest.raises(OptionError, match=message):
        profile_model(tiny[0], **options)


def test_counts_and_dims_may_be_numpy_integers(tmp_path):
    # As optimize takes them: `repeat must be at least 1, got np.int64(3)` had refused them,
    # and a NumPy dim in input_shapes had read as "a dynamic dim 0 (unknown)".
    proto = parse_model("""
        g (float[N,16] x) => (float[N,8] y) {
            y = MatMul (x, w)
        }""", w=weight(16, 8))
    profile = profile_model(proto, repeat=np.int64(2), warmup=np.int32(1), threads=np.int64(1),
                            seed=np.int64(3), input_shapes={"x": [np.int64(5), 16]})
    assert (profile.runs, profile.warmup, profile.threads) == (2, 1, 1)
    assert json.loads(json.dumps(profile.to_json()))["runs"] == 2
    assert profile.models["model"].graph.inputs[0].shape == (5, 16)


def test_a_pinned_dim_pins_every_input_that_names_it():
    # As optimize and compare pin it: profile had asked for the other input's pin as well.
    proto = parse_model("""
        g (float[N,16] x, float[N,16] m) => (float[N,8] y) {
            s = Mul (x, m)
            y = MatMul (s, w)
        }""", w=weight(16, 8))
    profile = profile_model(proto, input_shapes={"x": [3, 16]}, **RUNS)
    assert [v.shape for v in profile.models["model"].graph.inputs] == [(3, 16), (3, 16)]
    # Two sizes for one dim are refused as optimize and run refuse them: onnxruntime's
    # broadcast error had blamed the model.
    with pytest.raises(OptionError, match="dim 'N' pinned to both 3 and 4"):
        profile_model(proto, input_shapes={"x": [3, 16], "m": [4, 16]}, **RUNS)


def test_a_model_as_bytes_is_profiled_and_other_types_named_in_one_line(tiny):
    # Bytes had been taken for a path: an InputError holding the model's whole repr.
    assert profile_model(tiny[0].read_bytes(), **RUNS).kernels
    with pytest.raises(OptionError, match="^path_or_proto: expected an .onnx or .om path, a "
                                          "ModelProto or an .onnx's bytes, not dict$"):
        profile_model({"x": 1})


def test_cli_text_json_and_trace(tiny, tmp_path, capsys):
    trace = tmp_path / "trace.json"
    rc, out, err = run_cli(capsys, "profile", tiny[1], "--repeat", "2", "--warmup", "1",
                           "--threads", "1", "--top", "3", "--trace", trace)
    assert rc == 0, err
    assert "per op type" in out and "top 3 kernel(s)" in out and "partitions" in out
    assert "advisor:" in out and f"wrote {trace}" in out
    events = json.loads(trace.read_text())
    kernels = [e for e in events if e.get("cat") == "Node"]
    assert kernels and all(e["args"]["partition"] == "p0_cpu" for e in kernels)
    # warmups included: the trace is onnxruntime's whole record
    assert len(kernels) >= 2 * 6

    rc, out, err = run_cli(capsys, "profile", tiny[0], "--repeat", "2", "--warmup", "0",
                           "--threads", "1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "onnx" and doc["runs"] == 2 and doc["trace"] is None
    assert sum(op["total_us"] for op in doc["ops"]) == pytest.approx(
        sum(k["total_us"] for k in doc["kernels"]))
    assert {h["kind"] for h in doc["hints"]} >= {"unfused"}
    rc, out, err = run_cli(capsys, "profile", tiny[0], "--repeat", "2", "--warmup", "0",
                           "--threads", "1")
    assert rc == 0, err
    # The first run checks the outputs and is never timed, even at --warmup 0.
    assert "2 profiled run(s) after 1 untimed check run (--warmup 0), 1 thread(s)" in out


def test_a_damaged_default_calibration_leaves_the_defaults_with_a_note(tiny, tmp_path):
    from graphopt.tuner.calibrate import default_path

    os.makedirs(os.path.dirname(default_path()))
    with open(default_path(), "w") as f:
        f.write('{"format_version": 1}')
    profile = profile_model(tiny[1], **RUNS)  # the cache is not the user's to fix first
    assert "the calibration file does not load" in profile.cost_model
    assert any("missing key 'constants'" in note for note in profile.notes)
    with pytest.raises(OptionError, match="missing key 'constants'"):
        profile_model(tiny[1], calibration=default_path(), **RUNS)  # named: the error


def test_cli_errors(tiny, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "profile", tmp_path / "missing.onnx")
    assert rc == 1 and "missing.onnx: no such file" in err
    rc, _, err = run_cli(capsys, "profile", tiny[0], "--level", "fast")
    assert rc == 2 and "argument --level: invalid choice: 'fast'" in err  # a usage error
    rc, _, err = run_cli(capsys, "profile", tiny[0], "--top", "0")
    assert rc == 2 and "argument --top: 0 is not allowed" in err
    rc, _, err = run_cli(capsys, "profile", tiny[0], "--trace", tmp_path / "no" / "t.json")
    assert rc == 1 and "--trace" in err and "does not exist" in err
    junk = tmp_path / "junk.om"
    junk.write_bytes(b"not an artifact")
    rc, _, err = run_cli(capsys, "profile", junk)
    assert rc == 1 and "junk.om" in err
    assert not list(tmp_path.glob("*.json"))
    # Feeds that do not fit are named by their file, not by the model.
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, z=np.zeros(3, np.float32))
    rc, _, err = run_cli(capsys, "profile", tiny[0], "--inputs", wrong)
    assert rc == 1 and f"--inputs {wrong}: unknown input 'z'" in err, err
    with pytest.raises(InputError, match=r"^feeds='\S*wrong.npz': unknown input 'z'"):
        profile_model(tiny[0], wrong, **RUNS)


def test_seed_with_inputs_is_refused_as_run_and_compare_refuse_it(tiny, tmp_path, capsys):
    # It seeded nothing: the profile ran on the file's arrays without a word.
    feeds = tmp_path / "x.npz"
    np.savez(feeds, input=np.zeros((1, 3, 32, 32), np.float32))
    rc, out, err = run_cli(capsys, "profile", tiny[0], "--inputs", feeds, "--seed", "3")
    assert rc == 1 and not out
    assert err == "graphopt: error: --seed only applies to random inputs; drop it or --inputs\n"


# --- onnxruntime's replacement names, INT8 kernels, shape profiles, long names -------------

GEMM_RELU = """
    g (float[4,16] x) => (float[4,8] y) {
        h = Gemm (x, w1, b1)
        r = Relu (h)
        g2 = Gemm (r, w2, b2)
        y = Relu (g2)
    }"""


def gemm_relu_model():
    return parse_model(GEMM_RELU, w1=weight(16, 16), b1=weight(16), w2=weight(16, 8),
                       b2=weight(8))


def test_matcher_strips_token_suffixes_and_the_fused_prefix():
    proto = gemm_relu_model()
    for node, name in zip(proto.graph.node, ("/fc1/Gemm", "/fc1/Relu", "/fc2/Gemm", "/fc2/Relu")):
        node.name = name
    matcher = Matcher(load_onnx(proto))
    # QDQ: onnxruntime's QGemm (or QLinearConv) is named after the node it replaces, whose
    # name is still taken then: `_token_N`.
    node, how = matcher.match("/fc1/Gemm_token_10", "QGemm")
    assert (node.name, how) == ("/fc1/Gemm", "fused")
    node, how = matcher.match("fused /fc2/Gemm", "FusedGemm")
    assert node.name == "/fc2/Gemm" and how == "fused"
    assert matcher.match("fused /fc2/Gemm_token_3", "FusedGemm")[0].name == "/fc2/Gemm"
    # onnxruntime's own nodes stay unmatched, with or without a token.
    assert matcher.match("Transpose_token_0", "Transpose") == (None, "")


def test_replacements_of_unnamed_nodes_match_in_order_when_only_one_order_exists(tmp_path):
    # Unnamed Gemm + Relu pairs become FusedGemm "fused " and "fused _token_0" at load.
    path = tmp_path / "gemm.om"
    graphopt.save(graphopt.optimize(gemm_relu_model(), level=0, target="cpu"), path)
    profile = profile_model(path, **RUNS)
    fused = {k.name: (k.node, k.how) for k in profile.kernels if k.op_type == "FusedGemm"}
    assert fused == {"fused ": ("Gemm_0", "order"), "fused _token_0": ("Gemm_2", "order")}
    assert profile.matched_share == 1.0
    # Two Gemms side by side run in either order: no rank says which kernel is which.
    side = load_onnx(parse_model("""
        g (float[4,16] x) => (float[4,8] a, float[4,8] b) {
            a = Gemm (x, w1)
            b = Gemm (x, w2)
        }""", w1=weight(16, 8), w2=weight(16, 8)))
    name_nodes(side)
    found = Matcher(side).match_all([("fused ", "FusedGemm"), ("fused _token_0", "FusedGemm")])
    assert set(found.values()) == {(None, "")}


@pytest.fixture(scope="module")
def int8_om(tmp_path_factory):
    """A conv classifier with named nodes, INT8 for the cpu: its middle conv is QDQ, which
    onnxruntime runs as a QLinearConv named `<conv>_token_<N>`."""
    root = tmp_path_factory.mktemp("int8")
    proto = conv_classifier("", "float[1,64] scores")
    for i, node in enumerate(proto.graph.node):
        node.name = f"/{node.op_type.lower()}{i}/{node.op_type}"
    calibration = root / "calib.npz"
    np.savez(calibration, x=RNG.standard_normal((4, 1, 8, 32, 32)).astype(np.float32))
    path = root / "int8.om"
    graphopt.save(graphopt.optimize(proto, target="cpu", pass_options={
        "quantize": "int8", "calibration": str(calibration)}), path)
    return path


def test_int8_kernels_match_the_convs_they_quantize(int8_om):
    profile = profile_model(int8_om, **RUNS)
    assert_consistent(profile)
    (qconv,) = [k for k in profile.kernels if k.op_type == "QLinearConv"]
    assert re.fullmatch(r"/conv2/Conv_token_\d+", qconv.name)
    assert (qconv.node, qconv.how) == ("/conv2/Conv", "fused")
    # The int8 conv, a large share of the work, went unmatched before. Its share is read off
    # the cost model's prediction, not the measured times, which a busy machine moves.
    predicted = sum(k.predicted_us or 0.0 for k in profile.kernels)
    assert (qconv.predicted_us or 0.0) / predicted > 0.2
    unmatched = {k.op_type for k in profile.kernels if k.node is None}
    assert unmatched <= {"Transpose"}  # onnxruntime's NHWC transposes around the QLinearConv


def test_an_om_with_shape_profiles_profiles_the_first_by_default(tmp_path, capsys):
    proto = parse_model("""
        g (float[N,16] x) => (float[N,8] y) {
            y = MatMul (x, w)
        }""", w=weight(16, 8))
    path = tmp_path / "dyn.om"
    graphopt.save(graphopt.optimize(proto, target="cpu", dynamic_dims="N:2,4"), path)
    profile = profile_model(path, **RUNS)
    assert profile.shape_profile["name"] == "profile0"
    assert profile.shape_profile["dims"] == {"N": 2} and profile.shape_profile["of"] == 2
    (model,) = profile.models.values()  # the chosen profile's partitions only
    assert model.graph.inputs[0].shape == (2, 16)
    pinned = profile_model(path, input_shapes={"x": [4, 16]}, **RUNS)
    assert pinned.shape_profile["dims"] == {"N": 4}
    rc, out, err = run_cli(capsys, "profile", path, "--repeat", "2", "--warmup", "1")
    assert rc == 0, err
    assert "shape profile profile0 (N=2) of 2: the first" in out.splitlines()[2]
    assert profile_model(tmp_path / "dyn.om", {"x": np.ones((4, 16), np.float32)},
                         **RUNS).shape_profile["name"] == "profile1"


def test_long_kernel_names_keep_their_start_and_end():
    names = [f"/layer{i}/layer{i}.0/downsample/downsample.1/BatchNormalization/ConvBatchNorm/"
             "Conv/nchwc" for i in (1, 2)]
    short = [elide(name) for name in names]
    assert short[0] != short[1] and all(len(s) == 56 for s in short)
    assert short[0].startswith("/layer1/layer1.0/") and short[0].endswith("Conv/nchwc")
    assert "…" in short[0]
    assert elide("/fc/Gemm") == "/fc/Gemm"


def test_a_loop_body_is_counted_once_in_its_loop(tmp_path):
    # onnxruntime records the body's kernels and the Loop kernel whose time includes them:
    # counting both made kernel time exceed wall time, with the body's nodes "unmatched".
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h_in", "w"], ["m"], name="body_matmul"),
         helper.make_node("Tanh", ["m"], ["h_out"], name="body_tanh")],
        "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []),
                 vi("h_in", TensorProto.FLOAT, [8, 64])],
        [vi("cond_out", TensorProto.BOOL, []), vi("h_out", TensorProto.FLOAT, [8, 64])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c", "x"], ["y"], name="loop", body=body)], "g",
        [vi("x", TensorProto.FLOAT, [8, 64])], [vi("y", TensorProto.FLOAT, [8, 64])],
        [onnx.numpy_helper.from_array(np.array(20, np.int64), "n"),
         onnx.numpy_helper.from_array(np.array(True), "c"),
         onnx.numpy_helper.from_array(RNG.standard_normal((64, 64)).astype(np.float32) * 0.1,
                                      "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    path = tmp_path / "loop.om"
    graphopt.save(graphopt.optimize(proto, target="cpu"), path)
    profile = profile_model(path, **RUNS)
    assert_consistent(profile)
    assert [k.op_type for k in profile.kernels] == ["Loop"]
    assert profile.matched_share == 1.0
    # Its time is its body's: not priced as one small kernel, whose 1 µs of overhead made the
    # advisor call silero-vad's If "bound by per-kernel overhead" (fusion would help).
    assert profile.kernels[0].predicted_us is None and profile.by_op()[0].bound is None
    hint = next(h for h in advise(profile) if h.kind == "bottleneck")
    assert hint.message.startswith("Loop: 100% of kernel time") and hint.numbers["control_flow"]
    assert hint.message.endswith("; control flow: its time is that of the kernels its branches "
                                 "or body ran, counted within it, so no per-kernel verdict "
                                 "applies"), hint.message


def test_a_model_onnxruntime_cannot_load_gets_one_line_of_error(tmp_path, capfd):
    # The failed session, destroyed with profiling on, had logged onnxruntime's own coloured
    # error about the profile it could not write before graphopt's line.
    from graphopt.cli import main

    path = tmp_path / "custom.onnx"
    proto = parse_model("g (float[2] x) => (float[2] y) { y = Foo (x) }",
                        header='<ir_version: 8, opset_import: ["" : 17, "my.dom" : 1]>\n')
    proto.graph.node[0].domain = "my.dom"
    onnx.save(proto, path)
    assert main(["profile", str(path), "--repeat", "1"]) == 1
    err = capfd.readouterr().err
    assert "onnxruntime cannot run it" in err and "EndProfiling" not in err, err


@pytest.mark.parametrize("predicted, measured, gap", [
    ([1.0, 2.0], [1.0, 3.0], "2 priced kernel(s), a rank correlation needs 3"),
    ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], "predicts the same time for all 3 priced kernels"),
    ([1.0, 2.0, 3.0], [4.0, 4.0, 4.0], "all 3 priced kernels measured the same time"),
])
def test_spearman_is_not_reported_where_it_says_nothing(predicted, measured, gap):
    # Two points correlate ±1 whatever the model predicts; constant sides have no ranks.
    from types import SimpleNamespace

    from graphopt.tools.profile_stats import ProfileStats

    stats = ProfileStats()
    stats.kernels = [SimpleNamespace(predicted_us=p, mean_us=m)
                     for p, m in zip(predicted, measured)]
    assert math.isnan(stats.spearman()) and gap in stats.spearman_gap()
    stats.kernels.append(SimpleNamespace(predicted_us=9.0, mean_us=9.5))
    stats.kernels.append(SimpleNamespace(predicted_us=0.5, mean_us=0.1))
    assert not math.isnan(stats.spearman()) and stats.spearman_gap() == ""


def test_the_trace_puts_every_partition_on_one_clock(tmp_path):
    # Each partition's session starts its profiler clock when it is created: kept apart, the
    # last partition's kernels came before the first's on the viewers' shared time axis.
    path = tmp_path / "topk.om"
    graphopt.save(graphopt.optimize(conv_topk_model(k=4), target="ascend310"), path)
    profile = profile_model(path, **RUNS)
    first: dict[str, float] = {}
    for event in profile.trace:
        if event.get("cat") == "Node":
            partition = event["args"]["partition"]
            first[partition] = min(first.get(partition, math.inf), event["ts"])
    from graphopt.codegen.om_read import load_om

    order = load_om(path).execution_order
    assert len(order) == 2 and sorted(first, key=first.get) == order


def test_a_kernel_whose_shapes_are_unknown_is_not_priced(tmp_path):
    # The cost model counted the unknown shapes of a Softmax behind a Reshape of data-given
    # sizes as no work: 1 µs, "bound by per-kernel overhead", for 1 ms of memory traffic.
    proto = parse_model("""
        g (float[1,65536] x, int64[2] shape) => (y) {
            r = Reshape(x, shape)
            y = Softmax <axis = -1> (r)
        }""")
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 65536)).astype(np.float32),
             "shape": np.array([256, 256], np.int64)}
    profile = profile_model(str(path), feeds, **RUNS)
    (softmax,) = [k for k in profile.kernels if k.op_type == "Softmax"]
    assert softmax.predicted_us is None and softmax.compute_us is None
    assert not any("Softmax" in hint.message and "bound" in hint.message
                   for hint in advise(profile))
