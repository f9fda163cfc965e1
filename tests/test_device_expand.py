"""ExpandForDevice: an op the target's NPU lacks, as its ONNX function body, where the NPU has
every op of that body; kept on CPU targets and where the NPU has the op."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import parse_model

import graphopt
from graphopt import numerics

# opset 18: what the dynamo exporter writes for nn.Mish (TorchScript writes the three ops).
MISH_NET = """
    agraph (float[1, 4, 16, 16] x) => (float[1, 8, 16, 16] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        m1 = Mish (c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (m1, w2)
        y = Mish (c2)
    }"""


def _mish_net() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    proto = parse_model(MISH_NET, w1=(rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32),
                        w2=(rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32))
    proto.opset_import[0].version = 18
    return proto


def test_mish_runs_on_the_npu_as_softplus_tanh_and_mul():
    # CANN's ONNX operator list has Softplus and Tanh but no Mish: each Mish had sent its
    # neighbourhood to the host, and this net went there whole.
    proto = _mish_net()
    result = graphopt.optimize(proto, target="ascend310")
    ops = [n.op_type for n in result.model.graph]
    assert "Mish" not in ops and ops.count("Softplus") == 2 and ops.count("Tanh") == 2
    assert [p.device for p in result.partitioning.partitions] == ["npu"]
    assert result.log.totals()["ExpandForDevice"]["rewrites"] == {"MishAsSoftplusTanh": 2}
    out = result.to_onnx()
    onnx.checker.check_model(out)
    feeds = numerics.random_feeds(proto, seed=1)
    assert not numerics.compare(numerics.run(proto, feeds), numerics.run(out, feeds), 1e-5, 1e-6)


def test_mish_stays_one_op_where_the_cpu_runs_it():
    for target in (None, "cpu"):
        ops = [n.op_type for n in graphopt.optimize(_mish_net(), target=target).model.graph]
        assert ops.count("Mish") == 2, (target, ops)
