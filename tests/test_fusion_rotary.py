"""FuseRotaryEmbedding: x·cos + rotate_half(x)·sin (and GPT-J's rotate_every_two) with constant
tables into RotaryEmbedding; each case is checked against onnxruntime on the original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import IR_VERSION, as_float16
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt import numerics
from graphopt.ir import load_onnx, to_onnx, verify
from graphopt.partition.target import load_target
from graphopt.passes import PASSES, Options, PassContext
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.rules import Tracer

B, N, S, H = 2, 3, 5, 8
BIG = 9223372036854775807  # INT64_MAX, the exporters' "to the end"


def tables(batches: int = 1, scale: float = 1.0, halves_equal: bool = True):
    """cos and sin [batches, 1, S, H] as transformers builds them: cat(freqs, freqs) of the
    positions (per batch: shifted, as left padding shifts them), times attention_scaling."""
    inv = 1.0 / 10000 ** (np.arange(0, H, 2) / H)
    positions = np.arange(S)[None] + np.arange(batches)[:, None] * 2
    freqs = positions[..., None] * inv  # [batches, S, H/2]
    emb = np.concatenate([freqs, freqs if halves_equal else freqs * 1.5], -1)[:, None]
    return ((np.cos(emb) * scale).astype(np.float32), (np.sin(emb) * scale).astype(np.float32))


def rotary(batches: int = 1, scale: float = 1.0, halves_equal: bool = True,
           second=(H // 2, BIG), first=(0, H // 2), sin_input: bool | str = False,
           dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    """y = x·cos + Concat(-x[..., second], x[..., first])·sin on x [B,N,S,H]."""
    cos, sin = tables(batches, scale, halves_equal)
    inits = [numpy_helper.from_array(cos, "cos")]
    inputs = [helper.make_tensor_value_info("x", dtype, [B, N, S, H])]
    if sin_input == "positions":  # sin of the angles an input gives, as of position_ids
        inputs.append(helper.make_tensor_value_info("positions", dtype, list(sin.shape)))
    elif sin_input:
        inputs.append(helper.make_tensor_value_info("sin", dtype, list(sin.shape)))
    else:
        inits.append(numpy_helper.from_array(sin, "sin"))
    for name, value in (("s2", second[0]), ("e2", second[1]), ("s1", first[0]),
                        ("e1", first[1]), ("axis", -1), ("step", 1)):
        inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
    nodes = [helper.make_node("Sin", ["positions"], ["sin"])] if sin_input == "positions" else []
    nodes += [
        helper.make_node("Slice", ["x", "s2", "e2", "axis", "step"], ["x2"]),
        helper.make_node("Slice", ["x", "s1", "e1", "axis"], ["x1"]),
        helper.make_node("Neg", ["x2"], ["neg"]),
        helper.make_node("Concat", ["neg", "x1"], ["rot"], axis=-1),
        helper.make_node("Mul", ["cos", "x"], ["xc"]),
        helper.make_node("Mul", ["rot", "sin"], ["rs"]),
        helper.make_node("Add", ["xc", "rs"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "rope", inputs,
                              [helper.make_tensor_value_info("y", dtype, [B, N, S, H])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def fuse(proto, target=None, rules=frozenset({"RotateHalf"})):
    model = load_onnx(proto)
    infer_shapes(model)
    ctx = PassContext(Options(), tracer=Tracer(set(rules)),
                      target=load_target(target) if target else None)
    result = PASSES["FuseRotaryEmbedding"]().run(model, ctx)
    PASSES["EliminateDeadNodes"]().run(model, ctx)
    verify(model)
    return model, dict(result.stats), ctx.tracer.report()


def same_outputs(proto, model, tol=1e-6):
    feeds = numerics.random_feeds(proto, seed=0)
    problems = numerics.compare(numerics.run(proto, feeds), numerics.run(to_onnx(model), feeds),
                                tol, tol)
    assert not problems, [str(p) for p in problems]


@pytest.mark.parametrize("batches, scale", [(1, 1.0), (1, 0.7), (B, 1.0)],
                         ids=["shared", "scaled", "per-batch"])
def test_rotate_half_becomes_rotary_embedding(batches, scale):
    proto = rotary(batches, scale)
    model, stats, _ = fuse(proto)
    assert stats == {"RotateHalf": 1}
    (node,) = model.graph
    assert node.qualified_op == "com.microsoft::RotaryEmbedding" and node.attr("interleaved") == 0
    ids, cos_cache = node.inputs[1].constant(), node.inputs[2].constant()
    assert cos_cache.shape == (batches * S, H // 2)
    assert ids.tolist() == ([0] if batches == 1 else np.arange(B * S).reshape(B, S).tolist())
    same_outputs(proto, model)


@pytest.mark.parametrize("edit, reason", [
    ({"halves_equal": False}, "two halves of %cos differ"),
    ({"second": (0, H // 2), "first": (H // 2, BIG)}, "do not take x[..., :4] and x[..., 4:]"),
    ({"sin_input": True}, "%sin is an input of the model (the fused op takes constant tables"),
    ({"sin_input": "positions"}, "%sin is computed from input 'positions' at run time"),
])
def test_refusals_say_why(edit, reason):
    # A table computed from the data of an input (position_ids) had been told to pin the
    # sequence, which folds nothing there.
    proto = rotary(**edit)
    model, stats, trace = fuse(proto)
    assert stats == {} and "Neg" in [n.op_type for n in model.graph]
    assert any(reason in line for line in trace), trace


@pytest.mark.parametrize("ulps, fused", [(1, True), (3, False)])
def test_halves_an_ulp_apart_are_one_table(ulps, fused):
    # onnxruntime's Sin of cat(freqs, freqs), folded, rounds one angle of the second half
    # 1 ulp off the first (its vector body and its scalar tail differ, at a head size of 6).
    proto = rotary()
    sin = next(t for t in proto.graph.initializer if t.name == "sin")
    table = numpy_helper.to_array(sin).copy()
    at = (0, 0, S - 1, H - 1)
    for _ in range(ulps):
        table[at] = np.nextafter(table[at], np.float32(np.inf))
    sin.CopyFrom(numpy_helper.from_array(table, "sin"))
    model, stats, trace = fuse(proto)
    assert (stats == {"RotateHalf": 1}) == fused, trace
    if fused:
        same_outputs(proto, model)


def test_a_slice_from_the_end_takes_the_same_half():
    proto = rotary(second=(-H // 2, BIG))
    model, stats, _ = fuse(proto)
    assert stats == {"RotateHalf": 1}
    same_outputs(proto, model)


def test_a_target_without_the_kernel_keeps_the_decomposed_form():
    _, stats, trace = fuse(rotary(), target="ascend310")
    assert stats == {} and any("no com.microsoft::RotaryEmbedding kernel" in line
                               for line in trace), trace


def test_the_pipeline_fuses_a_table_built_from_the_positions():
    # The tables as a pinned export computes them: from Range over the sequence, folded.
    proto = rotary()
    inv = (1.0 / 10000 ** (np.arange(0, H, 2) / H)).astype(np.float32)
    graph = proto.graph
    keep = [i for i in graph.initializer if i.name not in ("cos", "sin")]
    del graph.initializer[:]
    graph.initializer.extend(keep + [numpy_helper.from_array(inv[None], "inv"),
                                     numpy_helper.from_array(np.array([1, 1, S, H], np.int64),
                                                             "shape4")])
    built = [
        helper.make_node("Shape", ["x"], ["xs"], start=2, end=3),
        helper.make_node("Squeeze", ["xs"], ["len"]),
        helper.make_node("Range", ["zero", "len", "one"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["posf", "ax1"], ["pcol"]),
        helper.make_node("MatMul", ["pcol", "inv"], ["freqs"]),
        helper.make_node("Concat", ["freqs", "freqs"], ["emb"], axis=-1),
        helper.make_node("Reshape", ["emb", "shape4"], ["emb4"]),
        helper.make_node("Cos", ["emb4"], ["cos"]),
        helper.make_node("Sin", ["emb4"], ["sin"]),
    ]
    graph.initializer.extend([numpy_helper.from_array(np.array(v, np.int64), n)
                              for n, v in (("zero", 0), ("one", 1), ("ax1", [1]))])
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(built + nodes)
    onnx.checker.check_model(proto, full_check=True)
    result = graphopt.optimize(proto)
    assert [n.qualified_op for n in result.model.graph] == ["com.microsoft::RotaryEmbedding"]
    feeds = numerics.random_feeds(proto, seed=0)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(result.to_onnx(), feeds),
                                1e-5, 1e-5)


# -- GPT-J's rotate_every_two ------------------------------------------------------------------


def every_two(batches: int = 1, opset: int = 17, odd_start: int = 1,
              interleaved_tables: bool = True) -> onnx.ModelProto:
    """y = x·cos + flatten(stack(-x[..., 1::2], x[..., ::2]), -2)·sin on x [B,N,S,H], as the
    exporters write GPT-J's rotate_every_two; its tables repeat_interleave(freqs, 2)."""
    cos, sin = tables(batches)
    if interleaved_tables:  # each angle twice in a row: [f0, f0, f1, f1, …]
        cos, sin = (np.repeat(t[..., : H // 2], 2, axis=-1) for t in (cos, sin))
    inits = [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin"),
             numpy_helper.from_array(np.array([B, N, S, H], np.int64), "flat")]
    for name, value in (("odd", odd_start), ("even", 1 - odd_start), ("end", BIG),
                        ("axis", -1), ("step", 2)):
        inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "new"))
        unsqueeze = [helper.make_node("Unsqueeze", ["neg", "new"], ["neg5"]),
                     helper.make_node("Unsqueeze", ["x1", "new"], ["x15"])]
    else:
        unsqueeze = [helper.make_node("Unsqueeze", ["neg"], ["neg5"], axes=[4]),
                     helper.make_node("Unsqueeze", ["x1"], ["x15"], axes=[4])]
    nodes = [
        helper.make_node("Slice", ["x", "odd", "end", "axis", "step"], ["x2"]),
        helper.make_node("Slice", ["x", "even", "end", "axis", "step"], ["x1"]),
        helper.make_node("Neg", ["x2"], ["neg"]),
        *unsqueeze,
        helper.make_node("Concat", ["neg5", "x15"], ["pairs"], axis=-1),
        helper.make_node("Reshape", ["pairs", "flat"], ["rot"]),
        helper.make_node("Mul", ["x", "cos"], ["xc"]),
        helper.make_node("Mul", ["rot", "sin"], ["rs"]),
        helper.make_node("Add", ["xc", "rs"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [B, N, S, H])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [B, N, S, H])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(proto, full_check=True)
    return proto


@pytest.mark.parametrize("batches, opset", [(1, 17), (B, 17), (1, 11)],
                         ids=["shared", "per-batch", "axes-attribute"])
def test_rotate_every_two_becomes_interleaved_rotary_embedding(batches, opset):
    proto = every_two(batches, opset)
    model, stats, _ = fuse(proto)
    assert stats == {"RotateEveryTwo": 1}
    (node,) = model.graph
    assert node.qualified_op == "com.microsoft::RotaryEmbedding" and node.attr("interleaved") == 1
    cos, sin = tables(batches)
    np.testing.assert_array_equal(node.inputs[2].constant(),
                                  cos[..., : H // 2].reshape(batches * S, H // 2))
    same_outputs(proto, model)


@pytest.mark.parametrize("edit, reason", [
    ({"interleaved_tables": False}, "even and odd entries of %cos differ"),
    ({"odd_start": 0}, "do not take x[..., 1::2] and x[..., ::2]"),
])
def test_rotate_every_two_refusals_say_why(edit, reason):
    model, stats, trace = fuse(every_two(**edit), rules={"RotateEveryTwo"})
    assert stats == {} and "Neg" in [n.op_type for n in model.graph]
    assert any(reason in line for line in trace), trace


@pytest.mark.parametrize("target", [None, "ascend910b"])
def test_a_float16_rotation_becomes_rotary_embedding(target):
    # onnxruntime's CPU provider and the 910B both run RotaryEmbedding in float16.
    proto = as_float16(rotary())
    model, stats, _ = fuse(proto, target=target)
    assert stats == {"RotateHalf": 1}
    (node,) = model.graph
    assert node.qualified_op == "com.microsoft::RotaryEmbedding"
    assert node.inputs[2].constant().dtype == np.float16
    feeds = numerics.random_feeds(proto, seed=0)
    (expected,), (actual,) = (numerics.run(m, feeds).values() for m in (proto, to_onnx(model)))
    # x·cos + rot(x)·sin rounded once or at each of its three steps: a step of float16 apart.
    assert actual.dtype == np.float16
    error = np.abs(actual.astype(np.float32) - expected.astype(np.float32))
    assert np.all(error <= 2.0 ** -10 * np.maximum(np.abs(expected.astype(np.float32)), 1.0))
