"""optuna, imported on a thread of its own, so that the first import keeps no caller alive;
quiet while graphopt drives it.

optuna keeps the ImportError of an optional backend it lacks (redis), and that error's
traceback holds every frame above the import: imported first inside optimize() or save(), it
would keep that call's model and weights alive for the life of the process. A thread's stack
has no such frames.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

if "optuna" not in sys.modules:
    _importer = threading.Thread(target=importlib.import_module, args=("optuna",),
                                 name="graphopt-import-optuna")
    _importer.start()
    _importer.join()

import optuna  # noqa: E402 - imported above (or failing here with its own ImportError)

_LOCK = threading.Lock()
_quiet = 0                    # quiet blocks open, all threads together
_verbosity_after: int = 0     # the caller's verbosity, which the last block out restores


@contextmanager
def optuna_quiet() -> Iterator[None]:
    """Optuna logs errors only inside the block: graphopt reports a failed trial (Ctrl-C, say)
    in one line, where Optuna's warning would print the traceback first, and its progress
    replaces Optuna's line per trial. The caller's own verbosity comes back after the last of
    several overlapping blocks (compiles and tunes in a thread pool)."""
    global _quiet, _verbosity_after
    with _LOCK:
        if _quiet == 0:
            _verbosity_after = optuna.logging.get_verbosity()
            optuna.logging.set_verbosity(optuna.logging.ERROR)
        _quiet += 1
    try:
        yield
    finally:
        with _LOCK:
            _quiet -= 1
            if _quiet == 0:
                optuna.logging.set_verbosity(_verbosity_after)


__all__ = ["optuna", "optuna_quiet"]
