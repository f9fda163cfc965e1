"""Plain-text tables for terminal summaries (right-aligned numbers, left-aligned text)."""

from __future__ import annotations

import re
import unicodedata

from graphopt.errors import one_line


def format_table(headers: list[str], rows: list[list], title: str | None = None) -> str:
    # A cell may hold a name read from a model (any byte): a newline or an escape sequence
    # would break the table or act on the terminal, so control characters are shown escaped.
    cells = [[one_line(str(h)) for h in headers]] + \
        [["" if c is None else one_line(str(c)) for c in row] for row in rows]
    widths = [max(display_width(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(r[i]) for r in cells[1:] if r[i]) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [_padded(c, w, num) for c, w, num in zip(row, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


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
