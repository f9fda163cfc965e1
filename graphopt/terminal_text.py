"""Standard streams as a command sees them: control characters escaped, characters the
stream's encoding lacks written as backslash escapes, a stream the process was started
without an error on use, and a failed write to standard output an error of its own.

A name read from a model, a manifest or a target file may hold any character. Printed raw, an
escape sequence in it acts on the user's terminal (retitles it, clears it, recolours what
follows) and a bidirectional override reorders the line. Every line graphopt prints passes
through here, so a message that forgets `one_line` still cannot do that. Line feeds, tabs and
carriage returns (the progress line) pass as they are: graphopt's own text uses them.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator

_KEPT = {"\t", "\n", "\r"}
_CONTROLS = ([chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7F, 0xA0)]
             + [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)])
_ESCAPES = str.maketrans({c: repr(c)[1:-1] for c in _CONTROLS if c not in _KEPT})

# Temporary paths a command works on, and the paths the user gave for them (graphopt.cli_streams).
_shown_as: dict[str, str] = {}


def escape_controls(text: str) -> str:
    """`text` with terminal control characters (but tab, line feed, carriage return) escaped."""
    return text.translate(_ESCAPES)


class ReaderGone(Exception):
    """Standard output's reader went away (`graphopt … | head -1`). Not an OSError, which a
    command's own file handling would take for a failure of its files."""


class OutputFailed(Exception):
    """A write to standard output failed (a full disk behind `> out.txt`). Not an OSError, as
    for ReaderGone."""


class EscapingStream:
    """A text stream's stand-in that escapes control characters in what is written to it;
    for standard output (`checked`), a failed write raises ReaderGone or OutputFailed."""

    def __init__(self, stream, checked: bool = False) -> None:
        self._stream = stream
        self._checked = checked

    @property
    def closed_stream(self) -> bool:
        """Whether the process was started without this stream (`>&-`)."""
        return isinstance(self._stream, ClosedStream)

    def write(self, text: str) -> int:
        shown = text
        for path, given in _shown_as.items():
            shown = shown.replace(path, given)
        with self._failures():
            self._stream.write(shown.translate(_ESCAPES))
        return len(text)

    def flush(self) -> None:
        with self._failures():
            self._stream.flush()

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        if not self._checked:
            yield
            return
        try:
            yield
        except BrokenPipeError:
            raise ReaderGone from None
        except OSError as exc:
            raise OutputFailed(f"cannot write to standard output: {exc.strerror or exc}") \
                from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):  # isatty, fileno, encoding, buffer, close, …
        return getattr(self._stream, name)


class ClosedStreamError(Exception):
    """A read or write on a standard stream the process was started without (`>&-`). Not an
    OSError: argparse's help, and readers that report a file's OSErrors, would take it for
    one of theirs (--help printed nothing and exited 0)."""


class ClosedStream(io.TextIOBase):
    """Stands in for a closed standard stream: any read or write raises ClosedStreamError,
    as a write to a closed descriptor fails for `cat`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _closed(self, *_args, **_kwargs):
        raise ClosedStreamError(f"standard {self.name} is closed")

    write = read = readline = fileno = _closed

    @property
    def buffer(self):
        return self

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Inside the block sys.stdout and sys.stderr escape control characters, and characters
    their encoding cannot write (µ, ×, a model's non-ASCII names under PYTHONIOENCODING=ascii
    or a cp1252 console) come out as backslash escapes instead of failing the command. A
    stream the process was started without is a ClosedStream (stdin, stdout) or, for stderr,
    where nothing could report it, os.devnull."""
    saved = sys.stdin, sys.stdout, sys.stderr
    errors = {}
    for stream in (sys.stdout, sys.stderr):
        # surrogateescape too (PYTHONIOENCODING=ascii:surrogateescape, a C locale without
        # UTF-8 mode): it writes back only the bytes a file name brought, no other character.
        if isinstance(stream, io.TextIOWrapper) and stream not in errors \
                and stream.errors in ("strict", "surrogateescape"):
            errors[stream] = stream.errors
            stream.reconfigure(errors="backslashreplace")
    devnull = open(os.devnull, "w") if sys.stderr is None else None  # noqa: SIM115
    sys.stdin = sys.stdin or ClosedStream("input")
    sys.stdout = EscapingStream(sys.stdout or ClosedStream("output"), checked=True)
    sys.stderr = EscapingStream(sys.stderr or devnull)
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        for stream, mode in errors.items():
            with contextlib.suppress(ValueError, OSError):  # closed meanwhile (a broken pipe)
                stream.reconfigure(errors=mode)
        if devnull is not None:
            devnull.close()


@contextlib.contextmanager
def paths_shown_as(paths: dict[str, str]) -> Iterator[None]:
    """Inside the block, what is written names each key of `paths` as its value (a temporary
    copy as the path the user gave); `paths` is read as the block fills it."""
    global _shown_as
    saved, _shown_as = _shown_as, paths
    try:
        yield
    finally:
        _shown_as = saved


def silence_stdout() -> None:
    """Point the descriptor under sys.stdout (the stream whose reader went away, which need
    not be the process's own) at os.devnull, so that what is still buffered for it is not
    written, and failed, again when the interpreter exits."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        fd = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
