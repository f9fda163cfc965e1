"""INT8 precision: graphopt's QuantizeInt8 beside onnxruntime's quantize_static and
quantize_dynamic, latency and accuracy against FP32, on a BERT-like and a ResNet-like model."""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import io
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from _common import (Stats, json_path, markdown_table, non_negative_int, positive_int,
                     positive_ints, session_options, short_reason, write_json)
from _models import Wanted, check_folder, matching, unmatched

import graphopt
from graphopt import zoo
from graphopt.codegen import OmSession

DESCRIPTION = """\
Per model, at each thread count: FP32 (the original at ORT_ENABLE_ALL); graphopt INT8 (the .om of
`graphopt.optimize(target="cpu", quantize="int8")`, run by graphopt.load's OmSession), once with
the default quant_keep_ends (layers that read a graph input or write a graph output stay float: a
classifier's stem and FC; none in a BERT encoder) and once with every layer quantized;
onnxruntime's quantize_static (QDQ, per-channel int8 weights, uint8 activations, min-max, the same
calibration samples) and quantize_dynamic (int8 weights), both at ORT_ENABLE_ALL; with
--npu-target, graphopt INT8 compiled for that NPU target too (AMCT's QDQ form, run by the CPU
provider standing in for CANN's: its accuracy counts, its time does not); with
--equalization-off, graphopt INT8 without channel equalization too (and for the NPU target, with
both). Variants run
interleaved after warm-up; figures are medians (min-max) in ms and the ratio FP32 / variant
(above 1: faster). Accuracy on N held-out samples the calibration never saw: mean and minimum
cosine of the output to FP32's (at ORT_DISABLE_ALL) and, for the classifier, top-1 agreement and
the logit error |variant - FP32| in units of each sample's FP32 logit standard deviation (σ),
mean over every logit and max.

Inputs: BERT gets token ids drawn like zoo.sample_inputs (seq 128, padded tails); ResNet gets
images with structure rather than white noise: a few smooth colour blobs over a gradient plus mild
noise, ImageNet-normalized, so activations have the spatial correlation of photographs. The zoo's
weights are seeded random (no downloads): top-1 agreement is measured against FP32's own
prediction, and the number of distinct FP32 classes over the samples is printed beside it."""

EPILOG = """\
examples:
  python bench/precision.py
  python bench/precision.py --threads 1,2 --samples 64 --json out/precision.json
  python bench/precision.py --shared ../shared/models --only resnet
  python bench/precision.py --only resnet --npu-target ascend310 --samples 256
"""


@dataclass
class Model:
    name: str
    path: str
    calibration: list[dict]     # feeds the quantizers calibrate on
    held_out: list[dict]        # feeds accuracy is measured on
    classifier: bool


@dataclass
class Variant:
    key: str
    name: str
    path: str | None = None
    error: str | None = None
    build_seconds: float | None = None
    times: dict[int, list[float]] = field(default_factory=dict)
    cosines: list[float] = field(default_factory=list)
    agree: int = 0
    errors_sigma: list[float] = field(default_factory=list)  # classifier: mean |Δ|/σ per sample
    max_error_sigma: float = 0.0


# ---------------------------------------------------------------------------------------------
# inputs

def _seed(args, default: int) -> int:
    """The held-out samples' seed: --eval-seed, or the model kind's default."""
    return default if args.eval_seed is None else args.eval_seed


def structured_images(n: int, seed: int, shape=(1, 3, 224, 224)) -> list[dict]:
    """Smooth colour blobs over a gradient plus mild noise, ImageNet-normalized."""
    rng = np.random.default_rng(seed)
    _, c, h, w = shape
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    mean = np.array([0.485, 0.456, 0.406])[:, None, None]
    std = np.array([0.229, 0.224, 0.225])[:, None, None]
    images = []
    for _ in range(n):
        img = rng.uniform(0, 1, (c, 1, 1)) * (1 - xx) + rng.uniform(0, 1, (c, 1, 1)) * yy
        for _ in range(int(rng.integers(2, 6))):
            cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
            img = img * (1 - blob) + rng.uniform(0, 1, (c, 1, 1)) * blob
        img = np.clip(img + rng.normal(0, 0.03, img.shape), 0, 1)
        images.append({"input": ((img - mean) / std)[None].astype(np.float32)})
    return images


def token_feeds(proto, n: int, seed: int, seq: int) -> list[dict]:
    return [zoo.sample_inputs(proto, seed=seed + i, dims={"sequence_length": seq})
            for i in range(n)]


def build_models(args, workdir: str, wanted: Wanted):
    """Yields each model `wanted` once its file is written (one big model on disk at a time)."""
    n_cal, n_eval = args.calibration_samples, args.samples
    if wanted("zoo/bert_base"):
        options = {} if args.full else {"layers": args.bert_layers}
        proto = zoo.build("bert_base", **options)
        path = os.path.join(workdir, "bert.onnx")
        onnx.save(proto, path)
        label = "zoo/bert_base" + ("" if args.full else f" ({args.bert_layers} layers)") \
            + f", seq {args.seq}"
        yield Model(label, path, token_feeds(proto, n_cal, 1000, args.seq),
                    token_feeds(proto, n_eval, _seed(args, 5000), args.seq), False)
        del proto
        os.remove(path)
    if wanted("zoo/resnet50"):
        path = os.path.join(workdir, "resnet50.onnx")
        onnx.save(zoo.build("resnet50"), path)
        yield Model("zoo/resnet50", path, structured_images(n_cal, 1),
                    structured_images(n_eval, _seed(args, 2)), True)
        os.remove(path)
    for path in sorted(glob.glob(os.path.join(args.shared, "*.onnx"))) if args.shared else ():
        name = f"shared/{os.path.basename(path)[:-5]}"
        if not wanted(name):
            continue
        proto = onnx.load(path, load_external_data=False)
        inputs = [i for i in proto.graph.input
                  if i.name not in {t.name for t in proto.graph.initializer}]
        dims = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim]
        if len(inputs) == 1 and len(dims) == 4 and dims[1] == 3:
            shape = (1, 3, dims[2] or 224, dims[3] or 224)
            cal = [{inputs[0].name: f["input"]} for f in structured_images(n_cal, 1, shape)]
            held = [{inputs[0].name: f["input"]}
                    for f in structured_images(n_eval, _seed(args, 2), shape)]
            yield Model(name, path, cal, held, True)
        else:
            yield Model(name, path, token_feeds(proto, n_cal, 1000, args.seq),
                        token_feeds(proto, n_eval, _seed(args, 5000), args.seq), False)


# ---------------------------------------------------------------------------------------------
# variants

@contextlib.contextmanager
def _quiet():
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


class _Reader:
    """onnxruntime's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)

    def rewind(self):  # some onnxruntime versions call it
        pass


def build_variants(model: Model, workdir: str, seq: int,
                   quant_skip: set[str] | None = None,
                   npu_target: str | None = None,
                   equalization_off: bool = False) -> list[Variant]:
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    calib = os.path.join(workdir, "calibration.npz")
    np.savez(calib, **{k: np.stack([f[k] for f in model.calibration])
                       for k in model.calibration[0]})
    shapes = {k: list(v.shape) for k, v in model.calibration[0].items()}
    variants = [Variant("fp32", "FP32 (ORT_ENABLE_ALL)", model.path)]

    def timed(variant: Variant, make) -> None:
        start = time.perf_counter()
        try:
            with _quiet():
                make()
        except Exception as e:  # noqa: BLE001 - a failure is a table cell
            variant.error, variant.path = short_reason(e), None
        variant.build_seconds = time.perf_counter() - start
        variants.append(variant)

    # (key, row name, quant_keep_ends, quant_skip, target, quant_equalize)
    graphopt_rows = [("graphopt", "graphopt INT8 .om", True, set(), "cpu", True),
                     ("graphopt_all", "graphopt INT8 .om, keep_ends off", False, set(), "cpu",
                      True)]
    if equalization_off:
        graphopt_rows.append(("graphopt_flat", "graphopt INT8 .om, equalization off", True,
                              set(), "cpu", False))
    if quant_skip:
        graphopt_rows.append(("graphopt_skip", "graphopt INT8 .om, --quant-skip", True,
                              quant_skip, "cpu", True))
    if npu_target:
        # AMCT's form for the NPU, run here by the CPU provider standing in for CANN's: its
        # accuracy is the NPU's (up to float16 rounding), its time is not.
        graphopt_rows.append(("graphopt_npu", f"graphopt INT8 .om, {npu_target} (CPU stand-in)",
                              True, set(), npu_target, True))
        if equalization_off:
            graphopt_rows.append(("graphopt_npu_flat",
                                  f"graphopt INT8 .om, {npu_target}, equalization off", True,
                                  set(), npu_target, False))
    for key, name, keep, skip, target, equalize in graphopt_rows:
        path = os.path.join(workdir, f"{key}.om")

        def make(path=path, keep=keep, skip=skip, target=target, equalize=equalize):
            result = graphopt.optimize(model.path, target=target, input_shapes=shapes,
                                       pass_options={"quantize": "int8", "calibration": calib,
                                                     "quant_keep_ends": keep,
                                                     "quant_skip": skip,
                                                     "quant_equalize": equalize})
            graphopt.save(result, path)
        timed(Variant(key, name, path), make)
    static = os.path.join(workdir, "ort_static.onnx")
    timed(Variant("ort_static", "ORT quantize_static (QDQ)", static),
          lambda: quantize_static(model.path, static, _Reader(model.calibration),
                                  quant_format=QuantFormat.QDQ, per_channel=True,
                                  activation_type=QuantType.QUInt8,
                                  weight_type=QuantType.QInt8))
    dynamic = os.path.join(workdir, "ort_dynamic.onnx")
    timed(Variant("ort_dynamic", "ORT quantize_dynamic", dynamic),
          lambda: quantize_dynamic(model.path, dynamic, weight_type=QuantType.QInt8))
    return variants


def open_runner(variant: Variant, threads: int):
    """A function feeds → list of outputs, in the model's output order."""
    config = {"session.force_spinning_stop": "1"}
    if variant.path.endswith(".om"):
        om = OmSession(variant.path, intra_op_num_threads=threads, inter_op_num_threads=1,
                       session_config=config)
        names = [e["name"] for e in om.outputs]
        return lambda feeds: [om.run(feeds)[n] for n in names]
    options = session_options("all", threads=threads)
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    sess = ort.InferenceSession(variant.path, options, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    denominator = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denominator) if denominator else float(np.array_equal(a, b))


def measure(model: Model, variants: list[Variant], args) -> dict:
    ready = [v for v in variants if v.error is None]
    reference = [graphopt.numerics.run(onnx.load(model.path), f)
                 for f in model.held_out]  # ORT_DISABLE_ALL
    ref_first = [next(iter(r.values())) for r in reference]
    for threads in args.thread_counts:
        runners = {}
        for v in ready:
            try:
                runners[v.key] = open_runner(v, threads)
            except Exception as e:  # noqa: BLE001
                v.error = short_reason(e)
        feeds = model.held_out[0]
        for _ in range(args.warmup):
            for key, run in runners.items():
                run(feeds)
        times = {key: [] for key in runners}
        gc.collect()
        gc.disable()
        try:
            for i in range(args.runs):
                for key, run in runners.items():
                    start = time.perf_counter()
                    run(feeds)
                    times[key].append((time.perf_counter() - start) * 1e3)
        finally:
            gc.enable()
        for v in ready:
            if v.key in times:
                v.times[threads] = times[v.key]
        if threads == args.thread_counts[0]:
            for v in ready:
                if v.key not in runners:
                    continue
                for f, ref in zip(model.held_out, ref_first):
                    out = runners[v.key](f)[0]
                    v.cosines.append(cosine(ref, out))
                    v.agree += int(np.argmax(ref.reshape(ref.shape[0], -1), -1)[0]
                                   == np.argmax(out.reshape(out.shape[0], -1), -1)[0])
                    if model.classifier:
                        sigma = float(np.std(ref)) or 1.0
                        error = np.abs(out.astype(np.float64) - ref) / sigma
                        v.errors_sigma.append(float(error.mean()))
                        v.max_error_sigma = max(v.max_error_sigma, float(error.max()))
        runners.clear()
        gc.collect()
    classes = len({int(np.argmax(r.reshape(r.shape[0], -1), -1)[0]) for r in ref_first})
    return {"distinct_fp32_top1": classes}


# ---------------------------------------------------------------------------------------------
# output

def table(rows: list[tuple[Model, list[Variant], dict]], threads: list[int]) -> str:
    headers = ["model", "variant"]
    for t in threads:
        headers += [f"{t}T ms", f"{t}T ×FP32"]
    headers += ["cosine mean / min", "top-1 agree", "logit err mean / max (σ)"]
    classifiers = any(model.classifier for model, _, _ in rows)
    body = []
    for model, variants, extra in rows:
        fp32 = variants[0]
        for i, v in enumerate(variants):
            cells = [model.name if i == 0 else "", v.name]
            if v.error:
                body.append(cells + [f"error: {v.error}"] + [""] * (2 * len(threads) + 2))
                continue
            for t in threads:
                s, base = Stats.of(v.times[t]), Stats.of(fp32.times[t])
                cells += [s.cell(), f"{base.median / s.median:.2f}"]
            n = len(v.cosines)
            cells.append(f"{np.mean(v.cosines):.5f} / {np.min(v.cosines):.5f}")
            cells.append(f"{v.agree}/{n} ({extra['distinct_fp32_top1']} classes)"
                         if model.classifier else "")
            cells.append(f"{np.mean(v.errors_sigma):.4f} / {v.max_error_sigma:.4f}"
                         if model.classifier else "")
            body.append(cells)
    if not classifiers:  # no classifier: drop the two empty columns
        headers, body = headers[:-2], [row[:-2] for row in body]
    return markdown_table(headers, body)


def to_json(rows, args, seconds: float) -> dict:
    return {
        "bench": "precision",
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "runs": args.runs, "warmup_runs": args.warmup, "threads": args.thread_counts,
        "samples": args.samples, "calibration_samples": args.calibration_samples,
        "versions": {"graphopt": graphopt.__version__, "onnxruntime": ort.__version__,
                     "onnx": onnx.__version__, "python": platform.python_version()},
        "cpus": os.cpu_count(), "wall_seconds": seconds,
        "models": [{
            "model": model.name, **extra,
            "variants": {v.key: {
                "name": v.name, "error": v.error, "build_seconds": v.build_seconds,
                "times_ms": {str(t): ts for t, ts in v.times.items()},
                "median_ms": {str(t): float(np.median(ts)) for t, ts in v.times.items()},
                "speedup_vs_fp32": {str(t): float(np.median(variants[0].times[t])
                                                  / np.median(ts))
                                    for t, ts in v.times.items()},
                "cosines": v.cosines, "top1_agree": v.agree if model.classifier else None,
                "logit_error_sigma_mean": float(np.mean(v.errors_sigma))
                if v.errors_sigma else None,
                "logit_error_sigma_max": v.max_error_sigma if v.errors_sigma else None,
            } for v in variants}} for model, variants, extra in rows]}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="precision.py", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=positive_int, default=20, metavar="N",
                   help="timed runs (default 20)")
    p.add_argument("--warmup", type=non_negative_int, default=3, metavar="N",
                   help="warm-up runs (default 3)")
    p.add_argument("--threads", type=positive_ints, default=[1], metavar="T[,T...]",
                   help="intra-op thread counts (default 1)")
    p.add_argument("--samples", type=positive_int, default=32, metavar="N",
                   help="held-out samples for accuracy (default 32)")
    # numpy's generators take no negative seed.
    p.add_argument("--eval-seed", type=non_negative_int, metavar="S",
                   help="seed of the held-out samples (default: 2 for images, 5000 for token "
                        "ids; calibration samples never use it)")
    p.add_argument("--calibration-samples", type=positive_int, default=16, metavar="N",
                   help="calibration samples, shared by every static quantizer (default 16)")
    p.add_argument("--seq", type=positive_int, default=128, metavar="N",
                   help="BERT sequence length, pinned (default 128)")
    p.add_argument("--bert-layers", type=positive_int, default=4, metavar="N",
                   help="bert_base layers at hidden 768 (default 4; --full: 12)")
    p.add_argument("--full", action="store_true", help="bert_base at its real 12 layers")
    p.add_argument("--shared", metavar="DIR", help="also every DIR/*.onnx")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="only models whose name contains TEXT; repeatable")
    p.add_argument("--quant-skip", metavar="NAMES",
                   type=lambda text: {n.strip() for n in text.split(",") if n.strip()},
                   help="also a graphopt INT8 row with these comma-separated node names or op "
                        "types left float (names after fusion, e.g. …/ConvBatchNorm/Conv)")
    p.add_argument("--npu-target", metavar="NAME",
                   help="also a graphopt INT8 row compiled for this NPU target (AMCT's QDQ "
                        "form), run by the CPU stand-in: read its accuracy, not its time")
    p.add_argument("--equalization-off", action="store_true",
                   help="also a graphopt INT8 row (and one for --npu-target) compiled without "
                        "channel equalization (quant_equalize=False)")
    p.add_argument("--json", metavar="FILE", type=json_path, help="also write the results as JSON")
    args = p.parse_args(argv)
    args.thread_counts = sorted(set(args.threads))
    check_folder(p, args.shared)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = unmatched(args.only, lambda wanted: build_models(args, "", wanted))
    if problem:
        print(problem, file=sys.stderr)
        return 1
    ort.set_default_logger_severity(3)
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphopt-precision-") as workdir:
        for model in build_models(args, workdir, matching(args.only)):
            files = tempfile.mkdtemp(dir=workdir)
            variants = build_variants(model, files, args.seq, args.quant_skip, args.npu_target,
                                      args.equalization_off)
            extra = measure(model, variants, args)
            rows.append((model, variants, extra))
            print(f"{model.name}: done in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    print(f"INT8 latency (median (min–max) ms of {args.runs} interleaved runs after "
          f"{args.warmup} warm-up) and accuracy on {args.samples} held-out samples "
          f"({args.calibration_samples} calibration samples); × = FP32 median / variant median. "
          f"onnxruntime {ort.__version__}, {os.cpu_count()} CPUs.")
    print(table(rows, args.thread_counts))
    if args.json:
        write_json(args.json, to_json(rows, args, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
