"""`warnings.catch_warnings` that graphopt's own threads take one at a time.

catch_warnings swaps the process-wide filter list on entry and puts back what it saved on
exit: two overlapping blocks in two threads (compiles in a thread pool) could put back each
other's temporary list, leaving an "ignore everything" filter installed for good. A block
here holds a process-wide lock, so graphopt's blocks never interleave.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.RLock()


@contextmanager
def warnings_as(action: str, category: type[Warning] = Warning,
                record: bool = False) -> Iterator[list | None]:
    """A catch_warnings block with one filter (`action` for `category`); yields the list of
    caught warnings when `record`."""
    with _LOCK, warnings.catch_warnings(record=record) as caught:
        warnings.simplefilter(action, category)
        yield caught
