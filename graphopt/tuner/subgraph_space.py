"""The decision space of subgraph tuning: which fusions and layout changes a compile may make.

A default compile runs with a recording rewrite gate (PassContext.gate): every rewrite a
tunable pass makes is one decision, and decisions that look alike — same pass and rule, same
anchor op, in the same partition — form one group, switched on or off
together (a BERT's twelve identical GELU fusions are one choice, not twelve); with
granularity "shape" the anchor's output shape splits a group further (blocking the 7×7 convs
but not the 56×56 ones), a bigger space that wants more trials. Groups are
what Optuna sees, one boolean each; on is the default. Tunable passes are the ones whose
rewrites can cost time on some target: fusions into bigger kernels (FuseMatMul, FuseGelu,
FuseLayerNorm, FuseAttention, FuseActivation, FuseElementwise), layout changes (LayoutNchwc,
where reorders go) and the conv algorithm (WinogradConv at -O3 on the CPU: with granularity
"shape" the measured objective settles the layer shapes its rule calls close). Folding,
cleanups and FuseConvBatchNorm only ever remove work and are not searched. With FuseElementwise in the pipeline (-O3) the group size limit
is a knob too ("fusion depth"), and on an NPU target whether a Conv/MatMul/Gemm heads its
elementwise group (epilogue fusion).

A decision's partition is the one that holds, in the default compile, a node whose name
starts with the anchor's (rewrites name their nodes `<anchor>/<rule>/<op>`) or that
defines the anchor's first output; "-" when the fused result cannot be traced back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from graphopt.passes.base import anchor_key

if TYPE_CHECKING:
    from graphopt.ir import Node
    from graphopt.partition.partitioner import Partitioning

TUNABLE_PASSES = frozenset({"FuseMatMul", "FuseGelu", "FuseLayerNorm", "FuseAttention",
                            "FuseActivation", "FuseElementwise", "LayoutNchwc", "WinogradConv"})
GRANULARITIES = ("rule", "shape")
GROUP_SIZES = (2, 4, 8, 16, 32)          # FuseElementwise's max group size ladder
MAX_GROUP_KNOB = "elementwise_max_group"
EPILOGUE_KNOB = "elementwise_epilogues"


def decision_key(pass_name: str, rule: str, node: "Node", granularity: str = "rule") -> str:
    """`pass:rule@Op`, or with granularity "shape" `pass:rule@Op[dims]`: the same for every
    rewrite a group switches together."""
    what = rule if rule == pass_name else f"{pass_name}:{rule}"
    if granularity == "rule":
        return f"{what}@{node.op_type}"
    out = next((v for v in node.outputs if v is not None), None)
    # Symbolic dims read "?": exporters give every layer fresh symbols (unk__14, unk__28),
    # which would keep alike layers apart.
    dims = "?" if out is None or out.shape is None else \
        ",".join(str(d) if isinstance(d, int) else "?" for d in out.shape)
    return f"{what}@{node.op_type}[{dims}]"


@dataclass
class Group:
    key: str                     # decision_key without the partition
    partition: str               # where the default compile put it ("-" when untraceable)
    anchors: list[str] = field(default_factory=list)

    @property
    def param(self) -> str:
        """The Optuna parameter name: partition and key."""
        return f"{self.partition}/{self.key}"


@dataclass
class Space:
    groups: list[Group]
    knobs: dict[str, list]       # pass option -> its choices (the first is the default)
    granularity: str = "rule"

    @property
    def size(self) -> int:
        n = 2 ** len(self.groups)
        for choices in self.knobs.values():
            n *= len(choices)
        return n

    def default_params(self) -> dict:
        params: dict = {group.param: True for group in self.groups}
        params.update({knob: choices[0] for knob, choices in self.knobs.items()})
        return params


class Recorder:
    """A rewrite gate that lets everything through and notes the tunable rewrites."""

    def __init__(self, granularity: str = "rule") -> None:
        self.granularity = granularity
        self.seen: list[tuple[str, str]] = []        # (decision key, anchor key), in order

    def __call__(self, pass_name: str, rule: str, node: "Node") -> bool:
        if pass_name in TUNABLE_PASSES:
            self.seen.append((decision_key(pass_name, rule, node, self.granularity),
                              anchor_key(node)))
        return True


def build_space(recorder: Recorder, partitioning: "Partitioning | None", *,
                elementwise: bool, npu: bool) -> Space:
    """Groups of the recorded rewrites by (partition, key), in first-seen order, plus the knobs
    (`elementwise`: FuseElementwise ran; `npu`: the target's primary device is an NPU)."""
    where = _partition_lookup(partitioning)
    groups: dict[tuple[str, str], Group] = {}
    for key, anchor in recorder.seen:
        part = where(anchor)
        group = groups.setdefault((part, key), Group(key, part))
        if anchor not in group.anchors:
            group.anchors.append(anchor)
    knobs: dict[str, list] = {}
    if elementwise:
        knobs[MAX_GROUP_KNOB] = [32] + [s for s in GROUP_SIZES if s != 32]
        if npu:
            knobs[EPILOGUE_KNOB] = [False, True]
    return Space(list(groups.values()), knobs, recorder.granularity)


def _partition_lookup(partitioning: "Partitioning | None") -> Callable[[str], str]:
    if partitioning is None:
        return lambda anchor: "-"
    if len(partitioning.partitions) == 1:  # every rewrite is in it, traced or not
        only = partitioning.partitions[0].name
        return lambda anchor: only
    by_prefix: dict[str, str] = {}
    by_value: dict[str, str] = {}
    for part in partitioning.partitions:
        for node in part.nodes:
            pieces = node.name.split("/")
            for i in range(1, len(pieces) + 1):
                by_prefix.setdefault("/".join(pieces[:i]), part.name)
            for value in node.outputs:
                if value is not None:
                    by_value.setdefault(value.name, part.name)

    def where(anchor: str) -> str:
        if anchor.startswith("%"):
            return by_value.get(anchor[1:]) or by_prefix.get(anchor[1:], "-")
        return by_prefix.get(anchor, "-")
    return where


def gate_for(params: dict, space: Space) -> Callable[[str, str, "Node"], bool]:
    """The rewrite gate that applies a trial's group choices. A rewrite no group covers (one
    that only happens because an earlier choice changed the graph) goes ahead, as by default.
    Partitions are not known while passes run, so a key switched off in one partition is
    switched off at every anchor that group recorded."""
    off: dict[str, set[str]] = {}
    for group in space.groups:
        if not params.get(group.param, True):
            off.setdefault(group.key, set()).update(group.anchors)

    def gate(pass_name: str, rule: str, node: "Node") -> bool:
        if pass_name not in TUNABLE_PASSES:
            return True
        anchors = off.get(decision_key(pass_name, rule, node, space.granularity))
        return anchors is None or anchor_key(node) not in anchors
    return gate


def pass_options_for(params: dict, space: Space) -> dict:
    return {knob: params[knob] for knob in space.knobs if knob in params}


def space_json(space: Space) -> dict:
    return {"groups": [asdict(g) for g in space.groups], "knobs": space.knobs,
            "granularity": space.granularity}


def space_from_json(data: dict) -> Space:
    return Space([Group(**g) for g in data["groups"]],
                 {k: list(v) for k, v in data["knobs"].items()}, data["granularity"])
