"""Rule passes skip candidates they can rule out before a full match (the operands' op types,
a rule's `plausible` pre-check, no kernel for the root): skipping never changes the result."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt import zoo
from graphopt.compiler import optimize
from graphopt.ir.onnx_export import to_onnx
from graphopt.passes import rules
from graphopt.passes.rules import RULES

_BENCH = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "scale.py")


def _bench_transformer(layers: int):
    """bench/scale.py's synthetic encoder (the graph its timings are for)."""
    spec = importlib.util.spec_from_file_location("_scale_bench", _BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(_BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(os.path.dirname(_BENCH))
    return module.transformer_model(layers)


def _matmuls():
    """MatMul + bias on matrices (fuses, both operand orders) and on [B, S, C] (refused), and
    transposes into MatMul that swap the last two axes (fuse) or not (refused)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w", (8, 8)), ("b", (8,)))]
    node = helper.make_node
    nodes = [
        node("MatMul", ["x2", "w"], ["m2"]), node("Add", ["m2", "b"], ["y2"]),
        node("MatMul", ["y2", "w"], ["n2"]), node("Add", ["b", "n2"], ["z2"]),
        node("MatMul", ["x3", "w"], ["m3"]), node("Add", ["m3", "b"], ["y3"]),
        node("Transpose", ["z2"], ["t2"], perm=[1, 0]), node("MatMul", ["t2", "z2"], ["p2"]),
        node("Transpose", ["y3"], ["t3"], perm=[0, 2, 1]), node("MatMul", ["y3", "t3"], ["p3"]),
        node("Transpose", ["y3"], ["u3"], perm=[1, 0, 2]), node("MatMul", ["u3", "y3"], ["q3"]),
    ]
    io = helper.make_tensor_value_info
    inputs = [io("x2", TensorProto.FLOAT, [8, 8]), io("x3", TensorProto.FLOAT, [8, 8, 8])]
    graph = helper.make_graph(
        nodes, "matmuls", inputs,
        [io(name, TensorProto.FLOAT, None) for name in ("p2", "p3", "q3")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


MODELS = {
    "matmuls": _matmuls,
    "bert_base": lambda: zoo.build("bert_base", layers=2, hidden=64, heads=4, intermediate=128,
                                   vocab=100),
    "gpt2_small": lambda: zoo.build("gpt2_small"),
    "mobilenetv2": lambda: zoo.build("mobilenetv2"),
    "scale_transformer": lambda: _bench_transformer(3),
}


def _compile(model, level, target, traced):
    result = optimize(model, level=level, target=target,
                      trace_rules=list(RULES) if traced else None)
    log = [(r.name, r.iteration, r.nodes_after, r.stats) for r in result.log.records]
    return to_onnx(result.model).SerializeToString(), log


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("level, target", [(2, "cpu"), (3, None)])
def test_skipping_candidates_changes_nothing(name, level, target):
    """Traced, every candidate is fully matched; untraced, the shortcuts apply."""
    quick = _compile(MODELS[name](), level, target, traced=False)
    full = _compile(MODELS[name](), level, target, traced=True)
    assert quick[1] == full[1]
    assert quick[0] == full[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_plausible_never_refuses_an_applied_match(name, monkeypatch):
    applied = []
    original = rules.apply

    def checked(model, graph, rule, match, output):
        assert rule.plausible(match.root), f"{rule.name}: plausible refuses a match at " \
                                           f"{match.root}"
        applied.append(rule.name)
        return original(model, graph, rule, match, output)

    monkeypatch.setattr(rules, "apply", checked)
    optimize(MODELS[name](), level=3, trace_rules=list(RULES))
    assert applied
