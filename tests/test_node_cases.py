"""ONNX's own operator test cases (onnx.backend.test.case.node, generated from the installed
onnx): one case per op type, compiled into an .om, must give what onnxruntime gives on the
original at ORT_DISABLE_ALL. Every case onnxruntime runs is checked locally by setting
GRAPHOPT_NODE_CASES=all (about a minute more)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnxruntime as ort
import pytest

import graphopt
from graphopt.errors import GraphoptError

RTOL, ATOL = 1e-4, 1e-5
RTOL_16, ATOL_16 = 2e-2, 2e-3  # float16 and bfloat16 outputs: their own rounding


def _cases() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own deprecation warnings
        from onnx.backend.test.case import node as node_cases

        cases = node_cases.collect_testcases(None)
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
