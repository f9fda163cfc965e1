"""Differential fuzzing of the rewrite passes: random valid models built from the patterns they
look for (and near misses, and traps around them) compute the same outputs once compiled, at
every level and for every kind of target.

CI runs a fixed, derandomized set of examples; GRAPHOPT_FUZZ_EXAMPLES=2000 runs more locally."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from fuzz_models import feeds_for, models
from hypothesis import HealthCheck, event, given, settings

import graphopt
from graphopt import numerics
from graphopt.errors import GraphoptError, PassError

EXAMPLES = int(os.environ.get("GRAPHOPT_FUZZ_EXAMPLES", "0")) or None
CONFIGS = [(level, target) for target in (None, "cpu", "ascend310") for level in (1, 2, 3)]

# Tolerances: a rewrite may reorder a sum (a BatchNorm folded into the weights, a MatMul + Add
# as one Gemm), which moves a result by a few ulps of the terms summed, not of the result: the
# absolute part scales with the output's largest magnitude. WinogradConv (-O3 on the cpu target)
# rounds relative to the layer's outputs too (tests/test_winograd.py's SCALED_TOLERANCE).
FLOAT32 = dict(rtol=1e-4, atol=1e-5)
WINOGRAD_SCALED = 4e-5
# float16 keeps 11 bits: a fused op that rounds once where the original rounded at every node
# differs from it by a few of its ulps (1e-3).
FLOAT16 = dict(rtol=1e-2, atol=1e-2)


def fuzz_settings(default_examples: int):
    return settings(max_examples=EXAMPLES or default_examples, deadline=None, derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.too_slow,
                                                          HealthCheck.filter_too_much])


def run(proto: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return numerics.run(proto, feeds)


def compile_or_refuse(proto, level, target, **options):
    """The compiled model, or None when graphopt refused the model cleanly. A PassError, or a
    refusal that says it is a graphopt bug, fails: the input is valid."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return graphopt.optimize(proto, level=level, target=target, **options)
        except GraphoptError as exc:
            assert not isinstance(exc, PassError) and "graphopt bug" not in str(exc), str(exc)
            event(f"refused: {type(exc).__name__}")
            return None


def assert_close(expected, actual, tolerance, scaled: float, where: str) -> None:
    assert sorted(actual) == sorted(expected), where
    for name, want in expected.items():
        got = actual[name]
        assert got.shape == want.shape and got.dtype == want.dtype, \
            f"{where} {name}: {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        finite = np.abs(want[np.isfinite(want)].astype(np.float64))
        peak = float(finite.max()) if finite.size else 0.0
        atol = max(tolerance["atol"] * max(1.0, peak), scaled * peak)
        np.testing.assert_allclose(got, want, rtol=tolerance["rtol"], atol=atol,
                                   err_msg=f"{where} {name}")


def check(proto: onnx.ModelProto, symbolic: bool, tmp_path) -> None:
    onnx.checker.check_model(proto, full_check=True)  # a generator bug otherwise
    feed_sets = [feeds_for(proto, batch) for batch in ((1, 3) if symbolic else (1,))]
    try:
        expected = [run(proto, feeds) for feeds in feed_sets]
    except Exception as exc:  # onnxruntime's own refusal of a valid model (no fp16 kernel)
        event(f"onnxruntime refuses the original: {str(exc)[:60]}")
        return
    half = proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    for level, target in CONFIGS:
        where = f"-O{level} target={target}"
        result = compile_or_refuse(proto, level, target)
        if result is None:
            continue
        compiled = result.to_onnx()
        if level == 3:  # what the fusions made, in the statistics
            given = {n.op_type for n in proto.graph.node}
            for op in sorted({n.op_type for n in compiled.graph.node} - given):
                event(f"made {op} for {target}")
        onnx.checker.check_model(compiled, full_check=True)
        winograd = level == 3 and target == "cpu"
        scaled = WINOGRAD_SCALED if winograd else 0.0
        tolerance = FLOAT16 if half else FLOAT32
        for feeds, want in zip(feed_sets, expected):
            assert_close(want, run(compiled, feeds), tolerance, scaled, where)
        if result.partitioning is not None and len(result.partitioning.partitions) > 1:
            # Several device partitions: the .om runs each and routes tensors between them.
            event("several partitions")
            path = tmp_path / "model.om"
            graphopt.save(result, path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                session = graphopt.load(path, optimization_level="disable")
                for feeds, want in zip(feed_sets, expected):
                    assert_close(want, session.run(feeds), tolerance, scaled, where + " .om")


@fuzz_settings(25)
@given(case=models("conv"))
def test_conv_nets_compile_to_the_same_outputs(case, tmp_path_factory):
    check(*case, tmp_path_factory.mktemp("om"))


@fuzz_settings(25)
@given(case=models("sequence"))
def test_sequence_nets_compile_to_the_same_outputs(case, tmp_path_factory):
    check(*case, tmp_path_factory.mktemp("om"))


@pytest.mark.parametrize("family", ["conv", "sequence"])
def test_the_generator_makes_models_onnxruntime_runs(family):
    # The property above discards models onnxruntime refuses; most must not be.
    from hypothesis import find

    found = find(models(family), lambda case: case[0].graph.input[0].type.tensor_type
                 .elem_type == onnx.TensorProto.FLOAT and len(case[0].graph.node) >= 3,
                 settings=settings(derandomize=True, database=None))
    run(found[0], feeds_for(found[0], 1))
