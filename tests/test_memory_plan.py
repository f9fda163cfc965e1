"""The static memory plan: lifetimes, views and in-place reuse, alignment, accounting, errors,
memory-aware ordering, verification, the arena executor on zoo and corpus models (and a
deliberately corrupted plan it must catch), the manifest JSON and the plot."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import onnx
import pytest

import graphopt
from graphopt import zoo
from graphopt.errors import OptionError
from graphopt.ir import load_onnx
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.memory import (MemoryPlanError, check_plan, draw_plan, liveness,
                                    plan_memory, schedule_for_memory, schedule_peak, verify_plan)

from corpus import corpus_models, model_inputs


def parse(text: str):
    model = load_onnx(onnx.parser.parse_model(text))
    infer_shapes(model)
    return model


HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


# -- lifetimes and accounting ---------------------------------------------------------------
def test_lifetimes_run_from_definition_to_last_read_and_dead_values_live_one_step():
    model = parse(HEADER + """
    g (float[4] x) => (float[4] y) {
        a = Relu(x)
        dead = Sigmoid(x)
        b = Neg(x)
        y = Add(a, b)
    }""")
    live = liveness(model)
    spans = {lt.value.name: (lt.first, lt.last) for lt in live.lifetimes()}
    assert spans == {"a": (0, 3), "dead": (1, 1), "b": (2, 3)}
    assert live.kind[model.graph.outputs[0]] == "output"


def test_inputs_outputs_and_weights_are_accounted_outside_the_arena():
    model = parse(HEADER + """
    g (float[2,8] x) => (float[2,4] y) {
        w = Constant<value = float[8,4] {0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,
                                         16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31}>()
        shape = Constant<value = int64[2] {8, 4}>()
        filled = ConstantOfShape(shape)
        w2 = Add(w, filled)
        h = MatMul(x, w2)
        y = Relu(h)
    }""")
    plan = plan_memory(model)
    assert plan.input_bytes == 2 * 8 * 4 and plan.output_bytes == 2 * 4 * 4
    # w (128 B), shape (16 B), filled and w2 (128 B each): constant folding computes them once
    assert plan.weight_bytes == 128 + 16 + 128 + 128
    assert set(plan.tensors) == {"h"}
    assert plan.external["w2"] == "weight" and plan.external["x"] == "input"
    unfolded = plan_memory(model, fold_constants=False)
    assert {"w", "filled", "w2", "h"} <= set(unfolded.tensors)


def test_a_quantized_weight_counts_as_its_int8_bytes_and_is_dequantized_in_the_arena():
    # onnxruntime never folds DequantizeLinear: the weight stays int8, dequantized per run
    # (or fused away), so it weighs 32 bytes of int8 (and its scale), not 128 of float.
    model = parse(HEADER + """
    g (float[2,8] x) => (float[2,4] y) {
        wq = Constant<value = int8[8,4] {0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,
                                         16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31}>()
        s = Constant<value = float {0.5}>()
        w = DequantizeLinear(wq, s)
        y = MatMul(x, w)
    }""")
    plan = plan_memory(model)
    assert plan.weight_bytes == 32 + 4
    assert set(plan.tensors) == {"w"}


def test_what_int8_layers_read_is_dequantized_inside_them(tmp_path):
    # Both operands dequantized: onnxruntime's QLinear kernels (and AMCT's) read the int8 weight
    # itself, so its float copy takes no memory; the arena executor still reproduces the model.
    model = parse(HEADER + """
    g (float[2,8] x) => (float[2,4] y) {
        wq = Constant<value = int8[8,4] {0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,
                                         16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31}>()
        s = Constant<value = float {0.5}>()
        xs = Constant<value = float {0.1}>()
        xz = Constant<value = uint8 {128}>()
        q = QuantizeLinear(x, xs, xz)
        d = DequantizeLinear(q, xs, xz)
        w = DequantizeLinear(wq, s)
        y = MatMul(d, w)
    }""")
    plan = plan_memory(model)
    assert plan.weight_bytes == 32 + 4 + 4 + 1 and "w" not in plan.tensors
    # The activation's too (an int8 ResNet-50 for ascend310 had planned 6.9 MiB, its float
    # compile's figure, for 6.1): the uint8 codes q live until the MatMul reads them.
    d, q = plan.tensors["d"], plan.tensors["q"]
    assert d.size == 0 and q.size == 2 * 8 and q.last == d.last
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    assert check_plan(model, plan, feeds).ok


def test_unknown_size_raises_naming_the_value():
    model = parse(HEADER + """
    g (float[N,4] x) => (float[N,4] y) {
        a = Relu(x)
        y = Neg(a)
    }""")
    with pytest.raises(MemoryPlanError, match=r"%x .*graph input.* shape \[N,4\].*input_shapes"):
        plan_memory(model)


def test_a_size_read_from_input_values_is_not_blamed_on_open_input_shapes():
    # Every input is static; the Resize's sizes are the values of `hw` (SAM's original image
    # size). Pinning input shapes cannot help, and the message says so.
    model = parse(HEADER + """
    g (float[1, 1, 4, 4] x, int64[2] hw) => (float[1, 1, H, W] y) {
        one = Constant <value_ints = [1, 1]> ()
        sizes = Concat <axis = 0> (one, hw)
        y = Resize <mode = "nearest"> (x, , , sizes)
    }""")
    with pytest.raises(MemoryPlanError) as info:
        plan_memory(model)
    message = str(info.value)
    assert "every input is static already" in message and "pin the input shapes" not in message


def test_strings_and_sequences_are_unplannable_without_a_pin_hint():
    # Their bytes are only known at run time: pinning shapes would not help.
    model = parse(HEADER + """
    g (string[2] x) => (string[2] y) { y = Identity(x) }""")
    with pytest.raises(MemoryPlanError) as info:
        plan_memory(model)
    assert "holds strings, whose bytes are only known at run time" in str(info.value)
    assert "--input-shape" not in str(info.value)
    model = parse(HEADER + """
    g (float[2] x, int64 i) => (float[2] y) {
        s = SequenceConstruct(x, x)
        y = SequenceAt(s, i)
    }""")
    with pytest.raises(MemoryPlanError, match=r"%s .*is not a tensor .*only known at run time$"):
        plan_memory(model)


def test_subgraph_reads_of_outer_values_extend_their_lifetimes():
    model = parse(HEADER + """
    g (float[4] x, bool c) => (float[4] y) {
        a = Relu(x)
        b = Sigmoid(x)
        n = Neg(x)
        z = If(c) <then_branch = then_g () => (float[4] t) { t = Neg(a) },
                   else_branch = else_g () => (float[4] e) { e = Abs(b) }>
        y = Add(z, n)
    }""")
    plan = plan_memory(model)
    assert (plan.tensors["a"].first, plan.tensors["a"].last) == (0, 3)
    assert (plan.tensors["b"].first, plan.tensors["b"].last) == (1, 3)
    assert any("If" in note for note in plan.notes)
    verify_plan(plan, model)
    feeds = {"x": np.arange(4, dtype=np.float32) - 2, "c": np.array(False)}
    assert check_plan(model, plan, feeds).ok


def test_the_summary_says_the_bodies_of_control_flow_are_not_planned():
    # All the work inside a branch: the arena holds the outer tensors alone, and its size
    # (silero-vad's 128 B) is not the memory the model needs.
    model = parse(HEADER + """
    g (float[64] x, bool c) => (float[64] y) {
        a = Relu(x)
        z = If(c) <then_branch = then_g () => (float[64] t) { u = Neg(a)\n t = Exp(u) },
                   else_branch = else_g () => (float[64] e) { v = Abs(a)\n e = Exp(v) }>
        y = Sigmoid(z)
    }""")
    assert plan_memory(model).summary().endswith(
        "over 3 steps; not counted: memory inside the bodies of 1 control-flow node (If), "
        "which the runtime allocates as they run")
    flat = parse(HEADER + "g (float[64] x) => (float[64] y) { a = Relu(x)\n y = Exp(a) }")
    assert "not counted" not in plan_memory(flat).summary()


def test_the_om_tables_say_the_bodies_are_not_planned(tmp_path, capsys):
    # inspect's memory plan table and both shape-profile tables showed the outer arena alone.
    from helpers import run_cli

    proto = onnx.parser.parse_model(HEADER + """
    g (float[N, 64] x, bool c) => (float[N, 64] y) {
        a = Relu(x)
        y = If(c) <then_branch = then_g () => (float[N, 64] t) { t = Exp(a) },
                   else_branch = else_g () => (float[N, 64] e) { e = Neg(a) }>
    }""")
    onnx.save(proto, tmp_path / "if.onnx")
    note = "work memory: not counted: memory inside the bodies of 1 control-flow node (If)"
    for argv in (["--dynamic-dims", "N:1,2"], ["--input-shape", "x:2,64"]):
        rc, out, err = run_cli(capsys, "optimize", tmp_path / "if.onnx", "-o",
                               tmp_path / "if.om", *argv)
        assert rc == 0, err
        assert (note in out) == ("--dynamic-dims" in argv)  # the plan's own line says it else
        rc, out, _ = run_cli(capsys, "inspect", tmp_path / "if.om")
        assert rc == 0 and "not counted: memory inside the bodies" in out
        if "--dynamic-dims" in argv:
            assert note in " ".join(out.split())  # under the shape profiles table
        else:
            assert "p0_cpu: not counted" in out  # under the memory plan table


def test_a_schedule_out_of_order_is_refused():
    model = parse(HEADER + """
    g (float[4] x) => (float[4] y) {
        a = Relu(x)
        y = Neg(a)
    }""")
    with pytest.raises(MemoryPlanError, match="before %a"):
        plan_memory(model, list(reversed(model.graph.nodes())))


def test_options_are_checked():
    model = parse(HEADER + "g (float[4] x) => (float[4] y) { y = Relu(x) }")
    with pytest.raises(OptionError, match="unknown strategy 'tetris'"):
        plan_memory(model, strategies=["tetris"])
    with pytest.raises(OptionError, match="alignment"):
        plan_memory(model, alignment=0)


# -- views and in place ---------------------------------------------------------------------
def test_reshape_shares_its_input_storage_and_keeps_the_group_alive():
    model = parse(HEADER + """
    g (float[2,8] x) => (float[16] y) {
        a = Relu(x)
        s = Constant<value = int64[1] {16}>()
        b = Reshape(a, s)
        c = Sigmoid(x)
        d = Add(b, b)
        e = Mul(d, d)
        y = Add(e, c)
    }""")
    plan = plan_memory(model)
    a, b = plan.tensors["a"], plan.tensors["b"]
    assert b.view_of == "a" and b.note == "view of %a"
    assert (a.offset, a.buffer) == (b.offset, b.buffer)
    # a's last reader is the Reshape (step 2), but its view b is read at step 4: the storage
    # lives until then, so c (defined at step 3) must not take it; d, at step 4, may.
    assert (a.first, a.last, b.first, b.last) == (0, 2, 2, 4)
    assert plan.tensors["c"].offset != a.offset
    assert plan.tensors["d"].inplace_of == "b" and plan.tensors["e"].inplace_of == "d"
    assert (plan.buffers[a.buffer].first, plan.buffers[a.buffer].last) == (0, 6)
    verify_plan(plan, model)


def test_a_view_of_a_graph_input_takes_no_arena():
    model = parse(HEADER + """
    g (float[2,8] x) => (float[16] y) {
        s = Constant<value = int64[1] {16}>()
        v = Reshape(x, s)
        y = Relu(v)
    }""")
    plan = plan_memory(model)
    assert plan.arena_bytes == 0 and plan.external["v"] == "input"


def test_add_writes_in_place_of_the_input_that_dies_there():
    model = parse(HEADER + """
    g (float[4,8] x, float[1,8] bias) => (float[4,8] y) {
        a = Relu(x)
        b = Sigmoid(x)
        c = Add(a, b)
        d = Add(bias, c)
        y = Neg(d)
    }""")
    plan = plan_memory(model)
    assert plan.tensors["c"].inplace_of == "a"          # both die at the Add: the first is taken
    assert plan.tensors["d"].inplace_of == "c"          # the broadcast input is a graph input
    assert plan.tensors["c"].offset == plan.tensors["a"].offset == plan.tensors["d"].offset
    assert plan.lower_bound == 2 * 128                  # a and b; c and d take a's bytes
    verify_plan(plan, model)
    assert check_plan(model, plan).ok


def test_no_in_place_while_the_input_is_read_later_or_broadcast_or_caller_owned():
    model = parse(HEADER + """
    g (float[4,8] x) => (float[4,8] y, float[4,8] out) {
        a = Relu(x)
        b = Sigmoid(a)
        small = ReduceMean<axes = [0]>(x)
        c = Add(small, b)
        y = Add(c, a)
        out = Neg(c)
    }""")
    plan = plan_memory(model)
    assert plan.tensors["b"].inplace_of == ""           # a is read again by the last Add
    assert plan.tensors["c"].inplace_of == "b"          # b dies there; small would broadcast
    assert "y" not in plan.tensors and "out" not in plan.tensors
    assert plan_memory(model, inplace=False).tensors["c"].inplace_of == ""


def test_cast_goes_in_place_only_at_the_same_width():
    model = parse(HEADER + """
    g (float[16] x) => (float16[16] y) {
        a = Relu(x)
        i = Cast<to = 6>(a)
        f = Cast<to = 1>(i)
        y = Cast<to = 10>(f)
    }""")
    plan = plan_memory(model)
    assert plan.tensors["i"].inplace_of == "a" and plan.tensors["f"].inplace_of == "i"
    assert len(plan.buffers) == 1


# -- alignment and strategies ---------------------------------------------------------------
@pytest.mark.parametrize("alignment", [1, 64, 256])
def test_offsets_and_slots_are_aligned(alignment):
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) {
        a = Relu(x)
        b = Neg(x)
        c = Sigmoid(x)
        d = Add(a, b)
        y = Add(d, c)
    }""")
    plan = plan_memory(model, alignment=alignment)
    assert all(t.offset % alignment == 0 for t in plan.tensors.values())
    slot = -(-12 // alignment) * alignment
    assert all(b.size == slot for b in plan.buffers)
    assert plan.lower_bound == 3 * slot and plan.arena_bytes == 3 * slot
    assert plan.candidates["naive"] == 3 * slot  # d took a's slot in place, y is an output
    verify_plan(plan, model)


def test_plan_keeps_the_smallest_strategy_and_names_it():
    model = _zoo("mobilenetv2", width=0.5, image_size=64)[0]
    plan = plan_memory(model)
    assert plan.strategy in plan.candidates
    assert plan.arena_bytes == min(v for k, v in plan.candidates.items() if k != "naive")
    assert plan.lower_bound <= plan.arena_bytes <= plan.candidates["greedy_by_size"]
    assert plan.arena_bytes <= 1.03 * plan.lower_bound
    assert plan.candidates["naive"] > 3 * plan.arena_bytes
    verify_plan(plan, model)


def test_thousands_of_tensors_live_at_once_are_placed_without_listing_their_pairs():
    # 1,500 Adds all read by one Concat: 1.1 M pairs live at a common step. The greedy
    # strategies place pair by pair (quadratic); the sweep-based ones meet the bound alone.
    count = 1500
    body = "\n".join(f"    a{i} = Add(x, x)" for i in range(count))
    model = parse(HEADER + f"g (float[1,16] x) => (float[{count},16] y) {{\n{body}\n"
                  f"    y = Concat<axis = 0>({', '.join(f'a{i}' for i in range(count))})\n}}")
    plan = plan_memory(model)
    assert set(plan.candidates) == {"naive", "best_fit", "same_size"}
    assert plan.arena_bytes == plan.lower_bound
    assert plan.notes[0].startswith("1,124,250 pairs of tensors live at a common step: placed "
                                    "by best_fit and same_size alone")
    verify_plan(plan, model)
    named = plan_memory(model, strategies=["greedy_by_size"])  # asked for by name: it runs
    assert set(named.candidates) == {"naive", "greedy_by_size"} and not named.notes


# -- scheduling -----------------------------------------------------------------------------
BRANCHY = HEADER + """
g (float[1,8] x) => (float[1,8] y) {
    w1 = Constant<value = float[8,256] {%s}>()
    w2 = Constant<value = float[256,8] {%s}>()
    a = MatMul(x, w1)
    b = MatMul(x, w1)
    a2 = MatMul(a, w2)
    b2 = MatMul(b, w2)
    y = Add(a2, b2)
}""" % (",".join(["0.01"] * 2048), ",".join(["0.01"] * 2048))


def test_reordering_lowers_the_peak_of_a_branchy_graph():
    model = parse(BRANCHY)
    result = schedule_for_memory(model)
    # a, b (1 KiB each) and a2 live at once in the written order; a, a2, then b, b2 in the best
    assert result.original_peak == 2 * 1024 + 64 and result.peak == 1024 + 2 * 64
    assert result.optimal and result.peak == schedule_peak(model, result.order)
    plan = plan_memory(model, reorder=True)
    assert plan.schedule_method == result.method
    assert plan.arena_bytes < plan_memory(model).arena_bytes
    # The plan says the order is provably the best, where inspect and the report read it.
    assert plan.schedule_optimal is True and plan.to_dict()["schedule_optimal"] is True
    assert plan.summary().endswith(f"; order {result.method}, optimal")
    assert plan_memory(model).schedule_optimal is None  # not searched
    assert "schedule_optimal" not in plan_memory(model).to_dict()
    verify_plan(plan, model)
    assert check_plan(model, plan).ok


def test_exact_search_on_a_wide_graph_respects_its_time_budget():
    model = _zoo("mobilenetv2", width=0.5, image_size=64)[0]
    result = schedule_for_memory(model, exact=True, time_budget=0.2)
    assert result.peak <= result.original_peak
    assert result.peak == schedule_peak(model, result.order)


# -- verification and the arena executor ----------------------------------------------------
def _zoo(name: str, precision: str = "keep", **options):
    proto = zoo.build(name, **options)
    pins = {i.name: [d.dim_value or (1 if k == 0 else 16)
                     for k, d in enumerate(i.type.tensor_type.shape.dim)]
            for i in proto.graph.input}
    model = graphopt.optimize(proto, level=2, input_shapes=pins, precision=precision).model
    return model, zoo.sample_inputs(proto, seed=0)


ZOO_CASES = {
    "tiny": {},
    "mobilenetv2": {"width": 0.5, "image_size": 64},
    "bert_base": {"layers": 1, "hidden": 64, "heads": 2, "intermediate": 128, "vocab": 100},
}


@pytest.mark.parametrize("name", ZOO_CASES)
def test_arena_executor_reproduces_zoo_models(name):
    model, feeds = _zoo(name, **ZOO_CASES[name])
    plan = plan_memory(model)
    verify_plan(plan, model)
    check = check_plan(model, plan, feeds)
    assert check.ok, check.mismatches
    assert max(check.max_abs.values()) < 1e-5


# The corpus models onnxruntime runs whose plans hold intermediates (most pytorch-converted
# models are one node), plus a single-node one; shufflenet's reordered schedule differs from
# the original (its Reshape/Transpose channel shuffles are views and copies).
CORPUS = ["pytorch-converted/test_PixelShuffle", "pytorch-converted/test_Softmin",
          "pytorch-converted/test_Conv2d", "light/light_squeezenet", "light/light_shufflenet"]


@pytest.mark.parametrize("entry", [m for m in corpus_models() if m.id in CORPUS],
                         ids=lambda m: m.id)
def test_arena_executor_reproduces_corpus_models(entry):
    proto = onnx.load(entry.path)
    feeds = model_inputs(entry, proto)
    model = graphopt.optimize(proto, level=2).model
    plan = plan_memory(model, reorder=True)
    verify_plan(plan, model)
    check = check_plan(model, plan, feeds)
    assert check.ok, check.mismatches


def _clobber(plan):
    """Two tensors in different buffers where the later one is written while the earlier one is
    still to be read after that step: put the later one on the earlier one's bytes."""
    for early in plan.tensors.values():
        for late in plan.tensors.values():
            if (late.buffer != early.buffer and early.first < late.first < early.last
                    and late.size <= early.size and not late.view_of and not late.inplace_of):
                late.offset = early.offset
                return early, late
    raise AssertionError("no pair to clobber")


def test_a_corrupted_plan_is_caught_statically_and_by_the_executor():
    model = parse(HEADER + """
    g (float[64] x) => (float[64] y) {
        a = Relu(x)
        b = Sigmoid(x)
        c = Add(a, b)
        y = Add(c, a)
    }""")
    plan = plan_memory(model, inplace=False)
    assert check_plan(model, plan).ok
    plan.tensors["b"].offset = plan.tensors["a"].offset  # b overwrites a, which the last Add reads
    with pytest.raises(MemoryPlanError, match="%a .* overlaps %b"):
        verify_plan(plan)
    check = check_plan(model, plan)
    assert not check.ok and check.max_abs["y"] > 0.1


def test_check_plan_passes_a_correct_fp16_plan_and_fails_a_wrong_one():
    # Each node's own session rounds to float16 where onnxruntime's whole-model run need not:
    # every fp16 compile failed float32's tolerances, even with nothing shared.
    proto = zoo.build("tiny")
    model = graphopt.optimize(proto, level=2, precision="fp16").model
    feeds = zoo.sample_inputs(proto, seed=0)
    for strategies in (["naive"], None):
        check = check_plan(model, plan_memory(model, strategies=strategies), feeds)
        assert check.ok, check.mismatches
    assert not check_plan(model, plan_memory(model), feeds, rtol=1e-4, atol=1e-5).ok  # as asked
    # b overwrites a, which the last Add reads: the looser tolerances do not hide it.
    model = parse(HEADER + """
    g (float16[64] x) => (float16[64] y) {
        a = Relu(x)
        b = Sigmoid(x)
        c = Add(a, b)
        y = Add(c, a)
    }""")
    plan = plan_memory(model, inplace=False)
    assert check_plan(model, plan).ok
    plan.tensors["b"].offset = plan.tensors["a"].offset
    assert not check_plan(model, plan).ok


def test_a_correct_fp16_plan_of_a_detector_passes_at_each_outputs_scale():
    # blazepalm's fp16 detections: values of 0.02 beside 31.5, which a node's own session
    # rounds 0.03 apart from the whole model's run, with nothing shared.
    model, feeds = _zoo("blazepalm", precision="fp16")
    for strategies in (["naive"], None):
        check = check_plan(model, plan_memory(model, strategies=strategies), feeds)
        assert check.ok, check.mismatches


def test_a_corrupted_fp16_mobilenet_plan_is_caught_within_float16s_rounding():
    # Clobbering an early conv's output moves the logits by 1.3e-3 of the largest: within
    # float16 tolerances of onnxruntime's run, but not of the same nodes run unshared.
    model, feeds = _zoo("mobilenetv2", precision="fp16", width=0.5, image_size=64)
    plan = plan_memory(model)
    assert check_plan(model, plan, feeds).ok
    early, late = _clobber(plan)
    check = check_plan(model, plan, feeds)
    assert not check.ok, f"clobbering %{early.name} with %{late.name} went unnoticed"
    assert "no tensor sharing bytes" in check.mismatches[0]


def test_a_corrupted_mobilenet_plan_changes_its_outputs():
    model, feeds = _zoo("mobilenetv2", width=0.5, image_size=64)
    plan = plan_memory(model)
    early, late = _clobber(plan)
    with pytest.raises(MemoryPlanError, match="overlaps"):
        verify_plan(plan)
    check = check_plan(model, plan, feeds)
    assert not check.ok, f"clobbering %{early.name} with %{late.name} went unnoticed"


def test_verify_plan_names_misaligned_and_out_of_arena_tensors():
    model = parse(HEADER + """
    g (float[4] x) => (float[4] y) {
        a = Relu(x)
        y = Neg(a)
    }""")
    plan = plan_memory(model)
    plan.tensors["a"].offset = 8
    with pytest.raises(MemoryPlanError, match="%a at offset 8 is not aligned to 64"):
        verify_plan(plan)
    plan.tensors["a"].offset = 64
    with pytest.raises(MemoryPlanError, match="outside the 64-byte arena"):
        verify_plan(plan)


# -- output forms ---------------------------------------------------------------------------
def test_to_json_carries_the_manifest_summary():
    model = parse(BRANCHY)
    plan = plan_memory(model, reorder=True)
    data = json.loads(plan.to_json())
    assert data["arena_bytes"] == plan.arena_bytes and data["lower_bound"] == plan.lower_bound
    assert data["strategy"] == plan.strategy and data["schedule_method"] == plan.schedule_method
    assert len(data["schedule"]) == len(model.graph) and len(data["tensors"]) == len(plan.tensors)
    assert {"name", "offset", "size", "first", "last", "buffer"} <= set(data["tensors"][0])
    assert "same_size" in data["candidates"] and "naive" in data["candidates"]


def test_draw_plan_writes_a_png_and_an_svg(tmp_path):
    model = _zoo("tiny")[0]
    plan = plan_memory(model)
    png = tmp_path / "plan.png"
    draw_plan(plan, str(png), width=200, height=120)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    length = struct.unpack(">I", data[33:37])[0]
    assert data[37:41] == b"IDAT"
    pixels = zlib.decompress(data[41:41 + length])
    assert (width, height) == (200, 120) and len(pixels) == height * (1 + 3 * width)
    assert len(set(pixels)) > 3  # more than white, black and one colour
    # The captions (arena size above, steps below) are drawn: black pixels in the top rows.
    rows = [pixels[r * (1 + 3 * width) + 1:(r + 1) * (1 + 3 * width)] for r in range(height)]
    assert any(b"\x00\x00\x00" in rows[r] for r in range(10))
    svg = tmp_path / "plan.svg"
    draw_plan(plan, str(svg))
    text = svg.read_text()
    assert text.count("<rect") == len(plan.buffers) + 1 and "lower bound" in text


def test_greedy_by_breadth_finds_each_buffers_broadest_step():
    """The range-max table gives every buffer the step of its lifetime with the most live
    bytes, the earliest of equals, as a scan of its lifetime does."""
    import random

    from graphopt.passes.memory.buffers import Buffer, live_profile
    from graphopt.passes.memory.strategies import _broadest_steps

    rng = random.Random(0)
    for _ in range(200):
        steps = rng.randint(1, 70)
        buffers = []
        for i in range(rng.randint(1, 50)):
            first = rng.randrange(steps)
            buffers.append(Buffer(i, 64 * rng.choice([1, 1, 2, 3, 10 ** 9]), first,
                                  rng.randrange(first, steps)))
        profile = live_profile(buffers)
        found = _broadest_steps(profile, buffers)
        for b in buffers:
            step = max(range(b.first, b.last + 1), key=lambda s: (profile[s], -s))
            assert found[b.id] == (profile[step], -step)
