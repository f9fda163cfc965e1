"""A model that samples noise without a seed: its compile is verified, compared and bisected
on noise drawn alike in both, and still draws fresh noise when deployed."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import run_cli
from onnx import TensorProto, helper

import graphopt
from graphopt.random_seeds import seeded_bytes, seeded_copy, unseeded_random_nodes


def _sampler() -> onnx.ModelProto:
    """y = x + noise, the noise's op behind no-ops that the compile removes: onnxruntime's draw
    for an unseeded op depends on where it sits, so the compile drew other noise."""
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Identity", ["a"], ["b"]),
             helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("RandomNormalLike", ["c"], ["n"], name="noise",
                              dtype=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "n"], ["y"])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_seeds_follow_the_node_name_and_leave_seeded_ops_alone():
    model = _sampler()
    seeded = seeded_copy(model)
    (node,) = [n for n in seeded.graph.node if n.op_type == "RandomNormalLike"]
    seed = onnx.helper.get_attribute_value(node.attribute[-1])
    assert node.attribute[-1].name == "seed" and seed == float(np.float32(seed))
    assert list(unseeded_random_nodes(seeded.graph)) == []
    assert seeded_copy(seeded) is None  # the given model and seeded ones stay as they are
    assert list(unseeded_random_nodes(model.graph))
    data = seeded.SerializeToString()
    assert seeded_bytes(data) is data
    other = _sampler()
    del other.graph.node[:3]  # the same op elsewhere in another graph: the same seed
    other.graph.node[0].input[0] = "x"
    assert seeded_copy(other).graph.node[0].attribute[-1] == node.attribute[-1]


def test_verify_compare_and_bisect_draw_alike(tmp_path, capsys):
    source, om = tmp_path / "noise.onnx", tmp_path / "noise.om"
    onnx.save(_sampler(), source)
    rc, out, err = run_cli(capsys, "optimize", source, "-o", om, "--verify")
    assert rc == 0, err
    assert "draws random numbers without a seed (RandomNormalLike)" in out + err
    assert "max abs error 0 on the same inputs" in out + err  # the artifact as written too
    rc, out, err = run_cli(capsys, "compare", source, om)
    assert rc == 0 and "result: PASS" in out and "seeded by its node's name" in out
    rc, out, err = run_cli(capsys, "bisect", source)
    assert rc == 0 and "nothing to bisect" in out + err


def test_a_deployed_sampler_draws_fresh_noise(tmp_path):
    om = tmp_path / "noise.om"
    graphopt.save(graphopt.optimize(_sampler()), om)
    session = graphopt.load(om)
    x = {"x": np.zeros((1, 16), np.float32)}
    assert not np.array_equal(session.run(x)["y"], session.run(x)["y"])
