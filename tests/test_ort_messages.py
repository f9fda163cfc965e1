"""onnxruntime's errors reach the user without the C++ source location and function signature
it puts before the sentence that says what is wrong."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import parse_model

import graphopt
from graphopt.errors import GraphoptError
from graphopt.ort_messages import without_source_location


@pytest.mark.parametrize("raw, shown", [
    ("[ONNXRuntimeError] : 1 : FAIL : /onnxruntime_src/onnxruntime/core/graph/"
     "model_load_utils.h:46 void onnxruntime::model_load_utils::ValidateOpsetForDomain(const "
     "std::unordered_map<std::__cxx11::basic_string<char>, int>&, const "
     "onnxruntime::logging::Logger&, bool, const std::string&, int) ONNX Runtime only "
     "*guarantees* support for models stamped with official released onnx opset versions.",
     "[ONNXRuntimeError] : 1 : FAIL : ONNX Runtime only *guarantees* support for models "
     "stamped with official released onnx opset versions."),
    ("Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/math/gemm_helper.h:14 "
     "onnxruntime::GemmHelper::GemmHelper(const onnxruntime::TensorShape&, bool) "
     "left.NumDimensions() == 2 was false.",
     "Status Message: left.NumDimensions() == 2 was false."),
    ("Invalid rank for input: x Got: 1 Expected: 2", "Invalid rank for input: x Got: 1 Expected: 2"),
])
def test_the_source_location_goes_and_the_reason_stays(raw, shown):
    assert without_source_location(raw) == shown


def test_a_run_that_onnxruntime_fails_says_why_without_its_sources(tmp_path):
    # A Reshape of [1, 4] to the [3, 5] fed with it: onnxruntime fails the run.
    proto = parse_model("""
        g (float[1, 4] x, int64[2] shape) => (float[?, ?] y) { y = Reshape (x, shape) }""")
    onnx.save(proto, tmp_path / "m.onnx")
    graphopt.save(graphopt.optimize(str(tmp_path / "m.onnx")), str(tmp_path / "m.om"))
    with pytest.raises(GraphoptError) as caught:
        graphopt.load(tmp_path / "m.om").run({"x": np.ones((1, 4), np.float32),
                                              "shape": np.array([3, 5], np.int64)})
    message = str(caught.value)
    assert "cannot be reshaped to the requested shape" in message
    assert "onnxruntime_src" not in message and "ReshapeHelper::" not in message
