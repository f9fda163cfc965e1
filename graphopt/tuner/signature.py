"""Kernel signatures: the key one tuning of a cube kernel is stored and shared under.

    ascend310/gemm/b1_m256_k256_n256/float16
    <target>/<op class>/b<batch>_m<M>_k<K>_n<N>/<cube dtype>

The op class is "gemm" for MatMul/Gemm (and fused forms), "conv" for Conv (an implicit GEMM,
tiling.py). The dtype is the one the cube computes in (float32 runs in float16, uint8 as
int8): kernels the cost model cannot tell apart share one signature, hence one tuning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.tuner.tiling import (ANCHORS_OF_GROUPS, CONV_OPS, GemmShape, cube_dtype, gemm_shape,
                                   group_anchor_shape)

from graphopt.passes.base import anchor_key
from graphopt.partition.placement import data_dtype

if TYPE_CHECKING:
    from graphopt.ir import Model, Node
    from graphopt.partition.partitioner import Partitioning

_PATTERN = re.compile(r"^(?P<target>[^/]+)/(?P<op>gemm|conv)/"
                      r"b(?P<b>\d+)_m(?P<m>\d+)_k(?P<k>\d+)_n(?P<n>\d+)/(?P<dtype>[A-Za-z0-9_]+)$")


def signature(target: str, op_class: str, shape: GemmShape) -> str:
    if op_class not in ("gemm", "conv"):
        raise ValueError(f"op class '{op_class}' is not 'gemm' or 'conv'")
    return (f"{target}/{op_class}/b{shape.batch}_m{shape.m}_k{shape.k}_n{shape.n}/"
            f"{cube_dtype(shape.dtype)}")


def parse_signature(text: str) -> tuple[str, str, GemmShape]:
    """(target, op class, shape) of a signature; ValueError naming it when it is not one."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"'{text}' is not a kernel signature "
                         "(<target>/<gemm|conv>/b<B>_m<M>_k<K>_n<N>/<dtype>)")
    g = match.groupdict()
    shape = GemmShape(int(g["b"]), int(g["m"]), int(g["k"]), int(g["n"]), g["dtype"])
    return g["target"], g["op"], shape


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
