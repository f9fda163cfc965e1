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
activation per run from its actual range (and Gemms too, where such layers outnumber the convs:
select._gemms_as_the_other_layers). Measured on a
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

from dataclasses import dataclass

import numpy as np

from graphopt.errors import OptionError
from graphopt.ir import Model, Node
from graphopt.option_names import setting
from graphopt.passes.base import Pass, PassContext, PassResult, anchor_key, register
from graphopt.passes.edit import replace_value
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.precision.nested import nested_note
from graphopt.quant.calib_data import calibration_data
from graphopt.quant.calibrate import calibrate, channel_extents
from graphopt.quant.equalize import equalize_channels
from graphopt.quant.float_heads import correct_float_layers, float_heads, with_enough_values
from graphopt.quant.hard_sigmoid import (
    hard_sigmoids_on_codes,
    join_float_hard_swishes,
    split_hard_swishes,
)
from graphopt.quant.opset_upgrade import INT8_OPSET, LAYER_OPS
from graphopt.quant.probe import int8_gemm_saturates
from graphopt.quant.qdq_rewrite import (HIGH_CODE, WEIGHT_LIMIT_HIGH_CODES, as_conv,
                                        codes_sit_high, drop_unused_initializers,
                                        dynamic_attention, dynamic_matmul, gemm_as_matmul,
                                        insert_qdq, pads_on_codes, quantize_weights)
from graphopt.quant.qparams import QParams, activation_params
from graphopt.quant.select import (MS, Plan, non_layer_skips, plan, quantize_ends,
                                   unmatched_skips)
from graphopt.quant.sensitivity import Drowned, drowned_layers, drowned_note, guarded, kept_float
from graphopt.quant.stats import METHODS, TensorStats
from graphopt.quant.unfused_activations import join_float_activations, split_activations


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


# Ops that only move or view their input's elements.
_MOVEMENT = frozenset({"Slice", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                       "Identity", "Gather", "Split", "Expand", "Tile"})


def _moves_to_outputs_only(node: Node) -> bool:
    """Whether `node` moves a value's elements on to graph outputs alone (a streaming model's
    state, sliced out of the Concat a quantized Conv reads): it reads the float value, exact,
    not its dequantized copy. Reading the copy, it gave onnxruntime's QDQPropagationTransformer
    a Q/DQ pair to copy past it, which at opset 21 carries an output_dtype that
    QDQS8ToU8Transformer then contradicts: the symmetric int8 model did not load at
    ORT_ENABLE_ALL."""
    if node.op_type not in _MOVEMENT or not node.is_onnx:
        return False
    for out in node.outputs:
        if out is None:
            continue
        if not out.is_graph_output and not out.uses:
            return False
        if not all(_moves_to_outputs_only(use) for use in out.consumers()):
            return False
    return True


# The share of the quantizable work in the ends kept float past which a note says what the
# default gives up: a conv net's stem and head do a few percent, GPT-2's head 39%.
_HEAVY_ENDS = 0.2


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
        # Before the plan and its ranges, which then see the scaled float graph. A shape
        # profile the data does not fit scales by the extents the profile it fits measured,
        # as it takes that one's ranges, which were measured on the graph so scaled.
        if options.quant_equalize and options.calibration:
            result.count("equalized channel region", equalize_channels(
                model, lambda names: _channel_extents(model, names, ctx)))
            if ctx.shared_stats is not None and ctx.calibration_mismatch is None:
                ctx.shared_stats.keep_extents({}, model.graph)  # measured, when none to measure
        splits = split_activations(model.graph, opset, convs=form == "onnxruntime")
        missing = unmatched_skips(model.graph, options.quant_skip, self.name,
                                  ctx.source_names, ctx.cut_names)
        if missing:
            ctx.note(missing)
        # After that check, which would not find a HardSwish that quant_skip names.
        swishes = split_hard_swishes(model.graph) if form == "onnxruntime" else []
        nested = nested_note(model.graph, "QuantizeInt8",
                             lambda node: node.op_type in ("Conv", "MatMul", "Gemm"))
        if nested:
            ctx.note(nested)
        idle = non_layer_skips(model.graph, options.quant_skip, form, self.name)
        if idle:
            ctx.note(idle)
        planned = self._planned(model, ctx, form)
        chosen, params, means, heads = planned.chosen, planned.params, planned.means, planned.heads
        if chosen.kept:
            ctx.note("QuantizeInt8 kept in float: " + "; ".join(
                f"{n} × {why}" for why, n in chosen.kept.most_common()))
        elif not (chosen.static or chosen.dynamic):  # a compile that quantized nothing says why
            # Its layers in If or Loop bodies, which the note before names, are layers too.
            ctx.note(NOTHING_TO_QUANTIZE.replace("the model has", "the main graph has")
                     if nested else NOTHING_TO_QUANTIZE)
        if chosen.ends_share >= _HEAVY_ENDS:  # the speed the default gives up, in one line
            ctx.note(f"QuantizeInt8: the first and last layers kept in float do "
                     f"{chosen.ends_share:.0%} of the multiply-adds of the float layers it "
                     f"could quantize; {quantize_ends()} quantizes them too, for speed at some "
                     "accuracy")
        if planned.drowned:
            ctx.note(drowned_note(planned.drowned))
        if chosen.needs_calibration():
            _note_nonfinite(chosen, planned.stats, ctx)
            few = _few_samples_note(ctx)
            if few:
                ctx.note(few)
        elif chosen.dynamic:
            unused = _unused_range_options(options)
            if unused:  # a BERT's layers: every one measures its input's range on each run
                verb = "changes" if len(unused) == 1 else "change"
                ctx.note(f"QuantizeInt8: {' and '.join(unused)} {verb} nothing here: every "
                         "layer it quantized is a dynamic MatMul, whose input range "
                         "onnxruntime measures on each run")
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
                node = as_conv(node)  # AMCT's keeps its activation, for ATC to fuse
            per_channel = options.per_channel and (form == "onnxruntime"
                                                   or node.op_type in ("Conv", "FusedConv"))
            # A MatMul has no bias input to take the correction.
            mean = means.get(id(node)) if node.op_type != "MatMul" else None
            x = params[id(node.inputs[0])]
            limit = WEIGHT_LIMIT_HIGH_CODES if saturates and codes_sit_high(x) else 127
            narrowed += limit != 127
            quantize_weights(graph, node, x, per_channel, mean, limit)
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
            readers = [n for n in value.consumers() if n in static] if form == "amct" else \
                [n for n in value.consumers() if not _moves_to_outputs_only(n)]
            insert_qdq(graph, value, params[id(value)], readers)
            result.count("QuantizeLinear")
        result.count("Pad on codes", pads_on_codes(graph, chosen))
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
            if node.op_type in ("MatMul", "Gemm"):
                dynamic_matmul(graph, gemm_as_matmul(graph, node) if node.op_type == "Gemm"
                               else node, per_column)
            else:
                dynamic_attention(graph, node, per_column)
            result.count(node.op_type)
        if result.changed:
            model.opset_imports.setdefault(MS, 1)
            graph.sort()
            if heads:
                correct_float_layers(model, heads, means, ctx, result)
        join_float_hard_swishes(graph, swishes)
        if splits:  # after the bias correction, which reads the float convs as Convs
            join_float_activations(graph, splits,
                                   {id(n) for n in chosen.static + chosen.dynamic})
        if result.changed or splits:
            drop_unused_initializers(graph)
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
            heads, head_notes = float_heads(model, chosen, ctx)
            params, means = self._calibrated(model, chosen, ctx, heads, known) \
                if chosen.needs_calibration() else ({}, {})
            heads, few_notes = with_enough_values(heads, known)
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
                                                  options.activation_symmetric,
                                                  as_uint8=chosen.form == "onnxruntime")
        return params, means


def _unused_range_options(options) -> list[str]:
    """The activation-range options given other than their defaults, as the user spelled them."""
    defaults = type(options)()
    return [setting(name, getattr(options, name))
            for name in ("calibration_method", "calibration_percentile", "activation_symmetric")
            if getattr(options, name) != getattr(defaults, name)]


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


def _channel_extents(model: Model, names: list[str], ctx: PassContext) -> dict:
    """Each named tensor's largest |value| per channel over the calibration data, for channel
    equalization; for a shape profile the data does not fit, those a profile it fits measured
    (shared_stats.py: a profile compiled before that one waits for it)."""
    shared, mismatch = ctx.shared_stats, ctx.calibration_mismatch
    if mismatch is not None:
        if shared is None or shared.extents is None:
            raise mismatch
        return shared.extents_of(names, model.graph)
    measured = channel_extents(model, names, calibration_data(ctx, model.graph))
    if shared is not None:
        shared.keep_extents(measured, model.graph)
    return measured


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


__all__ = ["QuantizeInt8"]
