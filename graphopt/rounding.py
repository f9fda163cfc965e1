"""Outputs off by rounding alone: what --verify and compare accept beyond rtol/atol, saying so."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import ModelProto, TensorProto

from graphopt import numerics
from graphopt.option_names import option
from graphopt.tools.metrics import FLOAT16_STEP
from graphopt.widened import widened_feeds, widened_to_float32


def within_rounding(original: ModelProto, feeds, expected: dict, actual: dict,
                    failing: list[str], judge: dict,
                    own: Callable[[], dict] | None = None,
                    sensitivity: Callable[[], dict] | None = None) -> str | None:
    """A note when rounding explains every output in `failing` (outside rtol/atol), None
    otherwise: they differ from the original no more than twice as much as onnxruntime's
    optimizer makes the original itself differ (the NCHWc convolutions of a cpu compile
    accumulate in onnxruntime's order at ORT_ENABLE_ALL, and through a detector's box decoding
    that can pass 1e-4: YOLO's 0.035 on 900-pixel coordinates), or, where that optimizer
    changes nothing, they are off at the output's scale only (_rounding_at_scale).

    A tensor of rank 3 or more is judged slice by slice along axis 1, as its worst slice is
    reported: ours in a slice may reach twice onnxruntime's own error in that slice, or twice
    its worst error relative to the whole output's largest magnitude at the slice's scale, and
    the second rule takes each slice's own largest magnitude. A detector's class scores (up to
    0.006) beside its box coordinates (up to 545) are so held to their own scale: an error the
    coordinates' rounding would excuse (0.05 on scores) is not. Neither bound exceeds twice
    onnxruntime's worst error over the whole output.

    Where neither explains it, the original's own sensitivity to rounding does: each slice may
    be off by up to WEIGHT_ROUNDING_FACTOR times the most that moving every weight of the
    original by one unit in the last place moves it (weight_rounding). A sigmoid's scores near
    1 then get the rounding of the logits of tens they come from, which their own scale hides:
    the dynamo YOLO export's class scores are off by 2.5e-4 once its BatchNorms fold, where a
    one-ulp move of its weights moves them by 2.3e-4 (a corrupted score, off by 0.005, is
    twenty times that).

    `own` gives the original's outputs at ORT_ENABLE_ALL on `feeds`, `sensitivity` its
    weight_rounding there (a caller that judges many candidates on one input, as bisect does,
    computes each once); by default they are computed here, when needed."""
    if any(_special_values_differ(expected[name], actual[name]) for name in failing):
        return None
    if original is not None and unreproduced(original, feeds, expected, failing):
        return None  # no yardstick measured on a model that differs from itself is one
    own = own or (lambda: numerics.run(original, feeds, "all"))
    sensitivity = sensitivity or (lambda: weight_rounding(original, feeds))
    stepped = after_quantization(original) if original is not None else set()
    # After a selection, a one-ulp move of the weights may flip a near-tie and pick another
    # box: the movement is then a box's size, and four times it excused boxes all shifted by
    # 200 pixels. Selected outputs get the other rules alone.
    selected = _selections_before(original, failing) if original is not None else {}
    return _within_onnxruntimes_own(own, expected, actual, failing, judge, stepped) \
        or _within_output_scale(expected, actual, failing, judge) \
        or (None if selected else _within_weight_rounding(sensitivity, expected, actual,
                                                          failing, judge)) \
        or _reordered_selection(original, own, expected, actual, failing, judge)


def unreproduced(original: ModelProto, feeds, expected: dict, failing: list[str]) -> list[str]:
    """The outputs in `failing` that a second run of the original, on the same feeds and at
    the same level, does not give again bit for bit: values onnxruntime leaves unwritten (a
    sliding KV cache fed longer than its window: 1.9e25 where the model's values reach 2.7),
    or a model that is not deterministic. Against those, every allowance measured from the
    original's own runs (its optimizer's error, its weights' rounding) was garbage too, and
    had excused them. [] when the second run fails."""
    try:
        again = numerics.run(original, feeds)
    except Exception:  # noqa: BLE001 - no second run to hold it to
        return []
    return [name for name in failing if name in again
            and numerics.compare({name: expected[name]}, {name: again[name]}, 0.0, 0.0)]


def unreproduced_hint(original: ModelProto, feeds, expected: dict, failing: list[str]) -> str:
    """The failure's note on outputs the original itself does not reproduce; "" otherwise."""
    names = unreproduced(original, feeds, expected, failing) if original is not None else []
    if not names:
        return ""
    return (f" (the original itself gives other values for {', '.join(repr(n) for n in names)} "
            "on a second run of the same inputs: onnxruntime leaves them unwritten, or the "
            "model is not deterministic; no comparison can hold them)")


# Ops that pick elements by comparing scores: an order of summation that moves a score by its
# last bit can swap two near-tied ones, and the op then returns other boxes, other indices.
SELECTING = frozenset({"NonMaxSuppression", "TopK"})


def _reordered_selection(original: ModelProto, own_outputs: Callable[[], dict], expected: dict,
                         actual: dict, failing: list[str], judge: dict) -> str | None:
    """A note when every output in `failing` follows a NonMaxSuppression or TopK and equals
    what onnxruntime's own optimizer gives the original (ORT_ENABLE_ALL), which differs from
    the original at ORT_DISABLE_ALL as well: a detector's near-tied scores that select other
    boxes under another summation order (a RetinaNet's 171 of 1200 box coordinates, off by up
    to 320 pixels at either level), not an error of the compile. None otherwise."""
    selections = _selections_before(original, failing) if original is not None else {}
    if not failing or len(selections) != len(failing):
        return None
    try:
        own = own_outputs()
    except Exception:  # noqa: BLE001 - no baseline to measure against
        return None
    for name in failing:
        theirs = {name: own[name]}
        if numerics.compare(theirs, {name: actual[name]}, judge["rtol"], judge["atol"]) \
                or not numerics.compare({name: expected[name]}, theirs, judge["rtol"],
                                        judge["atol"]):
            return None
    ops = " or ".join(sorted(set(selections.values())))
    return (f"output(s) {', '.join(repr(n) for n in failing)} follow a {ops} and differ from "
            "the original at ORT_DISABLE_ALL as the original's own do at ORT_ENABLE_ALL, which "
            "they match: near-tied scores that select other elements under another summation "
            "order, not an error of the compile (the scores before it, reached with "
            f"{option('out_nodes')}, show the numbers)")


def unstable_selection_hint(original: ModelProto, feeds, expected: dict, failing: list[str],
                            judge: dict) -> str:
    """A hint for a failure whose every output follows a NonMaxSuppression or TopK that the
    original itself does not reproduce under onnxruntime's own optimizer (ORT_ENABLE_ALL off
    from ORT_DISABLE_ALL beyond rtol/atol on the same outputs): near-tied scores whose
    selection any other summation order changes, which no tolerance on the boxes can tell
    from an error. "" otherwise."""
    selections = _selections_before(original, failing) if original is not None else {}
    if not failing or len(selections) != len(failing):
        return ""
    try:
        own = numerics.run(original, feeds, "all")
    except Exception:  # noqa: BLE001
        return ""
    unstable = [n for n in failing
                if numerics.compare({n: expected[n]}, {n: own[n]}, judge["rtol"], judge["atol"])]
    if len(unstable) != len(failing):
        return ""
    ops = " or ".join(sorted(set(selections.values())))
    return (f" (output(s) {', '.join(repr(n) for n in failing)} follow a {ops}, and the original "
            "differs from itself on them at ORT_ENABLE_ALL too: near-tied scores that another "
            "summation order selects differently; verify the scores before the selection with "
            f"{option('out_nodes')})")


def lossy_selection_hint(original: ModelProto, failing: list[str]) -> str:
    """A hint for a lossy compile (fp16, int8, int4) whose failing outputs all follow a
    NonMaxSuppression or TopK: half precision or int8 moves near-tied scores enough to select
    other boxes, which the boxes' cosine cannot tell from an error; the scores before the
    selection can be verified. "" otherwise."""
    selections = _selections_before(original, failing) if original is not None else {}
    if not failing or len(selections) != len(failing):
        return ""
    ops = " or ".join(sorted(set(selections.values())))
    return (f" (output(s) {', '.join(repr(n) for n in failing)} follow a {ops}: a lossy "
            "precision moves near-tied scores enough to select other elements; verify the "
            f"scores before the selection with {option('out_nodes')})")


def _selections_before(original: ModelProto, names: list[str]) -> dict[str, str]:
    """For each of the main graph's values `names` that a NonMaxSuppression or TopK reaches,
    the type of one such op upstream: in the main graph, or in a body of a node upstream
    (torchvision's detectors select their boxes inside an If)."""
    producers = {out: node for node in original.graph.node for out in node.output}
    found = {}
    for name in names:
        frontier, seen = [name], set()
        while frontier and name not in found:
            node = producers.get(frontier.pop())
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            selecting = _selecting_op(node)
            if selecting is not None:
                found[name] = selecting
            frontier.extend(value for value in node.input if value)
    return found


def _selecting_op(node) -> str | None:
    """The type of a NonMaxSuppression or TopK that `node` is or holds in a body."""
    if node.op_type in SELECTING and node.domain in ("", "ai.onnx"):
        return node.op_type
    for attribute in node.attribute:
        for body in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            for inner in body.node:
                found = _selecting_op(inner)
                if found is not None:
                    return found
    return None


def _special_values_differ(expected, actual) -> bool:
    """Whether an output has a NaN or an infinity where the other has something else (a
    number, or the other infinity). No rounding does that, even where onnxruntime's own
    optimizer does the same (a product it rescales overflows): onnxruntime's error is then
    infinite and would excuse anything."""
    for pair in numerics.paired("", expected, actual):
        if isinstance(pair, numerics.Mismatch):
            continue  # a structure that differs is no rounding either: the judges say so
        _, exp, got = pair
        exp, got = numerics.widened(exp), numerics.widened(got)
        if exp.dtype.kind not in "fc" or exp.shape != got.shape:
            continue
        special = ~np.isfinite(exp) | ~np.isfinite(got)
        with np.errstate(invalid="ignore"):
            if (special & (exp != got) & ~(np.isnan(exp) & np.isnan(got))).any():
                return True
    return False


def _slices(value) -> list:
    """A float tensor of rank 3 or more as its slices along axis 1; anything else whole."""
    if isinstance(value, np.ndarray) and value.ndim >= 3 and value.shape[1] >= 2 \
            and value.dtype.kind == "f":
        return [value[:, i] for i in range(value.shape[1])]
    return [value]


def after_quantization(model: ModelProto) -> set[str]:
    """The outputs of `model` computed from a value it rounds to integers (a QuantizeLinear or
    dynamic quantization of anything but a constant): a rounding change before one moves its
    result by a whole step, which the layers after it carry on. Quantization inside subgraphs
    is not followed (such outputs are held to the float bound)."""
    constants = {t.name for t in model.graph.initializer}
    constants.update(out for node in model.graph.node if node.op_type == "Constant"
                     for out in node.output)
    reached: set[str] = set()
    for node in model.graph.node:  # in topological order, as ONNX requires
        if (node.op_type in _ROUNDS_TO_STEPS and node.input and node.input[0] not in constants) \
                or any(name in reached for name in node.input):
            reached.update(name for name in node.output if name)
    return {o.name for o in model.graph.output if o.name in reached}


_ROUNDS_TO_STEPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "DynamicQuantizeMatMul",
                              "MatMulIntegerToFloat"})


def _within_onnxruntimes_own(own_outputs: Callable[[], dict], expected: dict, actual: dict,
                             failing: list[str], judge: dict,
                             stepped: set[str] = frozenset()) -> str | None:
    try:
        own = own_outputs()
    except Exception:  # noqa: BLE001 - no baseline to measure against
        return None
    worst, baseline = 0.0, 0.0
    for name in failing:
        if not _same_layout(expected[name], actual[name], own[name]):
            return None
        slices = list(zip(*map(_slices, (expected[name], actual[name], own[name]))))
        theirs = [numerics.max_abs_error(exp, other) for exp, _, other in slices]
        if not max(theirs):
            return None
        ours = [numerics.max_abs_error(exp, got) for exp, got, _ in slices]
        scales = [_scale(exp) for exp, _, _ in slices]
        # onnxruntime's worst error relative to the whole output's largest magnitude, not to
        # a slice's: a slice of values near 0 that its rounding moves by half their size
        # would otherwise excuse errors of that size, relatively, in every other slice.
        relative = max(theirs) / max(scales) if max(scales) else 0.0
        if relative > _rounding_limit(expected[name], name in stepped):
            # onnxruntime's optimizer computes something else than the original there (its
            # LayerNormFusion reads a Pow of 4 as a square): an error it shares is no rounding.
            return None
        for (exp, got, _), error, mine, scale in zip(slices, ours, theirs, scales):
            if error <= 2 * max(mine, relative * scale):
                continue
            if numerics.compare({name: exp}, {name: got}, judge["rtol"], judge["atol"]):
                return None
        worst, baseline = max(worst, max(ours)), max(baseline, max(theirs))
    cause = ("values the original quantizes rounded to a neighbouring step"
             if set(failing) <= set(stepped) else "the same kernels' rounding")
    return (f"outputs differ from the original at ORT_DISABLE_ALL by up to {worst:.3g}, "
            "beyond rtol/atol but within twice what onnxruntime's own optimizer gives the "
            f"original, slice by slice along axis 1 (up to {baseline:.3g} at ORT_ENABLE_ALL): "
            f"{cause}")


def _rounding_limit(value, stepped: bool = False) -> float:
    """The most onnxruntime's own optimizer may move an output, relative to its largest
    magnitude, for that to read as rounding: a summation order's, YOLO's 0.035 on 900-pixel
    boxes (4e-5), well under 1e-3; a 16-bit float's own step is 1e-3 (float16) or 8e-3
    (bfloat16, whose ml_dtypes arrays are of numpy kind 'V'). An output computed from values
    the model quantizes (`stepped`) gets the 16-bit floats' bound too: an 8-bit step is 4e-3 of a
    range, and a value rounded to the next one moves everything computed from it (a 4-layer
    QDQ BERT: 0.109 on hidden states up to 4.5 at onnxruntime's own ORT_ENABLE_ALL)."""
    if not isinstance(value, np.ndarray) or numerics.widened(value).dtype.kind != "f":
        return 5e-2 if stepped else 1e-3
    return 5e-2 if stepped or value.dtype.itemsize == 2 else 1e-3


def _scale(value) -> float:
    """The largest finite magnitude of a float tensor; 1 for anything else (whose errors are
    then compared as they are)."""
    if not isinstance(value, np.ndarray):
        return 1.0
    value = numerics.widened(value)  # a bfloat16 output is scaled like any float
    return numerics.largest_magnitude(value) if value.dtype.kind == "f" else 1.0


def _same_layout(*values) -> bool:
    """Whether the outputs slice alike (a shape that differs is a mismatch, never rounding)."""
    shapes = {np.shape(v) if isinstance(v, np.ndarray) else None for v in values}
    return len(shapes) == 1


def _within_output_scale(expected: dict, actual: dict, failing: list[str],
                         judge: dict) -> str | None:
    scaled = [_rounding_at_scale(expected[name], actual[name], judge) for name in failing]
    if not scaled or not all(scaled):
        return None
    worst = max(error for error, _ in scaled)
    scale = max(largest for _, largest in scaled)
    return (f"outputs differ from the original at ORT_DISABLE_ALL by up to {worst:.3g}, "
            "beyond rtol/atol in under 1% of their elements, and within rtol of the output's "
            f"largest magnitude ({scale:.3g}): sums taken in another order (NCHWc blocks, "
            "BatchNorm as a depthwise conv) round so")


def _rounding_at_scale(expected, actual, judge: dict) -> tuple[float, float] | None:
    """(largest error, largest |expected|) when an output fails allclose in under 1% of its
    elements, each off by no more than rtol times the largest magnitude of the output (of its
    slice along axis 1, at rank 3 or more): how the
    rounding of a sum reordered shows through a detector's box decoding, where elements near
    0 come from terms of hundreds (YOLO's 0.017 on 896-pixel coordinates, where onnxruntime's
    own optimizer changes nothing). None otherwise, a miscompile's systematic error included."""
    error, largest, beyond, total = 0.0, 0.0, 0, 0
    for pair in numerics.paired("", expected, actual):
        if isinstance(pair, numerics.Mismatch):
            return None
        _, exp, got = pair
        exp, got = numerics.widened(exp), numerics.widened(got)
        if exp.dtype.kind != "f" or exp.shape != got.shape:
            if not np.array_equal(exp, got):
                return None
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(got.astype(np.float64) - exp)
            ok = (diff <= judge["atol"] + judge["rtol"] * np.abs(exp)) | (got == exp) | (
                np.isnan(exp) & np.isnan(got))
            # An infinity is close to itself alone: rtol·|inf| took any value for it, so a
            # lost or sign-flipped infinity passed as rounding (and inf - inf, NaN, failed
            # an infinity kept).
            ok &= ~((np.isinf(exp) | np.isinf(got)) & (got != exp))
        if not np.isfinite(exp).all() and not ok[~np.isfinite(exp)].all():
            return None
        finite = np.isfinite(exp)
        if not np.isfinite(diff[finite]).all():  # a NaN or inf where the original has a number
            return None
        if finite.any():
            largest = max(largest, float(np.abs(exp[finite]).max()))
            error = max(error, float(diff[finite].max()))
            # Each slice along axis 1 at its own scale (see within_rounding).
            scale = np.abs(np.where(finite, exp, 0.0))
            if exp.ndim >= 3 and exp.shape[1] >= 2:
                scale = scale.max(axis=tuple(a for a in range(exp.ndim) if a != 1),
                                  keepdims=True)
            else:
                scale = scale.max()
            if (diff[finite] > (judge["rtol"] * np.broadcast_to(scale, exp.shape))[finite]).any():
                return None
        beyond += int((~ok).sum())
        total += exp.size
    if not total or beyond > total // 100:
        return None
    return error, largest


# An output slice off by up to this many times the most a one-ulp move of the original's
# weights moves it is off by rounding (on the dynamo YOLO export, the compile's error is 0.1-1.1
# times that movement per slice; an error of a rewrite is orders of magnitude past it).
WEIGHT_ROUNDING_FACTOR = 4
# Seeded draws of the one-ulp directions: their largest movement is taken, element by element.
_WEIGHT_DRAWS = 2
# Float inputs of these ops hold sizes, not weights (a Resize scale of 2 moved below 2 floors
# a size of 40 to 39): they keep their values.
_SIZE_READERS = frozenset({"Resize", "Upsample", "Range"})


def weight_rounding(original: ModelProto, feeds) -> dict:
    """Per output of `original`, the largest movement of each element (at ORT_DISABLE_ALL, on
    `feeds`) when every float weight of the main graph moves one unit in the last place, up or
    down at random (seeded, _WEIGHT_DRAWS draws): the size of rounding in this model, whatever
    scale its outputs have. Raises what onnxruntime raises (a model it cannot run twice more,
    one past protobuf's 2 GiB)."""
    base = numerics.run(original, feeds)
    moved: dict = {}
    for seed in range(_WEIGHT_DRAWS):
        nudged = numerics.run(_nudged(original, seed), feeds)
        for name, value in base.items():
            if not (isinstance(value, np.ndarray) and value.dtype.kind == "f"):
                continue
            with np.errstate(invalid="ignore"):
                step = np.abs(nudged[name].astype(np.float64) - value)
            moved[name] = step if name not in moved else np.fmax(moved[name], step)
    return moved


def _nudged(model: ModelProto, seed: int) -> ModelProto:
    """A copy of `model` whose float weights (initializers and Constant nodes of the main
    graph, but sizes: _SIZE_READERS) are each moved one unit in the last place, toward +inf or
    -inf at random."""
    from onnx import numpy_helper

    from graphopt.lent_weights import tensor_array

    sizes = {name for node in model.graph.node if node.op_type in _SIZE_READERS
             for name in node.input}
    copy = ModelProto()
    copy.CopyFrom(model)
    rng = np.random.default_rng(seed)
    constants = [(node.output[0], attribute.t) for node in copy.graph.node
                 if node.op_type == "Constant" and node.output
                 for attribute in node.attribute if attribute.name == "value"]
    for name, tensor in [(t.name, t) for t in copy.graph.initializer] + constants:
        if name in sizes or tensor.data_type not in _FLOAT_TYPES:
            continue
        weight = tensor_array(tensor)  # a weight --verify lends onnxruntime too
        away = np.where(rng.random(weight.shape) < 0.5, -np.inf, np.inf).astype(weight.dtype)
        with np.errstate(over="ignore"):
            nudged = np.nextafter(weight, away)
        # Infinities and the largest finite values (an attention mask's -inf or -3.4e38) stay:
        # a step from them is no rounding, it is another mask.
        extreme = ~np.isfinite(weight) | (np.abs(weight) >= np.finfo(weight.dtype).max)
        nudged = np.where(extreme, weight, nudged)
        tensor.CopyFrom(numpy_helper.from_array(nudged.astype(weight.dtype), tensor.name))
    return copy


# float16, float, double: the element types whose neighbours numpy steps to.
_FLOAT_TYPES = frozenset({10, 1, 11})


def _within_weight_rounding(sensitivity: Callable[[], dict], expected: dict, actual: dict,
                            failing: list[str], judge: dict) -> str | None:
    try:
        moved = sensitivity()
    except Exception:  # noqa: BLE001 - no yardstick to measure against
        return None
    worst, yardstick = 0.0, 0.0
    for name in failing:
        if name not in moved or not _same_layout(expected[name], actual[name], moved[name]):
            return None
        for exp, got, step in zip(*map(_slices, (expected[name], actual[name], moved[name]))):
            error, allowed = numerics.max_abs_error(exp, got), _finite_max(step)
            if not error <= WEIGHT_ROUNDING_FACTOR * allowed and numerics.compare(
                    {name: exp}, {name: got}, judge["rtol"], judge["atol"]):
                return None  # (a NaN error, of a NaN where the original has a number, too)
            worst, yardstick = max(worst, error), max(yardstick, allowed)
    return (f"outputs differ from the original at ORT_DISABLE_ALL by up to {worst:.3g}, "
            f"beyond rtol/atol but within {WEIGHT_ROUNDING_FACTOR}x what moving each of the "
            f"original's weights by one unit in the last place moves them ({yardstick:.3g}, "
            "slice by slice along axis 1): rounding")


def _finite_max(value: np.ndarray) -> float:
    finite = value[np.isfinite(value)]
    return float(finite.max()) if finite.size else 0.0


# A 16-bit float's step (its epsilon): what a value computed in that type is good to.
_HALF_STEPS = {TensorProto.FLOAT16: FLOAT16_STEP, TensorProto.BFLOAT16: 2.0 ** -7}


def half_computed(model: ModelProto, outputs: list[str]) -> dict[str, float]:
    """The step of the coarsest 16-bit float each of `outputs` is computed through in `model`'s
    main graph (a Cast to it, or a weight, an input or a declared value of it among its
    ancestors), for the outputs that are: a float16 body between float32 Casts, as
    onnxconverter-common's keep_io_types writes it, had been judged at float32's rtol and
    refused where the compile was right (a GPT-2 0.0006 off on logits of 1.2)."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*graph.input, *graph.value_info, *graph.output)}
    types.update({t.name: t.data_type for t in graph.initializer})
    producer = {out: node for node in graph.node for out in node.output}
    found = {}
    for output in outputs:
        steps, seen, stack = [], set(), [output]
        while stack:
            name = stack.pop()
            if name in seen or not name:
                continue
            seen.add(name)
            steps.append(_HALF_STEPS.get(types.get(name), 0.0))
            node = producer.get(name)
            if node is None:
                continue
            if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
                to = next((a.i for a in node.attribute if a.name == "to"), None)
                steps.append(_HALF_STEPS.get(to, 0.0))
            stack.extend(node.input)
        if max(steps, default=0.0):
            found[output] = max(steps)
    return found


def within_half_precision(model: ModelProto, expected: dict, actual: dict,
                          failing: list[str], feeds: dict | None = None) -> str | None:
    """The note passing `failing` outputs that `model` computes through 16-bit floats
    (half_computed), when each is within that type's precision, or, given the `feeds` they
    ran on, no farther from the result computed in float32 than the original itself is, give
    or take that step of the output's largest magnitude; None when one is neither."""
    half = half_computed(model, failing)
    if not failing or not all(name in half for name in failing):
        return None
    if all(_within_half(expected[name], actual[name], half[name]) for name in failing):
        return (f"output(s) {', '.join(failing)} computed in 16-bit floats in the original "
                "(float16 or bfloat16 values on their way), judged at that type's precision: "
                "within its step of each element and of the output's largest magnitude, as "
                "sums in that type round")
    exact = _computed_in_float32(model, feeds, failing) if feeds is not None else None
    if exact is None or not all(_no_farther(expected[name], actual[name], exact[name],
                                            half[name]) for name in failing):
        return None
    return (f"output(s) {', '.join(failing)} computed in 16-bit floats in the original, "
            "judged against the same model computed in float32: no farther from it than the "
            "original is, give or take that type's step of the output's largest magnitude "
            "(kernels that sum in float32 round less than the original's ops)")


def _computed_in_float32(model: ModelProto, feeds: dict, names: list[str]) -> dict | None:
    """`names` of `model` with its 16-bit floats widened to float32, on `feeds` widened alike;
    None when that model cannot be made or run."""
    widened = widened_to_float32(model)
    if widened is None:
        return None
    try:
        outputs = numerics.run(widened, widened_feeds(model, feeds))
    except Exception:  # noqa: BLE001 - onnxruntime's own errors: no reference to judge by
        return None
    return outputs if all(name in outputs for name in names) else None


def _no_farther(reference, candidate, exact, step: float) -> bool:
    """Whether `candidate` is no farther from `exact` than `reference` is, plus `step` of the
    largest magnitude, with NaN and infinities where `reference` has them."""
    r, c, e = (np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f" else None
               for x in (reference, candidate, exact))
    if r is None or c is None or e is None or not (r.shape == c.shape == e.shape) or not r.size:
        return False
    finite = np.isfinite(r)
    if not np.array_equal(finite, np.isfinite(c)) or not np.array_equal(r[~finite], c[~finite],
                                                                          equal_nan=True):
        return False
    if not finite.any():
        return True
    scale = _finite_max(np.abs(e[finite]))
    own = float(np.nanmax(np.abs(r[finite] - e[finite])))
    return float(np.nanmax(np.abs(c[finite] - e[finite]))) <= own + step * scale


def _within_half(reference, candidate, step: float) -> bool:
    """Whether `candidate` is within a 16-bit float's `step` of `reference`, element by
    element and of its largest magnitude (a float16 sum's error grows with the terms)."""
    r = np.asarray(reference)
    if r.dtype.kind not in "fc" or not r.size:
        return False
    scale = _finite_max(np.abs(r))
    return not numerics.compare({"y": reference}, {"y": candidate}, step, step * scale)
