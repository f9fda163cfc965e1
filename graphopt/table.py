"""Plain-text tables for terminal summaries (right-aligned numbers, left-aligned text)."""

from __future__ import annotations

import re
import shutil
import sys
import unicodedata
from collections.abc import Collection

from graphopt.errors import one_line


MIN_WRAPPED = 12  # the narrowest a text column is wrapped to; a table needing less stays wide


def format_table(headers: list[str], rows: list[list], title: str | None = None,
                 width: int | None = None, names: Collection[int] = ()) -> str:
    """The table as text. `width` (default: the terminal's, when standard output is one)
    wraps the widest text columns of a table that would run past it onto continuation lines
    (a row's cells side by side, line by line); piped output keeps one line per row, for grep
    and scripts. `names` are the columns of names (tensors, nodes, kernels), left-aligned as
    text even when every name is digits: older PyTorch exports name outputs `387`."""
    # A cell may hold a name read from a model (any byte): a newline or an escape sequence
    # would break the table or act on the terminal, so control characters are shown escaped.
    cells = [[_encodable(one_line(str(h))) for h in headers]] + \
        [["" if c is None else _encodable(one_line(str(c))) for c in row] for row in rows]
    widths = [max(display_width(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [i not in names and _numeric([r[i] for r in cells[1:]])
               for i in range(len(headers))]
    width = terminal_width() if width is None else width
    if width:
        prose = [any(" " in r[i] for r in cells[1:]) for i in range(len(headers))]
        widths = _fitted(widths, numeric, prose, width)

    def line(row: list[str]) -> str:
        pieces = [_wrapped(c, w) if display_width(c) > w else [c] for c, w in zip(row, widths)]
        lines = []
        for k in range(max(len(p) for p in pieces)):
            parts = [_padded(p[k] if k < len(p) else "", w, num)
                     for p, w, num in zip(pieces, widths, numeric)]
            lines.append("  ".join(parts).rstrip())
        return "\n".join(lines)

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


def _encodable(text: str) -> str:
    """`text` as standard output's encoding will write it: a character it lacks (µ under
    PYTHONIOENCODING=ascii) as the backslash escape terminal_text writes, so that the column
    is measured at the width it takes."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    if text.isascii():
        return text
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:
        return text


def _fitted(widths: list[int], numeric: list[bool], prose: list[bool],
            width: int) -> list[int]:
    """Column widths within `width`, taken from the widest text columns, none below
    MIN_WRAPPED (numbers are never wrapped); the natural widths when that cannot fit. Columns
    of `prose` (cells with spaces: lists, reasons) wrap first, and columns of single words
    (names a user copies: a pass for --disable-pass) only when those cannot make room."""
    fitted = list(widths)
    excess = sum(fitted) + 2 * (len(fitted) - 1) - width
    while excess > 0:
        wrappable = [i for i, w in enumerate(fitted) if not numeric[i] and w > MIN_WRAPPED]
        if any(prose[i] for i in wrappable):
            wrappable = [i for i in wrappable if prose[i]]
        if not wrappable:
            return widths
        widest = max(wrappable, key=lambda i: fitted[i])
        others = max((fitted[i] for i in wrappable if i != widest), default=MIN_WRAPPED)
        cut = min(excess, fitted[widest] - max(others, MIN_WRAPPED)) or 1
        fitted[widest] -= cut
        excess -= cut
    return fitted


def terminal_width() -> int | None:
    """The terminal's columns when standard output is one (COLUMNS overrides), else None."""
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):  # replaced or closed stdout
        return None
    return shutil.get_terminal_size().columns


def wrap_to_terminal(line: str, hang: str = "") -> str:
    """A line of prose broken at spaces to the terminal's width, its continuation lines
    indented as its own first line is plus `hang`; as it is when standard output is not a
    terminal (a pipe or a file keeps one line per entry, for grep)."""
    width = terminal_width()
    if width is None or display_width(line) <= width:
        return line
    lead = line[:len(line) - len(line.lstrip(" "))]
    room = max(width - len(lead) - len(hang), 20)
    first, *rest = _wrapped(line.strip(" "), room)
    return "\n".join([lead + first] + [lead + hang + part for part in rest])


def _wrapped(text: str, room: int) -> list[str]:
    """`text` in lines of at most `room` columns, broken at spaces; a longer word is cut."""
    lines, current = [], ""
    for word in text.split(" "):
        while display_width(word) > room:  # a name without spaces: cut it where it must be
            if current:
                lines.append(current)
                current = ""
            # After a separator where one falls in the line: a kernel signature's parts
            # (ascend310/conv/ | b1_m1024_k27_n16/ | float16) stay whole; a part longer than
            # the line breaks between its dims (b1_m3136_ | k576_n64/), not inside a number.
            fits = _fitting(word, room)  # the characters of `word` that fit in `room` columns
            cut = max(word.rfind(mark, 0, fits) for mark in "/.:") + 1 \
                or word.rfind("_", 0, fits) + 1 or max(fits, 1)
            lines.append(word[:cut])
            word = word[cut:]
        candidate = f"{current} {word}" if current else word
        if current and display_width(candidate) > room:
            lines.append(current)
            current = word
        else:
            current = candidate
    return lines + [current]


def _fitting(text: str, room: int) -> int:
    """How many leading characters of `text` fit in `room` terminal columns."""
    used = 0
    for i, c in enumerate(text):
        used += display_width(c)
        if used > room:
            return i
    return len(text)


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
_UNITS = re.compile(r"\s?(B|KiB|MiB|GiB|TiB|PiB|EiB|ZiB|YiB|ns|µs|us|ms|s|%|×)")


# What a numeric column shows where a metric does not apply.
_PLACEHOLDERS = ("—", "-")


def _numeric(column: list[str]) -> bool:
    """Whether a column holds numbers, aligned right with its header: every cell a number,
    empty or a placeholder, and one at least a number."""
    # Stripped: a caller may have right-justified its cells already ("       —").
    values = [c.strip() for c in column if c.strip() and c.strip() not in _PLACEHOLDERS]
    return bool(values) and all(_is_number(c) for c in values)


def _is_number(text: str) -> bool:
    text = text.replace(",", "").lstrip("+<")  # "<0.1": a number too small for its digits
    unit = _UNITS.search(text)
    if unit is not None and unit.end() == len(text) and unit.start() > 0:
        text = text[:unit.start()]
    try:
        float(text)
        return True
    except ValueError:
        return False


def natural_key(text: str) -> list:
    """Sorts numbers inside names by value: `p2_cpu` before `p10_npu` (execution order),
    `m49_…` before `m3136_…`, `k256` before `k2304`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def format_bytes(size: int) -> str:
    """`512 B`, `980.0 KiB`, `1.8 MiB`, `2.10 GiB`, `16.00 EiB`, `16.00 YiB`."""
    if size < 1024:
        return f"{size} B"
    if size < 1 << 20:
        return f"{size / 1024:.1f} KiB"
    if size < 1 << 30:
        return f"{size / (1 << 20):.1f} MiB"
    # Past GiB too: a model's declared dims (2**40 × 2**40, say) had read
    # `18014398509481984.00 GiB`; past a float's range the division failed.
    if isinstance(size, int) and size.bit_length() > 1000:
        return f"2^{size.bit_length() - 1}+ B"
    for power, unit in ((80, "YiB"), (70, "ZiB"), (60, "EiB"), (50, "PiB"), (40, "TiB")):
        if size >= 1 << power:
            return f"{size / (1 << power):.2f} {unit}"
    return f"{size / (1 << 30):.2f} GiB"


def elide(name: str, width: int = 56) -> str:
    """`name` in `width` characters, its middle elided: the start names the layer
    (/layer2/layer2.0/downsample) and the end the op and onnxruntime's suffix (Conv/nchwc), so
    either alone makes different layers look the same."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]
