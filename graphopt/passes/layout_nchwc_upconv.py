r"""LayoutNchwc's ConvTranspose whose kernel equals its stride (a UNet's 2×2 up-sampling): a
blocked 1×1 conv and a blocked depth-to-space, where onnxruntime's transformer leaves the op in
NCHW behind a ReorderOutput, and the Concat after it behind a ReorderInput (graphopt's own rule).

With kernel = stride = (kh, kw) and no padding, output pixels never overlap: each one is a
single input pixel times one kernel tap,

    y[o, kh·i + a, kw·j + b] = Σ_c x[c, i, j] · W[c, o, a, b] + bias[o]

so one 1×1 conv computes all kh·kw taps at once, as kh·kw groups of O' channels (O padded to
the block B with zero weights and bias, so the padded channels stay 0), and the interleave
is a copy on the blocked memory:

    x [N, C', H, W] ─ nchwc.Conv 1×1 → [N, (a, b, O'/B), H, W, B]   (stored as [N, kh·kw·O', H, W])
      ─ Reshape [N, kh, kw, O'/B, H, W, B] ─ Transpose [0, 3, 4, 1, 5, 2, 6]
      ─ Reshape → [N, O'/B, H·kh, W·kw, B]                          (stored as [N, O', H·kh, W·kw])

Reshape and Transpose read the blocked tensor as the plain array it is in memory, so the result
is the up-sampled tensor in the same blocked layout the next conv or Concat reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from graphopt.ir import DType, Node, Value
from graphopt.passes.layout_nchwc_ops import NCHWC, reaches_blocked
from graphopt.passes.layout_nchwc_weights import filter_oihwbibo, padded

if TYPE_CHECKING:
    from graphopt.passes.layout_nchwc import Rewriter


def refusal(node: Node, channels: int | None) -> str | None:
    """Why `node` (a ConvTranspose reading a blocked input of `channels`) cannot become a 1×1
    blocked conv and a depth-to-space, or None when it can."""
    x, w, b = node.input(0), node.input(1), node.input(2)
    if w is None or not w.is_constant or w.dtype != DType.FLOAT or w.shape is None \
            or len(w.shape) != 4:
        return "the weight is not a constant float32 [I, O, kh, kw] tensor"
    i, o, kh, kw = w.shape
    if b is not None and not (b.is_constant and b.dtype == DType.FLOAT and b.shape == (o,)):
        return "the bias is not a constant float32 [O] vector"
    if node.attr("group", 1) != 1 or i != channels:
        return "grouped"  # (a weight of other input channels than x has is no model's)
    kernel = list(node.attr("kernel_shape") or (kh, kw))
    if kernel != [kh, kw] or list(node.attr("strides") or (1, 1)) != kernel:
        return "the stride is not the kernel (outputs overlap)"
    if list(node.attr("dilations") or (1, 1)) != [1, 1]:
        return "dilated"
    if node.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID") \
            or any(node.attr("pads") or ()) or any(node.attr("output_padding") or ()) \
            or node.attr("output_shape") is not None:
        return "padded or with an output shape"
    shape = x.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        return "the input's height and width are not known numbers"
    return None


def taps_as_rows(w: np.ndarray, block: int) -> np.ndarray:
    """W [I, O, kh, kw] → the 1×1 filter [kh·kw·O', I, 1, 1], row (a·kw + b)·O' + o = W[:, o, a, b]
    (rows o ≥ O zero), before blocking."""
    i, o, kh, kw = w.shape
    rows = np.zeros((kh, kw, padded(o, block), i), dtype=w.dtype)
    rows[:, :, :o] = w.transpose(2, 3, 1, 0)
    return rows.reshape(-1, i, 1, 1)


def taps_bias(b: np.ndarray, taps: int, block: int) -> np.ndarray:
    full = np.zeros((taps, padded(b.shape[0], block)), dtype=b.dtype)
    full[:, : b.shape[0]] = b
    return full.reshape(-1)


def conv_transpose(rw: Rewriter, node: Node) -> None:
    x = node.input(0)
    source = rw.blocked.get(id(x))
    if source is None:
        return
    reason = refusal(node, source.channels)
    if reason:
        rw.left[f"ConvTranspose: {reason}"] += 1
        return
    if not reaches_blocked(node.output):
        # Its output would leave the layout again at once: the reorder it saves on the
        # input is paid on an output kh·kw·O/I times its size.
        return
    w, b, block = node.input(1), node.input(2), rw.block
    _, o, kh, kw = w.shape
    n, _, h, width = x.shape
    padded_out = padded(o, block)
    weight = rw.constant(w, f"taps_OIHWBiBo{block}",
                         lambda: filter_oihwbibo(taps_as_rows(w.constant(), block), block))
    inputs = [source.value, weight]
    if b is not None:
        inputs.append(rw.constant(b, f"taps{kh * kw}_pad{block}",
                                  lambda: taps_bias(b.constant(), kh * kw, block)))
    out, graph = node.output, rw.graph
    name = node.name or out.name

    def step(op: str, operands: list, attrs: dict, shape: tuple, label: str,
             domain: str = "") -> Value:
        value = Value(graph.fresh_name(f"{out.name}_{label}"), DType.FLOAT, shape)
        graph.insert_before(node, Node(op, operands, attrs, domain=domain, outputs=[value],
                                       name=graph.fresh_node_name(f"{name}/{label}")))
        return value

    def dims(label: str, values: list[int]) -> Value:
        return graph.make_initializer(f"{out.name}_{label}", np.array(values, dtype=np.int64))

    blocks = padded_out // block
    taps = step("Conv", inputs, {"kernel_shape": [1, 1]}, (n, kh * kw * padded_out, h, width),
                "taps", domain=NCHWC)
    split_shape = (kh, kw, blocks, h, width, block)
    split = step("Reshape", [taps, dims("taps_shape", [0, *split_shape])], {}, (n, *split_shape),
                 "taps_split")
    interleaved = step("Transpose", [split], {"perm": [0, 3, 4, 1, 5, 2, 6]},
                       (n, blocks, h, kh, width, kw, block), "interleaved")
    # The padded channels are 0 in every tap (zero weights and bias), so in the result too.
    up_shape = dims("up_shape", [0, padded_out, h * kh, width * kw])
    rw.add(node, "Reshape", [interleaved, up_shape], {}, o, domain="", zero_pads=True)
    rw.result.count("ConvTranspose:1x1 Conv + depth-to-space")
