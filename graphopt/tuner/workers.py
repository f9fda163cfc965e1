"""Running tuning worker processes: start them, report progress while they run, stop them all
on Ctrl-C, and say how many failed."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker

from graphopt.errors import GraphoptError


# How long a terminated worker may take to complete its trial and end.
TERMINATE_GRACE_S = 10.0


def supervise(procs: list, tick: Callable[[], None] | None, what: str) -> None:
    """Start `procs` (spawned processes), call `tick` every 0.25 s until they end, and raise
    GraphoptError when any exits with an error (`what` names them: "tuning worker").

    The workers start with SIGINT blocked, a mask a spawned process inherits (multiprocessing
    protects its resource tracker so), since Ctrl-C reaches the whole process group, and a worker
    interrupted inside Optuna's commit of a trial dies with a traceback and the trial
    half-told. The parent takes the KeyboardInterrupt, terminates them (each completes the
    trial it runs and stops: worker_process) and re-raises; one that has not ended
    TERMINATE_GRACE_S later is killed, and its trial is marked failed by the next run's
    heartbeat check.

    While it starts them, the parent only notes a Ctrl-C and takes it once they have all
    started, so that none is left running untracked. (Ignoring SIGINT for the children's sake,
    as this did before, dropped a Ctrl-C that came then: the run went on and ended as done.)"""
    # Only the main thread takes Ctrl-C; a tune run from another thread has none to take.
    main = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # as a background job's is
    noted: list[int] = []
    if main:
        # Starting a process starts the resource tracker once, and that start unblocks
        # SIGINT when it is done: start it first, so the block below holds.
        resource_tracker.ensure_running()
        previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        try:
            for proc in procs:
                proc.start()
        finally:
            if main:
                # A Ctrl-C still pending is noted, or raised by the restored handler, whose
                # KeyboardInterrupt may come right after it is back: so it goes back last.
                try:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                finally:
                    signal.signal(signal.SIGINT, previous)
        if noted:
            raise KeyboardInterrupt
        while any(proc.is_alive() for proc in procs):
            time.sleep(0.25)
            if tick is not None:
                tick()
    except KeyboardInterrupt:
        started = [proc for proc in procs if proc.pid is not None]
        for proc in started:
            proc.terminate()  # each ends once the trial it runs completes
        for proc in started:
            proc.join(TERMINATE_GRACE_S)
            if proc.is_alive():  # a trial longer than the grace: not waited for
                proc.kill()
                proc.join()
        raise
    for proc in procs:
        proc.join()
    failed = [proc.exitcode for proc in procs if proc.exitcode]
    if failed:
        raise GraphoptError(f"{len(failed)} {what}(s) exited with status {failed}; completed "
                            "trials are kept in the storage")


# Set in a worker when its parent asks it to stop (terminate(), on Ctrl-C).
_stop_asked = threading.Event()


@contextlib.contextmanager
def worker_process() -> Iterator[None]:
    """The body of a tuning worker process. It ends when the parent that started it is gone
    (end_with_parent). The parent's terminate() on Ctrl-C (SIGTERM) asks it to stop: the trial
    it runs completes, and the study stops there (stop_if_asked, a callback of every
    study.optimize graphopt runs). Killed by the signal, it had left that trial RUNNING
    until a rerun's heartbeat check; interrupted where the signal landed, it could leave a
    database transaction open, which held the other workers' writes."""
    end_with_parent()
    signal.signal(signal.SIGTERM, lambda signum, frame: _stop_asked.set())
    yield


def stop_if_asked(study, trial) -> None:
    """An Optuna callback: stop the study after this trial when the worker was asked to."""
    if _stop_asked.is_set():
        study.stop()


def stop_asked() -> bool:
    return _stop_asked.is_set()


def end_with_parent(poll_seconds: float = 0.5) -> None:
    """Called first in a worker: end this process when the parent that started it is gone.
    Killed outright (kill -9, the OOM killer, a container's grace period running out), the
    parent cannot stop its workers, which went on tuning, and racing the rerun, on their own.
    A trial left running is failed by the next run's heartbeat check, as after Ctrl-C."""
    started_by = multiprocessing.parent_process()  # gone already: the process is adopted
    parent = started_by.pid if started_by is not None else os.getppid()

    def watch() -> None:
        while os.getppid() == parent:  # an orphan is adopted by init or a subreaper
            time.sleep(poll_seconds)
        os._exit(1)  # no cleanup to wait for: the storage keeps what was committed

    threading.Thread(target=watch, name="graphopt-parent-watch", daemon=True).start()
