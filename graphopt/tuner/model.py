"""The estimated time of a partitioned model: one row per kernel, per host↔device copy.

Partitions run one after another (no overlap between devices: an estimate's simplification). On
an NPU partition: a cube op (MatMul/Gemm/Conv and fused forms) is npu_model.estimate under its
tiling (`tilings[anchor_key(node)]`: the node's name, or `%output` for an unnamed one, as
anchor_key spells them; else default_tiling; none for one with a zero-size dim, which has no
work to tile), a graphopt:: call is one fused group (vector.group_estimate; the cube kernel
heading one is tiled as a lone one, by `tilings[anchor_key(call)]` or the default), any other
op one vector kernel (vector.vector_estimate; Reshape-like ops and Constant have no kernel). On the
host: partition.estimate's roofline per node. Copies: every non-constant value read by a
partition on another device than its producer's (graph inputs live on the host), and every
NPU-produced graph output, is one transfer_estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.partition.estimate import value_bytes
from graphopt.partition.placement import data_dtype
from graphopt.passes.base import anchor_key
from graphopt.tuner.cpu_model import host_cost_model, model_functions
from graphopt.tuner.npu_model import Estimate, estimate
from graphopt.tuner.tiling import (CUBE_OPS, GemmShape, Tiling, default_tiling, gemm_shape,
                                   group_anchor_shape)
from graphopt.tuner.vector import group_estimate, transfer_estimate, vector_estimate

if TYPE_CHECKING:
    from graphopt.ir import Model, Node
    from graphopt.partition.partitioner import Partition, Partitioning


@dataclass(frozen=True)
class KernelRow:
    partition: str
    device: str
    name: str               # the node's name, or the copied value's for a transfer
    op: str                 # qualified op type, "transfer" for a copy
    kind: str               # "cube" | "group" | "vector" | "host" | "transfer"
    estimate: Estimate
    tiling: Tiling | None = None

    @property
    def seconds(self) -> float:
        return self.estimate.seconds


@dataclass
class ModelEstimate:
    rows: list[KernelRow] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(row.seconds for row in self.rows)

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for row in self.rows:
            out[row.kind] = out.get(row.kind, 0.0) + row.seconds
        return out

    def table(self) -> str:
        """The per-kernel table, estimates in microseconds."""
        lines = [f"{'partition':<12} {'kind':<8} {'op':<28} {'us':>9}  {'bound':<8} tiling / node"]
        for row in self.rows:
            bound = row.estimate.breakdown.get("bound", "")
            lines.append(f"{row.partition:<12} {row.kind:<8} {row.op[:28]:<28} "
                         f"{row.seconds * 1e6:>9.2f}  {bound:<8} {row.tiling or row.name}")
        lines.append(f"total (estimate): {self.seconds * 1e6:.2f} us")
        return "\n".join(lines)


def node_estimate(node: Node, device, model: Model | None = None,
                  tiling: Tiling | None = None) -> tuple[str, Estimate, Tiling | None]:
    """(kind, estimate, tiling) of one node on an NPU device."""
    functions = {(f.domain, f.name): f for f in model.functions} if model is not None else {}
    function = functions.get((node.domain, node.op_type))
    if function is not None:
        # The cube kernel heading an elementwise group (epilogue fusion) keeps the tiling a
        # lone one of its shape gets: priced and recorded as such, so that a compile with
        # epilogues compares with one without like for like.
        shape = _group_cube_shape(node, function, device)
        if shape is not None:
            tiling = tiling or default_tiling(shape, device)
            return "group", group_estimate([node], device, model, tiling), tiling
        return "group", group_estimate([node], device, model), None
    # A profile may run them on another engine: priced as that engine's ops, untiled.
    if node.op_type in CUBE_OPS and device.cube \
            and device.on_cube(node.op_type, node.domain, data_dtype(node)):
        try:
            shape = gemm_shape(node)
        except ValueError:
            shape = None
        if shape is not None and not shape.has_work:
            return "cube", estimate(shape, None, device), None  # nothing to tile
        if shape is not None:
            tiling = tiling or default_tiling(shape, device)
            return "cube", estimate(shape, tiling, device), tiling
    # A kernel the profile puts on the cube without a tiling here (a fused attention, a
    # weight-only GEMM) keeps the cube's name; vector_estimate prices its cube work.
    kind = "cube" if device.cube and device.on_cube(node.op_type, node.domain,
                                                    data_dtype(node)) else "vector"
    return kind, vector_estimate(node, device, functions), None


def _group_cube_shape(call: Node, function, device) -> GemmShape | None:
    """The GEMM of the cube kernel heading a graphopt:: group call, when it has one to tile on
    this device (a cube, static shapes, work)."""
    if not device.cube:
        return None
    try:
        found = group_anchor_shape(call, function)
    except ValueError:
        return None
    if found is None or not device.on_cube(found[0]):
        return None
    return found[1] if found[1].has_work else None


def model_estimate(model: Model, partitioning: Partitioning,
                   tilings: dict[str, Tiling] | None = None) -> ModelEstimate:
    """The per-kernel estimates of `model` cut by `partitioning` (optimize(…, target=…))."""
    target = partitioning.target
    tilings = tilings or {}
    home = {node: p.device for p in partitioning.partitions for node in p.nodes}
    functions = model_functions(model)
    result = ModelEstimate()
    # A value crosses to a device once, however many of that device's partitions read it (and
    # a device's graph output read by a host partition too reaches the host once).
    moved: set[tuple[int, str]] = set()

    def transfer(part: Partition, value, destination: str) -> None:
        if (id(value), destination) not in moved:
            moved.add((id(value), destination))
            result.rows.append(KernelRow(part.name, part.device, value.name, "transfer",
                                         "transfer", transfer_estimate(value_bytes(value), target)))

    for part in partitioning.partitions:
        device = target.device(part.device)
        for value in part.inputs:
            if value.const is not None and value.is_constant:
                continue
            source = home.get(value.producer, target.host) if value.producer else target.host
            if source != part.device:
                transfer(part, value, part.device)
        host_model = host_cost_model(target, device) if device.kind == "cpu" else None
        for node in part.nodes:
            if host_model is not None:
                seconds = host_model.node_seconds(node, functions)
                result.rows.append(KernelRow(part.name, part.device, anchor_key(node), node.qualified_op,
                                             "host", Estimate(0.0, seconds, {"bound": "roofline"})))
                continue
            kind, est, tiling = node_estimate(node, device, model,
                                              tilings.get(anchor_key(node)))
            result.rows.append(KernelRow(part.name, part.device, anchor_key(node),
                                         node.qualified_op, kind, est, tiling))
        if part.device != target.host:
            for value in part.outputs:
                if value.is_graph_output:
                    transfer(part, value, target.host)
    return result
