"""`draw_plan`: a plan as rectangles over time (x) × address (y), to PNG or SVG, no dependencies.

The PNG writer is the smallest that works: 8-bit RGB rows, zlib, three chunks; its canvas also
draws text in a built-in 5×8 pixel font (the labels of `graphopt tune --plot`). The dashed red
line is the lower bound; the arena's top is the plot's top. SVG output labels each buffer and
gives every rectangle a tooltip (name, bytes, offset, steps).
"""

from __future__ import annotations

import colorsys
import struct
import zlib

from graphopt.markup import escape
from graphopt.passes.memory.plan import Plan
from graphopt.table import format_bytes

_MARGIN = 24

# The glyphs of the text in graphopt's PNG plots: 8 rows top to bottom as hex bytes, the 5 low
# bits of each a row with the high bit leftmost; row 6 is the baseline, row 7 holds
# descenders. A character without a glyph draws as '?'.
_FONT = {
    "0": "0e11131519110e00", "1": "040c040404040e00", "2": "0e11010204081f00",
    "3": "1f02040201110e00", "4": "02060a121f020200", "5": "1f101e0101110e00",
    "6": "0608101e11110e00", "7": "1f01020408080800", "8": "0e11110e11110e00",
    "9": "0e11110f01020c00", "a": "00000e010f110f00", "b": "10101e1111111e00",
    "c": "00000e1010110e00", "d": "01010f1111110f00", "e": "00000e111f100e00",
    "f": "0609081c08080800", "g": "00000f11110f010e", "h": "1010161911111100",
    "i": "04000c0404040e00", "j": "020006020202120c", "k": "1010121418141200",
    "l": "0c04040404040e00", "m": "00001a1515151500", "n": "0000161911111100",
    "o": "00000e1111110e00", "p": "00001e11111e1010", "q": "00000f11110f0101",
    "r": "0000161910101000", "s": "00000f100e011e00", "t": "08081c0808090600",
    "u": "0000111111130d00", "v": "00001111110a0400", "w": "0000111115150a00",
    "x": "0000110a040a1100", "y": "00001111110f010e", "z": "00001f0204081f00",
    "µ": "00001111111b1510", "A": "0e11111f11111100", "B": "1e11111e11111e00",
    "C": "0e11101010110e00", "D": "1e11111111111e00", "E": "1f10101e10101f00",
    "F": "1f10101e10101000", "G": "0e11101711110f00", "H": "1111111f11111100",
    "I": "0e04040404040e00", "J": "0702020202120c00", "K": "1112141814121100",
    "L": "1010101010101f00", "M": "111b151511111100", "N": "1111191513111100",
    "O": "0e11111111110e00", "P": "1e11111e10101000", "Q": "0e11111115120d00",
    "R": "1e11111e14121100", "S": "0f10100e01011e00", "T": "1f04040404040400",
    "U": "1111111111110e00", "V": "11111111110a0400", "W": "1111111515150a00",
    "X": "11110a040a111100", "Y": "11110a0404040400", "Z": "1f01020408101f00",
    " ": "0000000000000000", "!": "0404040404000400", "%": "1819020408130300",
    "'": "0404080000000000", "(": "0204080808040200", ")": "0804020202040800",
    "*": "00150e1f0e150000", "+": "0004041f04040000", ",": "000000000c040800",
    "-": "0000000e00000000", ".": "00000000000c0c00", "/": "0101020408101000",
    ":": "000c0c000c0c0000", ";": "000c0c000c040800", "<": "0204081008040200",
    "=": "00001f001f000000", ">": "0804020102040800", "?": "0e11010204000400",
    "[": "0e08080808080e00", "]": "0e02020202020e00", "_": "000000000000001f",
    "|": "0404040404040400", "×": "00110a040a110000", "…": "0000000000001500",
    "→": "0004021f02040000", "↑": "040e150404040400",
}
GLYPH_W = 6  # a glyph's advance in pixels, the gap to the next one included


def _colour(i: int) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb((i * 0.618033988749895) % 1.0, 0.55, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def _boxes(plan: Plan, width: int, height: int) -> list[tuple[int, int, int, int, int]]:
    """(x0, y0, x1, y1, buffer index) in pixels, y growing down, each at least 1 px."""
    steps = max(plan.steps, 1)
    top = max(plan.arena_bytes, 1)
    pw, ph = width - 2 * _MARGIN, height - 2 * _MARGIN
    boxes = []
    for i, b in enumerate(plan.buffers):
        offset = plan.offsets.get(b.id, 0)
        x0 = _MARGIN + b.first * pw // steps
        x1 = max(x0 + 1, _MARGIN + (b.last + 1) * pw // steps)
        y1 = height - _MARGIN - offset * ph // top
        y0 = min(y1 - 1, height - _MARGIN - (offset + b.size) * ph // top)
        boxes.append((x0, y0, x1, y1, i))
    return boxes


def _bound_y(plan: Plan, height: int) -> int:
    return height - _MARGIN - plan.lower_bound * (height - 2 * _MARGIN) // max(plan.arena_bytes, 1)


class _Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def fill(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        x0, x1 = max(0, x0), min(self.width, x1)
        colour = bytes(rgb) * max(0, x1 - x0)
        for y in range(max(0, y0), min(self.height, y1)):
            start = (y * self.width + x0) * 3
            self.pixels[start:start + len(colour)] = colour

    def text(self, x: int, y: int, text: str, rgb: tuple[int, int, int]) -> None:
        """`text` in the 5×8 font with its top-left corner at (x, y)."""
        for k, char in enumerate(text):
            left = x + k * GLYPH_W
            for r, bits in enumerate(bytes.fromhex(_FONT.get(char, _FONT["?"]))):
                for c in range(5):
                    if bits & (0x10 >> c):
                        self.fill(left + c, y + r, left + c + 1, y + r + 1, rgb)

    def png(self) -> bytes:
        row = self.width * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[y * row:(y + 1) * row])
                       for y in range(self.height))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + tag + data
                    + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def draw_plan(plan: Plan, path: str, *, width: int = 960, height: int = 540,
              title: str = "") -> None:
    """Write the plan as a picture: SVG when `path` ends in .svg, else PNG. `title` (the
    partition, and its shape profile) heads it."""
    from graphopt.atomic import atomic_write_bytes

    draw = _svg if path.lower().endswith(".svg") else _png
    atomic_write_bytes(path, draw(plan, width, height, title))


def _png(plan: Plan, width: int, height: int, title: str = "") -> bytes:
    canvas = _Canvas(width, height)
    for x0, y0, x1, y1, i in _boxes(plan, width, height):
        rgb = _colour(i)
        canvas.fill(x0, y0, x1, y1, tuple(c * 3 // 5 for c in rgb))  # border
        canvas.fill(x0 + 1, y0 + 1, x1 - 1, y1 - 1, rgb)
    y = _bound_y(plan, height)
    for x in range(_MARGIN, width - _MARGIN, 8):
        canvas.fill(x, y, x + 4, y + 1, (220, 30, 30))
    canvas.fill(_MARGIN - 1, _MARGIN, _MARGIN, height - _MARGIN + 1, (0, 0, 0))     # address axis
    canvas.fill(_MARGIN - 1, height - _MARGIN, width - _MARGIN, height - _MARGIN + 1, (0, 0, 0))
    black = (0, 0, 0)
    for text, x, y in _captions(plan, width, height, title):
        canvas.text(x, y - 8, text, black)  # the SVG's baseline is the glyphs' bottom row
    return canvas.png()


def _captions(plan: Plan, width: int, height: int,
              title: str = "") -> list[tuple[str, int, int]]:
    """(text, x, baseline y) of the axis and header lines both pictures carry: the address
    axis spans the work memory, from 0 at the bottom to the arena's size at the top."""
    head = (f"work memory {format_bytes(plan.arena_bytes)} ({plan.arena_bytes:,} B), "
            f"{plan.strategy}; lower bound (dashed) {format_bytes(plan.lower_bound)}")
    return [(f"step →  (0 to {max(plan.steps - 1, 0)})", _MARGIN, height - 8),
            ((f"{title}: " if title else "") + head, 4, _MARGIN - 12),
            (f"address ↑ (0 to {format_bytes(plan.arena_bytes)})", 4, _MARGIN - 2)]


def _svg(plan: Plan, width: int, height: int, title: str = "") -> bytes:
    names: dict[int, list[str]] = {}
    for t in plan.tensors.values():
        names.setdefault(t.buffer, []).append(t.name)
    # The viewBox lets a page shrink the picture to fit, not crop it.
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="10">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    for x0, y0, x1, y1, i in _boxes(plan, width, height):
        b = plan.buffers[i]
        label = ", ".join(names.get(b.id, [b.label]))
        fill = _colour(i)
        edge = tuple(c * 3 // 5 for c in fill)
        tip = (f"{label}: {b.nbytes:,} B at {plan.offsets.get(b.id, 0):,}, "
               f"steps {b.first}-{b.last}")
        parts.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" '
                     f'fill="rgb{fill}" stroke="rgb{edge}"><title>{escape(tip)}</title></rect>')
        if x1 - x0 > 6 * len(label) and y1 - y0 > 12:
            parts.append(f'<text x="{x0 + 2}" y="{y0 + 11}">{escape(label)}</text>')
    y = _bound_y(plan, height)
    parts.append(f'<line x1="{_MARGIN}" y1="{y}" x2="{width - _MARGIN}" y2="{y}" stroke="red" '
                 f'stroke-dasharray="4 4"><title>lower bound {plan.lower_bound:,} B</title></line>')
    bottom = height - _MARGIN
    axes = f"{_MARGIN},{_MARGIN} {_MARGIN},{bottom} {width - _MARGIN},{bottom}"
    parts.append(f'<polyline points="{axes}" fill="none" stroke="black"/>')
    for text, x, y in _captions(plan, width, height, title):
        parts.append(f'<text x="{x}" y="{y}">{escape(text)}</text>')
    parts.append("</svg>")
    return "\n".join(parts).encode()
