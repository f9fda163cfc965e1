"""Plain-text tables for terminal summaries (right-aligned numbers, left-aligned text)."""

from __future__ import annotations

import re
import shutil
import sys
import unicodedata

from graphopt.errors import one_line


MIN_WRAPPED = 24  # the narrowest last column worth wrapping into; below it lines stay long


def format_table(headers: list[str], rows: list[list], title: str | None = None,
                 width: int | None = None) -> str:
    """The table as text. `width` (default: the terminal's, when standard output is one)
    wraps a last text column that would run past it onto lines of its own, indented to the
    column; piped output keeps one line per row, for grep and scripts."""
    # A cell may hold a name read from a model (any byte): a newline or an escape sequence
    # would break the table or act on the terminal, so control characters are shown escaped.
    cells = [[one_line(str(h)) for h in headers]] + \
        [["" if c is None else one_line(str(c)) for c in row] for row in rows]
    widths = [max(display_width(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(r[i]) for r in cells[1:] if r[i]) for i in range(len(headers))]
    width = terminal_width() if width is None else width
    indent = sum(widths[:-1]) + 2 * (len(widths) - 1)
    room = (width - indent) if width else 0
    wrap = bool(width) and not numeric[-1] and widths[-1] > room >= MIN_WRAPPED
    if wrap:
        widths[-1] = room

    def line(row: list[str]) -> str:
        if not wrap:
            parts = [_padded(c, w, num) for c, w, num in zip(row, widths, numeric)]
            return "  ".join(parts).rstrip()
        head, *rest = _wrapped(row[-1], room)
        parts = [_padded(c, w, num) for c, w, num in zip(row[:-1], widths, numeric)]
        return "\n".join(["  ".join(parts + [head]).rstrip()]
                         + [" " * indent + piece for piece in rest])

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


def terminal_width() -> int | None:
    """The terminal's columns when standard output is one (COLUMNS overrides), else None."""
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):  # replaced or closed stdout
        return None
    return shutil.get_terminal_size().columns


def _wrapped(text: str, room: int) -> list[str]:
    """`text` in lines of at most `room` columns, broken at spaces (a longer word alone)."""
    lines, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and display_width(candidate) > room:
            lines.append(current)
            current = word
        else:
            current = candidate
    return lines + [current]


def display_width(text: str) -> int:
    """The columns `text` takes on a terminal: two for each wide (CJK, most emoji) character,
    none for combining marks, which draw over the character before them."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _padded(text: str, width: int, right: bool) -> str:
    pad = " " * (width - display_width(text))
    return pad + text if right else text + pad


# A number with a unit after it ("980.0 KiB", "12.5 ms", "1.38×"): aligned as a number.
_UNITS = re.compile(r"\s?(B|KiB|MiB|GiB|TiB|ns|µs|us|ms|s|%|×)")


def _is_number(text: str) -> bool:
    text = text.replace(",", "").lstrip("+")
    unit = _UNITS.search(text)
    if unit is not None and unit.end() == len(text) and unit.start() > 0:
        text = text[:unit.start()]
    try:
        float(text)
        return True
    except ValueError:
        return False


def format_bytes(size: int) -> str:
    """`512 B`, `980.0 KiB`, `1.8 MiB`, `2.10 GiB`."""
    if size < 1024:
        return f"{size} B"
    if size < 1 << 20:
        return f"{size / 1024:.1f} KiB"
    if size < 1 << 30:
        return f"{size / (1 << 20):.1f} MiB"
    return f"{size / (1 << 30):.2f} GiB"
