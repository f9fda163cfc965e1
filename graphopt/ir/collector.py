"""Keeping Python's cyclic garbage collector off the IR while a compile builds and rewrites it."""

from __future__ import annotations

import gc
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from graphopt.interrupts import interrupts_deferred


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
# counts them itself and collects, as CPython would, before the next import. The young ones
# are counted by generation 0's allocation count, which grows while compiles pause collection
# and which freezing resets: gc.get_objects would list them, handing a tuple another thread
# was still filling a second reference, which then failed to grow (SystemError: bad argument
# to internal function, in any thread of the process); and a walk of the whole heap before
# every import cost a process holding 3M objects 47 ms a compile.
_moved = 0                 # since the last full collection graphopt started
_long_lived: int | None = None  # objects tracked after that collection (or at the first freeze)


def _freeze() -> None:
    """gc.freeze(), counting the young objects it takes."""
    global _moved, _long_lived
    _moved += gc.get_count()[0]
    gc.freeze()
    if _long_lived is None:  # once: what the process had tracked by then
        _long_lived = gc.get_freeze_count()


def _caller_froze() -> bool:
    """Whether a caller froze the heap (only it may thaw it), rather than graphopt's blocks."""
    return bool(gc.get_freeze_count()) and not (_frozen and _unfreeze_after)


def _collection_wanted() -> bool:
    """Whether the process collects garbage: the collector is on, or off only because
    compiles (this thread's or others') paused it; and no caller froze the heap."""
    return (gc.isenabled() or bool(_paused and _enable_after)) and not _caller_froze()


def _collect_all() -> None:
    """A full collection, also of what graphopt's open heap_frozen blocks froze (freezing only
    spares the collector walks): a thread pool whose compiles always overlapped never closed
    its last block, and its dropped results piled up, 1.4 GB after 200 compiles. Then the
    objects left are counted, by freezing them (a walk of the collector's lists, which a full
    collection has just made anyway)."""
    global _moved, _long_lived
    thawed = _frozen and _unfreeze_after
    # A Ctrl-C between freeze and unfreeze had left the heap frozen for good.
    with interrupts_deferred():
        if thawed:
            gc.unfreeze()
        gc.collect()
        gc.freeze()
        _moved, _long_lived = 0, gc.get_freeze_count()
        if not thawed:
            gc.unfreeze()


def collect_if_due() -> None:
    """A full collection when the young objects graphopt moved into the oldest generation
    since its last one (and those allocated since, which other threads' compiles may still
    hold paused) pass a quarter of what that one left there (CPython's own rule for the
    objects it moves), unless the caller turned collection off or froze the heap. Called
    before an import: a dropped result of the previous compile is garbage by then, and the new
    model is not built yet. Other threads' blocks pause collection for speed alone, and ones
    that always overlapped would otherwise keep it off for good."""
    with _LOCK:
        if not _collection_wanted() or _long_lived is None \
                or _moved + gc.get_count()[0] <= _long_lived // 4:
            return
        _collect_all()


def collect_dropped() -> None:
    """A full collection now, unless the caller turned collection off or froze the heap: a
    large model was just dropped (its IR is cyclic, so only a collection frees it) and the
    memory is wanted before the next one is built or run, which collect_if_due's count may not
    yet call due."""
    with _LOCK:
        if _collection_wanted():
            _collect_all()


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic collection inside the block. Importing a model allocates millions of objects
    and frees almost none, yet every 700 allocations start a collection and each full one
    re-walks everything built so far: at 100k nodes that was half the import's time."""
    global _paused, _enable_after
    entered = False
    try:
        with interrupts_deferred(), _LOCK:
            if _paused == 0:
                _enable_after = gc.isenabled()
                gc.disable()
            _paused += 1
            _paused_in[threading.get_ident()] += 1
            entered = True
        yield
    finally:
        if entered:  # an interrupt before the entry's bookkeeping took nothing to give back
            with interrupts_deferred(), _LOCK:
                _resume()


def _resume() -> None:
    """collection_paused's exit, under _LOCK: the last block out puts the collector back."""
    global _paused
    _paused -= 1
    _paused_in[threading.get_ident()] -= 1
    if _paused == 0:
        if not gc.get_freeze_count():
            # What the block built would otherwise wait in the youngest generation and be
            # walked three times over (young, middle, old; 0.7 s for the first alone at 100k
            # nodes) before settling where it belongs. freeze + unfreeze moves every tracked
            # object to the oldest generation without walking it; skipped when objects are kept
            # frozen, which unfreeze would release.
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
    entered = False
    try:
        with interrupts_deferred(), _LOCK:
            if _frozen == 0:
                _unfreeze_after = not gc.get_freeze_count()
                if _unfreeze_after:
                    _freeze()
            _frozen += 1
            _frozen_in[threading.get_ident()] += 1
            entered = True
        yield
    finally:
        if entered:
            with interrupts_deferred(), _LOCK:
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
