"""`graphopt profile`'s measurement: onnxruntime's per-kernel profile of an .onnx or an .om,
with each kernel matched to its IR node and priced by the CPU cost model."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort

from graphopt import api_args
from graphopt.atomic import scratch_folder, scratch_writes
from graphopt.errors import GraphoptError, InputError, OptionError, model_label, naming
from graphopt.input_shapes import input_shapes_argument, pinned_signature
from graphopt.ir import Model, load_onnx
from graphopt.numerics import ort_reason, typed_runner
from graphopt.option_names import PROFILE_FLAGS, option, setting
from graphopt.source_marks import extra_fixed_inputs, extra_preprocessing, inserted_preprocessing
from graphopt.tools.profile_match import Matcher, name_nodes
from graphopt.tools.profile_stats import ProfileStats
from graphopt.tools.profile_trace import CONTROL_FLOW, kernel_events, merge_traces, read_trace
from graphopt.tuner.cpu_model import CpuCostModel, node_work, op_class
from graphopt.warning_scope import kept_notices

_ORT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
LEVELS = tuple(_ORT_LEVELS)
DEFAULT_REPEAT = 10
DEFAULT_WARMUP = 3
ONNX_PARTITION = "model"  # the one "partition" of a plain .onnx


@dataclass
class Kernel:
    """One profiled kernel summed over the kept runs, with the IR node it was matched to."""

    partition: str
    name: str                 # onnxruntime's node name
    op_type: str              # the op onnxruntime ran (after its own rewrites)
    provider: str
    calls: int
    total_us: float
    node: str | None = None   # the IR node it comes from (see profile_match)
    how: str = ""             # how it was matched: "name", "fused", "nchwc", "order"
    predicted_us: float | None = None  # the cost model's seconds per call of that node, in µs
    compute_us: float | None = None    # its roofline's two sides (flops/peak, bytes/bandwidth)
    memory_us: float | None = None
    median_us: float = 0.0            # of its calls: robust to a run another process slowed

    @property
    def mean_us(self) -> float:
        return self.total_us / self.calls if self.calls else 0.0


@dataclass
class PartitionInfo:
    name: str
    device: str
    level: str                # the onnxruntime optimization level its session ran at
    providers: list[str]
    nodes: int                # IR nodes in its model, those of If and Loop bodies included


@dataclass
class Profile(ProfileStats):
    """What `profile_model` measured. Aggregations live in ProfileStats."""

    path: str
    kind: str                              # "onnx" or "om"
    runs: int
    warmup: int
    threads: int | None
    partitions: list[PartitionInfo]
    kernels: list[Kernel]
    wall_s: list[float]                    # each kept run's wall time, profiling included
    cost_model: str                        # where the cost model's constants come from
    models: dict[str, Model] = field(default_factory=dict, repr=False)  # IR per partition
    partitioning: dict | None = None       # an .om's extra.partitioning record
    shape_profile: dict | None = None      # the .om shape profile that ran: name, dims, of, how
    compiled_passes: frozenset | None = None  # the passes an .om's compile ran (its pass log)
    notes: list[str] = field(default_factory=list)
    trace: list[dict] = field(default_factory=list, repr=False)  # chrome-trace events


def profile_model(path_or_proto: str | os.PathLike | onnx.ModelProto | bytes,
                  feeds: Mapping[str, np.ndarray] | str | os.PathLike | None = None, *,
                  repeat: int = DEFAULT_REPEAT, warmup: int = DEFAULT_WARMUP,
                  threads: int | None = None, level: str | None = None,
                  input_shapes: Mapping[str, list[int]] | None = None,
                  calibration: str | os.PathLike | None = None, seed: int = 0) -> Profile:
    """Run a model (an .onnx or .om path, a ModelProto or an .onnx's bytes) `repeat` times
    after `warmup` untimed runs with onnxruntime's profiler on.

    `level` is onnxruntime's graph optimization level (default: what `graphopt run` uses, the
    level each .om partition recorded; "all" for an .onnx). `feeds` is a dict or an .npz path;
    without it, seeded random inputs shaped by the model's signature with `input_shapes`
    pinning dynamic dims.
    `calibration` is a `graphopt calibrate` JSON (default: its default path when present, else
    the `cpu` target profile's figures).
    """
    repeat, warmup, threads = _check_options(repeat, warmup, threads, level)
    seed = api_args.seed(seed, _option("seed"))
    input_shapes = input_shapes_argument(input_shapes)
    feeds = api_args.feeds(feeds, option("feeds", PROFILE_FLAGS))
    if isinstance(feeds, (str, os.PathLike)):  # its errors name the file, not the model
        feeds = _NamedFeeds(feeds)
    cost, source, notes = _cost_model(calibration)
    path_or_proto = api_args.model(path_or_proto, "path_or_proto",
                                   "an .onnx or .om path, a ModelProto or an .onnx's bytes")
    is_proto = isinstance(path_or_proto, onnx.ModelProto)
    label = "<model>" if is_proto else path_or_proto
    if not is_proto:
        if not os.path.exists(label):
            raise InputError(f"{label}: no such file")
        if os.path.isdir(label):
            raise InputError(f"{label}: is a directory, expected an .onnx or .om file")
    with scratch_folder("graphopt-profile-") as workdir, model_label(label), \
            scratch_writes():
        if not is_proto and _is_om(label):
            profile = _profile_om(label, feeds, repeat, warmup, threads, level, input_shapes,
                                  seed, workdir)
        else:
            profile = _profile_onnx(path_or_proto, label, feeds, repeat, warmup, threads,
                                    level or "all", input_shapes, seed, workdir)
    profile.cost_model = source
    profile.notes = notes + profile.notes
    _price(profile, cost)
    return profile


def _option(keyword: str) -> str:
    return option(keyword, PROFILE_FLAGS)


def _check_options(repeat, warmup, threads, level) -> tuple[int, int, int | None]:
    """repeat, warmup and threads checked, as ints: a NumPy integer counts too, as the
    compiler's keywords take it, and leaves the Profile as one (which JSON cannot hold)."""
    if not api_args.is_integer(repeat) or repeat < 1:  # '3' read as "at least 1" misled
        raise OptionError(f"{_option('repeat')} must be an integer of at least 1, got "
                          f"{repeat!r}")
    if not api_args.is_integer(warmup) or warmup < 0:
        raise OptionError(f"{_option('warmup')} must be an integer of 0 or more, got "
                          f"{warmup!r}")
    if threads is not None and (not api_args.is_integer(threads)
                                or not 0 <= threads <= api_args.THREAD_LIMIT):
        raise OptionError(f"{_option('threads')} must be 0 (onnxruntime chooses) to "
                          f"{api_args.THREAD_LIMIT}, got {threads!r}")
    if level is not None and level not in LEVELS:
        raise OptionError(f"{_option('level')} {level!r} is not one of: {', '.join(LEVELS)}")
    return int(repeat), int(warmup), None if threads is None else int(threads)


def _is_om(path: str) -> bool:
    from graphopt.codegen.om_read import looks_like_onnx

    with open(path, "rb") as f:
        if f.read(2) == b"PK":
            return True
    return path.lower().endswith(".om") and not looks_like_onnx(path)


def _cost_model(calibration) -> tuple[CpuCostModel, str, list[str]]:
    from graphopt.tuner.calibrate import CalibrationResult, default_path

    path = os.fspath(calibration) if calibration is not None else default_path()
    if calibration is None and not os.path.exists(path):
        defaults = ("the cpu target profile's figures (run `graphopt calibrate --target cpu` "
                    "for this machine's)")
        return CpuCostModel(), defaults, []
    try:
        with kept_notices() as notes:
            result = CalibrationResult.load(path)
    except OptionError as exc:
        if calibration is not None:  # the file the user named: its problem is the error
            raise
        # The default file is a cache: a damaged one must not stop a profile, as it stops no
        # estimate (tuner.cpu_model); the note says what is wrong with it.
        defaults = "the cpu target profile's figures (the calibration file does not load)"
        return CpuCostModel(), defaults, [str(exc)]
    source = (f"calibration {path} ({result.threads} thread(s), "
              f"{'quick, ' if result.quick else ''}{result.cpu_model})")
    return result.cost_model(), source, notes


# --- running -------------------------------------------------------------------------------


def _timed_runs(run, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples


def _profile_onnx(source, label, feeds, repeat, warmup, threads, level, input_shapes, seed,
                  workdir) -> Profile:
    from graphopt.ir.onnx_io import read_model_proto

    if isinstance(source, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(source)  # nodes get names below: the caller's proto stays as it was
    else:
        proto = read_model_proto(label)
    # Name every node as onnxruntime would show it, so that its fusions ("<name>/…") can be
    # traced back to graphopt's nodes; the names change nothing that runs.
    for index, node in enumerate(proto.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
    signature = _signature(proto)
    feeds = _feeds(signature, feeds, input_shapes, seed, label,
                   inserted_preprocessing(proto.metadata_props))
    try:
        data = proto.SerializeToString()
    except ValueError as exc:  # protobuf refuses messages past 2 GB
        raise InputError(f"{label}: too large to profile from memory ({exc}); compile it to an "
                         ".om and profile that") from None
    options = ort.SessionOptions()
    options.graph_optimization_level = _ORT_LEVELS[level]
    if threads is not None:
        options.intra_op_num_threads = threads  # 0 lets onnxruntime choose, as for `graphopt run`
    # Fatal only: a session that fails to load logs, as it is destroyed, an error about the
    # profile it cannot write, beside the error graphopt raises for the load itself.
    options.log_severity_level = 4
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(workdir, ONNX_PARTITION)
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        call = typed_runner(session) or session.run  # bfloat16 and float8 as OrtValues
        call(None, feeds)  # the first run fails here, not mid-measurement
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped exceptions
        raise InputError(f"{label}: onnxruntime cannot run it: {ort_reason(exc)}") from None
    # The check run counts as the first warmup; with no warmup it is dropped all the same.
    skip = max(warmup, 1)

    def run():
        return call(None, feeds)

    _timed_runs(run, skip - 1)
    wall = _timed_runs(run, repeat)
    trace = read_trace(session.end_profiling())
    model = load_onnx(proto, user_model=False)
    _shape(model, _tensor_shapes(feeds))
    part = PartitionInfo(ONNX_PARTITION, "cpu", level, ["CPUExecutionProvider"],
                         model.graph.count_nodes())
    profile = Profile(path=label, kind="onnx", runs=repeat, warmup=warmup, threads=threads,
                      partitions=[part], kernels=[], wall_s=wall, cost_model="",
                      models={ONNX_PARTITION: model}, trace=trace)
    _collect(profile, {ONNX_PARTITION: trace}, skip)
    return profile


def _profile_om(path, feeds, repeat, warmup, threads, level, input_shapes, seed,
                workdir) -> Profile:
    from graphopt.codegen.runtime import OmSession

    # e.g. an NPU partition standing in on the CPU provider
    with kept_notices() as notes:
        session = OmSession(path, intra_op_num_threads=threads, optimization_level=level,
                            profile_dir=workdir)
    random = feeds is None
    where = path + (f" on {feeds.label}" if isinstance(feeds, _NamedFeeds) else "")
    signature = _random_signature(session, input_shapes) if random else session.inputs
    feeds = _feeds(signature, feeds, input_shapes, seed, path,
                   extra_preprocessing(session.artifact.extra),
                   extra_fixed_inputs(session.artifact.extra))
    artifact = session.artifact
    shape_profile = None
    if artifact.profiles:  # the shape profile these feeds run on; the others' sessions idle
        with naming(where):
            chosen = session.profile_for(feeds)
        artifact = artifact.profile(chosen)
        dims = next(p["dims"] for p in session.profiles if p["name"] == chosen)
        how = ("the first, which random inputs take as in `graphopt run`"
               if random and not input_shapes
               else f"the first that {_option('input_shapes')} fits" if random
               else "the one the inputs' shapes fit")
        shape_profile = {"name": chosen, "dims": dims, "of": len(session.profiles), "how": how}
    # The first run also returns every tensor passed between partitions: their shapes pin the
    # partitions' inputs for the cost model. It is dropped like a warmup.
    routed = [t for p in artifact.partitions for t in (*p.inputs, *p.outputs)]
    skip = max(warmup, 1)

    def run():
        return session.run(feeds)

    with naming(where):
        values = session.run(feeds, list(dict.fromkeys(routed)))
        _timed_runs(run, skip - 1)
        wall = _timed_runs(run, repeat)
    ran = set(artifact.execution_order)
    starts = session.profiling_starts_ns()
    traces = {name: read_trace(file) for name, file in session.end_profiling().items()
              if file and name in ran}
    shapes = _tensor_shapes({**feeds, **values})
    providers = session.providers
    partitions, models = [], {}
    for part in artifact.partitions:
        # Its weights stay in the file: shapes suffice.
        model = load_onnx(artifact.models[part.name], user_model=False)
        name_nodes(model)
        _shape(model, shapes)
        models[part.name] = model
        partitions.append(PartitionInfo(part.name, part.device,
                                        level or part.optimization_level or "all",
                                        providers.get(part.name, []), model.graph.count_nodes()))
    profile = Profile(path=path, kind="om", runs=repeat, warmup=warmup, threads=threads,
                      partitions=partitions, kernels=[], wall_s=wall, cost_model="",
                      models=models, partitioning=artifact.extra.get("partitioning"),
                      notes=notes, trace=merge_traces(traces, starts),
                      shape_profile=shape_profile, compiled_passes=_passes_run(artifact))
    _collect(profile, traces, skip)
    return profile


def _passes_run(artifact) -> frozenset:
    """The names of the passes an .om's pass log records (read defensively: free-form)."""
    log = artifact.pass_log
    return frozenset(entry["pass"] for entry in log if isinstance(entry, dict)
                     and isinstance(entry.get("pass"), str)) if isinstance(log, list) else \
        frozenset()


def _tensor_shapes(values: Mapping) -> dict[str, tuple]:
    """The shapes of the tensors among `values`; a sequence, map or optional has none to pin
    the cost model's shapes with."""
    return {name: value.shape for name, value in values.items() if isinstance(value, np.ndarray)}


def _random_signature(session, input_shapes) -> list[dict]:
    """What random inputs are made for: as `graphopt run` does, an .om with shape profiles
    takes its first profile's shapes, or the first whose dims agree with `input_shapes`."""
    for profile in session.profiles:
        if all(_agrees(entry["shape"], (input_shapes or {}).get(entry["name"]))
               for entry in profile["inputs"]):
            return profile["inputs"]
    return session.inputs  # no profile fits the pins: the error names the dynamic dim


def _agrees(shape, pins) -> bool:
    if pins is None or shape is None:
        return True
    return len(shape) == len(pins) and all(p == -1 or not isinstance(d, int) or d == p
                                           for d, p in zip(shape, pins))


def _signature(proto: onnx.ModelProto) -> list[dict]:
    from graphopt.codegen.feeds import typed_inputs

    return typed_inputs(proto)


class _NamedFeeds(dict):
    """Feeds read from an .npz, which a mismatch with the model names."""

    def __init__(self, path: str | os.PathLike):
        from graphopt.codegen.feeds import load_npz

        self.label = setting("feeds", os.fspath(path), PROFILE_FLAGS)
        try:
            super().__init__(load_npz(path))
        except InputError as exc:
            raise InputError(f"{option('feeds', PROFILE_FLAGS)} {exc}") from None


def _feeds(signature, feeds, input_shapes, seed, label, images=(),
           fixed=()) -> dict[str, np.ndarray]:
    """The caller's feeds checked against the signature, or seeded random ones (`images`: the
    inputs --insert-op-conf made, frames of every pixel value; `fixed`: the source's inputs an
    .om fixed, which a feed is told about)."""
    from graphopt.codegen.feeds import BeyondNumpy, check_feeds, npz_holds, random_feeds

    if feeds is not None:
        if input_shapes:
            raise OptionError(f"{_option('input_shapes')} shapes random inputs; drop it or "
                              f"{_option('feeds')}")
        try:
            check_feeds(signature, feeds, fixed)
        except InputError as exc:
            raise InputError(f"{getattr(feeds, 'label', label)}: {exc}") from None
        return dict(feeds)
    # A dim pinned on one input is pinned wherever its name appears, as optimize pins it.
    pinned = pinned_signature(signature, input_shapes or {}, label)
    try:
        return random_feeds(pinned, seed=seed, images=images)
    except BeyondNumpy as exc:
        raise InputError(f"{label}: {exc}") from None
    except InputError as exc:
        # An .npz holds arrays: a sequence or map can only be fed from Python.
        hint = (f"pin it with {_option('input_shapes')} or pass {_option('feeds')}"
                if all(map(npz_holds, signature))
                else "pass feeds from Python: graphopt.tools.profile.profile_model(path, feeds)")
        raise InputError(f"{label}: {exc}; {hint}") from None


def _shape(model: Model, shapes: Mapping[str, tuple]) -> None:
    """Static shapes for the cost model: the graph inputs as fed, then inference if needed."""
    from graphopt.input_shapes import pin_input_shapes
    from graphopt.passes.infer_shapes import infer_shapes

    inputs = {v.name: list(shapes[v.name]) for v in model.graph.inputs
              if not v.is_constant and v.name in shapes}
    try:
        pin_input_shapes(model, inputs)
    except OptionError:
        pass  # the model's own dims disagree with what ran: keep them, inference decides
    if any(v is not None and v.static_shape is None for n in model.graph for v in n.outputs):
        infer_shapes(model)


# --- aggregation ---------------------------------------------------------------------------


def _collect(profile: Profile, traces: dict[str, list[dict]], skip: int) -> None:
    """Sum each partition's kernel events per kernel over the kept runs and match them."""
    for part in profile.partitions:
        events, kept = kernel_events(traces.get(part.name, []), skip)
        if kept != profile.runs and part.name in traces:
            raise GraphoptError(f"{profile.path}: partition {part.name!r}: onnxruntime's profile "
                                f"holds {kept} run(s) after the warmups, expected {profile.runs}")
        # All names at once: a replacement of an unnamed node is matched by its rank.
        matches = Matcher(profile.models[part.name]).match_all((e.name, e.op_type)
                                                               for e in events)
        by_name: dict[str, Kernel] = {}
        durations: dict[str, list[float]] = {}
        for e in events:
            kernel = by_name.get(e.name)
            if kernel is None:
                node, how = matches[e.name]
                kernel = by_name[e.name] = Kernel(part.name, e.name, e.op_type, e.provider, 0,
                                                  0.0, node.name if node else None, how)
            kernel.calls += 1
            kernel.total_us += e.dur_us
            durations.setdefault(e.name, []).append(e.dur_us)
        for name, kernel in by_name.items():
            kernel.median_us = float(np.median(durations[name]))
        profile.kernels.extend(by_name.values())


def _shapes_known(node) -> bool:
    """Whether every tensor `node` reads and writes has a static shape: the cost model counts
    an unknown one as no work, and a 2M-element Softmax behind a Reshape of data-given sizes
    read as 1 µs of overhead, "bound by per-kernel overhead"; such a kernel is left unpriced."""
    return all(value.static_shape is not None for value in (*node.inputs, *node.outputs)
               if value is not None)


def _price(profile: Profile, cost: CpuCostModel) -> None:
    """The cost model's time and roofline sides for every matched kernel on a host partition
    (the CPU model prices host nodes only; an NPU partition's stand-in run is not its target).
    An If, Loop or Scan is not priced: its time is the kernels its bodies ran (kernel_events
    counts them within it), which the model's cost of the node itself (1 µs of overhead for
    silero-vad's If around its whole network) does not describe; nor is a node whose shapes
    are unknown (_shapes_known)."""
    host = {p.name: {n.name: n for n in profile.models[p.name].graph}
            for p in profile.partitions if p.device == "cpu"}
    for kernel in profile.kernels:
        if kernel.node is None or kernel.partition not in host:
            continue
        node = host[kernel.partition][kernel.node]
        if node.op_type in CONTROL_FLOW or not _shapes_known(node):
            continue
        c = cost.constants[op_class(node)]
        flops, moved = node_work(node)
        kernel.predicted_us = cost.node_seconds(node) * 1e6
        kernel.compute_us = flops / (c.peak_gflops * 1e3) if c.peak_gflops > 0 else 0.0
        kernel.memory_us = moved / (c.bandwidth_gbs * 1e3) if c.bandwidth_gbs > 0 else 0.0

