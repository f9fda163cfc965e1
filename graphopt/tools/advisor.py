"""Advice from a profile: bottleneck op types, patterns left unfused, CPU fallbacks, layout work.

Each hint carries the numbers that justify it. The unfused-pattern checks are deliberately
simple producer→consumer tests on the profiled graph (a node whose output has exactly the one
consumer the pattern names), not the fusion rules themselves: they say where a fusion *could*
apply, and the profile says whether onnxruntime fused it anyway at load time.

    MatMul → Add(const)           FuseMatMul         Conv → BatchNormalization   FuseConvBatchNorm
    Conv → Relu/Clip/Sigmoid/…    FuseActivation     ReduceMean → Sub → Pow|Mul  FuseLayerNorm
    Erf → Add → Mul               FuseGelu (erf)     Pow → … → Tanh              FuseGelu (tanh)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from graphopt.errors import one_line
from graphopt.ir import Model, Node, Value
from graphopt.passes.pipelines import lowest_level
from graphopt.tools.profile import Profile
from graphopt.tools.profile_match import EXACT
from graphopt.tools.profile_trace import CONTROL_FLOW

BOTTLENECK_SHARE = 0.10   # an op type at or above this share of kernel time is a bottleneck
MAX_BOTTLENECKS = 3
_REORDERS = ("ReorderInput", "ReorderOutput")
_ACTIVATIONS = {"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "HardSwish"}


@dataclass(frozen=True)
class Hint:
    kind: str                  # "bottleneck", "unfused", "fallback", "layout"
    message: str
    numbers: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message, "numbers": self.numbers}


def advise(profile: Profile, model: Model | Mapping[str, Model] | None = None, *,
           min_share: float = BOTTLENECK_SHARE) -> list[Hint]:
    """Hints for `profile`. `model` is the IR that ran (default: the profile's own, one model
    per partition); a single Model stands for a one-partition profile."""
    if model is None:
        models = profile.models
    elif isinstance(model, Model):
        models = {part.name: model for part in profile.partitions[:1]}
    else:
        models = dict(model)
    hints = _bottlenecks(profile, min_share)
    hints += _unfused(profile, models)
    hints += _fallbacks(profile)
    hints += _layout(profile, models)
    return hints


# --- bottlenecks ---------------------------------------------------------------------------


def _typical_us(kernel) -> float:
    """A kernel's time over the profiled runs counted at its median call: a call another
    process stalled (one 800 µs And among 7 µs ones) must not make its op the bottleneck."""
    return (kernel.median_us or kernel.mean_us) * kernel.calls


def _bottlenecks(profile: Profile, min_share: float) -> list[Hint]:
    typical: dict[str, float] = {}
    for kernel in profile.kernels:
        typical[kernel.op_type] = typical.get(kernel.op_type, 0.0) + _typical_us(kernel)
    total = sum(typical.values()) or 1.0
    rows = sorted((r for r in profile.by_op() if typical[r.op_type] / total >= min_share),
                  key=lambda r: (-typical[r.op_type], r.op_type))
    hints = []
    for row in rows[:MAX_BOTTLENECKS]:
        share, per_run = typical[row.op_type] / total, typical[row.op_type] / profile.runs
        # The table and the other hints count every call; say so where a stalled call made
        # the two bases part.
        # The µs too: a ResNet's Conv read 99% and 65654 µs/run beside the table's 96.7% and
        # 137292 µs/run, the share alone being within the 5 points.
        counted = row.total_us / profile.runs
        parted = abs(share - row.share) >= 0.05 or abs(per_run - counted) > 0.1 * counted
        basis = (f" at each kernel's median call ({row.share:.0%} and {counted:.1f} µs/run "
                 "counting every call, as the table does)" if parted else "")
        text = (f"{row.op_type}: {share:.0%} of kernel time, {per_run:.1f} µs/run{basis}, over "
                f"{row.kernels} kernel(s)")
        numbers = {"op": row.op_type, "share": share, "us_per_run": per_run,
                   "kernels": row.kernels, "bound": row.bound}
        if row.op_type in CONTROL_FLOW:  # no kernel of its own to speed up or fuse
            text += ("; control flow: its time is that of the kernels its branches or body "
                     "ran, counted within it, so no per-kernel verdict applies")
            numbers["control_flow"] = True
        elif row.bound is not None:
            numbers.update(compute_us=row.compute_us, memory_us=row.memory_us,
                           predicted_us=row.predicted_us)
            sides = (f"roofline compute {row.compute_us:.1f} µs vs memory {row.memory_us:.1f} µs "
                     f"per run, predicted {row.predicted_us:.1f} µs")
            if row.bound == "overhead":
                text += (f"; bound by per-kernel overhead ({sides}): fewer, larger kernels "
                         "(fusion) help more than faster ones")
            else:
                text += f"; {row.bound}-bound ({sides})"
        hints.append(Hint("bottleneck", text, numbers))
    return hints


# --- unfused patterns ----------------------------------------------------------------------


def _only_consumer(value: Value | None, ops) -> Node | None:
    """The single consumer of `value` if it is one of `ops` (and nothing else reads it)."""
    if value is None or value.is_graph_output:
        return None
    consumers = value.consumers()
    if len(consumers) == 1 and consumers[0].op_type in ops:
        return consumers[0]
    return None


def _matmul_add(node: Node) -> list[Node] | None:
    if node.op_type != "MatMul":
        return None
    add = _only_consumer(node.output, {"Add"})
    if add is None or not any(_constant(v) for v in add.inputs):
        return None
    return [node, add]


def _constant(value: Value | None) -> bool:
    """A constant, or an Identity of one (TorchScript exports route 11 of BERT's 12 shared
    projection biases through an Identity, which onnxruntime's MatMulAddFusion sees past)."""
    while value is not None and not value.is_constant and value.producer is not None \
            and value.producer.op_type == "Identity":
        value = value.producer.inputs[0]
    return value is not None and value.is_constant


def _conv_bn(node: Node) -> list[Node] | None:
    bn = _only_consumer(node.output, {"BatchNormalization"}) if node.op_type == "Conv" else None
    return [node, bn] if bn is not None else None


def _conv_activation(node: Node) -> list[Node] | None:
    act = _only_consumer(node.output, _ACTIVATIONS) if node.op_type == "Conv" else None
    return [node, act] if act is not None else None


def _layernorm(node: Node) -> list[Node] | None:
    if node.op_type != "ReduceMean":
        return None
    subs = [c for c in node.output.consumers() if c.op_type == "Sub"]
    for sub in subs:
        square = [c for c in sub.output.consumers() if c.op_type in ("Pow", "Mul")]
        if square:
            return [node, sub, square[0]]
    return None


def _gelu_erf(node: Node) -> list[Node] | None:
    add = _only_consumer(node.output, {"Add"}) if node.op_type == "Erf" else None
    mul = _only_consumer(add.output, {"Mul"}) if add is not None else None
    return [node, add, mul] if mul is not None else None


def _gelu_tanh(node: Node) -> list[Node] | None:
    """Pow(x, 3) → Mul(0.044715) → Add(x, ·) → Mul(√(2/π)) → Tanh, whichever operand order
    the exporter wrote and whether its constants are initializers or Constant nodes."""
    if node.op_type != "Tanh":
        return None
    chain = _path_to_pow(node, 4)
    if chain is None or len(chain) != 5:
        return None
    pow_node, add = chain[0], chain[2]
    base = pow_node.inputs[0] if pow_node.inputs else None
    return chain if add.op_type == "Add" and base is not None and base in add.inputs else None


def whole_pattern(nodes: list[Node]) -> list[Node]:
    """A decomposed LayerNorm's or Gelu's every node, from the few its check matches: what a
    fused kernel would replace (the matched ones stop at Pow, or at Tanh, and priced a
    LayerNorm's 9 kernels as its first 3)."""
    first = nodes[0].op_type
    if first == "ReduceMean":  # … Pow → ReduceMean → Add(ε) → Sqrt → Div(d, ·) → Mul(γ) → Add(β)
        sub = nodes[1]
        body = _chain(nodes[-1], {"ReduceMean", "Add", "Sqrt", "Reciprocal", "Div", "Mul"}, 5,
                      stop=lambda n: sub.outputs[0] in n.inputs)
        if body and sub.outputs[0] in body[-1].inputs:
            return nodes + body + _chain(body[-1], {"Mul", "Add"}, 2, constant=True)
        return nodes
    if first == "Erf":  # Div(x, √2) → Erf → Add(1) → Mul(x, ·) → Mul(0.5)
        before = [p for p in (nodes[0].inputs[0].producer,)
                  if p is not None and p.op_type in ("Div", "Mul") and _scaled(p)]
        after = _chain(nodes[-1], {"Mul"}, 1, constant=True)
        return before + nodes + after + _halves(nodes[-1:] + after)
    if first == "Pow":  # … Tanh → Add(1) → Mul(0.5) → Mul(x, ·), in either order
        after = _chain(nodes[-1], {"Add", "Mul"}, 3)
        return nodes + after + _halves(after)
    return nodes


def _chain(node: Node, ops: set[str], limit: int, *, constant: bool = False,
           stop: Callable[[Node], bool] | None = None) -> list[Node]:
    """The single consumers after `node`, one after another, while their op is in `ops` (and
    they read a constant, with `constant`), at most `limit`, ending at the first `stop` takes."""
    found = []
    while len(found) < limit:
        node = _only_consumer(node.outputs[0] if node.outputs else None, ops)
        if node is None or (constant and not _scaled(node)):
            break
        found.append(node)
        if stop is not None and stop(node):
            break
    return found


def _scaled(node: Node) -> bool:
    """Whether one of `node`'s inputs is a weight or a Constant node's output."""
    return any(v is not None and (v.is_weight or (v.producer is not None and
                                                  v.producer.op_type == "Constant"))
               for v in node.inputs)


def _halves(nodes: list[Node]) -> list[Node]:
    """The Mul(x, 0.5) a Gelu computes beside its Erf or Tanh branch, feeding one of `nodes`."""
    return [v.producer for n in nodes for v in n.inputs
            if v is not None and v.producer is not None and v.producer.op_type == "Mul"
            and v.producer not in nodes and _scaled(v.producer) and len(v.consumers()) == 1]


def _path_to_pow(node: Node, depth: int) -> list[Node] | None:
    """The nodes from a Pow up to `node`, at most `depth` producers back along computed
    values (not Constant nodes), or None."""
    if node.op_type == "Pow":
        return [node]
    if depth == 0:
        return None
    for value in node.inputs:
        producer = value.producer if value is not None else None
        if producer is None or producer.op_type == "Constant":
            continue
        path = _path_to_pow(producer, depth - 1)
        if path is not None:
            return path + [node]
    return None


# (label, the pass that fuses it, check)
PATTERNS: list[tuple[str, str, Callable[[Node], list[Node] | None]]] = [
    ("MatMul + Add", "FuseMatMul", _matmul_add),
    ("Conv + BatchNormalization", "FuseConvBatchNorm", _conv_bn),
    ("Conv + activation", "FuseActivation", _conv_activation),
    ("decomposed LayerNorm (ReduceMean, Sub, Pow…)", "FuseLayerNorm", _layernorm),
    ("decomposed Gelu (Erf, Add, Mul)", "FuseGelu", _gelu_erf),
    ("decomposed tanh Gelu (Pow … Tanh)", "FuseGelu", _gelu_tanh),
]
# The rule of each pattern's pass that `--trace-rule` asks why it did not fire.
TRACED_RULES = {"MatMul + Add": "MatMulAddToGemm", "Conv + BatchNormalization": "ConvBatchNorm",
                "Conv + activation": "ConvRelu",
                "decomposed LayerNorm (ReduceMean, Sub, Pow…)": "LayerNormDecomposed",
                "decomposed Gelu (Erf, Add, Mul)": "GeluErf",
                "decomposed tanh Gelu (Pow … Tanh)": "GeluTanh"}


# FusedConv is onnxruntime's CPU kernel; an NPU engine applies activations in its own pass.
_HOST_ONLY = {"Conv + activation"}


def find_patterns(model: Model) -> dict[str, list[list[Node]]]:
    """Every unfused-pattern occurrence in the main graph, by pattern label."""
    found: dict[str, list[list[Node]]] = {}
    for label, _, check in PATTERNS:
        for node in model.graph:
            nodes = check(node)
            if nodes:
                found.setdefault(label, []).append(nodes)
    return found


def _unfused(profile: Profile, models: Mapping[str, Model]) -> list[Hint]:
    own = {(k.partition, k.node): k for k in profile.kernels if k.node and k.how == EXACT}
    # At each kernel's median call, as the bottleneck hints count: one call another process
    # stalled must not make a pattern's savings look large.
    total = sum(_typical_us(k) for k in profile.kernels) or 1.0
    passes = {label: name for label, name, _ in PATTERNS}
    hints = []
    for partition, model in models.items():
        part = next((p for p in profile.partitions if p.name == partition), None)
        level = part.level if part is not None else "?"
        for label, places in find_patterns(model).items():
            if label in _HOST_ONLY and part is not None and part.device != "cpu":
                continue
            separate = [nodes for nodes in places
                        if sum((partition, n.name) in own for n in nodes) >= 2]
            # What fusing could save: the kernels after the pattern's first node (the Add, the
            # BatchNorm…), which a fused kernel does in the first one's pass over the data.
            spent = sum(_typical_us(own[(partition, n.name)]) for nodes in separate
                        for n in whole_pattern(nodes)[1:] if (partition, n.name) in own)
            example = " → ".join(repr(n.name or n.op_type) for n in places[0])
            fuser = _with_level(passes[label])
            text = (f"{label} left unfused in {len(places)} place(s) of {partition} "
                    f"(e.g. {example}); ")
            if separate:
                text += (f"{len(separate)} run as separate kernels, the ones after the first "
                         f"taking {spent / profile.runs:.1f} µs/run ({spent / total:.0%} of "
                         "kernel time); ")
            else:
                text += (f"onnxruntime fused each when loading at level {level}, so they cost "
                         "load time, not run time; ")
            if profile.compiled_passes and passes[label] in profile.compiled_passes:
                # Advice to run the pass would send the user round in a circle.
                text += (f"graphopt's {fuser} ran in this compile and its checks left them "
                         f"(`graphopt optimize … --trace-rule {TRACED_RULES[label]}` says why)")
            else:
                text += (f"graphopt's {fuser} fuses this pattern "
                         f"{'' if separate else 'offline '}where its checks allow")
            hints.append(Hint("unfused", text, {
                "pattern": label, "partition": partition, "places": len(places),
                "separate": len(separate), "us_per_run": spent / profile.runs,
                "share": spent / total, "pass": passes[label]}))
    return hints


def _with_level(pass_name: str) -> str:
    """The pass as a hint names it, with the lowest -O level that runs it (FuseActivation is
    -O3's, where every pattern's pass was called -O2's)."""
    level = lowest_level(pass_name)
    return pass_name if level is None else f"{pass_name} (-O{level})"


# --- fallbacks and layout ------------------------------------------------------------------


def _fallbacks(profile: Profile) -> list[Hint]:
    record = profile.partitioning or {}
    fallbacks = record.get("fallbacks") or []
    if not fallbacks:
        return []
    by_reason: dict[str, Counter] = {}
    for entry in fallbacks:
        by_reason.setdefault(entry["reason"], Counter())[entry["op"]] += 1
    host = [(p, us, share) for p, _, us, share in profile.by_partition() if p.device == "cpu"]
    host_us = sum(us for _, us, _ in host)
    host_share = sum(share for _, _, share in host)
    reasons = "; ".join(f"{', '.join(f'{op} ×{n}' for op, n in ops.items())}: {reason}"
                        for reason, ops in by_reason.items())
    text = one_line(f"{len(fallbacks)} node(s) placed on the CPU instead of the "
                    f"{record.get('target', '?')} NPU, in {len(host)} host partition(s) taking "
                    f"{host_us:.1f} µs/run ({host_share:.0%} of kernel time) — {reasons}")
    return [Hint("fallback", text, {"nodes": len(fallbacks), "host_partitions": len(host),
                                    "us_per_run": host_us, "share": host_share,
                                    "reasons": {r: dict(ops) for r, ops in by_reason.items()}})]


def _layout(profile: Profile, models: Mapping[str, Model]) -> list[Hint]:
    hints = []
    total = sum(_typical_us(k) for k in profile.kernels) or 1.0
    for ops, what in ((_REORDERS, "NCHWc layout conversions"), (("Transpose",), "Transposes")):
        kernels = [k for k in profile.kernels if k.op_type in ops]
        in_graph = sum(1 for m in models.values() for n in m.graph if n.op_type in ops)
        if not kernels and not in_graph:
            continue
        spent = sum(_typical_us(k) for k in kernels)
        counts = Counter(k.op_type for k in kernels)
        kinds = ", ".join(f"{op} ×{n}" for op, n in sorted(counts.items())) or "none ran"
        text = (f"{what}: {len(kernels)} kernel(s) ran ({kinds}; the graph has {in_graph} "
                f"before onnxruntime's own rewrites), {spent / profile.runs:.1f} µs/run, "
                f"{spent / total:.0%} of kernel time")
        hints.append(Hint("layout", text, {"ops": list(ops), "kernels": len(kernels),
                                           "in_graph": in_graph,
                                           "us_per_run": spent / profile.runs,
                                           "share": spent / total}))
    return hints
