"""Keeping Python's cyclic garbage collector off the IR while a compile builds and rewrites it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


# The collector's switches are process-wide, and compiles may run in several threads: the
# first block in pauses it, the last one out restores what the first found. Saving and
# restoring per block let a thread that entered while another had paused it find collection
# "off", and leave it off for good once the other had restored it.
_LOCK = threading.Lock()
_paused = 0                # collection_paused blocks open, all threads together
_enable_after = False      # whether the first of them found collection on
_frozen = 0                # heap_frozen blocks open
_unfreeze_after = False    # whether the first of them froze the heap (a caller had not)


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic collection inside the block. Importing a model allocates millions of objects
    and frees almost none, yet every 700 allocations start a collection and each full one
    re-walks everything built so far: at 100k nodes that was half the import's time."""
    global _paused, _enable_after
    with _LOCK:
        if _paused == 0:
            _enable_after = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _LOCK:
            _paused -= 1
            if _paused == 0:
                if not gc.get_freeze_count():
                    # What the block built would otherwise wait in the youngest generation
                    # and be walked three times over (young, middle, old; 0.7 s for the first
                    # alone at 100k nodes) before settling where it belongs. freeze +
                    # unfreeze moves every tracked object to the oldest generation without
                    # walking it; skipped when objects are kept frozen, which unfreeze would
                    # release.
                    gc.freeze()
                    gc.unfreeze()
                if _enable_after:
                    gc.enable()


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Objects alive at entry (the imported IR) skip every collection inside the block; new
    garbage is still collected. A full collection otherwise walks the whole graph each time
    the passes' churn triggers one (17 times, 13 s of a 100k-node compile). Nodes of the
    frozen IR that passes delete are collected after the block. A caller that froze the heap
    itself keeps its own freeze; with blocks in several threads, the last one out unfreezes."""
    global _frozen, _unfreeze_after
    with _LOCK:
        if _frozen == 0:
            _unfreeze_after = not gc.get_freeze_count()
            if _unfreeze_after:
                gc.freeze()
        _frozen += 1
    try:
        yield
    finally:
        with _LOCK:
            _frozen -= 1
            if _frozen == 0 and _unfreeze_after:
                gc.unfreeze()
