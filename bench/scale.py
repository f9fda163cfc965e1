"""Scale bench: compile time and peak RSS per stage as a transformer-like graph grows 1k → 100k
nodes, and an .om compile of a model with gigabytes of external weights."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
from _common import compare_outputs, json_path, markdown_table, positive_int, write_json
from onnx import TensorProto, helper, numpy_helper

DESCRIPTION = """\
Compile synthetic transformer-like graphs of about 1k, 10k and 100k nodes (no tuning, -O2,
--target cpu, written as .om) and report wall time and peak RSS per stage: import (load_onnx),
the input check (check_input: schemas and strict shape inference, whose static types are
kept), each step of the -O2 pipeline (a fixed point counts as one step), partitioning for the
cpu target, cutting partition models, memory planning, and the .om write.

Each layer is a pre-norm encoder block over a [1, 8, 16] activation: decomposed LayerNorm,
Q/K/V MatMul+Add with Reshape/Transpose into 2 heads, MatMul/Div/Softmax/MatMul attention,
output projection, residual Add, a second LayerNorm, a 16→64→16 MLP with decomposed erf GELU
(49 nodes, about 12 KB of float32 weights per layer): the fusions all fire, and weights stay
small so the graph, not the bytes, is what grows.

Every compile runs in a fresh Python process, which first reads the model's ONNX file (written
by this bench beforehand). Sizes are interleaved: each of --runs rounds compiles every size
(the small ones three times), so the machine's slow spells weigh on all sizes alike. Peak RSS
per stage: before each stage the child resets the kernel's high-water mark (writing 5 to
/proc/self/clear_refs), and after it reads VmHWM from /proc/self/status, so each figure is the
process's true peak resident set during that stage alone (Python, numpy and onnx included: the
`RSS before` column is the floor). `e2e s` is the wall time of `python -m graphopt optimize
model.onnx -o model.om --target cpu` in another fresh process (interpreter start and imports
included). The reference row times no compiler code: a fresh process walks a linked list of
5 small Python objects per node, how this machine's cost per object grows with the heap.

--weights-gb compiles a model of a few MatMuls whose float32 weights total that many GB,
written to disk with external data (generated one tensor at a time, never held whole), into
an .om, and reports peak RSS against the weight bytes; it then loads the .om with
graphopt.load, runs it, and compares it with onnxruntime on the original. With
--weights-target NPU (ascend310, …) a float64 Relu, which only the host runs, cuts the chain
after nine tenths of its MatMuls: the .om then has npu/cpu/npu partitions sharing the
source's weight tensors."""

EPILOG = """\
examples:
  python bench/scale.py --quick
  python bench/scale.py --json out/scale.json
  python bench/scale.py --weights-gb 3 --json out/scale_weights.json
  python bench/scale.py --weights-gb 3 --weights-target ascend310
  git worktree add /tmp/before HEAD~1 && python bench/scale.py --baseline /tmp/before
"""

# Per-layer geometry: small enough that weights do not dominate memory or time.
SEQ, HIDDEN, HEADS = 8, 16, 2
NODES_PER_LAYER = 49
SIZES = (1_000, 10_000, 100_000)
# The growth ratio divides by the smallest size's time, a fraction of a second that a moment of
# interference moves by tens of percent: sizes this small are cheap to run more often.
SMALL_NODES, SMALL_RUNS_FACTOR = 20_000, 3


# --- the synthetic graph -------------------------------------------------------------------


def transformer_model(layers: int, seed: int = 0) -> onnx.ModelProto:
    """`layers` pre-norm encoder blocks (49 nodes each) with static shapes and random weights."""
    rng = np.random.default_rng(seed)
    ffn, head_dim = HIDDEN * 4, HIDDEN // HEADS
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    count = 0

    def weight(name: str, *shape: int) -> str:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        inits.append(numpy_helper.from_array(data, name))
        return name

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(op_type: str, inputs: list[str], **attrs) -> str:
        nonlocal count
        count += 1
        out = f"{op_type.lower()}_{count}"
        nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{count}", **attrs))
        return out

    heads = const("shape_heads", np.array([1, SEQ, HEADS, head_dim], np.int64))
    flat = const("shape_flat", np.array([1, SEQ, HIDDEN], np.int64))
    eps, two = const("eps", np.float32(1e-5)), const("two", np.float32(2.0))
    scale = const("scale", np.float32(np.sqrt(head_dim)))
    sqrt2, one, half = (const("sqrt2", np.float32(np.sqrt(2.0))), const("one", np.float32(1.0)),
                        const("half", np.float32(0.5)))

    def layer_norm(x: str, prefix: str) -> str:
        mean = op("ReduceMean", [x], axes=[-1])
        centered = op("Sub", [x, mean])
        var = op("ReduceMean", [op("Pow", [centered, two])], axes=[-1])
        normed = op("Div", [centered, op("Sqrt", [op("Add", [var, eps])])])
        scaled = op("Mul", [normed, weight(prefix + "gamma", HIDDEN)])
        return op("Add", [scaled, weight(prefix + "beta", HIDDEN)])

    def linear(x: str, prefix: str, n_in: int, n_out: int) -> str:
        return op("Add", [op("MatMul", [x, weight(prefix + "w", n_in, n_out)]),
                          weight(prefix + "b", n_out)])

    def split_heads(x: str, perm: list[int]) -> str:
        return op("Transpose", [op("Reshape", [x, heads])], perm=perm)

    x = "x"
    for layer in range(layers):
        p = f"l{layer}_"
        h = layer_norm(x, p + "ln1_")
        q = split_heads(linear(h, p + "q_", HIDDEN, HIDDEN), [0, 2, 1, 3])
        k = split_heads(linear(h, p + "k_", HIDDEN, HIDDEN), [0, 2, 3, 1])
        v = split_heads(linear(h, p + "v_", HIDDEN, HIDDEN), [0, 2, 1, 3])
        probs = op("Softmax", [op("Div", [op("MatMul", [q, k]), scale])], axis=-1)
        context = op("Transpose", [op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        x = op("Add", [x, linear(op("Reshape", [context, flat]), p + "o_", HIDDEN, HIDDEN)])
        h = linear(layer_norm(x, p + "ln2_"), p + "fc1_", HIDDEN, ffn)
        erf = op("Erf", [op("Div", [h, sqrt2])])
        gelu = op("Mul", [op("Mul", [h, op("Add", [erf, one])]), half])
        x = op("Add", [x, linear(gelu, p + "fc2_", ffn, HIDDEN)])
    graph = helper.make_graph(
        nodes, "scale_transformer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, SEQ, HIDDEN])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# --- measuring one size in a fresh process --------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    # Linux ≥ 4.0: "5" resets VmHWM to the current RSS, so the next reading is this stage's peak.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Stages:
    """Wall seconds and peak RSS of consecutive stages of one process."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def run(self, name: str, fn, *args, **kwargs):
        before = _status_kib("VmRSS")
        _reset_peak()
        start = time.perf_counter()
        value = fn(*args, **kwargs)
        seconds = time.perf_counter() - start
        self.rows.append({"stage": name, "seconds": seconds, "rss_before_mb": before / 1024,
                          "peak_rss_mb": _status_kib("VmHWM") / 1024})
        return value


def _pipeline_steps(pipeline) -> list[tuple[str, object]]:
    from graphopt.passes.pipelines import FixedPoint

    labels = []
    for step in pipeline.steps:
        if isinstance(step, FixedPoint):
            kind = "fold" if "FoldConstants" in step.passes else \
                "fuse" if "FuseMatMul" in step.passes else "cleanup"
            labels.append((f"passes: {kind} fixed point", step))
        else:
            labels.append((f"passes: {step}", step))
    return labels


def _warm_up_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    return helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "warm_up", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)])


def compile_stages(path: str, om_path: str) -> dict:
    """The steps of `graphopt.optimize(path, target="cpu")` + `save(…, om_path)`, called one by
    one (as compiler.optimize calls them) so each has its own time and peak."""
    # Modules the stages import lazily, loaded now: a stage's time is compile work, not
    # module loading (which would weigh most at the smallest size and flatter the growth).
    # (By name: pyflakes reads a bare `import graphopt.x` as unused and does not honour noqa.)
    for module in ("graphopt.codegen.split", "graphopt.partition.report", "graphopt.passes.memory",
                   "graphopt.tuner.records"):
        importlib.import_module(module)
    from graphopt.codegen.split import partition_ir
    from graphopt.compile_checks import check_input
    from graphopt.compile_memory import plan_partition_memory
    from graphopt.compile_result import OptimizeResult, op_counts
    from graphopt.compile_save import save
    from graphopt.ir import load_onnx
    from graphopt.opcheck import check_ops, runtime_schemas
    from graphopt.partition import load_target, partition
    from graphopt.passes import (
        PIPELINES,
        Options,
        PassContext,
        PassLog,
        PassManager,
        for_target,
    )
    from graphopt.passes.pipelines import Pipeline

    # One-time setup, done now for the same reason: onnxruntime's schema list (cached) and
    # ONNX's checker and shape inference, whose first call costs ~40 ms whatever the model.
    runtime_schemas()
    check_ops(load_onnx(_warm_up_model()), "warm-up", False)
    stages = Stages()
    target = load_target("cpu")
    model = stages.run("import", load_onnx, path)
    stages.run("check ops", check_input, model, path, False)
    ops_before = op_counts(model.graph.all_nodes())
    options = Options(level=2)
    options.nchwc_block_size = target.device(target.primary).nchwc_block_size
    pipeline = for_target(PIPELINES[2], target)
    ctx = PassContext(options, target=target)
    log = PassLog(pipeline.name)
    for label, step in _pipeline_steps(pipeline):
        part = stages.run(label, PassManager(Pipeline(pipeline.name, "", (step,)), ctx).run, model)
        log.records.extend(part.records)
    result = OptimizeResult(model, log, path, None, ops_before)
    result.partitioning = stages.run("partition", partition, model, target)
    result.partition_models = stages.run("cut partitions", partition_ir, model,
                                         result.partitioning)
    result.memory_plans = stages.run("memory plan", plan_partition_memory,
                                     result.partition_models)
    stages.run("write .om", save, result, om_path)
    per_pass = {name: round(entry["seconds"], 4) for name, entry in log.totals().items()}
    return {"stages": stages.rows, "passes": per_pass, "nodes_after": len(model.graph),
            "partitions": len(result.partitioning.partitions),
            "om_megabytes": os.path.getsize(om_path) / 1e6}


class _Linked:
    """A stand-in for an IR node: a name, input and output lists, an attribute dict."""
    __slots__ = ("name", "inputs", "outputs", "attrs", "next")


def reference_walk(nodes: int, walks: int = 5) -> float:
    """Seconds per object of walking a linked list of 5 × `nodes` small Python objects (each
    a slotted object, two lists, a dict and a name looked up in a dict), median of `walks`.
    No compiler code runs: how this machine's time per object grows with the heap (caches,
    TLB) alone, the floor under the compile's own growth."""
    count = 5 * nodes
    by_name: dict[str, _Linked] = {}
    head = None
    for i in range(count):
        item = _Linked()
        item.name, item.inputs, item.outputs = f"node_{i}", [f"v{i}", f"v{i + 1}"], [f"v{i + 2}"]
        item.attrs, item.next = {"axis": i}, head
        by_name[item.name] = head = item
    times = []
    for _ in range(walks):
        start = time.perf_counter()
        total, item = 0, head
        while item is not None:
            total += len(by_name[item.name].inputs[0]) + item.attrs["axis"] + len(item.outputs)
            item = item.next
        times.append((time.perf_counter() - start) / count)
    return statistics.median(times)


def _child(args) -> int:
    out = compile_stages(args.child, args.child_om)
    with open(args.child_json, "w") as f:
        json.dump(out, f)
    return 0


def _write_model(nodes: int, workdir: str) -> dict:
    """The synthetic model of about `nodes` nodes on disk: {"layers", "nodes", "path", …}."""
    layers = max(1, round(nodes / NODES_PER_LAYER))
    path = os.path.join(workdir, f"scale_{layers}.onnx")
    start = time.perf_counter()
    proto = transformer_model(layers)
    onnx.save(proto, path)
    return {"layers": layers, "nodes": len(proto.graph.node), "path": path,
            "om": os.path.join(workdir, f"scale_{layers}.om"),
            "generate_seconds": time.perf_counter() - start}


def _compile_once(size: dict, workdir: str) -> tuple[dict, float]:
    """One fresh-process staged compile and one fresh-process CLI compile of `size`'s model:
    (the child's report, the CLI's wall seconds)."""
    report = os.path.join(workdir, "child.json")
    subprocess.run([sys.executable, __file__, "--child", size["path"], "--child-om", size["om"],
                    "--child-json", report], check=True)
    with open(report) as f:
        staged = json.load(f)
    os.remove(size["om"])
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "graphopt", "optimize", size["path"], "-o", size["om"],
                    "--target", "cpu", "-q"], check=True)
    e2e = time.perf_counter() - start
    os.remove(size["om"])
    return staged, e2e


def _staged_baseline(size: dict, workdir: str, baseline: str) -> dict:
    """One fresh-process staged compile of `size`'s model with the graphopt checkout at
    `baseline` (its own bench/scale.py and package)."""
    report = os.path.join(workdir, "baseline.json")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(baseline)}
    subprocess.run([sys.executable, os.path.join(baseline, "bench", "scale.py"), "--child",
                    size["path"], "--child-om", size["om"], "--child-json", report],
                   check=True, env=env)
    with open(report) as f:
        staged = json.load(f)
    os.remove(size["om"])
    return staged


def _total(staged: dict) -> float:
    return sum(row["seconds"] for row in staged["stages"])


def measure_sizes(node_counts: list[int], workdir: str, runs: int,
                  baseline: str | None = None) -> list[dict]:
    """`runs` rounds; each round compiles every size once (sizes below SMALL_NODES
    SMALL_RUNS_FACTOR times), so a slow spell of the machine lands on every size alike rather
    than on whichever size ran then. Per size: each stage's median seconds and highest peak,
    the median e2e, every run, and per round the ratio of its total to the smallest size's
    (median of that round's runs of it). With `baseline` (another checkout), each staged
    compile is paired with one with that checkout's code, the two taking turns to go first:
    the side-by-side totals."""
    sizes = [_write_model(n, workdir) for n in node_counts]
    runs_of = {id(s): [] for s in sizes}
    e2e_of = {id(s): [] for s in sizes}
    walks_of = {id(s): [] for s in sizes}  # reference_walk, fresh process, seconds per object
    baseline_of = {id(s): [] for s in sizes}  # the baseline checkout's staged compiles
    round_totals: list[list[float]] = []
    for done in range(runs):
        medians = []
        for size in sizes:
            repeat = SMALL_RUNS_FACTOR if size["nodes"] < SMALL_NODES else 1
            totals = []
            for _ in range(repeat):
                # Which checkout goes first alternates: the second finds caches the first warmed.
                baseline_first = baseline and len(runs_of[id(size)]) % 2 == 1
                if baseline_first:
                    baseline_of[id(size)].append(_staged_baseline(size, workdir, baseline))
                staged, e2e = _compile_once(size, workdir)
                if baseline and not baseline_first:
                    baseline_of[id(size)].append(_staged_baseline(size, workdir, baseline))
                runs_of[id(size)].append(staged)
                e2e_of[id(size)].append(e2e)
                totals.append(_total(staged))
            medians.append(statistics.median(totals))
            walk = subprocess.run([sys.executable, __file__, "--reference-child",
                                   str(size["nodes"])], check=True, capture_output=True, text=True)
            walks_of[id(size)].append(json.loads(walk.stdout))
        round_totals.append(medians)
        print(f"round {done + 1}/{runs}: " + ", ".join(
            f"{s['nodes']} nodes {t:.3g} s" for s, t in zip(sizes, medians)),
            file=sys.stderr, flush=True)
    results = []
    for i, size in enumerate(sizes):
        each = runs_of[id(size)]
        os.remove(size["path"])
        result = dict(each[-1])
        result["stages"] = [
            {"stage": rows[0]["stage"],
             "seconds": statistics.median(r["seconds"] for r in rows),
             "rss_before_mb": max(r["rss_before_mb"] for r in rows),
             "peak_rss_mb": max(r["peak_rss_mb"] for r in rows)}
            for rows in zip(*(run["stages"] for run in each))]
        result.update(layers=size["layers"], nodes=size["nodes"],
                      generate_seconds=size["generate_seconds"],
                      e2e_seconds=statistics.median(e2e_of[id(size)]), e2e_runs=e2e_of[id(size)],
                      round_ratios=[totals[i] / totals[0] for totals in round_totals],
                      walk_seconds_per_object=statistics.median(walks_of[id(size)]), runs=each)
        if baseline:
            result["baseline"] = {"totals": [_total(r) for r in baseline_of[id(size)]],
                                  "totals_here": [_total(r) for r in each],
                                  "runs": baseline_of[id(size)]}
        results.append(result)
    return results


def format_sizes(results: list[dict]) -> str:
    """One row per stage, two columns (seconds, peak RSS MiB) per size, and totals."""
    headers = ["stage"]
    for r in results:
        headers += [f"{r['nodes']} nodes s", "peak MiB"]
    names = [row["stage"] for row in results[0]["stages"]]
    body = []
    for i, name in enumerate(names):
        cells = [name]
        for r in results:
            row = r["stages"][i]
            cells += [f"{row['seconds']:.3g}", f"{row['peak_rss_mb']:.0f}"]
        body.append(cells)
    total = ["total (sum of stages)"]
    e2e = ["e2e: graphopt optimize CLI"]
    growth = ["× smallest size, per node"]
    rounds = ["× smallest size, per round: median (min–max)"]
    walk = ["reference: Python object walk, ns per object (× smallest)"]
    base = results[0]
    base_total = sum(row["seconds"] for row in base["stages"])
    for r in results:
        seconds = sum(row["seconds"] for row in r["stages"])
        total += [f"{seconds:.3g}", f"{max(row['peak_rss_mb'] for row in r['stages']):.0f}"]
        e2e += [f"{r['e2e_seconds']:.3g}", ""]
        ratio = seconds / base_total
        growth += [f"{ratio:.1f}× ({ratio / (r['nodes'] / base['nodes']):.2f})", ""]
        each = r.get("round_ratios") or [ratio]
        rounds += [f"{statistics.median(each):.1f}× ({min(each):.1f}–{max(each):.1f})", ""]
        if "walk_seconds_per_object" in r:
            per_object = r["walk_seconds_per_object"]
            walk += [f"{per_object * 1e9:.0f} "
                     f"({per_object / base['walk_seconds_per_object']:.2f})", ""]
    body += [total, e2e, growth, rounds] + ([walk] if len(walk) > 1 else [])
    return markdown_table(headers, body)


def format_baseline(results: list[dict], baseline: str) -> str:
    """Per size: the baseline's and this checkout's median total, and their ratio."""
    body = []
    for r in results:
        theirs, ours = r["baseline"]["totals"], r["baseline"]["totals_here"]
        pairs = [a / b for a, b in zip(theirs, ours)]
        body.append([str(r["nodes"]), f"{statistics.median(theirs):.3g}",
                     f"{statistics.median(ours):.3g}",
                     f"{statistics.median(theirs) / statistics.median(ours):.2f}× "
                     f"({min(pairs):.2f}–{max(pairs):.2f})"])
    return markdown_table(["nodes", f"baseline ({baseline}) s", "this checkout s",
                           "baseline / this (range over run pairs)"], body)


# --- gigabytes of weights -------------------------------------------------------------------


def weights_model(path: str, gigabytes: float, width: int = 4096, seed: int = 0,
                  host_cut: bool = False) -> dict:
    """A chain of MatMul(+Add) with [width, width] float32 weights totalling `gigabytes`,
    saved at `path` with every weight in `path`.data; one weight is in memory at a time.
    `host_cut` puts Cast→float64 Relu→Cast after nine tenths of the MatMuls: no NPU kernel
    takes float64, so an NPU target cuts the chain into three partitions there."""
    matrix_bytes = width * width * 4
    count = max(1, round(gigabytes * 1e9 / matrix_bytes))
    data_name = os.path.basename(path) + ".data"
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    offset = 0
    with open(path + ".data", "wb") as blob:
        for i in range(count):
            # Scaled so activations neither vanish nor blow up through the chain.
            w = (rng.standard_normal((width, width), dtype=np.float32)
                 * np.float32(1 / np.sqrt(width)))
            blob.write(w.tobytes())
            tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[width, width])
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)),
                               ("length", str(matrix_bytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += matrix_bytes
            inits.append(tensor)
            inits.append(numpy_helper.from_array(np.full(width, 0.01, np.float32), f"b{i}"))
            mm = f"mm{i}"
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [mm], name=f"matmul{i}"))
            nodes.append(helper.make_node("Add", [mm, f"b{i}"], [f"h{i}"], name=f"add{i}"))
            x = f"h{i}"
            if host_cut and i == max(0, count * 9 // 10 - 1) and i < count - 1:
                nodes += [helper.make_node("Cast", [x], ["wide"], to=TensorProto.DOUBLE),
                          helper.make_node("Relu", ["wide"], ["wide_relu"], name="host_relu"),
                          helper.make_node("Cast", ["wide_relu"], ["narrow"],
                                           to=TensorProto.FLOAT)]
                x = "narrow"
            del w
    graph = helper.make_graph(
        nodes, "scale_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return {"matrices": count, "width": width, "weight_bytes": offset}


def _weights_child(args) -> int:
    from graphopt.compile_save import save
    from graphopt.compiler import optimize

    stages = Stages()
    result = stages.run("optimize (import, -O2, partition, plan)", optimize, args.weights_child,
                        target=args.weights_target)
    stages.run("write .om", save, result, args.child_om)
    with open(args.child_json, "w") as f:
        json.dump({"stages": stages.rows}, f)
    return 0


def measure_weights(gigabytes: float, workdir: str, target: str = "cpu") -> dict:
    import onnxruntime as ort

    from graphopt import load

    path = os.path.join(workdir, "weights.onnx")
    om = os.path.join(workdir, "weights.om")
    info = weights_model(path, gigabytes, host_cut=target != "cpu")
    report = os.path.join(workdir, "child.json")
    subprocess.run([sys.executable, __file__, "--weights-child", path, "--child-om", om,
                    "--child-json", report, "--weights-target", target], check=True)
    with open(report) as f:
        result = json.load(f) | info
    result["om_bytes"] = os.path.getsize(om)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, info["width"]), np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    del session
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NPU partitions on the CPU stand-in
        compiled = load(om)
    actual = compiled.run(feeds)
    result["load_run_seconds"] = time.perf_counter() - start
    result["partitions"] = [f"{name} ({size / 1e9:.2f} GB)" for name, size
                            in _partition_weight_bytes(om).items()]
    check = compare_outputs(expected, actual)
    result["max_abs_diff"], result["within_tolerance"] = check.worst, check.ok
    del compiled
    return result


def _partition_weight_bytes(om: str) -> dict[str, int]:
    """The bytes of each partition's weights blob (0 without one)."""
    from graphopt.codegen import load_om
    from graphopt.codegen.om_weights import weights_member

    artifact = load_om(om, defer_checks=True)
    return {part["name"]: artifact.spans.get(weights_member(part["name"]), (0, 0))[1]
            for part in artifact.manifest["partitions"]}


def format_weights(result: dict) -> str:
    weight_mb = result["weight_bytes"] / 1e6
    rows = [[row["stage"], f"{row['seconds']:.3g}", f"{row['rss_before_mb']:.0f}",
             f"{row['peak_rss_mb']:.0f}", f"{row['peak_rss_mb'] * 1.048576 / weight_mb:.2f}"]
            for row in result["stages"]]
    return markdown_table(["stage", "s", "RSS before MiB", "peak RSS MiB", "peak / weight bytes"],
                          rows)


# --- driver ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scale.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1k and 10k nodes only (under a minute)")
    p.add_argument("--sizes", metavar="N,N,…",
                   help=f"node counts to compile (default {','.join(map(str, SIZES))})")
    p.add_argument("--runs", type=positive_int, metavar="N",
                   help="fresh-process runs per size, three times as many below "
                        f"{SMALL_NODES:,} nodes; stage times are medians, peaks the highest "
                        "(default 3, 1 with --quick)")
    p.add_argument("--weights-gb", type=float, metavar="GB",
                   help="instead: compile a model with GB gigabytes of external weights")
    p.add_argument("--weights-target", metavar="TARGET", default="cpu",
                   help="the --weights-gb compile's target (default cpu); an NPU target gets "
                        "a host-only op near the end of the chain, so three partitions")
    p.add_argument("--workdir", metavar="DIR",
                   help="where the models are written (default: a temporary folder; the "
                        "--weights-gb model needs twice GB free there)")
    p.add_argument("--baseline", metavar="DIR",
                   help="also compile each size with the graphopt checkout in DIR (e.g. a "
                        "`git worktree` of an older commit), interleaved, and print both "
                        "totals side by side")
    p.add_argument("--json", metavar="FILE", type=json_path,
                   help="also write the results as JSON to FILE")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--reference-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--weights-child", help=argparse.SUPPRESS)
    p.add_argument("--child-om", help=argparse.SUPPRESS)
    p.add_argument("--child-json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sizes:
        try:
            # Smallest first: the growth columns divide by the first size's figures.
            args.sizes = sorted(int(s) for s in args.sizes.split(","))
        except ValueError:
            p.error(f"--sizes {args.sizes}: expected comma-separated node counts")
        if any(s < NODES_PER_LAYER for s in args.sizes):
            p.error(f"--sizes: each size must be at least {NODES_PER_LAYER} (one layer)")
    else:
        args.sizes = list(SIZES[:2] if args.quick else SIZES)
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.weights_gb is not None and args.weights_gb <= 0:
        p.error("--weights-gb must be positive")
    if args.workdir and not os.path.isdir(args.workdir):  # tempfile makes no missing folder
        p.error(f"--workdir {args.workdir}: not a directory")
    if args.baseline and not os.path.isfile(os.path.join(args.baseline, "bench", "scale.py")):
        p.error(f"--baseline {args.baseline}: not a graphopt checkout (no bench/scale.py)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return _child(args)
    if args.reference_child:
        print(json.dumps(reference_walk(args.reference_child)))
        return 0
    if args.weights_child:
        return _weights_child(args)
    if not os.path.exists("/proc/self/clear_refs"):
        print("scale.py needs Linux /proc (peak RSS per stage)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="graphopt-scale-", dir=args.workdir) as workdir:
        runs = "" if args.weights_gb is not None else \
            (f"median of {args.runs} fresh-process run(s) per size "
             f"({args.runs * SMALL_RUNS_FACTOR} below {SMALL_NODES:,} nodes); ")
        target = args.weights_target if args.weights_gb is not None else "cpu"
        header = (f"graphopt -O2 --target {target} → .om, no tuning; {runs}python "
                  f"{platform.python_version()}, onnx {onnx.__version__}, {os.cpu_count()} CPUs. "
                  "Peak RSS per stage: VmHWM after resetting it (clear_refs) at the stage's start.")
        if args.weights_gb is not None:
            result = measure_weights(args.weights_gb, workdir, args.weights_target)
            print(header)
            print(f"\n{result['matrices']} MatMul weights of [{result['width']}, "
                  f"{result['width']}] float32 = {result['weight_bytes'] / 1e9:.2f} GB "
                  f"({result['weight_bytes'] / 2**20:.0f} MiB) in external data; .om "
                  f"{result['om_bytes'] / 1e9:.2f} GB; partitions: "
                  f"{', '.join(result['partitions'])}\n")
            print(format_weights(result))
            print(f"\n.om load + first run {result['load_run_seconds']:.3g} s; max |Δ| against "
                  f"onnxruntime on the original {result['max_abs_diff']:.1e}"
                  + ("" if result["within_tolerance"] else " ✗ beyond tolerance"))
            data = {"bench": "scale_weights", **result}
        else:
            results = measure_sizes(args.sizes, workdir, args.runs, args.baseline)
            print(header)
            print()
            print(format_sizes(results))
            print("\n× smallest size: total time over the smallest size's (in brackets: "
                  "divided by the node ratio, 1.00 = linear); per round: the same ratio within "
                  "each round of the interleaved runs. e2e: the CLI, a fresh process "
                  "(interpreter start, imports, input checks included). Reference: a linked "
                  "list of 5 small Python objects per node walked in a fresh process, no "
                  "compiler code (in brackets: over the smallest size, 1.00 = flat), how this "
                  "machine's cost per object grows with the heap alone.")
            if args.baseline:
                print("\nSide by side, each staged compile beside the baseline's on the same "
                      "model, which goes first alternating by round (sum of stages, "
                      "medians):\n")
                print(format_baseline(results, args.baseline))
            data = {"bench": "scale", "sizes": results}
    data["command"] = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    if args.json:
        write_json(args.json, data)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
