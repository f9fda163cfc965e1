"""The cpu target end to end: conv nets blocked into NCHWc offline, partitions that record the
onnxruntime level they need, memory plans in the artifact, and refusal of a wrong block size."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.parser
import pytest

import graphopt
from graphopt import numerics, zoo
from graphopt.cli import main
from graphopt.codegen import OmPartition, OmSession, load_om, write_om
from graphopt.errors import ArtifactError, OptionError
from graphopt.ir import load_onnx
from graphopt.nchwc_block import METADATA_KEY, detect_block_size
from helpers import conv_topk_model

BLOCK = detect_block_size()
needs_nchwc = pytest.mark.skipif(not BLOCK, reason="this CPU has neither AVX2 nor AVX-512F, "
                                                   "so onnxruntime has no NCHWc kernels here")


def small_resnet() -> onnx.ModelProto:
    return zoo.build("resnet50", blocks=(1, 1, 1, 1), width=0.25, image_size=64)


def compile_cli(proto, tmp_path, *args) -> str:
    source = tmp_path / "model.onnx"
    onnx.save(proto, source)
    out = tmp_path / "model.om"
    assert main(["optimize", str(source), "-o", str(out), "-q", *args]) == 0
    return str(out)


@needs_nchwc
def test_om_without_a_target_is_compiled_for_this_cpu(tmp_path):
    proto = small_resnet()
    path = compile_cli(proto, tmp_path, "--input-shape", "input:1,3,64,64")
    artifact = load_om(path)
    assert artifact.manifest["target"] == "cpu"
    (part,) = artifact.partitions
    ops = {n.domain + "::" + n.op_type for n in part.model.graph.node}
    assert "com.microsoft.nchwc::Conv" in ops and "::Conv" not in ops
    # onnxruntime's extended level finds nothing left to rewrite: its session skips the optimizer.
    assert part.optimization_level == "disable"
    assert {p.key: p.value for p in part.model.metadata_props}[METADATA_KEY] == str(BLOCK)
    feeds = zoo.sample_inputs(proto, seed=0)
    expected = numerics.run(proto, feeds)
    actual = OmSession(path).run(feeds)
    for name, array in expected.items():
        np.testing.assert_allclose(actual[name], array, rtol=1e-4, atol=1e-5)


def test_artifact_carries_the_memory_plan(tmp_path):
    proto = small_resnet()
    path = compile_cli(proto, tmp_path, "--input-shape", "input:1,3,64,64",
                       "--memory-plot", str(tmp_path / "plan.svg"))
    (plan,) = load_om(path).extra["memory_plan"].values()
    assert plan["arena_bytes"] >= plan["lower_bound"] > 0
    assert plan["arena_bytes"] <= 1.03 * plan["lower_bound"]
    assert (tmp_path / "plan.svg").read_text().startswith("<svg")


def test_dynamic_shapes_leave_the_artifact_unplanned(tmp_path, capsys):
    proto = small_resnet()  # batch_size stays symbolic
    source = tmp_path / "model.onnx"
    onnx.save(proto, source)
    assert main(["optimize", str(source), "-o", str(tmp_path / "m.om")]) == 0
    out = capsys.readouterr().out
    assert "memory plan p0_cpu: none (cannot plan memory:" in out
    (plan,) = load_om(tmp_path / "m.om").extra["memory_plan"].values()
    assert "batch_size" in plan["unplanned"]
    # It told a compile at -O2 to "let -O2's shape folding run", which it had.
    assert "pin the input shapes (--input-shape, or input_shapes in Python): the shape " \
        "folding of -O2 and above then sizes it" in plan["unplanned"]
    assert main(["optimize", str(source), "-o", str(tmp_path / "n.om"),
                 "--memory-plot", str(tmp_path / "p.png")]) == 1
    assert "no partition has a memory plan" in capsys.readouterr().err
    assert not (tmp_path / "n.om").exists()  # a failed compile writes nothing


def test_memory_plot_draws_every_shape_profile(tmp_path):
    proto = small_resnet()
    source = tmp_path / "model.onnx"
    onnx.save(proto, source)
    assert main(["optimize", str(source), "-o", str(tmp_path / "m.om"), "-q",
                 "--dynamic-dims", "batch_size:1,2",
                 "--memory-plot", str(tmp_path / "plan.svg")]) == 0
    assert sorted(p.name for p in tmp_path.glob("plan.*.svg")) == [
        "plan.profile0.p0_cpu.svg", "plan.profile1.p0_cpu.svg"]
    # Each picture names its partition and profile, and says what its axes span.
    text = (tmp_path / "plan.profile1.p0_cpu.svg").read_text()
    assert "profile1.p0_cpu (batch_size=2): work memory " in text
    assert "address ↑ (0 to " in text and "step →  (0 to " in text


def test_the_profile_table_says_which_order_memory_reorder_chose(tmp_path, capsys):
    # A one-profile compile's memory-plan line says it; the profile table had no word of it.
    source = tmp_path / "model.onnx"
    onnx.save(small_resnet(), source)
    assert main(["optimize", str(source), "-o", str(tmp_path / "m.om"),
                 "--dynamic-dims", "batch_size:1,2", "--memory-reorder"]) == 0
    table = capsys.readouterr().out.split("shape profiles (2)")[1].splitlines()
    assert "order" in table[1].split()
    assert all(", optimal" in row or "not proven optimal" in row for row in table[3:5]), table


def test_memory_plot_checks_the_names_it_makes_before_writing_anything(tmp_path, capsys):
    # A picture per profile takes a name made from FILE's, which had not been checked: one
    # that was the input model was replaced by the picture, one that was a directory failed
    # after the .om was written.
    proto = small_resnet()
    source = tmp_path / "plan.profile0.p0_cpu.svg"  # a model under a name the plots make
    onnx.save(proto, source)
    before = source.read_bytes()
    flags = ["--dynamic-dims", "batch_size:1,2", "--memory-plot", str(tmp_path / "plan.svg")]
    assert main(["optimize", str(source), "-o", str(tmp_path / "m.om"), "-q", *flags]) == 1
    assert "--memory-plot " in capsys.readouterr().err
    assert source.read_bytes() == before and not (tmp_path / "m.om").exists()
    (tmp_path / "model.onnx").write_bytes(before)
    (tmp_path / "plan.profile1.p0_cpu.svg").mkdir()
    assert main(["optimize", str(tmp_path / "model.onnx"), "-o", str(tmp_path / "m.om"), "-q",
                 *flags]) == 1
    assert "plan.profile1.p0_cpu.svg: is a directory" in capsys.readouterr().err
    assert not (tmp_path / "m.om").exists()


def test_memory_plot_leaves_out_partitions_without_work_memory(tmp_path, capsys):
    # The TopK partition on the host reads a partition edge and writes the graph's outputs.
    source = tmp_path / "model.onnx"
    onnx.save(conv_topk_model(), source)
    assert main(["optimize", str(source), "-o", str(tmp_path / "m.om"), "--target",
                 "ascend310", "--memory-plot", str(tmp_path / "plan.png")]) == 0
    out = capsys.readouterr().out
    assert "memory plan p1_cpu: no work memory (every tensor is an input, an output or a " \
           "weight); weights 8 B, inputs 256 B, outputs 48 B" in out
    assert "memory plan p0_npu: work memory 256.0 KiB (262,144 B; greedy_by_size" in out
    # One picture, so under the name given.
    assert [p.name for p in tmp_path.glob("plan*")] == ["plan.png"]
    # inspect names no strategy or order for it, which had read as a plan made there.
    assert main(["inspect", str(tmp_path / "m.om")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("p1_cpu") and "B" in line)
    assert "no work memory  -  " in row and "greedy" not in row, row
    # Python draws what the flag draws, and refuses what it refuses.
    from graphopt.compile_memory import draw_memory_plans

    result = graphopt.optimize(str(source), target="ascend310")
    with pytest.raises(OptionError, match=r"plan\.jpg: the picture must end in \.png or \.svg"):
        draw_memory_plans(result, str(tmp_path / "plan.jpg"))
    assert not (tmp_path / "plan.jpg").exists()


BRANCHES = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[64,256] x) => (float[1,1] y) {
        a = Relu (x)
        b = Sigmoid (x)
        c = Tanh (x)
        ra = ReduceSum (a)
        rb = ReduceSum (b)
        rc = ReduceSum (c)
        ab = Add (ra, rb)
        y = Add (ab, rc)
    }""")


def test_memory_reorder_lowers_the_peak_and_keeps_outputs(tmp_path):
    plain = graphopt.optimize(BRANCHES, target="cpu")
    reordered = graphopt.optimize(BRANCHES, target="cpu", memory_reorder=True)
    (before,) = plain.memory_plans.values()
    (after,) = reordered.memory_plans.values()
    assert after.lower_bound < before.lower_bound
    assert after.schedule_method != "original"
    order = [n.op_type for n in reordered.model.graph]
    assert order.index("ReduceSum") < order.index("Sigmoid")  # a's branch finishes first
    graphopt.save(reordered, tmp_path / "r.om")
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)}
    np.testing.assert_allclose(OmSession(tmp_path / "r.om").run(feeds)["y"],
                               numerics.run(BRANCHES, feeds)["y"], rtol=1e-5)


@needs_nchwc
def test_partition_blocked_for_another_cpu_is_refused(tmp_path):
    result = graphopt.optimize(small_resnet(), target="cpu", input_shapes="input:1,3,64,64")
    proto = result.to_onnx()
    for prop in proto.metadata_props:
        if prop.key == METADATA_KEY:
            prop.value = "16" if BLOCK == 8 else "8"
    path = tmp_path / "other.om"
    write_om(path, [OmPartition("p0", "cpu", proto)])
    with pytest.raises(ArtifactError, match="NCHWc blocks of .* compile it again for this CPU"):
        OmSession(path)


def test_npu_partitions_run_at_the_full_level_on_the_stand_in(tmp_path):
    result = graphopt.optimize(small_resnet(), target="ascend310", input_shapes="input:1,3,64,64")
    graphopt.save(result, tmp_path / "npu.om")
    (part,) = load_om(tmp_path / "npu.om").partitions
    assert part.device == "npu" and part.optimization_level is None
    assert not any(n.domain == "com.microsoft.nchwc" for n in part.model.graph.node)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        session = OmSession(tmp_path / "npu.om")
    assert session.providers["p0_npu"][-1] == "CPUExecutionProvider"


COMPUTED_WEIGHTS = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,32,16,16] x) => (float[1,32,16,16] y) {
        shape = Constant <value = int64[4] {32, 32, 3, 3}> ()
        w = ConstantOfShape <value = float[1] {0.01}> (shape)
        c = Conv <pads = [1,1,1,1]> (x, w)
        y = Relu (c)
    }""")


@needs_nchwc
def test_convs_with_computed_weights_leave_the_layout_to_onnxruntime(tmp_path):
    # Below the fold limit the weight stays computed: blocking the other convs only would put
    # reorders around this one, so the whole layout is left to onnxruntime's layout level.
    result = graphopt.optimize(COMPUTED_WEIGHTS, target="cpu", fold_size_limit=1024)
    assert any("read weights computed at run time" in note for note in result.notes)
    assert "Conv" in {n.op_type for n in result.model.graph}
    graphopt.save(result, tmp_path / "c.om")
    (part,) = load_om(tmp_path / "c.om").partitions
    assert part.optimization_level == "all"
    # -O3 fuses the activation first: a FusedConv left unblocked needs that level as well.
    fused = graphopt.optimize(COMPUTED_WEIGHTS, target="cpu", fold_size_limit=1024, level=3)
    assert "FusedConv" in {n.op_type for n in fused.model.graph}
    graphopt.save(fused, tmp_path / "c3.om")
    assert load_om(tmp_path / "c3.om").partitions[0].optimization_level == "all"
    folded = graphopt.optimize(COMPUTED_WEIGHTS, target="cpu")
    graphopt.save(folded, tmp_path / "f.om")
    (part,) = load_om(tmp_path / "f.om").partitions
    assert part.optimization_level == "disable"  # blocked and fused: nothing left for onnxruntime
    assert {n.domain for n in part.model.graph.node} == {"com.microsoft.nchwc"}


# --- transformer partitions: no SkipLayerNormalization, graphopt's or onnxruntime's -------------

BERT_SMALL = {"layers": 2, "hidden": 64, "heads": 2, "intermediate": 128, "vocab": 100}


def _optimized_ops(proto: onnx.ModelProto, level: str, disabled=None) -> set[str]:
    """The op types onnxruntime runs `proto` as at `level` with the `disabled` optimizers off
    (its optimized model, read back)."""
    return {n.op_type for n in
            numerics.optimized_by_onnxruntime(proto, level, disabled).graph.node}


@pytest.mark.parametrize("shapes, level", [("input_ids:1,16;attention_mask:1,16", "-O2"),
                                           (None, "-O2"),
                                           (None, "-O3")])  # Adds inside elementwise functions
def test_bert_partition_runs_at_extended_without_skip_layernorm(tmp_path, shapes, level):
    proto = zoo.build("bert_base", **BERT_SMALL)
    path = compile_cli(proto, tmp_path, level, *(["--input-shape", shapes] if shapes else []))
    (part,) = load_om(path).partitions
    ops = {n.op_type for n in part.model.graph.node}
    assert {"LayerNormalization", "BiasGelu"} <= ops and ops & {"Attention", "MultiHeadAttention"}
    assert "SkipLayerNormalization" not in ops
    # The premise: "extended" would fuse the residual Adds back into SkipLayerNormalization
    # (6× slower on the CPU); the partition keeps "extended" without that one fusion.
    assert part.optimization_level == "extended"
    assert part.disabled_optimizers == ["SkipLayerNormFusion"]
    assert "SkipLayerNormalization" in _optimized_ops(part.model, "extended")
    assert "SkipLayerNormalization" not in _optimized_ops(part.model, "extended",
                                                          part.disabled_optimizers)
    dims = {"batch_size": 1, "sequence_length": 16} if shapes else {"batch_size": 2,
                                                                     "sequence_length": 9}
    feeds = zoo.sample_inputs(proto, seed=0, dims=dims)
    expected = numerics.run(proto, feeds)
    actual = OmSession(path).run(feeds)
    for name, array in expected.items():
        np.testing.assert_allclose(actual[name], array, rtol=1e-4, atol=1e-4)


def test_a_portable_onnx_leaves_onnxruntime_no_residual_add_to_refuse_into_skip_layernorm(
        tmp_path):
    # The types graphopt inferred proved the residual Adds' inputs of one shape where
    # onnxruntime's own inference of the export's symbolic dims does not: a session at
    # ORT_ENABLE_ALL fused them into the slow CPU SkipLayerNormalization (BERT 1.04× the
    # original's time). The sums are written as Sum, which that fusion does not match.
    proto = zoo.build("bert_base", **BERT_SMALL)
    result = graphopt.optimize(proto)
    typed = graphopt.to_onnx(result.model)  # every type, as the IR holds them
    # -O3 holds the Adds in elementwise functions, which onnxruntime inlines before it fuses.
    assert "SkipLayerNormalization" not in _optimized_ops(
        graphopt.optimize(proto, level=3).to_onnx(), "all")
    assert "SkipLayerNormalization" in _optimized_ops(typed, "all")  # the premise
    path = tmp_path / "bert.onnx"
    graphopt.save(result, path)
    for written in (result.to_onnx(), onnx.load(path)):
        assert "SkipLayerNormalization" not in _optimized_ops(written, "all")
        assert "Sum" in {n.op_type for n in written.graph.node}
    feeds = zoo.sample_inputs(proto, seed=0, dims={"batch_size": 2, "sequence_length": 9})
    expected = numerics.run(proto, feeds)
    actual = numerics.run(onnx.load(path), feeds, level="all")
    for name, array in expected.items():
        np.testing.assert_allclose(actual[name], array, rtol=1e-4, atol=1e-5)


def test_a_static_bert_onnx_writes_its_residual_sums_as_sum(tmp_path):
    # With static input shapes onnxruntime's own inference proves the residual Add's inputs
    # alike, types or not: a BERT export's .onnx ran 0.98x the original, its .om 0.71x.
    proto = zoo.build("bert_base", **BERT_SMALL)
    pins = {"input_ids": [1, 16], "attention_mask": [1, 16]}
    result = graphopt.optimize(proto, input_shapes=pins)
    path = tmp_path / "bert.onnx"
    graphopt.save(result, path)
    for written in (onnx.load(path), result.to_onnx()):
        ops = [n.op_type for n in written.graph.node]
        assert ops.count("Sum") == ops.count("LayerNormalization") > 0, ops
        assert "SkipLayerNormalization" not in _optimized_ops(written, "all")
        onnx.checker.check_model(written, full_check=True)
    assert "Sum" not in [n.op_type for n in result.model.graph]  # the IR keeps its Adds
    feeds = zoo.sample_inputs(proto, seed=0, dims={"batch_size": 1, "sequence_length": 16})
    expected, actual = numerics.run(proto, feeds), numerics.run(onnx.load(path), feeds, "all")
    for name, array in expected.items():
        np.testing.assert_allclose(actual[name], array, rtol=1e-4, atol=1e-5)


ADD_LN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,8] a, float[1,4,8] b) => (float[1,4,8] y{extra}) <float[8] gamma = {{1,1,1,1,1,1,1,1}},
    float[8] beta = {{0,0,0,0,0,0,0,0}}, float s = {{0.1}}, uint8 z = {{128}}> {{
    x = Add(a, b)
    n = LayerNormalization <epsilon = 1e-5> (x, gamma, beta)
    {tail}
}}"""


def _add_ln(case: str):
    """ADD_LN as `case` has it: the sum read by the LayerNormalization alone ("add-ln"), also
    returned ("sum-read-twice"), or the LayerNormalization's output quantized ("qdq")."""
    from graphopt.ir import load_onnx

    extra, tail = {
        "add-ln": ("", "y = Identity(n)"),
        "sum-read-twice": (", float[1,4,8] x", "y = Identity(n)"),
        "qdq": ("", "q = QuantizeLinear(n, s, z)\n    y = DequantizeLinear(q, s, z)"),
    }[case]
    return load_onnx(onnx.parser.parse_model(ADD_LN.format(extra=extra, tail=tail)))


@pytest.mark.parametrize("case, level", [
    ("add-ln", "extended"),          # with SkipLayerNormFusion disabled (the test below)
    ("sum-read-twice", "extended"),  # onnxruntime fuses an Add only when LN alone reads it
    ("qdq", "extended"),             # QLinear fusions live in "extended"
])
def test_session_level_of_a_residual_layernorm(case, level):
    from graphopt.codegen.split import _session_level

    model = _add_ln(case)
    assert _session_level(model, "extended") == level
    assert _session_level(model, None) is None  # unfused compiles keep onnxruntime's default


@pytest.mark.parametrize("case, level, disabled", [
    ("add-ln", None, ["SkipLayerNormFusion"]),     # a compile for no target
    ("add-ln", "all", ["SkipLayerNormFusion"]),    # convs left for onnxruntime to block
    ("add-ln", "extended", ["SkipLayerNormFusion"]),  # a fused float partition
    ("add-ln", "basic", None),                     # "basic" fuses no LayerNorm
    ("qdq", "extended", ["SkipLayerNormFusion"]),  # kept for its QLinear fusions
    ("sum-read-twice", "all", None),               # nothing onnxruntime would fuse
])
def test_partitions_at_extended_or_above_skip_onnxruntimes_skip_layernorm_fusion(case, level,
                                                                                 disabled):
    from graphopt.codegen.split import disabled_optimizers

    model = _add_ln(case)
    assert disabled_optimizers(model, level) == disabled


def test_a_partition_left_at_all_runs_add_and_layernorm_as_written(tmp_path):
    """A conv net with a transformer tail (wav2vec2) compiled for no target runs at
    onnxruntime's default level, which must not fuse the residual Adds into
    SkipLayerNormalization."""
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 4, 16] x) => (float[1, 16, 8] y) {
            c = Conv <pads = [1, 1]> (x, w)
            t = Transpose <perm = [0, 2, 1]> (c)
            a = Add (t, r)
            y = LayerNormalization <epsilon = 1e-5> (a, gamma, beta)
        }""")
    rng = np.random.default_rng(4)
    weights = {"w": rng.standard_normal((8, 4, 3)), "r": rng.standard_normal((1, 16, 8)),
               "gamma": rng.random(8) + 0.5, "beta": rng.standard_normal(8)}
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(v.astype(np.float32), k)
                                   for k, v in weights.items())
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto), path)  # for no target: onnxruntime's default level
    (part,) = load_om(path).partitions
    assert part.optimization_level is None and part.disabled_optimizers == ["SkipLayerNormFusion"]
    assert "SkipLayerNormalization" in _optimized_ops(part.model, "all")  # the premise
    feeds = {"x": rng.standard_normal((1, 4, 16)).astype(np.float32)}
    with graphopt.load(path) as session:
        np.testing.assert_allclose(session.run(feeds)["y"], numerics.run(proto, feeds)["y"],
                                   rtol=1e-5, atol=1e-5)


def test_a_small_partition_onnxruntime_would_leave_as_it_is_runs_at_disable():
    from graphopt.codegen.split import _session_level
    from graphopt.ir import load_onnx

    # Nothing for onnxruntime's extended level to rewrite (the Add has a second reader).
    text = ADD_LN.format(extra=", float[1,4,8] x", tail="y = Relu(n)")
    model = load_onnx(onnx.parser.parse_model(text))
    proto = graphopt.to_onnx(model)
    optimized = numerics.optimized_by_onnxruntime(proto, "extended")
    assert sorted(n.op_type for n in optimized.graph.node) == sorted(
        n.op_type for n in proto.graph.node)
    assert _session_level(model, "extended") == "disable"
    # An Identity the basic level would remove keeps the partition at "extended".
    text = ADD_LN.format(extra=", float[1,4,8] x", tail="y = Identity(n)")
    assert _session_level(load_onnx(onnx.parser.parse_model(text)), "extended") == "extended"


def test_a_models_own_qlinearconv_runs_at_all(tmp_path):
    # onnxruntime's quantize_static in QOperator form writes QLinearConv, which only the "all"
    # level moves to NHWC, its fastest int8 layout: a small ResNet so quantized had run at
    # "disable", 2× the original's time.
    rng = np.random.default_rng(3)
    w = rng.integers(-100, 100, (8, 4, 3, 3)).astype(np.int8)
    proto = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 8, 8] x) => (float[1, 8, 6, 6] y)
      <float xs = {0.02}, uint8 xz = {128}, float ws = {0.01}, int8 wz = {0},
       float ys = {0.05}, uint8 yz = {120}> {
        q = QuantizeLinear(x, xs, xz)
        c = QLinearConv(q, xs, xz, w, ws, wz, ys, yz)
        y = DequantizeLinear(c, ys, yz)
    }""")
    proto.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    path = tmp_path / "q.om"
    graphopt.save(graphopt.optimize(proto, target="cpu"), path)
    (part,) = load_om(path).partitions
    assert part.optimization_level == "all"
    feeds = {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)}
    with graphopt.load(path) as session:
        np.testing.assert_array_equal(session.run(feeds)["y"], numerics.run(proto, feeds)["y"])


def test_a_large_partition_keeps_extended_without_asking_onnxruntime(monkeypatch):
    import graphopt.codegen.split as split
    from graphopt.ir import load_onnx

    count = split._LEVEL_CHECK_NODES + 1  # one node past the bound
    body = "\n".join(f"    r{i + 1} = Relu(r{i})" for i in range(count))
    text = (f'<ir_version: 8, opset_import: ["" : 17]>\ng (float[4] r0) => '
            f"(float[4] r{count}) {{\n{body}\n}}")
    model = load_onnx(onnx.parser.parse_model(text))
    asked = []
    monkeypatch.setattr(split, "optimized_by_onnxruntime", lambda *a: asked.append(a))
    assert split._session_level(model, "extended") == "extended"
    assert asked == []


def test_with_the_layout_pass_off_onnxruntime_blocks_the_convs(tmp_path):
    result = graphopt.optimize(COMPUTED_WEIGHTS, target="cpu", disable_passes=["LayoutNchwc"])
    graphopt.save(result, tmp_path / "n.om")
    assert load_om(tmp_path / "n.om").partitions[0].optimization_level == "all"


@pytest.mark.parametrize("target", ["cpu", "ascend310"])
def test_a_transposed_matrix_times_a_vector_skips_onnxruntimes_transpose_folding(tmp_path,
                                                                                   target):
    # onnxruntime's MatmulTransposeFusion turns this into a FusedMatMul that computes it wrong.
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[4,3] x, float[4] v) => (float[3] y) {
          t = Transpose <perm = [1, 0]> (x)
          y = MatMul(t, v)
        }""")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 3)).astype(np.float32),
             "v": rng.standard_normal(4).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    assert numerics.compare(expected, numerics.run(proto, feeds, "extended"))  # the bug
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, target=target), path)
    (partition,) = load_om(path).manifest["partitions"]
    assert partition["disabled_optimizers"] == ["MatmulTransposeFusion"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the NPU's CPU stand-in
        with graphopt.load(path) as session:
            assert numerics.compare(expected, session.run(feeds)) == []


NORM = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2,4,8] x, float[2,4,8] skip) => (float[2,4,8] y) {
      r = Add (x, skip)
      m = ReduceMean <axes = [-1]> (r)
      d = Sub (r, m)
      d2 = Pow (d, p)
      v = ReduceMean <axes = [-1]> (d2)
      ve = Add (v, eps)
      s = Sqrt (ve)
      y = Div (d, s)
    }"""


# A decomposed LayerNorm of `r` into `y`, with constants two, eps, gamma and beta.
NORM_OF_R = """mean = ReduceMean <axes = [-1]> (r)
          d = Sub (r, mean)
          sq = Pow (d, two)
          var = ReduceMean <axes = [-1]> (sq)
          ve = Add (var, eps)
          std = Sqrt (ve)
          n = Div (d, std)
          ng = Mul (n, gamma)
          y = Add (ng, beta)"""


def test_a_mixed_precision_norm_behind_a_cast_loads_at_onnxruntimes_full_level(tmp_path):
    # A decomposed LayerNorm graphopt cannot fuse (its last dim comes from a Reshape to a
    # shape built at run time, as paddle2onnx writes PaddleOCR's recognizer) runs in float32
    # behind a Cast from the float16 MatMul: onnxruntime's LayerNormFusion fused it into a
    # LayerNormalization of the float16 input and the float32 scale, and refused the .om.
    rng = np.random.default_rng(0)
    proto = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, T, 16] x) => (float y) {{
          mm = MatMul (x, w)
          a = Add (mm, b)
          sx = Shape (x)
          sx2 = Slice (sx, s0, s2)
          target = Concat <axis = 0> (sx2, m1)
          r = Reshape (a, target)
          {NORM_OF_R}
        }}""")
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in {
        "w": rng.standard_normal((16, 16)).astype(np.float32),
        "b": rng.standard_normal(16).astype(np.float32),
        "gamma": rng.standard_normal(16).astype(np.float32),
        "beta": rng.standard_normal(16).astype(np.float32),
        "two": np.float32(2), "eps": np.float32(1e-5), "s0": np.array([0], np.int64),
        "s2": np.array([2], np.int64), "m1": np.array([-1], np.int64)}.items())
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, target="cpu", precision="mixed-fp16"), path)
    (partition,) = load_om(path).manifest["partitions"]
    assert "LayerNormFusionL2" in (partition.get("disabled_optimizers") or [])
    feeds = {"x": rng.standard_normal((1, 8, 16)).astype(np.float32)}
    with graphopt.load(path) as session:
        actual = session.run(feeds)["y"]
    np.testing.assert_allclose(actual, numerics.run(proto, feeds)["y"], rtol=0.02, atol=0.02)


@pytest.mark.parametrize("precision, head", [
    ("fp16", "r = Identity (x)"),                          # behind fp16's Cast of the input
    ("keep", "i = Cast <to = 6> (x)\n r = Cast <to = 1> (i)"),  # behind a Cast from int32
])
def test_a_norm_behind_any_cast_loads_at_onnxruntimes_full_level(tmp_path, precision, head):
    # onnxruntime's LayerNormFusion fuses a decomposed norm into a LayerNormalization of the
    # leading Cast's input whatever its dtype: float32 beside fp16's float16 scale at -O1
    # (where FuseLayerNorm does not run), int32 for a model's own Cast from int; the .om
    # disabled the fusion only behind a Cast from half precision, and did not load.
    rng = np.random.default_rng(0)
    proto = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 16] x) => (float[1, 8, 16] y) {{
          {head}
          {NORM_OF_R}
        }}""")
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in {
        "gamma": rng.standard_normal(16).astype(np.float32),
        "beta": rng.standard_normal(16).astype(np.float32),
        "two": np.float32(2), "eps": np.float32(1e-5)}.items())
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, level=1, precision=precision), path)
    feeds = {"x": (rng.standard_normal((1, 8, 16)) * 4).astype(np.float32)}
    with graphopt.load(path) as session:
        actual = session.run(feeds)["y"]
    np.testing.assert_allclose(actual, numerics.run(proto, feeds)["y"], rtol=0.02, atol=0.02)


@pytest.mark.parametrize("exponent, epsilon, form", [
    (0.0, 1e-5, ""), (3.0, 1e-5, ""), (4.0, 1e-5, ""), (2.0, 0.0, ""), (2.0, -1e-5, ""),
    (2.0, float("nan"), ""),
    # The fusions ignore keepdims=0 (2.5 off) and drop the rank an epsilon of [1,1,1,1] adds
    # (the .om's output came back of rank 0).
    (2.0, 1e-5, "keepdims=0"), (2.0, 1e-5, "epsilon of rank 4"),
    # onnxruntime drops an Identity before its fusions; -O0 keeps it in the partition.
    (3.0, 1e-5, "Identity before the variance")])
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_norms_onnxruntime_would_misread_are_left_as_written(tmp_path, exponent, epsilon,
                                                             form, level):
    # onnxruntime's LayerNormFusion reads no Pow exponent (a Pow(d, 0) became a LayerNorm, off
    # by 0.2), and its (Skip)LayerNormalization kernels refuse an epsilon ≤ 0 or NaN at load:
    # neither graphopt's FuseLayerNorm nor the session's fusions may take such a norm. At -O3
    # the Pow and the epsilon's Add sit in elementwise groups, whose bodies onnxruntime
    # inlines: the check had not looked inside (a Pow of 4 read as a square, 0.8 off).
    text, shape = NORM, (2, 4, 8)
    if form == "keepdims=0":
        text = text.replace("<axes = [-1]>", "<axes = [-1], keepdims = 0>").replace(
            "float[2,4,8] x, float[2,4,8] skip) => (float[2,4,8] y)",
            "float[8,8] x, float[8,8] skip) => (float[8,8] y)")
        shape = (8, 8)
    elif form == "Identity before the variance":
        text = text.replace("v = ReduceMean <axes = [-1]> (d2)",
                            "d3 = Identity (d2)\n      v = ReduceMean <axes = [-1]> (d3)")
    elif form:
        text = text.replace("=> (float[2,4,8] y)", "=> (float[1,2,4,8] y)")
    proto = onnx.parser.parse_model(text)
    eps_shape = (1, 1, 1, 1) if form == "epsilon of rank 4" else ()
    proto.graph.initializer.extend([
        onnx.numpy_helper.from_array(np.array(exponent, np.float32), "p"),
        onnx.numpy_helper.from_array(np.full(eps_shape, epsilon, np.float32), "eps")])
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name in ("x", "skip")}
    expected = numerics.run(proto, feeds)
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, level=level, target="cpu"), path)
    (partition,) = load_om(path).manifest["partitions"]
    assert partition.get("optimization_level", "all") == "disable" \
        or "LayerNormFusionL2" in (partition.get("disabled_optimizers") or [])
    with graphopt.load(path) as session:
        actual = session.run(feeds)
    np.testing.assert_allclose(actual["y"], expected["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("level", [1, 2])
def test_a_tanh_gelus_cube_leaves_onnxruntimes_norm_fusions_on(tmp_path, level):
    # The misread-norm guard took any Pow of an exponent other than 2 for a norm's variance:
    # GPT-2's tanh-GELU, Pow(x, 3) read by a Mul, switched every norm fusion off at -O1,
    # where graphopt leaves the norms to onnxruntime.
    rng = np.random.default_rng(0)
    proto = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 16] x) => (float[1, 8, 16] y) {{
          cube = Pow (x, three)
          k = Mul (cube, c)
          inner = Add (x, k)
          t = Tanh (inner)
          r = Mul (t, x)
          {NORM_OF_R}
        }}""")
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in {
        "gamma": rng.standard_normal(16).astype(np.float32),
        "beta": rng.standard_normal(16).astype(np.float32), "c": np.float32(0.044715),
        "three": np.float32(3), "two": np.float32(2), "eps": np.float32(1e-5)}.items())
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, level=level, target="cpu"), path)
    (partition,) = load_om(path).manifest["partitions"]
    assert "LayerNormFusionL2" not in (partition.get("disabled_optimizers") or [])
    feeds = {"x": rng.standard_normal((1, 8, 16)).astype(np.float32)}
    with graphopt.load(path) as session:
        np.testing.assert_allclose(session.run(feeds)["y"], numerics.run(proto, feeds)["y"],
                                   rtol=1e-4, atol=1e-5)


def test_a_portable_onnx_keeps_the_types_onnx_cannot_infer_through_a_function():
    # At -O3 the SiLU's QuickGelu and the residual Add share one elementwise function: ONNX
    # inference cannot see through a contrib op, so the sum left untyped failed
    # onnx.checker's full check at the LayerNormalization reading it.
    proto = onnx.parser.parse_model(ADD_LN.format(extra="", tail="y = Identity(n)").replace(
        "x = Add(a, b)", "g = Sigmoid(a)\n    m = Mul(a, g)\n    x = Add(m, b)"))
    result = graphopt.optimize(proto, level=3)
    assert any(n.op_type == "QuickGelu" for f in result.model.functions for n in f.node)
    written = result.to_onnx()
    onnx.checker.check_model(written, full_check=True)
    feeds = numerics.random_feeds(proto, seed=0)
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(written, feeds),
                                1e-5, 1e-6)
    assert not problems, problems


@pytest.mark.parametrize("level", [1, 2, 3])
def test_a_division_by_a_rank_widening_one_keeps_its_rank(tmp_path, level):
    # onnxruntime's DivMulFusion wrote Mul(Div(1, x), y) as Div(y, x), dropping the rank a
    # constant 1 of shape [1,1,1] adds: the partition returned [3, 8] for a declared [1, 3, 8]
    # and the .om did not load.
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[3,8] x, float[3,8] y) => (float[1,3,8] z) {
          r = Div (one, x)
          z = Mul (r, y)
        }""")
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((1, 1, 1), np.float32),
                                                                "one"))
    rng = np.random.default_rng(0)
    feeds = {name: rng.uniform(0.5, 2, (3, 8)).astype(np.float32) for name in ("x", "y")}
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, level=level, target="cpu"), path)
    with graphopt.load(path) as session:
        np.testing.assert_allclose(session.run(feeds)["z"], numerics.run(proto, feeds)["z"],
                                   rtol=1e-6)


def test_a_norm_that_half_precision_makes_a_square_loads_at_o3(tmp_path):
    # Pow(d, 2.0001) is no square in float32 (FuseLayerNorm leaves it), but 2.0 in float16;
    # at -O3 the centring Sub sits in an elementwise group, and onnxruntime fused the inlined
    # norm into a LayerNormalization of the float32 input behind the Cast, which it refused
    # to load ("bound to different types").
    proto = onnx.parser.parse_model(NORM)
    proto.graph.initializer.extend([
        onnx.numpy_helper.from_array(np.array(2.0001, np.float32), "p"),
        onnx.numpy_helper.from_array(np.array(1e-5, np.float32), "eps")])
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, level=3, target="cpu", precision="fp16"), path)
    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal((2, 4, 8)).astype(np.float32) for name in ("x", "skip")}
    with graphopt.load(path) as session:  # it loads and runs (float16 squares d exactly,
        y = session.run(feeds)["y"]       # where float32's d^2.0001 of a negative d is NaN)
    expected = numerics.run(proto, feeds)["y"]
    assert y.shape == expected.shape
    finite = np.isfinite(expected)
    np.testing.assert_allclose(y[finite], expected[finite], atol=0.02, rtol=0.02)


def test_a_mean_pool_head_leaves_onnxruntimes_norm_fusions_on():
    # The keepdims=0 rule switched every norm fusion off for an ordinary mean-pooled head
    # (ReduceMean without keepdims, then a bias), which no fusion misreads: 1.5× slower.
    from graphopt.codegen.split import disabled_optimizers
    from graphopt.ir import load_onnx

    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,6,8] x) => (float[2,8] y) {
          h = MatMul (x, w)
          p = ReduceMean <axes = [1], keepdims = 0> (h)
          y = Add (p, b)
        }""")
    rng = np.random.default_rng(0)
    proto.graph.initializer.extend([
        onnx.numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
        onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")])
    model = load_onnx(proto)
    assert disabled_optimizers(model, "all") is None


# -- onnxruntime optimizers the .om's partitions switch off --------------------------------------

def _q_model(opset, zero_dtype, const_input=False):
    """QuantizeLinear → DequantizeLinear of x (or of a constant) at `opset`, zero point typed
    `zero_dtype`, added back to x."""
    src = "c" if const_input else "x"
    proto = onnx.parser.parse_model(f"""<ir_version: 10, opset_import: ["" : {opset}]>
        g (float[1, 8] x) => (float[1, 8] y) {{
          q = QuantizeLinear ({src}, s, z)
          d = DequantizeLinear (q, s, z)
          y = Add (d, x)
        }}""")
    proto.graph.initializer.extend([
        onnx.numpy_helper.from_array(np.float32(0.1), "s"),
        onnx.numpy_helper.from_array(np.array(0, zero_dtype), "z"),
        onnx.numpy_helper.from_array(np.ones((1, 8), np.float32), "c")])
    return load_onnx(proto)


@pytest.mark.parametrize("opset, zero, const, expected", [
    (21, np.int8, False, True), (20, np.int8, False, False), (21, np.uint8, False, False),
    (21, np.int8, True, False)])
def test_qdq_propagation_is_off_for_a_signed_activation_quantize_at_opset_21(opset, zero, const,
                                                                            expected):
    # onnxruntime's QDQ propagation at opset 21 turns a signed activation quantize into one
    # whose int8 output meets a uint8 zero point: the partition would not load.
    from graphopt.codegen.split import disabled_optimizers
    found = disabled_optimizers(_q_model(opset, zero, const), "all") or []
    assert ("QDQPropagationTransformer" in found) == expected


NORM3 = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 4, 8] x) => (float[2, 4, 8] y) {
      m = ReduceMean <axes = [-1]> (x)
      d = Sub (x, m)
      d2 = Pow (d, p)
      READ
      e = Add (v, eps)
      s = Sqrt (e)
      y = Div (d, s)
    }"""


@pytest.mark.parametrize("read, off", [
    ("d3 = Dropout (d2)\n      v = ReduceMean <axes = [-1]> (d3)", True),
    ("d3 = Cast <to = 1> (d2)\n      v = ReduceMean <axes = [-1]> (d3)", True),
    ("d3 = Cast <to = 11> (d2)\n      d4 = Cast <to = 1> (d3)\n      v = ReduceMean <axes = [-1]> (d4)", False),
])
def test_a_cube_reaching_the_variance_through_what_onnxruntime_drops(read, off):
    # Dropout and a Cast to the same type are gone by the time onnxruntime's LayerNorm fusions
    # look, so a Pow of 3 they pass on to the mean is still a variance to them; a Cast
    # through double is not (types inferred first: unknown dtypes would compare equal).
    from graphopt.codegen.split import disabled_optimizers
    proto = onnx.parser.parse_model(NORM3.replace("READ", read))
    proto.graph.initializer.extend([onnx.numpy_helper.from_array(np.float32(3), "p"),
                                    onnx.numpy_helper.from_array(np.float32(1e-5), "eps")])
    from graphopt.passes.infer_shapes import infer_shapes
    model = load_onnx(proto)
    infer_shapes(model)
    found = disabled_optimizers(model, "all") or []
    assert ("LayerNormFusionL2" in found) == off


@pytest.mark.parametrize("read", ["Dropout", "Cast <to = 1>"])
def test_a_cube_through_dropout_or_same_cast_is_not_misfused_end_to_end(tmp_path, read):
    proto = onnx.parser.parse_model(NORM3.replace(
        "READ", f"d3 = {read} (d2)\n      v = ReduceMean <axes = [-1]> (d3)"))
    proto.graph.initializer.extend([onnx.numpy_helper.from_array(np.float32(3), "p"),
                                    onnx.numpy_helper.from_array(np.float32(1e-5), "eps")])
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)}
    expected = numerics.run(proto, feeds)
    path = tmp_path / "m.om"
    graphopt.save(graphopt.optimize(proto, level=0, target="cpu"), path)
    with graphopt.load(path) as session:
        np.testing.assert_allclose(session.run(feeds)["y"], expected["y"], rtol=1e-5, atol=1e-6)


def test_a_partition_with_float16_weights_runs_at_all(tmp_path):
    # onnxruntime's CPU provider has no float16 MatMul kernel: it casts the weight to float32
    # in front of its float32 one, a Cast only "all" folds once. Below it the weight was cast
    # at every run: a float16 MatMul chain's .om ran 20.6 ms against the original's 7.5 ms.
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 64])], [weight])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = compile_cli(proto, tmp_path, "-O2")
    (part,) = load_om(path).partitions
    assert part.optimization_level == "all"
    folded = numerics.optimized_by_onnxruntime(part.model, "all").graph.node
    assert not any(n.op_type == "Cast" and n.input[0] == "w" for n in folded)
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float16)}
    assert not numerics.compare(numerics.run(proto, feeds),
                                OmSession(path).run(feeds), 0, 0)
