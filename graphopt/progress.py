"""The progress line of long work (tuning): rewritten in place on a terminal; in a log, where
carriage returns would join every update into one line, a line per tenth of the work, or
for work in several pieces (tune's kernels) a line as each piece ends."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar

from graphopt.table import display_width

# In a log, a piece of several still shows it is alive this often (seconds).
HEARTBEAT_S = 30.0

# Whether a compile's long steps (calibration) show a line: set by `graphopt optimize` without
# -q; off for the Python API, whose callers print what they choose.
_COMPILE_PROGRESS: ContextVar[bool] = ContextVar("graphopt_compile_progress", default=False)


@contextlib.contextmanager
def compile_progress(enabled: bool) -> Iterator[None]:
    """Inside the block, compile_line() shows on a terminal when `enabled`."""
    token = _COMPILE_PROGRESS.set(enabled)
    try:
        yield
    finally:
        _COMPILE_PROGRESS.reset(token)


def _stderr_columns() -> int | None:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return None


def _clipped(text: str) -> str:
    """`text` cut to the terminal's width less a column: a line that wraps leaves a row behind
    at every update, since a carriage return goes back to the start of its last row only."""
    columns = _stderr_columns()
    if columns is None:
        return text
    room = columns - 1
    if room < 2 or display_width(text) <= room:
        return text
    while display_width(text) > room - 1:
        text = text[:-1]
    return text + "…"


class ProgressLine:
    """`update(text, done, total)` as the work advances (`begin(pieces)` before each of
    several pieces), `finish()` after it (or the work in a `with` block, which finishes
    however it ends); silent when `enabled` is False (--quiet)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.terminal = enabled and sys.stderr.isatty()
        self._tenth = -1
        self._pieces = 1
        self._printed_at = time.monotonic()
        self._unshown: str | None = None  # the last update, when a log did not get it
        self._printed: str | None = None
        self._shown = False
        self._width = 0  # of the line on screen, which a shorter update must cover
        self._started = self._printed_at
        self._seconds: float | None = None  # the piece's --timeout

    def update(self, text: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        tenth = done * 10 // max(total, 1)
        if self._seconds is not None:
            # Under --timeout the trial cap may never be reached (--trials 100000): the time
            # says how far the piece is, and in a log its tenths keep the lines coming.
            elapsed = now - self._started
            text = f"{text}  {_seconds(elapsed, self._seconds)}/{_seconds(self._seconds)} s"
            tenth = max(tenth, min(10, int(elapsed * 10 // self._seconds)))
        if self.terminal:
            # A shorter line ("best 9.50 µs" after "best 125.43 µs") is padded over the
            # longer one's tail, which a carriage return alone would leave on screen.
            text = _clipped(text)
            shown = display_width(text)
            print(f"\r{text}{' ' * (self._width - shown)}", end="", file=sys.stderr, flush=True)
            self._width = max(self._width, shown)
            self._shown = True
            return
        # Workers' progress is polled: the same count comes again and again, the last
        # one included, and is shown once.
        if self._pieces == 1:
            due = tenth != self._tenth
        else:  # of many pieces, a tenth of each would be ten lines a kernel: its end says
            # enough, and a heartbeat that a slow one still runs
            due = (done >= total and tenth != self._tenth) or now - self._printed_at >= HEARTBEAT_S
        self._unshown = None if due or text == self._printed else text
        if due:
            self._tenth = tenth
            self._printed_at = now
            self._printed = text
            print(text, file=sys.stderr, flush=True)

    def _show_last(self) -> None:
        """A piece that ended short of its total (tune's --timeout) still gets its line."""
        if not self.terminal and self._unshown is not None:
            print(self._unshown, file=sys.stderr, flush=True)
        self._unshown = None

    def begin(self, pieces: int = 1, seconds: float | None = None) -> None:
        """The next of `pieces` pieces of work (tune's next kernel), which may take `seconds`
        (--timeout): its progress is shown from its start, also when its first report is its
        last, with its time when it has a limit."""
        self._show_last()
        self._tenth = -1
        self._pieces = pieces
        self._printed_at = self._started = time.monotonic()
        self._seconds = seconds

    def __enter__(self) -> "ProgressLine":
        return self

    def __exit__(self, *_exc) -> None:
        self.finish()

    def finish(self) -> None:
        """End a terminal's updating line: what follows starts on a line of its own; in a
        log, show the last update if it was held back."""
        if self.enabled:
            self._show_last()
        if self._shown:
            print(file=sys.stderr)
            self._shown = False
            self._width = 0


def compile_line() -> ProgressLine:
    """The progress line of a long step inside a compile: on a terminal, when the command line
    asked for output (an INT8 calibration with entropy ranges took 16 s without a word); in a
    log, under -q and from Python, silent (a compile's output is its summary)."""
    return ProgressLine(_COMPILE_PROGRESS.get() and sys.stderr.isatty())


def _seconds(value: float, scale: float | None = None) -> str:
    """Whole seconds, or tenths under a timeout below 10 s (a --timeout of 0.3 read 0/0 s)."""
    return f"{value:.1f}" if (value if scale is None else scale) < 10 else f"{value:.0f}"
