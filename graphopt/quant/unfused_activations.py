"""FusedConv with an activation QLinearConv cannot take, split for INT8 and joined again after.

-O3's FuseActivation runs before QuantizeInt8 and wraps Conv + HardSwish (Sigmoid,
HardSigmoid, LeakyRelu, Clip, Tanh) into com.microsoft FusedConv. onnxruntime's QLinearConv
folds only a Relu into its output range, so those FusedConvs stayed float: timm's LCNet at -O3
quantized 2 of its 32 convs against 31 at -O2. Split back into Conv and its activation before
the plan, each conv quantizes as at -O2, its activation running on the dequantized output; a
conv left float (the first and last layers, quant_skip) is joined again afterwards.
FuseActivation's FusedGemm (a Gemm or a matrix MatMul with any activation) is no layer the plan
takes in either form, so it is split the same way: into the MatMul it came from (two inputs and
no Gemm attribute) or a Gemm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphopt.ir import Graph, Node

MS = "com.microsoft"


@dataclass
class Split:
    conv: Node          # the FusedConv (FusedGemm), now a Conv (Gemm, MatMul) writing a fresh value
    activation: Node    # the activation node, writing the FusedConv's old output
    attrs: dict         # the FusedConv's attributes, to join them again
    fused: str = "FusedConv"


def split_activations(graph: Graph, opset: int, convs: bool = True) -> list[Split]:
    """Split every FusedConv of `graph` whose activation is not Relu into Conv → activation
    (a Clip only from `opset` 11, where its bounds are inputs), when `convs`, and every
    FusedGemm into its Gemm or MatMul → activation.
    The Conv takes the FusedConv's name (quant_skip names it so); the FusedConv node becomes
    the activation, so its output keeps its name and readers."""
    splits = [split for node in list(graph.nodes()) if node.domain == MS
              and node.op_type == "FusedGemm" and (split := _split_gemm(graph, node))]
    for node in list(graph.nodes()) if convs else ():
        activation = node.attr("activation")
        params = list(node.attr("activation_params") or [])
        if node.domain != MS or node.op_type != "FusedConv" or activation in (None, "Relu") \
                or _PARAM_COUNTS.get(activation) != len(params) \
                or (activation == "Clip" and opset < 11) or node.input(3) is not None:
            continue  # a fourth input Z (a residual sum onnxruntime adds) is no Conv's
        attrs, out = dict(node.attrs), node.output
        conv = graph.make_node(
            "Conv", node.inputs, {k: v for k, v in attrs.items()
                                  if not k.startswith("activation")},
            name=node.name, before=node, dtype=out.dtype, shape=out.shape)
        inputs, act_attrs = [conv.output], {}
        if activation == "Clip":
            inputs += [graph.make_initializer(f"{out.name}_{bound}",
                                              np.asarray(v, out.dtype.numpy))
                       for bound, v in zip(("min", "max"), params)]
        elif params:
            act_attrs = dict(zip(("alpha", "beta"), params))
        node.op_type, node.domain, node.attrs = activation, "", {}
        for key, value in act_attrs.items():
            node.set_attr(key, float(value))
        node.name = graph.fresh_node_name(f"{conv.name or 'conv'}_{activation}")
        node.set_inputs(inputs)
        splits.append(Split(conv, node, attrs))
    return splits


def join_float_activations(graph: Graph, splits: list[Split], quantized: set[int]) -> None:
    """Join again each split whose Conv stayed float (not in `quantized`, ids of nodes, and its
    output read by its activation alone)."""
    for split in splits:
        conv, act = split.conv, split.activation
        pre = conv.output
        if id(conv) in quantized or conv.graph is not graph or act.graph is not graph \
                or pre.is_graph_output or [use.node for use in pre.uses] != [act]:
            continue
        act.op_type, act.domain, act.attrs = split.fused, MS, dict(split.attrs)
        act.name = conv.name
        act.set_inputs(list(conv.inputs))
        graph.remove(conv)


def _split_gemm(graph: Graph, node: Node) -> Split | None:
    """`node`, a FusedGemm, split into Gemm (or MatMul) → activation, as split_activations
    splits a FusedConv; None for an activation it does not know."""
    attrs, out = dict(node.attrs), node.output
    activation = node.attr("activation")
    names = _GEMM_PARAMS.get(activation)
    if names is None or any(node.attr(f"activation_{n}") is None for n in names):
        return None
    params = [float(node.attr(f"activation_{n}")) for n in names]
    layer = {k: v for k, v in attrs.items() if not k.startswith("activation")}
    op = "MatMul" if len(node.inputs) == 2 and not layer else "Gemm"
    gemm = graph.make_node(op, node.inputs, layer, name=node.name, before=node,
                           dtype=out.dtype, shape=out.shape)
    node.op_type, node.domain, node.attrs = activation, "", {}
    for name, value in zip(names, params):
        node.set_attr(name, value)
    node.name = graph.fresh_node_name(f"{gemm.name or 'gemm'}_{activation}")
    node.set_inputs([gemm.output])
    return Split(gemm, node, attrs, "FusedGemm")


# FusedGemm's activations (FuseActivation), with the parameters it takes as activation_* attributes.
_GEMM_PARAMS = {"Relu": (), "Sigmoid": (), "Tanh": (), "LeakyRelu": ("alpha",),
                "HardSigmoid": ("alpha", "beta")}
# The activations this module writes as ONNX ops, with the parameters FusedConv lists for them.
_PARAM_COUNTS = {"Clip": 2, "LeakyRelu": 1, "HardSigmoid": 2, "HardSwish": 0, "Sigmoid": 0,
                 "Tanh": 0}
