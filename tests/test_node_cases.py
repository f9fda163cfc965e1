"""ONNX's own operator test cases (onnx.backend.test.case.node, generated from the installed
onnx), compiled by graphopt, must give what onnxruntime gives on the original at
ORT_DISABLE_ALL: one case per op type into an .om at cpu -O2 and ascend310 -O3 alternately
(every case with GRAPHOPT_NODE_CASES=all, about a minute more), and every case into an
ascend310 .om at -O2 and, with its inputs made weights, for the cpu, where folding computes
the op (about 45 s)."""

from __future__ import annotations

import copy
import functools
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import graphopt
from graphopt.errors import GraphoptError

RTOL, ATOL = 1e-4, 1e-5
RTOL_16, ATOL_16 = 2e-2, 2e-3  # float16 and bfloat16 outputs: their own rounding


@functools.cache
def _all_cases() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own deprecation warnings
        from onnx.backend.test.case import node as node_cases

        return node_cases.collect_testcases(None)


def _cases() -> list:
    cases = _all_cases()
    if os.environ.get("GRAPHOPT_NODE_CASES") == "all":
        return cases
    first: dict[str, object] = {}
    for case in sorted(cases, key=lambda c: c.name):
        ops = [n.op_type for n in case.model.graph.node]
        first.setdefault(ops[0] if ops else "", case)
    return list(first.values())


def _reference(data: bytes, feeds: dict):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # not the expanded functions' unused-initializer warnings
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _difference(expected, got) -> str | None:
    """Why `got` is not `expected` (None when it is), for tensors and sequences of them."""
    if isinstance(expected, list) or isinstance(got, list):
        if not (isinstance(expected, list) and isinstance(got, list)) or len(expected) != len(got):
            return "sequences differ in length"
        return next(filter(None, map(_difference, expected, got)), None)
    if isinstance(expected, dict) or isinstance(got, dict):
        return None if expected == got else "maps differ"
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return (f"{got.dtype}{list(got.shape)} where onnxruntime gives "
                f"{expected.dtype}{list(expected.shape)}")
    if expected.dtype.kind == "f" or expected.dtype.name.startswith(("bfloat16", "float8")):
        rtol, atol = (RTOL, ATOL) if expected.dtype.itemsize >= 4 else (RTOL_16, ATOL_16)
        e, g = expected.astype(np.float64), got.astype(np.float64)
        if not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
            return f"max abs error {np.nanmax(np.abs(g - e)):.3g}"
        return None
    return None if np.array_equal(expected, got) else "values differ"


@pytest.mark.filterwarnings("ignore:CANNExecutionProvider not installed")
def test_each_op_types_first_case_compiles_to_what_onnxruntime_computes(tmp_path):
    checked, problems = 0, []
    for index, case in enumerate(_cases()):
        data = case.model.SerializeToString()
        if not case.data_sets:
            continue
        try:
            session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            names = [i.name for i in session.get_inputs()]
            inputs = case.data_sets[0][0]
            if len(inputs) != len(names):
                continue
            feeds = dict(zip(names, inputs))
            expected = _reference(data, feeds)
        except Exception:  # noqa: BLE001 - onnxruntime cannot run the original: not a case here
            continue
        # Both paths: the cpu target at -O2, an NPU target (partitioned, layouts) at -O3.
        target, level = ("cpu", 2) if index % 2 == 0 else ("ascend310", 3)
        path = tmp_path / "case.om"
        try:
            graphopt.save(graphopt.optimize(case.model, level=level, target=target), path)
            outputs = graphopt.load(path).run(feeds)
            got = [outputs[o.name] for o in session.get_outputs()]
        except GraphoptError as exc:
            problems.append(f"{case.name} ({target} -O{level}): refused: {exc}")
            continue
        for output, want, have in zip(session.get_outputs(), expected, got):
            why = _difference(want, have)
            if why:
                problems.append(f"{case.name} ({target} -O{level}): {output.name}: {why}")
        checked += 1
    assert checked >= 150, f"only {checked} cases ran"  # 166 with onnx 1.23, onnxruntime 1.32
    assert not problems, "\n".join(problems)



def _ran(data: bytes, feeds: dict) -> list | None:
    """onnxruntime's outputs at ORT_DISABLE_ALL, or None where it cannot run the model."""
    try:
        return _reference(data, feeds)
    except Exception:  # noqa: BLE001 - no kernel, a feed numpy cannot hold, a preview op
        return None


def _as_weights(model: onnx.ModelProto, inputs: list) -> onnx.ModelProto | None:
    """`model` with every input a weight holding its test value (None where one cannot be:
    a sequence or an optional), so that folding computes the whole graph."""
    weighted = copy.deepcopy(model)
    for value, array in zip(model.graph.input, inputs):
        if not isinstance(array, np.ndarray):
            return None
        weighted.graph.initializer.append(numpy_helper.from_array(array, value.name))
    del weighted.graph.input[:]
    return weighted


def _wrong(case, label: str, expected: list, got: dict) -> list[str]:
    return [f"{case.name} ({label}): {output.name}: {why}"
            for output, want in zip(case.model.graph.output, expected)
            if (why := _difference(want, got.get(output.name))) is not None]


@pytest.mark.filterwarnings("ignore:CANNExecutionProvider not installed")
def test_every_case_compiles_for_the_npu_and_folds_on_the_cpu(tmp_path):
    # One case per op type missed opset 25's windowed Attention (test_attention_bidirectional_
    # window), which the NPU expansion had computed as full attention.
    problems, checked = [], 0
    for case in _all_cases():
        if not case.data_sets:
            continue
        inputs = list(case.data_sets[0][0])
        if len(inputs) != len(case.model.graph.input):
            continue
        feeds = {v.name: a for v, a in zip(case.model.graph.input, inputs)}
        expected = _ran(case.model.SerializeToString(), feeds)
        if expected is not None:
            checked += 1
            path = tmp_path / "case.om"
            try:
                graphopt.save(graphopt.optimize(case.model, target="ascend310"), path)
                problems += _wrong(case, "ascend310 .om", expected, graphopt.load(path).run(feeds))
            except Exception as exc:  # noqa: BLE001 - each case's failure is listed
                problems.append(f"{case.name} (ascend310 .om): {type(exc).__name__}: {exc}")
        weighted = _as_weights(case.model, inputs)
        expected = None if weighted is None else _ran(weighted.SerializeToString(), {})
        if expected is not None:
            checked += 1
            try:
                compiled = graphopt.optimize(weighted, target="cpu").to_onnx()
                onnx.checker.check_model(compiled)
                got = dict(zip([o.name for o in compiled.graph.output],
                               _reference(compiled.SerializeToString(), {})))
                problems += _wrong(case, "cpu, inputs as weights", expected, got)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{case.name} (cpu, inputs as weights): "
                                f"{type(exc).__name__}: {exc}")
    assert checked > 2500, checked  # 3,224 with onnx 1.23 and onnxruntime 1.32
    assert not problems, "\n".join(problems)
