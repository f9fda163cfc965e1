"""Helpers shared by several test modules: parsing models, op listings, a deliberately wrong pass."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

from graphopt.ir import Tensor
from graphopt.passes import Pass, PassResult

OPSET17 = '<ir_version: 8, opset_import: ["" : 17]>\n'
# Test models pin their IR version: helper.make_model writes onnx's newest (14 for onnx 1.23),
# which an onnxruntime older than the onnx release refuses (1.23 reads up to 11). 10 has int4.
IR_VERSION = 10


def parse_model(text: str, header: str = OPSET17, **weights) -> onnx.ModelProto:
    """Parse `header + text`; each keyword names a graph input that becomes an initializer."""
    proto = onnx.parser.parse_model(header + text)
    kept = [i for i in proto.graph.input if i.name not in weights]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    proto.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), n)
                                   for n, a in weights.items())
    return proto


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """`graphopt ARGV` through graphopt.cli.main: (exit status, stdout, stderr)."""
    from graphopt.cli import main

    try:
        rc = main([os.fspath(a) for a in argv])
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def ops(model) -> list[str]:
    """The main graph's ops in order (`domain::Op` outside the default domain)."""
    return [n.qualified_op for n in model.graph]


def node(model, op_type: str):
    """The one node of `op_type` in the main graph (fails if there are none or several)."""
    (found,) = [n for n in model.graph if n.op_type == op_type]
    return found


class PerturbWeights(Pass):
    """Test-only miscompile: adds 1 to every float initializer."""

    name = "TestPerturbWeights"
    description = "add 1 to every float initializer (a deliberate miscompile)"

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        for value in model.graph.initializers.values():
            array = value.constant()
            if array is not None and array.dtype.kind == "f":
                value.const = Tensor(array + 1)
                result.count("perturbed")
        return result


def conv_classifier(tail: str, outputs: str, *, batch: int | str = 1, seed: int = 7,
                    **weights) -> onnx.ModelProto:
    """Two 3×3 convs and a classifier an NPU runs, `scores` [batch, 64] from x [batch, 8, 32,
    32], then `tail`, which may read `weights`; `batch` may be a symbolic dim."""
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    return parse_model(f"""
        g (float[{batch},8,32,32] x) => ({outputs}) {{
            c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
            r1 = Relu (c1)
            c2 = Conv <pads = [1,1,1,1]> (r1, w2, b2)
            r2 = Relu (c2)
            p = GlobalAveragePool (r2)
            f = Flatten (p)
            scores = Gemm <transB = 1> (f, wf, bf)
            {tail}
        }}""", w1=weight(32, 8, 3, 3), b1=weight(32), w2=weight(32, 32, 3, 3), b2=weight(32),
        wf=weight(64, 32), bf=weight(64), **weights)


def conv_topk_model(k: int = 4, seed: int = 7, batch: int | str = 1) -> onnx.ModelProto:
    """conv_classifier, then a TopK an NPU has no kernel for: on ascend310, an NPU partition
    and a CPU one."""
    return conv_classifier("values, indices = TopK <axis = 1> (scores, k)",
                           f"float[{batch},{k}] values, int64[{batch},{k}] indices",
                           batch=batch, seed=seed, k=np.array([k], np.int64))


def write_calibration(folder, samples: np.ndarray, layout: str, name: str = "x"):
    """`samples` [S, 1, …] as calibration data for input `name` in one of the layouts the
    reader takes, under `folder`: "stacked" ([S, 1, …] float32), "batch" ([S, …], the samples
    in the batch dim), "float64" (stacked, not cast) or "directory" (one .npz per sample).
    Returns the path to pass as --calibration."""
    if layout == "directory":
        path = os.path.join(folder, "samples")
        os.mkdir(path)
        for i, sample in enumerate(samples.astype(np.float32)):
            np.savez(os.path.join(path, f"{i}.npz"), **{name: sample})
        return path
    path = os.path.join(folder, "c.npz")
    arrays = samples if layout == "float64" else samples.astype(np.float32)
    np.savez(path, **{name: arrays[:, 0] if layout == "batch" else arrays})
    return path


def as_float16(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its float32 inputs, outputs, value types and weights in float16, finite
    weights clipped to float16's range as exporters write them (float32's lowest as a mask
    fill becomes float16's, -65504, not -inf)."""
    for info in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    largest = float(np.finfo(np.float16).max)
    for i, init in enumerate(proto.graph.initializer):
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32:
            clipped = np.where(np.isfinite(array), np.clip(array, -largest, largest), array)
            proto.graph.initializer[i].CopyFrom(numpy_helper.from_array(
                clipped.astype(np.float16), init.name))
    return proto
