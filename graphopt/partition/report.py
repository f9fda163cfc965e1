"""The partition table and fallback reasons, as text for `graphopt partition` and as JSON."""

from __future__ import annotations

import re
from collections import Counter

from graphopt.errors import one_line
from graphopt.option_names import from_command_line, option
from graphopt.partition.estimate import value_bytes
from graphopt.partition.layouts import layout_summary
from graphopt.partition.partitioner import Partition, Partitioning, _with_nested, is_constant_node
from graphopt.table import format_table, wrap_to_terminal

_TOP_OPS = 4  # op types named per partition row; the rest are counted


def format_partitioning(partitioning: Partitioning, *, all_fallbacks: bool = False,
                        more: str = "--all-fallbacks") -> str:
    """The partition table, then each fallback reason with the nodes it applies to (the first
    20 unless `all_fallbacks`; `more` says how to see the rest)."""
    target = partitioning.target
    rows = [[p.name, p.device, p.node_count(), _engines(partitioning, p), len(p.inputs),
             _kib(p.inputs), len(p.outputs), _kib(p.outputs), _ops(p)]
            for p in partitioning.partitions]
    lines = [format_table(
        ["partition", "device", "nodes", "engines", "in", "in KiB", "out", "out KiB", "ops"],
        rows, title=f"target {target.shown}: {len(partitioning.partitions)} partition(s)")]
    if partitioning.layouts:
        lines.append("")
        lines.append(wrap_to_terminal("device formats (TransData counted before and after "
                                      "cancelling pairs that meet):"))
        lines.append(layout_summary(partitioning.layouts))
    fallbacks = partitioning.fallbacks()
    if fallbacks:
        lines.append("")
        # The table counts the nodes inside If/Loop/Scan bodies too; the reasons are the
        # main graph's nodes, whose bodies go with them.
        nested = sum(1 for _ in _with_nested(node for node, _ in fallbacks))
        within = f" ({nested} with the nodes inside their subgraphs, as the partition table " \
                 "counts them)" if nested != len(fallbacks) else ""
        # A Constant node is data that goes with its readers: counted by the table, never a
        # fallback (at -O0, where none became an initializer, tiny's table said 23, this 18).
        constants = sum(is_constant_node(node) for p in partitioning.partitions
                        if p.device == target.host for node in p.nodes)
        data = (f"; the {target.host} partitions also hold {constants} Constant node(s), data "
                "that goes with the nodes reading it") if constants else ""
        lines.append(f"{len(fallbacks)} node(s) on {target.host} instead of {target.primary}"
                     f"{within}{data}:")
        by_reason: dict[str, list[str]] = {}
        example: dict[str, str] = {}  # a grouped row's first tensor, shown as an example
        for node, reason in fallbacks:
            key, tensor = _grouped(reason)
            example.setdefault(key, tensor)
            by_reason.setdefault(key, []).append(node.name or node.op_type)
        by_reason = {(f"{key} (e.g. {example[key]})" if example[key] else key): nodes
                     for key, nodes in by_reason.items()}
        shown = by_reason if all_fallbacks else dict(list(by_reason.items())[:20])
        rows = [[reason, len(nodes), _names(nodes)] for reason, nodes in shown.items()]
        lines.append(format_table(["reason", "nodes", "names"], rows))
        if len(shown) < len(by_reason):
            lines.append(f"… and {len(by_reason) - len(shown)} more reason(s) ({more})")
    return "\n".join(lines)


_DYNAMIC = re.compile(r"dynamic shape: (%\S+) \[([^\]]*)\]$")


def _grouped(reason: str) -> tuple[str, str]:
    """(the table's row for a fallback reason, a tensor to show as its example or ""): nodes
    whose tensors are open in the same named dims share a row (a Mask R-CNN's 426 fallbacks
    had read as one row per tensor of each NonZero's chain, 20 shown and 223 more). Other
    reasons, and dims that are only unknown (`?`), stay as they are."""
    match = _DYNAMIC.match(reason)
    if not match:
        return reason, ""
    named = sorted({d for d in match.group(2).split(",") if d and d != "?" and not d.isdigit()})
    if not named:
        return reason, ""
    return (f"dynamic shape: open dim{'s' if len(named) > 1 else ''} {', '.join(named)}",
            f"{match.group(1)} [{match.group(2)}]")


def partitioning_json(partitioning: Partitioning) -> dict:
    """What the .om manifest and `--json` carry: partitions, boundaries and fallback reasons."""
    return {
        "target": partitioning.target.name,
        "partitions": [
            {
                "name": p.name, "device": p.device, "nodes": p.node_count(),
                "engines": dict(sorted(_engine_counts(partitioning, p).items())),
                "ops": dict(sorted(p.op_counts().items())),
                "inputs": [{"name": v.name, "bytes": _bytes(v)} for v in p.inputs],
                "outputs": [{"name": v.name, "bytes": _bytes(v)} for v in p.outputs],
            }
            for p in partitioning.partitions
        ],
        # "nodes": the node and those inside its If/Loop/Scan bodies, as the partitions count;
        # "output": its first output's name, which tells apart nodes that have no name
        "fallbacks": [
            {"node": node.name, "op": node.qualified_op,
             "output": next((v.name for v in node.outputs if v is not None), ""),
             "reason": reason, "nodes": sum(1 for _ in _with_nested([node]))}
            for node, reason in partitioning.fallbacks()
        ],
        "layouts": {name: layout.to_json() for name, layout in partitioning.layouts.items()},
    }


def _engine_counts(partitioning: Partitioning, part: Partition) -> Counter:
    # A Constant is data the partition carries; no engine runs it. The nodes inside an
    # If/Loop/Scan body run where it does, and count as the partition's `nodes` count them.
    counts: Counter = Counter()
    for node in part.nodes:
        if not is_constant_node(node):
            counts[partitioning.placements[node].engine or part.device] += sum(
                1 for _ in _with_nested([node]))
    return counts


def _engines(partitioning: Partitioning, part: Partition) -> str:
    counts = _engine_counts(partitioning, part)
    if set(counts) <= {part.device}:
        return "-"
    return ", ".join(f"{engine}={n}" for engine, n in counts.most_common())


def _ops(part: Partition) -> str:
    counts = part.op_counts().most_common()
    shown = ", ".join(f"{op}={n}" for op, n in counts[:_TOP_OPS])
    rest = sum(n for _, n in counts[_TOP_OPS:])
    return f"{shown}, +{rest} more nodes" if rest else shown


def _bytes(value) -> int | None:
    """A value's bytes, None (JSON null) when its shape is dynamic."""
    return None if value.static_shape is None else value_bytes(value)


def _kib(values) -> str:
    """The values' KiB; `?` when a shape is dynamic (its size is unknown, not 0)."""
    if any(v is not None and v.static_shape is None for v in values):
        return "?"
    total = sum(value_bytes(v) for v in values)
    # 16 bytes read "0.0", as if nothing crossed.
    return "<0.1" if 0 < total < 0.05 * 1024 else f"{total / 1024:.1f}"


def _names(names: list[str], shown: int = 2, width: int = 48) -> str:
    short = [n if len(n) <= width else n[:width - 1] + "…" for n in names[:shown]]
    return ", ".join(short) + (f", +{len(names) - shown}" if len(names) > shown else "")


# The passes that make the shapes a model computes from static inputs static (-O2 and up).
_SHAPE_FOLDS = frozenset({"FoldShapes", "FoldConstants"})


def reason_counts(partitioning: Partitioning, shown: int = 3) -> str:
    """The fallback reasons in a few words each, the commonest first, with how many nodes each
    sent to the host: `3 returned by the cost model, 2 no npu kernel for LSTM, Loop`. Ops
    without a kernel are one kind, listed by their counts, so that none hides among the rest;
    so are the ops the profile leaves to the host."""
    kinds: Counter = Counter()
    missing: dict[str, Counter] = {}  # "no npu kernel" -> the ops it was missing for
    for node, reason in partitioning.fallbacks():
        if reason.startswith("returned"):
            kinds["returned by the cost model"] += 1
        elif reason.startswith("dynamic shape"):
            kinds["dynamic shape"] += 1
        elif " profile leaves " in reason:  # `npu profile leaves TopK to the host: …`
            device, _, rest = reason.partition(" profile leaves ")
            kind = f"left to the host by the {device} profile"
            kinds[kind] += 1
            missing.setdefault(kind, Counter())[rest.split(" to the host")[0]] += 1
        elif " kernel for " in reason:
            kind, op = reason.split(" inside ")[0].split(" for ", 1)
            kinds[kind] += 1
            missing.setdefault(kind, Counter())[op] += 1
        elif reason.startswith("dtype "):  # `dtype float64 of %x: MatMul takes …`
            kinds[f"{node.qualified_op} in {reason.split()[1]}"] += 1
        else:  # a dtype, rank or attribute limit: the op's name says more than the value's
            kinds[f"{node.qualified_op} beyond the kernel's limits"] += 1
    parts = [f"{count} {kind}" + (f" for {_op_counts(missing[kind])}" if kind in missing else "")
             for kind, count in kinds.most_common(shown)]
    rest = sum(count for _, count in kinds.most_common()[shown:])
    return ", ".join(parts) + (f", {rest} for other reasons" if rest else "")


def _op_counts(ops: Counter) -> str:
    return ", ".join(op if n == 1 else f"{op} ×{n}" for op, n in ops.most_common())


def returned_note(partitioning: Partitioning) -> str:
    """'' when the cost rule returned no island to the host, else how many nodes it returned,
    and that the primary device runs none of the model when so: the summary's other notes
    name only the nodes that fell back for a reason of their own (an op, a dynamic shape)."""
    returned = sum(1 for _, reason in partitioning.fallbacks() if reason.startswith("returned"))
    if not returned:
        return ""
    target = partitioning.target
    primary = sum(p.node_count() for p in partitioning.partitions if p.device == target.primary)
    where = (f"the {target.primary} runs none of the model" if not primary else
             f"the {target.primary} runs {primary} node(s)")
    return (f"{returned} node(s) returned to the {target.host}, where the cost model found the "
            f"{target.primary} slower on them with their host↔device copies; {where} "
            "(`graphopt partition` lists each island and its figures)")


def dynamic_hint(model, partitioning: Partitioning, log=None) -> str:
    """'' when no node fell back for a dynamic shape, else how many did and the --input-shape
    that pins the model's dynamic inputs (a batch dim shown as 1, others as <name> to fill in),
    and, when the compile's pass log (`log`) shows no shape folding, that -O2 folds them."""
    # One line: it quotes input and dim names, which the model chose (a line break too).
    return one_line(_dynamic_hint(model, partitioning, log))


def _dynamic_hint(model, partitioning: Partitioning, log=None) -> str:
    dynamic = [node for node, reason in partitioning.fallbacks()
               if reason.startswith("dynamic shape")]
    if not dynamic:
        return ""
    host = partitioning.target.host
    inputs = [v for v in model.graph.inputs if not v.is_constant and v.static_shape is None]
    # At -O0/-O1 a shape computed from static inputs (Shape → Gather → Concat → Reshape) stays
    # unknown: pins cannot help there, the folding does.
    unfolded = log is not None and not _SHAPE_FOLDS <= {r.name for r in log.records}
    low, high = ("-O0/-O1", "-O2") if from_command_line() else ("level=0/1", "level=2")
    fold = (f"; the compile left shapes unfolded ({low}, or FoldShapes or FoldConstants off): "
            f"{high}'s shape folding may make them static") if unfolded else ""
    if not inputs:
        if unfolded:
            return (f"{len(dynamic)} node(s) fell back to the {host} for dynamic shapes the "
                    f"model computes{fold}")
        return (f"{len(dynamic)} node(s) fell back to the {host} for dynamic shapes the "
                f"model computes, which {option('input_shapes')} cannot pin")
    named = ", ".join(f"'{v.name}' " + (f"[{_dims(v.shape)}]" if v.shape is not None
                                        else "(rank unknown)") for v in inputs)
    from graphopt.compile_checks import PIN_OPTIONS

    if "dynamic_dims" in PIN_OPTIONS.get():  # a shape profile's compile: its pins are those
        left = sorted({d for v in inputs for d in v.shape or () if isinstance(d, str) and d})
        keys = ", ".join(f"'{d}'" for d in left) or "its open dims (INPUT[AXIS])"
        return (f"{len(dynamic)} node(s) fell back to the {host} for dynamic shapes; the "
                f"profile leaves input(s) {named} open: give {keys} values in "
                f"{option('dynamic_dims')} too" + fold)
    example = ";".join(f"{v.name}:{_example_dims(v.shape)}" for v in inputs if v.shape is not None)
    if not from_command_line():
        return (f"{len(dynamic)} node(s) fell back to the {host} for dynamic shapes; pin the "
                f"dynamic input(s) {named} with input_shapes"
                + (f", e.g. input_shapes={example!r}" if example else "") + fold)
    flag = option("input_shapes")  # graphopt atc's runs say --input_shape
    return (f"{len(dynamic)} node(s) fell back to the {host} for dynamic shapes; pin the "
            f"dynamic input(s) {named} with {flag} NAME:dims"
            + (f', e.g. {flag} "{example}"' if example else "") + fold)


def _dims(shape) -> str:
    """Comma-separated dims, a symbolic one by its name ('?' when it has none)."""
    return ",".join(str(dim) if isinstance(dim, (int, str)) else "?" for dim in shape)


def _example_dims(shape) -> str:
    """Dims for an --input-shape example: numbers kept, a batch dim 1, others `<name>`."""
    def text(dim) -> str:
        if isinstance(dim, int):
            return str(dim)
        name = dim if isinstance(dim, str) else "?"
        return "1" if "batch" in name.lower() else f"<{name}>"
    return ",".join(text(dim) for dim in shape)
