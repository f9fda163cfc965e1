"""Tuning history pictures: best cost so far over the default per trial, as SVG or PNG."""

from __future__ import annotations

from dataclasses import dataclass, field

Series = list[tuple[str, list[float], float]]  # (name, best seconds so far per trial, default)
# Legend lines under the plot, one per style a curve can have (ten hues, solid, dashed and
# dotted); more series end in "… and N more", their curves repeating styles.
_LEGEND_ROWS = 30
_GREY, _GRID, _BLACK = (120, 120, 120), (225, 225, 225), (0, 0, 0)
# Ten hues told apart at a glance (Tableau's); the next ten series repeat them dashed, the ten
# after dotted (a ResNet-50 has 21 kernel signatures).
_PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
            (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))
_DASHES = (None, (6, 4), (2, 3))  # (pixels drawn, pixels left out) along a curve


def _dash(k: int) -> tuple[int, int] | None:
    """The dash pattern of the k-th series (None: solid)."""
    return _DASHES[k // len(_PALETTE) % len(_DASHES)]


@dataclass
class _Figure:
    """A plot as primitives both writers draw: axis-parallel lines (x0, y0, x1, y1, rgb,
    dashed), boxes (x0, y0, x1, y1, rgb), texts (x, top y, text, rgb, anchor start|middle|end)
    and step curves (name, points, rgb, dash pattern or None)."""

    width: int
    height: int
    lines: list = field(default_factory=list)
    boxes: list = field(default_factory=list)
    texts: list = field(default_factory=list)
    curves: list = field(default_factory=list)


def _duration(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def _nice_step(span: float, most: int, steps: tuple) -> float:
    """The first of `steps` that cuts `span` into at most `most` parts."""
    return next((step for step in steps if span / step <= most), steps[-1])


def _history_figure(series: Series, width: int, height: int, kind: str | None) -> _Figure:
    """Best-so-far cost / default cost (capped at 1.0) vs trial number (from 1, as the
    progress counts them) in a width × height plot, one step curve per series ending in a
    square, with the legend's rows below it."""
    points = [[(i, min(v / default, 1.0) if default > 0 else 1.0)
               for i, v in enumerate(hist) if v != float("inf")]
              for _, hist, default in series]
    n = max((len(hist) for _, hist, _ in series), default=1)
    low = min(min((v for curve in points for _, v in curve), default=0.5), 0.95) - 0.02
    y_step = _nice_step(1.0 - low, 5, (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0))
    low = 1.0 - -(-(1.0 - low) // y_step) * y_step          # the bottom is a tick
    x_step = int(_nice_step(n, 8, tuple(m * 10 ** e for e in range(7) for m in (1, 2, 5))))
    from graphopt.passes.memory.plot import GLYPH_W  # the PNG's font; SVG text is as wide

    # As wide as the longest legend line needs: a subgraph study's name and ratio ran past
    # the edge of a 720-pixel picture and were cut.
    width = max(width, 52 + 22 + GLYPH_W * max(map(len, _legend_texts(series)), default=0) + 8)
    left, right, top, bottom = 52, width - 16, 36, height - 36
    rows = min(len(series), _LEGEND_ROWS) + (len(series) > _LEGEND_ROWS)
    fig = _Figure(width, height + 12 * rows + 4)  # the last legend row clear of the edge

    def x(i: int) -> int:  # trial i + 1; the last one short of the frame, so a gain there shows
        return left + i * (right - left) // n

    def y(v: float) -> int:
        return top + round((1.0 - v) / (1.0 - low) * (bottom - top))

    what = f"best {kind} cost" if kind else "best cost"
    fig.texts += [(left, 6, f"{what} so far / default cost, per trial (lower is better)",
                   _BLACK, "start"),
                  (4, 22, "cost / default", _BLACK, "start"),
                  (right, top - 11, "default", _GREY, "end"),
                  ((left + right) // 2, bottom + 19, "trial", _BLACK, "middle")]
    for k in range(round((1.0 - low) / y_step) + 1):
        v = 1.0 - k * y_step
        fig.lines.append((left, y(v), right, y(v), _GRID, False))
        fig.texts.append((left - 4, y(v) - 4, f"{v:.2f}", _BLACK, "end"))
    # Every x_step trials, evenly; at a step of 5 or more trial 1 too, but not a tick so close
    # to it that the labels crowd (at a step of 2, 1 then 4, 6, 8 read as uneven).
    ticks = list(range(x_step, n + 1, x_step))
    if x_step >= 5 or not ticks:
        ticks = [1] + [t for t in ticks if t - 1 >= x_step / 2 + 0.5]
    for trial in ticks:
        fig.lines.append((x(trial - 1), bottom, x(trial - 1), bottom + 3, _BLACK, False))
        fig.texts.append((x(trial - 1), bottom + 6, str(trial), _BLACK, "middle"))
    fig.lines += [(left, top, right, top, _GREY, True),          # the default: 1.0
                  (left, top, left, bottom, _BLACK, False),
                  (left, bottom, right, bottom, _BLACK, False)]
    colours = [_PALETTE[k % len(_PALETTE)] for k in range(len(series))]
    for k, ((name, _, _), curve, rgb) in enumerate(zip(series, points, colours)):
        corners = [(x(i), y(v)) for i, v in _corners(curve)]
        fig.curves.append((name, corners, rgb, _dash(k)))
        if corners:  # where it ends: two curves that meet stay apart there
            end_x, end_y = corners[-1]
            fig.boxes.append((end_x - 2, end_y - 2, end_x + 3, end_y + 3, rgb))
    _add_legend(fig, series, colours, left, height)
    return fig


def _legend_texts(series: Series) -> list[str]:
    """The legend's row of each series it shows: its name, default and best cost."""
    texts = []
    for name, hist, default in series[:_LEGEND_ROWS]:
        best = min((v for v in hist if v != float("inf")), default=default)
        texts.append(f"{name}: default {_duration(default)}, best {_duration(best)} "
                     f"({default / best if best > 0 else 1.0:.3f}x)")
    return texts


def _add_legend(fig: _Figure, series: Series, colours: list, left: int, top: int) -> None:
    """One row per series from `top` down: its colour, name, default and best cost."""
    for k, (text, rgb) in enumerate(zip(_legend_texts(series), colours)):
        row = top + 12 * k
        drawn, gap = _dash(k) or (16, 0)  # a dashed or dotted curve's swatch is too
        fig.boxes += [(left + s, row + 3, left + min(s + drawn, 16), row + 6, rgb)
                      for s in range(0, 16, drawn + gap)]
        fig.texts.append((left + 22, row, text, _BLACK, "start"))
    if len(series) > _LEGEND_ROWS:
        fig.texts.append((left + 22, top + 12 * _LEGEND_ROWS,
                          f"… and {len(series) - _LEGEND_ROWS} more", _BLACK, "start"))


def _corners(curve: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A best-so-far curve as the corners of its steps: flat to each trial that lowers it,
    then down, then flat to the last trial."""
    out = curve[:1]
    for i, v in curve[1:]:
        if v != out[-1][1]:
            out += [(i, out[-1][1]), (i, v)]
    if curve and curve[-1][0] != out[-1][0]:
        out.append((curve[-1][0], out[-1][1]))
    return out


def histories_svg(series: Series, *, width: int = 720, height: int = 360,
                  kind: str | None = None) -> str:
    """Best-so-far cost / default cost vs trial as SVG text, one line per (name, history,
    default seconds), with ticks, axis labels and a legend; `kind` ("estimated", "measured")
    goes into the title."""
    from graphopt.markup import escape

    fig = _history_figure(series, width, height, kind)
    # The viewBox lets a page shrink the picture to fit, not crop it.
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{fig.width}" '
              f'height="{fig.height}" viewBox="0 0 {fig.width} {fig.height}" '
              'font-family="sans-serif" font-size="10">'),
             f'<rect width="{fig.width}" height="{fig.height}" fill="white"/>']
    for x0, y0, x1, y1, rgb, dashed in fig.lines:
        dash = ' stroke-dasharray="4 4"' if dashed else ""
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y1}" stroke="rgb{rgb}"{dash}/>')
    for x0, y0, x1, y1, rgb in fig.boxes:
        parts.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" '
                     f'fill="rgb{rgb}"/>')
    for name, points, rgb, pattern in fig.curves:
        text = " ".join(f"{px},{py}" for px, py in points)
        dash = f' stroke-dasharray="{pattern[0]} {pattern[1]}"' if pattern else ""
        parts.append(f'<polyline points="{text}" fill="none" stroke="rgb{rgb}" '
                     f'stroke-width="2"{dash}><title>{escape(name)}</title></polyline>')
    for px, py, text, rgb, anchor in fig.texts:
        parts.append(f'<text x="{px}" y="{py + 8}" text-anchor="{anchor}" fill="rgb{rgb}">'
                     f"{escape(text)}</text>")
    parts.append("</svg>")
    return "\n".join(parts)


def histories_png(series: Series, *, width: int = 720, height: int = 360,
                  kind: str | None = None) -> bytes:
    """histories_svg's picture as PNG, its text in passes.memory.plot's pixel font."""
    from graphopt.passes.memory.plot import GLYPH_W, _Canvas

    fig = _history_figure(series, width, height, kind)
    canvas = _Canvas(fig.width, fig.height)
    for x0, y0, x1, y1, rgb, dashed in fig.lines:
        if dashed:  # horizontal only: the default's line
            for dx in range(x0, x1, 8):
                canvas.fill(dx, y0, min(dx + 4, x1), y0 + 1, rgb)
        else:
            canvas.fill(x0, y0, x1 + 1, y1 + 1, rgb)
    for x0, y0, x1, y1, rgb in fig.boxes:
        canvas.fill(x0, y0, x1, y1, rgb)
    for _, points, rgb, pattern in fig.curves:
        for (x0, y0), (x1, y1) in zip(points, points[1:]):  # each piece is flat or upright
            _segment(canvas, min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1), rgb, pattern)
    for px, py, text, rgb, anchor in fig.texts:
        span = len(text) * GLYPH_W - 1
        shift = {"start": 0, "middle": span // 2, "end": span}[anchor]
        canvas.text(px - shift, py, text, rgb)
    return canvas.png()


def _segment(canvas, x0: int, y0: int, x1: int, y1: int, rgb,
             pattern: tuple[int, int] | None) -> None:
    """A flat or upright piece of a curve, 2 px wide; with a pattern, (drawn, left out) px."""
    if not pattern:
        canvas.fill(x0 - 1, y0 - 1, x1 + 1, y1 + 1, rgb)
        return
    drawn, gap = pattern
    flat = y0 == y1
    for start in range(x0 if flat else y0, (x1 if flat else y1) + 1, drawn + gap):
        if flat:
            canvas.fill(start - 1, y0 - 1, min(start + drawn, x1 + 1), y0 + 1, rgb)
        else:
            canvas.fill(x0 - 1, start - 1, x0 + 1, min(start + drawn, y1 + 1), rgb)


def draw_histories(series: Series, path: str, *, width: int = 720, height: int = 360,
                   kind: str | None = None) -> None:
    """Best-so-far cost / default cost vs trial, one line per (name, history, default seconds):
    SVG when `path` ends in .svg, else PNG; written atomically."""
    from graphopt.atomic import atomic_write_bytes

    if path.lower().endswith(".svg"):
        data = histories_svg(series, width=width, height=height, kind=kind).encode()
    else:
        data = histories_png(series, width=width, height=height, kind=kind)
    atomic_write_bytes(path, data)
