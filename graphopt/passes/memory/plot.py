"""`draw_plan`: a plan as rectangles over time (x) × address (y), to PNG or SVG, no dependencies.

The PNG writer is the smallest that works: 8-bit RGB rows, zlib, three chunks. The dashed red
line is the lower bound; the arena's top is the plot's top. SVG output labels each buffer and
gives every rectangle a tooltip (name, bytes, offset, steps).
"""

from __future__ import annotations

import colorsys
import struct
import zlib
from html import escape

from graphopt.passes.memory.plan import Plan

_MARGIN = 24


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


def draw_plan(plan: Plan, path: str, *, width: int = 960, height: int = 540) -> None:
    """Write the plan as a picture: SVG when `path` ends in .svg, else PNG."""
    data = _svg(plan, width, height) if path.lower().endswith(".svg") else _png(plan, width, height)
    with open(path, "wb") as f:
        f.write(data)


def _png(plan: Plan, width: int, height: int) -> bytes:
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
    return canvas.png()


def _svg(plan: Plan, width: int, height: int) -> bytes:
    names: dict[int, list[str]] = {}
    for t in plan.tensors.values():
        names.setdefault(t.buffer, []).append(t.name)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="10">',
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
    parts.append(f'<text x="{_MARGIN}" y="{height - 8}">step →  ({plan.steps} steps)</text>')
    parts.append(f'<text x="4" y="{_MARGIN - 8}">{plan.arena_bytes:,} B ({plan.strategy}; '
                 f'lower bound {plan.lower_bound:,} B)</text>')
    parts.append("</svg>")
    return "\n".join(parts).encode()
