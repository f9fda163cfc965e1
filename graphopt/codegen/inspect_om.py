"""What `graphopt inspect` shows of an .om: header, signature, partitions, routing, pass log,
extras."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import onnx

from graphopt.codegen.feeds import typed_entry
from graphopt.source_marks import (EXTRA_CUT, EXTRA_IO_TYPES, EXTRA_PREPROCESS, cut_text,
                                   extra_cut_outputs, extra_io_types, extra_preprocessing,
                                   io_types_text, preprocessing_text)
from graphopt.codegen.om_manifest import DETAILS_NAME, INDEX_DIMS, INDEX_ROWS, order_label
from graphopt.codegen.om_read import OmArtifact
from graphopt.codegen.profile_match import dims_label
from graphopt.codegen.om_weights import weights_member
from graphopt.errors import ArtifactError, one_line
from graphopt.ir.dtypes import DType, nbytes
from graphopt.table import format_bytes, format_table, natural_key, wrap_to_terminal

_TOP_OPS = 4  # op types shown per partition in the text form; --json has them all
_TOP_NAMES = 3  # tensor names shown per partition input/output cell
_TOP_RULES = 3


# --- counting ------------------------------------------------------------------------------


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _all_nodes(attr.g)
            for sub in attr.graphs:
                yield from _all_nodes(sub)


def weight_tensors(graph: onnx.GraphProto, nested: bool = False
                   ) -> Iterator[tuple[onnx.TensorProto, bool, bool]]:
    """(tensor, from a Constant node, inside an If/Loop/Scan body) for every weight `graph`
    holds: its initializers (a sparse one's values) and its Constant nodes' tensors, nested
    graphs included. An export may keep all of its weights in branches (silero-vad's 2.1 MiB
    in If branches, as initializers or as Constant nodes): the top level alone showed 8 B."""
    for init in graph.initializer:
        yield init, False, nested
    for sparse in graph.sparse_initializer:
        yield sparse.values, False, nested
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                if attr.HasField("t"):
                    yield attr.t, True, nested
                elif attr.HasField("sparse_tensor"):
                    yield attr.sparse_tensor.values, True, nested
            if attr.HasField("g"):
                yield from weight_tensors(attr.g, True)
            for sub in attr.graphs:
                yield from weight_tensors(sub, True)


def op_counts(model: onnx.ModelProto) -> Counter:
    """Nodes per op type, nested graphs included; `domain::Op` outside the default domain (as
    `graphopt optimize`'s summary names them)."""
    return Counter(
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        for node in _all_nodes(model.graph)
    )


def format_ops(counts: Counter, top: int = _TOP_OPS) -> str:
    """`Conv=2, Relu=2, Gemm=1, +3 more nodes` (the most frequent first, ties by name), as
    `graphopt partition` counts the rest: a bare +3 read as more op types."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{op}={n}" for op, n in ranked[:top])
    rest = sum(n for _, n in ranked[top:])
    return f"{shown}, +{rest} more nodes" if rest else shown or "-"


def format_shape(shape: list | None) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def signature_cells(entry: dict) -> list[str]:
    """The dtype and shape cells of a signature entry; for a value that is not a tensor its
    type (`seq(float32)`) and the shape of the tensor it holds (`[2] each` in a sequence)."""
    if not entry.get("type"):
        return [entry["dtype"] or "?", format_shape(entry["shape"])]
    element = entry.get("element")
    if element is None:
        return [entry["type"], "-"]
    each = " each" if entry["type"].startswith("seq(") else ""
    return [entry["type"], format_shape(element["shape"]) + each]


def typed_signature(artifact: OmArtifact, entries: list[dict]) -> list[dict]:
    """The manifest's signature entries, those without a dtype (sequences, maps, optionals)
    typed from the partition models that take or return them."""
    untyped = {e["name"] for e in entries if e["dtype"] is None}
    found = {}
    for part in artifact.partitions if untyped else ():
        for info in (*part.model.graph.input, *part.model.graph.output):
            if info.name in untyped:
                found.setdefault(info.name, typed_entry(info))
    return [found.get(e["name"], e) for e in entries]


def _session_cell(entry: dict) -> str:
    """How the runtime sets up a partition's onnxruntime session: the graph optimization level
    its compile recorded ("all" when none), the optimizers it must skip, and whether it
    pre-packs weights."""
    cell = entry.get("optimization_level", "all")
    disabled = entry.get("disabled_optimizers")
    cell += f" without {', '.join(disabled)}" if disabled else ""
    return cell + ("" if entry.get("prepack_weights", True) else ", unpacked weights")


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_TOP_NAMES])
    more = len(names) - _TOP_NAMES
    return f"{shown}, +{more}" if more > 0 else shown or "-"


# --- the pass log --------------------------------------------------------------------------


def pass_totals(pass_log: list) -> dict[str, dict]:
    """Per pass, in first-run order: runs and rewrites by rule. The log is free-form, so entries
    without a "pass" name, or rewrites that are not counts, are tolerated rather than trusted."""
    totals: dict[str, dict] = {}
    for entry in pass_log:
        name = entry.get("pass") if isinstance(entry, dict) else None
        name = name if isinstance(name, str) else "(unnamed)"
        total = totals.setdefault(name, {"runs": 0, "rewrites": Counter()})
        total["runs"] += 1
        rewrites = entry.get("rewrites") if isinstance(entry, dict) else None
        if isinstance(rewrites, dict):
            total["rewrites"].update({str(rule): n for rule, n in rewrites.items()
                                      if isinstance(n, int) and not isinstance(n, bool)})
    return totals


def winograd_rewrites(pass_log: list) -> int:
    """How many convs the compile rewrote as Winograd (-O3 WinogradConv), whose results differ
    from the direct conv's in the last bits."""
    return sum(pass_totals(pass_log).get("WinogradConv", {"rewrites": Counter()})["rewrites"]
               .values())


def _node_change(pass_log: list) -> str | None:
    counts = [e for e in pass_log if isinstance(e, dict)
              and isinstance(e.get("nodes_before"), int) and isinstance(e.get("nodes_after"), int)]
    if not counts:
        return None
    before, after = counts[0]["nodes_before"], counts[-1]["nodes_after"]
    return f"nodes {before} -> {after} ({after - before:+d})"


def _format_pass_log(pass_log: list) -> str:
    totals = pass_totals(pass_log)
    if not totals:
        return "pass log: empty (compiled without passes, or written directly)"
    rows = []
    for name, total in totals.items():
        ranked = total["rewrites"].most_common()
        by_rule = ", ".join(f"{rule}={n}" for rule, n in ranked[:_TOP_RULES])
        if len(ranked) > _TOP_RULES:
            by_rule += f", +{len(ranked) - _TOP_RULES} more"
        rows.append([name, total["runs"], sum(total["rewrites"].values()), by_rule])
    runs = sum(t["runs"] for t in totals.values())
    title = f"pass log: {runs} run(s) of {len(totals)} pass(es)"
    change = _node_change(pass_log)
    if change:
        title += f", {change}"
    return format_table(["pass", "runs", "rewrites", "by rule"], rows, title=title)


# --- the artifact --------------------------------------------------------------------------


def _extra_line(name: str, value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"  {name}: {len(value)} entries"
    text = repr(value) if isinstance(value, str) else str(value)
    return f"  {name}: {text if len(text) <= 60 else text[:57] + '...'}"


def weight_bytes_by_dtype(artifact: OmArtifact) -> Counter:
    """Bytes of the partitions' weights per element type (`f32`, `i8`, `u4`…): initializers
    and Constant nodes' tensors, in If/Loop/Scan bodies too, read from their declared dims (no
    weight data is read). Shape profiles share the weights of their main graphs, which point
    into one blob, and are counted once; a body's weights are stored inline in each profile's
    partition, and counted as often as they are stored."""
    totals: Counter = Counter()
    seen: set[tuple] = set()
    for name, model in artifact.models.items():
        for index, (init, _, _) in enumerate(weight_tensors(model.graph)):
            # A profile's partitions (`profile1.p0_cpu`) point into the default's blob.
            where = {e.key: e.value for e in init.external_data}
            key = ((where.get("location"), where.get("offset")) if "location" in where
                   else (name, index))
            if key in seen:
                continue
            seen.add(key)
            dtype = DType(init.data_type)
            count = 1
            for d in init.dims:
                count *= d
            totals[dtype.short] += nbytes(dtype, count)
    return totals


def precision_line(artifact: OmArtifact) -> str:
    """The lossy precision passes the .om went through and its weights by element type:
    `QuantizeInt8 (lossy); weights i8 22.9 MiB, f32 112.0 KiB`."""
    from graphopt.tools.accuracy_rule import lossy_passes, pass_log_of_om

    lossy = lossy_passes(pass_log_of_om(artifact))
    mode = artifact.extra.get("precision_mode")
    names = [f"{name} {mode}" if name == "ConvertPrecision" and isinstance(mode, str) else name
             for name in lossy]
    head = f"{' and '.join(names)} (lossy)" if lossy else "as the source (no lossy precision pass)"
    weights = weight_bytes_by_dtype(artifact)
    if not weights:
        return head
    ranked = sorted(weights.items(), key=lambda item: -item[1])
    return head + "; weights " + ", ".join(f"{dtype} {format_bytes(n)}" for dtype, n in ranked)


def partition_size(members: dict, member: str, partition: str) -> str:
    """The model's bytes, and its weights blob's when it has one."""
    size = format_bytes(members[member]["size"])
    blob = members.get(weights_member(partition))
    return size if blob is None else f"{size} + {format_bytes(blob['size'])} weights"


def by_partition(entries: dict) -> list[tuple]:
    """A dict keyed by partition name, in execution order: p2 before p10 (the manifest's
    sorted keys put p10 first)."""
    return sorted(entries.items(), key=lambda item: natural_key(item[0]))


def _format_memory(plans: dict) -> str:
    """One row per partition: its work memory beside the lower bound, and the other pools."""
    rows, unplanned = [], []
    for name, plan in by_partition(plans):
        if isinstance(plan, dict) and isinstance(plan.get("not_counted"), str):
            unplanned.append(f"{name}: {plan['not_counted']}")  # control-flow bodies
        if not isinstance(plan, dict) or "arena_bytes" not in plan:
            # A sentence, under the table: in a cell it widened the whole table.
            reason = plan.get("unplanned", "?") if isinstance(plan, dict) else "?"
            rows.append([name, "-", "-", "-", "not planned (below)", "", "", ""])
            unplanned.append(f"{name}: {reason}")
            continue
        if plan.get("sizes") == "device formats":  # an NPU partition (plan.py)
            copies = plan.get("transdata_copies")
            unplanned.append(f"{name}: sized as the device stores its tensors (blocked formats "
                             f"padded; {copies if isinstance(copies, int) else '?'} TransData "
                             "copies, named T@FORMAT)")
        bound = plan.get("lower_bound") or 0
        ratio = f"{plan['arena_bytes'] / bound:.3f}" if bound else "-"
        # Nothing to place (every tensor an input, output or weight): no strategy or order
        # chose anything, as the compile's summary says.
        idle = not plan.get("tensors")
        rows.append([name, format_bytes(plan["arena_bytes"]), format_bytes(bound), ratio,
                     "no work memory" if idle else plan.get("strategy", "?"),
                     "-" if idle else order_label(plan),
                     format_bytes(plan.get("weight_bytes", 0)),
                     format_bytes(plan.get("input_bytes", 0) + plan.get("output_bytes", 0))])
    table = format_table(["partition", "work memory", "lower bound", "×", "strategy", "order",
                          "weights", "inputs+outputs"], rows, title="memory plan")
    return "\n".join([table, *(wrap_to_terminal(line, "  ") for line in unplanned)])


def _format_kernels(info: dict, profile: str = "") -> str:
    """One row per NPU partition: its kernels, how many are cube kernels with a tiling."""
    rows = []
    for name, records in by_partition(info.get("partitions") or {}):
        records = records if isinstance(records, list) else []
        tiled = [r for r in records if isinstance(r, dict) and "tiling" in r]
        sources = sorted({r.get("tiling_source", "?") for r in tiled}) or ["-"]
        total = sum(r.get("estimate_us", 0) for r in records if isinstance(r, dict))
        int8 = sum(r.get("dtype") == "int8" for r in tiled)  # older artifacts record no dtype
        cube = f"{len(tiled)} ({int8} int8)" if int8 else len(tiled)
        rows.append([name, len(records), cube, ", ".join(sources), f"{total:.1f}"])
    of = f" of {profile}" if profile else ""
    title = (f"kernel configs{of} (estimates; whole model {info.get('estimate_us', 0):.1f} µs "
             "with transfers)")
    return format_table(["partition", "kernels", "cube tilings", "tiling source", "µs"], rows,
                        title=title)


_REASONS_SHOWN = 10  # the most frequent fallback reasons inspect lists


def nested_count(fallbacks: list) -> str:
    """' (N with the nodes inside their subgraphs…)' where the record's fallbacks hold If, Loop
    or Scan nodes whose bodies the partition table counts; else ''."""
    nested = sum(f["nodes"] if isinstance(f, dict) and isinstance(f.get("nodes"), int) else 1
                 for f in fallbacks)
    return (f" ({nested} with the nodes inside their subgraphs, as the partition table counts "
            "them)" if nested != len(fallbacks) else "")


def _format_fallbacks(info: dict, scope: str = "") -> str:
    """The placement's fallbacks by reason; `scope` names the shape profile(s) it is of."""
    fallbacks = info.get("fallbacks") or []
    of = f" of {scope}" if scope else ""
    if not fallbacks:
        parts = [p for p in info.get("partitions") or [] if isinstance(p, dict)]
        if parts and not any(p.get("nodes") for p in parts):  # a model of its inputs alone
            return f"placement{of}: no node to place (the model passes its inputs through)"
        devices = {p.get("device") for p in parts}
        device = devices.pop() if len(devices) == 1 else "the primary device"
        return (f"placement{of}: every node on {device}, the primary device of target "
                f"{info.get('target', '?')}")
    reasons: dict[str, int] = {}
    for entry in fallbacks:
        reasons[entry.get("reason", "?")] = reasons.get(entry.get("reason", "?"), 0) + 1
    ranked = sorted(reasons.items(), key=lambda r: -r[1])
    table = format_table(["reason", "nodes"], [list(row) for row in ranked[:_REASONS_SHOWN]],
                         title=f"placement{of}: {len(fallbacks)} node(s) fell back to the host"
                         + nested_count(fallbacks))
    hidden = len(ranked) - _REASONS_SHOWN
    return table + (f"\n… and {hidden} more reason(s) (--json lists every node's)"
                    if hidden > 0 else "")


def _format_placements(artifact: OmArtifact, default: dict) -> list[str]:
    """The placement of each shape profile (one table when they all place alike), or the
    artifact's own."""
    sections = profile_sections(artifact, "partitioning")
    if not sections or not all(isinstance(info, dict) for info in sections.values()):
        return [_format_fallbacks(default)]
    tables = {name: _format_fallbacks(info) for name, info in sections.items()}
    if len(set(tables.values())) == 1:
        return [_format_fallbacks(default, "every shape profile")]
    return [_format_fallbacks(info, name) for name, info in sections.items()]


def profile_memory_plans(artifact: OmArtifact) -> list[tuple[str | None, dict]]:
    """(profile name, its partitions' memory plans) per shape profile, default first; one
    (None, plans) pair for an artifact without profiles. Plans missing or malformed: {}."""
    if not artifact.profiles:
        plans = artifact.extra.get("memory_plan")
        return [(None, plans if isinstance(plans, dict) else {})]
    sections = artifact.extra.get("profiles")
    sections = sections if isinstance(sections, dict) else {}
    pairs = []
    for profile in artifact.profiles:
        section = sections.get(profile["name"])
        plans = section.get("memory_plan") if isinstance(section, dict) else None
        pairs.append((profile["name"], plans if isinstance(plans, dict) else {}))
    return pairs


def work_bytes(plans: dict) -> int | None:
    """The work memory of a profile's partitions together; None if any is not planned."""
    arenas = [p.get("arena_bytes") if isinstance(p, dict) else None for p in plans.values()]
    return sum(arenas) if arenas and all(isinstance(a, int) for a in arenas) else None


def profile_rows(artifact: OmArtifact) -> list[dict]:
    """Per shape profile: name, dims and inputs labels, partition count and devices, nodes,
    and work memory in bytes (None when not planned)."""
    by_name = {p["name"]: p for p in artifact.manifest["partitions"]}
    plans = dict(profile_memory_plans(artifact))
    rows = []
    for profile in artifact.profiles:
        order = profile["execution_order"]
        rows.append({
            "name": profile["name"], "dims": dims_label(profile["dims"]),
            "inputs": "; ".join(f"{e['name']}{format_shape(e['shape'])}"
                                for e in profile["inputs"]),
            "partitions": len(order),
            "devices": list(dict.fromkeys(by_name[name]["device"] for name in order
                                          if name in by_name)),  # in execution order
            "nodes": sum(sum(op_counts(artifact.models[name]).values()) for name in order
                         if name in artifact.models),
            "work_bytes": work_bytes(plans[profile["name"]])})
    return rows


def largest_index(sizes: list[int | None]) -> int | None:
    """Where the one largest of several sizes is, when all are known and it is above every
    other; None otherwise. Buffers are sized by the profile it marks, and a tie (every profile
    0 B, say) has no one largest."""
    if len(sizes) < 2 or None in sizes or sizes.count(max(sizes)) > 1:
        return None
    return sizes.index(max(sizes))


def largest_profile(rows: list[dict]) -> str | None:
    """The profile needing the most work memory, when there are several, all are planned and
    one needs more than every other."""
    index = largest_index([r["work_bytes"] for r in rows])
    return None if index is None else rows[index]["name"]


PROFILE_HEADERS = ["profile", "dims", "inputs", "partitions", "nodes", "work memory"]


def profile_cells(rows: list[dict], mark_default: bool = False) -> list[list]:
    """profile_rows as table cells under PROFILE_HEADERS, the largest work memory marked (and
    the default profile, the first, when `mark_default`)."""
    largest = largest_profile(rows)
    return [[r["name"] + (" (default)" if mark_default and i == 0 else ""), r["dims"],
             r["inputs"], f"{r['partitions']} ({', '.join(r['devices'])})", r["nodes"],
             ("-" if r["work_bytes"] is None else format_bytes(r["work_bytes"]))
             + (" (largest)" if r["name"] == largest else "")]
            for i, r in enumerate(rows)]


def profile_views(artifact: OmArtifact) -> list[OmArtifact]:
    """The artifact as each shape profile sees it, default first; the artifact alone without."""
    return [artifact.profile(p["name"]) for p in artifact.profiles] or [artifact]


def _format_profiles(artifact: OmArtifact) -> str:
    """One row per shape profile: the sizes it pins, its inputs, partitions and memory."""
    rows = profile_rows(artifact)
    table = format_table(PROFILE_HEADERS, profile_cells(rows),
                         title=f"shape profiles ({len(rows)}; a run takes the one its input "
                               "shapes match, the first is the default)")
    return "\n".join([table] + [wrap_to_terminal(f"work memory: {note}", "  ")
                                for note in uncounted_notes(profile_memory_plans(artifact))])


def uncounted_notes(profile_plans: list[tuple[str, dict]]) -> list[str]:
    """The plans' notes on memory they leave out (control-flow bodies), each once."""
    notes = [plan.get("not_counted") for _, plans in profile_plans for plan in plans.values()
             if isinstance(plan, dict)]
    return list(dict.fromkeys(note for note in notes if isinstance(note, str)))


def profile_kernel_configs(artifact: OmArtifact) -> list[tuple[str | None, dict]]:
    """(profile name, its kernel configs) for every shape profile with NPU kernels, default
    first; (None, configs) for an artifact without profiles that has some; [] when none."""
    if artifact.profiles:
        sections = artifact.extra.get("profiles")
        sections = sections if isinstance(sections, dict) else {}
        found = [(p["name"], (sections.get(p["name"]) or {}).get("kernels"))
                 for p in artifact.profiles]
    else:
        found = [(None, artifact.extra.get("kernels"))]
    return [(name, info) for name, info in found
            if isinstance(info, dict) and info.get("partitions")]


def profile_sections(artifact: OmArtifact, key: str) -> dict:
    """profile name -> what its section of the extras holds under `key` (None where absent),
    for an artifact of several shape profiles; empty otherwise."""
    sections = artifact.extra.get("profiles")
    if len(artifact.profiles) < 2 or not isinstance(sections, dict):
        return {}
    return {p["name"]: (sections.get(p["name"]) or {}).get(key) for p in artifact.profiles}


def describe_om(artifact: OmArtifact, nodes: bool = False) -> dict:
    """`graphopt inspect --json`: the manifest with the details member's pass log and extras
    in it, plus each partition's node and op counts (and, with `nodes`, its nodes)."""
    from graphopt.codegen.inspect_nodes import node_records

    partitions = []
    for part in (part for view in profile_views(artifact) for part in view.partitions):
        counts = op_counts(part.model)
        partitions.append({"name": part.name, "nodes": sum(counts.values()),
                           "ops": dict(sorted(counts.items())),
                           **({"graph": node_records(part.model.graph)} if nodes else {})})
    return {"file": artifact.path, "checksums_verified": True,
            "manifest": {**artifact.manifest, **artifact.details}, "partition_ops": partitions}


def partition_graphs(artifact: OmArtifact) -> list[tuple[str, onnx.GraphProto]]:
    """(title, graph) of every partition in execution order, each shape profile's in turn,
    the title naming the profile where there are several."""
    if len(artifact.profiles) < 2:
        return [(part.name, part.model.graph) for part in artifact.partitions]
    return [(f"{part.name} (profile {entry['name']})", part.model.graph)
            for entry in artifact.profiles for part in artifact.profile(entry["name"]).partitions]


def target_line(artifact: OmArtifact) -> str:
    """The target's name, and the profile file of a custom one (whose name may be a
    built-in's)."""
    name, profile_file = one_line(artifact.manifest["target"]), artifact.extra.get("target_file")
    if not isinstance(profile_file, str):
        return name  # escaped: a hand-edited manifest may hold a line break there
    from graphopt.partition.target import builtin_targets

    clash = ", not the built-in of that name" if name in builtin_targets() else ""
    return f"{name} (profile file {one_line(profile_file)}{clash})"


def source_edit_lines(cut, preprocess, io=None) -> list[tuple[str, str]]:
    """The header lines of what the compile edited of its source, from what the model
    records (source_marks' readers of an .om's extra or an .onnx's metadata)."""
    lines = []
    if cut:
        lines.append(("cut", one_line(cut_text(cut))))
    if preprocess:
        lines.append(("preprocess", one_line(preprocessing_text(preprocess))))
    if io and (io["inputs"] or io["outputs"]):
        lines.append(("io types", one_line(io_types_text(io))))
    return lines


def format_om(artifact: OmArtifact) -> str:
    """The artifact for a person: what it was built from and for, what it takes and returns,
    what runs where and in which order, and what the compiler did. The extras (memory plans,
    kernel configs, placements, profiles) are data no run reads, checked only by their sum: an
    entry of the wrong type in them (a hand-edited artifact whose sums were refreshed) is an
    ArtifactError naming it, not an internal error of the formatting."""
    with unreadable_extras(artifact):
        return _format_om(artifact)


@contextlib.contextmanager
def unreadable_extras(artifact: OmArtifact) -> Iterator[None]:
    """Turn a formatting error over the artifact's extras into an ArtifactError that names
    where they are stored (GRAPHOPT_DEBUG=1 keeps the error as it was, with its traceback)."""
    try:
        yield
    except (TypeError, AttributeError, ValueError, KeyError, IndexError) as exc:
        if os.environ.get("GRAPHOPT_DEBUG"):
            raise
        where = DETAILS_NAME if artifact.manifest.get("details") == DETAILS_NAME \
            else "the manifest's extra"
        raise ArtifactError(f"{artifact.path}: {where} holds an entry graphopt cannot read "
                            f"({type(exc).__name__}: {one_line(str(exc))}); `graphopt inspect "
                            "--json` shows it as stored") from None


def _format_om(artifact: OmArtifact) -> str:
    m = artifact.manifest
    members = m["members"]
    source = m["source"]
    header = [
        ("format", one_line(f"{m['format']} {m['format_version']}, written by "
                            f"{m['created_by']} {m['graphopt_version']}")),
        ("source", f"{one_line(source['path']) if source['path'] else '(not recorded)'}"
                   + (f"  sha256 {source['sha256']}" if source["sha256"] else "")),
        *source_edit_lines(extra_cut_outputs(artifact.extra),
                           extra_preprocessing(artifact.extra), extra_io_types(artifact.extra)),
        ("target", target_line(artifact)),
        ("precision", precision_line(artifact)),
        ("members", (f"{len(members)} verified against the manifest's sha256 and size "
                     f"({format_bytes(sum(i['size'] for i in members.values()))})")),
    ]
    width = max(len(key) for key, _ in header)
    # A long value (a path and its sha256) wraps under its own column on a terminal.
    parts = [f"{one_line(artifact.path)}\n"
             + "\n".join(wrap_to_terminal(f"  {key.ljust(width)}  {value}", " " * (width + 2))
                         for key, value in header)]

    signature = [[direction, e["name"], *signature_cells(e)]
                 for direction, entries in (("input", m["inputs"]), ("output", m["outputs"]))
                 for e in typed_signature(artifact, entries)]
    columns = ["role", "tensor", "dtype", "shape"]
    if any(INDEX_ROWS in e or INDEX_DIMS in e for e in m["inputs"]):  # checked by the runtime
        columns.append("bounds")
        by_name = {e["name"]: e for e in m["inputs"]}
        for row in signature:
            entry = by_name.get(row[1], {}) if row[0] == "input" else {}
            rows = entry.get(INDEX_ROWS)
            cell = [f"ids {-rows} to {rows - 1}"] if rows else []
            cell += [f"dim {axis} ≤ {limit}" for axis, limit in entry.get(INDEX_DIMS, ())]
            row.append(", ".join(cell))
    parts.append(format_table(columns, signature, title="signature", names={1}))

    if artifact.profiles:
        parts.append(_format_profiles(artifact))

    by_name = {p["name"]: p for p in m["partitions"]}
    with_providers = any("providers" in p for p in m["partitions"])
    with_session = any(key in p for p in m["partitions"]
                       for key in ("optimization_level", "disabled_optimizers", "prepack_weights"))
    rows = []
    for index, part in enumerate(artifact.partitions):
        counts = op_counts(part.model)
        entry = by_name[part.name]
        row = [index, part.name, part.device]
        if with_providers:
            row.append(", ".join(entry.get("providers", [])) or "-")
        if with_session:
            row.append(_session_cell(entry))
        row += [sum(counts.values()), format_ops(counts), _names(part.inputs), _names(part.outputs),
                partition_size(members, entry["member"], part.name)]
        rows.append(row)
    headers = ["#", "partition", "device"] + (["providers"] if with_providers else [])
    headers += ["session"] if with_session else []
    headers += ["nodes", "ops", "inputs", "outputs", "size"]
    default = f" of the default profile {artifact.profiles[0]['name']}" if artifact.profiles else ""
    parts.append(format_table(headers, rows, title=f"partitions{default} ({len(rows)}, in "
                                                   "execution order)"))

    routing = [[e["tensor"], e["from"] or "(caller)", e["to"] or "(caller)"] for e in m["routing"]]
    parts.append(format_table(["tensor", "from", "to"], routing, title=f"routing{default}",
                              names={0}))

    parts.append(_format_pass_log(artifact.pass_log))

    extra = dict(artifact.extra)
    for shown_above in (EXTRA_CUT, EXTRA_PREPROCESS, EXTRA_IO_TYPES, "precision_mode"):  # above
        extra.pop(shown_above, None)
    # Each profile's own shapes, tilings and estimates, when there are several.
    kernels = dict(profile_kernel_configs(artifact)) if len(artifact.profiles) > 1 else {}
    if artifact.profiles:
        extra.pop("profiles", None)  # in the profiles table
    plans = extra.get("memory_plan")
    if artifact.profiles:  # the extras' plans are the default profile's: show every profile's
        plans = {name: plan for _, section in profile_memory_plans(artifact)
                 for name, plan in section.items()}
    if isinstance(plans, dict) and plans and all(isinstance(p, dict) for p in plans.values()):
        extra.pop("memory_plan", None)
        parts.append(_format_memory(plans))
    if isinstance(extra.get("partitioning"), dict):
        parts += _format_placements(artifact, extra.pop("partitioning"))
    if kernels:  # each profile's own shapes, tilings and estimates
        extra.pop("kernels", None)
        parts += [_format_kernels(info, profile) for profile, info in kernels.items()]
        without = [p["name"] for p in artifact.profiles if p["name"] not in kernels]
        if without:
            parts.append(f"kernel configs: none in {', '.join(without)}, which run(s) "
                         "every node on the host")
    elif isinstance(extra.get("kernels"), dict):
        parts.append(_format_kernels(extra.pop("kernels")))
    if extra:
        parts.append("extra\n" + "\n".join(_extra_line(k, v) for k, v in sorted(extra.items())))
    elif not artifact.extra:
        parts.append("extra: none")
    shown = {p["member"] for p in m["partitions"]} | {DETAILS_NAME}  # the pass log and extras
    others = sorted(set(members) - shown, key=natural_key)  # p2 before p10
    if others:
        parts.append("other members\n" + "\n".join(
            f"  {one_line(name)}  {format_bytes(members[name]['size'])}" for name in others))
    return "\n\n".join(parts)
