"""Differential fuzzing of the precision modes: random models onnxruntime runs, compiled under
fp16, mixed-fp16, bf16, int8 and int4, must compile or raise a GraphoptError, and a compile
must pass the checker, run at both onnxruntime levels with the original's signature, and agree
with the float32 model within what the mode's rounding explains.

The tolerance is measured, not guessed: the float32 model is run again with every weight, input
and computed float value moved by noise of the mode's size (a relative 2^-11 for float16, a
256th of the tensor's range for int8, a 4-bit step of the weight's range for int4), and the
compile may differ by at most ten times as much as the noisy runs do. Outputs a comparison or a
rounding to integers decides are compared for validity only; integers no float path feeds must
be equal.

CI runs a fixed, derandomized set of examples; GRAPHOPT_FUZZ_EXAMPLES=2000 runs more locally."""

from __future__ import annotations

import os
import re
import tempfile
import warnings

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, event, given, note, settings
from hypothesis import strategies as st
from onnx import numpy_helper
from precision_fuzz_models import BOOL, FLOAT, OPS, build, conv, matmul

import graphopt
from graphopt import numerics
from graphopt.codegen.split import disabled_optimizers
from graphopt.errors import GraphoptError

EXAMPLES = int(os.environ.get("GRAPHOPT_FUZZ_EXAMPLES", "0")) or None
NOISY_RUNS = 3
SLACK = 10.0  # the compile may differ by this many times what the noisy runs do
WELL_SCALED = 1e4  # float16 judged only where every float32 value stays below this


def fuzz_settings(default_examples: int):
    return settings(max_examples=EXAMPLES or default_examples, deadline=None, derandomize=True,
                    database=None, suppress_health_check=list(HealthCheck))


# --- the models --------------------------------------------------------------------------------

def _with_every_value_out(fuzzed) -> onnx.ModelProto:
    """The model with each computed float value an output too (no shape: onnxruntime checks
    the declared ones)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(fuzzed.model)
    declared = {o.name for o in proto.graph.output}
    for v in fuzzed.builder.values:
        if v.kind == FLOAT and v.name not in declared and v.name not in fuzzed.feeds:
            proto.graph.output.append(onnx.helper.make_tensor_value_info(
                v.name, onnx.TensorProto.FLOAT, None))
    return proto


@st.composite
def fuzzed_models(draw, int4: bool = False, int8: bool = False):
    opset = draw(st.integers(13, 18))
    seed = draw(st.integers(0, 2 ** 16))
    layout = draw(st.integers(0, 7))
    steps = draw(st.lists(st.tuples(st.integers(0, len(OPS) - 1), st.integers(0, 63)),
                          min_size=1, max_size=20))
    if int4:  # a sequence input, and a MatMul whose weight has 16 or 32 rows
        layout |= 1
        steps = [(OPS.index(matmul), 0)] + steps
    if int8 and draw(st.booleans()):  # an image input, and two Convs in a row to quantize
        layout &= ~1
        steps = [(OPS.index(conv), 1), (OPS.index(conv), 4)] + steps
    outputs = draw(st.lists(st.integers(0, 63), max_size=3))
    fuzzed = build(opset, seed, layout, steps, outputs, draw(st.booleans()),
                   symbolic=draw(st.booleans()))
    assume(fuzzed is not None)
    try:  # models the generator got wrong are its bug, not the compiler's: fail loudly
        onnx.checker.check_model(fuzzed.model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise AssertionError(f"generated an invalid model: {exc}") from exc
    try:
        values = quiet(numerics.run, _with_every_value_out(fuzzed), fuzzed.feeds)
    except Exception as exc:  # onnxruntime's own limits: only models it runs are compared
        event(f"onnxruntime refused the original: {str(exc)[:80]}")
        assume(False)
    fuzzed.values = values
    try:  # onnxruntime's optimizer has its own bugs (its LayerNormFusion drops a Cast from int)
        quiet(numerics.run, fuzzed.model, fuzzed.feeds, "all")
        fuzzed.loads_at_all = True
    except Exception:  # noqa: BLE001 - then the compile need not load there either
        event("onnxruntime refused the original at ORT_ENABLE_ALL")
        fuzzed.loads_at_all = False
    note(onnx.printer.to_text(fuzzed.model))
    fuzzed.reference = {o.name: values[o.name] for o in fuzzed.model.graph.output}
    for o in fuzzed.outputs:  # the builder's bookkeeping is what the checks below rely on
        assert fuzzed.reference[o.name].shape == o.shape, (o, fuzzed.reference[o.name].shape)
    event(f"opset {opset}")
    return fuzzed


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# --- noise of a mode's size --------------------------------------------------------------------

def _noise(array, rng, relative, of_range, floor=0.0):
    array = np.asarray(array, np.float32)
    top = float(np.max(np.abs(array[np.isfinite(array)]), initial=0.0))
    size = relative * np.abs(array) + of_range * top + floor
    return (rng.uniform(-1, 1, array.shape) * size).astype(np.float32)


def noisy_model(fuzzed, rng, relative, of_range, floor, weights_only=None):
    """The float32 model with noise added to its weights (those in `weights_only`, if given) and,
    unless weights_only is given, to every float value it computes."""
    proto = onnx.ModelProto()
    proto.CopyFrom(fuzzed.model)
    graph = proto.graph
    picked = set(fuzzed.builder.weights) if weights_only is None else weights_only

    def moved(tensor):
        array = numpy_helper.to_array(tensor)
        return numpy_helper.from_array(array + _noise(array, rng, relative, of_range, floor),
                                       tensor.name)

    for init in graph.initializer:
        if init.name in picked:
            init.CopyFrom(moved(init))
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] in picked:
            node.attribute[0].t.CopyFrom(moved(node.attribute[0].t))
    if weights_only is not None:
        return proto
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for i, out in enumerate(node.output):
            value = fuzzed.values.get(out)
            if not isinstance(value, np.ndarray) or value.dtype != np.float32 or out in picked:
                continue
            node.output[i] = out + "__exact"
            noise = numpy_helper.from_array(_noise(value, rng, relative, of_range, floor),
                                            out + "__noise")
            graph.initializer.append(noise)
            nodes.append(onnx.helper.make_node("Add", [node.output[i], noise.name], [out]))
    del graph.node[:]
    graph.node.extend(nodes)
    return proto


def noisy_feeds(fuzzed, rng, relative, of_range, floor):
    return {k: v + _noise(v, rng, relative, of_range, floor) if v.dtype == np.float32 else v
            for k, v in fuzzed.feeds.items()}


def noisy_outputs(fuzzed, relative, of_range=0.0, floor=0.0, weights_only=None):
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(NOISY_RUNS):
        proto = noisy_model(fuzzed, rng, relative, of_range, floor, weights_only)
        feeds = fuzzed.feeds if weights_only is not None else \
            noisy_feeds(fuzzed, rng, relative, of_range, floor)
        runs.append(quiet(numerics.run, proto, feeds))
    return runs


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / na / nb)


def well_scaled(fuzzed, limit=WELL_SCALED) -> bool:
    return all(np.all(np.abs(v) < limit) for v in fuzzed.values.values()
               if isinstance(v, np.ndarray) and v.dtype == np.float32)


# --- the checks --------------------------------------------------------------------------------

def compile_(fuzzed, **options):
    """optimize's result, or None when it raised a GraphoptError (any other exception fails)."""
    try:
        return quiet(graphopt.optimize, fuzzed.model, **options)
    except GraphoptError as exc:
        message = str(exc).strip()
        assert message and "Traceback" not in message, repr(exc)
        event(f"refused: {type(exc).__name__}")
        return None


def check_valid(fuzzed, result, output_type=None) -> list[dict]:
    """The compiled model passes the checker and runs at both levels with the original's
    signature (its float outputs float16 under output_type FP16); its outputs at each level
    (float16 ones widened)."""
    proto = result.to_onnx()
    onnx.checker.check_model(proto, full_check=True)
    half = onnx.TensorProto.FLOAT16 if output_type == "FP16" else onnx.TensorProto.FLOAT
    original = [(o.name, half if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
                 else o.type.tensor_type.elem_type) for o in fuzzed.model.graph.output]
    compiled = [(o.name, o.type.tensor_type.elem_type) for o in proto.graph.output]
    assert compiled == original
    runs = []
    for level in ("disable", "all") if fuzzed.loads_at_all else ("disable",):
        try:
            got = quiet(numerics.run, proto, fuzzed.feeds, level)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's refusals have no common type
            # onnxruntime 1.32's LayerNormFusion takes a leading Cast's input whatever its
            # dtype (a norm that fp16 converts at -O1 behind the input's Cast); graphopt's
            # .om sessions skip that fusion, as `disabled_optimizers` says: only that refusal.
            assert level == "all" and "LayerNormFusion" in str(exc), exc
            event("onnxruntime's LayerNormFusion refused the compile: run as its .om would")
            got = quiet(numerics.run, proto, fuzzed.feeds, level,
                        disabled_optimizers=disabled_optimizers(result.model, level))
        for name, elem_type in compiled:
            want = fuzzed.reference[name]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
            assert got[name].shape == want.shape and got[name].dtype == dtype, \
                (name, level, got[name].shape, got[name].dtype, want.shape, want.dtype)
        runs.append({k: v.astype(np.float32) if v.dtype == np.float16 else v
                     for k, v in got.items()})
    return runs


def check_exact(fuzzed, runs):
    """Integers and bools no float computation decides are equal; float outputs are finite
    where the original's are, on a model whose values stay well inside float16's range."""
    scaled = well_scaled(fuzzed)
    for o in fuzzed.outputs:
        want = fuzzed.reference[o.name]
        for got in runs:
            if o.kind != FLOAT and o.exact:
                np.testing.assert_array_equal(got[o.name], want, err_msg=o.name)
            elif o.kind == FLOAT and scaled:
                assert np.isfinite(got[o.name])[np.isfinite(want)].all(), o.name


def check_close(fuzzed, runs, noisy):
    """Each smooth float output differs from the original by at most SLACK times the most any
    noisy run does (plus float32's own rounding of the output's scale)."""
    for o in fuzzed.outputs:
        if o.kind != FLOAT or not o.smooth:
            continue
        want = fuzzed.reference[o.name].astype(np.float64)
        allowed = max(np.max(np.abs(n[o.name] - want), initial=0.0) for n in noisy)
        floor = 1e-6 * np.max(np.abs(want), initial=0.0) + 1e-7
        for got in runs:
            err = np.max(np.abs(got[o.name] - want), initial=0.0)
            assert err <= SLACK * allowed + floor, \
                f"{o.name}: differs by {err:.3g}, noise of the mode's size by {allowed:.3g}"


def check_cosine(fuzzed, runs, noisy, makes_sense):
    """A loose cosine bound on outputs where noise of the mode's size keeps cosine ≥
    `makes_sense`: 1 - cosine at most SLACK times the noisy runs' worst."""
    for o in fuzzed.outputs:
        if o.kind != FLOAT or not o.smooth:
            continue
        want = fuzzed.reference[o.name]
        if not np.isfinite(want).all():
            continue
        worst = min(cosine(n[o.name], want) for n in noisy)
        if not worst >= makes_sense:  # NaN too: the noise took a value out of its domain
            event("cosine: output too sensitive to judge")
            continue
        for got in runs:
            c = cosine(got[o.name], want)
            assert 1 - c <= SLACK * (1 - worst) + 1e-6, \
                f"{o.name}: cosine {c:.6f}, noise of the mode's size {worst:.6f}"


HALF = {"fp16": dict(relative=2.0 ** -11, floor=6e-8),
        "bf16": dict(relative=2.0 ** -8, floor=1e-38)}


def check_half(fuzzed, result, mode, output_type=None):
    runs = check_valid(fuzzed, result, output_type)
    check_exact(fuzzed, runs)
    if mode == "fp16" and not well_scaled(fuzzed):
        event("fp16: not well scaled, not compared")
        return
    check_close(fuzzed, runs, noisy_outputs(fuzzed, **HALF[mode]))


# --- the tests ---------------------------------------------------------------------------------

TARGETS = st.sampled_from([None, "cpu"])
LEVELS = st.sampled_from([1, 2, 3])


def refused_ops(message: str) -> set[str]:
    """The op types a bf16 refusal names (`no bfloat16 kernel for Add ×2, Where; keep …`)."""
    match = re.search(r"no bfloat16 kernel for (.*?); keep them", message)
    assert match, message
    return {re.sub(r" ×\d+$", "", op) for op in match.group(1).split(", ")}


@fuzz_settings(100)
@given(fuzzed=fuzzed_models(), target=TARGETS, level=LEVELS,
       mode=st.sampled_from(["fp16", "bf16"]))
def test_fp16_and_bf16_compile_run_and_agree(fuzzed, target, level, mode):
    options = dict(target=target, level=level, precision=mode)
    try:
        result = quiet(graphopt.optimize, fuzzed.model, **options)
    except GraphoptError as exc:
        assert mode == "bf16", f"fp16 has a kernel for every op on the cpu target: {exc}"
        # The refusal names every op the target lacks: denied, the rest must compile and load.
        event("bf16: refused, then compiled with the ops it named denied")
        result = quiet(graphopt.optimize, fuzzed.model, **options,
                       pass_options={"precision_deny": refused_ops(str(exc))})
    event(f"{mode}: compiled")
    check_half(fuzzed, result, mode)


@fuzz_settings(100)
@given(fuzzed=fuzzed_models(), target=TARGETS, level=LEVELS, data=st.data())
def test_mixed_fp16_with_random_lists_compiles_runs_and_agrees(fuzzed, target, level, data):
    op_types = sorted({n.op_type for n in fuzzed.model.graph.node})
    names = sorted(n.name for n in fuzzed.model.graph.node)
    subset = st.lists(st.sampled_from(op_types), max_size=2, unique=True) if op_types \
        else st.just([])
    options = {}
    if data.draw(st.booleans(), "lists"):
        allow = set(data.draw(subset, "allow"))
        options = {"precision_allow": allow,  # an op in both lists is refused
                   "precision_deny": set(data.draw(subset, "deny")) - allow,
                   "keep_dtype": set(data.draw(st.lists(st.sampled_from(names), max_size=2),
                                               "keep_dtype"))}
    output_type = data.draw(st.sampled_from([None, "FP16"]), "output_type")
    result = quiet(graphopt.optimize, fuzzed.model, target=target, level=level,
                   precision="mixed-fp16", pass_options=options, output_type=output_type)
    event("mixed-fp16: compiled")
    check_half(fuzzed, result, "fp16", output_type)


def _calibration(fuzzed, folder, rng, samples, as_directory):
    """The feeds and `samples - 1` more drawn alike: minmax ranges then cover the feeds."""
    drawn = [fuzzed.feeds] + [
        {k: (rng.standard_normal(v.shape).astype(np.float32) if v.dtype == np.float32
             else rng.permutation(v.ravel()).reshape(v.shape)) for k, v in fuzzed.feeds.items()}
        for _ in range(samples - 1)]
    if as_directory:
        for i, feeds in enumerate(drawn):
            np.savez(os.path.join(folder, f"{i:02}.npz"), **feeds)
        return folder
    path = os.path.join(folder, "calib.npz")
    np.savez(path, **{k: np.stack([d[k] for d in drawn]) for k in fuzzed.feeds})
    return path


@fuzz_settings(80)
@given(fuzzed=fuzzed_models(int8=True), target=TARGETS, level=LEVELS, samples=st.integers(1, 4),
       as_directory=st.booleans(), keep_ends=st.booleans(),
       method=st.sampled_from(["minmax", "minmax", "percentile", "entropy", "mse"]))
def test_int8_compiles_runs_and_keeps_cosine(fuzzed, target, level, samples, as_directory,
                                            keep_ends, method):
    assume(any(v.kind == FLOAT for v in fuzzed.builder.values if v.name in fuzzed.feeds))
    with tempfile.TemporaryDirectory() as folder:
        calibration = _calibration(fuzzed, folder, np.random.default_rng(samples), samples,
                                   as_directory)
        result = compile_(fuzzed, target=target, level=level, quantize="int8",
                          calibration=calibration,
                          pass_options={"quant_keep_ends": keep_ends,
                                        "calibration_method": method})
    if result is None:
        return
    quantized = [n.op_type for n in result.to_onnx().graph.node
                 if "Quantize" in n.op_type or "Integer" in n.op_type]
    event(f"int8: compiled, {'quantized' if quantized else 'nothing quantized'}")
    runs = check_valid(fuzzed, result)
    check_exact(fuzzed, runs)
    # Only minmax ranges cover the feeds (one of the samples); the others clip by design.
    if method == "minmax" and well_scaled(fuzzed):
        check_cosine(fuzzed, runs, noisy_outputs(fuzzed, 0.0, of_range=2 / 255), 0.99)


@fuzz_settings(80)
@given(fuzzed=fuzzed_models(int4=True), target=TARGETS, level=LEVELS,
       mixed=st.sampled_from(["keep", "mixed-fp16", "fp16"]), embeddings=st.booleans(),
       accuracy_level=st.sampled_from([0, 4]), gptq=st.booleans())
def test_int4_compiles_runs_and_keeps_cosine(fuzzed, target, level, mixed, embeddings,
                                            accuracy_level, gptq):
    options = {"int4_group_size": 16, "int4_embeddings": embeddings,
               "int4_accuracy_level": accuracy_level}
    with tempfile.TemporaryDirectory() as folder:
        calibration = None
        if gptq:
            options["int4_method"] = "gptq"
            calibration = _calibration(fuzzed, folder, np.random.default_rng(0), 4, False)
        result = compile_(fuzzed, target=target, level=level, quantize="int4", precision=mixed,
                          calibration=calibration, pass_options=options)
    if result is None:
        return
    proto = result.to_onnx()
    quantized = [n for n in proto.graph.node if n.op_type == "MatMulNBits"]
    event(f"int4: {'quantized' if quantized else 'nothing quantized'} ({mixed})")
    runs = check_valid(fuzzed, result)
    check_exact(fuzzed, runs)
    if mixed != "keep" and not well_scaled(fuzzed):
        return
    if mixed != "keep" and accuracy_level == 4 and quantized:
        # onnxruntime 1.32's prepacked float16 MatMulNBits at accuracy_level 4 computes a
        # chain of two of them wrongly below ORT_ENABLE_ALL (cosine 0.89 where prepacking off,
        # or ORT_ENABLE_ALL, gives 0.9997): judged where an .om runs it, at ORT_ENABLE_ALL.
        event("int4: float16 accuracy_level 4 judged at ORT_ENABLE_ALL only")
        runs = runs[1:]
    weights = matmul_weights(fuzzed.model) | (gather_tables(fuzzed.model) if embeddings
                                               else set())
    noisy = noisy_outputs(fuzzed, 0.0, of_range=1 / 15, weights_only=weights)
    if mixed != "keep":  # and float16 everywhere else
        noisy += noisy_outputs(fuzzed, **HALF["fp16"])
    if accuracy_level == 4:  # and activations rounded to int8 on the fly
        noisy += noisy_outputs(fuzzed, 0.0, of_range=1 / 127)
    check_cosine(fuzzed, runs, noisy, 0.98)


def matmul_weights(model) -> set[str]:
    return {n.input[1] for n in model.graph.node if n.op_type in ("MatMul", "Gemm")}


def gather_tables(model) -> set[str]:
    return {n.input[0] for n in model.graph.node if n.op_type == "Gather"}


@fuzz_settings(6)
@given(fuzzed=fuzzed_models(), mode=st.sampled_from(["fp16", "mixed-fp16"]))
def test_om_of_a_converted_model_loads_and_runs(fuzzed, mode, tmp_path_factory):
    result = compile_(fuzzed, target="cpu", precision=mode)
    assume(result is not None)
    path = tmp_path_factory.mktemp("om") / "model.om"
    graphopt.save(result, path)
    got = quiet(graphopt.load(path).run, fuzzed.feeds)
    for o in fuzzed.outputs:
        want = fuzzed.reference[o.name]
        assert got[o.name].shape == want.shape and got[o.name].dtype == want.dtype
        if o.kind != FLOAT and o.exact:
            np.testing.assert_array_equal(got[o.name], want)


@pytest.mark.parametrize("kind", [FLOAT, BOOL])
def test_the_generator_makes_outputs_of_each_kind(kind):
    # Without them the checks on exact outputs would check nothing.
    steps = [(i, n) for n in range(4) for i in range(len(OPS))]
    fuzzed = build(17, 0, 7, steps, list(range(64)), True)
    assert any(o.kind == kind for o in fuzzed.outputs)
