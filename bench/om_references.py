"""Reading an .om's external-data references at load: the runtime's protobuf-wire reader against
onnx's parse, side by side.

Every partition whose weights onnxruntime maps from the artifact carries references that a load
must check (they may point only into the artifact's weights members) and repoint at the
artifact file before onnxruntime reads them. For each zoo model compiled for the cpu target
(`graphopt optimize model.onnx -o model.om`), this times both ways of doing that on the stored
partition bytes: om_refs' wire reader (plain_references, check, repointed) and onnx's parse
(the loader's checked parse, point_into, SerializeToString). Interleaved rounds, medians; both
must give the same model.

    python bench/om_references.py
    python bench/om_references.py --only resnet50 --runs 50
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import graphopt  # noqa: E402
from graphopt.codegen import load_om, om_refs  # noqa: E402
from graphopt.codegen.om_weights import point_into  # noqa: E402
from _common import (Stats, json_path, markdown_table, positive_int, summary,  # noqa: E402
                     write_json)
from _models import ZOO_FULL, matching, sized_zoo_models, unmatched  # noqa: E402


def readers(om_path: str):
    """(references, the wire reader, onnx's parse) for the artifact's first partition that
    references a weights blob; None when none does."""
    artifact = load_om(om_path, defer_checks=True)
    offsets = {name: offset for name, (offset, _) in artifact.spans.items()}
    sizes = {name: size for name, (_, size) in artifact.spans.items()}
    path = os.path.abspath(om_path)
    for part in artifact.manifest["partitions"]:
        data = artifact.members[part["member"]]
        references = om_refs.plain_references(data)
        if references:
            break
    else:
        return None

    def wire() -> bytes:
        found = om_refs.plain_references(data)
        om_refs.check(found, sizes)
        return om_refs.repointed(data, found, os.path.basename(path), offsets)

    def parsed() -> bytes:
        model = artifact.models.parse(part["name"])
        return point_into(model, path, offsets, copy=False).SerializeToString()

    return references, wire, parsed


def bench(model, runs: int, workdir: str) -> dict:
    om_path = os.path.join(workdir, "model.om")
    graphopt.save(graphopt.optimize(model.path, target="cpu"), om_path)
    found = readers(om_path)
    if found is None:
        return {"model": model.name, "references": 0}
    references, wire, parsed = found
    same = onnx.load_from_string(wire()) == onnx.load_from_string(parsed())
    times: dict[str, list[float]] = {"wire": [], "onnx": []}
    for round_ in range(runs):
        order = (("wire", wire), ("onnx", parsed))
        for name, read in order if round_ % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            read()
            times[name].append(time.perf_counter() - start)
    wire_stats, onnx_stats = Stats.of(times["wire"]), Stats.of(times["onnx"])
    return {"model": model.name, "references": len(references), "same_model": same,
            "wire_ms": wire_stats.median * 1e3, "onnx_ms": onnx_stats.median * 1e3,
            "ratio": wire_stats.median / onnx_stats.median}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--runs", type=positive_int, default=30,
                        help="interleaved rounds (default 30)")
    parser.add_argument("--only", action="append", default=[],
                        help="rows whose name contains this (repeatable)")
    parser.add_argument("--json", metavar="FILE", type=json_path,
                        help="also write the rows as JSON")
    args = parser.parse_args(argv)
    problem = unmatched(args.only, lambda wanted: sized_zoo_models("", ZOO_FULL, wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for model in sized_zoo_models(workdir, ZOO_FULL, matching(args.only)):
            row = bench(model, args.runs, workdir)
            rows.append(row)
            if row["references"]:
                print(f"{row['model']}: {row['references']} references, wire "
                      f"{row['wire_ms']:.2f} ms, onnx {row['onnx_ms']:.2f} ms", file=sys.stderr)
    table = [[r["model"], r["references"], f"{r['wire_ms']:.2f}", f"{r['onnx_ms']:.2f}",
              f"{r['ratio']:.2f}", "yes" if r["same_model"] else "NO"]
             for r in rows if r["references"]]
    print(markdown_table(["model", "references", "wire ms", "onnx parse ms", "wire ×",
                          "same model"], table))
    skipped = [r["model"] for r in rows if not r["references"]]
    if skipped:
        print(f"\n(no weights blob, nothing to repoint: {', '.join(skipped)})")
    if args.json:
        write_json(args.json, {"runs": args.runs, "rows": rows})
    return 0 if all(r.get("same_model", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
