"""graphopt.zoo: deterministic, download-free ONNX models shaped like real PyTorch exports."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from ._builder import shapes_only
from .bert import build_bert_base
from .blazepalm import build_blazepalm
from .gpt2 import build_gpt2_small
from .lcnet import build_lcnetv3
from .matmul import build_matmul
from .mobilenet import build_mobilenetv2
from .resnet import build_resnet50
from .tiny import build_tiny
from .unet import build_unet

__all__ = ["ZOO", "build", "list_models", "param_count", "sample_inputs"]

ZOO: dict[str, tuple[Callable[..., onnx.ModelProto], str]] = {
    "tiny": (build_tiny, "quick-start conv net [1,3,32,32] -> [1,10] with exporter leftovers"),
    "matmul256": (build_matmul, "single 256x256 float32 MatMul, the seed benchmark"),
    "resnet50": (build_resnet50, "ResNet-50 v1.5, Conv + unfused BatchNorm, 25.6M params"),
    "mobilenetv2": (build_mobilenetv2, "MobileNetV2, depthwise convs and Clip(0,6), 3.5M params"),
    "blazepalm": (build_blazepalm, "BlazePalm-style detector: depthwise blocks, PReLU, "
                                   "channel-padded residuals"),
    "lcnetv3": (build_lcnetv3, "PP-LCNetV3-style backbone (PaddleOCR v4) as Paddle2ONNX exports "
                               "it: hard-swish, learned scale and shift after each activation"),
    "unet": (build_unet, "segmentation UNet, 4 down/up stages, long skip Concats, 31.0M params"),
    "bert_base": (build_bert_base, "BERT-base encoder, decomposed LayerNorm/GELU, 109M params"),
    "gpt2_small": (build_gpt2_small, "small GPT-2 decoder (2 layers, hidden 256), tanh GELU"),
}

# Trainable parameters in torch's sense; these initializers are buffers, not parameters.
_BUFFER_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked")
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
_DEFAULT_DIMS = {"batch_size": 1, "sequence_length": 16}


def build(name: str, *, weights: bool = True, **options) -> onnx.ModelProto:
    """Build zoo model `name` with size `options` (see each builder's keyword arguments).

    weights=False emits initializers as dims-only external-data stubs: the graph is complete for
    inspection and parameter counting, but cannot be run.
    """
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known models: {', '.join(ZOO)}")
    builder = ZOO[name][0]
    if weights:
        return builder(**options)
    with shapes_only():
        return builder(**options)


def list_models() -> list[tuple[str, str]]:
    """(name, one-line description) for every zoo model, in registry order."""
    return [(name, desc) for name, (_, desc) in ZOO.items()]


def param_count(model: onnx.ModelProto) -> int:
    """What torch's sum(p.numel() for p in model.parameters()) reports: float initializers minus
    BatchNorm running statistics. Reads dims only, so it works on weights=False models too."""
    return sum(math.prod(t.dims) for t in model.graph.initializer
               if t.data_type in _FLOAT_TYPES and not t.name.endswith(_BUFFER_SUFFIXES))


def sample_inputs(model: onnx.ModelProto, seed: int = 0,
                  dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded feeds for every graph input of `model`.

    Symbolic dims come from `dims` (default batch_size=1, sequence_length=16, anything else 1).
    Integer inputs named like masks get ones with a few trailing zeros per row (padding); other
    integer inputs are token ids below the "graphopt.zoo.vocab" metadata value.
    """
    dims = {**_DEFAULT_DIMS, **(dims or {})}
    meta = {p.key: p.value for p in model.metadata_props}
    vocab = int(meta.get("graphopt.zoo.vocab", 2))
    max_pos = int(meta.get("graphopt.zoo.max_positions", 0))
    rng = np.random.default_rng(seed)
    initialized = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in initialized:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1)
                      for d in tt.shape.dim)
        if max_pos and len(shape) > 1 and shape[-1] > max_pos:
            raise ValueError(f"{vi.name}: sequence length {shape[-1]} exceeds the model's "
                             f"{max_pos} positions")
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.random(shape) < 0.5
        elif "mask" in vi.name:
            feeds[vi.name] = _padding_mask(rng, shape, dtype)
        else:
            feeds[vi.name] = rng.integers(0, vocab, shape).astype(dtype)
    return feeds


def _padding_mask(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Ones with 1..S/4 trailing zeros per row, never masking a whole row (softmax of all -inf)."""
    mask = np.ones(shape, dtype)
    if not shape or shape[-1] < 2:
        return mask
    seq = shape[-1]
    rows = mask.reshape(-1, seq)
    for row in rows:
        row[seq - int(rng.integers(1, max(1, seq // 4) + 1)):] = 0
    return mask
