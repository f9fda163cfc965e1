"""A CompareReport for people (tables), spreadsheets (CSV, written atomically) and machines (JSON)."""

from __future__ import annotations

import csv
import io
import json
import math

from graphopt.atomic import atomic_write_bytes
from graphopt.errors import GraphoptError, one_line
from graphopt.table import elide, format_table
from graphopt.tools.compare import CompareReport, Row
from graphopt.tools.rule_text import cosine_text

NOT_MEANINGFUL = "—"
NAME_WIDTH = 64  # a tensor name's characters in the tables, its middle elided past them
BEYOND_TOLERANCE = "beyond tol"
HEADERS = ["tensor", "shape", "cosine", "max abs", "mean abs", "max rel", "mean rel", "RMSE", "KL",
           "mismatch", "result", "note"]
_NUMERIC = set(range(2, 10))  # columns right-aligned even when "—" stops format_table doing it
CSV_FIELDS = ["role", "tensor", "producer", "partition", "dtype", "shape", "cosine", "max_abs",
              "mean_abs", "max_rel", "mean_rel", "rmse", "kl", "mismatches", "result", "note"]


def _number(value: float | None, digits: str = ".3g") -> str:
    if value is None:
        return NOT_MEANINGFUL
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, digits)


def row_cells(row: Row, min_cosine: float | None) -> list[str]:
    shape = row.dtype  # an empty optional's `optional(None)`: `[]` would say a scalar
    if row.shape is not None:
        shape += f"[{','.join(str(d) for d in row.shape)}]"
    mismatch = NOT_MEANINGFUL if row.mismatches is None else str(row.mismatches)
    cosine = NOT_MEANINGFUL if row.cosine is None else cosine_text(row.cosine, min_cosine)
    return [row.name, shape, cosine, _number(row.max_abs),
            _number(row.mean_abs), _number(row.max_rel), _number(row.mean_rel),
            _number(row.rmse), _number(row.kl), mismatch, "pass" if row.passed else "FAIL", row.note]


def headers(report: CompareReport) -> list[str]:
    """The table's headers: under a cosine rule the count of elements outside rtol/atol does
    not decide a row, so it is not called a mismatch."""
    if report.rule.startswith("cosine"):
        return [BEYOND_TOLERANCE if h == "mismatch" else h for h in HEADERS]
    return HEADERS


def _table(rows: list[Row], title: str, names: list[str], min_cosine: float | None) -> str:
    cells = [row_cells(r, min_cosine) for r in rows]
    for c in cells:  # a 290-character name made a table 400 columns wide (CSV and JSON keep it)
        c[0] = elide(c[0], NAME_WIDTH)
    for column in _NUMERIC:
        width = max(len(c[column]) for c in cells)
        for c in cells:
            c[column] = c[column].rjust(width)
    if not any(r.note for r in rows):  # an empty last column would only widen the table
        return format_table(names[:-1], [c[:-1] for c in cells], title=title, names={0})
    return format_table(names, cells, title=title, names={0})


def format_report(report: CompareReport) -> str:
    """The header lines, the outputs table, the intermediates table and the verdict."""
    lines = [f"reference: {report.reference} (onnxruntime, optimizations disabled)",
             f"candidate: {report.candidate}"
             + (f" ({report.candidate_run})" if report.candidate_run else ""),
             f"inputs:    {report.inputs}",
             f"rule:      {report.rule}", ""]
    outputs, intermediates = report.outputs, report.intermediates
    names = headers(report)
    lines.append(_table(outputs, "outputs", names, report.min_cosine))
    if intermediates:
        lines += ["", _table(intermediates, "intermediates (the candidate's graph order)", names,
                             report.min_cosine)]
    lines.append("")
    lines.extend(f"note: {note}" for note in report.notes)
    failed = [r for r in outputs if not r.passed]
    lines.append(f"outputs: {len(outputs) - len(failed)}/{len(outputs)} pass")
    if intermediates:
        bad = [r for r in intermediates if not r.passed]
        line = f"intermediates: {len(intermediates) - len(bad)}/{len(intermediates)} pass"
        first = report.first_failing_intermediate
        if first is not None:
            where = f" in partition {first.partition}" if first.partition else ""
            line += f"; first failure in graph order: {first.name} ({first.producer}{where})"
        lines.append(one_line(line))  # names from the model: one line, escaped
    lines.append("result: PASS" if report.passed else
                 one_line(f"result: FAIL ({', '.join(r.name for r in failed)})"))
    return "\n".join(lines)


def _csv_value(value) -> str:
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def report_csv(report: CompareReport) -> str:
    """One line per row, full precision; an empty cell where a metric is not meaningful."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for row in report.rows:
        data = row.to_dict()
        data["tensor"] = row.name
        data["shape"] = "" if row.shape is None else "x".join(str(d) for d in row.shape)
        data["result"] = "pass" if row.passed else "FAIL"
        writer.writerow([_csv_value(data[f]) for f in CSV_FIELDS])
    return out.getvalue()


def write_csv(report: CompareReport, path: str) -> None:
    try:
        atomic_write_bytes(path, report_csv(report).encode("utf-8"))
    except OSError as exc:
        raise GraphoptError(f"cannot write {path}: {exc.strerror or exc}") from None


def report_json(report: CompareReport) -> str:
    """JSON of report.to_dict(); a NaN or infinite metric becomes a string ("inf"), which strict
    JSON parsers accept."""
    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(report.to_dict()), indent=2)
