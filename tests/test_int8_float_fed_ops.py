"""INT8: an Add, Mul or Concat runs in int8 only where an int8 value reaches it
(select._fed_int8)."""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import onnx
from helpers import parse_model

import graphopt
from graphopt import numerics

# LowerPRelu's Relu(x) + Min(x, 0) · a after a conv (x read twice, so the Relu cannot fold into
# it), beside a residual Add of two convs.
NET = """
    agraph (float[1, 4, 12, 12] x) => (float[1, 8, 12, 12] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        pos = Relu(c1)
        neg = Min(c1, zero)
        scaled = Mul(neg, slope)
        p = Add(pos, scaled)
        c2 = Conv <pads = [1, 1, 1, 1]> (p, w2)
        c3 = Conv <pads = [1, 1, 1, 1]> (p, w3)
        s = Add(c2, c3)
        c4 = Conv <pads = [1, 1, 1, 1]> (s, w4)
        y = Relu(c4)
    }"""


def _int8(text: str, inputs: dict[int, int]):
    """The seeded model of `text` (weights w1… of 8 output channels, 8 input channels but
    where `inputs` says otherwise, a PReLU slope) and its int8 compile, ends quantized."""
    rng = np.random.default_rng(0)
    count = max(int(n) for n in re.findall(r"\bw(\d+)\b", text))
    weights = {f"w{i}": (rng.standard_normal((8, inputs.get(i, 8), 3, 3)) * 0.3)
               .astype(np.float32) for i in range(1, count + 1)}
    proto = parse_model(text, zero=np.zeros(1, np.float32),
                        slope=np.linspace(0.1, 0.3, 8, dtype=np.float32).reshape(1, 8, 1, 1),
                        **weights)
    with tempfile.TemporaryDirectory() as folder:
        calibration = os.path.join(folder, "calib.npz")
        np.savez(calibration, x=rng.standard_normal((8, 1, 4, 12, 12)).astype(np.float32))
        # MergeParallelConvs off: these nets add two convs of one input, which it would merge.
        result = graphopt.optimize(proto, disable_passes=["MergeParallelConvs"], pass_options={
            "quantize": "int8", "calibration": calibration, "quant_keep_ends": False})
    out = graphopt.to_onnx(result.model)
    onnx.checker.check_model(out)
    return proto, out


def test_an_add_of_float_values_alone_stays_float():
    proto, out = _int8(NET, inputs={1: 4})
    producers = {o: n for n in out.graph.node for o in n.output}
    adds = {n.output[0]: [producers[i].op_type for i in n.input]
            for n in out.graph.node if n.op_type == "Add"}
    assert adds["p"] == ["Relu", "Mul"]  # float: each input would take a Q/DQ pair of its own
    assert adds["s"] == ["DequantizeLinear", "DequantizeLinear"]  # QLinearAdd
    feeds = numerics.random_feeds(proto, seed=5)
    a = numerics.run(proto, feeds)["y"].ravel().astype(np.float64)
    b = numerics.run(out, feeds)["y"].ravel().astype(np.float64)
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.998


# A residual Add whose sum only LowerPRelu's Relu(s) + Min(s, 0) · a reads, as MediaPipe's palm
# detector has 24 times.
RESIDUAL_PRELU = """
    agraph (float[1, 4, 12, 12] x) => (float[1, 8, 12, 12] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        c2 = Conv <pads = [1, 1, 1, 1]> (x, w2)
        s = Add(c1, c2)
        pos = Relu(s)
        neg = Min(s, zero)
        scaled = Mul(neg, slope)
        p = Add(pos, scaled)
        c3 = Conv <pads = [1, 1, 1, 1]> (p, w3)
        y = Relu(c3)
    }"""


def test_an_add_whose_readers_all_stay_float_is_not_quantized():
    # The PRelu sum, fed float values alone, stays float; then nothing int8 reads the residual
    # sum, and quantizing it would round what the float PRelu reads (palm: cosine 0.991, 0.994
    # without).
    _, out = _int8(RESIDUAL_PRELU, inputs={1: 4, 2: 4})
    readers = {r.op_type for r in out.graph.node if "s" in r.input}
    assert readers == {"Relu", "Min"}  # the float sum itself, not a DequantizeLinear of it
