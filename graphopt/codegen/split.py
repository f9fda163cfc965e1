"""Cut a partitioned IR model into one model per partition, and those into .om partitions."""

from __future__ import annotations

from collections import Counter

from onnx import ModelProto

from graphopt.codegen.om_write import OmPartition
from graphopt.codegen.prepacking import prepacking_pays
from graphopt.ir import DType, Model, load_onnx, to_onnx
from graphopt.ir.onnx_export import node_to_proto, value_info
from graphopt.ir.onnx_io import proto_nodes
from graphopt.ir.tensor import Tensor, referenced, tensor_copies, tensor_references
from graphopt.numerics import optimized_by_onnxruntime
from graphopt.passes.disputed_shapes import shape_read_past_dispute
from graphopt.partition.partitioner import Partition, Partitioning, reads
from graphopt.partition.target_ort import op_key, ort_cpu_kernels


def partition_ir(model: Model, partitioning: Partitioning) -> dict[str, Model]:
    """Each partition as a model of its own, by name, carrying the weights it reads and the
    model-local functions it calls. A single partition is `model` itself."""
    parts = partitioning.partitions
    if len(parts) == 1:
        return {parts[0].name: model}
    return {p.name: _partition_ir(model, p) for p in parts}


def _partition_ir(model: Model, part: Partition) -> Model:
    """Partition `part` as a model of its own, sharing `model`'s weight tensors: its proto
    carries references to them, not copies, so weights still on disk stay there (a model
    past 2 GB would not even fit in one proto)."""
    proto, references = _partition_model(model, part)
    cut = load_onnx(proto, user_model=False)
    for value in cut.graph.initializers.values():
        if value.const is not None:
            value.const = referenced(value.const, references) or value.const
    return cut


def om_partitions(partitioning: Partitioning, models: dict[str, Model],
                  cpu_level: str | None = None) -> list[OmPartition]:
    """The .om partitions in execution order: each model (from `partition_ir`), the providers the
    target names for its device, and for CPU partitions `cpu_level`, the onnxruntime
    optimization level to run them at."""
    parts = partitioning.partitions
    result = []
    for part in parts:
        device = partitioning.target.device(part.device)
        # One partition keeps its model's own signature (initializers a caller may override);
        # several are cut along the tensors that cross between them.
        cut = {} if len(parts) == 1 else {"inputs": [v.name for v in part.inputs],
                                           "outputs": [v.name for v in part.outputs]}
        model = models[part.name]
        on_cpu = device.kind == "cpu"
        if shape_read_past_dispute(model):
            level = "disable"  # onnxruntime would fold a Shape to inference's size
        else:
            level = _session_level(model, cpu_level) if on_cpu else _device_level(model)
        result.append(OmPartition(part.name, part.device, to_onnx(model), **cut,
                                  providers=list(device.providers), optimization_level=level,
                                  disabled_optimizers=disabled_optimizers(model, level),
                                  prepack_weights=not on_cpu or prepacking_pays(
                                      model, wide_vectors=device.nchwc_block_size == 16)))
    return result


def _host_avx512() -> bool:
    """Whether this CPU has AVX-512F (onnxruntime's NCHWc block of 16): a model compiled for
    no target runs where it is compiled, as the `cpu` profile's "auto" block assumes."""
    from graphopt.partition.target_ort import nchwc_block_size

    return nchwc_block_size() == 16


def _device_level(model: Model) -> str | None:
    """An NPU partition's level: "basic" when it holds Q/DQ pairs, which the device's provider
    takes as they are and which the CPU provider standing in for it would otherwise fuse into
    its own int8 kernels, whose 16-bit pair sums saturate without VNNI where the NPU's int32
    sums do not; else onnxruntime's default."""
    return "basic" if any(n.op_type in _QDQ and n.is_onnx for n in model.graph) else None


def portable_partition(name: str, model: Model) -> OmPartition:
    """The one partition of a model compiled for no target, which the CPU runs."""
    level = "disable" if shape_read_past_dispute(model) else None  # as in om_partitions
    return OmPartition(name, "cpu", to_onnx(model), optimization_level=level,
                       disabled_optimizers=disabled_optimizers(model, level),
                       prepack_weights=prepacking_pays(model, wide_vectors=_host_avx512()))


# onnxruntime's WeightBiasQuantization (1.20 on, "basic" level) quantizes the float weight of
# any Conv, ConvTranspose or Gemm that reads a DequantizeLinear output, per tensor, and fuses it
# into an int8 kernel: a layer QuantizeInt8 left float (--quant-skip, quant_keep_ends' head)
# would silently run in int8, less accurately than either.
_REQUANTIZER = "WeightBiasQuantization"
# It also quantizes a float bias beside a dequantized weight with a Round, which ONNX has from
# opset 11 only: an opset-10 QDQ model's session then fails to load ("No Op registered for
# Round with domain_version of 10"), the original's too at any level but "disable".
_ROUND_OPSET = 11
# onnxruntime's MatmulTransposeFusion ("extended" level) folds a Transpose of A into
# FusedMatMul's transA, which then computes a wrong product against a 1-D B (1.32: off by 3.4
# on a [4,3]ᵀ · [4]; correct with the Transpose kept, and with A 1-D or B of rank 2).
_TRANSPOSE_FOLDER = "MatmulTransposeFusion"
# onnxruntime's SkipLayerNormFusion ("extended" level) turns Add + LayerNormalization back into
# the SkipLayerNormalization graphopt's fusions avoid on the CPU (see _session_level).
_SKIP_FUSER = "SkipLayerNormFusion"
# onnxruntime's LayerNormFusion ("basic" level from opset 17, "extended" before; named by its
# level since 1.2x) and SimplifiedLayerNormFusion match a decomposed LayerNorm or RMSNorm
# without reading the Pow's exponent (1.32: Pow(d, 0) fused as a LayerNorm, off by 0.2 to 0.6),
# and build a (Skip)LayerNormalization from any epsilon, whose kernel then refuses one ≤ 0 or
# NaN at load.
_NORM_FUSERS = ("LayerNormFusionL1", "LayerNormFusionL2", "LayerNormFusion",
                "SimplifiedLayerNormFusion")


def disabled_optimizers(model: Model, level: str | None = None, *,
                        for_speed: bool = True) -> list[str] | None:
    """The onnxruntime optimizers that would change this partition's results or slow it, at
    its session `level` (None: onnxruntime's default, "all"): None, or WeightBiasQuantization
    when a float Conv/ConvTranspose/Gemm reads dequantized data or, below opset 11, a float
    bias beside dequantized data (its Round would not load), MatmulTransposeFusion when a
    MatMul of a transposed A reads a 1-D B, the norm fusions where a Pow's exponent or an
    epsilon is one they would misread (_misfused_norm_part), QDQPropagationTransformer for an
    int8 activation at opset 21 or later (_signed_quantize_at_21), ConvBNFusion for a 16-bit
    float Conv -> BatchNormalization (_half_conv_batchnorm), and SkipLayerNormFusion where a
    partition at
    "extended" or above (a fused float one, Q/DQ, convs left for onnxruntime to block, a
    compile for no target) has an Add + LayerNormalization it would fuse: a wav2vec2 export's
    .om, its convs left to onnxruntime, ran 1.28× the original's time with four
    SkipLayerNormalizations, 1.01× without. That last one is for speed alone: `for_speed=False`
    leaves it out, for the optimizers that change results."""
    found = []
    functions = {(f.domain, f.name): f for f in model.functions}
    if for_speed and level in (None, "all", "extended"):
        if any(_refusable_skip_layernorm(n, functions) for n in model.graph.all_nodes()):
            found.append(_SKIP_FUSER)
    if level != "disable" and any(_misfused_norm_part(n) or _misfused_in_call(n, functions)
                                  for n in model.graph.all_nodes()):
        found += [name for name in (*_NORM_FUSERS, _SKIP_FUSER) if name not in found]
    if _signed_quantize_at_21(model):
        found.append(_QDQ_PROPAGATOR)
    if (model.opset("") or 1) < _ROUND_OPSET and any(
            map(_float_bias_beside_dequantized, model.graph.all_nodes())):
        found.append(_REQUANTIZER)
    for node in model.graph.all_nodes():
        if node.op_type in ("Conv", "ConvTranspose", "Gemm") and node.is_onnx \
                and len(node.inputs) > 1 and node.inputs[0] is not None:
            producer, weight = node.inputs[0].producer, node.inputs[1]
            if producer is not None and producer.op_type == "DequantizeLinear" \
                    and weight is not None and weight.producer is None \
                    and _REQUANTIZER not in found:
                found.append(_REQUANTIZER)
        elif node.op_type == "MatMul" and node.is_onnx and _transposed_times_vector(node) \
                and _TRANSPOSE_FOLDER not in found:
            found.append(_TRANSPOSE_FOLDER)
        elif level != "disable" and _CONV_BN_FUSER not in found and _half_conv_batchnorm(node):
            found.append(_CONV_BN_FUSER)
        elif level != "disable" and _DIV_MUL_FUSER not in found and (
                _widening_numerator(node) or _widening_numerator_in_call(node, functions)):
            found.append(_DIV_MUL_FUSER)
    return found or None


# onnxruntime's QDQPropagationTransformer copies a Q/DQ pair past data movement (a Slice to a
# graph output), writing the new QuantizeLinear's output_dtype (opset 21 on); its
# QDQS8ToU8Transformer then makes the zero point uint8 and leaves output_dtype INT8: 1.32
# refused the .om of a symmetric int8 compile ("output_dtype INT8 does not match y_zero_point
# type UINT8").
_QDQ_PROPAGATOR = "QDQPropagationTransformer"


def _float_bias_beside_dequantized(node) -> bool:
    """A Conv, ConvTranspose or Gemm reading a DequantizeLinear output with a float constant
    bias: what WeightBiasQuantization quantizes with its Round."""
    if node.op_type not in ("Conv", "ConvTranspose", "Gemm") or not node.is_onnx \
            or len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    bias = node.inputs[2]
    return bias.producer is None and bias.is_constant and any(
        x is not None and x.producer is not None and x.producer.op_type == "DequantizeLinear"
        for x in node.inputs[:2])


def _signed_quantize_at_21(model: Model) -> bool:
    """Whether the partition quantizes an activation to int8 (a signed zero point) at an ONNX
    opset of 21 or later, where QuantizeLinear has output_dtype."""
    import numpy as np

    if (model.opset("") or 1) < 21:
        return False
    for node in model.graph.all_nodes():
        if node.op_type == "QuantizeLinear" and node.is_onnx and len(node.inputs) > 2 \
                and node.inputs[2] is not None and not node.inputs[0].is_constant:
            zero = node.inputs[2].constant()
            if zero is not None and zero.dtype == np.int8:
                return True
    return False


# onnxruntime's DivMulFusion writes Mul(Div(1, x), y) as Div(y, x), dropping the rank a
# constant 1 of shape [1, 1, 1] adds: the partition returned [3, 8] for a declared [1, 3, 8],
# and the .om did not load.
_DIV_MUL_FUSER = "DivMulFusion"

# onnxruntime's ConvBNFusion folds a float16 BatchNormalization into its Conv in float16: a
# weight the scale takes past 65504, or a var + epsilon that float16 rounds to 0, makes inf/NaN
# where the unfolded pair (and FuseConvBatchNorm, which declines such a fold) computes finite
# values.
_CONV_BN_FUSER = "ConvBNFusion"


def _half_conv_batchnorm(node) -> bool:
    """A BatchNormalization of a float16 or bfloat16 Conv's (or ConvTranspose's) output."""
    if node.op_type != "BatchNormalization" or not node.is_onnx or not node.inputs \
            or node.inputs[0] is None:
        return False
    producer = node.inputs[0].producer
    return producer is not None and producer.op_type in ("Conv", "ConvTranspose") \
        and node.inputs[0].dtype in (DType.FLOAT16, DType.BFLOAT16)


def _widening_numerator(node) -> bool:
    """A Div of a constant numerator of a higher rank than its divisor."""
    if node.op_type != "Div" or not node.is_onnx or len(node.inputs) < 2:
        return False
    numerator, divisor = node.inputs
    data = numerator.constant() if numerator is not None else None
    return data is not None and divisor is not None and divisor.shape is not None \
        and data.ndim > len(divisor.shape)


def _widening_numerator_in_call(node, functions: dict) -> bool:
    """The same inside an -O3 group's body, its constants and inputs the call's: a divisor
    the body computes, of a rank the body does not say, counts as of rank 1."""
    called = _called(node, functions)
    if called is None:
        return False
    function, actual = called
    for body in function.node:
        if body.op_type != "Div" or len(body.input) < 2:
            continue
        numerator, divisor = actual.get(body.input[0]), actual.get(body.input[1])
        data = numerator.constant() if numerator is not None else None
        rank = len(divisor.shape) if divisor is not None and divisor.shape is not None else 1
        if data is not None and data.ndim > rank:
            return True
    return False


def _misfused_norm_part(node) -> bool:
    """A node onnxruntime's norm fusions would misread: a Pow whose constant exponent is not
    2 read by a ReduceMean (or an -O3 group's call), an Add of a constant ≤ 0 or NaN, or of a
    higher rank than the value it adds to, into a Sqrt (a decomposed norm's epsilon), a
    ReduceMean with keepdims=0 read by a Sub or an Add (the fused node keeps the reduced
    axis), a LayerNormalization whose epsilon is ≤ 0 or NaN, or a ReduceMean of a Cast from
    another dtype: onnxruntime 1.32 fuses the decomposed norm into a LayerNormalization of the Cast's
    input, whatever its dtype, which it then refuses to load ("Type parameter (T) … bound to
    different types"; "Type 'tensor(int32)' … is invalid"): the float16 input of one that a
    mixed-precision compile runs in float32 behind a Cast, the float32 input of one that fp16
    converts at -O0/-O1 (where FuseLayerNorm does not run) behind the model's input Cast, the
    integers of a model's own Cast from int."""
    import math

    import numpy as np

    if not node.is_onnx:
        return False
    if node.op_type == "ReduceMean" and not node.attr("keepdims", 1) and node.inputs \
            and node.inputs[0] is not None and node.outputs[0] is not None:
        # The fusions ignore keepdims (a [8] mean broadcast along the rows): a norm's mean, read
        # with its input by a Sub (or an -O3 group's call), or its variance, read by an Add
        # into a Sqrt. A mean-pool head (keepdims=0, then a bias) leaves the fusions on.
        readers = node.outputs[0].consumers()
        centring = {id(use) for use in readers if use.op_type == "Sub"
                    or use.domain == "graphopt"}
        if any(id(use.node) in centring for use in node.inputs[0].uses) or any(
                use.op_type == "Add" and any(after.op_type == "Sqrt" for out in use.outputs
                                             if out is not None for after in out.consumers())
                for use in readers):
            return True
    if node.op_type == "ReduceMean" and node.inputs and node.inputs[0] is not None:
        cast = node.inputs[0].producer
        source = cast.inputs[0] if cast is not None and cast.op_type == "Cast" else None
        if source is None or source.dtype is None or source.dtype == node.inputs[0].dtype:
            return False  # a Cast to the dtype it reads: one onnxruntime may drop
        # A norm's: x - mean(x) follows (a mean pooled for its own sake leaves the fusions on),
        # or a call of an -O3 group that reads both, whose body onnxruntime inlines.
        centred = {id(use.node) for use in node.outputs[0].uses
                   if use.node.op_type == "Sub" or use.node.domain == "graphopt"}
        return any(id(use.node) in centred for use in node.inputs[0].uses)
    if node.op_type == "LayerNormalization":
        epsilon = node.attr("epsilon", 1e-5)
        return not (isinstance(epsilon, (int, float)) and epsilon > 0)  # NaN > 0 is False
    if node.op_type == "Pow" and len(node.inputs) > 1 and node.inputs[1] is not None:
        # Both fusions match the variance as ReduceMean(Pow(d, 2)): a Pow read otherwise (a
        # tanh-GELU's cube, read by a Mul) is none of theirs.
        exponent = node.inputs[1].constant()
        return exponent is not None and exponent.size == 1 \
            and float(exponent.reshape(-1)[0]) != 2 and _reduced_by_a_mean(node.outputs[0])
    if node.op_type == "Add" and any(use.op_type == "Sqrt" for out in node.outputs
                                     if out is not None for use in out.consumers()):
        for value, other in zip(node.inputs, reversed(node.inputs)):
            data = value.constant() if value is not None else None
            if data is not None and data.size == 1 and np.issubdtype(data.dtype, np.floating):
                epsilon = float(data.reshape(-1)[0])
                if math.isnan(epsilon) or epsilon <= 0:
                    return True
                # An epsilon of a higher rank widens the output, which the fused node drops.
                if other is not None and other.shape is not None and data.ndim > len(other.shape):
                    return True
    return False


def _reduced_by_a_mean(value) -> bool:
    """Whether a ReduceMean (or an -O3 group's call) reads `value`, directly or through ops
    onnxruntime removes before its fusions: an Identity, a Dropout, a Cast to the same dtype."""
    for use in value.consumers() if value is not None else ():
        if use.op_type == "ReduceMean" or use.domain == "graphopt":
            return True
        passes_on = use.op_type in ("Identity", "Dropout") or (
            use.op_type == "Cast" and use.outputs[0] is not None
            and use.outputs[0].dtype == value.dtype)
        if use.is_onnx and passes_on and _reduced_by_a_mean(use.outputs[0]):
            return True
    return False


def _called(node, functions: dict):
    """(the model-local function `node` calls, its formal inputs' actual values by name), or
    None for a node that calls none."""
    function = functions.get((node.domain, node.op_type))
    if function is None:
        return None
    return function, {formal: value for formal, value in zip(function.input, node.inputs)}


def _misfused_in_call(node, functions: dict) -> bool:
    """Whether a call of a model-local function (an -O3 elementwise group) holds a Pow or an
    epsilon Add that _misfused_norm_part would flag: onnxruntime inlines the body, and its
    LayerNormFusion then read a Pow of 4, moved into a group at -O3, as a square (0.8 off on
    outputs of magnitude 3; the check had walked the graph's own nodes alone). The body's
    constants are the call's inputs."""
    import math

    called = _called(node, functions)
    if called is None:
        return False
    function, actual = called
    feeds_sqrt = {name for body in function.node if body.op_type == "Sqrt" for name in body.input}

    def constant(name: str):
        value = actual.get(name)
        data = value.constant() if value is not None else None
        return data if data is not None and data.size == 1 else None

    # A Pow's value reaches a ReduceMean where the body reduces it or passes it out.
    reduced = {name for body in function.node if body.op_type == "ReduceMean"
               for name in body.input} | set(function.output)
    for body in function.node:
        if body.op_type == "Pow" and len(body.input) > 1 and body.output[0] in reduced:
            exponent = constant(body.input[1])
            if exponent is not None and float(exponent.reshape(-1)[0]) != 2:
                return True
        if body.op_type == "Add" and set(body.output) & feeds_sqrt:
            for name in body.input:
                epsilon = constant(name)
                if epsilon is not None and (math.isnan(float(epsilon.reshape(-1)[0]))
                                            or float(epsilon.reshape(-1)[0]) <= 0
                                            or epsilon.ndim > 1):  # it may widen the rank
                    return True
    return False


def _transposed_times_vector(node) -> bool:
    a, b = node.input(0), node.input(1)
    return a is not None and b is not None and a.producer is not None \
        and a.producer.op_type == "Transpose" and (b.shape is None or len(b.shape) == 1)


def _layout_left_to_onnxruntime(nodes: list) -> bool:
    """Whether onnxruntime's layout level would rewrite convs that graphopt left as they were:
    a model's own QLinearConv, which "all" alone moves to NHWC (onnxruntime's quantize_static
    in QOperator form: a small ResNet's .om, at "disable", ran 2.06× the original's time); any
    Conv or FusedConv (-O3 fuses activations first) when nothing was blocked offline
    (LayoutNchwc off, or given up on the model), or one whose filters are computed at run
    time, which onnxruntime folds first. A conv with constant filters left beside blocked ones
    is one that onnxruntime's rules leave too (a grouped conv whose groups are not whole
    blocks, say)."""
    if any(n.op_type == "QLinearConv" and n.is_onnx for n in nodes):
        return True  # a model's own int8 conv (QOperator form): "all" runs it in NHWC
    convs = [n for n in nodes if (n.op_type == "Conv" and n.is_onnx)
             or (n.op_type == "FusedConv" and n.domain == "com.microsoft")]
    if not convs:
        return False
    if not any(n.domain == "com.microsoft.nchwc" for n in nodes):
        return True
    return any(len(n.inputs) > 1 and n.inputs[1] is not None and not n.inputs[1].is_constant
               for n in convs)


def _convs_in_called_functions(model: Model) -> bool:
    """Whether a node (or one in its subgraphs) calls a model-local function whose body, or a
    function it calls, holds a Conv at any depth: the passes leave function bodies as they are,
    so onnxruntime's layout level must block it."""
    functions = {(f.domain, f.name): f for f in model.functions}
    seen = set()
    todo = [(n.domain, n.op_type) for n in model.graph.all_nodes()]
    while todo:
        key = todo.pop()
        if key in seen or key not in functions:
            continue
        seen.add(key)
        for inner in proto_nodes(functions[key].node):
            if inner.op_type in ("Conv", "QLinearConv") and inner.domain in ("", "ai.onnx"):
                return True
            todo.append((inner.domain, inner.op_type))
    return False


def _session_level(model: Model, fused_level: str | None) -> str | None:
    """`fused_level`, unless convs were left for onnxruntime's layout level ("all") to block
    (`_layout_left_to_onnxruntime`), such as one whose filters it folds first. An int8 Conv
    between Q/DQ nodes (QuantizeInt8) is one too: "extended" already fuses it into
    QLinearConv, and "all" adds the NHWC layout (com.microsoft QLinearConv) that onnxruntime's
    int8 convs run fastest in.

    A fused float partition with Add + LayerNormalization keeps "extended", with onnxruntime's
    SkipLayerNormFusion disabled (`disabled_optimizers`): its CPU SkipLayerNormalization is what
    graphopt's fusions avoid (6× slower, fusion/layernorm.py). Such a partition used to run at
    "basic", which loses the rewrites "extended" makes beyond graphopt's own: an XLNet export's
    .om ran 1.13× its original at "basic" and 0.97× at "extended" (its Gather→Split and Range
    merges); BERT and GPT-2 get the same graph at both."""
    nodes = list(model.graph)
    if fused_level is not None and _layout_left_to_onnxruntime(nodes):
        return "all"
    if fused_level is not None and _convs_in_called_functions(model):
        return "all"  # convs inside model-local functions: graphopt did not block them
    if any(map(_half_int8_nbits, nodes)) or any(map(_half_weight_cast, nodes)):
        return "all"
    if fused_level == "extended" and _nothing_left_for(model, nodes):
        return "disable"
    return fused_level


def _half_weight_cast(node) -> bool:
    """A node reading a float16 weight that onnxruntime's CPU provider has no float16 kernel
    for: it casts the weight to float32 in front of its float32 kernel, and only "all" folds
    that Cast once; below it the weight is cast at every run (a float16 MatMul chain's .om,
    at "extended", ran 20.6 ms where the original at "all" ran 7.5 ms)."""
    if not any(v is not None and v.is_constant and v.dtype == DType.FLOAT16
               for v in node.inputs):
        return False
    return "float16" not in ort_cpu_kernels().get(op_key(node.op_type, node.domain), ())


def _half_int8_nbits(node) -> bool:
    """A float16 MatMulNBits at accuracy level 4 (activations quantized to int8): onnxruntime
    1.32 computes it wrong below "all" while it pre-packs the weights (an fp16 int4 Llama
    export's .om, at "extended", read logits cosine 0.34 against 0.90 at "all", float32's)."""
    return node.op_type == "MatMulNBits" and node.domain == "com.microsoft" \
        and node.attr("accuracy_level", 0) == 4 and node.input(0) is not None \
        and node.input(0).dtype == DType.FLOAT16


# _nothing_left_for asks onnxruntime, which costs about one start of the partition at compile
# time (34 ms at 220 nodes, 0.43 s at 2,244) and a copy of its weights. It pays for a small
# graph, whose start it shortens by ~10%; past these bounds the partition keeps "extended".
_LEVEL_CHECK_NODES = 128
_LEVEL_CHECK_BYTES = 16 << 20


def _nothing_left_for(model: Model, nodes: list) -> bool:
    """Whether onnxruntime's extended level leaves a small partition's graph as graphopt wrote
    it: then its session can skip the graph optimizer, ~0.2 ms of a 2 ms start (tiny 2.15 →
    1.93 ms, matmul256 2.66 → 2.45 ms, 300 interleaved starts; steady state unchanged)."""
    if len(nodes) > _LEVEL_CHECK_NODES or any(node.subgraphs() for node in nodes):
        return False
    weights = sum(v.const.nbytes for v in model.graph.initializers.values()
                  if v.const is not None)
    if weights > _LEVEL_CHECK_BYTES:
        return False
    with tensor_copies():  # the .om writer's references would not load
        proto = to_onnx(model)
    if proto.ByteSize() > _LEVEL_CHECK_BYTES:  # a tree ensemble's node attributes (20 MB)
        return False
    try:
        optimized = optimized_by_onnxruntime(proto, "extended")
    except Exception:  # noqa: BLE001 - onnxruntime refuses it: keep the level, let load report
        return False
    return _op_counts(optimized.graph) == _op_counts(proto.graph)


def _op_counts(graph) -> Counter:
    return Counter(("" if n.domain == "ai.onnx" else n.domain, n.op_type) for n in graph.node)


_QDQ = ("QuantizeLinear", "DequantizeLinear")


def _refusable_skip_layernorm(node, functions: dict | None = None) -> bool:
    """LayerNormalization of an Add that only it reads, both inputs of rank 3: what onnxruntime's
    SkipLayerNormFusion (extended level) fuses, given equal shapes, into SkipLayerNormalization.
    The Add may be the last op of a model-local function (-O3's FuseElementwise groups), which
    onnxruntime inlines before it fuses."""
    if node.op_type != "LayerNormalization" or not node.is_onnx or not node.inputs:
        return False
    x = node.inputs[0]
    add = x.producer
    if add is None or len(x.uses) != 1 or x.is_graph_output:
        return False
    if add.op_type == "Add" and add.is_onnx:
        return all(v is not None and v.shape is not None and len(v.shape) == 3
                   for v in add.inputs)
    function = (functions or {}).get((add.domain, add.op_type))
    return function is not None and x.shape is not None and len(x.shape) == 3 \
        and _function_output_op(function, x.index) == "Add"


def _function_output_op(function, index: int) -> str | None:
    """The op of the body node that makes a function's `index`-th output."""
    if index >= len(function.output):
        return None
    name = function.output[index]
    return next((n.op_type for n in function.node if name in n.output
                 and n.domain in ("", "ai.onnx")), None)


def _partition_model(model: Model, part: Partition) -> tuple[ModelProto, dict[str, Tensor]]:
    """The partition's proto, whose large initializers are references (the dict resolves them)
    to the model's own tensors; tensor attributes are copied as they are."""
    proto = ModelProto()
    # Initializers that are not graph inputs need IR 4; weights move between partitions freely.
    proto.ir_version = max(model.ir_version, 4)
    for domain, version in model.opset_imports.items():
        entry = proto.opset_import.add()
        entry.domain, entry.version = domain, version
    proto.producer_name = model.producer_name
    proto.producer_version = model.producer_version
    graph = proto.graph
    graph.name = f"{model.graph.name}_{part.name}"
    graph.input.extend(value_info(v) for v in part.inputs)
    outputs = {id(v) for v in part.outputs}
    # An initializer the caller gets (a graph output) travels like one a node reads.
    weights: dict[str, object] = {v.name: v for v in part.outputs if v.is_weight}
    for node in part.nodes:
        for value in reads(node):
            if value.is_weight:  # dense or sparse
                weights.setdefault(value.name, value)
        graph.node.append(node_to_proto(node))
        for value in node.outputs:
            if value is not None and id(value) not in outputs and (
                    value.dtype is not None or value.type_proto is not None):
                graph.value_info.append(value_info(value))
    with tensor_references() as references:
        for value in weights.values():
            if value.sparse_const is not None:
                graph.sparse_initializer.append(value.sparse_const)
            else:
                graph.initializer.append(value.const.to_proto(value.name))
    graph.output.extend(value_info(v) for v in part.outputs)
    proto.functions.extend(_functions_used(model, part))
    return proto, references


def _functions_used(model: Model, part: Partition) -> list:
    """The model-local functions the partition calls, directly or from other functions."""
    by_key = {(f.domain, f.name): f for f in model.functions}
    wanted = [(n.domain, n.op_type) for node in part.nodes for n in _with_nested(node)]
    used: dict[tuple[str, str], object] = {}
    while wanted:
        key = wanted.pop()
        function = by_key.get(key)
        if function is None or key in used:
            continue
        used[key] = function
        wanted.extend((n.domain, n.op_type) for n in function.node)
    return [f for key, f in by_key.items() if key in used]  # the model's order, deterministic


def _with_nested(node):
    yield node
    for sub in node.subgraphs():
        yield from sub.all_nodes()
