"""What a precision mode leaves on the host CPU of an NPU target: bfloat16 ops it cannot run
(refused), quantized ops that moved there (a note)."""

from __future__ import annotations

from collections import Counter

from graphopt.codegen.om_manifest import dtype_name
from graphopt.errors import OptionError
from graphopt.ir import DType
from graphopt.option_names import option, setting
from graphopt.partition.body_types import body_types
from graphopt.partition.target import as_given
from graphopt.partition.target_ort import cpu_kernel_binds

# Ops the quantization passes write. The NPU profiles list QuantizeLinear and DequantizeLinear
# (in AMCT's form, quant_fit.py), and ascend910b MatMulNBits (CANN's weight-only quantized
# GEMM), none of the others: onnxruntime's own (GatherBlockQuantized, DynamicQuantizeMatMul…)
# have no CANN kernel.
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                 "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulNBits",
                 "GatherBlockQuantized",
                 "QLinearConv", "QLinearMatMul", "QLinearAdd", "QGemm"}


def npu_runs_bfloat16(target) -> bool:
    """Whether `target` has an NPU with bfloat16 kernels (ascend910b): a model given in
    bfloat16 is checked against its placement then, not against onnxruntime's CPU provider
    alone, which has few bfloat16 kernels and had refused it at the input check."""
    return target is not None and any(
        device.kind == "npu" and any("bfloat16" in kernel.dtypes
                                     for kernel in device.kernels.values())
        for device in target.devices)


def check_host_bfloat16(partitioning, options, model, log=None) -> None:
    """Refuse a bf16 compile whose host partitions hold bfloat16 ops the host has no kernel for.
    ConvertPrecision converts an op the NPU runs in bfloat16; the partitioner may still return
    it to the host (an island not worth the copies), where onnxruntime cannot load it. A host
    of onnxruntime's kernels is asked for the op's version in `model` and the dtypes of all
    its values, as onnxruntime will look the kernel up."""
    target = partitioning.target
    given = "bf16" not in options.precision  # a model given in bfloat16, on an NPU with it
    if given and not (npu_runs_bfloat16(target) and any(
            _reads_or_writes(n, DType.BFLOAT16) for n in model.graph.all_nodes())):
        return
    functions = {(f.domain, f.name): f for f in model.functions}
    missing: Counter = Counter()
    stranded = []
    for part in partitioning.partitions:
        device = target.device(part.device)
        if device.kind != "cpu":
            continue
        for node in part.nodes:
            # CastLike has no kernel: onnxruntime runs it as the Cast its function body is.
            if node.op_type in ("Cast", "CastLike") and node.is_onnx \
                    or not _reads_or_writes(node, DType.BFLOAT16):
                continue
            function = functions.get((node.domain, node.op_type))
            # onnxruntime inlines a model-local function (an -O3 elementwise group) when it
            # loads the model: its body's ops need the kernels, the call none of its own.
            lacking = None if function is None else _body_lacking(device, node, function)
            if lacking is None:
                lacking = [] if _host_runs(device, node, model) else [node.qualified_op]
            for op in lacking:
                missing[op] += 1
            if lacking:
                stranded.append(node)
    if missing:
        ops = ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in sorted(missing.items()))
        reasons = dict(partitioning.fallbacks())
        dynamic = sum(reasons.get(node, "").startswith("dynamic shape") for node in stranded)
        # Open dims put them there: pins, not a deny list that would convert nothing, help.
        pin = ""
        if dynamic:
            from graphopt.partition.report import dynamic_hint

            # With the pass log, the hint says when -O2's folding would make them static
            # (at -O0/-O1 it said --input-shape could not help, and nothing else).
            pin = (f"; {dynamic} of them for dynamic shapes "
                   f"({dynamic_hint(model, partitioning, log)})")
        what = (f"the model's bfloat16 ops, {setting('target', as_given(target))}" if given
                else f"{setting('precision', options.precision)} "
                     f"{setting('target', as_given(target))}")
        advice = ("give the model those ops in float32 or float16" if given else
                  f"{option('precision_deny')} them, or use fp16")
        raise OptionError(
            f"{what}: {sum(missing.values())} bfloat16 op(s) run on the host CPU, which has no "
            f"bfloat16 kernel for {ops} (the partitioner placed them there: `graphopt "
            f"partition` says why{pin}); {advice}")


def quantized_fallback_note(partitioning, options) -> str:
    """A note when quantization left some of an NPU target's work on the host CPU, with the
    first reason the partitioner gave for a quantized op."""
    if options.quantize == "none":
        return ""
    target = partitioning.target
    if target.device(target.primary).kind == "cpu":
        return ""
    placed = partitioning.placements
    host = [(node, p) for node, p in placed.items() if p.device != target.primary]
    quantized = [(node, p) for node, p in host if node.op_type in QUANTIZED_OPS]
    if not quantized:
        return ""
    ops = sorted({node.qualified_op for node, _ in quantized})
    why = next((p.reason for _, p in quantized if p.reason), "")
    # The quantized ops' own reason first: "43 of 43 nodes on the host, 9 of them quantized
    # ops, e.g.: no npu kernel" read as the reason for all 43, which the cost model had sent.
    others = len(host) - len(quantized)
    rest = (f"; {others} other node(s) run there too, for their own reasons" if others else "")
    return (f"{setting('quantize', options.quantize)} {setting('target', as_given(target))}: "
            f"{len(quantized)} quantized op(s) ({', '.join(ops)}) run on the host CPU, e.g.: "
            f"{why}{rest} (`graphopt partition` lists every reason)")


def _body_lacking(device, node, function) -> list[str] | None:
    """The ops of `function`'s body (called by `node`) that read or write bfloat16 and that the
    host has no kernel for at their dtypes, named as inside the call; None when the body's
    types do not follow from the call's (the call is then judged as one op)."""
    types = body_types(node, function)
    if types is None:
        return None
    versions = {o.domain: o.version for o in function.opset_import}
    lacking = []
    for inner in function.node:
        ins, outs = [types.get(n) for n in inner.input], [types.get(n) for n in inner.output]
        if inner.op_type == "Cast" or "bfloat16" not in ins + outs:
            continue
        domain = "" if inner.domain == "ai.onnx" else inner.domain
        version = versions.get(domain, versions.get("ai.onnx" if not domain else domain))
        binds = None if version is None else cpu_kernel_binds(inner.op_type, domain, version,
                                                              ins, outs)
        if not (device.has_kernel(inner.op_type, domain, "bfloat16") if binds is None
                else binds):
            op = inner.op_type if not domain else f"{domain}::{inner.op_type}"
            lacking.append(f"{op} (inside {node.qualified_op})")
    return lacking


def _host_runs(device, node, model, dtype: str = "bfloat16") -> bool:
    binds = None
    version = model.opset(node.domain)
    if device.kernel_source == "onnxruntime" and version is not None:
        binds = cpu_kernel_binds(node.op_type, node.domain, version,
                                 [_dtype_name(v) for v in node.inputs],
                                 [_dtype_name(v) for v in node.outputs])
    return device.has_kernel(node.op_type, node.domain, dtype) if binds is None else binds


def host_float16_note(partitioning, options, model) -> str | None:
    """The note of a float16 compile for an NPU whose host partitions hold float16 ops that
    onnxruntime's CPU provider has no float16 kernel for: it runs them in float32 behind Casts.
    ConvertPrecision's own note speaks of the nodes the NPU did not take; the partitioner
    returns more to the host later (islands not worth their copies: a whole MobileNet once)."""
    target = partitioning.target
    if "fp16" not in options.precision or target.device(target.primary).kind == "cpu":
        return None
    functions = {(f.domain, f.name) for f in model.functions}
    emulated: Counter = Counter()
    for part in partitioning.partitions:
        device = target.device(part.device)
        if device.kind != "cpu" or device.kernel_source != "onnxruntime":
            continue
        for node in part.nodes:
            if node.op_type == "Cast" or (node.domain, node.op_type) in functions \
                    or not _reads_or_writes(node, DType.FLOAT16):
                continue
            if not _host_runs(device, node, model, "float16"):
                emulated[node.qualified_op] += 1
    if not emulated:
        return None
    ops = ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in sorted(emulated.items()))
    return (f"{setting('precision', options.precision)} {setting('target', as_given(target))}: "
            f"the host partitions compute {ops} in float16, which onnxruntime's CPU provider "
            "runs in float32 behind Casts it adds when loading the model: half the weight "
            "bytes there, not faster")


def _dtype_name(value) -> str | None:
    if value is None or value.dtype is None:
        return None
    return dtype_name(int(value.dtype))


def _reads_or_writes(node, dtype: DType) -> bool:
    return any(v is not None and v.dtype == dtype for v in (*node.inputs, *node.outputs))
