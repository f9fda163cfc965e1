"""Keeping Python's cyclic garbage collector off the IR while a compile builds and rewrites it."""

from __future__ import annotations

import gc
import os
import threading
from collections import Counter
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
# The blocks open per thread: a child forked mid-compile keeps only the forking thread, and
# the others' blocks never close there (_after_fork_in_child).
_paused_in: Counter = Counter()
_frozen_in: Counter = Counter()

# Objects that freeze + unfreeze moved from the young generations into the oldest one. CPython
# starts a full collection only once the objects that reached the oldest generation by aging
# pass a quarter of those a full collection left there; these arrive without being counted,
# so a process that compiles one model after another and drops each result (the IR is cyclic)
# would never collect them: mobilenetv2 left 23 MB per compile, 1.9 GB after 80. graphopt
# counts them itself and collects, as CPython would, before the next import.
_moved = 0                 # since the last full collection graphopt started
_long_lived: int | None = None  # objects in the oldest generation after that collection


def _freeze() -> None:
    """gc.freeze(), counting the young objects it takes (the old ones were counted already)."""
    global _moved, _long_lived
    if _long_lived is None:
        _long_lived = len(gc.get_objects(generation=2))
    _moved += len(gc.get_objects(generation=0)) + len(gc.get_objects(generation=1))
    gc.freeze()


def collect_if_due() -> None:
    """A full collection when the objects graphopt moved into the oldest generation since the
    last one pass a quarter of what that one left there (CPython's own rule for the objects it
    moves), unless collection is off or paused. Called before an import: a dropped result of
    the previous compile is garbage by then, and the new model is not built yet."""
    global _moved, _long_lived
    with _LOCK:
        if _paused or _frozen or not gc.isenabled() or _long_lived is None \
                or _moved <= _long_lived // 4:
            return
        gc.collect()
        _moved, _long_lived = 0, len(gc.get_objects(generation=2))


def collect_dropped() -> None:
    """A full collection now, unless collection is off or paused: a large model was just
    dropped (its IR is cyclic, so only a collection frees it) and the memory is wanted before
    the next one is built or run, which collect_if_due's count may not yet call due."""
    global _moved, _long_lived
    with _LOCK:
        if _paused or _frozen or not gc.isenabled():
            return
        gc.collect()
        _moved, _long_lived = 0, len(gc.get_objects(generation=2))


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
        _paused_in[threading.get_ident()] += 1
    try:
        yield
    finally:
        with _LOCK:
            _paused -= 1
            _paused_in[threading.get_ident()] -= 1
            if _paused == 0:
                if not gc.get_freeze_count():
                    # What the block built would otherwise wait in the youngest generation
                    # and be walked three times over (young, middle, old; 0.7 s for the first
                    # alone at 100k nodes) before settling where it belongs. freeze +
                    # unfreeze moves every tracked object to the oldest generation without
                    # walking it; skipped when objects are kept frozen, which unfreeze would
                    # release.
                    _freeze()
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
                _freeze()
        _frozen += 1
        _frozen_in[threading.get_ident()] += 1
    try:
        yield
    finally:
        with _LOCK:
            _frozen -= 1
            _frozen_in[threading.get_ident()] -= 1
            if _frozen == 0 and _unfreeze_after:
                gc.unfreeze()


def _after_fork_in_child() -> None:
    """A child forked while other threads compiled (a fork-based multiprocessing pool beside a
    thread pool) has only the forking thread: the blocks the others had open never close
    there, so the collector is put back as their closing would have left it, instead of
    staying off (or the heap frozen) for the child's life."""
    global _LOCK, _paused, _frozen
    _LOCK = threading.Lock()  # another thread may have held it at the fork
    me = threading.get_ident()
    paused, frozen = _paused_in[me], _frozen_in[me]
    _paused_in.clear()
    _frozen_in.clear()
    _paused_in[me], _frozen_in[me] = paused, frozen
    if _frozen and not frozen and _unfreeze_after:
        gc.unfreeze()
    if _paused and not paused and _enable_after:
        gc.enable()
    _paused, _frozen = paused, frozen


os.register_at_fork(after_in_child=_after_fork_in_child)
