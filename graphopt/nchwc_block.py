"""The NCHWc block size: this CPU's (MLAS's), the installed onnxruntime's, and whether a model
blocked by graphopt's LayoutNchwc can run here. Light on imports: the runtime asks it at load."""

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
