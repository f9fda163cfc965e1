"""`tune --workers N` over a model of several kernels: each worker process tunes its share of
the kernels one after another, as one process tunes them all, rather than N processes being
started for every kernel's trials."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable

from graphopt.tuner.optuna_import import optuna, optuna_quiet
from graphopt.tuner.storage import opened
from graphopt.tuner.workers import stop_asked, supervise, worker_process

# How often the parent counts the trials in the storage for its progress line.
_POLL_SECONDS = 1.0


def tune_in_workers(kernels: list, target: str, url: str, *, trials: int,
                    timeout: float | None, seed: int, sampler: str, workers: int,
                    progress: Callable[[int, int], None] | None = None) -> None:
    """Tune `kernels` (model_kernels' groups) on `workers` processes sharing the storage at
    `url`, kernel i on worker i mod N. Each kernel's study gets its `trials`, seeded as a run
    alone seeds it, so the tilings found are those of a run with one worker; only their order
    in time differs. Starting N processes for each kernel cost about 2 s each time: with 2
    workers the zoo's ResNet-50 (21 kernels, 10 trials each) took 43 s against 10 s alone.
    `progress(done, total)` counts this run's trials over every kernel."""
    items = [(group.shape, group.device, group.signature.split("/")[1], group.signature)
             for group in kernels]
    shares = [items[i::workers] for i in range(workers)]
    before = _trial_counts(url, [item[3] for item in items])
    total = trials * len(items)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_tune_share,
                         args=([item[:3] for item in share], target, url, trials, timeout,
                               seed, sampler))
             for share in shares if share]
    last = [0.0]

    def tick() -> None:
        if time.monotonic() - last[0] < _POLL_SECONDS:
            return
        last[0] = time.monotonic()
        now = _trial_counts(url, [item[3] for item in items])
        done = sum(min(trials, now[name] - before[name]) for name in now)
        progress(done, total)

    supervise(procs, tick if progress is not None else None, "tuning worker")


def _trial_counts(url: str, names: list[str]) -> dict[str, int]:
    """The trials each named study holds (0 for one not yet created)."""
    with opened(url, read_only=True) as store, optuna_quiet():
        known = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(store)
                 if s.study_name in names}
    return {name: known.get(name, 0) for name in names}


def _tune_share(share: list, target: str, url: str, trials: int, timeout: float | None,
                seed: int, sampler: str) -> None:
    from graphopt.partition import load_target
    from graphopt.tuner.search import tune_kernel

    with worker_process():
        loaded = load_target(target)
        with opened(url) as store:
            for shape, device, op_class in share:
                if stop_asked():  # the kernels after the one it stopped in are not begun
                    break
                tune_kernel(shape, loaded.device(device), trials=trials, timeout=timeout,
                            seed=seed, storage=store, sampler=sampler, target=target,
                            op_class=op_class)
