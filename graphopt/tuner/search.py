"""Operator tuning: an Optuna study per kernel signature searching its tiling space.

Each trial picks a step on an ordinal ladder per Tiling field: base sizes double from the cube
unit up to the dim (the dim itself and the default's value included), L1 depths 1, 2, 4, 8,
double buffering, 1..AI cores. TPE models each ladder as ordered, which the tiling landscape
rewards: on the 256³ fp16 MatMul this reaches the exhaustive optimum's 1.22× in 50 trials where
unordered categorical choices over every multiple of the cube unit stalled near 1.09×. A pick
outside the feasible space is projected into it rather than thrown away: base_k steps down, then
the L1 depth, then double buffering goes, then cores, until tiling_space holds it (a pick with no
feasible projection is pruned with the reason). The tiling actually evaluated is the trial's
"tiling" user attr, so every completed trial is a point of tiling_space, or the default. The
objective is the cost model's estimated seconds (npu_model.estimate: never a measurement).

Trial 0 of a new study is always the documented default tiling (priced when the study is
opened and added complete, user attr "default"), so a study's default and best costs sit side
by side. Studies live in an Optuna storage, by default an SQLite file: a rerun with the same
storage and study name resumes (load_if_exists), and completed trials of a killed worker
persist. The same storage is the knowledge base (kb.py).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphopt.api_args import THREAD_LIMIT
from graphopt.errors import OptionError
from graphopt.tuner.npu_model import estimate
from graphopt.tuner.optuna_import import optuna, optuna_quiet
from graphopt.tuner.signature import is_signature, is_subgraph_study_name, signature
from graphopt.tuner.storage import (fail_silent_trials, open_storage, opened,
                                     optimize_failing_on_interrupt, setup_lock, storage_url)
from graphopt.tuner.tiling import (
    L1_DEPTHS,
    GemmShape,
    Tiling,
    cube_dtype,
    cube_shape,
    default_tiling,
    feasible,
    space_size,
    tiling_from,
)
from graphopt.tuner.workers import supervise, worker_process

if TYPE_CHECKING:
    from graphopt.partition.target import Device

PARAMS = ("base_m", "base_n", "base_k", "l1_depth", "double_buffer", "cores")

Progress = Callable[[int, int, float], None]  # (trials done, trials asked for, best seconds)
_STARTED = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE,
            optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


@dataclass
class TuneResult:
    study_name: str
    default: tuple[Tiling, float]        # the default tiling and its estimated seconds
    best: tuple[Tiling, float]           # the best completed trial's tiling and seconds
    trials: int                          # trials in the study (all runs, pruned included)
    space_size: int                      # points in tiling_space
    # Best seconds so far, per trial number, as this cost model prices the trials' tilings.
    history: list[float] = field(default_factory=list)
    # Completed trials recording no tiling graphopt wrote ("study #number"), left out.
    foreign: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.default[1] / self.best[1]


# --- the space --------------------------------------------------------------------------------


def search_choices(shape: GemmShape, device: Device) -> dict[str, list]:
    """The ordered ladder of values each Tiling field steps along (see the module docstring)."""
    cm, ck, cn = cube_shape(shape, device)
    default = default_tiling(shape, device)
    max_k_steps = -(-shape.k // ck)
    max_tiles = shape.batch * -(-shape.m // cm) * -(-shape.n // cn)
    choices = {"base_m": _ladder(shape.m, cm), "base_n": _ladder(shape.n, cn),
               "base_k": _ladder(shape.k, ck),
               "l1_depth": [d for d in L1_DEPTHS if d == 1 or d // 2 < max_k_steps],
               "double_buffer": [False, True],
               "cores": list(range(1, min(device.ai_cores or 1, max_tiles) + 1))}
    for name in PARAMS:
        value = getattr(default, name)
        if value not in choices[name]:
            choices[name] = sorted(choices[name] + [value])
    return choices


def _ladder(size: int, unit: int) -> list[int]:
    """unit, 2·unit, 4·unit, … up to the size rounded up to the unit, and that size itself."""
    top = -(-size // unit) * unit
    values = {top}
    step = unit
    while step < top:
        values.add(step)
        step *= 2
    return sorted(values)


def outside_space(tiling: Tiling, shape: GemmShape, device: Device) -> str | None:
    """None when `tiling` is a point of tiling_space (or the default tiling), else why not."""
    if tiling == default_tiling(shape, device):
        return None
    reason = feasible(tiling, shape, device)
    if reason is not None:
        return reason
    if tiling.l1_depth not in L1_DEPTHS:
        return f"l1_depth {tiling.l1_depth} is not one of {', '.join(map(str, L1_DEPTHS))}"
    cm, ck, cn = cube_shape(shape, device)
    for name, size, unit in (("base_m", shape.m, cm), ("base_n", shape.n, cn),
                             ("base_k", shape.k, ck)):
        value, top = getattr(tiling, name), -(-size // unit) * unit
        if value % unit or value > top:  # a larger tile only pads
            return f"{name} {value} is not a base size for a dim of {size} (multiples of " \
                   f"{unit} up to {top})"
    k_steps = -(-shape.k // tiling.base_k)
    if tiling.l1_depth > 1 and tiling.l1_depth // 2 >= k_steps:
        return f"l1_depth {tiling.l1_depth} loads past the {k_steps} K-step(s) there are"
    tiles = shape.batch * -(-shape.m // tiling.base_m) * -(-shape.n // tiling.base_n)
    if tiling.cores > tiles:
        return f"cores {tiling.cores} exceed the {tiles} output tile(s) there are"
    return None


def tiling_params(tiling: Tiling) -> dict[str, Any]:
    return {name: getattr(tiling, name) for name in PARAMS}


def step_params(tiling: Tiling, choices: dict[str, list]) -> dict[str, int]:
    """The ladder steps that pick `tiling` (each value must be on its ladder)."""
    return {f"{name}_step": choices[name].index(getattr(tiling, name)) for name in PARAMS}


def step_distributions(choices: dict[str, list]) -> dict:
    return {f"{name}_step": optuna.distributions.IntDistribution(0, len(choices[name]) - 1)
            for name in PARAMS}


def trial_tiling(trial: optuna.trial.FrozenTrial, study: str = "") -> Tiling:
    """The tiling a trial evaluated (its projection into the space, not the raw pick); an
    OptionError, naming `study` when given, when the trial holds none graphopt wrote (another
    Optuna client's, an edit)."""
    recorded = trial.user_attrs.get("tiling")
    try:
        return tiling_from(recorded)
    except TypeError:
        where = f"study {study}, " if study else ""
        raise OptionError(f"the knowledge base's {where}trial {trial.number} records no tiling "
                          f"graphopt wrote ({recorded!r}): tune into a fresh --tuning-db, or "
                          "drop the trial") from None


def written_trials(trials, study: str = "", skipped: list[str] | None = None
                   ) -> list[tuple[optuna.trial.FrozenTrial, Tiling]]:
    """(trial, tiling) of the completed `trials` of `study`, best first. A trial graphopt did
    not write is an OptionError, or, given a `skipped` list, left out and named there
    ("study #number")."""
    found = []
    for trial in sorted(trials, key=lambda t: (t.value, t.number)):
        try:
            found.append((trial, trial_tiling(trial, study)))
        except OptionError:
            if skipped is None:
                raise
            skipped.append(f"{study} #{trial.number}")
    return found


def project(tiling: Tiling, shape: GemmShape, device: Device,
            choices: dict[str, list]) -> Tiling | None:
    """`tiling` if it is in the space, else the nearest point below it: base_k steps down,
    then the L1 depth, then double buffering goes, then cores; None if nothing fits."""
    buffering = [tiling.double_buffer] + ([False] if tiling.double_buffer else [])
    for double_buffer in buffering:
        for base_k in [k for k in choices["base_k"] if k <= tiling.base_k][::-1]:
            for depth in [d for d in choices["l1_depth"] if d <= tiling.l1_depth][::-1]:
                for cores in [c for c in choices["cores"] if c <= tiling.cores][::-1]:
                    candidate = Tiling(tiling.base_m, tiling.base_n, base_k, depth,
                                       double_buffer, cores)
                    if outside_space(candidate, shape, device) is None:
                        return candidate
    return None


def _objective(shape: GemmShape, device: Device, choices: dict[str, list]):
    def objective(trial: optuna.Trial) -> float:
        picked = Tiling(**{name: choices[name][trial.suggest_int(f"{name}_step", 0,
                                                                  len(choices[name]) - 1)]
                           for name in PARAMS})
        tiling = project(picked, shape, device, choices)
        if tiling is None:
            reason = outside_space(picked, shape, device)
            trial.set_user_attr("infeasible", reason)
            raise optuna.TrialPruned(reason)
        result = estimate(shape, tiling, device)
        trial.set_user_attr("tiling", tiling_params(tiling))
        trial.set_user_attr("cycles", result.cycles)
        return result.seconds
    return objective


# --- the search -------------------------------------------------------------------------------


class RunSampler(optuna.samplers.BaseSampler):
    """One run's sampler (`kind` seeded with `seed`) on a study that other runs may share. A
    run alone gets the trial numbers after the `first` it expects, one by one, and samples as
    its seed says; where a trial's number is not the next one, another run took trials in
    between, and the sampler starts afresh from a seed of that number. Two runs started
    together on one database had the same seed (the user's plus the trials done), and
    evaluated the same candidates, trial for trial: a third of the budget went twice."""

    def __init__(self, kind: str, seed: int, first: int) -> None:
        self._kind, self._seed, self._next = kind, seed, first
        self._inner = _make_sampler(kind, seed)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.number != self._next:
            self._inner = _make_sampler(self._kind, self._seed + 7919 * (trial.number + 1))
        self._next = trial.number + 1
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


def first_trial_number(study: optuna.Study) -> int:
    """The number of the trial a run on `study` takes first: the first one enqueued and still
    waiting (the default tiling), else the next new one."""
    trials = study.get_trials(deepcopy=False)
    waiting = [t.number for t in trials if t.state == optuna.trial.TrialState.WAITING]
    return min(waiting) if waiting else len(trials)


def _make_sampler(kind: str, seed: int) -> optuna.samplers.BaseSampler:
    # A run's seed is the user's plus the trials already done (and 1000 per worker), which
    # may pass numpy's 2**32 bound: wrapped, it stays deterministic.
    seed %= 2 ** 32
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise OptionError(f"sampler '{kind}': use 'tpe' or 'random'")


def _resolve_device(device: Device | str, target: str | None) -> tuple[Device, str | None]:
    """(device, target reference) from a Device or a target name/profile path."""
    if isinstance(device, (str, os.PathLike)):
        from graphopt.partition import load_target
        ref = os.fspath(device)
        loaded = load_target(ref)
        npus = [d for d in loaded.devices if d.kind == "npu"]
        if not npus:
            raise OptionError(f"target '{ref}' has no NPU device to tune for")
        return npus[0], target or ref
    return device, target


def _target_name(target: str | None, device: Device) -> str:
    if target is None:
        return device.name
    if os.path.exists(target):
        from graphopt.partition import load_target
        return load_target(target).name
    return target


# The study attribute naming the device figures its trials were estimated on: a study is
# found by the target's name, which an edited profile may keep.
DEVICE_ATTR = "device"


def device_fingerprint(device: Device) -> str:
    """A digest of the device figures the cost model reads."""
    figures = {"cube": dict(device.cube or {}), "buffers": dict(device.buffers),
               "ai_cores": device.ai_cores, "clock_hz": device.clock_hz,
               "peak_ops_per_s": dict(device.peak_ops_per_s),
               "memory_bandwidth": device.memory_bandwidth,
               "launch_overhead_s": device.launch_overhead_s}
    text = json.dumps(figures, sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def open_study(storage: Any, study_name: str, shape: GemmShape, device: Device,
               sampler: optuna.samplers.BaseSampler | None = None,
               default_seconds: float | None = None,
               default_cycles: float | None = None, kernel: str | None = None) -> optuna.Study:
    """Create or load the study; a study without a default (new, or its default failed) gets
    the default tiling, completed: with `default_seconds` (and `default_cycles`) when that is
    known (a knowledge-base import), else as the cost model prices it. `kernel`, the signature of a study named
    otherwise (--study NAME), is checked against what the study holds and recorded on it."""
    return _opened(storage, study_name, shape, device, sampler, default_seconds,
                   default_cycles, kernel)[0]


def _opened(storage, study_name, shape, device, sampler=None, default_seconds=None,
            default_cycles=None, kernel=None) -> tuple[optuna.Study, bool]:
    """open_study, and whether this call added the default trial."""
    with setup_lock(getattr(storage, "url", "")):
        return _open_study(storage, study_name, shape, device, sampler, default_seconds,
                           default_cycles, kernel)


def _check_named_study(study: optuna.Study, kernel: str, shape: GemmShape) -> None:
    """OptionError unless the study of a --study NAME is new or op tuning's of this kernel: a
    study of another kernel, a subgraph study or another program's would be mixed with these
    tilings (and a subgraph study then read as tuned)."""
    from graphopt.tuner.kb import SIGNATURE_ATTR

    name = study.study_name
    held, stored = study.user_attrs.get(SIGNATURE_ATTR), study.user_attrs.get("shape")
    if "job" in study.user_attrs:
        raise OptionError(f"--study {name}: that is a subgraph tuning study, not {kernel}'s; "
                          "name a new study")
    # float32 and float16 shapes are one kernel: the cube computes both in float16.
    if held not in (None, kernel) or stored is not None and not (
            isinstance(stored, list) and len(stored) == 5
            and stored[:4] == [shape.batch, shape.m, shape.k, shape.n]
            and cube_dtype(stored[4]) == cube_dtype(shape.dtype)):
        raise OptionError(f"--study {name}: that study tunes {held or 'another shape'}, not "
                          f"{kernel}")
    if stored is None and study.get_trials(deepcopy=False):
        raise OptionError(f"--study {name}: that study holds trials graphopt's op tuning did "
                          "not make (another program's?); name a new study")


def tuned_on_another_profile(study: optuna.Study, device: Device) -> bool:
    """Whether the study recorded other device figures than `device`'s: a profile edited
    under the same name, whose tilings may not fit."""
    held = study.user_attrs.get(DEVICE_ATTR)
    return held is not None and held != device_fingerprint(device)


def _open_study(storage, study_name, shape, device, sampler, default_seconds, default_cycles,
                kernel):
    study = optuna.create_study(storage=storage, study_name=study_name, direction="minimize",
                                sampler=sampler, load_if_exists=True)
    if kernel is not None:  # before anything is written to it
        _check_named_study(study, kernel, shape)
    fail_silent_trials(study)
    if tuned_on_another_profile(study, device):
        raise OptionError(f"study {study_name} was tuned on another profile of that name (its "
                          "cube, buffers, cores or rates differ): its tilings may not fit this "
                          "one; tune into a fresh --tuning-db, or give the edited profile a "
                          "new name")
    trials = study.get_trials(deepcopy=False)
    if not trials:
        study.set_user_attr("shape", [shape.batch, shape.m, shape.k, shape.n, shape.dtype])
        study.set_user_attr(DEVICE_ATTR, device_fingerprint(device))
    if kernel is not None:
        from graphopt.tuner.kb import SIGNATURE_ATTR

        study.set_user_attr(SIGNATURE_ATTR, kernel)
    # The default is every study's yardstick: a run stopped during its trial (Ctrl-C, a kill)
    # left it failed, and without it the best of a few random tilings passed as tuned.
    pending = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING,
               optuna.trial.TrialState.RUNNING)
    if any(t.user_attrs.get("default") and t.state in pending for t in trials):
        return study, False
    # Priced here, under the setup lock, rather than queued: runs started together on one
    # SQLite file could each pop the one waiting default, run it, and all but one then failed
    # to record it ("Cannot tell a COMPLETE trial"), their remaining kernels untuned.
    tiling = default_tiling(shape, device)
    if default_seconds is None:
        priced = estimate(shape, tiling, device)
        default_seconds, default_cycles = priced.seconds, priced.cycles
    choices = search_choices(shape, device)
    study.add_trial(optuna.trial.create_trial(
        params=step_params(tiling, choices), value=default_seconds,
        distributions=step_distributions(choices),
        user_attrs={"default": True, "cycles": default_cycles, "tiling": tiling_params(tiling)}))
    return study, True


def tune_kernel(shape: GemmShape, device: Device | str, *, trials: int = 50,
                timeout: float | None = None, seed: int = 0, storage: Any = None,
                study_name: str | None = None, sampler: str = "tpe",
                progress: Progress | None = None, target: str | None = None,
                op_class: str = "gemm", workers: int = 1) -> TuneResult:
    """Run `trials` more trials of the study of `shape` on `device` and return its result.

    `device`: a Device, or a target name/profile path (its NPU device). `target`: the target's
    name or profile path, for the default study name (the kernel signature) and for workers,
    which reload the device (Devices do not pickle). `storage`: an Optuna storage URL, an
    SQLite file path, a storage object, or None for default_db_path(). Reruns resume: the
    sampler is seeded with seed + the trials already there, so it does not replay them.
    `workers` > 1 runs that many processes on the same storage (not an in-memory one),
    splitting `trials` between them."""
    if trials < 0:
        raise OptionError(f"trials must be ≥ 0, got {trials}")
    if not 1 <= workers <= THREAD_LIMIT:  # each is a process; more would swamp any machine
        raise OptionError(f"workers must be from 1 to {THREAD_LIMIT}, got {workers}")
    if not shape.has_work:
        raise OptionError(f"{shape} has a zero-size dim: no work, so no tiling to tune")
    if op_class == "conv" and shape.conv is None:  # its study would be keyed by no compile
        raise OptionError(f"{shape}: a conv is priced by its geometry, which this shape lacks "
                          "(gemm_shape of the Conv node gives it)")
    device, target = _resolve_device(device, target)
    kernel = signature(_target_name(target, device), op_class, shape)
    study_name = study_name or kernel
    if study_name != kernel and is_signature(study_name):
        # The knowledge base would file this kernel's tilings under the one the name spells.
        raise OptionError(f"--study {study_name}: that name is another kernel's signature; "
                          f"this job tunes {kernel}")
    if is_subgraph_study_name(study_name):
        # A subgraph tune of that job would load this study by its default name and mix its
        # decisions with these tilings.
        raise OptionError(f"--study {study_name}: that name is a subgraph tuning study's; "
                          f"this job tunes {kernel}")
    with opened(storage) as store, optuna_quiet():
        if workers > 1 and isinstance(store, optuna.storages.InMemoryStorage):
            raise OptionError("workers > 1 need a shared storage: an SQLite file or a server URL")
        choices = search_choices(shape, device)
        # The knowledge base finds a study named otherwise by the signature it records.
        study, priced_default = _opened(store, study_name, shape, device,
                                        kernel=kernel if study_name != kernel else None)
        done_before = len(study.get_trials(deepcopy=False))
        # The default this run priced is the first of its trials, in its count and progress.
        started_before = len(study.get_trials(deepcopy=False, states=_STARTED)) - priced_default
        best_so_far = [_best_value(study)]
        ran_default = int(priced_default and trials > 0)
        trials_left = trials - ran_default

        if workers == 1:
            study.sampler = RunSampler(sampler, seed + done_before, first_trial_number(study))

            ran = [ran_default]  # this run's trials: another run on the study numbers trials too
            if ran_default and progress is not None:
                progress(ran[0], trials, best_so_far[0])

            def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
                ran[0] += 1
                if trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None:
                    best_so_far[0] = min(best_so_far[0], trial.value)
                if progress is not None:
                    progress(ran[0], trials, best_so_far[0])

            optimize_failing_on_interrupt(study, _objective(shape, device, choices),
                                          n_trials=trials_left, timeout=timeout,
                                          callbacks=[callback], gc_after_trial=False)
        else:
            if target is None:
                raise OptionError("workers > 1 need `target` (a target name or profile path): "
                                  "each worker process reloads the device")
            url = store.url if isinstance(store, optuna.storages.RDBStorage) \
                else storage_url(storage)
            # A default an earlier release queued runs here first: two workers popping the one
            # waiting trial at the same moment can both run it on SQLite.
            waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
            if waiting and trials_left:
                first = min(len(waiting), trials_left)
                study.optimize(_objective(shape, device, choices), n_trials=first,
                               gc_after_trial=False)
                trials_left -= first
            shares = [trials_left // workers + (i < trials_left % workers) for i in range(workers)]
            ctx = multiprocessing.get_context("spawn")
            procs = [ctx.Process(target=_worker, args=(url, study_name, shape, target, device.name,
                                                       share, timeout, sampler,
                                                       seed + 1000 * (i + 1) + done_before))
                     for i, share in enumerate(shares) if share]

            def tick() -> None:
                now = study.get_trials(deepcopy=False)
                progress(min(len(now) - started_before, trials), trials, _best_value(study))

            supervise(procs, tick if progress is not None else None, "tuning worker")
        return study_result(study, shape, device)


def _worker(url: str, study_name: str, shape: GemmShape, target: str, device_name: str,
            trials: int, timeout: float | None, sampler: str, seed: int) -> None:
    from graphopt.partition import load_target

    with worker_process():
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        device = load_target(target).device(device_name)
        study = optuna.load_study(study_name=study_name, storage=open_storage(url),
                                  sampler=_make_sampler(sampler, seed))
        optimize_failing_on_interrupt(study, _objective(shape, device,
                                                        search_choices(shape, device)),
                                      n_trials=trials, timeout=timeout, gc_after_trial=False)


# --- results ----------------------------------------------------------------------------------


def _best_value(study: optuna.Study) -> float:
    values = [t.value for t in study.get_trials(deepcopy=False,
                                                states=(optuna.trial.TrialState.COMPLETE,))
              if t.value is not None]
    return min(values, default=float("inf"))


def history(study: optuna.Study) -> list[float]:
    """Best seconds so far after each trial, by trial number (inf before the first result)."""
    best, out = float("inf"), []
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None:
            best = min(best, trial.value)
        out.append(best)
    return out


def priced_history(study: optuna.Study, shape: GemmShape, device: Device) -> list[float]:
    """history(study) with each completed trial's tiling priced by this cost model, as
    best_priced prices it for tune's table, not by the figure stored with it (a study another
    graphopt's cost model filled holds stale ones, and --plot drew those beside the table's).
    A trial with no tiling graphopt wrote, or one this profile cannot hold, adds nothing, as
    neither can be the table's best."""
    prices: dict[Tiling, float] = {}
    best, out = float("inf"), []
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None:
            try:
                tiling = trial_tiling(trial)
            except OptionError:
                tiling = None
            if tiling is not None and tiling not in prices \
                    and feasible(tiling, shape, device) is None:
                prices[tiling] = estimate(shape, tiling, device).seconds
            best = min(best, prices.get(tiling, float("inf")))
        out.append(best)
    return out


def best_priced(tilings, shape: GemmShape, device: Device) -> tuple[Tiling, float]:
    """(tiling, seconds) that this cost model prices lowest among the default and the stored
    `tilings` that fit `device`: what a compile applies and what tune's table shows. The
    figures stored with the tilings are not used: a study another graphopt's cost model
    filled, or one tuned on an edited profile of the same name, may hold stale ones."""
    default = default_tiling(shape, device)
    best = (default, estimate(shape, default, device).seconds)
    for tiling in dict.fromkeys(tilings):
        if feasible(tiling, shape, device) is None:
            seconds = estimate(shape, tiling, device).seconds
            if seconds < best[1]:
                best = (tiling, seconds)
    return best


def study_result(study: optuna.Study, shape: GemmShape, device: Device) -> TuneResult:
    default = default_tiling(shape, device)
    completed = [t for t in study.get_trials(deepcopy=False,
                                             states=(optuna.trial.TrialState.COMPLETE,))
                 if t.value is not None]
    # Another client's trial cannot be the best tiling.
    foreign: list[str] = []
    written = written_trials(completed, study.study_name, skipped=foreign)
    default_seconds = estimate(shape, default, device).seconds
    best = best_priced((tiling for _, tiling in written), shape, device)
    # Trials evaluated, as `kb list` counts them: not one a Ctrl-C or a kill stopped.
    evaluated = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                         optuna.trial.TrialState.PRUNED))
    return TuneResult(study.study_name, (default, default_seconds), best, len(evaluated),
                      space_size(shape, device), priced_history(study, shape, device),
                      foreign)
