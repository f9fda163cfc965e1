"""Running tuning worker processes: start them, report progress while they run, stop them all
on Ctrl-C, and say how many failed."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from graphopt.errors import GraphoptError


def supervise(procs: list, tick: Callable[[], None] | None, what: str) -> None:
    """Start `procs` (spawned processes), call `tick` every 0.25 s until they end, and raise
    GraphoptError when any exits with an error (`what` names them: "tuning worker").

    The workers start with SIGINT ignored (an ignored signal stays ignored across the spawn,
    and Python then installs no handler of its own): Ctrl-C reaches the whole process group,
    and a worker interrupted inside Optuna's commit of a trial dies with a traceback and the
    trial half-told. The parent takes the KeyboardInterrupt, terminates them and re-raises; a
    trial a worker was running is marked failed by the next run's heartbeat check."""
    # Only the main thread may set a handler; a tune run from another thread has no Ctrl-C.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        for proc in procs:
            proc.start()
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    try:
        while any(proc.is_alive() for proc in procs):
            time.sleep(0.25)
            if tick is not None:
                tick()
    except KeyboardInterrupt:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join()
        raise
    for proc in procs:
        proc.join()
    failed = [proc.exitcode for proc in procs if proc.exitcode]
    if failed:
        raise GraphoptError(f"{len(failed)} {what}(s) exited with status {failed}; completed "
                            "trials are kept in the storage")
