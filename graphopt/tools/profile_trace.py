"""onnxruntime's chrome-trace profiles: reading a trace file, kernel events per run, merging."""

from __future__ import annotations

import bisect
import itertools
import json
import os
from dataclasses import dataclass

from graphopt.errors import GraphoptError

KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class KernelEvent:
    """One kernel's execution in one run, as onnxruntime's profiler recorded it."""

    name: str        # the onnxruntime node name (the event name without "_kernel_time")
    op_type: str     # args.op_name: the kernel's op, after onnxruntime's own rewrites
    provider: str
    run: int         # 0-based index of the session run it belongs to
    dur_us: float


def read_trace(path: str | os.PathLike) -> list[dict]:
    """The events of a trace file onnxruntime wrote (a JSON array)."""
    try:
        # onnxruntime writes a node's name byte for byte: a model's name that is no UTF-8
        # made the whole trace unreadable.
        with open(path, encoding="utf-8", errors="replace") as f:
            events = json.load(f)
    except (OSError, ValueError) as exc:
        raise GraphoptError(f"cannot read onnxruntime's profile {path}: {exc}") from None
    if not isinstance(events, list):
        raise GraphoptError(f"onnxruntime's profile {path} is not a JSON array of events")
    return events


def kernel_events(events: list[dict], skip_runs: int = 0) -> tuple[list[KernelEvent], int]:
    """The kernel events of every run after the first `skip_runs` (the warmups), and how many
    runs were kept. A kernel belongs to the `model_run` whose time span holds its start: a node
    inside a control-flow subgraph runs several times per run, so counting by node would not do.
    """
    runs = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    starts = [start for start, _ in runs]
    kernels = [e for e in events
               if e.get("cat") == "Node" and e.get("name", "").endswith(KERNEL_SUFFIX)]
    inside = _in_control_flow(kernels)
    kept: list[KernelEvent] = []
    for k, e in enumerate(kernels):
        name = e["name"]
        if k in inside:
            continue
        index = bisect.bisect_right(starts, e["ts"]) - 1
        if index < skip_runs or e["ts"] > runs[index][1]:
            continue
        args = e.get("args", {})
        kept.append(KernelEvent(name[: -len(KERNEL_SUFFIX)], str(args.get("op_name", "?")),
                                str(args.get("provider", "?")), index - skip_runs,
                                float(e.get("dur", 0))))
    return kept, max(0, len(runs) - skip_runs)


CONTROL_FLOW = {"If", "Loop", "Scan"}


def _in_control_flow(kernels: list[dict]) -> set[int]:
    """Indexes of the kernels a control-flow kernel ran in its subgraph: its own time includes
    theirs, so counting them too would count that time twice (and the subgraph's nodes are not
    nodes of the graph the profile matches against)."""
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0), e.get("tid"), k)
                   for k, e in enumerate(kernels)
                   if e.get("args", {}).get("op_name") in CONTROL_FLOW)
    if not spans:
        return set()
    starts = [span[0] for span in spans]
    reach = list(itertools.accumulate((span[1] for span in spans), max))
    inside = set()
    for k, e in enumerate(kernels):
        begin, end = e["ts"], e["ts"] + e.get("dur", 0)
        j = bisect.bisect_right(starts, begin) - 1
        # Back through the spans that start before the event, while one of them could still
        # reach past its end (the running maximum of their ends says so).
        while j >= 0 and reach[j] >= end:
            start, stop, tid, owner = spans[j]
            if owner != k and stop >= end and tid == e.get("tid"):
                inside.add(k)
                break
            j -= 1
    return inside


def merge_traces(traces: dict[str, list[dict]],
                 starts_ns: dict[str, int] | None = None) -> list[dict]:
    """One chrome trace from several sessions' (one per .om partition), each partition on a
    process track of its own, named by a metadata event. Each session's clock starts at its
    own creation: `starts_ns` (when each started) puts them on the earliest one's, so the
    viewers' shared time axis shows the partitions in the order they ran (the last one's
    kernels had come 5 ms before the first's)."""
    first = min(starts_ns.values()) if starts_ns else 0
    merged: list[dict] = []
    for pid, (partition, events) in enumerate(traces.items(), start=1):
        shift = ((starts_ns or {}).get(partition, first) - first) / 1000  # µs, as "ts" is
        merged.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"partition {partition}"}})
        merged.extend({**e, "pid": pid, "args": {**e.get("args", {}), "partition": partition},
                       **({"ts": e["ts"] + shift} if "ts" in e else {})}
                      for e in events)
    return merged
