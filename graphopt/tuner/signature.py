"""Kernel signatures: the key one tuning of a cube kernel is stored and shared under.

    ascend310/gemm/b1_m256_k256_n256/float16
    ascend310/conv/b1_m3136_k576_n64_i56x56_o56x56_f3x3_s1x1_d1x1/float16
    <target>/<op class>/b<batch>_m<M>_k<K>_n<N>[_<conv geometry>]/<cube dtype>

The op class is "gemm" for MatMul/Gemm (and fused forms), "conv" for Conv and ConvTranspose (an
implicit GEMM, tiling.py), whose signature adds its ConvGeometry: input, output and kernel
sizes, strides and dilations per spatial dim (`_t` for a ConvTranspose), which price its input
band. The dtype is the one the cube computes in (float32 runs in float16, uint8 as int8):
kernels the cost model cannot tell apart share one signature, hence one tuning.

A conv signature without the geometry is one graphopt wrote before the cost model priced a
conv's input as bands (2026-12-07): it still parses (a GEMM-only shape, `kb list` shows it),
but no compile looks it up, since one such key stood for convs now priced apart
(kb.tuned_tilings names the nodes it would have matched).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.tuner.tiling import (ANCHORS_OF_GROUPS, CONV_OPS, ConvGeometry, GemmShape,
                                   cube_dtype, gemm_shape, group_anchor_shape)

from graphopt.passes.base import anchor_key
from graphopt.partition.placement import data_dtype

if TYPE_CHECKING:
    from graphopt.ir import Model, Node
    from graphopt.partition.partitioner import Partitioning

_DIMS = r"\d+(?:x\d+)*"
_PATTERN = re.compile(r"^(?P<target>[^/]+)/(?P<op>gemm|conv)/"
                      r"b(?P<b>\d+)_m(?P<m>\d+)_k(?P<k>\d+)_n(?P<n>\d+)"
                      rf"(?:_i(?P<i>{_DIMS})_o(?P<o>{_DIMS})_f(?P<f>{_DIMS})_s(?P<s>{_DIMS})"
                      rf"_d(?P<d>{_DIMS})(?P<t>_t)?)?"
                      r"/(?P<dtype>[A-Za-z0-9_]+)$")
_FORM = ("<target>/<gemm|conv>/b<B>_m<M>_k<K>_n<N>[_i<in>_o<out>_f<kernel>_s<strides>_d<dilations>"
         "[_t]]/<dtype>, sizes per spatial dim joined by x")


def signature(target: str, op_class: str, shape: GemmShape) -> str:
    """ValueError for a conv shape without its ConvGeometry: no compile would look it up."""
    if op_class not in ("gemm", "conv"):
        raise ValueError(f"op class '{op_class}' is not 'gemm' or 'conv'")
    if op_class == "conv" and shape.conv is None:
        raise ValueError(f"a conv's signature names its geometry, which {shape} lacks "
                         "(gemm_shape of a Conv node gives it)")
    return _signature(target, op_class, shape)


def _signature(target: str, op_class: str, shape: GemmShape) -> str:
    return (f"{target}/{op_class}/b{shape.batch}_m{shape.m}_k{shape.k}_n{shape.n}"
            f"{_geometry_text(shape.conv) if op_class == 'conv' else ''}/"
            f"{cube_dtype(shape.dtype)}")


def _geometry_text(geometry: ConvGeometry | None) -> str:
    if geometry is None:  # an earlier graphopt's conv key (legacy_signature)
        return ""
    return "".join(f"_{tag}{'x'.join(map(str, dims))}" for tag, dims in (
        ("i", geometry.inputs), ("o", geometry.outputs), ("f", geometry.kernel),
        ("s", geometry.strides), ("d", geometry.dilations))) + ("_t" if geometry.transposed
                                                                else "")


def legacy_signature(sig: str) -> str | None:
    """The key graphopt wrote for a conv signature's kernel before signatures carried the
    conv geometry (2026-12-07), None for a signature without geometry."""
    target, op_class, shape = parse_signature(sig)
    if shape.conv is None:
        return None
    return _signature(target, op_class, dataclasses.replace(shape, conv=None))


def parse_signature(text: str) -> tuple[str, str, GemmShape]:
    """(target, op class, shape) of a signature; ValueError naming it when it is not one."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"'{text}' is not a kernel signature ({_FORM})")
    g = match.groupdict()
    geometry = None
    if g["i"] is not None:
        geometry = ConvGeometry(*(tuple(int(d) for d in g[key].split("x"))
                                  for key in ("i", "o", "f", "s", "d")), bool(g["t"]))
        why = _wrong_geometry(g["op"], geometry, int(g["m"]), int(g["k"]))
        if why:
            raise ValueError(f"'{text}' is not a kernel signature: {why}")
    shape = GemmShape(int(g["b"]), int(g["m"]), int(g["k"]), int(g["n"]), g["dtype"], geometry)
    return g["target"], g["op"], shape


def _wrong_geometry(op_class: str, geometry: ConvGeometry, m: int, k: int) -> str | None:
    """What makes a signature's conv geometry impossible for its GEMM, None when nothing."""
    if op_class != "conv":
        return "only a conv has a geometry"
    dims = (geometry.inputs, geometry.outputs, geometry.kernel, geometry.strides,
            geometry.dilations)
    if len({len(d) for d in dims}) != 1:
        return "its sizes, strides and dilations name different numbers of spatial dims"
    if min(geometry.kernel + geometry.strides + geometry.dilations) < 1:
        return "a kernel size, stride or dilation below 1"
    pixels = math.prod(geometry.outputs)
    if pixels and m % pixels or not pixels and m:
        return f"M {m} is not a whole number of {'x'.join(map(str, geometry.outputs))} outputs"
    if k % geometry.taps:
        return f"K {k} is not a whole number of {'x'.join(map(str, geometry.kernel))} kernels"
    return None


def is_signature(text: str, target: str | None = None) -> bool:
    match = _PATTERN.match(text)
    return match is not None and (target is None or match["target"] == target)


# The name a subgraph study gets by default (subgraph_job.study_name_for).
_SUBGRAPH_NAME = re.compile(r"^subgraph/.+/[0-9a-f]{16}/O\d+/(estimate|measured)(\+\w+)?$")


def is_subgraph_study_name(text: str) -> bool:
    """Whether `text` is the default name of a subgraph study (`tune --job subgraph`)."""
    return _SUBGRAPH_NAME.match(text) is not None


def node_signature(node: Node, target: str) -> str | None:
    """The signature of a cube node, None when it is not one or its shapes are not static."""
    try:
        shape = gemm_shape(node)
    except ValueError:
        return None
    return signature(target, "conv" if node.op_type in CONV_OPS else "gemm", shape)


@dataclass
class KernelGroup:
    """The NPU cube nodes that share one signature, hence one tuning."""

    signature: str
    shape: GemmShape
    device: str                      # the target's device name the nodes run on
    nodes: list[str] = field(default_factory=list)


def model_kernels(model: Model, partitioning: Partitioning) -> list[KernelGroup]:
    """The distinct cube-kernel signatures of the NPU partitions of a compiled model, in graph
    order of their first node. A kernel with a zero-size dim is left out: it has no work, so
    no tiling to tune (idle_kernels names them)."""
    groups: dict[str, KernelGroup] = {}
    for part, node, sig in _npu_cube_nodes(model, partitioning):
        shape = parse_signature(sig)[2]
        if shape.has_work:
            group = groups.setdefault(sig, KernelGroup(sig, shape, part.device))
            group.nodes.append(anchor_key(node))
    return list(groups.values())


def idle_kernels(model: Model, partitioning: Partitioning) -> list[str]:
    """The NPU cube nodes (by anchor key) that model_kernels leaves out: a zero-size dim."""
    return [anchor_key(node) for _, node, sig in _npu_cube_nodes(model, partitioning)
            if not parse_signature(sig)[2].has_work]


def _npu_cube_nodes(model: Model, partitioning: Partitioning):
    """(partition, node, signature) of every cube node with static shapes on an NPU."""
    target = partitioning.target
    # A graphopt:: fused group is one kernel of its own (model.node_estimate): one headed by a
    # cube kernel (epilogue fusion) takes that kernel's tuning, under the call's name.
    functions = model_functions(model)
    for part in partitioning.partitions:
        device = target.device(part.device)
        if device.kind != "npu" or not device.cube:  # no cube: no tiling to tune
            continue
        for node in part.nodes:
            if not _runs_on_cube(node, functions, device):
                continue  # a profile may list Conv or MatMul on its vector engine
            sig = kernel_signature(node, functions, target.name)
            if sig is not None:
                yield part, node, sig


def _runs_on_cube(node: Node, functions: dict, device) -> bool:
    """Whether the device runs `node`'s cube kernel (a group call's: its heading kernel's) on
    a cube engine."""
    function = functions.get((node.domain, node.op_type))
    if function is None:
        return device.on_cube(node.op_type, node.domain, data_dtype(node))
    anchor = next((n for n in function.node if n.op_type in ANCHORS_OF_GROUPS and not n.domain),
                  None)
    return anchor is not None and device.on_cube(anchor.op_type)


def model_functions(model: Model) -> dict:
    """(domain, name) -> the model's local function of that name: what kernel_signature
    looks a call up in."""
    return {(f.domain, f.name): f for f in model.functions}


def kernel_signature(node: Node, functions: dict, target: str) -> str | None:
    """The signature of the cube kernel a node runs: its own, or for the call of a graphopt::
    group in `functions` (model_functions) the one of the cube kernel heading the group. None
    when it runs none, or its shapes are not static."""
    function = functions.get((node.domain, node.op_type))
    return (node_signature(node, target) if function is None
            else _group_signature(node, function, target))


def _group_signature(call: Node, function, target: str) -> str | None:
    """The signature of the cube kernel heading a graphopt:: group call, None when it has none
    or its shapes are not static."""
    try:
        found = group_anchor_shape(call, function)
    except ValueError:
        return None
    if found is None:
        return None
    op_type, shape = found
    return signature(target, "conv" if op_type in CONV_OPS else "gemm", shape)
