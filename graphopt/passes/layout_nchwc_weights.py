"""LayoutNchwc's constants: the NCHWc block size (this CPU's, onnxruntime's, and the check that a
blocked model matches the runtime) and the blocked filter layouts that onnxruntime's
com.microsoft.nchwc::Conv reads (what MLAS's MlasReorderFilter* write).

With B the block size, O' = ⌈O/B⌉·B and I' = ⌈I/B⌉·B, padding is zeros:

    OIHWBiBo  W[O, I, kh, kw] → [O'/B][I'/B][kh][kw][Bi][Bo]   stored as a [O', I', kh, kw] tensor
              D[ob, ib, y, x, bi, bo] = W[ob·B + bo, ib·B + bi, y, x]
              (blocked input: regular convs, and grouped ones whose groups are block-aligned)
    OIHWBo    W[O, I, kh, kw] → [O'/B][I][kh][kw][Bo]          stored as a [O', I, kh, kw] tensor
              D[ob, i, y, x, bo] = W[ob·B + bo, i, y, x]
              (depthwise convs, and the first conv whose NCHW input has fewer than B channels)

Biases and BatchNorm's per-channel scale and shift are padded with zeros to O'. A padded output
channel therefore computes act(0) (0.5 after Sigmoid): consumers never read it as data, since
every blocked filter has zero input rows there and ReorderOutput drops it.
"""

from __future__ import annotations

import functools
import os
import tempfile

import numpy as np

CPUINFO = "/proc/cpuinfo"
BLOCK_SIZES = (8, 16)  # MLAS: 8 floats with AVX2, 16 with AVX-512F
METADATA_KEY = "graphopt.nchwc_block_size"  # the block a model was rewritten for


def detect_block_size(cpuinfo: str = CPUINFO) -> int:
    """MLAS's NCHWc block size on this CPU from the kernel's flags: 16 with avx512f, 8 with avx2,
    0 when neither (or no /proc/cpuinfo: not Linux). MLAS also blocks by 8 with SSE2 only, and
    recent builds by a NEON block on ARM64; LayoutNchwc does not target those."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return 0
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    return 16 if "avx512f" in flags else 8 if "avx2" in flags else 0


@functools.cache
def onnxruntime_block_size() -> int:
    """The block the installed onnxruntime uses on this CPU (0: none), read back from its own
    NCHWc transformer: a one-filter conv's weight comes out padded to one block."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [numpy_helper.from_array(np.ones((1, 3, 1, 1), np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # "hardware specific" warning: expected here
    with tempfile.TemporaryDirectory(prefix="graphopt-nchwc-probe-") as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "probe.onnx")
        ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        probe = onnx.load(options.optimized_model_filepath)
    if not any(n.domain == "com.microsoft.nchwc" for n in probe.graph.node):
        return 0
    return max(int(t.dims[0]) for t in probe.graph.initializer if len(t.dims) == 4)


def block_mismatch(metadata: dict[str, str]) -> str | None:
    """Why a model LayoutNchwc rewrote cannot run on this machine's onnxruntime, or None. A
    model blocked by another size loads and runs there, silently wrong, so a runtime loading
    blocked models should ask this first."""
    wanted = metadata.get(METADATA_KEY)
    here = onnxruntime_block_size() if wanted else 0
    if not wanted or int(wanted) == here:
        return None
    return (f"the model is in NCHWc blocks of {wanted} channels but onnxruntime blocks by "
            f"{here or 'nothing'} on this CPU, which would give wrong results: compile it "
            "again for this CPU")


def padded(n: int, block: int) -> int:
    return -(-n // block) * block


def _zero_padded(w: np.ndarray, out: int, inp: int) -> np.ndarray:
    full = np.zeros((out, inp) + w.shape[2:], dtype=w.dtype)
    full[: w.shape[0], : w.shape[1]] = w
    return full


def filter_oihwbibo(w: np.ndarray, block: int) -> np.ndarray:
    """[O, I, kh, kw] → blocked [O', I', kh, kw] (OIHWBiBo byte order)."""
    o, i, kh, kw = w.shape
    full = _zero_padded(w, padded(o, block), padded(i, block))
    blocks = full.reshape(full.shape[0] // block, block, full.shape[1] // block, block, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 4, 5, 3, 1)).reshape(full.shape)


def filter_oihwbo(w: np.ndarray, block: int) -> np.ndarray:
    """[O, I, kh, kw] → blocked [O', I, kh, kw] (OIHWBo byte order)."""
    o, i, kh, kw = w.shape
    full = _zero_padded(w, padded(o, block), i)
    blocks = full.reshape(full.shape[0] // block, block, i, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 3, 4, 1)).reshape(full.shape)


def unblock_oihwbibo(d: np.ndarray, out: int, inp: int, block: int) -> np.ndarray:
    """The inverse of filter_oihwbibo (for tests and dumps)."""
    op, ip, kh, kw = d.shape
    blocks = d.reshape(op // block, ip // block, kh, kw, block, block).transpose(0, 5, 1, 4, 2, 3)
    return blocks.reshape(op, ip, kh, kw)[:out, :inp]


def unblock_oihwbo(d: np.ndarray, out: int, block: int) -> np.ndarray:
    """The inverse of filter_oihwbo (for tests and dumps)."""
    op, i, kh, kw = d.shape
    blocks = d.reshape(op // block, i, kh, kw, block).transpose(0, 4, 1, 2, 3)
    return blocks.reshape(op, i, kh, kw)[:out]


def padded_vector(v: np.ndarray, block: int) -> np.ndarray:
    out = np.zeros(padded(v.shape[0], block), dtype=v.dtype)
    out[: v.shape[0]] = v
    return out


def batchnorm_as_depthwise(scale, shift, mean, var, eps: float, block: int
                           ) -> tuple[np.ndarray, np.ndarray]:
    """BatchNormalization as a 1×1 depthwise conv over the padded channels: W [C', 1, 1, 1],
    b [C'] with W = γ/√(σ²+ε), b = β − μ·W (computed in float64). A 1×1 OIHWBo filter with one
    input channel is plain channel order, so W needs no reordering."""
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = shift.astype(np.float64) - mean.astype(np.float64) * s
    dtype = scale.dtype
    return (padded_vector(s.astype(dtype), block).reshape(-1, 1, 1, 1),
            padded_vector(b.astype(dtype), block))
