"""`render_report`: the report's one self-contained HTML page (inline CSS and SVG, no scripts,
no network), each section saying what is missing and how to get it."""

from __future__ import annotations

import datetime
from collections import Counter

from graphopt.codegen.inspect_om import (PROFILE_HEADERS, by_partition, format_bytes, format_ops,
                                         largest_profile, nested_count, partition_size,
                                         precision_line,
                                         profile_cells, profile_kernel_configs,
                                         profile_memory_plans, profile_rows, profile_sections,
                                         profile_views, signature_cells, source_edit_lines,
                                         typed_signature)
from graphopt.codegen.om_manifest import order_label
from graphopt.markup import escape
from graphopt.source_marks import extra_cut_outputs, extra_io_types, extra_preprocessing
from graphopt.tools.report_data import ReportData, Tuning, pass_rows
from graphopt.tools.report_graph import graph_svg, partition_colours
from graphopt.tools.report_plan import plan_svg

SECTIONS = [("summary", "Summary"), ("partitions", "Partitions"), ("graph", "Graph"),
            ("passes", "Passes"), ("memory", "Memory plan"), ("placement", "Placement"),
            ("kernels", "Kernel configs"), ("tuning", "Tuning history"),
            ("accuracy", "Accuracy")]
MAX_FALLBACK_ROWS = 100
OPEN_KERNEL_ROWS = 30  # the per-kernel table starts folded above this many rows

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:6px 24px;z-index:1}
nav a{margin-right:14px;text-decoration:none;color:#2060a0}
table{border-collapse:collapse;margin:6px 0 10px;background:#fff}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.kv th{width:160px}code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.missing{background:#fff8e1;border:1px solid #f0d48a;padding:8px 12px;border-radius:4px}
.fail{color:#b00020;font-weight:bold}.pass{color:#1b7f3b;font-weight:bold}
.scroll{overflow:auto;max-height:900px;border:1px solid #ddd;background:#fff}
.wide{overflow-x:auto;max-width:100%}.wide table{margin-right:2px}
.plot svg{max-width:100%;height:auto;border:1px solid #ddd}
.entry{white-space:nowrap;margin-right:12px}
.swatch{display:inline-block;width:12px;height:12px;border:1px solid #333;margin-right:4px;vertical-align:-1px}
.note{color:#555;font-size:13px}
@media print{.scroll,.wide{max-height:none;overflow:visible}nav{position:static}}
"""


# --- small builders ------------------------------------------------------------------------


def table(headers: list[str], rows: list[list], numeric: set[int] = frozenset(),
          raw: set[int] = frozenset()) -> str:
    """An HTML table; columns in `numeric` are right-aligned, those in `raw` already HTML. It
    scrolls sideways on its own when wider than the page."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = "" if value is None else str(value)
            align = ' class="n"' if i in numeric else ""
            cells.append(f"<td{align}>{text if i in raw else escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="wide"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _kv(pairs: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in pairs)
    return f'<table class="kv">{rows}</table>'


def missing(what: str, how: str) -> str:
    return f'<p class="missing"><b>{escape(what)}</b> {how}</p>'


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{escape(title)}</h2>\n{body}\n</section>'


def _us(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e6:.2f}"


# --- sections ------------------------------------------------------------------------------


def _signature_entry(entry: dict) -> str:
    """`name float32[1,3]`, or `name seq(map(int64,float32))` for a value that is no tensor
    (as inspect shows them)."""
    kind, shape = signature_cells(entry)
    if not entry.get("type"):
        return f"{entry['name']} {kind}{shape}"
    return f"{entry['name']} {kind}" + ("" if shape == "-" else f" ({shape})")


def _summary(data: ReportData) -> str:
    m = data.manifest
    source = m["source"]
    parts = data.artifact.partitions
    devices = Counter(p.device for p in parts)
    fallbacks = (data.artifact.extra.get("partitioning") or {}).get("fallbacks") or []
    source_text = escape(source["path"] or "(not recorded)")
    if data.source_file:
        source_text += f' <span class="note">(found at {escape(data.source_file)})</span>'
    pairs = [
        ("artifact", f"<code>{escape(data.artifact.path)}</code>"),
        ("artifact sha256", f"<code>{data.om_sha256}</code>"),
        ("model source", source_text),
        ("source sha256", f"<code>{escape(source['sha256'] or '(not recorded)')}</code>"),
        *[(key, escape(text)) for key, text in source_edit_lines(
            extra_cut_outputs(data.artifact.extra), extra_preprocessing(data.artifact.extra),
            extra_io_types(data.artifact.extra))],
        ("target", f"<b>{escape(m['target'])}</b>"),
        ("precision", escape(precision_line(data.artifact))),
        ("written by", escape(f"{m['created_by']} {m['graphopt_version']} "
                              f"({m['format']} format {m['format_version']})")),
        ("compiled", ("not recorded in the .om (its bytes are reproducible, so it holds no "
                      f"date); the file was last modified {escape(data.modified)}")),
        ("partitions", escape(_partition_line(data.artifact, parts, devices, fallbacks))),
        ("signature", escape(" → ".join(
            "; ".join(_signature_entry(e) for e in typed_signature(data.artifact, m[side]))
            for side in ("inputs", "outputs")))),
        *([("shape profiles", escape(
            f"{len(data.artifact.profiles)}, a run takes the one its input shapes match (table "
            f"below); the graph shows the default, {data.artifact.profiles[0]['name']}"))]
          if data.artifact.profiles else []),
        ("report written", datetime.datetime.now(datetime.timezone.utc)
         .strftime("%Y-%m-%d %H:%M:%S UTC")),
    ]
    return _kv(pairs) + _profiles(data)


def _partition_line(artifact, parts, devices: Counter, fallbacks: list) -> str:
    """How many partitions run where, and how many nodes fell back; of each shape profile when
    the artifact has several."""
    line = (f"{len(parts)}: " + ", ".join(f"{n} on {d}" for d, n in devices.items())
            + f"; {len(fallbacks)} node(s) fell back to the host{nested_count(fallbacks)}")
    placements = profile_sections(artifact, "partitioning")
    if not placements:
        return line
    entries = []
    for profile, view in zip(artifact.profiles, profile_views(artifact)):
        name = profile["name"]
        own = Counter(p.device for p in view.partitions)
        placed = placements[name] if isinstance(placements[name], dict) else {}
        entries.append(f"{name} {len(view.partitions)} (" + ", ".join(
            f"{n} on {d}" for d, n in own.items()) + f"; {len(placed.get('fallbacks') or [])} "
            "fell back)")
    return "; ".join(entries)


def _profiles(data: ReportData) -> str:
    """One row per shape profile, the one needing the most work memory marked."""
    rows = profile_rows(data.artifact)
    if not rows:
        return ""
    return "<h3>shape profiles</h3>" + table(
        PROFILE_HEADERS, profile_cells(rows, mark_default=True), numeric={4, 5})


def _partitions(data: ReportData) -> str:
    m = data.manifest
    colours = partition_colours(data.graph.partitions)
    by_name = {p["name"]: p for p in m["partitions"]}
    ops = {p["name"]: p for p in data.partition_ops}
    rows = []
    for view in profile_views(data.artifact):
        for i, part in enumerate(view.partitions):
            entry = by_name[part.name]
            member = m["members"][entry["member"]]
            colour = colours.get(part.name)  # the graph draws the default profile's only
            swatch = (f'<span class="swatch" style="background:{colour}"></span>'
                      if colour else "")
            rows.append([i, swatch + escape(part.name), part.device,
                         ", ".join(entry.get("providers", [])) or "-", ops[part.name]["nodes"],
                         format_ops(Counter(ops[part.name]["ops"]), top=6),
                         ", ".join(part.inputs), ", ".join(part.outputs),
                         partition_size(m["members"], entry["member"], part.name),
                         member["sha256"][:12]])
    body = table(["#", "partition", "device", "providers", "nodes", "ops", "inputs", "outputs",
                  "size", "sha256"], rows, numeric={0, 4, 8}, raw={1})
    if data.artifact.profiles:
        body += ('<p class="note">Shape profiles share one copy of the weights they have in '
                 "common: a weights blob is counted with the partition that stores it, which "
                 "the others' read.</p>")
    routing = [[e["tensor"], e["from"] or "(caller)", e["to"] or "(caller)"] for e in m["routing"]]
    default = f" of the default profile {data.artifact.profiles[0]['name']}" \
        if data.artifact.profiles else ""
    body += f"<details><summary>routing{default} ({len(routing)} edges)</summary>"
    body += table(["tensor", "from", "to"], routing) + "</details>"
    return body


def _graph(data: ReportData) -> str:
    svg, notes = graph_svg(data.graph)
    colours = partition_colours(data.graph.partitions)
    # Each swatch and its label on one line: a long legend wraps between entries only.
    legend = " ".join(f'<span class="entry"><span class="swatch" style="background:'
                      f'{colours[name]}"></span>{escape(name)} ({escape(device)})</span>'
                      for name, device in data.graph.partitions)
    text = ("Data flows top to bottom. Hover a box for its op, name, tensor shapes and "
            "partition; red dashed edges carry a tensor from one partition to another "
            "(a host↔device copy). Weights are not drawn")
    casts = data.graph.weight_casts
    text += (f", nor the {casts} DequantizeLinear/QuantizeLinear node(s) that only convert a "
             "weight (a box's tooltip lists it among the inputs)." if casts else ".")
    notes_html = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    return (f'<p>{legend}</p><p class="note">{escape(text)}</p>{notes_html}'
            f'<div class="scroll">{svg}</div>')


def _passes(data: ReportData) -> str:
    log = data.artifact.pass_log
    rows = pass_rows(log)
    if not rows:
        return missing("The pass log is empty:", "the .om was written without running passes "
                       "(compile it with <code>graphopt optimize MODEL.onnx -o MODEL.om</code>).")
    counted = [e for e in log if isinstance(e, dict) and isinstance(e.get("nodes_before"), int)
               and isinstance(e.get("nodes_after"), int)]
    head = f"{sum(r['runs'] for r in rows)} run(s) of {len(rows)} pass(es)"
    if counted:
        before, after = counted[0]["nodes_before"], counted[-1]["nodes_after"]
        head += f"; nodes {before} → {after} ({after - before:+d})"
    cells = [[r["pass"], r["runs"], r["changed"], f"{r['delta']:+d}" if r["delta"] else "0",
              sum(r["rewrites"].values()),
              ", ".join(f"{rule}={n}" for rule, n in r["rewrites"].most_common())]
             for r in rows]
    return f"<p>{escape(head)}, in first-run order.</p>" + table(
        ["pass", "runs", "changed", "Δ nodes", "rewrites", "by rule"], cells, numeric={1, 2, 3, 4})


def _memory(data: ReportData) -> str:
    profiles = profile_memory_plans(data.artifact)
    if not any(plans for _, plans in profiles):
        return missing("No memory plan in this .om:", "plans are made for compiles with a "
                       "target: <code>graphopt optimize MODEL.onnx -o MODEL.om --target "
                       "cpu</code> (or an NPU target).")
    largest = largest_profile(profile_rows(data.artifact))
    rows, pictures = [], []
    for index, (profile, plans) in enumerate(profiles):
        shown = []
        for name, plan in by_partition(plans):
            row, picture = _plan_row(name, plan)
            rows.append(([profile] if profile else []) + row)
            shown.append(picture)
        if profile is None or index == 0 or profile == largest:
            pictures += shown
        elif shown:  # the other profiles' pictures stay folded
            pictures.append(f"<details><summary>{escape(profile)}'s plan</summary>"
                            + "".join(shown) + "</details>")
    headers = ["partition", "work memory", "lower bound", "×", "strategy", "order", "weights",
               "inputs+outputs", "tensors"]
    numeric = {1, 2, 3, 6, 7, 8}
    if profiles[0][0] is not None:
        headers, numeric = ["profile"] + headers, {i + 1 for i in numeric}
    body = table(headers, rows, numeric=numeric)
    if largest:
        body += (f'<p class="note">Each shape profile has its own plan. {escape(largest)} needs '
                 "the most work memory: size buffers by it. The pictures of the default profile "
                 f"and of {escape(largest)} are open.</p>")
    if any(pictures):
        body += ('<p class="note">Each picture: tensors as boxes over execution steps (x) and '
                 "work-memory address (y); the dashed red line is the lower bound.</p>")
    return body + "".join(pictures)


def _plan_row(name: str, plan) -> tuple[list, str]:
    """A partition's row of the memory table and its picture (or a note saying why none)."""
    if not isinstance(plan, dict) or "arena_bytes" not in plan:
        reason = plan.get("unplanned", "?") if isinstance(plan, dict) else "?"
        return [name, "-", "-", "-", f"not planned: {reason}", "", "", "", ""], ""
    bound = plan.get("lower_bound") or 0
    idle = not plan.get("tensors")  # nothing to place: no strategy or order chose anything
    row = [name, format_bytes(plan["arena_bytes"]), format_bytes(bound),
           f"{plan['arena_bytes'] / bound:.3f}" if bound else "-",
           "no work memory" if idle else plan.get("strategy", "?"),
           "-" if idle else order_label(plan),
           format_bytes(plan.get("weight_bytes", 0)),
           format_bytes(plan.get("input_bytes", 0) + plan.get("output_bytes", 0)),
           len(plan.get("tensors", []))]
    if plan.get("tensors"):
        device = ""
        if plan.get("sizes") == "device formats":  # an NPU partition (memory/plan.py)
            copies = plan.get("transdata_copies")
            device = (f'<p class="note">Sized as the device stores its tensors: blocked formats '
                      f"padded, {copies if isinstance(copies, int) else '?'} TransData copies "
                      "(named T@FORMAT).</p>")
        return row, (f"<h3>{escape(name)}</h3>{device}"
                     f"<div class=\"plot\">{plan_svg(plan)}</div>")
    return row, (f'<p class="note">{escape(name)}: no work memory (every tensor is an '
                 "input, an output or a weight)</p>")


def _placement(data: ReportData) -> str:
    info = data.artifact.extra.get("partitioning")
    if not isinstance(info, dict):
        return missing("No placement record:", "the .om was compiled without a target; "
                       "compile with <code>--target NAME</code> to place nodes on devices.")
    fallbacks = info.get("fallbacks") or []
    if not fallbacks:
        parts = [p for p in info.get("partitions") or [] if isinstance(p, dict)]
        if parts and not any(p.get("nodes") for p in parts):
            return "<p>No node to place: the model passes its inputs through.</p>"
        devices = {p.get("device") for p in parts}
        device = f"the {escape(str(devices.pop()))}" if len(devices) == 1 and None not in devices \
            else "the primary device"
        return (f"<p>Every node runs on {device}, the primary device of target "
                f"{escape(str(info.get('target', '?')))}: no fallbacks.</p>")
    reasons = Counter(f.get("reason", "?") for f in fallbacks)
    profiles = data.artifact.profiles
    # The record is the default profile's: the summary above counts each profile's.
    of = (f" in {escape(str(profiles[0].get('name')))}, the default shape profile (the summary "
          "counts each profile's)" if len(profiles) > 1 else "")
    body = f"<p>{len(fallbacks)} node(s) fell back to the host{of}" \
        f"{escape(nested_count(fallbacks))}.</p>"
    body += table(["reason", "nodes"], [[r, n] for r, n in reasons.most_common()], numeric={1})
    rows = [[f.get("op", "?"), f.get("node") or "(unnamed)", f.get("reason", "?")]
            for f in fallbacks[:MAX_FALLBACK_ROWS]]
    body += f"<details><summary>every fallback node ({len(fallbacks)})</summary>"
    body += table(["op", "node", "reason"], rows)
    if len(fallbacks) > MAX_FALLBACK_ROWS:
        body += f'<p class="note">… and {len(fallbacks) - MAX_FALLBACK_ROWS} more</p>'
    return body + "</details>"


def _tiling(tiling: dict | None) -> str:
    """`256x32x16 l1=8 db=on cores=2`, as `graphopt kb list` prints tilings."""
    from graphopt.tuner.tiling import Tiling

    if not tiling:
        return ""
    try:
        return str(Tiling(**tiling))
    except TypeError:  # a record from another graphopt version: show it as stored
        return " ".join(f"{k}={v}" for k, v in tiling.items())


def _kernels(data: ReportData) -> str:
    """Each shape profile's kernel configs (the artifact's own without profiles)."""
    found = profile_kernel_configs(data.artifact)
    target = data.manifest["target"]
    if not found:
        hint = ("compile with an NPU target, e.g. <code>--target ascend310</code>"
                if target == "cpu" else
                f"on {escape(target)}, every node of this .om runs on the host"
                + (" in every shape profile" if data.artifact.profiles else ""))
        return missing(f"No kernel configs for target {escape(target)}:",
                       f"they are recorded for NPU partitions only ({hint}).")
    if found[0][0] is None:
        return _kernel_tables(found[0][1])
    body = ""
    for name, info in found:
        body += f"<h3>shape profile {escape(name)}</h3>" + _kernel_tables(info)
    without = [p["name"] for p in data.artifact.profiles
               if p["name"] not in {name for name, _ in found}]
    if without:
        body += (f"<p class=\"note\">No NPU kernel in {escape(', '.join(without))}: every "
                 "node of those profiles runs on the host.</p>")
    return body


def _kernel_tables(info: dict) -> str:
    body = (f"<p>Estimated whole-model time {info.get('estimate_us', 0):.1f} µs with "
            "transfers (cost-model estimates, not measurements).</p>")
    summary, details = [], []
    for name, records in by_partition(info["partitions"]):
        records = [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []
        tiled = [r for r in records if "tiling" in r]
        sources = Counter(r.get("tiling_source", "?") for r in tiled)
        summary.append([name, len(records), len(tiled),
                        ", ".join(f"{s}={n}" for s, n in sorted(sources.items())) or "-",
                        f"{sum(r.get('estimate_us', 0) for r in records):.1f}"])
        for r in records:
            details.append([name, r.get("op", "?"), r.get("node") or "(unnamed)",
                            r.get("kind", ""), r.get("bound", ""),
                            f"{r.get('estimate_us', 0):.3f}", _tiling(r.get("tiling")),
                            r.get("tiling_source", "")])
    body += table(["partition", "kernels", "cube tilings", "tiling source", "µs"], summary,
                  numeric={1, 2, 4})
    shown = " open" if len(details) <= OPEN_KERNEL_ROWS else ""
    body += f"<details{shown}><summary>every kernel ({len(details)})</summary>"
    body += table(["partition", "op", "node", "kind", "bound", "µs", "tiling", "source"],
                  details, numeric={5}) + "</details>"
    return body


def _curve_svg(curves) -> str:
    from graphopt.tuner.history_plot import histories_svg

    series = []
    for c in curves:
        finite = [v for v in c.history if v != float("inf")]
        if not finite:
            continue
        # Without a recorded default the first result is the baseline the curve falls from.
        series.append((c.name, c.history, c.default or finite[0]))
    return f'<div class="plot">{histories_svg(series)}</div>' if series else ""


def _tuning(data: ReportData) -> str:
    tuning: Tuning | None = data.tuning
    if tuning is None:
        return missing("No tuning storage given:", "add <code>--tuning-db FILE.db</code> (or "
                       "<code>--storage URL</code>) naming the storage <code>graphopt tune</code> "
                       "filled, to see this model's op-tuning and subgraph-tuning histories.")
    body = f"<p>storage <code>{escape(tuning.storage)}</code></p><h3>op tuning</h3>"
    if tuning.kernels:
        rows = [[k["signature"], k["nodes"], k["trials"], _us(k.get("default_seconds")),
                 _us(k.get("best_seconds")),
                 f"{k['speedup']:.3f}" if k.get("speedup") else "", k.get("tiling") or ""]
                for k in tuning.kernels]
        body += table(["kernel signature", "nodes", "trials", "default µs", "best µs",
                       "speedup", "best tiling"], rows, numeric={1, 2, 3, 4, 5})
    if tuning.kernel_note:
        body += missing("", escape(tuning.kernel_note))
    if tuning.curves:
        body += ('<p class="note">Best-so-far estimated time over the default tiling\'s, per '
                 "trial (lower is better).</p>" + _curve_svg(tuning.curves))
    body += "<h3>subgraph tuning</h3>"
    if tuning.subgraph is None:
        return body + missing("", escape(tuning.subgraph_note))
    s = tuning.subgraph
    body += ('<p class="note">This .om holds the decisions of this study.</p>' if s["applied"]
             else '<p class="note">This .om names no subgraph study whose decisions it holds '
             "(compiled without them, or by an earlier graphopt): this is its source model's."
             "</p>")
    speedup = (s["default_seconds"] / s["best_seconds"]
               if s["default_seconds"] and s["best_seconds"] else None)
    body += table(["study", "objective", "level", "input shapes", "trials", "default µs",
                   "best µs", "speedup", "decisions changed"],
                  [[s["study"], s["objective"], s["level"], s["input_shapes"] or "-", s["trials"],
                    _us(s["default_seconds"]), _us(s["best_seconds"]),
                    f"{speedup:.3f}" if speedup else "",
                    f"{s['changed']} of {len(s['chosen'])}"]],
                  numeric={4, 5, 6, 7, 8})
    if not s["changed"]:
        body += (f'<p class="note">No decision differs from the default compile\'s: '
                 f"{s['trials']} trial(s) found nothing better.</p>")
    if s["best_trial_seconds"] is not None and \
            _us(s["best_trial_seconds"]) != _us(s["best_seconds"]):
        body += ('<p class="note">The curve follows the trials (best '
                 f"{_us(s['best_trial_seconds'])} µs); the best µs above is what the decisions "
                 "the study chose cost after the simplification or re-timing that follows its "
                 "trials, as <code>tune</code> and <code>kb list</code> give it.</p>")
    if tuning.subgraph_curve is not None:
        body += _curve_svg([tuning.subgraph_curve])
    return body


def _accuracy(data: ReportData) -> str:
    report = data.accuracy
    if data.accuracy_skipped:
        return missing("Not checked on this machine:", escape(data.accuracy_skipped) +
                       ". Run <code>graphopt compare</code> where the target's execution "
                       "provider is installed.")
    if report is None:
        return missing("No accuracy check:", "add <code>--reference MODEL.onnx</code> (and "
                       "<code>--inputs FEEDS.npz</code> for real data instead of seeded random "
                       "inputs) to run the source model and this .om on the same inputs and "
                       "compare every output, as <code>graphopt compare</code> does.")
    from graphopt.tools.compare_format import headers, row_cells

    verdict = ('<span class="pass">PASS</span>' if report.passed
               else '<span class="fail">FAIL</span>')
    body = _kv([("reference", escape(f"{report.reference} (onnxruntime, optimizations "
                                     "disabled)")),
                ("candidate", escape(f"{report.candidate} ({report.candidate_run})")),
                ("inputs", escape(report.inputs)),
                ("rule", escape(report.rule)), ("result", verdict)])
    if data.accuracy_note:
        body += f'<p class="note">note: {escape(data.accuracy_note)}</p>'
    for title, rows in (("outputs", report.outputs), ("intermediates", report.intermediates)):
        if not rows:
            continue
        cells = []
        for row in rows:
            c = row_cells(row, report.min_cosine)  # the text `graphopt compare` prints
            c[10] = ('<span class="pass">pass</span>' if row.passed
                     else '<span class="fail">FAIL</span>')
            cells.append(c)
        body += f"<h3>{title}</h3>" + table(headers(report), cells, numeric=set(range(2, 10)),
                                            raw={10})
    first = report.first_failing_intermediate
    if first is not None:
        where = f" in partition {first.partition}" if first.partition else ""
        body += (f"<p>first failing intermediate in graph order: <b>{escape(first.name)}</b> "
                 f"({escape(first.producer + where)})</p>")
    body += "".join(f'<p class="note">note: {escape(n)}</p>' for n in report.notes)
    return body


# --- the page ------------------------------------------------------------------------------


def render_report(data: ReportData) -> str:
    builders = {"summary": _summary, "partitions": _partitions, "graph": _graph,
                "passes": _passes, "memory": _memory, "placement": _placement,
                "kernels": _kernels, "tuning": _tuning, "accuracy": _accuracy}
    title = f"graphopt report: {data.manifest['source']['path'] or data.artifact.path}"
    nav = "".join(f'<a href="#{key}">{escape(name)}</a>' for key, name in SECTIONS)
    sections = "\n".join(_section(key, name, builders[key](data)) for key, name in SECTIONS)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>"
            f"<nav>{nav}</nav><main><h1>{escape(title)}</h1>\n{sections}\n</main></body></html>\n")
