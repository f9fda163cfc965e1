"""ConvertPrecision: float32 ops to float16/bfloat16 by the policy of `--precision`.

    x<f32> ─ Cast ─ Conv<f16> ─ Relu<f16> ─ Cast ─ Softmax<f32> ─ Cast ─ MatMul<f16> ─ Cast ─ y<f32>
                    (weights converted offline)     (mixed: DENY)          (output keeps f32)

Decisions are made in graph order (policy.py has the lists and the FOLLOW rule), then every
converted slot is rewired: a half producer feeding it needs nothing, a weight becomes a half
initializer, anything else gets the value's one shared Cast; float32 readers of a half value
share one Cast back. Each If/Loop/Scan body converts within itself, behind Casts at its
inputs, outputs and captured values (a half value of the outer graph is captured through its
Cast back to float32); the node holding it and ops without a schema keep their dtypes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from graphopt.aipp_ops import exact_preprocessing
from graphopt.ir import DType, Model, Node, Tensor, Value
from graphopt.option_names import option, setting, usage
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.precision.casts import (
    Boundaries,
    collapse_cast_pairs,
    constant_data,
    to_half_array,
)
from graphopt.passes.precision.ort_half_crash import move_batch_swaps_after_half_matmuls
from graphopt.passes.precision.sandwich import drop_sandwiched
from graphopt.passes.precision.policy import (
    ALLOW,
    DENY,
    HALF,
    OP_TYPE_ENTRY,
    PASS_THROUGH,
    PrecisionError,
    Support,
    check_options,
    deny_types,
    half_dtype,
    is_mixed,
    keep_names,
)
from graphopt.passes.precision.schema import (Slots, convertible_slots, float_dtype_attrs,
                                              in_qdq_group, never_converted, schema_lacks)
from graphopt.passes.unmatched import absorbed_ops, op_spellings, unmatched_note

# The first opset whose Cast takes bfloat16.
BFLOAT16_CASTS = 13
# The first opset whose Cast names its type by number (Cast-1 takes a string such as "FLOAT16").
NUMBERED_CASTS = 6


def _unmatched_pins(graph, options, source: frozenset[str] = frozenset(),
                    cut: frozenset[str] = frozenset()) -> str | None:
    """The --keep-dtype names and --precision-allow/-deny op types that match nothing in
    `graph` (a typo, or a node a fusion renamed); None when all do. A denied op type that a
    fused node computes inside matches that node (see _denied)."""
    names = {node.name for node in graph.all_nodes()}
    ops = {spelling for node in graph.all_nodes() for spelling in op_spellings(node)}
    inside = ops | {op for node in graph.all_nodes() for op in absorbed_ops(node)}
    # keep_dtype's OpType:: entries are named as given, by the option they were given to.
    kept_types = {OP_TYPE_ENTRY + op for op in inside}
    return unmatched_note([(option("keep_dtype"), keep_names(options), names),
                           (option("keep_dtype"), options.keep_dtype - keep_names(options),
                            kept_types, "op types"),
                           (option("precision_allow"), options.precision_allow, ops, "op types"),
                           (option("precision_deny"), options.precision_deny, inside,
                            "op types")], source, cut)


def _fused_deny_note(graph, options) -> str | None:
    """Which fused nodes a denied op type keeps in float32 because they compute it inside
    (--keep-dtype OpType::Softmax and an attention FuseAttention fused), None when none."""
    kept: Counter = Counter()
    ops: set[str] = set()
    for node in graph.all_nodes():
        denied = deny_types(options)
        inside = absorbed_ops(node) & denied
        if inside and not op_spellings(node) & denied:
            kept[node.qualified_op] += 1
            ops |= inside
    if not kept:
        return None
    return (f"ConvertPrecision: {_listing(kept)} kept in their dtype: they compute "
            f"{', '.join(sorted(ops))} inside, which the precision options keep")


def _listed(node: Node, op_types) -> bool:
    return not op_spellings(node).isdisjoint(op_types)


def _denied(node: Node, op_types) -> bool:
    """Whether a deny list (--precision-deny, --keep-dtype OpType::X) names `node`'s op type,
    or one it computes inside: attention fused from a Softmax the user keeps in float32 would
    otherwise run it in half, the option met by nothing but a note."""
    return _listed(node, op_types) or not absorbed_ops(node).isdisjoint(op_types)


def _listing(counts: Counter) -> str:
    return ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in sorted(counts.items()))


class _Decider:
    """Whether each node goes to half: user pins first, then the mode's lists, then the target."""

    def __init__(self, options, half: DType, support: Support):
        self.options, self.half, self.support = options, half, support
        self.kept_names, self.denied = keep_names(options), deny_types(options)
        self.mixed = is_mixed(options.precision)
        self.half_values: set[int] = set()
        self.refused: Counter = Counter()       # forced/allowed ops the target cannot run
        self.kept_by_target: Counter = Counter()  # mixed: ALLOW ops the target cannot run
        self.kept_for_stand_in: Counter = Counter()  # NPU ops onnxruntime's CPU would refuse
        self.where = ""  # how the counts name the graph being decided: "" for the main one

    def wants(self, node: Node, slots: Slots) -> bool:
        op, options = node.op_type, self.options
        if node.name in self.kept_names or _denied(node, self.denied) \
                or exact_preprocessing(node):
            return False
        if op == "Cast" and node.is_onnx and _accumulator(node.input(0)):
            return False  # an int32 sum (MatMulInteger's, ConvInteger's) passes 65504
        if op == "Mul" and node.is_onnx and any(map(_cast_accumulator, node.inputs)):
            # The scale that dequantizes that sum: its input in half would be the sum rounded
            # to float16, inf past 65504 (a ddddocr OCR model's ConvInteger reached 1.1e5).
            return False
        if _listed(node, options.precision_allow) or (self.mixed and op in ALLOW):
            return True
        if self.mixed:
            if op in DENY:
                return False
            # FOLLOW: half when every computed float input already is.
            arrived_half = self._arrived_half(node, slots)
            return bool(arrived_half) and all(arrived_half)
        if op == "Cast" and node.is_onnx and self._other_half(node):
            # float16 under bf16 (an --input-fp16-nodes input's Cast, say): converted, it would
            # round the value to bfloat16 on its way to or from a float32 neighbour
            return id(node.inputs[0]) in self.half_values
        if op in PASS_THROUGH:
            # Between float32 ops a half copy would round its value and Cast it back: stay float32
            # unless a computed input arrives half (weights alone convert offline, at no cost).
            arrived_half = self._arrived_half(node, slots)
            return not arrived_half or any(arrived_half)
        return True

    def _other_half(self, node: Node) -> bool:
        """Whether Cast `node` reads or writes a 16-bit float other than the mode's half."""
        ends = (node.input(0), node.outputs[0] if node.outputs else None)
        return any(value is not None and value.dtype in HALF.values()
                   and value.dtype != self.half for value in ends)

    def _arrived_half(self, node: Node, slots: Slots) -> list[bool]:
        """For each computed float input that converts with `node` (weights adapt offline),
        whether it is already half."""
        return [id(node.inputs[i]) in self.half_values for i in slots.inputs
                if constant_data(node.inputs[i]) is None]

    def decide(self, node: Node, slots: Slots) -> bool:
        if not self.wants(node, slots):
            return False
        if self.support.stand_in_refuses(node):
            self.kept_for_stand_in[node.qualified_op] += 1
            return False
        if not self.support.runs(node, self.half, slots):
            if not self.mixed or _listed(node, self.options.precision_allow):
                self.refused[node.qualified_op + self.where] += 1
            else:
                self.kept_by_target[node.qualified_op + self.where] += 1
            return False
        for i in slots.outputs:
            self.half_values.add(id(node.outputs[i]))
        return True


def _nothing_to_convert(decider: _Decider, model) -> str:
    """Why a mode found no node to convert, when no other note says."""
    computed = {v.dtype for node in model.graph.all_nodes() for v in node.outputs
                if v is not None and v.dtype is not None and v.dtype.is_float}
    if computed and computed <= {DType.FLOAT16, DType.BFLOAT16}:
        given = " and ".join(sorted(dtype.name.lower() for dtype in computed))
        return f"no op computes in float32 (the model computes in {given} already)"
    kept = f"{option('keep_dtype')} and {option('precision_deny')} keep"
    if decider.mixed:
        return ("mixed precision starts from Conv, ConvTranspose, MatMul, Gemm, Einsum and the "
                f"attention ops, and from the ops {option('precision_allow')} names; the model "
                f"has none that converts (apart from any {kept} float32)")
    return f"the model has no float32 op that converts (apart from any {kept} float32)"


def _float64_remark(model) -> str:
    """What to add where the model computes in float64, which no precision mode converts (a
    scikit-learn model exported in double)."""
    double = sum(1 for node in model.graph.all_nodes()
                 if any(v is not None and v.dtype == DType.DOUBLE for v in node.outputs))
    return f"; {double} op(s) compute in float64, which no precision mode converts" \
        if double else ""


def _accumulator(value: Value | None) -> bool:
    """An int32 value: what integer GEMMs and convs sum into. (An int64 one is an index, a
    position or a size, which float16 holds: converted, as before.)"""
    return value is not None and value.dtype in (DType.INT32, DType.UINT32)


def _cast_accumulator(value: Value | None) -> bool:
    """A float value an ONNX Cast makes of an int32 sum."""
    producer = value.producer if value is not None else None
    return producer is not None and producer.op_type == "Cast" and producer.is_onnx and \
        _accumulator(producer.input(0))


def _untyped(node: Node) -> bool:
    """A node that reads float32 data and whose outputs carry no dtype."""
    return any(v is not None and v.dtype == DType.FLOAT for v in node.inputs) and \
        any(v is not None and v.dtype is None and v.type_proto is None for v in node.outputs)


@register
class ConvertPrecision(Pass):
    name = "ConvertPrecision"
    description = ("float32 ops to float16/bfloat16 (--precision fp16|bf16|mixed-fp16|"
                   "mixed-bf16); Casts only where float32 and half regions meet")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        options = ctx.options
        check_options(options)
        result = PassResult()
        if options.precision == "keep":
            return result
        half = half_dtype(options.precision)
        opset = model.opset("")
        if opset is not None and opset < NUMBERED_CASTS:
            # The Casts at the conversion's boundaries would be Cast-1's, of a string type
            # (written as numbers, the compile had been refused as a graphopt bug).
            ctx.note(f"{options.precision}: kept float32: the model imports ONNX opset {opset}, "
                     f"whose Cast graphopt does not write (from opset {NUMBERED_CASTS} on it "
                     "does); ONNX's version converter can raise the model's opset first")
            return result
        if half == DType.BFLOAT16 and opset is not None and opset < BFLOAT16_CASTS:
            # Every conversion needs Casts at its boundaries, and raising the opset would
            # change what ops redefined at 13 compute (see opset_raise).
            ctx.note(f"{options.precision}: kept float32: a Cast to or from bfloat16 takes "
                     f"opset {BFLOAT16_CASTS}, and the model imports opset {opset}, below which "
                     "ONNX redefined Squeeze, Unsqueeze, Split, the Reduce ops and Softmax "
                     "(an export at opset 13 or later converts)")
            return result
        # Fusions leave the values they create untyped until the pipeline's last InferShapes;
        # the schema's type parameters are matched against dtypes, so they must be known.
        infer_shapes(model)
        support = Support(ctx.target, model.opset(""))
        unmatched = _unmatched_pins(model.graph, options, ctx.source_names, ctx.cut_names)
        if unmatched:
            ctx.note(f"ConvertPrecision: {unmatched}")
        fused = _fused_deny_note(model.graph, options)
        if fused:
            ctx.note(fused)
        decider = _Decider(options, half, support)
        kept_by_schema: Counter = Counter()  # ops whose schema at this opset has no `half`
        untyped: Counter = Counter()  # float32 ops whose outputs inference left untyped
        kept_int8: Counter = Counter()  # layers of the model's own Q/DQ groups
        sandwiched: Counter = Counter()  # elementwise work between float32 ops
        # The main graph and every If/Loop/Scan body, each converted within itself: a body's
        # inputs, outputs and captured values keep their dtypes, so the node holding it does.
        # The bodies of control flow the NPU cannot run go to the host with it: their ops
        # convert only where the host has the half kernel.
        host = support.host_only()
        hosted = {id(sub): node.qualified_op for node in model.graph
                  if host is not None and node.subgraphs() and support.on_host(node)
                  for top in node.subgraphs() for sub in top.all_graphs()}
        # SequenceMap's body, which onnxruntime expands as a function: an op it would expand
        # from its own function body in half (Relu, Softmax, Elu…) then fails to load.
        expanded = {id(sub) for node in model.graph.all_nodes()
                    if node.op_type == "SequenceMap" and node.is_onnx
                    for top in node.subgraphs() for sub in top.all_graphs()}
        choices = []
        for graph in list(model.graph.all_graphs()):
            graph.sort()
            holder = hosted.get(id(graph))
            decider.support = support if holder is None else host
            decider.where = "" if holder is None else f" (inside {holder}, on the host)"
            if id(graph) in expanded:
                decider.support = decider.support.inside_function_body()
                decider.where = decider.where or " (inside SequenceMap)"
            chosen = _choose(graph, model, decider, kept_by_schema, untyped, kept_int8)
            chosen, dropped = drop_sandwiched(
                chosen, decider.half_values, lambda node: _listed(node, options.precision_allow))
            sandwiched.update(dropped)
            if chosen:
                choices.append((graph, chosen))
        decider.support, decider.where = support, ""
        if kept_by_schema:
            ctx.note(f"{options.precision}: kept float32, their ONNX schema at opset {opset} "
                     f"has no {half.short}: {_listing(kept_by_schema)} (a model exported at a "
                     "later opset may convert them)")
        if sandwiched:
            ctx.note(f"{options.precision}: kept float32, where {half.name.lower()} would only "
                     "round their values and Cast them back (no matrix work, fed by float32 "
                     f"ops alone): {_listing(sandwiched)} ({usage('precision_allow', 'OPS')} "
                     "converts them)")
        if kept_int8:
            whose = (f"the int8 layers of {setting('quantize', 'int8')}" if options.quantize
                     == "int8" else "the model's own int8 layers")
            ctx.note(f"{options.precision}: kept {whose} (between DequantizeLinear and "
                     f"QuantizeLinear nodes, or reading dequantized data and weights: one int8 "
                     f"kernel each): {_listing(kept_int8)}")
        if untyped:
            ctx.note(f"{options.precision}: kept float32, ONNX shape inference gives their "
                     f"outputs no type, so their schema cannot be matched: {_listing(untyped)}")
        self._refuse(options.precision, decider, support)
        # Said whether or not anything converts: what kept them float32 is the target.
        if decider.kept_by_target:
            ctx.note(f"{options.precision}: kept float32, no {half.short} kernel on the target: "
                     f"{_listing(decider.kept_by_target)}")
        if decider.kept_for_stand_in:
            ctx.note(f"{options.precision}: kept float32, onnxruntime's CPU provider (which runs "
                     f"the NPU partitions where no CANN provider is installed) refuses them in "
                     f"{half.short} at run time: {_listing(decider.kept_for_stand_in)}")
        if not choices:
            explained = kept_by_schema or kept_int8 or untyped or decider.kept_by_target \
                or decider.kept_for_stand_in or sandwiched
            if not explained:  # a compile that converted nothing says why
                why = _nothing_to_convert(decider, model)
                ctx.note(f"ConvertPrecision converted nothing: {why}"
                         + _float64_remark(model))
            return result
        constants: dict[object, Value] = {}  # one half copy of a weight, whichever graph reads it
        boundaries = [Boundaries(graph, half, constants) for graph, _ in choices]
        removed = moved = 0
        for (graph, chosen), graph_boundaries in zip(choices, boundaries):
            _convert_graph(graph, chosen, half, graph_boundaries, decider.half_values, model)
            removed += collapse_cast_pairs(graph)
            if half == DType.FLOAT16:
                # onnxruntime's CPU provider runs these MatMuls (on an NPU target, where they
                # go back to the host or the provider stands in), and crashes on one form
                moved += move_batch_swaps_after_half_matmuls(graph)
        for graph in model.graph.all_graphs():
            for value in list(graph.initializers.values()):
                if not value.uses and not value.is_graph_output and not value.is_input:
                    graph.remove_initializer(value)
        if any(b.casts_inserted for b in boundaries) and model.opset("") is None:
            # A model of contrib ops alone imports no default domain, which its Casts need
            # (opset 13: the first with bfloat16 Casts).
            model.opset_imports[""] = 13
        if half == DType.FLOAT16:
            result.count("transposes_moved", moved)
        chosen_count = sum(len(chosen) for _, chosen in choices)
        inserted = sum(b.casts_inserted for b in boundaries)
        converted = sum(b.constants_converted for b in boundaries)
        clipped = [entry for b in boundaries for entry in b.constants_clipped]
        flushed = [entry for b in boundaries for entry in b.weights_flushed]
        result.count("nodes_converted", chosen_count)
        result.count("casts_inserted", inserted)
        result.count("casts_removed", removed)
        result.count("weights_converted", converted)
        if clipped:
            names = ", ".join(name for name, _ in clipped[:3]) \
                + (", …" if len(clipped) > 3 else "")
            ctx.note(f"ConvertPrecision: {sum(n for _, n in clipped)} constant element(s) beyond "
                     f"the {half.short} range clipped to its largest finite value (in {names})")
        if flushed:
            ctx.note(_flushed_note(flushed, half))
        # For an NPU, the partitioner's note names them once it knows what the host runs.
        npu = ctx.target is not None and ctx.target.device(ctx.target.primary).kind == "npu"
        if support.emulated and not npu:
            ctx.note(f"{options.precision}: onnxruntime's CPU provider has no float16 kernel for "
                     f"{', '.join(sorted(support.emulated))}; it runs them in float32 behind "
                     "Casts it adds when loading the model: half the weight bytes, not faster, "
                     "and slower where a mixed mode's float32 ops add Casts of their own "
                     "(1.2-1.7× the float32 run on PaddleOCR's models under mixed-fp16)")
        if half == DType.BFLOAT16 and ctx.target is not None \
                and any(device.kind == "npu" for device in ctx.target.devices):
            ctx.note(f"{options.precision}: the NPU partitions run where the CANN provider is "
                     "installed; onnxruntime's CPU provider, which stands in for it elsewhere, "
                     "has no bfloat16 kernel for most ops")
        return result

    @staticmethod
    def _refuse(mode: str, decider: _Decider, support: Support) -> None:
        target = support.target.shown
        dtype = "float16" if "fp16" in mode else "bfloat16"
        if decider.refused:
            raise PrecisionError(
                f"{setting('precision', mode)}: target {target} has no {dtype} kernel for "
                f"{_listing(decider.refused)}; keep them float32 with "
                f"{usage('precision_deny', 'OPS')} or {usage('keep_dtype', 'NODES')}")
        if decider.kept_by_target and not decider.half_values:
            raise PrecisionError(
                f"{setting('precision', mode)}: target {target} runs none of the ops mixed "
                f"precision converts in {dtype} ({_listing(decider.kept_by_target)}); nothing "
                f"would change" + (_bfloat16_hint(support) if dtype == "bfloat16" else ""))


def _bfloat16_hint(support: Support) -> str:
    """Where bfloat16 would run: a target whose device has bfloat16 kernels (ascend910b) runs
    these ops on its host, which has none; another target has none at all."""
    device = support.devices[0]
    if device.kind != "cpu" and any("bfloat16" in kernel.dtypes
                                    for kernel in device.kernels.values()):
        return (" (here they run on the host, which has no bfloat16 kernels; mixed-fp16 "
                "converts them, and `graphopt partition` shows where each op runs)")
    return (" (mixed-fp16 converts them for this target; bfloat16 needs a target with its "
            f"kernels, such as {setting('target', 'ascend910b')})")


def _flushed_note(flushed: list[tuple[str, int, int]], half: DType) -> str:
    """Names the weights whose values fell below the half range, worst first."""
    flushed = sorted(flushed, key=lambda entry: entry[1] / entry[2], reverse=True)
    shown = ", ".join(f"'{name}' ({'all' if lost == nonzero else f'{lost} of {nonzero}'})"
                      for name, lost, nonzero in flushed[:3])
    more = f" and {len(flushed) - 3} more" if len(flushed) > 3 else ""
    return (f"ConvertPrecision: {len(flushed)} weight(s) lost over 1% of their nonzero values "
            f"below the {half.short} range, now 0: {shown}{more}; keep their readers float32 "
            f"with {usage('keep_dtype', 'NODES')} or {usage('precision_deny', 'OPS')}")


def _choose(graph, model: Model, decider: _Decider, kept_by_schema: Counter,
            untyped: Counter, kept_int8: Counter) -> list[tuple[Node, Slots]]:
    """The nodes of `graph` (not of its nested graphs) that go to half, with their slots. A
    node holding a nested graph keeps its dtypes; one producing a value a nested graph reads
    converts, and the nested graph reads a Cast of it back to float32 (it had been kept
    float32 without a note: a MatMul whose output only an If's branches read)."""
    opset = model.opset("")
    chosen: list[tuple[Node, Slots]] = []
    for node in graph:
        if node.op_type == "Constant" and node.is_onnx:
            continue  # its data is converted offline where a half op reads it
        if node.subgraphs():
            continue
        if in_qdq_group(node):  # int8 layers, the model's own or QuantizeInt8's, stay int8
            kept_int8[node.qualified_op] += 1
            continue
        node_opset = model.opset(node.domain) if not node.is_onnx else opset
        slots = convertible_slots(node, decider.half, node_opset)
        if slots is None and _untyped(node):
            untyped[node.qualified_op] += 1
        if slots is not None and decider.decide(node, slots):
            chosen.append((node, slots))
        elif slots is None and (not decider.mixed or node.op_type in ALLOW
                                or _listed(node, decider.options.precision_allow)) \
                and not never_converted(node) and schema_lacks(node, decider.half, node_opset):
            kept_by_schema[node.qualified_op] += 1
    return chosen


def _convert_graph(graph, chosen: list[tuple[Node, Slots]], half: DType,
                   boundaries: Boundaries, half_values: set[int], model: Model) -> None:
    """Convert the `chosen` nodes of `graph`, then give float32 readers of the values that
    became half (graph outputs, unconverted nodes, unconverted slots) a Cast back."""
    opset = model.opset("")
    for node, slots in chosen:
        node_opset = model.opset(node.domain) if not node.is_onnx else opset
        _convert(node, slots, half, boundaries, half_values, node_opset)
    converted_in = {(id(n), i) for n, s in chosen for i in s.inputs}
    for node, slots in chosen:
        for i in slots.outputs:
            value = node.outputs[i]
            for use in list(value.uses):
                if (id(use.node), use.index) not in converted_in:
                    use.node.set_input(use.index, boundaries.cast(value, DType.FLOAT))
            if value.is_graph_output:
                boundaries.cast(value, DType.FLOAT)


def _convert(node: Node, slots: Slots, half: DType, boundaries: Boundaries,
             half_values: set[int], opset: int | None) -> None:
    """Give `node`'s converted inputs half values and its converted outputs the half dtype."""
    for i in slots.inputs:
        value = node.inputs[i]
        if id(value) in half_values:
            continue
        data = constant_data(value)
        if data is not None:
            # A Cast to half is the model's own conversion, whose overflow is inf, not 65504
            own_cast = node.op_type == "Cast" and node.is_onnx and node.attr("to") == int(half)
            node.set_input(i, boundaries.half_constant(value, data, clip=not own_cast))
        else:
            node.set_input(i, boundaries.cast(value, half))
    for i in slots.outputs:
        node.outputs[i].dtype = half
    if slots.outputs:
        for name in float_dtype_attrs(node, opset):
            node.set_attr(name, int(half))
        if node.op_type == "ConstantOfShape":  # its `value` says the dtype; absent, float32 0
            value = node.attr("value")
            data = value.numpy() if value is not None else np.zeros(1, np.float32)
            array, _ = to_half_array(data, half)
            node.set_attr("value", Tensor(array))
