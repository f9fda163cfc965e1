"""Static operands that cannot work together are refused at import, naming the node: ONNX's
inference lets them through, onnxruntime loads the model and fails at every run (a Conv of
group 0 was a ZeroDivisionError in an NPU compile's tiling)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import parse_model

import graphopt
from graphopt.errors import InputError

RNG = np.random.default_rng(0)


def _weights(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


CONV = "g (float[1,{c},8,8] x) => (y) {{ y = Conv <pads = [1,1,1,1]{attrs}> (x, w{bias}) }}"


@pytest.mark.parametrize("text, weights, message", [
    (CONV.format(c=3, attrs="", bias=""), {"w": _weights(4, 5, 3, 3)},
     "reads 3 channels, where its weight of shape [4, 5, 3, 3] with group=1 takes 5"),
    (CONV.format(c=4, attrs=", group = 0", bias=""), {"w": _weights(4, 4, 3, 3)},
     "has group=0; a group count is at least 1"),
    (CONV.format(c=3, attrs=", group = 3", bias=""), {"w": _weights(4, 1, 3, 3)},
     "has 4 output channels (its weight's dim 0), which group=3 does not divide"),
    (CONV.format(c=3, attrs=", kernel_shape = [5,5]", bias=""), {"w": _weights(4, 3, 3, 3)},
     "has kernel_shape=[5, 5], where its weight's is [3, 3]"),
    (CONV.format(c=3, attrs="", bias=", b"), {"w": _weights(4, 3, 3, 3), "b": _weights(7)},
     "has a bias of shape [7] for 4 output channels"),
    ("g (float[1,4] x) => (y) { y = Gemm <transB = 1> (x, w, c) }",
     {"w": _weights(3, 4), "c": _weights(7)},
     "has C of shape [7], which does not broadcast to its [1, 3]"),
    ("g (float[1,4] x) => (y) { y = Clip (x, lo) }", {"lo": _weights(2)},
     "has a min of shape [2]; a bound is a scalar"),
])
@pytest.mark.parametrize("target", [None, "ascend310"])
def test_operands_that_cannot_work_together_are_refused(text, weights, message, target):
    with pytest.raises(InputError, match="onnxruntime loads such a model and fails at every run"
                       ) as refused:
        graphopt.optimize(parse_model(text, **weights), target=target)
    assert message in str(refused.value)


def test_operands_that_fit_compile():
    # Grouped and depthwise convs, a bias of one per channel, Gemm's broadcast C, scalar bounds.
    for text, weights in (
            (CONV.format(c=4, attrs=", group = 2", bias=", b"),
             {"w": _weights(6, 2, 3, 3), "b": _weights(6)}),
            (CONV.format(c=4, attrs=", group = 4, kernel_shape = [3,3]", bias=""),
             {"w": _weights(4, 1, 3, 3)}),
            ("g (float[2,4] x) => (y) { y = Gemm <transB = 1> (x, w, c) }",
             {"w": _weights(3, 4), "c": _weights(1, 3)}),
            ("g (float[1,4] x) => (y) { y = Clip (x, lo, hi) }",
             {"lo": np.array(-1, np.float32), "hi": np.array([1], np.float32)})):
        graphopt.optimize(parse_model(text, **weights))
