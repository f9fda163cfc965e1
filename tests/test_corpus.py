"""Every model of the onnx wheel's corpus that onnxruntime runs survives (a) import→export with
no passes and (b) every optimization level: same outputs at ORT_DISABLE_ALL, valid for
onnx.checker."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import graphopt
from graphopt import numerics
from graphopt.codegen import OmSession
from graphopt.ir import format_model, load_onnx, to_onnx, verify

from corpus import corpus_models, model_inputs, run_outputs

MODELS = corpus_models()
RTOL, ATOL = 1e-4, 1e-5
OUTCOMES: dict[str, str] = {}  # model id -> "ok" or the skip reason, reported at the end
PARTITIONS: dict[str, int] = {}  # model id -> partitions of its ascend310 artifact


def _flatten(outputs: dict) -> dict[str, np.ndarray]:
    flat = {}
    for name, value in outputs.items():
        if isinstance(value, list):
            for i, item in enumerate(value):
                flat[f"{name}[{i}]"] = np.asarray(item)
        else:
            flat[name] = np.asarray(value)
    return flat


@pytest.fixture(scope="module")
def reference_cache():
    return {}


def _reference(entry, cache):
    if entry.id not in cache:
        original = onnx.load(entry.path)
        feeds = model_inputs(entry, original)
        try:
            cache[entry.id] = (feeds, _flatten(run_outputs(original, feeds)))
        except Exception as e:  # noqa: BLE001 - the runtime's refusal is the skip reason
            cache[entry.id] = (feeds, f"onnxruntime cannot run the original: "
                                      f"{numerics_reason(e)}")
    return cache[entry.id]


def numerics_reason(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:160]


def _check(entry, candidate: onnx.ModelProto, feeds, expected) -> None:
    onnx.checker.check_model(candidate)
    actual = _flatten(run_outputs(candidate, feeds))
    problems = numerics.compare(expected, actual, RTOL, ATOL)
    assert not problems, f"{entry.id}: " + "; ".join(map(str, problems))


@pytest.mark.parametrize("entry", MODELS, ids=[m.id for m in MODELS])
def test_round_trip_is_lossless(entry, reference_cache):
    feeds, expected = _reference(entry, reference_cache)
    if isinstance(expected, str):
        OUTCOMES[entry.id] = expected
        pytest.skip(expected)
    model = load_onnx(entry.path)
    verify(model)
    exported = to_onnx(model)
    assert format_model(load_onnx(exported)) == format_model(model)
    _check(entry, exported, feeds, expected)


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("entry", MODELS, ids=[m.id for m in MODELS])
def test_pipelines_preserve_outputs(entry, level, reference_cache):
    feeds, expected = _reference(entry, reference_cache)
    if isinstance(expected, str):
        pytest.skip(expected)
    result = graphopt.optimize(entry.path, level=level, verify_structure=True)
    _check(entry, result.to_onnx(), feeds, expected)
    if level == 2:
        OUTCOMES[entry.id] = "ok"


@pytest.mark.parametrize("target, level", [("ascend310", 2), ("cpu", 2), ("cpu", 3)],
                         ids=["ascend310", "cpu", "cpu-O3"])
@pytest.mark.parametrize("entry", MODELS, ids=[m.id for m in MODELS])
def test_artifacts_reproduce_outputs(entry, target, level, reference_cache, tmp_path):
    """Compiled into an .om — for ascend310 device partitions, each its own onnxruntime
    session with tensors routed between them; for cpu conv nets blocked into NCHWc and weights
    mapped from the artifact, and at -O3 the CPU's own passes' order (Winograd, the layout,
    then elementwise groups) — the model still computes the same outputs."""
    feeds, expected = _reference(entry, reference_cache)
    if isinstance(expected, str):
        pytest.skip(expected)
    result = graphopt.optimize(entry.path, target=target, level=level)
    path = tmp_path / "model.om"
    graphopt.save(result, path)
    artifact = graphopt.codegen.load_om(path)
    for part in artifact.partitions:
        onnx.checker.check_model(artifact.partition_model(part.name))  # weights back inside
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU stand-in notice
        session = OmSession(path, optimization_level="disable")  # no ORT fusion hides a bug
    wanted = [o["name"] for o in session.outputs]
    actual = _flatten(dict(zip(wanted, (session.run(feeds)[n] for n in wanted))))
    problems = numerics.compare(expected, actual, RTOL, ATOL)
    assert not problems, f"{entry.id}: " + "; ".join(map(str, problems))
    if target == "ascend310":
        PARTITIONS[entry.id] = len(result.partitioning.partitions)


def test_corpus_counts(capsys):
    """Runs last in this file: prints how many models were checked and why any were skipped."""
    if not OUTCOMES:
        pytest.skip("corpus tests were deselected")
    ok = sum(1 for v in OUTCOMES.values() if v == "ok")
    skipped = {k: v for k, v in OUTCOMES.items() if v != "ok"}
    with capsys.disabled():
        print(f"\ncorpus: {len(MODELS)} models, {ok} checked (round-trip and -O1/-O2/-O3), "
              f"{len(skipped)} skipped")
        for model_id, reason in sorted(skipped.items()):
            print(f"  skipped {model_id}: {reason}")
        split = sum(1 for n in PARTITIONS.values() if n > 1)
        print(f"corpus on ascend310: {len(PARTITIONS)} artifacts reproduce their outputs, "
              f"{split} with more than one partition")
    if len(OUTCOMES) == len(MODELS):
        # A floor, so that a runtime upgrade that silently refuses most models fails loudly.
        assert ok >= 100
