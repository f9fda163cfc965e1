"""What a model output is, for the accuracy report: LM logits, classifier scores or a plain
tensor, from the model's structure and the feeds rather than the output's rank alone.

A rank-3 float output is not necessarily logits (YOLO's [1, 12, 525] detections, BERT's
[1, 64, 128] hidden states), nor a rank-2 one class scores (BERT's pooled [1, 128]); argmax
agreement and perplexity mean nothing on those. So:

* `lm`: float [batch, seq, V] where the feeds hold an integer [batch, seq] input (token ids)
  and V is wider than the model's hidden size (the width of the embedding table those ids
  index) or the output's name says logits;
* `classifier`: float [batch, classes] with `batch` a feed's first dim, at least 2 classes, not
  the hidden size of a token model, and either a linear layer (Gemm, MatMul, Conv) behind it
  through bias, softmax and reshaping ops or a name that says logits, scores or probabilities;
* `segmentation`: float [batch, classes, H, W] at the spatial size of a rank-4 image feed,
  with at least 2 classes, out of a linear layer (a Conv) through the head's ops and a resize:
  per-pixel class scores, whose top-1 is taken over axis 1 (a detector's raw head, at a
  fraction of the image's size, stays a tensor, and so does an output of a float feed's very
  shape: a diffusion UNet's predicted noise, a denoiser's image, whose argmax over channels
  means nothing);
* `tensor`: everything else (cosine only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

# Ops that only carry token ids on towards the embedding Gather.
_ID_PATH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"}
# Ops a classifier's head may end with after its linear layer.
# QuantizeLinear/DequantizeLinear too: a QDQ classifier's scores leave its Gemm through a pair.
_HEAD_TAIL = {"Add", "Sub", "Mul", "Div", "Softmax", "LogSoftmax", "Sigmoid", "Flatten",
              "Reshape", "Squeeze", "Identity", "Cast", "QuantizeLinear", "DequantizeLinear"}
_LINEAR = {"Gemm", "MatMul", "Conv", "FusedMatMul", "FusedGemm", "MatMulNBits",
           "DynamicQuantizeMatMul", "QGemm", "MatMulInteger", "QLinearMatMul", "QLinearConv"}
_SCORE_NAMES = ("logit", "score", "prob", "class")
# A segmentation head's logits are upsampled to the image: argmax still means the class.
_RESIZES = {"Resize", "Upsample"}


@dataclass(frozen=True)
class ModelFacts:
    """What the rules read from the reference model's graph."""

    hidden: int | None              # width of the embedding tables the integer inputs index
    producers: dict                 # value name -> the NodeProto computing it


def model_facts(proto: onnx.ModelProto) -> ModelFacts:
    graph = proto.graph
    producers = {out: node for node in graph.node for out in node.output if out}
    return ModelFacts(_hidden_size(graph), producers)


def output_kind(name: str, array: np.ndarray, facts: ModelFacts, feeds: dict) -> str:
    """"lm", "classifier", "segmentation" or "tensor" for the output `name` holding `array`
    (as the reference computed it on `feeds`)."""
    # Sequence (list) and empty optional (None) feeds have no shape to match outputs against.
    feeds = {k: v for k, v in feeds.items() if isinstance(v, np.ndarray)}
    if array.dtype.kind == "f" and array.ndim == 4:
        return "segmentation" if _per_pixel_scores(name, array, facts, feeds) else "tensor"
    if array.dtype.kind != "f" or array.ndim not in (2, 3) or array.shape[-1] < 2:
        return "tensor"
    named = any(word in name.lower() for word in _SCORE_NAMES)
    if array.ndim == 3:
        ids = any(a.dtype.kind in "iu" and a.shape == array.shape[:2] for a in feeds.values())
        wide = facts.hidden is not None and array.shape[2] > facts.hidden
        return "lm" if ids and (wide or "logit" in name.lower()) else "tensor"
    batches = {a.shape[0] for a in feeds.values() if a.ndim}
    if array.shape[0] not in batches:
        return "tensor"
    if facts.hidden is not None and array.shape[1] == facts.hidden and "logit" not in name.lower():
        return "tensor"  # a token model's pooled hidden state
    return "classifier" if named or _after_linear(name, facts.producers) else "tensor"


def _per_pixel_scores(name: str, array: np.ndarray, facts: ModelFacts, feeds: dict) -> bool:
    """Whether a float [N, C, H, W] output is per-pixel class scores: C ≥ 2, N a feed's batch,
    H × W a rank-4 feed's, out of a linear layer through head ops and resizes."""
    images = [a for a in feeds.values() if a.ndim == 4]
    if array.shape[1] < 2 or not any(a.shape[0] == array.shape[0]
                                     and a.shape[2:] == array.shape[2:] for a in images):
        return False
    if any(a.shape == array.shape and a.dtype.kind == "f" for a in images):
        return False  # image to image: the input's own channels, not class scores
    return _after_linear(name, facts.producers, _HEAD_TAIL | _RESIZES)


def _after_linear(name: str, producers: dict, tail: set[str] = _HEAD_TAIL) -> bool:
    """Whether a linear layer computes `name`, followed by nothing but _HEAD_TAIL ops."""
    node = producers.get(name)
    while node is not None and node.op_type in tail and node.input:
        node = producers.get(node.input[0])
    return node is not None and node.op_type in _LINEAR


def _hidden_size(graph: onnx.GraphProto) -> int | None:
    """The widest embedding table ([rows, width], a weight) that a Gather indexes with an
    integer graph input, directly or through _ID_PATH ops; None when there is none."""
    weights = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.attribute \
                and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            weights[node.output[0]] = list(node.attribute[0].t.dims)
    integer = {onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT32,
               onnx.TensorProto.UINT64, onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
    ids = {i.name for i in graph.input
           if i.name not in weights and i.type.tensor_type.elem_type in integer}
    widths = []
    for node in graph.node:  # graph order: a node's inputs are reached before it
        if node.op_type in _ID_PATH and node.input and node.input[0] in ids:
            ids.update(out for out in node.output if out)
        elif (node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in ids
              and len(weights.get(node.input[0], ())) == 2 and _axis(node) == 0):
            widths.append(weights[node.input[0]][1])
    return max(widths) if widths else None


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)
