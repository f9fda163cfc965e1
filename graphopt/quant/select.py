"""Which nodes QuantizeInt8 quantizes, and which activations carry QuantizeLinear/
DequantizeLinear pairs.

  * static (QDQ, calibrated): Conv, FusedConv(activation=Relu) and Gemm with constant weights;
    onnxruntime fuses DQ → Conv → Q into QLinearConv and DQ → Gemm (→ Q) into QGemm;
  * dynamic (activations quantized per run): MatMul with a constant 2-D weight, and
    com.microsoft::Attention; no calibration needed;
  * int8 in between, when a quantized node reads their output: Add, Mul (QLinearAdd/Mul),
    Concat, GlobalAveragePool, AveragePool, and the ops that keep their input's scale (MaxPool,
    Reshape, Transpose, Flatten, Squeeze, Unsqueeze: onnxruntime drops their Q/DQ and runs them
    on int8; and a Pad that fills with zeros or by reflecting or repeating its edge, which
    QuantizeInt8 then runs on the codes itself, since onnxruntime keeps its Q/DQ); a Relu or
    Clip(0, …) right after a quantized op folds into its uint8 range (zero point 0 clamps as
    Relu does); a HardSigmoid whose output an int8 op reads runs on the codes too (hard-swish
    is x · HardSigmoid(x): hard_sigmoid.py).

Marking runs backwards (an op is int8 only when a reader wants int8), so a tail that ends in a
float layer stays float instead of paying a quantize/dequantize for nothing; and an op in
between runs int8 only where an int8 value reaches it (_fed_int8), so one fed float values
alone rounds once, in float.

For an NPU target the plan takes AMCT's form instead (`form="amct"`), the QDQ that AMCT's
convert_qat_model turns into AscendQuant → int8 cube kernel → AscendDequant for ATC: Conv, Gemm
and MatMul with a constant 2-D weight are all static; only their data inputs carry Q/DQ, read
by them alone (every other reader keeps the float tensor, as AscendDequant hands float on); no
int8 Add, pools or scale-keeping ops (AMCT's Add is a fake-quantized float Add, no faster) and
no Relu folding (the Relu stays, for ATC to fuse into the dequantize).

The ends that `quant_keep_ends` keeps float are found by structure, not by position: a layer that
reads a graph input (a classifier's stem conv) or writes a graph output (its last FC, a language
model's vocabulary head), with only layout, activation, pooling or constant arithmetic between.
A transformer encoder has neither (its GEMMs read and write normalized hidden states), so all of
its GEMMs quantize: keeping its first QKV and last FFN GEMM float cost 7-9% on BERT-base for no
accuracy gain (bench/precision.py).
"""

from __future__ import annotations


from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from graphopt.ir import DType, Graph, Node, Value
from graphopt.option_names import from_command_line, option
from graphopt.passes.unmatched import op_spellings, unmatched_note
from graphopt.quant import attention_split

MS = "com.microsoft"
INT8_OPS = {"Add": None, "Mul": None, "Concat": None, "GlobalAveragePool": (0,),
            "AveragePool": (0,)}  # op → its activation inputs (None: all)
SAME_SCALE = {"MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Pad"}
# What may sit between a graph input or output and a layer that still counts as the model's first
# or last: ops of one computed input (the arithmetic ones when their other inputs are constant:
# input normalization, a bias, a temperature).
THROUGH = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Cast", "Identity", "Pad",
           "Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid",
           "HardSwish", "Softplus", "Mish", "Gelu", "PRelu", "Softmax", "LogSoftmax",
           "GlobalAveragePool", "GlobalMaxPool", "Add", "Sub", "Mul", "Div"}
# What may also sit between a graph input and the first layer, looking back from the layer
# only: the crop, channel order, YUV planes and colour conversion of --insert-op-conf's image
# preprocessing (Slice and Gather of constant indices; a resize of the chroma).
FROM_INPUT = {"Slice", "Gather", "Concat", "Floor", "Resize", "Upsample"}
# The activations graphopt's fusions make in onnxruntime's contrib domain (FuseGelu).
THROUGH_CONTRIB = {"Gelu", "FastGelu", "BiasGelu", "QuickGelu"}


@dataclass
class Plan:
    static: list[Node] = field(default_factory=list)
    dynamic: list[Node] = field(default_factory=list)
    int8_ops: list[Node] = field(default_factory=list)    # run in int8, own output range
    same_scale: list[Node] = field(default_factory=list)  # run in int8, the input's range
    folds: list[tuple[Node, Node]] = field(default_factory=list)  # (producer, Relu/Clip)
    tensors: list[Value] = field(default_factory=list)    # Q/DQ pairs go on these
    kept: Counter = field(default_factory=Counter)        # why a candidate stayed float
    alias: dict[int, Value] = field(default_factory=dict)  # id(folded act output) → producer's
    form: str = "onnxruntime"  # or "amct": Q/DQ pairs feed the static nodes alone (FORMS)
    ends_share: float = 0.0  # of the float layers' multiply-adds it could quantize, in the ends kept

    def resolve(self, value: Value) -> Value:
        """`value`, or the producer output a folded Relu/Clip's output becomes."""
        return self.alias.get(id(value), value)

    def stats_name(self, value: Value) -> str | None:
        """Whose calibration statistics give `value`'s range: its own, its folded activation's
        output, or None when it takes its input's parameters (SAME_SCALE)."""
        if value.producer is not None and value.producer in self.same_scale:
            return None
        for producer, act in self.folds:
            if producer.outputs[0] is value:
                return act.output.name
        return value.name

    def needs_calibration(self) -> bool:
        return bool(self.static)


def _float(value: Value | None) -> bool:
    return value is not None and value.dtype == DType.FLOAT


def _const(value: Value | None, ndim: int | None = None) -> np.ndarray | None:
    data = value.constant() if value is not None else None
    if data is None or data.dtype != np.float32 or (ndim is not None and data.ndim != ndim):
        return None
    return data


FORMS = ("onnxruntime", "amct")


def kind(node: Node, form: str = "onnxruntime") -> str | None:
    """"static", "dynamic" or None: whether and how `node` could be quantized at all, in `form`
    (AMCT has no dynamic quantization: its MatMuls are static, and Attention stays float)."""
    how = _kind(node, form)
    if form == "amct" and how == "dynamic":
        return "static" if node.op_type == "MatMul" else None
    return how


def _kind(node: Node, form: str) -> str | None:
    ins = node.inputs
    if node.is_onnx and node.op_type == "Conv" and len(ins) >= 2 and _float(ins[0]):
        w = _const(ins[1])
        if w is not None and w.ndim in (3, 4) and (len(ins) < 3 or ins[2] is None
                                                   or _const(ins[2], 1) is not None):
            return "static"
    # onnxruntime's QLinearConv folds only a Relu into its output range; AMCT keeps any
    # activation for ATC to fuse after the dequantize.
    if node.domain == MS and node.op_type == "FusedConv" and len(ins) in (2, 3) \
            and (node.attr("activation") == "Relu" or form == "amct") and _float(ins[0]):
        w = _const(ins[1])
        if w is not None and w.ndim in (3, 4) and (len(ins) < 3 or _const(ins[2], 1) is not None):
            return "static"
    if node.is_onnx and node.op_type == "Gemm" and _float(ins[0]) \
            and _const(ins[1], 2) is not None and node.attr("transA", 0) == 0 \
            and node.attr("alpha", 1.0) == 1.0 and node.attr("beta", 1.0) == 1.0 \
            and (len(ins) < 3 or ins[2] is None or _const(ins[2], 1) is not None):
        return "static"
    if node.is_onnx and node.op_type == "MatMul" and _float(ins[0]) \
            and _const(ins[1], 2) is not None:
        return "dynamic"
    if node.domain == MS and node.op_type == "Attention" and _float(ins[0]) \
            and _const(ins[1], 2) is not None and len(ins) > 2 and _const(ins[2], 1) is not None \
            and attention_split.refusal(node) is None:
        return "dynamic"
    return None


def _gemms_as_the_other_layers(quantizable: list) -> list:
    """`quantizable` with each Gemm dynamic where the model's dynamic layers (MatMuls, Attention)
    outnumber its static convs. Exporters write a Linear over 2-D rows as a Gemm: GPT-2's
    output projections in a one-token decoder step, between MatMuls that measure their input's
    range on every run. Static, that one layer kept the range of the calibration's past keys
    and values, and a step from another past clipped it (logits cosine 0.84 against 0.9998 for
    onnxruntime's quantize_dynamic). A CNN's fully connected layers stay static, calibrated
    with the convs they follow."""
    dynamic = sum(how == "dynamic" for _, how in quantizable)
    convs = sum(node.op_type in ("Conv", "FusedConv") for node, _ in quantizable)
    if dynamic <= convs:
        return quantizable
    return [(node, "dynamic" if node.op_type == "Gemm" else how) for node, how in quantizable]


# Ops a model quantized before graphopt saw it computes with (onnxruntime's quantize_dynamic
# and QOperator forms): their layers are int8 already.
INTEGER_OPS = frozenset({"MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul",
                         "DynamicQuantizeMatMul", "QAttention", "MatMulIntegerToFloat",
                         "QGemm"})


def _nonfinite_weight(node: Node) -> bool:
    """Whether `node`'s constant weight holds a NaN or an Inf: quantized, its per-channel scale
    is NaN, or the dynamic kernels turn it into finite outputs the float model does not give."""
    weight = node.inputs[1].constant() if len(node.inputs) > 1 and node.inputs[1] is not None \
        else None
    return weight is not None and weight.dtype.kind == "f" and not np.isfinite(weight).all()


def _input_dependent(graph: Graph) -> set[int]:
    """The ids of the main graph's values a graph input (or a subgraph) reaches, in one pass in
    graph order: every other computed value, constant folding could have made a weight. A walk
    back from each layer without a constant weight was quadratic in a transformer's size."""
    dependent = {id(v) for v in graph.inputs if not v.is_constant}
    for node in graph:
        if node.subgraphs() or any(v is not None and id(v) in dependent for v in node.inputs):
            dependent.update(id(v) for v in node.outputs if v is not None)
    return dependent


def _dequantized(value: Value | None) -> bool:
    """Whether `value` comes out of a DequantizeLinear: the model quantized it itself, and
    quantizing it again would stack a second Q/DQ pair, of another scale, on the first."""
    producer = value.producer if value is not None else None
    return producer is not None and producer.op_type == "DequantizeLinear" \
        and producer.domain in ("", "ai.onnx", "com.microsoft")


def _unfolded() -> str:
    """Why a constant computed at run time is still computed."""
    return (f" (FoldConstants, from -O2 on, folds such constants but those larger than "
            f"{option('fold_size_limit')} or of an op it cannot evaluate)")


def _unquantizable(node: Node, dependent: set[int]) -> str | None:
    """Why a Conv, Gemm or MatMul with a constant weight cannot be quantized at all (None for
    other nodes, and for reasons as plain as an activation weight); `dependent`:
    _input_dependent's."""
    if node.is_onnx and node.op_type == "ConvTranspose" and len(node.inputs) >= 2 \
            and node.inputs[1].constant() is not None:
        # Left float silently beside counted 3-D convs: a user saw a layer no note named.
        return "ConvTranspose (graphopt's int8 quantizes Conv, Gemm and MatMul)"
    if not node.is_onnx or node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.inputs) < 2:
        return None
    data, weight = node.inputs[0], node.inputs[1].constant()
    if weight is None and _dequantized(node.inputs[1]):
        # onnxruntime's quantize_static output: "the model has no Conv … with a constant
        # weight" had read as if the model had no layers at all.
        return "already quantized (its weight comes from the model's own DequantizeLinear)"
    if node.op_type == "MatMul" and weight is None and data is not None \
            and _const(data) is not None:  # W · X: without this, "the model has no MatMul…"
        return "MatMul whose constant is its first operand (int8 quantizes W in X · W)"
    if weight is None and data is not None and node.inputs[1] is not None \
            and not _dequantized(node.inputs[1]) and id(node.inputs[1]) not in dependent:
        # A light model's ConstantOfShape weights: the layer looked quantized, and was not.
        return f"{node.op_type} whose weight is computed at run time from constants{_unfolded()}"
    if weight is None or data is None:
        return None
    bias = node.input(2) if node.op_type in ("Conv", "Gemm") else None
    if bias is not None and bias.constant() is None:
        what = "bias" if node.op_type == "Conv" else "C"
        if id(bias) not in dependent:
            # A dynamo export's Conv biases through Expand and CastLike, which -O1 leaves.
            return (f"{node.op_type} whose {what} is computed at run time from "
                    f"constants{_unfolded()}")
        # At -O0 that CastLike still reads an activation, for its type alone: those convs
        # were left float with no note at all.
        return (f"{node.op_type} whose {what} is computed at run time from the data (from -O1 "
                "on, an op that reads an activation only for its type or shape, such as "
                "CastLike, is folded)")
    if data.dtype is None:  # after a contrib op that neither ONNX nor InferShapes types
        return f"{node.op_type} of data of unknown type (give the model value_info for it)"
    if data.dtype != DType.FLOAT and data.dtype.numpy.kind == "f":
        return f"{node.op_type} of {data.dtype.numpy.name} data (int8 quantizes float32 layers)"
    if node.op_type == "Conv" and weight.ndim not in (3, 4):
        return f"{weight.ndim - 2}-D Conv (graphopt quantizes 1-D and 2-D convs)"
    if node.op_type == "MatMul" and weight.ndim != 2:
        return f"MatMul with a {weight.ndim}-D weight (int8 quantizes 2-D ones)"
    if node.op_type == "Gemm":
        if node.attr("transA", 0) != 0:
            return "Gemm with transA (onnxruntime's QGemm form takes A as it is)"
        if node.attr("alpha", 1.0) != 1.0 or node.attr("beta", 1.0) != 1.0:
            return "Gemm with alpha or beta other than 1"
        if bias is not None and (bias.constant() is None or bias.constant().ndim > 1):
            return "Gemm whose C is not a constant vector"
        if weight.ndim != 2:
            return f"Gemm with a {weight.ndim}-D weight"
    return None


def _through(node: Node) -> Value | None:
    """The one computed input `node` passes on, or None when it is not a THROUGH op."""
    if node.is_onnx and node.op_type == "Mul" and len(node.outputs) == 1:
        gated = _gated(node)
        if gated is not None:
            return gated
    known = THROUGH if node.is_onnx else THROUGH_CONTRIB if node.domain == MS else ()
    if node.op_type not in known or len(node.outputs) != 1:
        return None
    computed = [v for v in node.inputs if v is not None and not v.is_constant]
    return computed[0] if len(computed) == 1 else None


def _gated(mul: Node) -> Value | None:
    """x, when `mul` is x · Sigmoid(x) (SiLU) or x · HardSigmoid(x) (hard-swish, as
    QuantizeInt8 splits it): an activation in two ops."""
    if len(mul.inputs) != 2:
        return None
    for x, gate in (mul.inputs, mul.inputs[::-1]):
        producer = gate.producer if gate is not None else None
        if x is not None and producer is not None and producer.is_onnx \
                and producer.op_type in ("Sigmoid", "HardSigmoid") and producer.inputs[0] is x:
            return x
    return None


def reads_graph_input(value: Value) -> bool:
    """Whether `value` is a graph input, or computed from inputs alone through THROUGH and
    FROM_INPUT ops."""
    stack, seen = [value], set()
    while stack:
        value = stack.pop()
        if value.is_input or id(value) in seen:
            continue
        seen.add(id(value))
        sources = _passed_from_input(value.producer) if value.producer is not None else None
        if not sources:
            return False
        stack.extend(sources)
    return True


def _passed_from_input(node: Node) -> list[Value] | None:
    """The computed inputs `node` passes on toward its output, looking back from a layer: all
    of them, as what only inputs make through such ops is still the input's (the three
    channels of a colour conversion, added up)."""
    through = _through(node)
    if through is not None:
        return [through]
    known = (THROUGH | FROM_INPUT) if node.is_onnx else THROUGH_CONTRIB if node.domain == MS \
        else ()
    if node.op_type not in known or len(node.outputs) != 1:
        return None
    computed = [v for v in node.inputs if v is not None and not v.is_constant]
    if node.op_type in ("Slice", "Gather"):  # the data, not computed indices
        return computed if len(computed) == 1 and computed[0] is node.inputs[0] else None
    return computed


def _writes_output(value: Value) -> bool:
    """Whether `value` is a graph output, or reaches one through THROUGH ops alone (a loop,
    not recursion: a chain of thousands of activations is a model too)."""
    stack, seen = [value], set()
    while stack:
        value = stack.pop()
        if value.is_graph_output:
            return True
        if id(value) in seen:
            continue
        seen.add(id(value))
        stack.extend(use.node.outputs[0] for use in value.uses
                     if _through(use.node) is value and use.node.outputs[0] is not None)
    return False


def is_end(node: Node) -> bool:
    """Whether `node` is a first or last layer of its model: its data input comes from graph
    inputs alone through THROUGH and FROM_INPUT ops, or its output reaches a graph output
    through THROUGH ops only."""
    return reads_graph_input(node.inputs[0]) or _writes_output(node.outputs[0])


def unmatched_skips(graph: Graph, skip: set[str], pass_name: str,
                    source: frozenset[str] = frozenset(),
                    cut: frozenset[str] = frozenset()) -> str | None:
    """A note on the `quant_skip` entries that name no node and no op type of `graph` (fusions
    rename the nodes they replace; `source`: the model's names before them), with the nearest
    names; None when all match."""
    known = {name for node in graph.all_nodes() for name in (node.name, *op_spellings(node))}
    note = unmatched_note([(option("quant_skip"), skip, known)], source, cut)
    return f"{pass_name}: {note}" if note else None


def non_layer_skips(graph: Graph, skip: set[str], form: str, pass_name: str) -> str | None:
    """A note on the `quant_skip` entries that name nodes, none of them a layer the pass
    quantizes (an Add, a MaxPool): those run on the int8 codes of the layers around them
    whatever the entry says, and the entry had been taken in silence. None when there are
    none."""
    nodes = list(graph)
    idle = [entry for entry in sorted(skip)
            if (named := [n for n in nodes if n.name == entry or entry in op_spellings(n)])
            and all(kind(n, form) is None for n in named)]
    if not idle:
        return None
    head = (f"{pass_name}: {option('quant_skip')} {', '.join(map(repr, idle))} names no layer "
            "it quantizes (Conv, Gemm, MatMul, Attention and their fused forms): ")
    layers = [(n, how) for n in nodes if (how := kind(n, form)) is not None]
    if form == "onnxruntime" and layers and all(
            how == "dynamic" for _, how in _gemms_as_the_other_layers(layers)):
        # A transformer's layers are all dynamic: their outputs are float, and so is an Add.
        return head + ("it runs in float already, between layers quantized dynamically, "
                       "whose outputs are float")
    return head + ("an op between quantized layers, such as an Add or a MaxPool, runs on "
                   "their int8 codes; skip the layers around it to keep it in float")


KEPT_BY_GATE = "held back by the rewrite gate"
# The ends quant_keep_ends keeps, named by how a user quantizes them after all.
_KEPT_END = "a first or last layer (reads a graph input or writes a graph output; {} quantizes it)"


def kept_by_skip() -> str:
    """Why a layer stays float, for the layers quant_skip names, in the caller's spelling."""
    return f"named by {option('quant_skip')}"


def quantize_ends() -> str:
    """The option that quantizes the first and last layers, in the caller's spelling."""
    return "--quantize-ends" if from_command_line() else "quant_keep_ends=False"


def kept_end() -> str:
    """Why a first or last layer stays float, with the option that quantizes it."""
    return _KEPT_END.format(quantize_ends())


def _work_share(part: list[Node], whole: list[Node]) -> float:
    """The share of `whole`'s multiply-adds that `part` does: a constant weight's elements
    times the rows or positions that read it (a language model's head, 2000 × 128, did 39% of
    GPT-2's; a classifier's, one row, next to nothing beside its convs)."""
    def work(node: Node) -> int:
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        out = node.outputs[0]
        if weight is None or weight.const is None or out.shape is None:
            return 0
        reuse = out.shape[2:] if node.op_type in ("Conv", "ConvTranspose", "FusedConv") \
            else out.shape[:-1]
        return int(np.prod(weight.const.shape)) * int(np.prod(
            [d if isinstance(d, int) else 1 for d in reuse]))

    total = sum(map(work, whole))
    return sum(map(work, part)) / total if total else 0.0


def skipped(node: Node, skip) -> bool:
    """Whether `skip` (quant_skip) names `node`: by its name, its bare op type, or the
    `domain::Op` graphopt's messages print for a contrib op."""
    return node.name in skip or not op_spellings(node).isdisjoint(skip)


def plan(graph: Graph, options, allows=lambda node: True, form: str = "onnxruntime",
         held: dict[int, str] | None = None) -> Plan:
    """The quantization plan for the main graph under `options` (quant_skip, quant_keep_ends,
    activation_symmetric), in `form`: "onnxruntime" (its int8 CPU kernels) or "amct" (an NPU
    target's); the layers in `held` (by id) stay float, for the reason given there."""
    held = held or {}
    if form not in FORMS:
        raise ValueError(f"quantization form {form!r}: expected one of {', '.join(FORMS)}")
    result = Plan(form=form)
    nodes = list(graph)
    quantizable = [(node, how) for node in nodes if (how := kind(node, form)) is not None]
    if form == "onnxruntime":
        quantizable = _gemms_as_the_other_layers(quantizable)
    ends = {id(n) for n, _ in quantizable if is_end(n)} if options.quant_keep_ends else set()
    result.ends_share = _work_share([n for n, _ in quantizable if id(n) in ends],
                                    [n for n, _ in quantizable])
    candidates = []
    for node, how in quantizable:
        if id(node) in ends:
            result.kept[kept_end()] += 1
        elif skipped(node, options.quant_skip):
            result.kept[kept_by_skip()] += 1
        elif id(node) in held:
            result.kept[held[id(node)]] += 1
        elif not allows(node):
            result.kept[KEPT_BY_GATE] += 1
        elif _nonfinite_weight(node):
            result.kept["its weight holds NaN or Inf (its int8 scale would be NaN)"] += 1
        elif _dequantized(node.inputs[0]):
            result.kept["already quantized (its input comes from the model's own "
                        "DequantizeLinear)"] += 1
        elif _feeds_log(node):
            result.kept[KEPT_BEFORE_LOG] += 1
        elif form == "onnxruntime" and how == "static" and node.outputs[0].is_graph_output \
                and node.op_type != "Gemm":
            result.kept["its output is a graph output"] += 1
        elif form == "onnxruntime" and how == "static" and node.op_type == "FusedConv" \
                and options.activation_symmetric:
            result.kept["FusedConv's Relu needs the asymmetric range"] += 1
        else:
            candidates.append((node, how))
    # Layers no form can quantize say why: a compile that quantized nothing is no puzzle.
    taken = {id(node) for node, _ in quantizable}
    dependent = _input_dependent(graph)
    for node in nodes:
        why = _unquantizable(node, dependent) if id(node) not in taken else None
        if node.op_type in INTEGER_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
            why = f"already an integer op ({node.op_type})"
        if why:
            result.kept[why] += 1
    result.static = [n for n, how in candidates if how == "static"]
    result.dynamic = [n for n, how in candidates if how == "dynamic"]
    if form == "amct":
        # Each static node's data input, once (a block output two convs read).
        result.tensors = list({id(n.inputs[0]): n.inputs[0] for n in result.static}.values())
    else:
        _mark(nodes, result, options.activation_symmetric)
    return result


# A layer whose output a Log reads (a log-mel front end's filterbank MatMul of a power
# spectrum): one int8 scale wide enough for the loud bins rounds the quiet ones, and the Log
# turns their rounding into errors as large as the loud bins' values (onnx-asr's NeMo front end
# at cosine 0.87, its mel bin 0 at 0.14). The sensitivity guard measures a layer's own output,
# where those errors are small.
KEPT_BEFORE_LOG = "its output feeds a Log, which makes the rounding of its small values large"
# What may stand between such a layer and the Log: a floor or an offset, layout.
_BEFORE_LOG = {"Add", "Max", "Clip", "Relu", "Abs", "Identity", "Reshape", "Transpose",
               "Squeeze", "Unsqueeze", "Flatten"}


def _feeds_log(node: Node, depth: int = 4) -> bool:
    """Whether a Log reads `node`'s output, directly or through _BEFORE_LOG ops."""
    frontier = [node.outputs[0]]
    for _ in range(depth):
        ahead = []
        for value in frontier:
            for use in value.uses if value is not None else ():
                reader = use.node
                if reader.is_onnx and reader.op_type == "Log":
                    return True
                if reader.is_onnx and reader.op_type in _BEFORE_LOG and reader.outputs:
                    ahead.append(reader.outputs[0])
        frontier = ahead
    return False


def _activations(node: Node) -> list[Value]:
    if node.op_type in SAME_SCALE:
        return [node.inputs[0]]
    if node.op_type in INT8_OPS:
        which = INT8_OPS[node.op_type]
        return list(node.inputs) if which is None else [node.inputs[i] for i in which]
    return [node.inputs[0]]  # Conv, FusedConv, Gemm: the data input


def codes_padded(node: Node) -> bool:
    """Whether `node`, if a Pad, computes the same on its input's 8-bit codes: it repeats or
    reflects the edge, or fills with 0, the zero point's value (a DQ → Pad → Q that
    onnxruntime would run in float). Any other op: True."""
    if node.op_type != "Pad":
        return True
    if node.attr("mode", "constant") in ("reflect", "edge", "wrap"):
        return True
    fill = node.inputs[2] if len(node.inputs) > 2 else None
    if fill is None:
        return node.attr("value", 0.0) == 0.0  # opset < 11 keeps it as an attribute
    data = fill.constant()
    return data is not None and data.size == 1 and float(data.reshape(())) == 0.0


def _foldable(node: Node) -> bool:
    """Relu, or Clip whose low bound is a constant 0: a uint8 range starting at 0 clamps the
    same."""
    if not node.is_onnx:
        return False
    if node.op_type == "Relu":
        return True
    if node.op_type == "Clip" and node.input(1) is not None:
        low = node.input(1).constant()
        return low is not None and low.size == 1 and float(low.reshape(())) == 0.0
    return False


def _mark(nodes: list[Node], result: Plan, symmetric: bool) -> None:
    wanted = {id(n) for n in result.static}  # nodes that read int8 activations
    passing = set()                          # Relu/Clip that only relay a want backwards
    for node in reversed(nodes):
        if id(node) in wanted or not node.is_onnx or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if out is None or out.is_graph_output or not _float(out):
            continue
        if not any(id(c) in wanted or id(c) in passing for c in out.consumers()):
            continue
        if node.op_type in INT8_OPS or node.op_type in SAME_SCALE and codes_padded(node):
            acts = _activations(node)
            if all(_float(v) and not v.is_constant for v in acts):
                wanted.add(id(node))
                (result.same_scale if node.op_type in SAME_SCALE else result.int8_ops
                 ).append(node)
        elif not symmetric and _foldable(node):
            passing.add(id(node))
    result.int8_ops.reverse()
    result.same_scale.reverse()
    while True:  # an op pruned for want of int8 input may leave another no int8 reader
        fed, scale_keeping = _fed_int8(nodes, result, symmetric)
        kept = _read_as_int8(nodes, result, fed, scale_keeping, symmetric)
        if len(kept) == len(result.int8_ops):
            break
        result.int8_ops = kept
    producers = [n for n in nodes if n in result.static or n in result.int8_ops]
    # An output the model quantizes itself (its readers, past an activation, are its own
    # QuantizeLinear) gets no Q/DQ of graphopt's: a second pair would round it twice.
    requantized = {id(n.outputs[0]) for n in producers if _quantized_by_model(n.outputs[0])}
    if not symmetric:
        for node in producers:
            if id(node.outputs[0]) in requantized:
                continue
            out = node.outputs[0]
            users = out.uses
            # Its readers then read the DQ of the producer's Q, whose range starts at 0; a
            # reader inside a branch or loop body gets no DQ (qdq_rewrite.insert_qdq) and would read
            # the value before the activation, so such an activation stays.
            if len(users) == 1 and _foldable(users[0].node) and users[0].index == 0 \
                    and not users[0].node.output.is_graph_output \
                    and all(u.node.graph is node.graph for u in users[0].node.output.uses):
                result.folds.append((node, users[0].node))
    # A scale-keeping op runs int8 only behind an int8 producer. After a float one (the stem
    # conv that quant_keep_ends keeps) onnxruntime runs a uint8 MaxPool on a generic NCHW
    # kernel: 7.6 ms on ResNet-50's stem, against 0.3 ms blocked in float with the Q after it.
    int8_values = {id(n.outputs[0]) for n in result.static + result.int8_ops}
    int8_values |= {id(act.output) for _, act in result.folds}
    kept = []
    for node in result.same_scale:  # graph order
        if id(node.inputs[0]) in int8_values:
            kept.append(node)
            int8_values.add(id(node.outputs[0]))
    result.same_scale = kept
    # A folded Relu's output becomes its producer's: readers will read that instead.
    result.alias = alias = {id(act.output): producer.outputs[0] for producer, act in result.folds}
    seen: dict[int, Value] = {}
    for node in nodes:
        if node in result.static or node in result.int8_ops or node in result.same_scale:
            for value in _activations(node):
                value = alias.get(id(value), value)
                seen.setdefault(id(value), value)
            out = node.outputs[0]
            if not out.is_graph_output and id(out) not in requantized:
                seen.setdefault(id(out), out)
    result.tensors = list(seen.values())


def _fed_int8(nodes: list[Node], result: Plan, symmetric: bool) -> tuple[list[Node], set[int]]:
    """The int8 ops of `result` that read at least one int8 value: the output of a static
    layer, of such an op or of a scale-keeping op behind one, directly or through a Relu or
    Clip(0, …) that will fold into it (its only reader; asymmetric ranges only). One fed float
    values alone would quantize each of them, add their codes and quantize the sum, where the
    float op rounds once and no slower: LowerPRelu's Relu(x) + Min(x, 0) · a (x read twice,
    so no Relu folds) quantized its two terms on MediaPipe's palm detector. Also the ids of
    the scale-keeping ops that read an int8 value (the others are pruned later)."""
    int8 = {id(n.outputs[0]) for n in result.static}
    ops, scale_keeping, kept = set(map(id, result.int8_ops)), set(map(id, result.same_scale)), []
    kept_scale_keeping: set[int] = set()

    def is_int8(value: Value | None) -> bool:
        if value is None or id(value) in int8:
            return value is not None
        producer = value.producer
        return not symmetric and producer is not None and _foldable(producer) \
            and producer.inputs[0] is not None and id(producer.inputs[0]) in int8 \
            and len(producer.inputs[0].uses) == 1 and not value.is_graph_output

    for node in nodes:
        if id(node) in ops:
            if any(is_int8(v) for v in _activations(node)):
                kept.append(node)
                int8.add(id(node.outputs[0]))
        elif id(node) in scale_keeping and is_int8(node.inputs[0]):
            kept_scale_keeping.add(id(node))
            int8.add(id(node.outputs[0]))
    return kept, kept_scale_keeping


def _read_as_int8(nodes: list[Node], result: Plan, ops: list[Node], scale_keeping: set[int],
                  symmetric: bool) -> list[Node]:
    """The int8 ops of `ops` that a static layer, another of `ops` or a scale-keeping op of
    `scale_keeping` (ids) reads, through a Relu or Clip(0, …) that folds, as _mark wanted them
    before _fed_int8 pruned some: a residual Add whose only int8 reader was LowerPRelu's sum
    quantized its output for float readers alone, one more rounding for nothing."""
    kept = set(map(id, ops))
    wanted, passing = {id(n) for n in result.static}, set()
    for node in reversed(nodes):
        if len(node.outputs) != 1 or node.outputs[0] is None:
            continue
        read = any(id(c) in wanted or id(c) in passing for c in node.outputs[0].consumers())
        if read and (id(node) in kept or id(node) in scale_keeping):
            wanted.add(id(node))
        elif read and not symmetric and _foldable(node) and node.inputs[0] is not None \
                and len(node.inputs[0].uses) == 1 and not node.outputs[0].is_graph_output:
            passing.add(id(node))  # it folds into its input's range, as _fed_int8 counts it
    return [n for n in ops if id(n) in wanted]


def _quantized_by_model(value: Value) -> bool:
    """Whether every reader of `value`, or of the one activation that reads it, is a
    QuantizeLinear the model holds."""
    readers = value.consumers()
    if len(readers) == 1 and _foldable(readers[0]) and readers[0].output is not None:
        readers = readers[0].output.consumers()
    return bool(readers) and all(r.op_type == "QuantizeLinear"
                                 and r.domain in ("", "ai.onnx", "com.microsoft")
                                 for r in readers)
