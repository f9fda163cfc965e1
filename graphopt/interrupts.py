"""Ctrl-C (and the terminating signals) held back while a step that must not be cut in half
runs, then taken by the handler it was meant for."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# The signals a command takes as an interrupt: Ctrl-C, and those cli.Terminated stands for.
INTERRUPTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block with an interrupting signal that arrives inside it noted, and hand it to
    its handler once the block has ended (not when the block raises an error of its own,
    which wins). Python runs a signal's handler between two bytecodes, so a KeyboardInterrupt
    can land right after a database commit returns and before its caller sees the result:
    the row is written and nobody knows its id. Only the main thread takes signals, and only
    a Python handler is held back (an ignored signal, or one left to the system, is not)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signum: handler for signum in INTERRUPTING
            if callable(handler := signal.getsignal(signum))}
    noted: list[int] = []
    for signum in held:
        signal.signal(signum, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
    if noted:
        held[noted[0]](noted[0], None)
