"""`warnings.catch_warnings` that graphopt's own threads take one at a time, and graphopt's own
warnings kept for a tool that reports them, without touching the process-wide filters.

catch_warnings swaps the process-wide filter list on entry and puts back what it saved on
exit: two overlapping blocks in two threads (compiles in a thread pool) could put back each
other's temporary list, leaving an "ignore everything" filter installed for good. A block
here holds a process-wide lock, so graphopt's blocks never interleave. Other threads' warnings
are still caught by such a block, so a tool that turns graphopt's warnings into notes of its
report keeps them with kept_notices, per thread, instead.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_LOCK = threading.RLock()
_KEPT: ContextVar[list | None] = ContextVar("graphopt_kept_notices", default=None)


@contextmanager
def warnings_as(action: str, category: type[Warning] = Warning,
                record: bool = False) -> Iterator[list | None]:
    """A catch_warnings block with one filter (`action` for `category`); yields the list of
    caught warnings when `record`."""
    with _LOCK, warnings.catch_warnings(record=record) as caught:
        warnings.simplefilter(action, category)
        yield caught


@contextmanager
def kept_notices() -> Iterator[list[str]]:
    """Inside the block, graphopt's warnings raised in this thread (through `notice`) go to the
    yielded list instead of being shown: for a tool that reports them in its output (compare's
    notes: a stand-in provider). Other threads' warnings are left alone."""
    kept: list[str] = []
    token = _KEPT.set(kept)
    try:
        yield kept
    finally:
        _KEPT.reset(token)


def notice(message: str, category: type[Warning] = UserWarning, stacklevel: int = 1) -> None:
    """warnings.warn(message, category, stacklevel), or kept inside kept_notices."""
    kept = _KEPT.get()
    if kept is not None:
        kept.append(message)
        return
    warnings.warn(message, category, stacklevel=stacklevel + 1)
