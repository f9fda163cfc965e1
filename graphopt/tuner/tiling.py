"""The tiling space of NPU cube ops: GEMM shapes of IR nodes, tilings, their buffer constraints.

A cube op is a batch of GEMMs C[M,N] = A[M,K]·B[K,N]; Conv runs as an implicit GEMM
(im2col): M = N·Ho·Wo, K = Cin/group·kh·kw, N = Cout/group, with `group` as the batch;
ConvTranspose as the conv over its stride-dilated input that CANN runs (the same formula). A
grouped conv's groups are packed as CANN's Conv2D packs them (group_enlargement): groups of a
few channels each share one GEMM of block-diagonal weights, so a depthwise conv of 144
channels is 9 GEMMs 16 channels wide, not 144 one channel wide.

A conv's shape also carries its ConvGeometry (input, output and kernel sizes, strides,
dilations): its A operand is never an im2col matrix in GM. The feature map sits in GM as
NC1HWC0, MTE2 moves the input band an M-tile's output pixels need (halo included) into L1, and
MTE1's load3d (Img2Col) expands it on the way to L0A: ConvGeometry.band and conv_reads size
what GM supplies (the formulas and their sources: npu_model.py).

A `Tiling` cuts C into base_m × base_n output tiles, each accumulated over ceil(K/base_k)
K-steps of an A tile (base_m × base_k) and a B tile (base_k × base_n). Per AI core:

    L0A   base_m·base_k·in_bytes      (×2 double buffered)   A operand of the cube
    L0B   base_k·base_n·in_bytes      (×2 double buffered)   B operand of the cube
    L0C   base_m·base_n·acc_bytes     (×2 double buffered)   fp32 (int32 for int8) accumulators
    L1    l1_depth·(base_m + base_n)·base_k·in_bytes (×2)    l1_depth K-steps of A and B tiles
          (a conv: its A part is the largest input band one GM→L1 load brings, conv_reads,
          never more than the l1_depth·base_m·base_k of the GEMM)
    UB    base_m·base_n·ub_bytes      (×2 double buffered)   the epilogue / output tile

in_bytes is 1 for int8/uint8 and 2 otherwise (float32 cube work runs in float16, ATC's default
precision mode), acc_bytes 4, ub_bytes 4 for int8 (the int32 results its AscendDequant epilogue
reads) and 2 otherwise; out_bytes, what reaches GM, is 2: float16, an int8 kernel's dequantized
results included (the int8 cube kernels on an NPU come from QDQ, and ATC fuses AscendDequant into
the kernel before them: CANN's conv and matmul dequant UB fusion patterns). Base sizes are
multiples of the device's cube shape for the dtype (M, K, N): 16×16×16 for float16,
16×32×16 for int8.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphopt.codegen.om_manifest import dtype_name

if TYPE_CHECKING:
    from graphopt.ir import Node, Value
    from graphopt.partition.target import Device

MATMUL_OPS = frozenset({"MatMul", "FusedMatMul", "Gemm", "FusedGemm", "MatMulInteger"})
CONV_OPS = frozenset({"Conv", "FusedConv", "ConvInteger", "ConvTranspose"})
CUBE_OPS = MATMUL_OPS | CONV_OPS
ANCHORS_OF_GROUPS = frozenset({"Conv", "MatMul", "Gemm"})  # cube kernels FuseElementwise takes
L1_DEPTHS = (1, 2, 4, 8)
BUFFERS = ("L0A", "L0B", "L0C", "L1", "UB")


@dataclass(frozen=True)
class ConvGeometry:
    """Where a conv's implicit GEMM reads its input, per spatial dim (outermost first): the
    input's size (unpadded: load3d makes the padding on chip, GM holds none of it), the
    output's, the kernel's, the stride and the dilation. `transposed`: a ConvTranspose, which
    CANN runs as the conv over its input dilated by `strides` (stride 1 over it); the zeros the
    dilation inserts are not in GM either."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    transposed: bool = False

    @property
    def taps(self) -> int:
        """Kernel positions: the K elements one input channel contributes."""
        return math.prod(self.kernel)

    def band(self, run: int, images: int, worst: bool = False) -> float:
        """Input elements per channel that `run` consecutive output pixels (one M-tile: M runs
        over the images, then each spatial dim, the last fastest) read, halo included: the
        input rows they span, whole (as CANN's Conv2D M mode loads hiL1 × Wi), or within one
        output row the window it spans (as its HW mode's wiL1). The tiles start every `run`
        pixels, so a tile is priced at the mean over where they start in a row: 1 + (run -
        g)/row output rows, g = gcd(run, row); `worst`: the most a tile can span,
        ⌈(run - 1)/row⌉ + 1 rows, what an L1 buffer must hold. A run of an image or more
        reads its whole images and the band of what remains. Ignored: padding rows at an
        image's border count as read (up to the image's own rows), and a run crossing from
        one image into the next is priced as if it stayed in one (its second halo: `worst`
        counts it)."""
        dims = []  # (out, in, stride, extent, in-per-read)
        for size, out, k, s, d in zip(self.inputs, self.outputs, self.kernel, self.strides,
                                      self.dilations):
            extent = (k - 1) * d + 1
            dims.append((out, size, 1, extent, s) if self.transposed
                        else (out, size, s, extent, 1))
        pixels, image = math.prod(self.outputs), math.prod(self.inputs)
        whole, rest = divmod(run, pixels) if run >= pixels else (0, run)
        if whole >= images:
            return images * image
        band = whole * image + (_band(rest, dims, worst) if rest else 0.0)
        if worst and images > 1:  # a run into the next image: a second halo and part-row
            out, size, stride, extent, sparse = dims[0]
            band += (max(0, extent - stride) / sparse + 1) * image / size
        return min(band, images * image)


def _band(run: int, dims: list[tuple[int, int, int, int, int]], worst: bool) -> float:
    """ConvGeometry.band over `dims`, (out, in, stride, extent, sparse) outermost first: the
    input rows of the outermost dim the run spans, times what it reads of the inner dims.
    `sparse` > 1 is a ConvTranspose's stride: GM holds one row in that many of the dilated
    input the conv reads."""
    out, size, stride, extent, sparse = dims[0]

    def rows_in(rows: float) -> float:
        return min(size, ((rows - 1) * stride + extent) / sparse)

    rest = dims[1:]
    if not rest:
        return rows_in(min(run, out))
    inner = math.prod(d[0] for d in rest)
    if run < inner:  # within one row of this dim, or across two: its window of the inner dims
        return rows_in(1) * _band(run, rest, worst)
    spanned = -(-(run - 1) // inner) + 1 if worst else 1 + (run - math.gcd(run, inner)) / inner
    return rows_in(min(out, spanned)) * math.prod(d[1] for d in rest)


@dataclass(frozen=True)
class GemmShape:
    """`batch` independent GEMMs of [m, k] × [k, n] in `dtype` ("float16", "int8", …); a
    conv's also carries its ConvGeometry (`conv`), which prices its A operand's GM traffic."""

    batch: int
    m: int
    k: int
    n: int
    dtype: str = "float16"
    conv: ConvGeometry | None = None

    @property
    def macs(self) -> int:
        return self.batch * self.m * self.k * self.n

    @property
    def has_work(self) -> bool:
        """False when a dim is 0 (a zero-size tensor): nothing for the cube, nothing to tile."""
        return self.macs > 0


@dataclass(frozen=True)
class Tiling:
    base_m: int
    base_n: int
    base_k: int
    l1_depth: int = 2          # K-steps of A and B tiles one GM→L1 load brings
    double_buffer: bool = True
    cores: int = 1             # AI cores the output tiles are spread over

    def __str__(self) -> str:
        return (f"{self.base_m}x{self.base_n}x{self.base_k} l1={self.l1_depth} "
                f"db={'on' if self.double_buffer else 'off'} cores={self.cores}")


def tiling_from(fields) -> Tiling:
    """The Tiling a stored record holds (a trial's user attribute, an export's entry);
    TypeError saying what is wrong when it is not one graphopt writes: a field missing or
    unknown, a count that is not an integer (bool is one to isinstance: `"cores": true` would
    reach the .om as a tiling), double_buffer not true or false."""
    if not isinstance(fields, dict):
        raise TypeError(f"a tiling is an object of base_m, base_n, …, not {fields!r}")
    wrong = [key for key, value in fields.items() if key in _TILING_TYPES
             and type(value) is not _TILING_TYPES[key]]
    if wrong:
        raise TypeError(f"{', '.join(wrong)} must be "
                        f"{'true or false' if wrong == ['double_buffer'] else 'integers'}: "
                        f"{fields}")
    return Tiling(**fields)  # TypeError for a field missing or unknown


_TILING_TYPES = {"base_m": int, "base_n": int, "base_k": int, "l1_depth": int,
                 "double_buffer": bool, "cores": int}


# --- shapes ---------------------------------------------------------------------------------


def cube_dtype(dtype: str) -> str:
    """The cube dtype a data dtype computes in: float32 runs in float16, uint8 as int8."""
    return {"float32": "float16", "uint8": "int8", "double": "float16"}.get(dtype, dtype)


def cube_shape(shape: GemmShape, device: Device) -> tuple[int, int, int]:
    """(M, K, N) of one cube operation for the shape's dtype (float16's when not listed)."""
    cubes = device.cube or {}
    cube = cubes.get(cube_dtype(shape.dtype)) or cubes.get("float16")
    if cube is None:
        raise ValueError(f"device '{device.name}' has no cube unit")
    return tuple(cube)  # type: ignore[return-value]


def in_bytes(shape: GemmShape) -> int:
    return 1 if cube_dtype(shape.dtype) == "int8" else 2


def acc_bytes(shape: GemmShape) -> int:
    return 4


def ub_bytes(shape: GemmShape) -> int:
    return 4 if cube_dtype(shape.dtype) == "int8" else 2


def out_bytes(shape: GemmShape) -> int:
    return 2


def gemm_shape(node: Node) -> GemmShape:
    """The GEMM a MatMul/Gemm/Conv node (and their fused forms) computes; ValueError when the
    op is not a cube op or a shape it needs is not static."""
    if node.op_type not in CUBE_OPS:
        raise ValueError(f"{node!r}: {node.qualified_op} is not a cube op (MatMul, Gemm, Conv)")
    a, b = node.input(0), node.input(1)
    if a is None or b is None or a.static_shape is None or b.static_shape is None:
        raise ValueError(f"{node!r}: {node.qualified_op} needs static input shapes")
    dtype = operand_dtype(a, b)
    out = node.outputs[0] if node.outputs else None
    attrs = {key: attr.value for key, attr in node.attrs.items()}
    return op_gemm_shape(node.op_type, attrs, a.static_shape, b.static_shape, dtype,
                         out.static_shape if out is not None else None)


def group_anchor_shape(call: Node, function) -> tuple[str, GemmShape] | None:
    """(op type, GEMM) of the cube kernel heading a graphopt:: elementwise group (the call of
    `function`, an onnx.FunctionProto FuseElementwise(epilogues=True) made); None for a group
    without one. ValueError when the kernel's input shapes are not static."""
    import onnx

    anchor = next((n for n in function.node if n.op_type in ANCHORS_OF_GROUPS and not n.domain),
                  None)
    if anchor is None:
        return None
    by_name = dict(zip(function.input, call.inputs))
    a, b = by_name.get(anchor.input[0]), by_name.get(anchor.input[1])
    if a is None or b is None or a.static_shape is None or b.static_shape is None:
        raise ValueError(f"{call!r}: the {anchor.op_type} inside needs static input shapes")
    attrs = {attr.name: onnx.helper.get_attribute_value(attr) for attr in anchor.attribute}
    return anchor.op_type, op_gemm_shape(anchor.op_type, attrs, a.static_shape,
                                         b.static_shape, operand_dtype(a, b))


def operand_dtype(a: Value, b: Value) -> str:
    """The dtype a cube op computes in from its operands: int8 when both are 8-bit tensors
    dequantized right before it (the QDQ form of an int8 kernel: the cube reads them as they
    are and dequantizes its int32 result), else A's."""
    if dequantized_8bit(a) and dequantized_8bit(b):
        return "int8"
    return (dtype_name(int(a.dtype)) if a.dtype is not None else None) or "float32"


def dequantized_8bit(value: Value | None) -> bool:
    """Whether `value` is a DequantizeLinear's output of int8 or uint8 data."""
    producer = value.producer if value is not None else None
    if producer is None or producer.op_type != "DequantizeLinear" or not producer.is_onnx:
        return False
    data = producer.inputs[0]
    return data is not None and data.dtype is not None \
        and dtype_name(int(data.dtype)) in ("int8", "uint8")


def op_gemm_shape(op_type: str, attrs: dict, a: tuple, b: tuple, dtype: str,
                  out: tuple | None = None) -> GemmShape:
    """gemm_shape from an op type, its attributes and its input shapes (A or X, B or W)."""
    if op_type == "ConvTranspose":
        return _conv_transpose_shape(attrs, a, b, dtype, out)
    if op_type in CONV_OPS:
        return _conv_shape(attrs, a, b, dtype, out)
    sa, sb = list(a), list(b)
    # FusedMatMul's transBatchA/B move dim 0 behind the batch dims (A [S, B, K] is read as
    # [B, S, K]); its transA/transB then swap the last two, as onnxruntime applies them.
    if attrs.get("transBatchA", 0) and len(sa) >= 3:
        sa = sa[1:-1] + [sa[0], sa[-1]]
    if attrs.get("transBatchB", 0) and len(sb) >= 3:
        sb = sb[1:-1] + [sb[0], sb[-1]]
    if attrs.get("transA", 0) and len(sa) >= 2:
        sa[-2:] = sa[-2:][::-1]
    if attrs.get("transB", 0) and len(sb) >= 2:
        sb[-2:] = sb[-2:][::-1]
    if len(sa) == 1:
        sa = [1] + sa
    if len(sb) == 1:
        sb = sb + [1]
    m, k, n = sa[-2], sa[-1], sb[-1]
    if len(sb) == 2:
        # A shared 2-D weight: the leading dims of A fold into M, as CANN's MatMul does.
        return GemmShape(1, math.prod(sa[:-1]), k, n, dtype)
    batch_a, batch_b = sa[:-2], sb[:-2]
    rank = max(len(batch_a), len(batch_b))
    batch_a = [1] * (rank - len(batch_a)) + batch_a
    batch_b = [1] * (rank - len(batch_b)) + batch_b
    return GemmShape(math.prod(max(x, y) for x, y in zip(batch_a, batch_b)), m, k, n, dtype)


def _conv_shape(attrs: dict, x: tuple, w: tuple, dtype: str, out: tuple | None) -> GemmShape:
    group = int(attrs.get("group", 1))
    kernel = w[2:]
    if out is not None and len(out) == len(x):
        spatial = out[2:]
    else:
        strides = attrs.get("strides") or [1] * len(kernel)
        dilations = attrs.get("dilations") or [1] * len(kernel)
        pads = attrs.get("pads") or [0] * (2 * len(kernel))
        auto_pad = attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            spatial = [math.ceil(d / s) for d, s in zip(x[2:], strides)]
        else:
            spatial = [(d + pads[i] + pads[i + len(kernel)] - dilations[i] * (kernel[i] - 1) - 1)
                       // strides[i] + 1 for i, d in enumerate(x[2:])]
    enlarge = group_enlargement(group, w[1], w[0] // group, dtype)
    return GemmShape(-(-group // enlarge), x[0] * math.prod(spatial),
                     enlarge * w[1] * math.prod(kernel), enlarge * (w[0] // group), dtype,
                     _geometry(attrs, x, kernel, spatial))


def _geometry(attrs: dict, x: tuple, kernel: tuple, spatial, transposed: bool = False
              ) -> ConvGeometry:
    rank = len(kernel)
    return ConvGeometry(tuple(int(d) for d in x[2:]), tuple(int(d) for d in spatial),
                        tuple(int(d) for d in kernel),
                        tuple(int(s) for s in attrs.get("strides") or [1] * rank),
                        tuple(int(d) for d in attrs.get("dilations") or [1] * rank), transposed)


def group_enlargement(group: int, cin: int, cout: int, dtype: str) -> int:
    """How many groups of `cin` input and `cout` output channels CANN's Conv2D packs into one
    GEMM (its group extension): enough that the packed channels fill a cube's C0 (16, 32 for
    int8) on the input side and 16 on the output side, at most every group. Priced one narrow
    GEMM per group, a depthwise conv took 12x the time of the 1×1 conv beside it, and the
    partitioner returned whole MobileNets to the host."""
    if group <= 1 or cin <= 0 or cout <= 0:
        return 1
    c0 = 32 if cube_dtype(dtype) == "int8" else 16
    by_input = math.lcm(cin, c0) // cin
    by_output = math.lcm(cout, 16) // cout
    return min(math.lcm(by_input, by_output), group)


def _conv_transpose_shape(attrs: dict, x: tuple, w: tuple, dtype: str,
                          out: tuple | None) -> GemmShape:
    """ConvTranspose as CANN's Conv2DBackpropInput runs it: a direct conv over the input
    dilated by the strides, so one GEMM row per output pixel: M = N·Hout·Wout, K = Cin/g·kh·kw,
    N = Cout/g (the weight is [Cin, Cout/g, kh, kw]); the zeros the dilation inserts are
    multiplied too. Groups are packed as a Conv's are (group_enlargement): one 1-wide GEMM per
    channel priced a depthwise ConvTranspose above a dense one of 64 times its work."""
    group = int(attrs.get("group", 1))
    kernel = w[2:]
    if out is not None and len(out) == len(x):
        spatial = out[2:]
    else:
        rank = len(kernel)
        strides = attrs.get("strides") or [1] * rank
        dilations = attrs.get("dilations") or [1] * rank
        pads = attrs.get("pads") or [0] * (2 * rank)
        extra = attrs.get("output_padding") or [0] * rank
        spatial = [strides[i] * (d - 1) + extra[i] + dilations[i] * (kernel[i] - 1) + 1
                   - pads[i] - pads[i + rank] for i, d in enumerate(x[2:])]
    cin = x[1] // group
    enlarge = group_enlargement(group, cin, w[1], dtype)
    return GemmShape(-(-group // enlarge), x[0] * math.prod(spatial),
                     enlarge * cin * math.prod(kernel), enlarge * w[1], dtype,
                     _geometry(attrs, x, kernel, spatial, transposed=True))


@functools.lru_cache(maxsize=1 << 16)  # a search prices each (tile rows, load) many times
def conv_reads(shape: GemmShape, tm: int, span: int) -> tuple[float, float]:
    """(A elements GM→L1 moves for one output tile of `tm` rows over its whole K loop, the
    most one load moves wherever a tile starts: what the L1 must hold) of a conv whose loads bring `span` K elements each (l1_depth
    K-steps). K runs in the order of CANN's FRACTAL_Z weights, C1·taps·C0: a block of C0
    channels (32 bytes of each pixel: 16 float16, 32 int8) takes all its taps before the next.
    A load brings the band (ConvGeometry.band) of every channel of the blocks its K range
    touches, once however many of its K-steps read it; a block split between two loads is
    brought by both (the L1 holds one load's data). Never more than the load's im2col elements
    (tm × its K): a kernel can move those instead (a 1×1 conv with a stride, its sampled
    pixels by a strided DMA)."""
    geometry = shape.conv
    assert geometry is not None
    images = shape.m // max(1, math.prod(geometry.outputs))
    band, most = geometry.band(tm, images), geometry.band(tm, images, worst=True)
    total = largest = 0.0
    for count, length, channels in _loads(shape.k, geometry.taps, 32 // in_bytes(shape), span):
        total += count * min(tm * length, channels * band)
        largest = max(largest, min(tm * length, channels * most))
    return total, largest


@functools.lru_cache(maxsize=4096)
def _loads(k: int, taps: int, c0: int, span: int) -> tuple[tuple[int, int, int], ...]:
    """(how many, K elements, channels) of each kind of the GM→L1 loads of `span` K elements
    that cover a conv's K = channels × taps in C1·taps·C0 order."""
    channels, block = k // taps, c0 * taps
    kinds: collections.Counter = collections.Counter()
    for start in range(0, k, span):
        end = min(k, start + span)
        first, last = start // block, (end - 1) // block
        kinds[end - start, min(channels, (last + 1) * c0) - first * c0] += 1
    return tuple((count, length, chans) for (length, chans), count in sorted(kinds.items()))


# --- the space ------------------------------------------------------------------------------


def buffer_use(tiling: Tiling, shape: GemmShape) -> dict[str, int]:
    """Bytes per AI core each buffer needs under `tiling` (formulas in the module docstring)."""
    db = 2 if tiling.double_buffer else 1
    ib, m, n, k = in_bytes(shape), tiling.base_m, tiling.base_n, tiling.base_k
    a_l1 = tiling.l1_depth * m * k
    if shape.conv is not None and shape.has_work:  # the band a load brings, not its im2col
        a_l1 = math.ceil(conv_reads(shape, m, tiling.l1_depth * k)[1])
    return {"L0A": m * k * ib * db, "L0B": k * n * ib * db,
            "L0C": m * n * acc_bytes(shape) * db,
            "L1": (a_l1 + tiling.l1_depth * n * k) * ib * db,
            "UB": m * n * ub_bytes(shape) * db}


def feasible(tiling: Tiling, shape: GemmShape, device: Device) -> str | None:
    """None when `tiling` can run `shape` on `device`, else the reason it cannot."""
    cm, ck, cn = cube_shape(shape, device)
    for name, value, unit in (("base_m", tiling.base_m, cm), ("base_k", tiling.base_k, ck),
                              ("base_n", tiling.base_n, cn)):
        if value <= 0 or value % unit:
            return f"{name} {value} is not a positive multiple of the cube's {unit} ({shape.dtype})"
    if tiling.l1_depth < 1:
        return f"l1_depth {tiling.l1_depth} is below 1"
    cores = device.ai_cores or 1
    if not 1 <= tiling.cores <= cores:
        return f"cores {tiling.cores} is outside 1..{cores} (the device's AI cores)"
    for name, need in buffer_use(tiling, shape).items():
        have = device.buffers.get(name)
        if have is not None and need > have:
            return (f"{name} overflows: {tiling} needs {need} bytes, {device.name} has {have}"
                    + (" (double buffered)" if tiling.double_buffer else ""))
    return None


def _padded(size: int, unit: int) -> int:
    return max(unit, -(-size // unit) * unit)


def base_candidates(size: int, unit: int) -> list[int]:
    """Base sizes for a dim: every multiple of the cube unit up to 16 units, then powers of two
    times the unit, never past the dim rounded up to the unit (a larger tile only pads)."""
    top = _padded(size, unit)
    values = {unit * j for j in range(1, 17)} | {unit * 2 ** j for j in range(5, 12)}
    return sorted(v for v in values if v <= top)


def tiling_space(shape: GemmShape, device: Device) -> Iterator[Tiling]:
    """Every feasible tiling of `shape` on `device`: base sizes from base_candidates,
    l1_depth in L1_DEPTHS (no more than the K-steps there are), double buffering on and off,
    1..ai_cores cores (no more than the output tiles there are)."""
    cm, ck, cn = cube_shape(shape, device)
    ms, ns, ks = (base_candidates(shape.m, cm), base_candidates(shape.n, cn),
                  base_candidates(shape.k, ck))
    for bm, bn, bk, db in itertools.product(ms, ns, ks, (True, False)):
        k_steps = -(-shape.k // bk)
        tiles = shape.batch * -(-shape.m // bm) * -(-shape.n // bn)
        for depth in L1_DEPTHS:
            if depth > 1 and depth // 2 >= k_steps:
                break
            first = Tiling(bm, bn, bk, depth, db, 1)
            if feasible(first, shape, device) is not None:
                continue
            for cores in range(1, min(device.ai_cores or 1, tiles) + 1):
                yield Tiling(bm, bn, bk, depth, db, cores)


def space_size(shape: GemmShape, device: Device) -> int:
    return sum(1 for _ in tiling_space(shape, device))


def default_tiling(shape: GemmShape, device: Device) -> Tiling:
    """A CANN-style default: base tiles of 128 × 128 × 128 elements (K 256 for int8, whose cube
    is 32 wide in K), each cut to a multiple of the cube and capped by its dim rounded up to
    it, double buffered, l1_depth 2 and every AI core that gets a tile: the kind of fixed base
    block CANN's matmul tiling starts from. It fits L0A/L0B/L0C/L1/UB double buffered on every
    shipped NPU profile; on a smaller device the tile halves (M and N first, then K) until it
    fits, then double buffering goes.
    Not the optimum: it ignores the shape's memory traffic, pipeline fill and the core split's
    load balance, which is what tuning is for."""
    cm, ck, cn = cube_shape(shape, device)
    mp, np_, kp = _padded(shape.m, cm), _padded(shape.n, cn), _padded(shape.k, ck)
    k_top = 128 * max(1, ck // 16)
    for db in (True, False):
        for side, k_side in ((128, k_top), (64, k_top), (64, k_top // 2), (32, k_top // 2),
                             (16, k_top // 4)):
            # Each side a multiple of its cube unit (a custom cube of 12 would take no 128).
            bm = max(cm, min(side - side % cm, mp))
            bn = max(cn, min(side - side % cn, np_))
            bk = max(ck, min(k_side - k_side % ck, kp))
            tiling = Tiling(bm, bn, bk, 2, db, 1)
            if feasible(tiling, shape, device) is None:
                tiles = shape.batch * -(-shape.m // bm) * -(-shape.n // bn)
                # max(1, …): a shape without work has no tiles, and a tiling at least one core.
                return Tiling(bm, bn, bk, 2, db, max(1, min(device.ai_cores or 1, tiles)))
    return Tiling(cm, cn, ck, 1, False, 1)
