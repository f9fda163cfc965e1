"""--insert-op-conf (ATC's AIPP) against preprocessing frames in numpy: from a uint8 frame to the
model's outputs.

Per zoo model (a BGR frame 32 pixels larger than the model's input each way, centre-cropped,
R/B swapped and ImageNet-normalized; with `--format nv12`, an NV12 frame as a video decoder
writes it, converted to RGB by BT.601 narrow range as well), three ways from the same frame,
timed per call at one thread, interleaved (numpy+ORT, numpy+.om, AIPP .om, numpy+ORT, ...),
medians and ratios:
- `numpy + ORT`: crop, swap (or colour conversion), normalize and transpose in numpy, then
  onnxruntime's InferenceSession at ORT_ENABLE_ALL on the original model (what a user does
  without graphopt);
- `numpy + .om`: the same numpy, then the .om compiled without AIPP;
- `AIPP .om`: the .om compiled with --insert-op-conf, fed the frame itself.
The last column is the largest difference of the AIPP .om's outputs from numpy + the original
at ORT_DISABLE_ALL.

    python bench/aipp.py
    python bench/aipp.py --only mobilenetv2 --runs 200
    python bench/aipp.py --format nv12
    python bench/aipp.py --json out/aipp.json
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (Stats, json_path, markdown_table, positive_int, run_model,  # noqa: E402
                     session_options, write_json)

import graphopt  # noqa: E402
from graphopt import zoo  # noqa: E402

MODELS = ("tiny", "mobilenetv2", "resnet50")
MARGIN = 32  # the frame is this much larger than the model's input, each way
MEAN, VAR_RECI = (123.675, 116.28, 103.53), (0.017125, 0.017507, 0.017429)
# ATC's manual: YUV to RGB, BT.601 narrow range.
BT601_NARROW, YUV_BIAS = np.array([[298, 0, 409], [298, -100, -208], [298, 516, 0]]), (16, 128, 128)
FORMATS = {
    "bgr": "input_format: RGB888_U8\n    rbuv_swap_switch: true",
    "nv12": "input_format: YUV420SP_U8\n    csc_switch: true\n    " + "\n    ".join(
        [f"matrix_r{r}c{c}: {BT601_NARROW[r, c]}" for r in range(3) for c in range(3)]
        + [f"input_bias_{i}: {v}" for i, v in enumerate(YUV_BIAS)]),
}
CONFIG = """aipp_op {{
    {steps}
    src_image_size_h: {src_h}
    src_image_size_w: {src_w}
    crop: true
    load_start_pos_h: {top}
    load_start_pos_w: {left}
    mean_chn_0: {mean[0]}
    mean_chn_1: {mean[1]}
    mean_chn_2: {mean[2]}
    var_reci_chn_0: {var_reci[0]}
    var_reci_chn_1: {var_reci[1]}
    var_reci_chn_2: {var_reci[2]}
}}
"""


def preprocess(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """CONFIG's steps in numpy, as a deployment writes them: centre crop, BGR to RGB,
    (x - mean) * var_reci, HWC to CHW."""
    top, left = (frame.shape[1] - size[0]) // 2, (frame.shape[2] - size[1]) // 2
    x = frame[:, top:top + size[0], left:left + size[1], ::-1].astype(np.float32)
    return normalized(x)


def preprocess_nv12(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The nv12 CONFIG's steps in numpy: centre crop of the Y and UV planes, each U, V pair
    over its 2x2 pixels, BT.601 to RGB in integers as ATC's formula, then as preprocess."""
    height = frame.shape[1] * 2 // 3
    top, left = (height - size[0]) // 2, (frame.shape[2] - size[1]) // 2
    luma = frame[:, top:top + size[0], left:left + size[1]]
    chroma = frame[:, height + top // 2:height + (top + size[0]) // 2, left:left + size[1]]
    chroma = chroma.reshape(len(frame), size[0] // 2, size[1] // 2, 2)
    yuv = np.concatenate([luma, chroma.repeat(2, axis=1).repeat(2, axis=2)], axis=-1)
    rgb = np.clip(((yuv.astype(np.int32) - np.array(YUV_BIAS, np.int32)) @ BT601_NARROW.T
                   .astype(np.int32)) >> 8, 0, 255)
    return normalized(rgb.astype(np.float32))


def normalized(x: np.ndarray) -> np.ndarray:
    x = (x - np.array(MEAN, np.float32)) * np.array(VAR_RECI, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def row(name: str, runs: int, folder: str, frame_format: str = "bgr") -> dict:
    model = zoo.build(name)
    path = os.path.join(folder, f"{name}.onnx")
    onnx.save(model, path)
    (image,) = [i for i in model.graph.input]
    dims = [d.dim_value or 1 for d in image.type.tensor_type.shape.dim]
    size = (dims[2], dims[3])
    src_h, src_w = size[0] + MARGIN, size[1] + MARGIN
    shape = (1, src_h * 3 // 2, src_w, 1) if frame_format == "nv12" else (1, src_h, src_w, 3)
    frame = np.random.default_rng(0).integers(0, 256, shape, np.uint8)
    to_tensor = preprocess_nv12 if frame_format == "nv12" else preprocess
    config = os.path.join(folder, f"{name}.cfg")
    with open(config, "w") as f:
        f.write(CONFIG.format(steps=FORMATS[frame_format], src_h=src_h, src_w=src_w,
                              top=MARGIN // 2, left=MARGIN // 2, mean=MEAN, var_reci=VAR_RECI))
    pins = {image.name: [1, 3, *size]}
    plain, with_aipp = os.path.join(folder, "plain.om"), os.path.join(folder, "aipp.om")
    graphopt.save(graphopt.optimize(path, input_shapes=pins), plain)
    graphopt.save(graphopt.optimize(path, insert_op_conf=config,
                                    input_shapes={image.name: [1, *frame.shape[1:]]}), with_aipp)
    original = ort.InferenceSession(path, session_options("all", threads=1),
                                    providers=["CPUExecutionProvider"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain_om = graphopt.load(plain, intra_op_num_threads=1)
        aipp_om = graphopt.load(with_aipp, intra_op_num_threads=1)
    variants = {
        "numpy + ORT": lambda: original.run(None, {image.name: to_tensor(frame, size)}),
        "numpy + .om": lambda: plain_om.run({image.name: to_tensor(frame, size)}),
        "AIPP .om": lambda: aipp_om.run({image.name: frame}),
    }
    expected = run_model(path, {image.name: to_tensor(frame, size)})
    actual = aipp_om.run({image.name: frame})
    error = max(float(np.max(np.abs(actual[k] - v))) for k, v in expected.items())
    times = {key: [] for key in variants}
    for _ in range(5):
        for call in variants.values():
            call()
    gc.collect()
    gc.disable()
    try:
        for _ in range(runs):
            for key, call in variants.items():
                start = time.perf_counter()
                call()
                times[key].append(time.perf_counter() - start)
    finally:
        gc.enable()
    stats = {key: Stats.of([t * 1e3 for t in ts]) for key, ts in times.items()}
    base = stats["numpy + ORT"].median
    return {"model": f"zoo/{name}", "format": frame_format, "frame": [src_h, src_w],
            "fed": list(frame.shape), "runs": runs,
            "ms": {key: {"median": s.median, "min": s.low, "max": s.high}
                   for key, s in stats.items()},
            "ratio_vs_numpy_ort": {key: s.median / base for key, s in stats.items()},
            "max_abs_error": error}


def cells(result: dict) -> list[str]:
    ms, ratios = result["ms"], result["ratio_vs_numpy_ort"]
    return [result["model"], "x".join(map(str, result["frame"])),
            *(Stats(t["median"], t["min"], t["max"]).cell() for t in ms.values()),
            f"{ratios['numpy + .om']:.2f}", f"{ratios['AIPP .om']:.2f}",
            f"{result['max_abs_error']:.1e}"]


COLUMNS = ["model", "frame", "numpy + ORT ms (min–max)", "numpy + .om ms (min–max)",
           "AIPP .om ms (min–max)", "numpy+.om ×", "AIPP ×", "max abs Δ vs original"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=positive_int, default=50,
                        help="timed calls of each (default 50)")
    parser.add_argument("--only", action="append", choices=MODELS, help="these zoo models only")
    parser.add_argument("--format", choices=FORMATS, default="bgr",
                        help="the frames: packed BGR (default), or NV12 converted to RGB")
    parser.add_argument("--json", type=json_path,
                        help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    results = []
    for name in args.only or MODELS:
        with tempfile.TemporaryDirectory() as folder:
            results.append(row(name, args.runs, folder, args.format))
    print(f"from a uint8 {args.format.upper()} frame to the outputs, 1 thread, medians of "
          f"{args.runs} interleaved calls; × = against numpy + ORT")
    print(markdown_table(COLUMNS, [cells(r) for r in results]))
    if args.json:
        write_json(args.json, {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
