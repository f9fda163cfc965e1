"""ConvertPrecision: fp16/bf16 and mixed modes, Casts at region boundaries only, user lists,
target refusal, dtype-sensitive inputs, zoo models through onnxruntime, and the CLI flags."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import IR_VERSION, ops, parse_model, run_cli

import graphopt
from graphopt import numerics, zoo
from graphopt.errors import ArtifactError, OptionError
from graphopt.ir import DType
from graphopt.tools.metrics import cosine_similarity

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((8, 8)).astype(np.float32)
W2 = RNG.standard_normal((8, 8)).astype(np.float32)
CHAIN = """
g (float[2,8] x) => (float[2,8] y) {
  a = MatMul(x, w1)
  r = Relu(a)
  s = Softmax(r)
  y = MatMul(s, w2)
}"""


def compile_(proto, level=1, **options):
    return graphopt.optimize(proto, level=level, pass_options=options)


def checked(result, proto, atol):
    """The compiled model passes onnx.checker, loads in onnxruntime at both ends of its
    optimization levels, and matches the float32 original within `atol`."""
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    feeds = numerics.random_feeds(proto, seed=1)
    expected = numerics.run(proto, feeds)
    for level in ("disable", "all"):
        actual = numerics.run(out, feeds, level=level)
        for name, value in expected.items():
            assert actual[name].dtype == value.dtype  # the signature keeps float32
            np.testing.assert_allclose(actual[name], value, atol=atol, rtol=0)
    return out


def dtypes(result) -> dict[str, str]:
    return {n.name or n.output.name: n.output.dtype.short for n in result.model.graph}


def stats(result) -> dict:
    return dict(result.log.totals()["ConvertPrecision"]["rewrites"])


def test_mixed_keeps_softmax_float32_with_casts_only_at_the_four_boundaries():
    proto = parse_model(CHAIN, w1=W1, w2=W2)
    result = compile_(proto, precision="mixed-fp16")
    assert ops(result.model) == ["Cast", "MatMul", "Relu", "Cast", "Softmax", "Cast", "MatMul",
                                 "Cast"]
    kinds = {n.output.name: n.output.dtype for n in result.model.graph}
    assert kinds["a"] == kinds["r"] == DType.FLOAT16 and kinds["s"] == DType.FLOAT
    assert stats(result) == {"nodes_converted": 3, "casts_inserted": 4, "weights_converted": 2}
    # Weights are converted offline: float16 initializers, no Cast reads one.
    inits = result.model.graph.initializers.values()
    assert sorted(v.dtype.short for v in inits) == ["f16", "f16"]
    out = checked(result, proto, atol=0.05)
    assert [o.name for o in out.graph.output] == ["y"]


def test_fp16_converts_every_op_and_casts_only_the_model_boundary():
    proto = parse_model(CHAIN, w1=W1, w2=W2)
    result = compile_(proto, precision="fp16")
    assert ops(result.model).count("Cast") == 2
    assert stats(result)["nodes_converted"] == 4
    # onnxruntime's CPU provider runs these float16 ops in float32 behind its own Casts.
    assert any("no float16 kernel for MatMul" in n for n in result.notes)
    checked(result, proto, atol=0.05)


def test_the_cast_back_to_float32_keeps_the_outputs_doc_string_and_metadata():
    proto = parse_model(CHAIN, w1=W1, w2=W2)
    proto.graph.output[0].doc_string = "the scores"
    proto.graph.output[0].metadata_props.add(key="unit", value="logit")
    written = compile_(proto, precision="fp16").to_onnx()
    (out,) = written.graph.output
    assert out.doc_string == "the scores"
    assert {p.key: p.value for p in out.metadata_props} == {"unit": "logit"}
    onnx.checker.check_model(written)


def test_one_cast_per_value_is_shared_by_its_consumers():
    proto = parse_model("""
    g (float[2,8] x) => (float[2,8] y) {
      a = MatMul(x, w1)
      b = MatMul(x, w2)
      y = Add(a, b)
    }""", w1=W1, w2=W2)
    result = compile_(proto, precision="fp16")
    casts = [n for n in result.model.graph if n.op_type == "Cast"]
    assert len(casts) == 2 and len(casts[0].output.uses) == 2
    checked(result, proto, atol=0.05)


def test_a_widening_cast_met_by_a_narrowing_one_cancels():
    proto = parse_model("""
    g (float16[2,8] x) => (float[2,8] y) {
      xf = Cast<to=1>(x)
      y = MatMul(xf, w1)
    }""", w1=W1)
    # mixed: the Cast stays float32 and MatMul's Cast back to float16 cancels with it.
    result = compile_(proto, precision="mixed-fp16")
    assert ops(result.model) == ["MatMul", "Cast"]
    assert stats(result)["casts_removed"] == 2
    checked(result, proto, atol=0.05)
    # fp16: the Cast itself converts, to float16 from float16, and goes.
    result = compile_(proto, precision="fp16")
    assert ops(result.model) == ["MatMul", "Cast"]
    assert stats(result)["casts_removed"] == 1
    checked(result, proto, atol=0.05)


def test_keep_dtype_and_precision_deny_pin_nodes():
    proto = parse_model("""
    g (float[2,8] x) => (float[2,8] y) {
      a = MatMul(x, w1)
      r = Relu(a)
      y = MatMul(r, w2)
    }""", w1=W1, w2=W2)
    proto.graph.node[0].name, proto.graph.node[2].name = "first", "second"
    kept = compile_(proto, precision="fp16", keep_dtype={"second"})
    assert dtypes(kept)["first"] == "f16" and dtypes(kept)["second"] == "f32"
    checked(kept, proto, atol=0.05)
    denied = compile_(proto, precision="mixed-fp16", precision_deny={"Relu"})
    assert [n.output.dtype.short for n in denied.model.graph if n.op_type == "Relu"] == ["f32"]
    allowed = compile_(parse_model(CHAIN, w1=W1, w2=W2), precision="mixed-fp16",
                       precision_allow={"Softmax"})
    assert "Cast" not in ops(allowed.model)[1:-1]  # Softmax joins the half region


def test_op_lists_take_contrib_ops_as_domain_and_op_or_bare():
    # graphopt's messages name a contrib op `com.microsoft::FastGelu`; the lists accept that too.
    proto = parse_model("""
    g (float[2,8] x) => (float[2,8] y) {
      a = MatMul(x, w1)
      f = com.microsoft.FastGelu(a)
      y = MatMul(f, w2)
    }""", header='<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n', w1=W1, w2=W2)
    # ONNX's shape inference cannot type a contrib op's output: the exporter's value_info does.
    proto.graph.value_info.append(onnx.helper.make_tensor_value_info("f", onnx.TensorProto.FLOAT,
                                                                     [2, 8]))
    for spelling in ("com.microsoft::FastGelu", "FastGelu"):
        denied = compile_(proto, precision="fp16", precision_deny={spelling})
        assert [n.output.dtype.short for n in denied.model.graph
                if n.op_type in ("MatMul", "FastGelu")] == ["f16", "f32", "f16"]
        allowed = compile_(proto, precision="mixed-fp16", precision_deny={"MatMul"},
                           precision_allow={spelling})
        assert [n.output.dtype.short for n in allowed.model.graph
                if n.op_type in ("MatMul", "FastGelu")] == ["f32", "f16", "f32"]
        assert not any("matches nothing" in n for n in denied.notes + allowed.notes)
        checked(denied, proto, atol=0.05)
    # bf16 refuses nothing once every op the cpu target lacks is denied, however it is spelled.
    kept = compile_(proto, precision="bf16", precision_deny={"MatMul", "com.microsoft::FastGelu"})
    assert "Cast" not in ops(kept.model)


def test_fp16_keeps_data_movement_between_float32_ops_float32():
    # A Reshape or Transpose converted between two float32 ops would round their value to
    # float16 and Cast it back for nothing: it follows its input instead.
    proto = parse_model("""
    g (float[2,8] x) => (float[4,4] y) {
      s = Softmax(x)
      r = Reshape(s, shape)
      t = Transpose(r)
      y = MatMul(t, w)
    }""", shape=np.array([4, 4]), w=W1[:4, :4])
    proto.graph.node[3].name = "head"
    kept = compile_(proto, precision="fp16", precision_deny={"Softmax"}, keep_dtype={"head"})
    assert ops(kept.model) == ["Softmax", "Reshape", "Transpose", "MatMul"]
    assert set(dtypes(kept).values()) == {"f32"}
    checked(kept, proto, atol=1e-6)
    # With a half input (or weights alone) they convert as before: Casts only at the model's ends.
    converted = compile_(proto, precision="fp16")
    assert ops(converted.model) == ["Cast", "Softmax", "Reshape", "Transpose", "MatMul", "Cast"]
    assert {n.op_type: n.output.dtype.short for n in converted.model.graph
            if n.op_type in ("Reshape", "Transpose")} == {"Reshape": "f16", "Transpose": "f16"}
    checked(converted, proto, atol=0.05)
    lookup = parse_model("""
    g (int64[3] ids) => (float[3,8] y) {
      rows = Gather(table, ids)
      y = MatMul(rows, w)
    }""", table=W1, w=W2)
    result = compile_(lookup, precision="fp16")
    assert ops(result.model) == ["Gather", "MatMul", "Cast"]
    assert dtypes(result)["rows"] == "f16"
    checked(result, lookup, atol=0.05)


def _residual_block() -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    return parse_model("""
    g (float[1,8,6,6] x) => (float[1,8,6,6] y) {
      a = Conv <pads = [1,1,1,1]> (x, w1)
      r = Clip(a, low, high)
      b = Conv <pads = [1,1,1,1]> (r, w2)
      s = Add(b, r)
      c = Conv <pads = [1,1,1,1]> (s, w3)
      y = Sigmoid(c)
    }""", low=np.float32(0), high=np.float32(6),
        **{f"w{i}": rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2 for i in (1, 2, 3)})


def test_elementwise_work_between_float32_ops_stays_float32():
    # A forced mode's Clips and Adds between Convs kept float32 (by --precision-deny here, by
    # Conv's schema in a bf16 compile at opset 17) each rounded an activation to half and Cast
    # it back: 97 Casts in a bf16 MobileNetV2, for no half matrix work. So does the Sigmoid
    # that writes the model's output, which the signature keeps float32.
    proto = _residual_block()
    kept = compile_(proto, precision="fp16", precision_deny={"Conv"})
    assert "Cast" not in ops(kept.model) and set(dtypes(kept).values()) == {"f32"}
    assert any("fp16: kept float32, where float16 would only round their values and Cast them back "
               "(no matrix work, fed by float32 ops alone): Add, Clip, Sigmoid (precision_allow="
               "OPS converts them)" in note for note in kept.notes), kept.notes
    checked(kept, proto, atol=1e-6)
    # --precision-allow converts them anyway, and a region that holds matrix work converts.
    allowed = compile_(proto, precision="fp16", precision_deny={"Conv"},
                       precision_allow={"Clip"})
    assert {n.op_type: n.output.dtype.short for n in allowed.model.graph
            if n.op_type in ("Clip", "Add")} == {"Clip": "f16", "Add": "f16"}
    checked(allowed, proto, atol=0.05)
    whole = compile_(proto, precision="fp16")
    assert {n.output.dtype.short for n in whole.model.graph if n.op_type != "Cast"} == {"f16"}
    # As it happens at opset 17 in bf16 for an NPU: the Convs stay float32, and what lies
    # between them with them.
    # (MergeParallelConvs off: it takes the skip `r` into the conv that reads it.)
    bf16 = graphopt.optimize(proto, target="ascend910b", precision="bf16",
                             disable_passes=["MergeParallelConvs"])
    assert {n.op_type: n.output.dtype.short for n in bf16.model.graph
            if n.op_type in ("Clip", "Add")} == {"Clip": "f32", "Add": "f32"}
    assert any("kept float32, where bfloat16 would only round" in note for note in bf16.notes)


def test_a_region_at_the_models_edge_fed_half_or_holding_a_table_still_converts():
    table = parse_model("""
    g (int64[3] ids) => (float[3,8] y) {
      y = Gather(table, ids)
    }""", table=W1)
    result = compile_(table, precision="fp16")  # half the table's bytes: worth a Cast back
    assert ops(result.model) == ["Gather", "Cast"]
    checked(result, table, atol=0.05)
    relu = parse_model("g (float[2,8] x) => (float[2,8] y) { y = Relu(x) }")
    assert ops(compile_(relu, precision="fp16").model) == ["Cast", "Relu", "Cast"]  # as asked
    # Also behind data movement, which stays float32 reading the float32 input: a Transpose
    # of an NHWC image had left its preprocessing float32, "fed by float32 ops".
    moved = parse_model("""
        g (float[1,4,4,3] x) => (float[1,3,4,4] y) {
            t = Transpose <perm = [0, 3, 1, 2]> (x)
            s = Sub(t, mean)
            y = Sigmoid(s)
        }""", mean=np.float32(0.5))
    assert {n.op_type: n.output.dtype.short for n in compile_(moved, precision="fp16").model.graph
            if n.op_type in ("Sub", "Sigmoid")} == {"Sub": "f16", "Sigmoid": "f16"}
    fed_half = graphopt.optimize(relu, input_fp16_nodes=["x"], precision="fp16")
    assert [(n.op_type, n.output.dtype.short) for n in fed_half.model.graph] == [
        ("Relu", "f16"), ("Cast", "f32")]


def test_bf16_on_the_cpu_target_is_refused_naming_the_ops():
    proto = parse_model(CHAIN, w1=W1, w2=W2)
    with pytest.raises(OptionError, match=r"target cpu has no bfloat16 kernel for MatMul ×2, "
                                          r"Relu, Softmax"):
        compile_(proto, precision="bf16")
    with pytest.raises(OptionError, match=r"mixed-bf16': target cpu runs none .* \(MatMul ×2\); "
                                          r"nothing would change \(mixed-fp16 converts them for "
                                          r"this target; .* such as target='ascend910b'\)"):
        compile_(proto, precision="mixed-bf16")


def test_mixed_bf16_of_host_ops_on_a_bf16_target_says_they_run_on_the_host():
    # ai.onnx Attention-23 has no ascend910b kernel: it runs on the host, which has no
    # bfloat16 kernels. The refusal had told the user to compile for ascend910b, the target
    # given.
    proto = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 23]> g (float[1,4,8] q, float[1,4,8] k, '
        'float[1,4,8] v) => (float[1,4,8] y) '
        '{ y = Attention <q_num_heads = 2, kv_num_heads = 2> (q, k, v) }')
    with pytest.raises(OptionError) as refused:
        graphopt.optimize(proto, target="ascend910b", precision="mixed-bf16")
    assert "(Attention); nothing would change (here they run on the host, which has no " \
           "bfloat16 kernels" in str(refused.value)
    assert "ascend910b'" not in str(refused.value).split("nothing would change")[1]


def test_bf16_with_the_refused_ops_denied_compiles_at_o3_for_the_cpu_target():
    # At -O3 the denied Add and the Cast back from bfloat16 before it became one elementwise
    # function; the host check judged the call as a bfloat16 op the CPU has no kernel for and
    # refused (naming graphopt::elementwise_0, which no deny list takes), though onnxruntime
    # inlines the body, whose Add is float32. Without the target the same model loaded.
    # (c varies by row: a constant over the last axis alone would go into the norm's bias.)
    proto = parse_model("""
        g (float[2,4] x) => (float[2,4] y) {
            n = LayerNormalization <axis = -1> (x, s, b)
            y = Add(n, c)
        }""", s=RNG.standard_normal(4).astype(np.float32), b=np.zeros(4, np.float32),
        c=np.arange(8, dtype=np.float32).reshape(2, 4))
    result = graphopt.optimize(proto, level=3, target="cpu", precision="bf16",
                               pass_options={"precision_deny": {"Add"},
                                             "precision_allow": {"LayerNormalization"}})
    assert "graphopt::elementwise_0" in ops(result.model)
    checked(result, proto, atol=0.05)


@pytest.mark.parametrize("opset", [13, 18])
def test_bf16_asks_for_the_kernel_of_the_models_opset(opset):
    # onnxruntime's CPU provider has a bfloat16 Pad from version 21 on: the kernel table, the
    # union over versions, said it had one, and a bf16 compile at opset 13 wrote a Pad (of a
    # Cast from integers, which converts with it) that no session loads.
    text = """
        g (int64[1,2,4,4] i) => (float[1,2,5,5] y) {
            f = Cast <to = 1> (i)
            y = Pad <mode = "constant"> (f, pads, c)
        }"""
    weights = dict(pads=np.array([0, 0, 1, 0, 0, 0, 0, 1]), c=np.float32(0.25))
    header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
    with pytest.raises(OptionError, match="target cpu has no bfloat16 kernel for Pad;"):
        compile_(parse_model(text, header, **weights), precision="bf16")
    proto = parse_model(text, header.replace(str(opset), "21"), **weights)
    checked(compile_(proto, precision="bf16"), proto, atol=0)


def conv_then(activation: str) -> onnx.ModelProto:
    """A 3×3 Conv followed by `activation`, at opset 17."""
    return parse_model(f"""
        g (float[1,8,8,8] x) => (float[1,8,8,8] y) {{
          c = Conv <pads = [1, 1, 1, 1]> (x, w)
          y = {activation}(c)
        }}""", w=RNG.standard_normal((8, 8, 3, 3)).astype(np.float32))


def test_ops_whose_schema_lacks_bfloat16_stay_float32_with_a_note():
    # ONNX's Conv admits bfloat16 only from opset 22: at 17 it stays float32, and says so.
    result = graphopt.optimize(conv_then("Relu"), target="ascend910b", precision="bf16")
    assert any("bf16: kept float32, their ONNX schema at opset 17 has no bf16: Conv" in note
               for note in result.notes)


@pytest.mark.parametrize("mode", ["bf16", "mixed-bf16"])
def test_bf16_before_opset_13_stays_float32_with_a_note(mode):
    # At opset 12 no Cast takes bfloat16, so converting the GELU that graphopt fuses into
    # com.microsoft::Gelu (whose schema takes it) left Casts onnx.checker refuses.
    gelu = parse_model("""
        g (float[1, 64] x) => (float[1, 64] y) {
          d = Div (x, sqrt2)
          e = Erf (d)
          e1 = Add (e, one)
          m = Mul (x, e1)
          y = Mul (m, half)
        }""", header='<ir_version: 7, opset_import: ["" : 12]>\n', sqrt2=np.float32(2 ** 0.5),
        one=np.float32(1), half=np.float32(0.5))
    result = graphopt.optimize(gelu, target="ascend910b", precision=mode)
    assert any(f"{mode}: kept float32: a Cast to or from bfloat16 takes opset 13, and the "
               "model imports opset 12" in note for note in result.notes), result.notes
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    assert not any(n.op_type == "Cast" for n in out.graph.node)


def test_an_allowed_op_whose_schema_lacks_the_half_type_is_named_too():
    pools = parse_model("""
        g (float[1,3,8,8] x) => (float[1,3,4,4] y) {
          m = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x)
          y = Relu(m)
        }""")
    result = graphopt.optimize(pools, target="ascend910b", precision="mixed-bf16",
                               pass_options={"precision_allow": {"MaxPool"}})
    assert any("mixed-bf16: kept float32, their ONNX schema at opset 17 has no bf16: MaxPool"
               in note for note in result.notes), result.notes
    # Without the allow list, mixed precision has nothing to start from: said, not silent.
    for mode, target in (("mixed-bf16", "ascend910b"), ("mixed-fp16", "cpu")):
        notes = graphopt.optimize(pools, target=target, precision=mode).notes
        assert any(note.startswith("ConvertPrecision converted nothing: mixed precision starts "
                                   "from Conv, ConvTranspose, MatMul") for note in notes), notes
    ints = parse_model("g (int64[4] x) => (int64[4] y) { y = Add(x, x) }")
    notes = graphopt.optimize(ints, precision="fp16").notes
    assert "ConvertPrecision converted nothing: the model has no float32 op that converts " \
           "(apart from any keep_dtype and precision_deny keep float32)" in notes, notes
    halves = parse_model("g (float16[2, 4] x) => (float16[2, 4] y) { y = Relu(x) }")
    assert "ConvertPrecision converted nothing: no op computes in float32 (the model computes " \
           "in float16 already)" in graphopt.optimize(halves, precision="mixed-fp16").notes
    doubles = parse_model("g (double[2, 4] x) => (double[2, 4] y) { y = Relu(x) }")
    assert "1 op(s) compute in float64, which no precision mode converts" in \
        " ".join(graphopt.optimize(doubles, precision="fp16").notes)
    # A compile that converts something, or says why not otherwise, has no such note.
    assert not any("converted nothing" in n for n in graphopt.optimize(
        conv_then("Relu"), target="ascend910b", precision="bf16").notes)


def test_bf16_npu_partitions_need_the_device_provider(tmp_path):
    proto = parse_model("g (float[2,8] x) => (float[2,8] y) { m = MatMul(x, w) y = Sigmoid(m) }",
                        w=W1)
    result = graphopt.optimize(proto, target="ascend910b", precision="bf16")
    assert any("the NPU partitions run where the CANN provider is installed" in note
               for note in result.notes)
    graphopt.save(result, tmp_path / "bf16.om")
    if "CANNExecutionProvider" in ort.get_available_providers():
        pytest.skip("the CANN provider runs the partition")
    with pytest.raises(ArtifactError, match="the CPU provider stands in for "
                                            "CANNExecutionProvider, which is not installed"):
        graphopt.load(tmp_path / "bf16.om")


def test_a_bf16_op_the_cpu_provider_expands_into_ops_without_bf16_is_its_gap(tmp_path):
    # onnxruntime's CPU provider has no bfloat16 Clip kernel and expands Clip's function body,
    # whose Where (opset 9) takes no bfloat16: a type error the compile took for its own bug.
    proto = parse_model("""
        g (float[1, 16] x) => (float[1, 16] y) {
          m = MatMul (x, w)
          y = Clip (m, lo, hi)
        }""", header='<ir_version: 8, opset_import: ["" : 13]>\n',
        w=RNG.standard_normal((16, 16)).astype(np.float32), lo=np.float32(-1),
        hi=np.float32(1))
    result = graphopt.optimize(proto, target="ascend910b", precision="bf16")
    assert any("the NPU partitions run where the CANN provider is installed" in note
               for note in result.notes)
    onnx.checker.check_model(result.to_onnx(), full_check=True)
    graphopt.save(result, tmp_path / "clip.om")


def test_pins_that_match_nothing_are_named_in_a_note():
    proto = parse_model(CHAIN, w1=W1, w2=W2)
    result = graphopt.optimize(proto, level=1, precision="mixed-fp16", pass_options={
        "keep_dtype": {"no_such_node"}, "precision_deny": {"Softmx"}})
    note = next(n for n in result.notes if "names nothing" in n)
    assert "keep_dtype 'no_such_node' names nothing in the model" in note
    assert "precision_deny 'Softmx' (nearest: 'Softmax') matches no op" in note
    # A node of the model that a fusion renamed: that is the cause given, with the new name.
    result = graphopt.optimize(zoo.build("tiny"), precision="fp16", pass_options={
        "keep_dtype": {"/bn1/BatchNormalization"}})
    assert "ConvertPrecision: keep_dtype '/bn1/BatchNormalization' (nearest: " \
        "'/bn1/BatchNormalization/ConvBatchNorm/Conv') matches nothing in the optimized " \
        "graph, whose fused nodes have new names (dump_dir shows the names)" in result.notes, \
        result.notes
    # Op types alone: the graph has no such op, which says nothing of renamed nodes.
    result = graphopt.optimize(proto, level=1, precision="fp16", pass_options={
        "precision_deny": {"Gemm"}})
    assert "ConvertPrecision: precision_deny 'Gemm' matches no op of the optimized graph (a " \
        "fusion may have taken it in: dump_dir shows the graph)" in result.notes, result.notes


def test_a_kept_softmax_keeps_the_attention_that_computes_it():
    # FuseAttention takes the Softmax into MultiHeadAttention: keeping the op type float32
    # (ATC's --keep_dtype OpType::Softmax) keeps the fused attention float32, with a note.
    proto = zoo.build("gpt2_small", layers=2, hidden=64, heads=2, vocab=100, positions=32)
    options = {"precision": "mixed-fp16", "target": "ascend910b",
               "input_shapes": {"input_ids": [1, 8]}}
    half = graphopt.optimize(proto, **options)
    kept = graphopt.optimize(proto, **options, pass_options={"precision_deny": {"Softmax"}})
    for result, dtype in ((half, "f16"), (kept, "f32")):
        attention = [n for n in result.model.graph if n.op_type == "MultiHeadAttention"]
        assert len(attention) == 2 and {n.inputs[0].dtype.short for n in attention} == {dtype}
    assert "com.microsoft::MultiHeadAttention ×2 kept in their dtype: they compute Softmax " \
        "inside" in " ".join(kept.notes), kept.notes
    assert not any("matches nothing" in note for note in kept.notes), kept.notes
    feeds = numerics.random_feeds(proto, seed=2, dims={"batch_size": 1, "sequence_length": 8})
    want = numerics.run(proto, feeds)["logits"]
    got = numerics.run(kept.to_onnx(), feeds)["logits"]
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("denied", ["ReduceMean", "Pow", "Sqrt", "Div"])
def test_a_denied_statistic_keeps_the_layernorm_fused_from_it(denied):
    # fp16 with --precision-deny of the decomposed LayerNorm's ops as the export shows them:
    # the LayerNormalization FuseLayerNorm made of them converted, the deny "matching nothing".
    rng = np.random.default_rng(0)
    proto = parse_model("""
        g (float[2,16] x) => (float[2,16] y) {
            m = ReduceMean <axes = [-1]> (x)
            d = Sub(x, m)
            p = Pow(d, two)
            v = ReduceMean <axes = [-1]> (p)
            e = Add(v, eps)
            s = Sqrt(e)
            n = Div(d, s)
            g = Mul(n, gamma)
            y = Add(g, beta)
        }""", two=np.float32(2), eps=np.float32(1e-5),
        gamma=rng.standard_normal(16).astype(np.float32),
        beta=rng.standard_normal(16).astype(np.float32))
    result = graphopt.optimize(proto, precision="fp16", pass_options={"precision_deny": {denied}})
    (norm,) = [n for n in result.model.graph if n.op_type == "LayerNormalization"]
    assert norm.inputs[0].dtype.short == "f32"
    assert f"LayerNormalization kept in their dtype: they compute {denied} inside" in \
        " ".join(result.notes), result.notes
    assert not any("match" in note and "nothing" in note for note in result.notes)


def test_dtype_sensitive_inputs_and_attributes():
    # Resize's scales are tensor(float) in every opset: they stay float32. Cast's `to` and
    # ConstantOfShape's value follow the converted output; Clip's min/max follow T.
    proto = parse_model("""
    g (float[1,1,2,2] x, int64[4] shape, int64[1,1,4,4] k) => (float[1,1,4,4] y) {
      up = Resize<mode="nearest">(x, roi, scales)
      c = Clip(up, lo, hi)
      z = ConstantOfShape<value=float[1] {0.5}>(shape)
      kf = Cast<to=1>(k)
      s = Add(c, z)
      y = Add(s, kf)
    }""", roi=np.zeros(0, np.float32), scales=np.array([1, 1, 2, 2], np.float32),
        lo=np.float32(-0.5), hi=np.float32(0.5))
    result = compile_(proto, precision="fp16")
    graph = result.model.graph
    resize = next(n for n in graph if n.op_type == "Resize")
    assert resize.input(2).dtype == DType.FLOAT and resize.output.dtype == DType.FLOAT16
    cast = next(n for n in graph if n.op_type == "Cast" and n.input(0).name == "k")
    assert cast.attr("to") == DType.FLOAT16
    fill = next(n for n in graph if n.op_type == "ConstantOfShape")
    assert fill.attr("value").dtype == DType.FLOAT16
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    feeds = {"x": RNG.standard_normal((1, 1, 2, 2)).astype(np.float32),
             "shape": np.array([1, 1, 4, 4]), "k": np.ones((1, 1, 4, 4), np.int64)}
    np.testing.assert_allclose(numerics.run(out, feeds)["y"], numerics.run(proto, feeds)["y"],
                               atol=2e-3)


def test_outputs_typed_by_a_default_attribute_follow_the_conversion():
    # ConstantOfShape without `value` makes float32 zeros; the window ops' output_datatype
    # defaults to float32: each gets the half dtype spelled out, or the model is invalid.
    proto = parse_model("""
    g (float[N,3] x) => (float[N,3] y) {
      s = Shape(x)
      z = ConstantOfShape(s)
      y = Add(z, x)
    }""")
    result = compile_(proto, precision="fp16")
    fill = next(n for n in result.model.graph if n.op_type == "ConstantOfShape")
    assert fill.attr("value").dtype == DType.FLOAT16
    checked(result, proto, atol=2e-3)


@pytest.mark.parametrize("op, text, opset, weights", [
    ("HannWindow", "g (int64 n, float[10] x) => (float[10] y) { w = HannWindow(n)\n "
                   "y = Mul(w, x) }", 17, {}),
    ("RandomUniform", "g (float[10] x) => (float[10] y) { w = RandomUniform<shape=[10], "
                      "seed=1.0>()\n y = Mul(w, x) }", 17, {}),
    ("EyeLike", "g (int32[10,10] i, float[10,10] x) => (float[10,10] y) { "
                "w = EyeLike<dtype=1>(i)\n y = Mul(w, x) }", 22, {}),
    ("ScatterND", "g (float[10] x, int64[2,1] idx, float[2] u) => (float[10] y) { "
                  "y = ScatterND<reduction=\"add\">(x, idx, u) }", 18,
     {"idx": np.array([[1], [3]], np.int64)}),
    ("ScatterElements", "g (float[10] x, int64[2] idx, float[2] u) => (float[10] y) { "
                        "y = ScatterElements<reduction=\"max\", axis=0>(x, idx, u) }", 18,
     {"idx": np.array([1, 3], np.int64)}),
])
def test_ops_onnxruntime_runs_only_in_float32_are_refused_in_fp16_kept_in_mixed(op, text, opset,
                                                                               weights):
    # onnxruntime cannot wrap these in Casts: the output dtype comes from an attribute (its
    # kernel is looked up by it), or the half kernel refuses the reduction when it runs.
    proto = parse_model(text, header=f'<ir_version: 8, opset_import: ["" : {opset}]>\n',
                        **weights)
    with pytest.raises(OptionError, match=f"target cpu has no float16 kernel for {op}"):
        compile_(proto, precision="fp16")
    mixed = compile_(proto, precision="mixed-fp16", precision_allow={"Mul"})
    assert next(n for n in mixed.model.graph if n.op_type == op).outputs[0].dtype == DType.FLOAT
    onnx.checker.check_model(mixed.to_onnx(), full_check=True)


def test_an_npu_keeps_float32_what_its_cpu_stand_in_refuses_in_float16(tmp_path):
    # The NPU profile lists the op in float16; onnxruntime's CPU provider, which runs the NPU
    # partitions here, registers a float16 ScatterElements that refuses a reduction when run.
    proto = parse_model("g (float[3,4] x, int64[3,2] idx, float[3,2] u) => (float[3,4] y) { "
                        "r = Relu(x)\n y = ScatterElements<reduction=\"add\", axis=1>(r, idx, u) }",
                        header='<ir_version: 8, opset_import: ["" : 18]>\n',
                        idx=np.array([[0, 1], [1, 2], [3, 3]], np.int64))
    result = graphopt.optimize(proto, target="ascend310", precision="fp16")
    scatter = next(n for n in result.model.graph.all_nodes() if n.op_type == "ScatterElements")
    assert scatter.outputs[0].dtype == DType.FLOAT
    assert any("refuses them in f16 at run time: ScatterElements" in note
               for note in result.notes), result.notes
    graphopt.save(result, tmp_path / "m.om")
    feeds = numerics.random_feeds(proto, seed=1)
    with pytest.warns(RuntimeWarning, match="functional stand-in") as caught:
        session = graphopt.load(tmp_path / "m.om")
    assert caught[0].filename == __file__  # the caller's line, not graphopt's own
    (actual,) = session.run(feeds).values()
    np.testing.assert_allclose(actual, numerics.run(proto, feeds)["y"], atol=2e-3, rtol=0)


def test_bitcast_and_classical_ml_ops_keep_their_float32():
    # BitCast reinterprets bits of one width; TreeEnsemble's split values are typed like its
    # input. Converting either gave a model onnxruntime refuses.
    bitcast = parse_model("g (float[4] x) => (int32[4] y) { r = Relu(x)\n y = BitCast<to=6>(r) }",
                          header='<ir_version: 10, opset_import: ["" : 26]>\n')
    result = compile_(bitcast, precision="fp16")
    assert next(n for n in result.model.graph if n.op_type == "BitCast").input(0).dtype \
        == DType.FLOAT
    onnx.checker.check_model(result.to_onnx(), full_check=True)
    ml = parse_model("""g (float[3,2] x) => (float[3,2] y) {
        y = ai.onnx.ml.Normalizer<norm="L2">(x) }""",
                     header='<ir_version: 8, opset_import: ["ai.onnx.ml" : 3]>\n')
    out = compile_(ml, precision="fp16").to_onnx()
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Normalizer"]


def test_casts_into_a_model_of_contrib_ops_alone_bring_the_default_domain():
    proto = parse_model("g (float[2,4] x) => (float[2,4] y) { y = com.microsoft.FastGelu(x) }",
                        header='<ir_version: 8, opset_import: ["com.microsoft" : 1]>\n')
    result = compile_(proto, precision="fp16")
    assert [n.op_type for n in result.model.graph] == ["Cast", "FastGelu", "Cast"]
    checked(result, proto, atol=2e-3)


SEQUENCES = """
g (float[2,8] x) => (float[2,8] y, float[2,8] z, float[2,8] u) {
  a = MatMul(x, w1)
  b = MatMul(x, w2)
  pair = SequenceConstruct(a, b)
  second = SequenceAt(pair, one)
  y = MatMul(second, w1)
  columns = SplitToSequence<axis=1>(b)
  z = ConcatFromSequence<axis=1>(columns)
  maybe = Optional(a)
  u = OptionalGetElement(maybe)
}"""


@pytest.mark.parametrize("mode", ["fp16", "mixed-fp16"])
def test_ops_on_sequences_and_optionals_of_float_stay_float32(mode):
    # Their schemas type the container and its elements with separate parameters: converting
    # the tensor side alone wrote seq(tensor(float)) holding float16 tensors, an invalid model.
    proto = parse_model(SEQUENCES, w1=W1, w2=W2, one=np.int64(1))
    result = compile_(proto, precision=mode)
    kinds: dict[str, set] = {}
    for node in result.model.graph:
        kinds.setdefault(node.op_type, set()).add(node.output.dtype)
    assert kinds["MatMul"] == {DType.FLOAT16}
    for op in ("SequenceAt", "ConcatFromSequence", "OptionalGetElement"):
        assert kinds[op] == {DType.FLOAT}
    checked(result, proto, atol=0.05)


def _sequence_map(body_op: str) -> onnx.ModelProto:
    """ys = SequenceMap(xs, y) with the body Mul(`body_op`(e), e2), and their concatenation."""
    from onnx import TensorProto as T
    from onnx import helper as h

    body = h.make_graph([h.make_node(body_op, ["e"], ["r0"]), h.make_node("Mul", ["r0", "e2"], ["r"])],
                        "body", [h.make_tensor_value_info("e", T.FLOAT, None),
                                 h.make_tensor_value_info("e2", T.FLOAT, None)],
                        [h.make_tensor_value_info("r", T.FLOAT, None)])
    graph = h.make_graph(
        [h.make_node("SequenceMap", ["xs", "y"], ["ys"], body=body),
         h.make_node("ConcatFromSequence", ["ys"], ["cat"], axis=1)], "g",
        [h.make_tensor_sequence_value_info("xs", T.FLOAT, [2, "n"]),
         h.make_tensor_value_info("y", T.FLOAT, [2, 1])],
        [h.make_tensor_value_info("cat", T.FLOAT, [2, "m"])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=IR_VERSION)


def test_a_sequence_map_body_gets_no_contrib_op_from_the_fusions():
    # FuseGelu's Silu rule made the body's x·Sigmoid(x) a com.microsoft::QuickGelu, which
    # onnxruntime has no float16 kernel for: expanded inside the expanded body, the fp16 .om
    # did not load.
    from onnx import TensorProto as T
    from onnx import helper as h

    body = h.make_graph([h.make_node("Sigmoid", ["e"], ["s"]), h.make_node("Mul", ["e", "s"], ["r"])],
                        "body", [h.make_tensor_value_info("e", T.FLOAT, None)],
                        [h.make_tensor_value_info("r", T.FLOAT, None)])
    graph = h.make_graph(
        [h.make_node("SequenceMap", ["xs"], ["ys"], body=body),
         h.make_node("ConcatFromSequence", ["ys"], ["cat"], axis=1)], "g",
        [h.make_tensor_sequence_value_info("xs", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("cat", T.FLOAT, [2, 6])])
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=IR_VERSION)
    feeds = {"xs": [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]}
    for level in (2, 3):
        result = compile_(proto, level=level, precision="fp16")
        body_ops = [n.op_type for n in next(iter(result.model.graph)).subgraphs()[0]]
        assert "QuickGelu" not in body_ops, body_ops
        np.testing.assert_allclose(numerics.run(result.to_onnx(), feeds)["cat"],
                                   numerics.run(proto, feeds)["cat"], rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("body_op", ["Relu", "Softmax", "Sigmoid"])
def test_a_sequence_map_body_keeps_what_onnxruntime_would_expand_in_half(body_op, tmp_path,
                                                                         capsys):
    # onnxruntime runs SequenceMap by expanding its body, and an op it has no float16 kernel
    # for there (Relu, Softmax) it expands from its own function body, nested: the fp16 .om
    # did not load ("Nodes in a graph must be topologically sorted"), blamed on the input.
    proto = _sequence_map(body_op)
    source = tmp_path / "m.onnx"
    onnx.save(proto, source)
    rng = np.random.default_rng(0)
    feeds = {"xs": [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)],
             "y": rng.standard_normal((2, 1)).astype(np.float32)}
    expected = numerics.run(proto, feeds)["cat"]
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "m.om", "--precision",
                         "fp16")
    if body_op == "Sigmoid":  # onnxruntime has a float16 Sigmoid: converted
        assert rc == 0, err
    else:
        assert rc == 1 and f"no float16 kernel for {body_op} (inside SequenceMap)" in err, err
    # mixed keeps such an op float32, and the accuracy report takes a sequence input (it had
    # ended the compile in an internal error after writing the model).
    rc, out, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "m.om", "--precision",
                           "mixed-fp16")
    assert rc == 0 and "internal error" not in err and "accuracy vs" in out, err
    actual = graphopt.load(tmp_path / "m.om").run(feeds)["cat"]
    np.testing.assert_allclose(actual, expected, rtol=2e-3, atol=2e-3)


# op: (the node reading the Conv's output c, opset).
NORMALIZATIONS = {
    "RMSNormalization": ("RMSNormalization(c, scale)", 23),
    "LRN": ("LRN<size=3>(c)", 17),
    "InstanceNormalization": ("InstanceNormalization(c, scale, bias)", 17),
    "GroupNormalization": ("GroupNormalization<num_groups=2>(c, scale, bias)", 21),
}


@pytest.mark.parametrize("op", NORMALIZATIONS)
def test_mixed_keeps_every_normalization_float32(op):
    call, opset = NORMALIZATIONS[op]
    header = f'<ir_version: {10 if opset >= 23 else 8}, opset_import: ["" : {opset}]>\n'
    proto = parse_model(f"""
    g (float[1,4,4,4] x) => (float[1,4,4,4] y) {{
      c = Conv(x, w)
      y = {call}
    }}""", header=header, w=RNG.standard_normal((4, 4, 1, 1)).astype(np.float32),
        scale=(RNG.random(4) + 0.5).astype(np.float32), bias=W1[0, :4], mean=W1[1, :4],
        var=(RNG.random(4) + 0.5).astype(np.float32))
    result = compile_(proto, precision="mixed-fp16")
    assert ops(result.model) == ["Cast", "Conv", "Cast", op]
    assert dtypes(result)["y"] == "f32"
    checked(result, proto, atol=0.02)


def test_mixed_lets_an_inference_batchnorm_follow_its_conv():
    # Stored moments: a per-channel scale and shift, no statistics to lose. A standalone one
    # (FuseConvBatchNorm folds it at -O2, not at the -O1 these tests compile at) stays in half
    # with its Conv rather than making a float32 island with two Casts.
    proto = parse_model("""
    g (float[1,4,4,4] x) => (float[1,4,4,4] y) {
      c = Conv(x, w)
      y = BatchNormalization(c, scale, bias, mean, var)
    }""", w=RNG.standard_normal((4, 4, 1, 1)).astype(np.float32),
        scale=(RNG.random(4) + 0.5).astype(np.float32), bias=W1[0, :4], mean=W1[1, :4],
        var=(RNG.random(4) + 0.5).astype(np.float32))
    result = compile_(proto, precision="mixed-fp16")
    assert ops(result.model) == ["Cast", "Conv", "BatchNormalization", "Cast"]
    checked(result, proto, atol=0.02)


def test_constants_beyond_the_float16_range_are_clipped_not_infinite():
    proto = parse_model("""
    g (float[2,8] x, bool[2,8] m) => (float[2,8] y) {
      a = MatMul(x, w1)
      y = Where(m, a, big)
    }""", w1=W1, big=np.float32(-3.4e38))
    result = compile_(proto, precision="fp16")
    assert any("1 constant element(s) beyond the f16 range clipped to its largest finite "
               "value (in big)" in n for n in result.notes), result.notes
    out = result.to_onnx()
    feeds = {"x": np.ones((2, 8), np.float32), "m": np.zeros((2, 8), np.bool_)}
    assert np.all(numerics.run(out, feeds)["y"] == -65504.0)


def test_a_constant_the_models_own_cast_narrows_overflows_as_that_cast_does():
    # Cast(70000 → float16) is inf in the model; a weight copy clipped to 65504 made y 65505.
    # The same constant read by a converted Add keeps the clipped copy.
    # A Cast to another type (int32 here) reads the clipped copy, as before: the unclipped
    # one's inf had become INT32_MIN.
    proto = parse_model("""
    g (float[2] x) => (float[2] y, float[2] z, int32[2] n) {
      h = Cast<to=10>(big)
      f = Cast<to=1>(h)
      y = Add(x, f)
      z = Add(x, big)
      n = Cast<to=6>(big)
    }""", big=np.float32([70000.0, -70000.0]))
    result = compile_(proto, precision="fp16")
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    got = numerics.run(out, {"x": np.ones(2, np.float32)}, level="disable")
    np.testing.assert_array_equal(got["y"], [np.inf, -np.inf])
    # onnxruntime adds in float32 where its CPU provider lacks the float16 kernel: 65504 ± 1
    np.testing.assert_allclose(got["z"], [65505.0, -65503.0], atol=32)
    np.testing.assert_array_equal(got["n"], [65504, -65504])


@pytest.mark.parametrize("mode", ["fp16", "mixed-fp16"])
def test_weights_below_the_float16_range_are_named_when_they_vanish(mode):
    # A weight initialized at 1e-10 (BLIP's default init range) is all zeros in float16: the
    # output became the LayerNorm's bias, exit 0, and no word said why.
    proto = parse_model("""
    g (float[2,8] x) => (float[2,8] y, float[2,200] z) {
      a = MatMul(x, tiny)
      y = LayerNormalization <epsilon = 1e-12> (a, gamma, beta)
      z = MatMul(x, w1)
    }""", tiny=(W1 * 1e-10).astype(np.float32), gamma=np.ones(8, np.float32),
        beta=np.zeros(8, np.float32),
        w1=_with_a_few_tiny_values(RNG.standard_normal((8, 200)).astype(np.float32)))
    notes = compile_(proto, precision=mode).notes
    (note,) = [n for n in notes if "below the f16 range" in n]
    # w1's one tiny value in 1,600 is too few to matter: only the vanished weight is named.
    assert note.startswith("ConvertPrecision: 1 weight(s) lost over 1% of their nonzero values "
                           "below the f16 range, now 0: 'tiny' (all); keep their readers "
                           "float32 with"), note


def _with_a_few_tiny_values(weight: np.ndarray) -> np.ndarray:
    weight = weight.copy()
    weight.flat[0] = 1e-9
    return weight


def test_tiny_fp16_through_the_whole_pipeline():
    proto = zoo.build("tiny")
    result = compile_(proto, level=2, precision="fp16")
    assert ops(result.model).count("Cast") == 2  # the image in, the logits out
    out = checked(result, proto, atol=5e-2)
    feeds, name = numerics.random_feeds(proto, seed=3), proto.graph.output[0].name
    cos = cosine_similarity(numerics.run(proto, feeds)[name], numerics.run(out, feeds)[name])
    assert cos >= 0.9999


def test_gpt2_mixed_fp16_keeps_logits_close_and_sensitive_ops_float32():
    proto = zoo.build("gpt2_small")
    # Pinned: with a symbolic sequence, attention stays unfused for the CPU (FuseAttention).
    result = graphopt.optimize(proto, level=2, input_shapes={"input_ids": [1, 16]},
                               pass_options={"precision": "mixed-fp16"})
    graph = result.model.graph
    half = {n.op_type for n in graph if n.outputs[0] is not None
            and n.output.dtype == DType.FLOAT16}
    assert {"MatMul", "MultiHeadAttention"} <= half
    assert not half & {"LayerNormalization", "SkipLayerNormalization"}
    out = result.to_onnx()
    onnx.checker.check_model(out)
    feeds = {"input_ids": RNG.integers(0, 1000, (1, 16))}
    expected = numerics.run(proto, feeds)["logits"]
    for level in ("disable", "all"):
        assert cosine_similarity(expected, numerics.run(out, feeds, level)["logits"]) >= 0.999


def test_options_are_checked_before_anything_runs():
    proto = parse_model(CHAIN, w1=W1, w2=W2)
    with pytest.raises(OptionError, match="precision='fp8': unknown mode"):
        compile_(proto, precision="fp8")
    with pytest.raises(OptionError, match="adjust a precision mode"):
        compile_(proto, keep_dtype={"first"})
    with pytest.raises(OptionError, match="precision_allow and precision_deny both name Relu"):
        compile_(proto, precision="fp16", precision_allow={"Relu"}, precision_deny={"Relu"})


def test_cli_flags_compile_report_and_refuse(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(parse_model(CHAIN, w1=W1, w2=W2), src)
    out = tmp_path / "m16.onnx"
    rc, stdout, _ = run_cli(capsys, "optimize", src, "-o", out, "-O1", "--precision", "mixed-fp16",
                            "--precision-deny", "Relu")
    assert rc == 0
    assert "ConvertPrecision" in stdout and "casts_inserted=" in stdout
    assert "accuracy vs" in stdout and "cosine" in stdout
    relus = [n for n in onnx.load(out).graph.node if n.op_type == "Relu"]
    assert len(relus) == 1
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--precision", "bf16")
    assert rc == 1 and "no bfloat16 kernel for MatMul" in err
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--quantize", "int8")
    assert rc == 1 and "--quantize int8 needs --calibration" in err
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--quantize", "int4",
                         "--int4-group-size", "24")
    assert rc == 2 and "power of 2 ≥ 16" in err
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--per-tensor")
    assert rc == 1 and "--per-channel/--per-tensor applies to --quantize int8" in err
    # Flags that would change nothing: no report to skip, no name to keep.
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--no-accuracy-report")
    assert rc == 1 and "--no-accuracy-report applies to a --precision or --quantize" in err
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--precision", "fp16",
                         "--keep-dtype", "")
    assert rc == 1 and "--keep-dtype: no name given" in err
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--int4-embeddings")
    assert rc == 1 and "--int4-embeddings applies to --quantize int4" in err
    rc, _, err = run_cli(capsys, "optimize", src, "-o", out, "--int4-method", "gptq")
    assert rc == 1 and "--int4-method applies to --quantize int4" in err
    rc, stdout, _ = run_cli(capsys, "optimize", src, "-o", out, "--precision", "fp16",
                            "--no-accuracy-report")
    assert rc == 0 and "accuracy vs" not in stdout


def test_fp16_takes_castlike_which_onnxruntime_expands_from_its_function_body():
    # No CPU kernel is registered for CastLike: onnxruntime runs its body, a Cast, which has a
    # float16 kernel. -O0 keeps it (-O1 removes a CastLike to the dtype it already has).
    proto = parse_model("""
    g (float[2,8] x, float[2,8] t) => (float[2,8] y) {
      a = MatMul(x, w1)
      c = CastLike(a, t)
      y = Relu(c)
    }""", w1=W1)
    result = compile_(proto, level=0, precision="fp16")
    assert "CastLike" in ops(result.model)
    checked(result, proto, atol=0.05)


def test_ops_inference_leaves_untyped_are_named_when_they_stay_float32():
    # ONNX infers no type for onnxruntime's Inverse, nor does InferShapes: its schema cannot
    # be matched.
    proto = parse_model("""
        g (float[2, 3, 3] x) => (float[2, 3, 3] y) {
            n = com.microsoft.Inverse (x)
            y = Relu(n)
        }""", header='<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n')
    result = graphopt.optimize(proto, precision="fp16")
    assert any(note.startswith("fp16: kept float32, ONNX shape inference gives their outputs no "
                               "type") and "Inverse" in note for note in result.notes), result.notes


@pytest.mark.parametrize("mode", ["fp16", "mixed-fp16"])
def test_a_models_own_qdq_keeps_float32_scales(mode):
    # An int16 activation's scale (1.3e-6) and a bias's (activation × weight scale, ~1e-8)
    # are float16 subnormals or zero: the bias vanished, a Q/DQ pair disagreed on its scale.
    proto = parse_model("""
        g (float[2,8] x) => (float[2,8] y, float[2,8] z) {
          xq = QuantizeLinear(x, xs, xz)
          xd = DequantizeLinear(xq, xs, xz)
          m = MatMul(xd, w)
          mq = QuantizeLinear(m, ys, az)
          y = DequantizeLinear(mq, ys, az)
          bd = DequantizeLinear(bq, bs)
          z = Add(xd, bd)
        }""", header='<ir_version: 9, opset_import: ["" : 21]>\n',
        xs=np.array(1.3e-4, np.float32), xz=np.array(0, np.int16), w=W1,
        bq=np.arange(8, dtype=np.int32) * 1000, bs=np.array(1e-8, np.float32),
        ys=np.array(1.3e-6, np.float32), az=np.array(0, np.int16))
    result = compile_(proto, precision=mode)
    for node in result.model.graph:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert node.inputs[1].dtype == DType.FLOAT, node
    # The MatMul between them is the model's own quantized layer, which onnxruntime runs as
    # one int8 kernel: in half it ran behind Casts, in float16 instead of int8.
    (matmul,) = [node for node in result.model.graph if node.op_type == "MatMul"]
    assert matmul.outputs[0].dtype == DType.FLOAT
    assert any("kept the model's own int8 layers" in note and "MatMul" in note
               for note in result.notes), result.notes
    out = result.to_onnx()
    onnx.checker.check_model(out, full_check=True)
    feeds = {"x": RNG.uniform(-1, 1, (2, 8)).astype(np.float32)}
    expected, actual = numerics.run(proto, feeds), numerics.run(out, feeds)
    assert cosine_similarity(expected["z"], actual["z"]) > 0.999
    saturated = np.abs(expected["y"]) > 0.04  # ±32767 · 1.3e-6: exactly the scale's limit
    np.testing.assert_allclose(actual["y"][saturated], expected["y"][saturated], rtol=1e-6)


def test_an_integer_accumulator_is_cast_to_float32_not_half():
    proto = parse_model("""
        g (uint8[1,64] xq, uint8 xz) => (float[1,4] y) {
          acc = MatMulInteger(xq, wq, xz, wz)
          f = Cast <to = 1> (acc)
          y = Mul(f, s)
        }""", wq=np.full((64, 4), 127, np.int8), wz=np.array(0, np.int8),
        s=np.array(1e-4, np.float32))
    result = compile_(proto, precision="fp16")
    (cast,) = [n for n in result.model.graph if n.op_type == "Cast" and n.input(0).name == "acc"]
    assert cast.attr("to") == int(DType.FLOAT)  # 64 · 255 · 127 = 2,072,640 > 65504
    # The Mul that scales the sum down read it rounded to float16, inf on float16 hardware
    # (onnxruntime's CPU provider drops that Cast pair, so its run cannot show it): it stays
    # float32, and so reads the sum as the Cast made it.
    (scale,) = [n for n in result.model.graph if n.op_type == "Mul"]
    assert scale.input(0) is cast.outputs[0] and scale.outputs[0].dtype == DType.FLOAT


def _if_of_matmuls():
    """y = If(c, x·w then Relu, x·w then Tanh): the work sits in the branches (silero-vad's
    whole network does), reading the main graph's x and w."""
    from onnx import TensorProto, helper, numpy_helper

    def branch(name, activation):
        nodes = [helper.make_node("MatMul", ["x", "w"], [f"m_{name}"]),
                 helper.make_node(activation, [f"m_{name}"], [f"y_{name}"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(
            f"y_{name}", TensorProto.FLOAT, None)])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("a", "Relu"),
                          else_branch=branch("b", "Tanh"))],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(RNG.normal(0, 0.1, (64, 64)).astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _loop_of_an_rnn_cell():
    """h ← tanh(h·w + xs[i]) for n steps, with softmax(h) scanned out: a recurrence written as
    a Loop whose body reads the main graph's w and xs."""
    from onnx import TensorProto, helper, numpy_helper
    f32 = TensorProto.FLOAT
    body = helper.make_graph([
        helper.make_node("Gather", ["xs", "i"], ["xi"], axis=0),
        helper.make_node("MatMul", ["h", "w"], ["hw"]),
        helper.make_node("Add", ["hw", "xi"], ["s"]),
        helper.make_node("Tanh", ["s"], ["h2"]),
        helper.make_node("Softmax", ["h2"], ["p"], axis=-1),
        helper.make_node("Identity", ["cond"], ["cond2"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", f32, [1, 16])],
        [helper.make_tensor_value_info("cond2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h2", f32, [1, 16]),
         helper.make_tensor_value_info("p", f32, [1, 16])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "h0"], ["hN", "ps"], body=body)], "g",
        [helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("h0", f32, [1, 16]),
         helper.make_tensor_value_info("xs", f32, [8, 1, 16])],
        [helper.make_tensor_value_info("hN", f32, [1, 16]),
         helper.make_tensor_value_info("ps", f32, [8, 1, 16])],
        [numpy_helper.from_array(RNG.normal(0, 0.3, (16, 16)).astype(np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _body_ops(model) -> list[tuple[str, int | None]]:
    """(op, output elem type) of every node inside the model's subgraphs."""
    from onnx import AttributeProto
    found = []

    def walk(graph, nested):
        types = {v.name: v.type.tensor_type.elem_type
                 for v in list(graph.value_info) + list(graph.output)}
        for node in graph.node:
            if nested:
                found.append((node.op_type, types.get(node.output[0])))
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    walk(attr.g, True)
    walk(model.graph, False)
    return found


@pytest.mark.parametrize("mode", ["fp16", "mixed-fp16"])
def test_work_inside_if_branches_and_loop_bodies_converts_behind_casts(mode):
    # Each body converts within itself: its inputs, outputs and captured values keep their
    # dtypes (Casts inside the body), so the If/Loop node and the model's signature do not change.
    half = onnx.TensorProto.FLOAT16
    cases = [(_if_of_matmuls(), [{"c": np.array(flag), "x": RNG.normal(size=(2, 64))
                                  .astype(np.float32)} for flag in (True, False)]),
             (_loop_of_an_rnn_cell(), [{"n": np.array(8), "h0": RNG.normal(size=(1, 16))
                                        .astype(np.float32),
                                        "xs": RNG.normal(size=(8, 1, 16)).astype(np.float32)}])]
    for proto, feeds_list in cases:
        result = graphopt.optimize(proto, precision=mode)
        out = result.to_onnx()
        onnx.checker.check_model(out, full_check=True)
        assert not any("inside the subgraphs" in note for note in result.notes), result.notes
        inferred = onnx.shape_inference.infer_shapes(out)
        assert ("MatMul", half) in _body_ops(inferred), _body_ops(inferred)
        assert [i.type for i in out.graph.input] == [i.type for i in proto.graph.input]
        assert [o.type.tensor_type.elem_type for o in out.graph.output] == \
            [o.type.tensor_type.elem_type for o in proto.graph.output]
        assert {t.data_type for t in out.graph.initializer} == {half}  # w converted once
        for feeds in feeds_list:
            expected, actual = numerics.run(proto, feeds), numerics.run(out, feeds)
            for name, value in expected.items():
                assert actual[name].dtype == value.dtype
                np.testing.assert_allclose(actual[name], value, atol=2e-3, rtol=0)


def test_mixed_precision_keeps_a_loop_bodys_softmax_float32():
    result = graphopt.optimize(_loop_of_an_rnn_cell(), precision="mixed-fp16")
    body = _body_ops(onnx.shape_inference.infer_shapes(result.to_onnx()))
    assert ("MatMul", onnx.TensorProto.FLOAT16) in body  # the body converts …
    assert ("Softmax", onnx.TensorProto.FLOAT) in body  # … by mixed precision's lists


def test_int4_names_the_matmuls_inside_an_if_it_leaves_as_they_are():
    int4 = graphopt.optimize(_if_of_matmuls(), quantize="int4")
    assert any(n.startswith("QuantizeInt4Weights: 2 node(s) inside the subgraphs of If")
               for n in int4.notes), int4.notes
    # and says the main graph, not the model, has none (an optimum-style merged decoder's 46)
    assert any(n.startswith("QuantizeInt4Weights quantized nothing: the main graph has no "
                            "MatMul") for n in int4.notes), int4.notes


def test_int8_of_an_if_takes_a_scalar_input_once_and_says_the_main_graph_has_no_layer(tmp_path):
    # silero-vad's sample rate: a rank-0 input, which --inputs takes as the scalar itself and
    # calibration refused unless given as [1]; and "the model has no … MatMul" followed the
    # note naming the If's MatMuls.
    path = tmp_path / "cal.npz"
    np.savez(path, c=np.array(True), x=RNG.standard_normal((4, 2, 64)).astype(np.float32))
    result = graphopt.optimize(_if_of_matmuls(), quantize="int8", calibration=path)
    assert any(n.startswith("QuantizeInt8: 2 node(s) inside the subgraphs of If")
               for n in result.notes), result.notes
    assert any(n.startswith("QuantizeInt8 quantized nothing: the main graph has no Conv, Gemm "
                            "or MatMul") for n in result.notes), result.notes
    from graphopt.ir import load_onnx
    from graphopt.quant.calib_data import read_calibration

    samples = list(read_calibration(path, load_onnx(_if_of_matmuls()).graph))
    assert len(samples) == 4 and all(s["c"].shape == () and s["c"] for s in samples)


def test_an_op_onnxruntime_expands_converts_only_when_its_body_loads_in_half(tmp_path):
    # No float16 kernel: onnxruntime runs the op from its ONNX function body, not behind
    # Casts. Mish's body takes float16; MeanVarianceNormalization's adds a float32 epsilon
    # (an .om no session could load), so fp16 refuses it by name and mixed keeps it float32.
    mish = parse_model("g (float[2,3] x) => (float[2,3] y) { y = Mish (x) }",
                       header='<ir_version: 8, opset_import: ["" : 18]>\n')
    result = graphopt.optimize(mish, precision="fp16")
    assert DType.FLOAT16 in {v.dtype for n in result.model.graph for v in n.outputs}
    graphopt.save(result, tmp_path / "mish.om")
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    y = graphopt.load(tmp_path / "mish.om").run({"x": x})["y"]
    np.testing.assert_allclose(y, x * np.tanh(np.log1p(np.exp(x))), atol=5e-3)
    mvn = parse_model("g (float[2,3,4,4] x) => (float[2,3,4,4] y) "
                      "{ y = MeanVarianceNormalization (x) }",
                      header='<ir_version: 8, opset_import: ["" : 13]>\n')  # 17's body loads
    with pytest.raises(OptionError, match="no float16 kernel for MeanVarianceNormalization"):
        graphopt.optimize(mvn, precision="fp16")
    graphopt.save(graphopt.optimize(mvn, precision="mixed-fp16"), tmp_path / "mvn.om")
    graphopt.load(tmp_path / "mvn.om")


def test_training_mode_batchnorm_and_qlinear_ops_stay_float32(tmp_path):
    # onnxruntime runs a float16 training-mode BatchNormalization in float32 and writes its
    # running statistics over the caller's mean and var; QLinearMatMul's scales are a Q/DQ
    # pair's, which never convert.
    bn = parse_model(
        "g (float[2,3,2] x, float[3] s, float[3] b, float[3] mean, float[3] var) => "
        "(float[2,3,2] y, float[3] rm, float[3] rv) "
        "{ y, rm, rv = BatchNormalization <training_mode = 1> (x, s, b, mean, var) }",
        header='<ir_version: 8, opset_import: ["" : 15]>\n')
    graphopt.save(graphopt.optimize(bn, precision="fp16"), tmp_path / "bn.om")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 2)).astype(np.float32),
             "s": np.ones(3, np.float32), "b": np.zeros(3, np.float32),
             "mean": rng.standard_normal(3).astype(np.float32),
             "var": rng.uniform(1, 2, 3).astype(np.float32)}
    kept = {name: array.copy() for name, array in feeds.items()}
    graphopt.load(tmp_path / "bn.om").run(feeds)
    for name, array in kept.items():
        np.testing.assert_array_equal(feeds[name], array, err_msg=name)
    qmm = parse_model(
        "g (uint8[2,4] a, uint8[4,3] b) => (uint8[2,3] y) "
        "{ y = QLinearMatMul (a, sa, za, b, sb, zb, sy, zy) }",
        header='<ir_version: 8, opset_import: ["" : 17]>\n',
        sa=np.float32(0.1), za=np.uint8(0), sb=np.float32(0.2), zb=np.uint8(0),
        sy=np.float32(0.5), zy=np.uint8(0))
    assert ops(graphopt.optimize(qmm, precision="fp16").model) == ["QLinearMatMul"]


def test_an_op_whose_function_body_is_a_later_versions_is_emulated_as_before():
    # LeakyRelu has a function body from opset 16 on: at 13 onnxruntime casts around its
    # float32 kernel, and the note says so.
    model = parse_model("g (float[2,4] x) => (float[2,4] y) { m = MatMul (x, w)\n"
                        " y = LeakyRelu (m) }", header='<ir_version: 7, opset_import: ["" : 13]>\n',
                        w=np.ones((4, 4), np.float32))
    notes = graphopt.optimize(model, precision="fp16").notes
    assert any("no float16 kernel for LeakyRelu, MatMul;" in n for n in notes), notes


_ONE_PROJECTION = ("""
        g (float[S, B, 32] x) => (float[B, S, 16] y) {
            r = Relu (x)
            t = Transpose <perm = [1, 0, 2]> (r)
            m = MatMul (t, w)
            y = Relu (m)
        }""", ["Cast", "Relu", "MatMul", "Transpose", "Relu", "Cast"])
# A bidirectional RNN's two projections (DeepSpeech's dynamo export) read one Transpose.
_TWO_PROJECTIONS = ("""
        g (float[S, B, 32] x) => (float[B, S, 16] y) {
            r = Relu (x)
            t = Transpose <perm = [1, 0, 2]> (r)
            m = MatMul (t, w)
            n = MatMul (t, w2)
            y = Add (m, n)
        }""", ["Cast", "Relu", "MatMul", "Transpose", "MatMul", "Transpose", "Add", "Cast"])


@pytest.mark.parametrize("text, expected_ops", [_ONE_PROJECTION, _TWO_PROJECTIONS],
                         ids=["one reader", "two readers"])
def test_a_half_matmul_of_a_batch_swap_is_written_in_a_form_onnxruntime_loads(
        tmp_path, text, expected_ops):
    """onnxruntime 1.32 segfaults loading, at ORT_ENABLE_ALL, a float16 Transpose(1, 0, 2)
    feeding a float16 MatMul with a constant weight (a sequence-first projection). The
    conversion moves the Transpose after the MatMul: the same products, in a form it loads."""
    rng = np.random.default_rng(7)
    weights = {name: rng.standard_normal((32, 16)).astype(np.float32)
               for name in ("w", "w2") if f", {name})" in text}
    model = parse_model(text, **weights)
    result = graphopt.optimize(model, pass_options={"precision": "fp16"})
    assert ops(result.model) == expected_ops
    x = rng.standard_normal((5, 2, 32)).astype(np.float32)
    expected = numerics.run(model, {"x": x})["y"]
    np.testing.assert_allclose(_run_at_all_in_a_child(result, x, tmp_path), expected,
                               rtol=2e-2, atol=2e-2)


def _run_at_all_in_a_child(result, x: np.ndarray, tmp_path, name: str = "half") -> np.ndarray:
    """The compiled model's y for x, run by onnxruntime at ORT_ENABLE_ALL in a child process:
    on the unmoved form the load kills the process."""
    import subprocess
    import sys

    path = tmp_path / f"{name}.onnx"
    graphopt.save(result, path)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    np.save(tmp_path / "x.npy", x)
    script = ("import sys, numpy as np, onnxruntime as ort\n"
              "options = ort.SessionOptions()\n"
              "options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL\n"
              "session = ort.InferenceSession(sys.argv[1], options, "
              "providers=['CPUExecutionProvider'])\n"
              "np.save(sys.argv[3], session.run(None, {'x': np.load(sys.argv[2])})[0])\n")
    child = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "x.npy"),
                            str(tmp_path / "y.npy")], capture_output=True, text=True)
    assert child.returncode == 0, (child.returncode, child.stderr[-500:])
    return np.load(tmp_path / "y.npy")


def test_a_batch_swap_is_moved_for_an_npu_target_and_in_a_model_given_in_float16(tmp_path):
    # The conversion moved it only where the CPU provider emulates MatMul, which on an NPU
    # target it runs on the device: a GRU's projection went back to the host in float16, and
    # --verify died loading the compile. A model exported in float16 reaches no conversion.
    rng = np.random.default_rng(8)
    text = _ONE_PROJECTION[0]
    model = parse_model(text, w=rng.standard_normal((32, 16)).astype(np.float32))
    x = rng.standard_normal((5, 2, 32)).astype(np.float32)
    expected = numerics.run(model, {"x": x})["y"]
    npu = graphopt.optimize(model, precision="fp16", target="ascend310",
                            input_shapes={"x": [5, 2, 32]})
    assert not [n for n in npu.model.graph.nodes() if n.op_type == "MatMul"
                and n.inputs[0].producer.op_type == "Transpose"]
    half = parse_model(text.replace("float[", "float16["),
                       w=rng.standard_normal((32, 16)).astype(np.float16))
    given = graphopt.optimize(half)
    assert ops(given.model) == ["Relu", "MatMul", "Transpose", "Relu"]
    assert any("1 float16 Transpose(perm=[1, 0, 2]) moved after the MatMul" in note
               for note in given.notes), given.notes
    x16 = x.astype(np.float16)
    np.testing.assert_allclose(_run_at_all_in_a_child(given, x16, tmp_path),
                               numerics.run(half, {"x": x16})["y"], rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(_run_at_all_in_a_child(npu, x, tmp_path, "npu"), expected,
                               rtol=2e-2, atol=2e-2)


def test_the_accuracy_report_runs_on_the_inputs_verify_runs_on(tmp_path, capsys):
    # A model that runs at its own sizes only (the Reshape to 2×16): random data with open
    # dims at 1 fails it, so without --inputs there was no report.
    src, out, feeds = tmp_path / "m.onnx", tmp_path / "m16.onnx", tmp_path / "x.npz"
    onnx.save(parse_model("""
        g (float[N, 8] x) => (float[2, 16] y) {
            m = MatMul (x, w)
            y = Reshape (m, shape)
        }""", w=W1[:8, :8], shape=np.array([2, 16], np.int64)), src)
    np.savez(feeds, x=np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32))
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", out, "--precision", "fp16",
                              "--verify", "--inputs", feeds)
    assert rc == 0, err
    assert f"accuracy vs {src} on {feeds}" in stdout and "no accuracy report" not in err
    rc, stdout, err = run_cli(capsys, "optimize", src, "-o", out, "--precision", "fp16")
    assert rc == 0 and "no accuracy report" in err
    # It says what would give it inputs the model runs on (the way it named, --inputs alone,
    # is refused without --verify).
    assert "(on seeded random inputs, their open dims set to 1); --calibration FILE.npz or " \
        "--verify --inputs FILE.npz give it inputs the model runs on" in err


def test_a_body_matmul_reading_a_transpose_of_the_main_graph_leaves_it_there():
    # The crash rewrite runs in each graph it converted; a body's float16 MatMul whose
    # Transpose(1, 0, 2) sits in the main graph is no pair to rewrite (the compile failed with
    # "not in graph" removing the outer Transpose from the branch).
    from onnx import TensorProto, helper, numpy_helper
    f16 = TensorProto.FLOAT16
    w = numpy_helper.from_array((RNG.standard_normal((32, 16)) * 0.1).astype(np.float16), "w")

    def branch(name):
        nodes = [helper.make_node("MatMul", ["t", "w"], [f"m_{name}"]),
                 helper.make_node("Relu", ["z"], [f"r_{name}"]),  # float32 work in the body
                 helper.make_node("Cast", [f"r_{name}"], [f"h_{name}"], to=f16),
                 helper.make_node("ReduceSum", [f"h_{name}"], [f"s_{name}"], keepdims=0),
                 helper.make_node("Add", [f"m_{name}", f"s_{name}"], [f"y_{name}"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(
            f"y_{name}", f16, [2, 5, 16])])

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
         helper.make_node("MatMul", ["z", "v"], ["u"]),  # float32 work for the pass to convert
         helper.make_node("If", ["c"], ["y"], then_branch=branch("a"), else_branch=branch("b"))],
        "g", [helper.make_tensor_value_info("x", f16, [5, 2, 32]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", f16, [2, 5, 16]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [3, 4])],
        [w, numpy_helper.from_array(np.eye(4, dtype=np.float32), "v")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out = graphopt.optimize(proto, precision="fp16").to_onnx()
    onnx.checker.check_model(out, full_check=True)
    feeds = {"x": RNG.standard_normal((5, 2, 32)).astype(np.float16), "c": np.array(True),
             "z": RNG.standard_normal((3, 4)).astype(np.float32)}
    expected, actual = numerics.run(proto, feeds), numerics.run(out, feeds)
    np.testing.assert_allclose(actual["y"].astype(np.float32), expected["y"].astype(np.float32),
                               rtol=2e-2, atol=2e-2)


def test_a_path_like_name_is_nearest_the_names_of_its_folder_and_its_op():
    # --quant-skip …/conv.0.0/Conv_nope was offered the folder's Clip nodes, not the Conv a
    # fusion renamed after the BatchNormalization it took in.
    from graphopt.passes.unmatched import unmatched_note

    known = {"/features.1/conv.0/conv.0.1/BatchNormalization/ConvBatchNorm/Conv",
             "/features.1/conv.0/conv.0.2/Clip", "/features.17/conv.0/conv.0.2/Clip", "Conv"}
    note = unmatched_note([("--quant-skip", {"/features.1/conv.0/conv.0.0/Conv_nope"}, known)])
    assert "(nearest: '/features.1/conv.0/conv.0.1/BatchNormalization/ConvBatchNorm/Conv')" \
        in note, note
    # A plain name keeps the plain likeness.
    assert "(nearest: 'Conv')" in unmatched_note([("--precision-deny", {"Cnv"}, known)])
    # A name nothing in its folder resembles: the fused node there, named after the node it
    # rooted at, not a name like it elsewhere (an unrelated MatMul had been offered).
    known = {"/h.0/attn/MatMul_1/ScaledDotProductAttention/MultiHeadAttention",
             "/h.0/attn/Split", "/h.0/mlp/c_fc/MatMul", "/h.0/mlp/c_proj/MatMul"}
    note = unmatched_note([("--keep-dtype", {"/h.0/attn/Softmax"}, known)])
    assert "(nearest: '/h.0/attn/MatMul_1/ScaledDotProductAttention/MultiHeadAttention')" \
        in note, note


@pytest.mark.parametrize("flags", [
    [],
    ["--precision", "mixed-fp16", "--precision-allow", "MatMul,Gemm", "--precision-deny",
     "Softmax", "--keep-dtype", "a,b", "--keep-dtype", "OpType::Erf"],
    ["--quantize", "int8", "--calibration", "CALIB", "--calibration-method", "percentile",
     "--calibration-percentile", "99.9", "--per-tensor", "--activation-symmetric",
     "--quant-skip", "Conv", "--quantize-ends", "--quantize-sensitive",
     "--no-equalize-channels"],
    ["--quantize", "int4", "--int4-group-size", "64", "--int4-embeddings", "--int4-method",
     "gptq", "--calibration", "CALIB", "--int4-accuracy-level", "4"],
])
def test_precision_argv_gives_back_the_options_it_was_parsed_from(flags, tmp_path):
    # tune prints the optimize line that applies its tilings; for an int8 tune it must
    # compile the int8 model, so every precision flag comes back as given.
    from graphopt.cli import build_parser
    from graphopt.cli_precision import precision_argv, precision_options

    calib = tmp_path / "c.npz"
    np.savez(calib, x=np.zeros((1, 2), np.float32))
    flags = [str(calib) if f == "CALIB" else f for f in flags]
    parser = build_parser()
    args = parser.parse_args(["optimize", "m.onnx", "-o", "m.om", *flags])
    again = parser.parse_args(["optimize", "m.onnx", "-o", "m.om", *precision_argv(args)])
    assert precision_options(again) == precision_options(args)


def test_an_op_whose_output_only_an_if_reads_converts_behind_a_cast():
    # `pre` stayed float32, without a note, because its output is read inside the branches.
    rng = np.random.default_rng(5)

    def weight(*shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32))

    w0, w1, w2, w3 = weight(16, 16), weight(16, 16), weight(16, 16), weight(16, 8)
    for w, name in zip((w0, w1, w2, w3), ("w0", "w1", "w2", "w3")):
        w.name = name
    make = onnx.helper
    branch = lambda name, w, act: make.make_graph(  # noqa: E731
        [make.make_node("MatMul", ["x", w], [f"{name}0"]),
         make.make_node(act, [f"{name}0"], [f"{name}_out"])], name, [],
        [make.make_tensor_value_info(f"{name}_out", onnx.TensorProto.FLOAT, [1, 16])])
    graph = make.make_graph(
        [make.make_node("MatMul", ["x0", "w0"], ["x"], name="pre"),
         make.make_node("If", ["c"], ["yi"], then_branch=branch("then", "w1", "Tanh"),
                        else_branch=branch("else", "w2", "Sigmoid")),
         make.make_node("MatMul", ["yi", "w3"], ["y"], name="post")], "g",
        [make.make_tensor_value_info("x0", onnx.TensorProto.FLOAT, [1, 16]),
         make.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [make.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])], [w0, w1, w2, w3])
    proto = make.make_model(graph, opset_imports=[make.make_opsetid("", 17)],
                            ir_version=IR_VERSION)
    for mode in ("fp16", "mixed-fp16"):
        result = compile_(proto, precision=mode)
        assert dtypes(result)["pre"] == "f16", mode
        out = result.to_onnx()
        onnx.checker.check_model(out, full_check=True)
        for branch_taken in (True, False):
            feeds = {"x0": rng.standard_normal((1, 16)).astype(np.float32),
                     "c": np.array(branch_taken)}
            np.testing.assert_allclose(numerics.run(out, feeds)["y"],
                                       numerics.run(proto, feeds)["y"], atol=5e-3, rtol=0)


def test_a_recurrent_layer_between_float32_ops_converts():
    # An LSTM between a denied Exp and ReduceMean was kept float32 as "no matrix work".
    rng = np.random.default_rng(6)
    proto = parse_model("""
        g (float[256,1,16] x) => (float[1,1,1] y) {
            e = Exp (x)
            h = LSTM <hidden_size = 32> (e, w, r)
            y = ReduceMean <keepdims = 1> (h)
        }""", w=(rng.standard_normal((1, 128, 16)) * 0.1).astype(np.float32),
        r=(rng.standard_normal((1, 128, 32)) * 0.1).astype(np.float32))
    result = compile_(proto, precision="fp16", precision_deny={"Exp", "ReduceMean"})
    assert dtypes(result)["h"] == "f16"
    assert not any("no matrix work" in note for note in result.notes), result.notes


def test_a_model_given_in_bfloat16_compiles_for_an_npu_that_runs_it():
    # Refused at the input check for the CPU provider's missing bfloat16 MatMul, for
    # ascend910b too, whose NPU runs it: even graphopt's own --precision bf16 output for it.
    from graphopt.errors import InputError

    proto = parse_model("""
        g (float[4,16] x) => (float[4,8] y) {
            m = MatMul (x, w)
            y = Relu (m)
        }""", w=np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32))
    bf16 = graphopt.optimize(proto, target="ascend910b", precision="bf16",
                             input_shapes={"x": [4, 16]}).to_onnx()
    again = graphopt.optimize(bf16, target="ascend910b")
    assert {p.device for p in again.partitioning.partitions} == {"npu"}
    assert any(v.dtype == DType.BFLOAT16 for n in again.model.graph for v in n.outputs)
    for target in ("cpu", "ascend310"):  # no bfloat16 kernel there: refused, naming it
        with pytest.raises(InputError, match="no MatMul-13 kernel for these dtypes"):
            graphopt.optimize(bf16, target=target)


def test_a_bfloat16_castlike_left_on_the_host_compiles_as_its_cast_runs():
    # CastLike has no CPU kernel: onnxruntime runs it as the Cast its function body is, which
    # takes bfloat16. The host check had refused it for ascend910b ("no bfloat16 kernel").
    from onnx import TensorProto, helper

    proto = helper.make_model(helper.make_graph(
        [helper.make_node("CastLike", ["a", "t"], ["b"]),
         helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [helper.make_tensor("t", TensorProto.BFLOAT16, [1], [1.0])]),
        opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    for target in ("cpu", "ascend910b"):
        result = graphopt.optimize(proto, target=target, verify=True)
        assert result.max_abs_error == {"y": 0.0}


@pytest.mark.parametrize("precision", ["fp16", "mixed-fp16"])
def test_a_model_below_opset_6_keeps_float32_with_a_note(precision):
    # Cast-1 takes its type as a string: the Casts ConvertPrecision writes, numbered, made the
    # compile fail as a graphopt bug.
    proto = parse_model("""
    agraph (float[1, 2, 4, 4] x) => (float[1, 2, 2, 2] y) {
      y = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x)
    }""", header='<ir_version: 3, opset_import: ["" : 5]>\n')
    result = graphopt.optimize(proto, precision=precision)
    assert any(n.startswith(f"{precision}: kept float32: the model imports ONNX opset 5")
               for n in result.notes), result.notes
    assert not any(n.op_type == "Cast" for n in result.to_onnx().graph.node)


def test_a_scaler_before_a_tree_ensemble_keeps_its_features_float32():
    # A scikit-learn pipeline's MinMaxScaler (a Mul and an Add of per-feature constants) before
    # a RandomForest: float16 features moved 84 of 512 rows' probabilities, since the trees
    # compare them with float32 thresholds. The [4] factors had passed for a table as large
    # as the [N, 4] output, N counted as 1, which kept the region half.
    ml = "ai.onnx.ml"
    tree = onnx.helper.make_node(
        "TreeEnsembleClassifier", ["f"], ["label", "scores"], domain=ml,
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[2, 0, 0],
        nodes_values=[0.1234567, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
        class_treeids=[0, 0, 0, 0], class_nodeids=[1, 1, 2, 2], class_ids=[0, 1, 0, 1],
        class_weights=[0.8, 0.2, 0.3, 0.7], classlabels_int64s=[0, 1])
    scale = onnx.numpy_helper.from_array(np.array([0.3, 1.7, 0.9, 2.1], np.float32), "scale")
    shift = onnx.numpy_helper.from_array(np.array([0.1, -0.2, 0.05, 0.0], np.float32), "shift")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Mul", ["x", "scale"], ["m"]),
         onnx.helper.make_node("Add", ["m", "shift"], ["f"]), tree], "pipeline",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [onnx.helper.make_tensor_value_info("label", onnx.TensorProto.INT64, ["N"]),
         onnx.helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, ["N", 2])],
        [scale, shift])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid(ml, 3)],
                                   ir_version=IR_VERSION)
    result = compile_(proto, precision="fp16")
    assert "Cast" not in ops(result.model)
    assert any("Add, Mul" in note and "kept float32" in note for note in result.notes), \
        result.notes
    # Features on both sides of the threshold, within float16's step of it.
    x = np.zeros((64, 4), np.float32)
    x[:, 2] = (0.1234567 - 0.05 + np.linspace(-1e-3, 1e-3, 64)) / 0.9
    compiled = result.to_onnx()
    for name, expected in numerics.run(proto, {"x": x}).items():
        np.testing.assert_array_equal(numerics.run(compiled, {"x": x})[name], expected)


def test_an_output_below_float16s_range_is_named_when_verify_fails(tmp_path, capsys):
    # A random-weight depth model's output of 5e-9 rounds to zero in float16: the failure had
    # said only "cosine 0.000000", where an overflow got a note of its own.
    proto = parse_model("""
        g (float[1,4,8,8] x) => (float[1,4,8,8] out) {
          a = Mul(x, c)
          b = Mul(a, c)
          y = Conv <pads = [1, 1, 1, 1]> (b, w)
          out = Mul(y, c)
        }""", c=np.float32(1e-3), w=(RNG.standard_normal((4, 4, 3, 3)) * 0.2).astype(np.float32))
    source = tmp_path / "tiny.onnx"
    onnx.save(proto, source)
    rc, _, err = run_cli(capsys, "optimize", source, "-o", tmp_path / "t.om", "--precision",
                         "fp16", "--verify")
    assert rc != 0 and "cosine" in err
    assert "output(s) 'out' (at most" in err and "below float16's smallest normal number" in err
    assert "--keep-dtype, --precision-deny" in err
