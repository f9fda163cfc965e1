"""Ctrl-C held back while a step that must not be cut in half runs, then taken."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block with a Ctrl-C that arrives inside it noted, and raise KeyboardInterrupt
    once it has ended (not when the block raises an error of its own, which wins). Python
    delivers a SIGINT between two bytecodes, so a KeyboardInterrupt can land right after a
    database commit returns and before its caller sees the result: the row is written and
    nobody knows its id. Only the main thread takes Ctrl-C, and only while the default
    handler is in place (a caller's own handler is left as it is)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    noted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted:
        raise KeyboardInterrupt
