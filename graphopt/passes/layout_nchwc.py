r"""LayoutNchwc: the conv net rewritten ahead of time into onnxruntime's blocked NCHWc layout
(com.microsoft.nchwc ops), which onnxruntime's CPU provider otherwise builds at every session
start at ORT_ENABLE_ALL (its NchwcTransformer).

A blocked tensor [N, C'/B, H, W, B] (stored as [N, C', H, W], C' = C rounded up to the block B)
flows from conv to conv; ReorderInput enters the layout, ReorderOutput(channels=C) leaves it
wherever a blocked value meets an op that reads NCHW or is a graph output:

    x ─ Conv(3→64) ─ Relu ─ MaxPool ─ Conv ─ BN ─ Add ─ Relu ─ GlobalAveragePool ─ Flatten ─ Gemm
                                              └───────┘
    x ─ nchwc.Conv(act=Relu) ─ nchwc.MaxPool ─ nchwc.Conv(Sum=…, act=Relu) ─ …
        ─ nchwc.GlobalAveragePool ─ ReorderOutput(channels=2048) ─ Flatten ─ Gemm

layout_nchwc_ops says which ops convert (onnxruntime 1.32's rules, found by running its
transformer), layout_nchwc_weights how filters are blocked. The layout is a dataflow fact, not a
local pattern: whether an op can read a blocked tensor depends on every producer before it, and a
value needs a ReorderOutput only once all of its readers are known. So the pass is one forward
walk in graph order (as onnxruntime's transformer is), not a set of rewrite rules: each handler
either leaves its node reading NCHW or replaces it, and the replaced nodes go at the end, their
outputs handed to ReorderOutputs where something still reads them.

Only the main graph is rewritten. The block size is the CPU's (see layout_nchwc_weights); the
output runs only where MLAS picks the same one, so the pass records it in the model's metadata
(graphopt.nchwc_block_size) and refuses to re-block a model blocked by another size.
"""

from __future__ import annotations

import math
from collections import Counter

from graphopt.errors import OptionError
from graphopt.ir import DType, Model, Node, Value
from graphopt.nchwc_block import BLOCK_SIZES, METADATA_KEY, detect_block_size
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.layout_nchwc_ops import HANDLERS, NCHWC, STARTERS, Blocked
from graphopt.passes.layout_nchwc_upconv import conv_transpose
from graphopt.passes.layout_nchwc_weights import padded


ALL_HANDLERS = {**HANDLERS, ("", "ConvTranspose"): conv_transpose}


def _with_channels(shape, channels: int):
    return None if shape is None or len(shape) != 4 else (shape[0], channels, *shape[2:])


class Rewriter:
    """One forward walk over the main graph in order, then the ReorderOutputs and cleanup."""

    def __init__(self, model: Model, block: int, result: PassResult, allows=None):
        self.model, self.graph, self.block, self.result = model, model.graph, block, result
        self.allows = allows or (lambda node: True)  # a node held back stays NCHW
        self.blocked: dict[int, Blocked] = {}      # id(NCHW value) → its blocked form
        self.originals: list[Value] = []           # the keys above, in order
        self.reordered: dict[int, Value] = {}      # id(NCHW value) → its ReorderInput
        self.constants: dict[tuple, Value] = {}    # (id(weight), layout) → blocked initializer
        self.replaced: list[Node] = []
        self.left: Counter = Counter()             # why a Conv or pool stayed NCHW

    def run(self) -> None:
        for node in self.graph.nodes():
            if node.graph is not self.graph:
                continue
            handler = ALL_HANDLERS.get(("" if node.is_onnx else node.domain, node.op_type))
            if handler is not None and node.outputs and node.outputs[0] is not None \
                    and (handler in STARTERS or self._reads_blocked(node)) and self.allows(node):
                handler(self, node)
        if self.replaced:
            self.finish()

    def _reads_blocked(self, node: Node) -> bool:
        return any(v is not None and id(v) in self.blocked for v in node.inputs)

    # -- building blocks -----------------------------------------------------------------------
    def add(self, node: Node, op: str, inputs, attrs: dict, channels: int, *,
            domain: str = NCHWC, zero_pads: bool = False) -> Node:
        """A node computing `node`'s output in blocked form, inserted before it; `zero_pads`:
        it leaves 0 in the padded channels."""
        out = node.outputs[0]
        value = Value(self.graph.fresh_name(f"{out.name}_nchwc"), DType.FLOAT,
                      _with_channels(out.shape, padded(channels, self.block)))
        new = Node(op, inputs, attrs, domain=domain, outputs=[value],
                   name=self.graph.fresh_node_name(f"{node.name or out.name}/nchwc"))
        self.graph.insert_before(node, new)
        self.adopt(node, value, channels, new, zero_pads)
        return new

    def adopt(self, node: Node, value: Value, channels: int, producer: Node,
              zero_pads: bool = False) -> None:
        """`value` (made by `producer`) now stands for `node`'s output; `node` goes at the end."""
        out = node.outputs[0]
        self.blocked[id(out)] = Blocked(value, channels, producer,
                                        len(out.uses) == 1 and not out.is_graph_output,
                                        zero_pads)
        self.originals.append(out)
        self.replaced.append(node)

    def blocked_input(self, node: Node, x: Value, channels: int) -> Value:
        if id(x) in self.blocked:
            return self.blocked[id(x)].value
        if id(x) not in self.reordered:
            value = Value(self.graph.fresh_name(f"{x.name}_nchwc"), DType.FLOAT,
                          _with_channels(x.shape, padded(channels, self.block)))
            # An NHWC tensor transposed to NCHW is reordered from NHWC itself, as onnxruntime
            # does: ConvNeXt's LayerNorm2d left a Transpose before each conv.
            flip = x.producer
            source, attrs = (flip.inputs[0], {"channels_last": 1}) \
                if flip is not None and flip.op_type == "Transpose" and flip.is_onnx \
                and list(flip.attr("perm") or ()) == [0, 3, 1, 2] else (x, {})
            self.graph.insert_before(node, Node(
                "ReorderInput", [source], attrs, domain=NCHWC, outputs=[value],
                name=self.graph.fresh_node_name(f"{x.name}/ReorderInput")))
            self.reordered[id(x)] = value
            self.result.count("ReorderInput")
        return self.reordered[id(x)]

    def constant(self, source: Value, layout: str, make) -> Value:
        key = (id(source), layout)
        if key not in self.constants:
            self.constants[key] = self.graph.make_initializer(f"{source.name}_{layout}", make())
        return self.constants[key]

    def channels_of(self, x: Value) -> int | None:
        if id(x) in self.blocked:
            return self.blocked[id(x)].channels
        shape = x.shape
        return shape[1] if shape is not None and len(shape) == 4 and isinstance(shape[1], int) \
            else None

    # -- the end -------------------------------------------------------------------------------
    def finish(self) -> None:
        """Drop the replaced nodes; give every NCHW value still read (or a graph output) a
        ReorderOutput from its blocked form; order the graph; drop weights no longer read."""
        inputs = {id(v) for node in self.replaced for v in node.inputs if v is not None}
        for node in self.replaced:
            self.graph.remove(node, safe=False)
        for out in self.originals:
            if not out.uses and not out.is_graph_output:
                continue
            source = self.blocked[id(out)]
            quantizers = _quantized_for_int8_convs(out)
            if quantizers:
                self.quantize_channels_last(source, out, quantizers)
                continue
            out.producer = None  # handed over from the removed node
            self.graph.insert_after(source.value.producer, Node(
                "ReorderOutput", [source.value], {"channels": source.channels}, domain=NCHWC,
                outputs=[out], name=self.graph.fresh_node_name(f"{out.name}/ReorderOutput")))
            self.result.count("ReorderOutput")
        self.graph.sort()
        for value in list(self.graph.initializers.values()):
            if id(value) in inputs and not value.uses and not value.is_input \
                    and not value.is_graph_output:
                self.graph.remove_initializer(value)
        self.model.opset_imports.setdefault(NCHWC, 1)
        self.model.metadata_props[METADATA_KEY] = str(self.block)


    def quantize_channels_last(self, source: Blocked, out: Value, quantizers: list[Node]) -> None:
        """`out`, read only by QuantizeLinears whose codes int8 convs read, leaves the layout
        channels-last: ReorderOutput(channels_last=1) → QuantizeLinear → Transpose to NCHW.

        onnxruntime runs an int8 conv in NHWC, with a Transpose before and after it that its
        transpose optimizer then cancels between neighbours. It cannot push one through a
        blocked conv, so behind a float layer in NCHWc (the first layer, kept float) the pair
        around every int8 conv, Add and pool of the trunk stayed: 34 Transposes in MediaPipe's
        BlazeFace, and MaxPools on uint8 in NCHW, 1.5-1.7× the time of its float model. Here
        the codes start in NHWC, and the Transpose after them is what the optimizer carries
        down to the first int8 conv and cancels."""
        nhwc = Value(self.graph.fresh_name(f"{out.name}_nhwc"), out.dtype, _nhwc(out.shape))
        self.graph.insert_after(source.value.producer, Node(
            "ReorderOutput", [source.value], {"channels": source.channels, "channels_last": 1},
            domain=NCHWC, outputs=[nhwc], name=self.graph.fresh_node_name(
                f"{out.name}/ReorderOutput")))
        for q in quantizers:
            codes = q.outputs[0]
            codes_nhwc = Value(self.graph.fresh_name(f"{codes.name}_nhwc"), codes.dtype,
                               _nhwc(codes.shape))
            requantize = Node("QuantizeLinear", [nhwc, *q.inputs[1:]], dict(q.attrs),
                              outputs=[codes_nhwc], name=q.name)
            self.graph.insert_after(q, requantize)
            self.graph.remove(q, safe=False)
            codes.producer = None  # handed over to the Transpose
            self.graph.insert_after(requantize, Node(
                "Transpose", [codes_nhwc], {"perm": [0, 3, 1, 2]}, outputs=[codes],
                name=self.graph.fresh_node_name(f"{codes.name}/to_nchw")))
        self.result.count("ReorderOutput to NHWC before QuantizeLinear")


def _nhwc(shape):
    return None if shape is None or len(shape) != 4 else (shape[0], *shape[2:], shape[1])


def _quantized_for_int8_convs(value: Value) -> list[Node] | None:
    """The QuantizeLinear nodes reading `value` when they are its only readers, each quantizes
    per tensor (one scale: the layout of the codes does not matter to it), and the codes of
    one reach an int8 conv (a Conv reading them through a DequantizeLinear); else None."""
    if value.is_graph_output or not value.uses:
        return None
    quantizers = list({id(use.node): use.node for use in value.uses}.values())
    for q in quantizers:
        scale = q.input(1)
        if q.op_type != "QuantizeLinear" or q.inputs[0] is not value or not q.is_onnx \
                or scale is None or scale.shape is None or math.prod(scale.shape) != 1 \
                or len(scale.shape) > 1 or q.attr("block_size", 0) \
                or len(q.outputs) != 1 or q.outputs[0].is_graph_output:
            return None
    dequantized = [use.node.outputs[0] for q in quantizers for use in q.outputs[0].uses
                   if use.node.op_type == "DequantizeLinear"]
    if not any(use.node.op_type == "Conv" and use.node.inputs[0] is v
               for v in dequantized for use in v.uses):
        return None
    return quantizers


def block_size(ctx: PassContext) -> int:
    """The block the options ask for (`nchwc_block_size`, 0 = this CPU's), or 0 for none."""
    asked = getattr(ctx.options, "nchwc_block_size", 0) or 0
    if asked and asked not in BLOCK_SIZES:
        raise OptionError(f"nchwc_block_size {asked}: MLAS blocks by 8 (AVX2) or 16 (AVX-512F); "
                          "0 detects this CPU's")
    return asked or detect_block_size()


def _in_qdq_unit(node: Node) -> bool:
    """Whether `node` is an int8 op in QDQ form (QuantizeInt8's output): it reads its weights
    through a DequantizeLinear, or reads a DequantizeLinear and feeds a QuantizeLinear.
    onnxruntime fuses those into QLinearConv & co. only while they stay plain NCHW ops between
    their Q/DQ nodes; a float op that merely feeds a QuantizeLinear is blocked as usual."""
    def dequantized(v):
        return v is not None and v.producer is not None \
            and v.producer.op_type == "DequantizeLinear"

    if node.op_type in ("Conv", "FusedConv") and dequantized(node.input(1)):
        return True
    return any(dequantized(v) for v in node.inputs) and any(
        use.node.op_type == "QuantizeLinear" for v in node.outputs if v is not None
        for use in v.uses)


@register
class LayoutNchwc(Pass):
    name = "LayoutNchwc"
    description = ("rewrite conv nets into onnxruntime's blocked NCHWc layout (com.microsoft.nchwc "
                   "ops, reordered weights) for this CPU's block size (cpu target)")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        block = block_size(ctx)
        if not block:
            ctx.note("LayoutNchwc: neither AVX-512F nor AVX2 in /proc/cpuinfo, the CPUs it "
                     "targets (MLAS blocks of 16 and 8); the layout stays NCHW "
                     "(nchwc_block_size=8 or 16 forces one)")
            return result
        done = model.metadata_props.get(METADATA_KEY)
        if done and done != str(block):
            ctx.note(f"LayoutNchwc: the model is already blocked by {done}, not {block}; "
                     "left as it is")
            return result
        computed = [n for n in model.graph if n.op_type in ("Conv", "FusedConv")
                    and len(n.inputs) > 1 and n.inputs[1] is not None and not n.inputs[1].is_constant
                    and not _in_qdq_unit(n)]
        if computed:
            # Blocking only the rest would put reorders around these, which onnxruntime blocks
            # anyway once it has folded their weights: it then does better alone.
            ctx.note(f"LayoutNchwc: {len(computed)} conv(s) read weights computed at run time "
                     f"(e.g. the one making %{computed[0].outputs[0].name}); the layout is left "
                     "to onnxruntime's layout level")
            return result
        if any(v is not None and v.dtype is None for n in model.graph for v in n.outputs):
            # Values the fusions' rewrites made untyped (LowerLRN's x², say): a Reorder takes
            # its input's type, and the memory plan needs every value's.
            infer_shapes(model)
        rewriter = Rewriter(model, block, result, lambda node: ctx.allows(self.name, node)
                            and not _in_qdq_unit(node))
        rewriter.run()
        if rewriter.left:
            ctx.note("LayoutNchwc left NCHW: " + "; ".join(
                f"{n} × {why}" for why, n in rewriter.left.most_common()))
        return result


__all__ = ["NCHWC", "LayoutNchwc", "block_size"]
