r"""The analytical NPU cost model of cube (GEMM/Conv) kernels. Every figure is an estimate.

Units: cycles of the AI core clock (device.clock_hz); bytes. Per AI core, for a tiling
(tiling.py) of a GemmShape with cube shape (cm, ck, cn) and an output tile tm × tn (tm ≤ base_m,
tn ≤ base_n: tail tiles are smaller) over K-steps of tk ≤ base_k:

    cube_step  = ⌈tm/cm⌉·⌈tn/cn⌉·⌈tk/ck⌉                   one cm×ck×cn fractal MAC per cycle
    gm_step    = (a + tn)·tk·in_bytes / bw_core  +  2·DMA_SETUP / min(l1_depth, K-steps)
                 GM→L1 (MTE2) of the A and B tiles; one DMA each brings l1_depth K-steps
                 (no more than there are).
                 bw_core = device.memory_bandwidth / active cores / clock_hz: the chip's
                 bandwidth shared evenly by the cores that stream (active = min(cores, tiles))
                 a = tm for a GEMM: its A tile. For a conv, A is no im2col matrix in GM (below):
                 a = Σ_loads min(tm·K_load, C_load·band(tm)) / K, what GM supplies of the
                 feature map over the tile's K loop, spread evenly over its K elements
    l0_step    = tm·tk·in_bytes / L1_TO_L0A + tk·tn·in_bytes / L1_TO_L0B      L1→L0A/L0B (MTE1)
    writeback  = tm·tn·acc_bytes / L0C_OUT + tm·tn·out_bytes / bw_core          L0C→UB→GM
                 (+ tm·tn·acc_bytes / VECTOR_BYTES for an int8 kernel: its AscendDequant
                 epilogue, int32 results to float16 on the vector unit, in the UB)

A conv (an implicit GEMM, tiling.py; its GemmShape carries a ConvGeometry) keeps its feature map
in GM as NC1HWC0; MTE2 moves the input band an M-tile needs into L1 once, and MTE1's load3d
(Img2Col, L1→L0A) expands it into the tile's rows, taking each pixel up to kh·kw times. So GM
pays for the band and l0_step keeps the expanded tm·tk. With K in the order of the FRACTAL_Z
weights, C1·kh·kw·C0 (a block of C0 = 32 bytes of channels takes all its taps before the
next), a load of l1_depth K-steps (K_load elements) brings the band of every channel of the
blocks it touches (C_load channels), once for all its K-steps:

    band(tm)   input elements per channel that tm consecutive output pixels read: the input
               rows they span, whole, hi = (ho - 1)·stride + (k - 1)·dilation + 1 ≤ Hi rows
               of Wi (CANN's M mode), ho = 1 + (tm - g)/Wo output rows on average over where
               the tiles start (g = gcd(tm, Wo)); for tm within one output row, the window it
               spans, the same formula across W (the HW mode's wiL1); a tile of an image or
               more reads those images whole and the band of the rest; likewise for 1-D and
               3-D convs, dim by dim. A ConvTranspose (the conv over its input dilated by the
               strides) reads one dilated row in `stride` from GM.
    min(…)     a load never costs more than its im2col elements (tm·K_load), what the model
               charged before and a kernel could move instead: a 1×1 conv costs what its GEMM
               does, stride 1 or not (a stride's sampled pixels by a strided DMA, which takes a
               block count, length and source stride).

Approximations: a channel block split between two loads is brought by both (the L1 holds one
load's data, CANN's tiling keeps kAL1 to whole blocks, which tuning finds by base_k); padding
rows at an image's border count as read (up to the image's own rows); a tile crossing into the
next image pays no second halo; C_load counts the GEMM's channels, as K does, not the zero
channels that pad Cin to C0; a ConvTranspose's dilation is assumed made on chip; L2 reuse of
a band across tiles is not modelled (no L2 at all, as for a GEMM). The L1 holds the largest band
a load brings, from the most rows a tile can span (tiling.buffer_use). Sources: the CANN
Ascend C API's Load3D (image to column, A1→A2) and the CCE intrinsic img2colv2_cbuf_to_ca
(L1→L0A, each kernel window of the feature map expanded into one row); Ascend C's Conv2D, whose
feature map sits in A1 as [C1, H, W, C0] and weights in B1 as [C1, Kh, Kw, Cout, C0]; hicann
ops-nn's conv tiling (conv/common/op_host/op_tiling/arch35/conv_api_tiling_algorithm_base.cpp:
InferHiL1, InferWiL1, and the AL1 size of its M mode: hiL1·Wi·kAL1/(kh·kw) elements for
hoAL1 = mAL1/Wo + 2 output rows); Ascend C's DataCopyParams (blockCount, blockLen, srcStride).

A tile takes TILE_SETUP scalar cycles plus
    double buffered:  max(loop, writeback),  loop = Σ_steps max(gm_step, l0_step, cube_step)
                      (the pipes overlap; the tile's writeback overlaps the next tile's K loop)
    single buffered:  Σ_steps (gm_step + l0_step + cube_step) + writeback       (they add)
and with double buffering the core pays the pipeline's fill and drain once, what the loop's
max leaves out of its first and last steps. GM→L1 moves D = min(l1_depth, K-steps) steps per
DMA, and the L1→L0→cube pipe (compute_step = max(l0_step, cube_step)) runs behind it: a
compute-bound core waits for the first DMA (D·gm_step), a memory-bound one for the last D
steps' compute after their data arrived (D·compute_step), so the fill is
    Σ_first D steps min(gm_step, compute_step) + min(l0_step, cube_step) + min(loop, writeback)
(the same for the inner L0 pipe, and the last tile's writeback, which no later loop hides: n
tiles take loop + (n - 1)·max(loop, writeback) + writeback). With every term of the fill below
what single buffering adds, a double-buffered tiling never prices above the same tiling single
buffered.

The batch·⌈M/base_m⌉·⌈N/base_n⌉ output tiles are spread over the active cores; the busiest
core has ⌈tiles/active⌉ of them and is charged the most expensive ones (full before tail tiles).
cycles = that core's total; seconds = cycles / clock_hz + device.launch_overhead_s.
A kernel is "memory" bound when its GM→L1 + writeback cycles exceed its cube cycles and its
L1→L0 cycles, "compute" bound when the cube cycles do, "on-chip" when L1→L0 does.

Rates (bytes/cycle per AI core), from CANN platform configs ([AICoreMemoryRates] of the SoC
.ini files, e.g. Ascend310's l1_to_l0_a_rate=512, l1_to_l0_b_rate=256, l0_c_to_ub_rate=256 as
hicann op-tiling tests carry them); the shipped profiles do not list them, so they are fixed here:
L1_TO_L0A = 512, L1_TO_L0B = 256, L0C_OUT = 256. DMA_SETUP = 50 and TILE_SETUP = 200 cycles are
estimates (descriptor issue, scalar address arithmetic and pipe synchronisation), to be
calibrated. Vector ops, fused groups, transfers and whole models: vector.py, model.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphopt.tuner.tiling import (GemmShape, Tiling, acc_bytes, conv_reads, cube_dtype,
                                   cube_shape, default_tiling, feasible, gemm_shape, in_bytes,
                                   out_bytes)

if TYPE_CHECKING:
    from graphopt.ir import Node
    from graphopt.partition.target import Device

L1_TO_L0A = 512.0   # bytes/cycle, CANN [AICoreMemoryRates] l1_to_l0_a_rate
L1_TO_L0B = 256.0   # bytes/cycle, l1_to_l0_b_rate
L0C_OUT = 256.0     # bytes/cycle, l0_c_to_ub_rate
DMA_SETUP = 50.0    # cycles per GM→L1 DMA: estimate
TILE_SETUP = 200.0  # scalar cycles per output tile: estimate
VECTOR_BYTES = 256.0  # bytes/cycle of the vector unit (vector.py), an int8 kernel's dequantize


@dataclass(frozen=True)
class Estimate:
    """An estimated (never measured) kernel time; breakdown holds the terms, in cycles unless
    the key says otherwise."""

    cycles: float
    seconds: float
    breakdown: dict = field(default_factory=dict)

    @property
    def bound(self) -> str:
        return self.breakdown.get("bound", "")


def estimate(node_or_shape: Node | GemmShape, tiling: Tiling | None, device: Device) -> Estimate:
    """The estimated time of one cube kernel under `tiling` (the default tiling when None);
    ValueError when the tiling is infeasible, naming the buffer. A shape with a zero-size dim
    has no work to tile, whatever the tiling: no_work_estimate."""
    shape = node_or_shape if isinstance(node_or_shape, GemmShape) else gemm_shape(node_or_shape)
    if not shape.has_work:
        return no_work_estimate(shape, device)
    tiling = tiling or default_tiling(shape, device)
    reason = feasible(tiling, shape, device)
    if reason is not None:
        raise ValueError(f"infeasible tiling for {shape}: {reason}")
    cm, ck, cn = cube_shape(shape, device)
    ib, ab, ob = in_bytes(shape), acc_bytes(shape), out_bytes(shape)
    dequant = ab / VECTOR_BYTES if cube_dtype(shape.dtype) == "int8" else 0.0  # per result
    bm, bn, bk = tiling.base_m, tiling.base_n, tiling.base_k
    mt, nt, kt = -(-shape.m // bm), -(-shape.n // bn), -(-shape.k // bk)
    tiles = shape.batch * mt * nt
    active = min(tiling.cores, tiles)
    bw_core = device.memory_bandwidth / active / device.clock_hz
    db = tiling.double_buffer
    k_tail = shape.k - (kt - 1) * bk

    depth = min(tiling.l1_depth, kt)
    reads: dict[int, float] = {}  # tm -> A elements GM supplies per element of K

    def a_rows(tm: int) -> float:
        """The A elements GM→L1 moves per element of K for a tile of tm rows: tm for a GEMM,
        a conv's input bands spread over its K loop (conv_reads)."""
        if shape.conv is None:
            return tm
        if tm not in reads:
            reads[tm] = conv_reads(shape, tm, depth * bk)[0] / shape.k
        return reads[tm]

    def tile(tm: int, tn: int) -> dict:
        terms = {"cube": 0.0, "gm": 0.0, "l0": 0.0, "loop": 0.0, "fill": 0.0}
        filled = 0  # of the first DMA's steps, counted into the fill
        a = a_rows(tm)
        for tk, count in ((bk, kt - 1), (k_tail, 1)):
            if not count:
                continue
            cube = math.ceil(tm / cm) * math.ceil(tn / cn) * math.ceil(tk / ck)
            gm = (a + tn) * tk * ib / bw_core + 2 * DMA_SETUP / depth
            l0 = tm * tk * ib / L1_TO_L0A + tk * tn * ib / L1_TO_L0B
            terms["cube"] += count * cube
            terms["gm"] += count * gm
            terms["l0"] += count * l0
            terms["loop"] += count * (max(cube, gm, l0) if db else cube + gm + l0)
            first = min(count, depth - filled)
            terms["fill"] += first * min(gm, max(l0, cube)) + (min(l0, cube) if not filled else 0)
            filled += first
        terms["writeback"] = tm * tn * (ab / L0C_OUT + ob / bw_core + dequant)
        terms["time"] = TILE_SETUP + (max(terms["loop"], terms["writeback"]) if db
                                      else terms["loop"] + terms["writeback"])
        terms["fill"] += min(terms["loop"], terms["writeback"])
        return terms

    m_tail, n_tail = shape.m - (mt - 1) * bm, shape.n - (nt - 1) * bn
    kinds = []  # (count, terms) of full and tail tiles
    for tm, m_count in ((bm, mt - 1), (m_tail, 1)):
        for tn, n_count in ((bn, nt - 1), (n_tail, 1)):
            if m_count * n_count:
                kinds.append((shape.batch * m_count * n_count, tile(tm, tn)))
    kinds.sort(key=lambda kind: -kind[1]["time"])
    busiest = -(-tiles // active)
    totals = {"cube": 0.0, "gm": 0.0, "l0": 0.0, "writeback": 0.0, "time": 0.0}
    left = busiest
    for count, terms in kinds:
        take = min(left, count)
        for key in totals:
            totals[key] += take * terms[key]
        left -= take
    # Charged for the most expensive tile kind, so a tail tile never shortens the drain.
    fill = kinds[0][1]["fill"] if db else 0.0
    cycles = totals["time"] + fill
    movement = totals["gm"] + totals["writeback"]
    bound = ("memory" if movement >= max(totals["cube"], totals["l0"])
             else "compute" if totals["cube"] >= totals["l0"] else "on-chip")
    seconds = cycles / device.clock_hz + device.launch_overhead_s
    breakdown = {
        "shape": shape, "tiling": tiling, "tiles": tiles, "k_steps": kt, "active_cores": active,
        "tiles_on_busiest_core": busiest, "cube_cycles": totals["cube"],
        "gm_to_l1_cycles": totals["gm"], "l1_to_l0_cycles": totals["l0"],
        "writeback_cycles": totals["writeback"], "setup_cycles": busiest * TILE_SETUP,
        "fill_cycles": fill, "launch_s": device.launch_overhead_s, "bound": bound,
        "utilization": shape.macs / (cm * ck * cn) / max(cycles, 1.0) / (device.ai_cores or 1),
    }
    return Estimate(cycles, seconds, breakdown)


def no_work_estimate(shape: GemmShape, device: Device) -> Estimate:
    """A cube op with a zero-size dim: no MACs and no tiles, only its launch and, when K alone
    is 0, the zeros it writes (an estimate, like the rest)."""
    written = shape.batch * shape.m * shape.n * out_bytes(shape)
    memory = written / device.memory_bandwidth if device.memory_bandwidth else 0.0
    breakdown = {"shape": shape, "tiles": 0, "memory_s": memory,
                 "launch_s": device.launch_overhead_s, "bound": "none",
                 "note": "no work: a zero-size dim"}
    return Estimate(memory * device.clock_hz, memory + device.launch_overhead_s, breakdown)


def best_tiling(shape: GemmShape, device: Device, space=None) -> tuple[Tiling, Estimate]:
    """The fastest tiling of `space` (default: the whole tiling_space) by exhaustive search."""
    from graphopt.tuner.tiling import tiling_space
    best = None
    for tiling in space if space is not None else tiling_space(shape, device):
        result = estimate(shape, tiling, device)
        if best is None or result.cycles < best[1].cycles:
            best = (tiling, result)
    if best is None:
        raise ValueError(f"no feasible tiling for {shape} on {device.name}")
    return best


# The rest of the model's public API lives in its own files and is re-exported here, after
# Estimate and estimate exist, since those files build on them.
from graphopt.tuner.vector import group_estimate, transfer_estimate, vector_estimate  # noqa: E402
from graphopt.tuner.model import model_estimate  # noqa: E402

__all__ = ["Estimate", "best_tiling", "estimate", "group_estimate", "model_estimate",
           "transfer_estimate", "vector_estimate"]
