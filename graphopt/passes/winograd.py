r"""WinogradConv: 3×3 stride-1 convolutions with many channels rewritten as Winograd F(4×4, 3×3)
in plain ONNX ops, which onnxruntime's CPU provider runs as a batch of 36 GEMMs with 4× fewer
multiply-adds than its direct convolution, plus the transforms (-O3, cpu target).

Winograd's minimal filtering (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks",
2016) computes a 4×4 output tile from a 6×6 input tile d as

    Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A        g: a 3×3 filter, ⊙: elementwise

and, summed over input channels, the elementwise products become one GEMM per position of the
6×6 transformed tile. With P tiles of C channels and K filters:

    x [1,C,H,W] ─ Reshape [C,1,H,W] ─ Conv(Bᵀ·B, kernel 6, stride 4)  ─ [C, 36, th, tw]
      ─ Transpose [36,C,th,tw] ─ Reshape [36,C,P]
      ─ MatMul(U [36,K,C], ·)  (U = G g Gᵀ of every filter, computed here)  ─ [36,K,P]
      ─ MatMul(A₂ [16,36], Reshape [36,K·P])   (A₂ = Aᵀ⊗Aᵀ)                  ─ [16,K·P]
      ─ Reshape [1,16K,th,tw] ─ DepthToSpace(4, DCR) ─ [1,K,4th,4tw] ─ Slice ─ Add(bias)

(from opset 7; a batch other than a static 1 adds two Transposes, see `rewrite`).

The transforms are passes over memory, the GEMMs are where the time goes, so the rewrite pays
where channels are many and tiles are not few: at least 128 channels in and out, and tiles ×
that many channels ≥ 8192, the tiles of every image of a static batch counted (`pays_off`).
`python bench/winograd.py` (onnxruntime 1.32, 1 thread, AVX2) is where the rule comes from
(ranges over runs): 1.2–1.3× on UNet's 128×128×128 layer, 1.7–1.8× at 256×64×64, 2.1–2.5× at
512×32×32 and 1024×16×16, 1.7–1.9× on VGG's 256×56×56; but 0.77–0.86× with 64 channels at
256×256, and 0.50–0.56× at 512×7×7, whose 4 tiles make GEMMs too thin (ResNet-50's last stage).
Near the line (128×28×28, 384×17×17) the gains are small, and inside a conv net smaller still:
the direct conv stays in the blocked NCHWc layout between its neighbours, while the rewrite
needs a reorder on each side.

Results change in the last bits: a transformed tile's sums are rounded differently from the
direct sums. The error measured on one layer is 4e-6 to 2.3e-5 of its largest output (points 0,
±1, ±2; F(2×2, 3×3) rounds less, but cuts the multiply-adds 2.25×, not 4×). That is why this
is an -O3 pass: -O2's passes keep results within what onnxruntime's own optimization levels
change. The transformed weights U take 36/9 = 4× the bytes of the filters they replace.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from graphopt.ir import DType, Model, Node
from graphopt.option_names import from_command_line, option
from graphopt.passes.base import Pass, PassContext, PassResult, register
from graphopt.passes.edit import replace_value

TILE = 4                     # output tile side, m in F(m×m, 3×3)
SPAN = TILE + 2              # input tile side, m + r − 1
MIN_CHANNELS = 128           # below, the transforms cost more than the GEMMs save
MIN_TILE_CHANNELS = 8192     # tiles × min(C, K): below, the 36 GEMMs are too thin


def tolerance_hint(rewrites: int, tolerance: str | None = None) -> str:
    """What a failed elementwise comparison of a compile with `rewrites` Winograd convs says;
    `tolerance` names the option to loosen (by default atol, as the caller names options)."""
    if from_command_line():
        level, disable = "-O3", "--disable-pass WinogradConv"
    else:
        level, disable = "level=3", "disable_passes=['WinogradConv']"
    return (f"{level} rewrote {rewrites} conv(s) as Winograd, exact to ~2e-5 of each one's "
            f"largest output; pass a looser {tolerance or option('atol')}, or compile with "
            f"{disable}")


@functools.cache
def matrices() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Aᵀ (4×6), G (6×3) and Bᵀ (6×6) of F(4, 3) on the points 0, 1, −1, 2, −2 and ∞."""
    at = np.array([[1, 1, 1, 1, 1, 0],
                   [0, 1, -1, 2, -2, 0],
                   [0, 1, 1, 4, 4, 0],
                   [0, 1, -1, 8, -8, 1]], np.float64)
    g = np.array([[1 / 4, 0, 0],
                  [-1 / 6, -1 / 6, -1 / 6],
                  [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6],
                  [0, 0, 1]], np.float64)
    bt = np.array([[4, 0, -5, 0, 1, 0],
                   [0, -4, -4, 1, 1, 0],
                   [0, 4, -4, -1, 1, 0],
                   [0, -2, -1, 2, 1, 0],
                   [0, 2, -1, -2, 1, 0],
                   [0, 4, 0, -5, 0, 1]], np.float64)
    return at, g, bt


def tiles(out_h: int, out_w: int) -> tuple[int, int]:
    return math.ceil(out_h / TILE), math.ceil(out_w / TILE)


def pays_off(channels: int, filters: int, out_h: int, out_w: int, batch: int = 1) -> bool:
    """Whether a [batch, channels, ·, ·] → [batch, filters, out_h, out_w] 3×3 conv runs faster
    as Winograd on onnxruntime's CPU provider (the measured rule in the module docstring). The
    tiles of every image are columns of the same GEMMs."""
    th, tw = tiles(out_h, out_w)
    narrow = min(channels, filters)
    return narrow >= MIN_CHANNELS and batch * th * tw * narrow >= MIN_TILE_CHANNELS


def filter_transform(weight: np.ndarray) -> np.ndarray:
    """U [36, K, C] from filters [K, C, 3, 3]."""
    _, g, _ = matrices()
    k, c = weight.shape[:2]
    # One GEMM by G⊗G over the flattened filters: U[x·6+y] = Σ G[x,i]·G[y,j]·g[i,j]. Per-filter
    # products (an einsum or batched 6×3 matmuls) took seconds on UNet's 31M weights. In the
    # filters' own float32: 9-term sums round far below the method's 1e-5.
    flat = weight.reshape(k * c, 9)
    u = np.kron(g, g).astype(weight.dtype) @ flat.T
    return u.reshape(SPAN * SPAN, k, c)


def input_kernel() -> np.ndarray:
    """The Conv filter [36, 1, 6, 6] computing Bᵀ d B of a one-channel image's tiles."""
    _, _, bt = matrices()
    return np.einsum("xi,yj->xyij", bt, bt).reshape(SPAN * SPAN, 1, SPAN, SPAN).astype(np.float32)


def output_matrix() -> np.ndarray:
    """A₂ [16, 36]: the output transform Aᵀ M A of one tile as a matrix on its 36 entries."""
    at, _, _ = matrices()
    return np.einsum("ax,by->abxy", at, at).reshape(TILE * TILE, SPAN * SPAN).astype(np.float32)


def _text(node: Node, name: str, default: str | None = None) -> str | None:
    """A string attribute, which an imported model may hold as bytes."""
    value = node.attr(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _auto_pad(node: Node) -> str:
    return _text(node, "auto_pad", "NOTSET")


MS = "com.microsoft"
# FusedConv's activation → (ONNX op, names its activation_params map to; "min"/"max" are Clip's
# bound inputs). -O3 fuses activations before this pass runs.
ACTIVATIONS = {"Relu": (), "Sigmoid": (), "Tanh": (), "HardSwish": (), "LeakyRelu": ("alpha",),
               "HardSigmoid": ("alpha", "beta"), "Clip": ("min", "max")}


def _activation(node: Node) -> str | None:
    return _text(node, "activation")


def _image_dims(value) -> tuple[int, int, int, int] | None:
    """(batch, C, H, W) of a rank-4 value whose C, H and W are known; the batch may be any dim."""
    shape = value.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        return None
    return shape


def refusal(node: Node, opset: int) -> str | None:
    """Why `node` (a Conv, or onnxruntime's FusedConv) stays a direct convolution (None: it is
    rewritten)."""
    fused = node.domain == MS and node.op_type == "FusedConv"
    if not (fused or node.is_onnx) or len(node.inputs) not in (2, 3):
        return "not an ONNX Conv, nor a FusedConv without a sum input"
    if fused and _activation(node) not in ACTIVATIONS:
        return f"activation {_activation(node)}"
    if fused and _activation(node) == "HardSwish" and opset < 14:
        return "HardSwish activation below opset 14"
    x, w = node.inputs[0], node.inputs[1]
    b = node.input(2)
    out = node.output
    if opset < 7:
        return "opset below 7 (Add without broadcasting)"
    if x is None or x.dtype != DType.FLOAT or not w.is_constant \
            or (b is not None and not b.is_constant):
        return "not float32 with constant filters"
    shape, out_shape = _image_dims(x), _image_dims(out)
    if shape is None or out_shape is None:
        return "not a 2-D conv with static channels and sizes"
    if w.const.shape[2:] != (3, 3) or node.attr("group", 1) != 1:
        return "not a 3×3 kernel of group 1"
    if any(s != 1 for s in node.attr("strides", [1, 1])) \
            or any(d != 1 for d in node.attr("dilations", [1, 1])):
        return "strided or dilated"
    if _auto_pad(node) not in ("NOTSET", "VALID"):
        return f"auto_pad {_auto_pad(node)}"
    images = shape[0] if isinstance(shape[0], int) else 1  # a symbolic batch may be 1
    if not pays_off(shape[1], out_shape[1], out_shape[2], out_shape[3], images):
        return "too few channels or tiles to pay off"
    return None


def rewrite(node: Node, opset: int = 17) -> None:
    """Replace `node` (checked by `refusal`) by its Winograd form. With a batch other than a
    static 1, the images' tiles are GEMM columns side by side, and two more Transposes move the
    batch axis in and out."""
    graph = node.graph
    x, w, b, out = node.inputs[0], node.inputs[1], node.input(2), node.output
    batch, channels, height, width = _image_dims(x)
    _, filters, out_h, out_w = _image_dims(out)
    single = batch == 1
    pads = list(node.attr("pads", [0, 0, 0, 0])) if _auto_pad(node) == "NOTSET" else [0] * 4
    th, tw = tiles(out_h, out_w)
    count = th * tw
    columns = count if single else (batch * count if isinstance(batch, int) else None)
    # The tiles' extent past the input is zero padding: pads top/left as the conv's, bottom and
    # right so that th × tw whole tiles exist (at least the conv's own padding).
    bottom = TILE * th + 2 - height - pads[0]
    right = TILE * tw + 2 - width - pads[1]
    prefix = node.name or out.name
    positions, outputs = SPAN * SPAN, TILE * TILE

    def step(op, inputs, attrs, shape):
        made = graph.make_node(op, inputs, attrs, before=node, dtype=DType.FLOAT, shape=shape,
                               name=graph.fresh_node_name(f"{prefix}/winograd/{op}"))
        return made.output

    def const(hint, array):
        return graph.make_initializer(f"{prefix}/winograd/{hint}", np.asarray(array))

    def dims(*values):
        return const("shape", np.array(values, np.int64))

    # The input transform treats every channel as an image of its own: one Conv whose GEMM is
    # [36 × 36]·[36 × images·C·tiles], where a grouped Conv (group C) ran C small ones and
    # measured up to 10% slower per layer. Its output [images·C, 36, th, tw] has the memory
    # order of [images, C·36, th, tw].
    planes = batch * channels if isinstance(batch, int) else None
    one_channel = step("Reshape", [x, dims(-1, 1, height, width)], {},
                       (planes, 1, height, width))
    spread = step("Conv", [one_channel, const("input_transform", input_kernel())],
                  {"kernel_shape": [SPAN, SPAN], "strides": [TILE, TILE],
                   "pads": [pads[0], pads[1], bottom, right]},
                  (planes, positions, th, tw))
    # A Reshape of rank 4 to 3 always stands between the Transpose and the MatMul: onnxruntime
    # would fuse a Transpose feeding a MatMul into a FusedMatMul with a transposed batch, which
    # measured 2× slower than the copy.
    if single:
        per_position = step("Transpose", [spread], {"perm": [1, 0, 2, 3]},
                            (positions, channels, th, tw))
    else:
        per_channel = step("Reshape", [spread, dims(-1, channels, positions, count)], {},
                           (batch, channels, positions, count))
        per_position = step("Transpose", [per_channel], {"perm": [2, 1, 0, 3]},
                            (positions, channels, batch, count))
    v = step("Reshape", [per_position, dims(positions, channels, -1)], {},
             (positions, channels, columns))
    m = step("MatMul", [const("filter_transform", filter_transform(w.constant())), v], {},
             (positions, filters, columns))
    flat = step("Reshape", [m, dims(positions, -1)], {},
                (positions, None if columns is None else filters * columns))
    y = step("MatMul", [const("output_transform", output_matrix()), flat], {},
             (outputs, None if columns is None else filters * columns))
    if not single:
        y = step("Reshape", [y, dims(outputs, filters, -1, th, tw)], {},
                 (outputs, filters, batch, th, tw))
        y = step("Transpose", [y], {"perm": [2, 0, 1, 3, 4]}, (batch, outputs, filters, th, tw))
    blocks = step("Reshape", [y, dims(-1, outputs * filters, th, tw)], {},
                  (batch, outputs * filters, th, tw))
    # DCR order, DepthToSpace's only mode before opset 11 and its default since.
    y = step("DepthToSpace", [blocks], {"blocksize": TILE},
             (batch, filters, TILE * th, TILE * tw))
    if (TILE * th, TILE * tw) != (out_h, out_w):
        crop = (batch, filters, out_h, out_w)
        if opset < 10:  # bounds were attributes then
            y = step("Slice", [y], {"starts": [0, 0], "ends": [out_h, out_w], "axes": [2, 3]}, crop)
        else:
            y = step("Slice", [y, dims(0, 0), dims(out_h, out_w), dims(2, 3)], {}, crop)
    if b is not None:
        y = step("Add", [y, const("bias", b.constant().reshape(1, filters, 1, 1))], {},
                 (batch, filters, out_h, out_w))
    if node.domain == MS:
        activation = _activation(node)
        params = dict(zip(ACTIVATIONS[activation], node.attr("activation_params", [])))
        if activation == "Clip" and opset < 11:  # bounds were attributes then
            y = step("Clip", [y], params, (batch, filters, out_h, out_w))
        elif activation == "Clip":
            bounds = [const(name, np.float32(params[name])) for name in ("min", "max")]
            y = step("Clip", [y, *bounds], {}, (batch, filters, out_h, out_w))
        else:
            y = step(activation, [y], params, (batch, filters, out_h, out_w))
    if not replace_value(out, y):
        raise AssertionError("a fresh value takes over any output")
    graph.remove(node)


@register
class WinogradConv(Pass):
    name = "WinogradConv"
    description = ("3×3 stride-1 Convs with ≥128 channels as Winograd F(4×4, 3×3) in ONNX ops "
                   "(-O3, cpu target; results within ~2e-5 of the layer's output scale)")

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        result = PassResult()
        graph = model.graph
        opset = model.opset() or 0
        for node in graph.nodes():
            if node.op_type not in ("Conv", "FusedConv") or refusal(node, opset) is not None:
                continue
            if not ctx.allows(self.name, node):
                continue
            rewrite(node, opset)
            result.count(self.name)
        return result
