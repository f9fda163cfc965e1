"""`graphopt targets`: the shipped target profiles in a table, or one profile described in full."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from graphopt.errors import OptionError, one_line
from graphopt.help_format import HelpFormatter
from graphopt.table import format_table, wrap_to_terminal

if TYPE_CHECKING:  # imported where used: `graphopt --help` builds this parser without them
    from graphopt.partition.target import Device, OpSupport, Target


def add_targets_parser(sub) -> None:
    p = sub.add_parser(
        "targets", help="list the target profiles or describe one",
        description="Without an argument, a table of the built-in targets. With a name or a "
                    "profile .json, its devices, engines, buffers, cube shapes, figures (each "
                    "with its source) and op table by engine.",
        formatter_class=HelpFormatter,
        epilog="examples:\n"
               "  graphopt targets\n"
               "  graphopt targets ascend310\n"
               "  graphopt targets my_board.json --json\n")
    p.add_argument("target", nargs="?", metavar="NAME|FILE",
                   help="a built-in target or a profile .json to describe")
    p.add_argument("--json", action="store_true",
                   help="print the loaded profile as JSON (the onnxruntime CPU table expanded)")
    p.set_defaults(func=_cmd_targets)


def _cmd_targets(args) -> int:
    from graphopt.option_names import command_line
    from graphopt.partition.target import builtin_targets, load_target

    if args.target is None:
        targets = [load_target(name) for name in builtin_targets()]
        if args.json:
            print(json.dumps([target_json(t) for t in targets], indent=2))
        else:
            print(format_targets(targets))
        return 0
    try:
        with command_line():  # as under graphopt.cli.main, whoever runs the command
            target = load_target(args.target)
    except OptionError as e:  # the loader speaks of --target; here the name is an argument
        raise type(e)(str(e).removeprefix("--target ")) from None
    if args.json:
        print(json.dumps(target_json(target), indent=2))
    else:
        print(describe_target(target))
    return 0


def format_targets(targets: list[Target]) -> str:
    """One row per target: devices, NPU cores, its primary device's peak, bandwidth, providers."""
    rows = []
    for t in targets:
        primary = t.device(t.primary)
        dtype = next((d for d in ("float16", "float32") if d in primary.peak_ops_per_s), None)
        peak = f"{_rate(primary.peak_ops_per_s[dtype], dtype)} {dtype}" if dtype else ""
        npu_cores = sum(d.ai_cores or 0 for d in t.devices if d.kind == "npu") or None
        rows.append([t.name, "+".join(d.name for d in t.devices), npu_cores, peak,
                     _bandwidth(primary.memory_bandwidth), ", ".join(primary.providers)])
    return format_table(["target", "devices", "NPU cores", "peak", "memory bandwidth",
                         "providers"], rows)


def describe_target(t: Target) -> str:
    """The profile in full; its prose lines wrap on a terminal, as its tables do."""
    file_line = one_line(f"file: {t.path}")
    lines = [one_line(f"{t.name}: {t.description}"), file_line]
    if t.primary == t.host:
        lines.append(f"runs everything on {t.primary}")
    else:
        lines.append(f"places work on {t.primary}, falls back to {t.host}")
    if len(t.devices) > 1:
        lines.append(f"host <-> device link: {_bandwidth(t.transfer_bandwidth)}, "
                     f"{_seconds(t.transfer_latency_s)} per copy")
    for device in t.devices:
        lines += [""] + _describe_device(device)
    # Many figures share a citation: number each distinct one and print it once.
    cited: dict[str, int] = {}
    rows = []
    for key, value in t.figures().items():
        source = t.sources.get(key)
        ref = f"[{cited.setdefault(source, len(cited) + 1)}]" if source else "none"
        rows.append([key, _figure(key, value), ref])
    rows += [[key, "", f"[{cited.setdefault(source, len(cited) + 1)}]"]
             for key, source in t.sources.items() if key.endswith(".ops")]
    lines += ["", format_table(["figure", "value", "source"], rows, title="figures")]
    # A table, so that a terminal wraps the long citations.
    lines += ["", format_table(["ref", "source"], [[f"[{n}]", source]
                                                   for source, n in cited.items()],
                               title="sources")]
    # Tables fit themselves; a line of prose (one that holds no line break) wraps here. The
    # path stays whole: a path cut in two cannot be copied.
    return "\n".join(line if "\n" in line or line == file_line else wrap_to_terminal(line, "  ")
                     for line in lines)


def _describe_device(d: Device) -> list[str]:
    shapes = "static shapes only" if d.static_shapes_only else "dynamic shapes allowed"
    lines = [f"device {d.name} ({d.kind}) via {', '.join(d.providers)}; {shapes}"]
    cores = [f"{label} {value}" for label, value in
             (("AI cores", d.ai_cores), ("AI CPU cores", d.aicpu_cores)) if value is not None]
    if d.clock_hz:
        cores.append(f"clock {d.clock_hz / 1e9:g} GHz")
    if cores:
        lines.append("  " + ", ".join(cores))
    lines.append("  peak: " + ", ".join(f"{dtype} {_rate(v, dtype)}"
                                        for dtype, v in d.peak_ops_per_s.items()))
    lines.append(f"  memory bandwidth {_bandwidth(d.memory_bandwidth)}, "
                 f"launch overhead {_seconds(d.launch_overhead_s)}")
    if d.cube:
        lines.append("  cube M×K×N: " + ", ".join(f"{dtype} {'×'.join(map(str, mkn))}"
                                                  for dtype, mkn in d.cube.items()))
    if d.buffers:
        lines.append("  buffers per core: " + ", ".join(f"{b} {_bytes(n)}"
                                                        for b, n in d.buffers.items()))
    if d.kind == "cpu":
        lines.append(f"  NCHWc block: {d.nchwc_block_size or 'none'}")
    counts = {e: len(d.engine_ops(e)) for e in d.engines}
    lines.append("  engines: " + ", ".join(f"{e} ({kind}, {counts[e]} ops)"
                                           for e, kind in d.engines.items()))
    if d.kernel_source == "onnxruntime":
        from graphopt.partition.target_ort import ort_version

        lines.append(f"  kernels: the CPU kernels of the installed onnxruntime {ort_version()}, "
                     "read when the profile loads")
        return lines
    for engine in d.engines:
        rows = [[s.op, _dtypes(s), s.max_rank or "", _constraints(s), s.note or ""]
                for s in d.engine_ops(engine)]
        lines += ["", format_table(["op", "dtypes", "max rank", "constraints", "note"], rows,
                                   title=f"engine {engine} of {d.name}")]
    if d.host_ops:
        lines += ["", format_table(["op", "why"], [[op, why] for op, why in d.host_ops.items()],
                                   title=f"ops {d.name} leaves to the host")]
    return lines


def target_json(t: Target) -> dict:
    """The loaded profile in the file format (it loads again): the onnxruntime table expanded
    into a `cpu` engine, `auto` resolved."""
    return {
        "schema_version": 1, "name": t.name, "description": t.description,
        "primary": t.primary, "host": t.host,
        **({"transfer": {"bandwidth": t.transfer_bandwidth, "latency_s": t.transfer_latency_s}}
           if len(t.devices) > 1 else {}),
        "devices": [_device_json(d) for d in t.devices],
        "sources": dict(t.sources),
    }


def _device_json(d: Device) -> dict:
    out: dict = {"name": d.name, "kind": d.kind, "providers": list(d.providers),
                 "static_shapes": d.static_shapes_only}
    for key in ("ai_cores", "aicpu_cores", "clock_hz"):
        if getattr(d, key) is not None:
            out[key] = getattr(d, key)
    if d.cube:
        out["cube"] = {dtype: list(mkn) for dtype, mkn in d.cube.items()}
    if d.buffers:
        out["buffers"] = dict(d.buffers)
    out.update(peak_ops_per_s=dict(d.peak_ops_per_s), memory_bandwidth=d.memory_bandwidth,
               launch_overhead_s=d.launch_overhead_s)
    if d.kind == "cpu":  # "auto" stays auto: a dump read on another CPU takes that CPU's block
        out["nchwc_block_size"] = "auto" if d.nchwc_auto else d.nchwc_block_size
    if d.kernel_source == "onnxruntime":
        # As the profile says it: a copy of the table the installed onnxruntime gives loads as a
        # fixed list, without onnxruntime's float16 fallback and per-opset kernel lookup (a
        # custom copy of `cpu` refused --precision fp16).
        out["ops"] = "onnxruntime"
        return out
    out["engines"] = {engine: {"kind": kind,
                               "ops": {s.op: _op_json(s) for s in d.engine_ops(engine)}}
                      for engine, kind in d.engines.items()}
    if d.host_ops:
        out["host_ops"] = dict(d.host_ops)
    return out


def _op_json(s: OpSupport) -> dict:
    out: dict = {"dtypes": sorted(s.dtypes)} if s.dtypes else {}  # none listed: any
    if s.max_rank is not None:
        out["max_rank"] = s.max_rank
    if s.attributes:
        out["attributes"] = {a: [list(v) if isinstance(v, tuple) else v for v in values]
                             for a, values in s.attributes.items()}
    if s.attribute_ranges:
        out["attribute_ranges"] = {a: list(bounds) for a, bounds in s.attribute_ranges.items()}
    if s.absent_inputs:
        out["absent_inputs"] = list(s.absent_inputs)
    if s.head_size:
        out["head_size"] = dict(s.head_size)
    if s.rank_attributes:
        out["rank_attributes"] = {
            str(rank): {a: [list(v) if isinstance(v, tuple) else v for v in values]
                        for a, values in limits.items()}
            for rank, limits in s.rank_attributes.items()}
    if s.max_outputs is not None:
        out["max_outputs"] = s.max_outputs
    if s.dtype_engines:
        out["engine_for"] = dict(s.dtype_engines)
    if s.note:
        out["note"] = s.note
    return out


# --- units ---------------------------------------------------------------------------------


def _dtypes(s: OpSupport) -> str:
    return ", ".join(sorted(s.dtypes)) if s.dtypes else "any"


def _constraints(s: OpSupport) -> str:
    parts = [f"{a} in {'/'.join(map(str, values))}" for a, values in s.attributes.items()]
    parts += [f"{a} {low:g} to {high:g}" for a, (low, high) in s.attribute_ranges.items()]
    parts += [f"no input {index}" for index in s.absent_inputs]
    if s.head_size:
        from graphopt.partition.placement import head_size_words

        parts.append(f"head size {head_size_words(s.head_size)}")
    parts += [f"{a} in {'/'.join(map(str, values))} at rank {rank}"
              for rank, limits in s.rank_attributes.items() for a, values in limits.items()]
    parts += [f"{dtype} on {engine}" for dtype, engine in s.dtype_engines.items()]
    if s.max_outputs is not None:
        parts.append(f"first {s.max_outputs} output(s) only")
    return "; ".join(parts)


def _figure(key: str, value) -> str:
    if ".buffers." in key:
        return _bytes(value)
    if ".peak_ops_per_s." in key:
        return _rate(value, key.rsplit(".", 1)[-1])
    if key.endswith("bandwidth"):
        return _bandwidth(value)
    if key.endswith("_s"):
        return _seconds(value)
    if key.endswith("clock_hz"):
        return f"{value / 1e9:g} GHz"
    if ".cube." in key:
        return "×".join(map(str, value))
    return str(value)


def _rate(ops_per_s: float, dtype: str = "") -> str:
    """`8 TFLOPS` for a float type, `16 TOPS` for an integer one."""
    kind = "FLOPS" if dtype.startswith(("float", "bfloat")) else "OPS"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if ops_per_s >= scale:
            return f"{ops_per_s / scale:.3g} {prefix}{kind}"
    return f"{ops_per_s:.3g} {kind}"


def _bandwidth(bytes_per_s: float) -> str:
    for scale, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def _bytes(n: int) -> str:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale and n % (scale >> 4) == 0:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _seconds(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:g} ms"
    return f"{s * 1e6:g} µs"
