"""Precision policy: the modes, the op lists of mixed precision, option checks and which ops a
target runs in half precision.

Modes (ATC's --precision_mode in spirit):
    keep        original dtypes (no pass runs)
    fp16, bf16  force: every float32 op becomes float16 (bfloat16); an op the target cannot run
                in that dtype is refused, naming it (exclude it with precision_deny/keep_dtype).
                A PASS_THROUGH op (data movement) stays float32 when every computed float input
                it reads does, so a value kept float32 is not rounded to half and back on its
                way from one float32 op to the next; so does a region of ops with no matrix
                work read and written only by float32 ops (sandwich.py).
    mixed-fp16, mixed-bf16
                mixed: ALLOW ops (matrix and conv work, where half precision pays) go to half,
                DENY ops (reductions, exponentials, normalizations: half loses their accuracy)
                stay float32, every other op FOLLOWS its inputs: half when each of its computed
                float inputs is half, float32 otherwise (so no Cast is spent on a Reshape).
                An ALLOW op the target cannot run in half stays float32 (a note names it).

precision_allow / precision_deny (op types) move ops between the lists (in fp16 and bf16,
precision_allow converts its ops where no matrix work is near); keep_dtype (node names, and
op types as `OpType::Type`, as ATC's list writes them) pins single nodes or op types to their
dtype. The lists are checked before the pass runs.
"""

from __future__ import annotations

import copy
import functools

from graphopt.codegen.om_manifest import dtype_name
from graphopt.errors import OptionError, PassError, UsageError
from graphopt.ir import DType, Node
from graphopt.ir.onnx_export import anonymous_node
from graphopt.opcheck import expandable
from graphopt.option_names import option, setting, usage
from graphopt.partition.target_ort import cpu_kernel_binds
from graphopt.precision_modes import (CALIBRATION_METHODS, INT4_METHODS, MODES, OP_TYPE_ENTRY,
                                      QUANTIZE)

# Matrix and convolution work: the reason to run in half precision at all.
ALLOW = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "FusedConv", "FusedGemm", "FusedMatMul",
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "NhwcConv", "MatMulNBits",
})
# Numerically sensitive: long accumulations (reductions, normalization statistics, softmax
# sums), exponentials and logs (range), powers and roots (range, cancellation near 0), division
# (a half-precision divisor underflows), erf/exp-based activations evaluated near saturation.
DENY = frozenset({
    "Softmax", "LogSoftmax", "BiasSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd", "CumSum", "Exp", "Log",
    "Pow", "Sqrt", "Reciprocal", "Div", "Erf",
    # Every normalization that computes statistics, ONNX's and onnxruntime's contrib ones. Not
    # BatchNormalization: at inference it is a per-channel scale and shift with stored moments,
    # as cheap and as safe in half as the Conv it follows (which -O2 folds it into anyway).
    "LayerNormalization", "SkipLayerNormalization", "RMSNormalization",
    "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization",
    "InstanceNormalization", "GroupNormalization", "GroupNorm", "SkipGroupNorm",
    "LpNormalization", "MeanVarianceNormalization", "LRN",
    "Range", "NonMaxSuppression", "RoiAlign", "TopK",
})

# Data movement: they copy, pick or repeat elements and compute nothing, so their dtype is their
# neighbours' business (fp16 mode; mixed modes already let every op outside the lists follow).
PASS_THROUGH = frozenset({
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile",
    "Slice", "Split", "Concat", "Gather", "GatherElements", "GatherND", "DepthToSpace",
    "SpaceToDepth", "Pad",
})

HALF = {"fp16": DType.FLOAT16, "bf16": DType.BFLOAT16}


def deny_types(options) -> set[str]:
    """The op types kept in their dtype: precision_deny's and keep_dtype's `OpType::` entries."""
    return set(options.precision_deny) | {entry[len(OP_TYPE_ENTRY):] for entry in
                                          options.keep_dtype if entry.startswith(OP_TYPE_ENTRY)}


def keep_names(options) -> set[str]:
    """The node names keep_dtype pins (its entries that are no `OpType::` entry)."""
    return {entry for entry in options.keep_dtype if not entry.startswith(OP_TYPE_ENTRY)}


class PrecisionError(OptionError, PassError):
    """An option the precision passes cannot honour. A PassError too, so the pass manager passes
    it through unchanged; an OptionError to the caller."""


def half_dtype(mode: str) -> DType:
    return HALF[mode.removeprefix("mixed-")]


def is_mixed(mode: str) -> bool:
    return mode.startswith("mixed-")


def check_options(options) -> None:
    """Refuse precision/quantization option values no pass can honour, before anything runs."""
    if options.precision not in MODES:
        raise OptionError(f"{setting('precision', options.precision)}: unknown mode "
                          f"(use {', '.join(MODES)})")
    if options.quantize not in QUANTIZE:
        raise OptionError(f"{setting('quantize', options.quantize)}: unknown scheme "
                          f"(use {', '.join(QUANTIZE)})")
    both = sorted(set(options.precision_allow) & set(options.precision_deny))
    if both:
        raise OptionError(f"{option('precision_allow')} and {option('precision_deny')} both "
                          f"name {', '.join(both)}")
    kept = sorted(set(options.precision_allow)
                  & (deny_types(options) - set(options.precision_deny)))
    if kept:
        raise OptionError(f"{option('precision_allow')} names "
                          f"{', '.join(kept)}, which {option('keep_dtype')} keeps "
                          f"({', '.join(OP_TYPE_ENTRY + op for op in kept)})")
    listed = options.precision_allow or options.precision_deny or options.keep_dtype
    if listed and options.precision == "keep":
        raise OptionError(f"{option('precision_allow')}/{option('precision_deny')}/"
                          f"{option('keep_dtype')} adjust a precision mode: give "
                          f"{usage('precision', 'fp16|bf16|mixed-fp16|mixed-bf16')}")
    size = options.int4_group_size
    if not isinstance(size, int) or size < 16 or size & (size - 1):
        raise UsageError(f"{setting('int4_group_size', size)}: must be a power of 2 ≥ 16 "
                          "(onnxruntime's MatMulNBits block sizes: 16, 32, 64, 128, …)")
    defaults = type(options)()
    for scheme, names in (("int8", ("calibration_method", "calibration_percentile",
                                    "per_channel", "activation_symmetric", "quant_keep_ends",
                                    "quant_keep_sensitive", "quant_equalize")),
                          ("int4", ("int4_group_size", "int4_embeddings", "int4_method",
                                    "int4_accuracy_level"))):
        if options.quantize == scheme:  # from Python: the CLI refuses these flags itself
            continue
        for name in names:
            if getattr(options, name) != getattr(defaults, name):
                raise OptionError(f"{option(name)} applies to {setting('quantize', scheme)}")
    if options.int4_method not in INT4_METHODS:
        raise UsageError(f"{setting('int4_method', options.int4_method)}: unknown (use "
                          f"{', '.join(INT4_METHODS)})")
    if options.quantize == "int4" and options.int4_method == "gptq" and not options.calibration:
        raise OptionError(f"{setting('int4_method', 'gptq')} needs "
                          f"{usage('calibration', 'FILE.npz|DIR')}: it weighs each weight's "
                          "rounding by the inputs the layer sees")
    level = options.int4_accuracy_level
    if not isinstance(level, int) or not 0 <= level <= 4:
        raise UsageError(f"{setting('int4_accuracy_level', level)}: must be 0 (float activations), "
                          "1 (fp32), 2 (fp16), 3 (bf16) or 4 (int8)")
    asked = {"ConvertPrecision": setting("precision", options.precision)} \
        if options.precision != "keep" else {}
    if options.quantize != "none":
        asked[{"int8": "QuantizeInt8", "int4": "QuantizeInt4Weights"}[options.quantize]] = \
            setting("quantize", options.quantize)
    for name, flag in asked.items():
        if name in options.disabled_passes:  # the compile would silently stay float32
            raise OptionError(f"{flag} needs the {name} pass, which "
                              f"{option('disable_passes')} or a switch file turns off; drop one "
                              "or the other")
    if options.quantize == "int4" and "bf16" in options.precision:
        # ConvertPrecision runs first: every MatMul would read bfloat16, which onnxruntime's
        # MatMulNBits does not take, and the compile quantized nothing with a note only.
        raise OptionError(f"{setting('quantize', 'int4')} with "
                          f"{setting('precision', options.precision)}: MatMulNBits takes "
                          "float32 or float16 activations, so no MatMul would be quantized; use "
                          "fp16 or mixed-fp16 (or keep)")
    if options.calibration and options.quantize == "none" and options.precision == "keep":
        raise OptionError(f"{option('calibration')} applies to {option('quantize')} "
                          f"(activation ranges, GPTQ) and {option('precision')} (the accuracy "
                          "report's inputs); a float32 compile reads none of it "
                          f"({setting('verify')} takes its inputs from {option('inputs')})")
    if options.quantize == "int8" and not options.calibration:
        raise OptionError(f"{setting('quantize', 'int8')} needs "
                          f"{usage('calibration', 'FILE.npz|DIR')}: activation ranges come from "
                          "representative inputs")
    if options.calibration_method not in CALIBRATION_METHODS:
        raise OptionError(f"{setting('calibration_method', options.calibration_method)}: "
                          "unknown "
                          f"(use {', '.join(CALIBRATION_METHODS)})")


class Support:
    """Whether a target runs an op in a half dtype: its primary device has the kernel, or the
    host CPU does. onnxruntime's CPU provider (a `"ops": "onnxruntime"` device) also runs a
    float16 op for which it has only a float32 kernel: when it loads the model it wraps the node
    in Casts to float32 (its InsertCastTransformer), so the op runs, in float32, and `emulated`
    records it. It has no such fallback for bfloat16."""

    def __init__(self, target, opset: int | None = None):
        self.opset = opset  # the model's default-domain opset, for probes of function bodies
        if target is None:
            from graphopt.partition import load_target
            target = load_target("cpu")
        self.target = target
        self.devices = [target.device(target.primary)]
        if target.host != target.primary:
            self.devices.append(target.device(target.host))
        self.emulated: set[str] = set()
        # Inside a body onnxruntime inlines as a function (SequenceMap's), an op it would expand
        # from its own function body in half fails to load (a nested expansion).
        self.no_expansion = False

    def inside_function_body(self) -> "Support":
        """This support for the body of an op onnxruntime expands from its function body."""
        inner = copy.copy(self)
        inner.no_expansion = True
        return inner

    def host_only(self) -> "Support | None":
        """This support with the host's kernels alone, for the bodies of control flow the
        primary device cannot run (an NPU has no Loop or Scan: their bodies run on the host);
        None when the primary device is the host."""
        if len(self.devices) == 1:
            return None
        host = Support(self.target, self.opset)
        host.devices, host.emulated = self.devices[1:], self.emulated
        return host

    def on_host(self, node: Node) -> bool:
        """Whether `node` of the main graph runs on the host: no primary-device kernel."""
        return len(self.devices) > 1 and self.devices[0].kernel(node.op_type, node.domain) is None

    def has(self, op: str, domain: str, dtype: DType) -> bool:
        """Whether the primary device or the host has a native `dtype` kernel for the op."""
        name = dtype_name(int(dtype))
        return any(device.has_kernel(op, domain, name) for device in self.devices)

    def stand_in_refuses(self, node: Node) -> bool:
        """Whether the target's NPU would run `node` in half on a kernel that onnxruntime's
        CPU provider, the NPU's functional stand-in, registers but refuses at run time."""
        return _ort_cpu_half_gap(node) and any(
            device.kind == "npu" and device.kernel_source != "onnxruntime"
            for device in self.devices)

    def runs(self, node: Node, dtype: DType, slots=None) -> bool:
        """Whether the target runs `node` with the inputs and outputs `slots` lists (every
        float32 one, without slots) in `dtype`."""
        from graphopt.passes.precision.schema import float_dtype_attrs

        gap = _ort_cpu_half_gap(node)
        name = {DType.FLOAT16: "float16", DType.BFLOAT16: "bfloat16"}[dtype]
        if any(self._native(device, node, name, slots) for device in self.devices
               if not (gap and device.kernel_source == "onnxruntime")):
            return True
        expands = bool(self.opset) and node.is_onnx and expandable(node.op_type, "", self.opset)
        if self.no_expansion:
            if expands or not node.is_onnx:
                # onnxruntime would expand it, nested in the body's own expansion (a contrib
                # op from its contrib function: FuseGelu's QuickGelu of a SiLU)
                return False
        elif _expanded_by_onnxruntime(node, self.devices):
            return True
        # Not an output whose dtype an attribute sets (HannWindow's output_datatype, EyeLike's
        # dtype): the kernel is looked up by that dtype, and fails.
        if gap or float_dtype_attrs(node, None):
            return False
        if dtype == DType.FLOAT16 and expands \
                and any(device.kernel_source == "onnxruntime" for device in self.devices):
            # No half kernel: onnxruntime expands the op from its ONNX function body rather
            # than cast around its float32 kernel, and that body must type-check in half.
            return _body_loads(anonymous_node(node).SerializeToString(),
                               tuple(_half_type(v, dtype) for v in node.inputs), self.opset)
        # Emulation: onnxruntime casts the half inputs and outputs of a float32-only kernel
        # around it.
        for device in self.devices:
            if (device.kernel_source == "onnxruntime" and dtype == DType.FLOAT16
                    and device.has_kernel(node.op_type, node.domain, "float32")):
                self.emulated.add(node.qualified_op)
                return True
        return False

    def _native(self, device, node: Node, name: str, slots) -> bool:
        """Whether `device` has a `name` kernel for `node`. onnxruntime's table is the union
        over every version of the op, so its CPU provider is asked for the kernel of the
        model's opset at the node's converted dtypes: Pad has bfloat16 from version 21 only,
        and a bf16 compile at opset 13 wrote a Pad no session loads."""
        if device.kernel_source == "onnxruntime" and self.opset and node.is_onnx:
            binds = cpu_kernel_binds(node.op_type, "", self.opset,
                                     _converted(node.inputs, slots and slots.inputs, name),
                                     _converted(node.outputs, slots and slots.outputs, name))
            if binds is not None:
                return binds
        return device.has_kernel(node.op_type, node.domain, name)


def _converted(values, positions, name: str) -> list[str | None]:
    """The dtype names of `values` once the float32 ones at `positions` (every float32 one,
    when None) are `name`."""
    names = []
    for i, value in enumerate(values):
        if value is None or value.dtype is None:
            names.append(None)
        elif value.dtype == DType.FLOAT and (positions is None or i in positions):
            names.append(name)
        else:
            names.append(dtype_name(int(value.dtype)))
    return names


def _ort_cpu_half_gap(node: Node) -> bool:
    """Whether onnxruntime's CPU provider registers a half kernel for `node` that refuses its
    attributes at run time: ScatterND and ScatterElements reduce in float32 and double only."""
    return node.op_type in ("ScatterND", "ScatterElements") and node.is_onnx \
        and node.attr("reduction", "none") not in ("none", b"none")


def _half_type(value, dtype: DType) -> tuple[int, tuple] | None:
    """(element type, shape) an input of a converted node gets: float32 becomes `dtype`."""
    if value is None or value.dtype is None:
        return None
    elem = int(dtype) if value.dtype == DType.FLOAT else int(value.dtype)
    return elem, tuple(value.shape) if value.shape is not None else None


@functools.cache
def _body_loads(node: bytes, inputs: tuple, opset: int) -> bool:
    """Whether onnxruntime loads a model of this one node (anonymous_node's form) with these
    input types, once per kind of node: MeanVarianceNormalization-13's body adds a float32
    epsilon to its input, so in float16 no session loads it."""
    import onnx
    from onnx import helper

    from graphopt.numerics import load_refusal

    proto = onnx.NodeProto.FromString(node)
    values = [helper.make_tensor_value_info(f"i{i}", *held) for i, held in enumerate(inputs)
              if held is not None]
    graph = helper.make_graph([proto], "probe", values,
                              [onnx.ValueInfoProto(name=name) for name in proto.output if name])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    return load_refusal(model.SerializeToString()) is None


def _expanded_by_onnxruntime(node: Node, devices) -> bool:
    """Whether onnxruntime runs `node` from its ONNX schema's function body (CastLike: a Cast),
    having no kernel of its own for it: the body's ops then decide, in any dtype they take."""
    import onnx

    if not any(d.kernel_source == "onnxruntime" and not d.has_kernel(node.op_type, node.domain,
                                                                      None) for d in devices):
        return False
    domain = "" if node.domain == "ai.onnx" else node.domain
    if not onnx.defs.has(node.op_type, domain):
        return False
    schema = onnx.defs.get_schema(node.op_type, domain)
    return schema.has_function or schema.has_context_dependent_function
