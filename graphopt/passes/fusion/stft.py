r"""LowerSTFT: a short-time Fourier transform as one strided Conv with a windowed DFT basis.

    STFT(x [B, L, 1], step, window [N])[b, f, k] = Σₙ x[b, f·step + n] · w[n] · e^(−2πi·k·n/N)
      →  Transpose(Reshape(Conv(Reshape(x, [B, 1, L]), W, strides=[step]), [B, 2, K, F]),
                   [0, 3, 2, 1])
         W [2K, 1, N]: rows w[n]·cos(2πkn/N), then −w[n]·sin(2πkn/N), k < K = N/2 + 1

The frames are the conv's windows (no padding: F = ⌊(L − N) / step⌋ + 1, as STFT counts them),
the real and imaginary parts its output channels. onnxruntime's CPU STFT sums a frame length
that is not a power of two as a plain DFT, one scalar loop per bin: a keyword spotter's log-mel
front end (N = 400, a 25 ms frame at 16 kHz) took 85% of its run there, and the conv runs that
STFT 9× faster (bench/stft.py). For a power of two it runs a radix-2 FFT, which the conv beats
up to N = 512 and loses to from 1024 on, so those stay; so do frames past 1024 samples, whose
basis (4·N·(N + 2) bytes) few frames do not pay back. The conv's sums are the exact DFT's to
float32 rounding; onnxruntime's plain DFT is off by up to 4e-5 of the largest bin at N = 400 and
1e-4 at 1000 (its twiddles drift), so outputs move by that much against onnxruntime, more than
-O2 allows: -O3 only.
Real signals (a last dim of 1, or none, as torch.stft exports them) with `onesided` 1 and a
constant frame step and window (or frame length) only; float32, as onnxruntime's Conv.
"""

from __future__ import annotations

import numpy as np

from graphopt.ir import DType, Value
from graphopt.ir.pattern import Attr, Optional, Var
from graphopt.option_names import from_command_line, option
from graphopt.passes.base import register
from graphopt.passes.fusion.lowering import FloatOnlyLowering, OnTheCpu

# The largest power-of-two frame length for which the conv beats onnxruntime's FFT.
FFT_FRAME_LIMIT = 512
# The largest other frame length lowered: the basis is 4·N·(N + 2) bytes (4 MB at 1024), read
# whole on every run, which a few frames do not pay back (1.0x at one frame of 1000 samples;
# a frame of 4095 with 7 frames ran 1.7x slower from a basis of 67 MB).
DFT_FRAME_LIMIT = 1024


def _scalar(value: Value | None) -> int | None:
    data = value.constant() if value is not None else None
    return int(data.reshape(-1)[0]) if data is not None and data.size == 1 else None


def _window(window: Value | None, length: Value | None) -> np.ndarray | str:
    """The window as float64 [N], or why it is not a constant."""
    if window is not None:
        data = window.constant()
        if data is None or data.ndim != 1:
            return f"the window %{window.name} is not a constant vector"
        given = _scalar(length)
        if length is not None and given != data.size:
            return f"the frame length {given} is not the window's {data.size}"
        return data.astype(np.float64)
    size = _scalar(length)
    if size is None:
        return "neither a constant window nor a constant frame length"
    return np.ones(size)


def dft_basis(window: np.ndarray) -> np.ndarray:
    """W [2K, 1, N] for a one-sided DFT of N = len(window) windowed samples, K = N/2 + 1:
    the real parts' rows, then the imaginary parts'."""
    size = window.size
    n = np.arange(size)
    k = np.arange(size // 2 + 1)[:, None]
    angle = 2 * np.pi * ((k * n) % size) / size  # reduced first: k·n reaches N²/2
    basis = np.concatenate([np.cos(angle) * window, -np.sin(angle) * window])
    return basis.astype(np.float32)[:, None, :]


class STFTAsConv(OnTheCpu):
    """STFT with a constant step and window → Conv with the windowed DFT basis."""

    dtypes = (DType.FLOAT,)
    emits = (("", "Reshape"), ("", "Conv"), ("", "Transpose"))

    def pattern(self, op, x, step):
        return op.STFT(x, step, Optional(Var("window")), Optional(Var("length")),
                       onesided=Attr("onesided", 1))

    def check(self, x, step, onesided, window=None, length=None, **_):
        return _refusal(x, step, onesided, window, length)

    def rewrite(self, op, x, step, window=None, length=None, **_):
        basis = dft_basis(_window(window, length))
        bins = basis.shape[0] // 2
        signal = op.Reshape(x, op.const(np.array([0, 1, -1], np.int64), "stft_signal_shape"))
        parts = op.Conv(signal, op.const(basis, f"{x.name}_dft_basis"), strides=[_scalar(step)])
        split = op.Reshape(parts, op.const(np.array([0, 2, bins, -1], np.int64),
                                           "stft_parts_shape"))
        return op.Transpose(split, perm=[0, 3, 2, 1])


def _refusal(x: Value, step: Value, onesided, window: Value | None,
             length: Value | None) -> str | None:
    """Why STFTAsConv keeps an STFT (None: it lowers it)."""
    # onnxruntime also takes a real signal without its last dim, as torch.stft exports it.
    if x.shape is None or not (len(x.shape) == 3 and x.shape[2] == 1 or len(x.shape) == 2):
        return "the signal is not known to be real, [batch, length, 1] or [batch, length]"
    if onesided != 1:
        return "a two-sided spectrum (onesided=0)"
    if _scalar(step) is None or _scalar(step) < 1:
        return "the frame step is not a positive constant"
    taps = _window(window, length)
    if isinstance(taps, str):
        return taps
    size = taps.size
    if size < 2:
        return f"a frame of {size} sample(s)"
    if size & (size - 1) == 0 and size > FFT_FRAME_LIMIT:
        return f"a frame of {size} samples, a power of two past {FFT_FRAME_LIMIT}, which " \
               "onnxruntime's FFT transforms faster than the conv"
    if size > DFT_FRAME_LIMIT:
        return f"a frame of {size} samples: the conv's basis would take " \
               f"{4 * size * (size + 2) / 2 ** 20:.0f} MiB, read whole on every run"
    if isinstance(x.shape[1], int) and x.shape[1] < size:
        return f"a signal of {x.shape[1]} samples, shorter than a frame"
    return None


def lowerable_frames(model) -> list[int]:
    """The frame lengths of the STFTs -O3 lowers, for the note an -O2 compile gives: those
    onnxruntime runs as a plain DFT, and the short FFTs (up to 512 samples) the conv beats too
    (a NeMo log-mel front end of 512-sample frames ran 0.62x the original's time at -O3)."""
    found = []
    for node in model.graph.all_nodes():
        if node.op_type != "STFT" or not node.is_onnx or node.outputs[0].dtype != DType.FLOAT:
            continue
        window, length = node.input(2), node.input(3)
        if not _refusal(node.inputs[0], node.inputs[1], node.attr("onesided", 1), window,
                        length):
            found.append(_window(window, length).size)
    return found


def tolerance_hint(rewrites: int) -> str:
    """What a failed elementwise comparison of a compile with `rewrites` lowered STFTs says."""
    if from_command_line():
        level, disable = "-O3", "--disable-pass LowerSTFT"
    else:
        level, disable = "level=3", "disable_passes=['LowerSTFT']"
    return (f"{level} lowered {rewrites} STFT(s) to a Conv, which is closer to the exact "
            "transform than onnxruntime's plain DFT (off by up to ~1e-4 of the largest bin for "
            "a frame length that is not a power of two, 4e-5 at 400 samples); pass a looser "
            f"{option('atol')}, or compile with {disable}")


@register
class LowerSTFT(FloatOnlyLowering):
    name = "LowerSTFT"
    description = ("STFT as a strided Conv with the windowed DFT basis: onnxruntime's CPU STFT "
                   "runs frame lengths other than powers of two as a plain DFT, ~9x slower")
    rules = (STFTAsConv,)


__all__ = ["LowerSTFT", "dft_basis"]
