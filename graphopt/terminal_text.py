"""Standard streams that show control characters escaped while a command runs.

A name read from a model, a manifest or a target file may hold any character. Printed raw, an
escape sequence in it acts on the user's terminal (retitles it, clears it, recolours what
follows) and a bidirectional override reorders the line. Every line graphopt prints passes
through here, so a message that forgets `one_line` still cannot do that. Line feeds, tabs and
carriage returns (the progress line) pass as they are: graphopt's own text uses them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

_KEPT = {"\t", "\n", "\r"}
_CONTROLS = ([chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7F, 0xA0)]
             + [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)])
_ESCAPES = str.maketrans({c: repr(c)[1:-1] for c in _CONTROLS if c not in _KEPT})


def escape_controls(text: str) -> str:
    """`text` with terminal control characters (but tab, line feed, carriage return) escaped."""
    return text.translate(_ESCAPES)


class EscapingStream:
    """A text stream's stand-in that escapes control characters in what is written to it."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(text.translate(_ESCAPES))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):  # flush, isatty, fileno, encoding, buffer, close, …
        return getattr(self._stream, name)


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """sys.stdout and sys.stderr escape control characters inside the block."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(sys.stdout), EscapingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
