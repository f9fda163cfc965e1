"""Subgraph tuning (`graphopt tune --job subgraph`): an Optuna study per model, target and level
over the fusion and layout decisions of subgraph_space, scored by the cost model or measured.

Every trial compiles the model with the trial's decisions (a rewrite gate plus pass options)
and scores the result:
  * objective "estimate": tuner.model.model_estimate of the partitioned compile, the sum of
    every partition's kernels and every host↔device copy, with the knowledge base's tuned
    tilings for cube kernels it knows (op tuning first makes subgraph tuning see tuned kernels);
  * objective "measured" (CPU targets): the compile is saved as an .om, loaded with
    graphopt.load and timed with onnxruntime: the median of `repeat` runs after warm-up. Its
    outputs are checked against the original's (ORT_DISABLE_ALL) first; a candidate outside
    rtol 1e-3 / atol 1e-4 is pruned, so a tuned compile is never a wrong one.
Trial 0 is the default compile (every group on, default knobs), so default and best sit side
by side. The study keeps the decision space in its user attrs, which lets `graphopt optimize
--tuning-db` apply the best decisions without recording them again (subgraph_lookup).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from graphopt.api_args import THREAD_LIMIT
from graphopt.atomic import scratch_folder, scratch_writes
from graphopt.errors import OptionError, VerificationError
from graphopt.ir.onnx_io import read_model_proto
from graphopt.tuner.optuna_import import optuna, optuna_quiet
from graphopt.partition.report import dynamic_hint
from graphopt.tuner.search import (_STARTED, Progress, RunSampler, _make_sampler,
                                   first_trial_number, history)
from graphopt.tuner.signature import is_signature, is_subgraph_study_name
from graphopt.tuner.storage import (fail_silent_trials, open_storage, opened,
                                     optimize_failing_on_interrupt, setup_lock, storage_url)
from graphopt.tuner.subgraph_job import (STANDS_FOR, SubgraphJob, checked_target, study_name_for,
                                         study_names)
from graphopt.tuner.subgraph_space import (Recorder, Space, build_space, gate_for,
                                           pass_options_for, space_from_json, space_json)
from graphopt.tuner.workers import supervise, worker_process

CHECK_RTOL, CHECK_ATOL = 1e-3, 1e-4
# A measured best must beat the default by this much when the two are re-timed side by side:
# two byte-identical models differed by 1.4-1.7% in bench/precision.py's interleaved runs.
MIN_MEASURED_GAIN = 0.02
WARMUP_RUNS = 2


@dataclass
class Scored:
    params: dict
    seconds: float
    by_device: dict[str, float] = field(default_factory=dict)


@dataclass
class SubgraphResult:
    study_name: str
    space: Space
    default: Scored
    best: Scored
    trials: int
    history: list[float]
    confirmed: tuple[float, float] | None = None  # measured: interleaved (default, best) medians
    hint: str = ""  # the default compile's nodes that fell back for dynamic shapes, and pins

    @property
    def kept_default(self) -> bool:
        """The re-timing found the search's best less than MIN_MEASURED_GAIN faster than the
        default: noise had won."""
        return self.confirmed is not None \
            and self.confirmed[0] < self.confirmed[1] * (1 + MIN_MEASURED_GAIN)

    @property
    def chosen(self) -> dict:
        """The decisions `optimize --tuning-db` applies."""
        return self.default.params if self.kept_default else self.best.params

    @property
    def speedup(self) -> float:
        """The chosen compile's over the default's (1.0 when the default is kept)."""
        if self.kept_default:
            return 1.0
        default, best = self.confirmed or (self.default.seconds, self.best.seconds)
        # A compile that prices at nothing (every output folded to a constant, or a graph
        # input passed through) has nothing to speed up.
        return default / best if best > 0 else 1.0

    def changes(self) -> list[tuple[str, Any, Any]]:
        """(decision, default, chosen) for every decision the chosen compile sets differently."""
        defaults = self.space.default_params()
        return [(name, value, self.chosen.get(name, value))
                for name, value in defaults.items() if self.chosen.get(name, value) != value]


def _references_files(data: bytes) -> bool:
    """Whether the serialized model keeps tensors in external files."""
    import onnx
    from google.protobuf.message import DecodeError

    from graphopt.errors import InputError
    from graphopt.ir.onnx_io import check_no_external_references

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        return False  # not a model: the compile says what is wrong with it
    try:
        check_no_external_references(proto)
    except InputError:
        return True
    return False


class Evaluator:
    """Compiles a job's model under given decisions and scores the result."""

    def __init__(self, job: SubgraphJob):
        self.job = job
        self.target = checked_target(job)
        # Compiled from memory, read once; a model with external data from its path, since
        # bytes name no folder to find that data in. Parsed first, so that a missing, empty or
        # foreign file is named by its path (the bytes are the file's own: the knowledge base
        # finds a model by their sha256, as optimize --tuning-db hashes the file).
        read_model_proto(job.model_path, load_external=False)
        with open(job.model_path, "rb") as f:
            self.data = f.read()
        self.source = job.model_path if _references_files(self.data) else self.data
        self.proto = self.feeds = self.reference = None
        self._measured: dict = {}  # the original's own rounding, measured once (_once)

    def compile(self, params: dict | None, space: Space | None, gate=None):
        from graphopt.compiler import optimize

        if params is not None and space is not None:
            gate, options = gate_for(params, space), pass_options_for(params, space)
        else:
            options = None
        return optimize(self.source, level=self.job.level, input_shapes=self.job.input_shapes,
                        target=self.target, rewrite_gate=gate, pass_options=options,
                        allow_custom_ops=self.job.allow_custom_ops)

    def score(self, result) -> tuple[float, dict[str, float]]:
        if self.job.objective == "measured":
            return self._measure(result), {}
        return self._estimate(result)

    def _estimate(self, result) -> tuple[float, dict[str, float]]:
        from graphopt.tuner.model import model_estimate

        tilings = None
        if self.job.tuning_db:
            from graphopt.tuner.kb import tuned_tilings
            # Another client's trial is left out, as optimize --tuning-db leaves it.
            tilings = tuned_tilings(self.job.tuning_db, result.model, result.partitioning,
                                    skipped=[])
        estimate = model_estimate(result.model, result.partitioning, tilings)
        by_device: dict[str, float] = {}
        for row in estimate.rows:
            key = "transfers" if row.kind == "transfer" else row.device
            by_device[key] = by_device.get(key, 0.0) + row.seconds
        return estimate.seconds, by_device

    def _measure(self, result) -> float:
        session = self._session(result)
        try:
            return _median_run(session, self.feeds, self.job.repeat)
        finally:
            del session

    def _session(self, result):
        """The candidate saved and loaded as an .om, its outputs checked against the original."""
        from graphopt import load, numerics
        from graphopt.compile_save import save

        if self.feeds is None:
            import onnx

            self.proto = (onnx.load(self.source) if isinstance(self.source, str)  # with its data
                          else onnx.load_from_string(self.data))
            shapes = None
            if self.job.input_shapes:
                from graphopt.input_shapes import parse_input_shapes
                shapes = parse_input_shapes(self.job.input_shapes)
            self.feeds = numerics.random_feeds(self.proto, seed=0, shapes=shapes)
            self.reference = numerics.run(self.proto, self.feeds)
        with scratch_folder("graphopt-tune-") as tmp, scratch_writes():
            path = os.path.join(tmp, "candidate.om")
            save(result, path)
            session = load(path, intra_op_num_threads=self.job.threads)
            actual = session.run(self.feeds)
        problem = self._beyond_rounding(actual)
        if problem:
            raise optuna.TrialPruned(f"outputs differ from the original: {problem}")
        for _ in range(WARMUP_RUNS):
            session.run(self.feeds)
        return session

    def _beyond_rounding(self, actual: dict):
        """The first output outside rtol/atol that rounding does not explain, None when all
        pass: as --verify judges a compile, so a detector whose box decoding moves by what
        onnxruntime's own optimizer moves it (YOLO's 0.035 on 900-pixel coordinates) is
        tuned, not pruned. The original's run at ORT_ENABLE_ALL and its weights' rounding are
        measured once, for every trial."""
        from graphopt import numerics
        from graphopt.rounding import weight_rounding, within_rounding

        problems = numerics.compare(self.reference, actual, CHECK_RTOL, CHECK_ATOL)
        if not problems:
            return None
        failing = [name for name in self.reference if numerics.compare(
            {name: self.reference[name]}, {name: actual[name]}, CHECK_RTOL, CHECK_ATOL)]
        judge = {"rtol": CHECK_RTOL, "atol": CHECK_ATOL, "min_cosine": None}
        explained = within_rounding(
            self.proto, self.feeds, self.reference, actual, failing, judge,
            own=lambda: self._once("own", lambda: numerics.run(self.proto, self.feeds, "all")),
            sensitivity=lambda: self._once("weights",
                                           lambda: weight_rounding(self.proto, self.feeds)))
        return None if explained is not None else problems[0]

    def _once(self, key: str, measure):
        if key not in self._measured:
            self._measured[key] = measure()
        return self._measured[key]


def _median_run(session, feeds, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def discover(evaluator: Evaluator) -> tuple[Space, Scored, str]:
    """Record the default compile's tunable rewrites into a Space; score that compile; and
    say, for an NPU target, which nodes it left on the host for dynamic shapes."""
    recorder = Recorder(evaluator.job.granularity)
    result = evaluator.compile(None, None, gate=recorder)
    passes = {record.name for record in result.log.records}
    npu = evaluator.target.device(evaluator.target.primary).kind == "npu"
    space = build_space(recorder, result.partitioning, elementwise="FuseElementwise" in passes,
                        npu=npu)
    seconds, by_device = evaluator.score(result)
    hint = dynamic_hint(result.model, result.partitioning, result.log) if npu else ""
    return space, Scored(space.default_params(), seconds, by_device), hint


def _discover_in(study: optuna.Study, store, evaluator: Evaluator) -> tuple[Space, str]:
    """discover() for the new `study`, which goes again if it fails: an empty study left
    behind read as a job run with no results, in `kb list` too."""
    try:
        space, _, hint = discover(evaluator)
    except BaseException as exc:
        if not study.get_trials(deepcopy=False):
            optuna.delete_study(study_name=study.study_name, storage=store)
        if isinstance(exc, optuna.TrialPruned):  # the default compile fails the check itself
            raise VerificationError(
                f"--objective measured: the default compile's {exc}, on the seeded random "
                "inputs every trial is checked on, beyond what rounding explains (graphopt "
                "optimize --verify judges it alike); a study times only compiles that compute "
                "the original's outputs") from None
        raise
    return space, hint


def _distributions(space: Space) -> dict[str, optuna.distributions.CategoricalDistribution]:
    """The space's decisions as Optuna parameters: a switch per rewrite group, then the knobs."""
    switches = {group.param: optuna.distributions.CategoricalDistribution([True, False])
                for group in space.groups}
    return {**switches, **{knob: optuna.distributions.CategoricalDistribution(choices)
                           for knob, choices in space.knobs.items()}}


def _objective(evaluator: Evaluator, space: Space):
    distributions = _distributions(space)

    def objective(trial: optuna.Trial) -> float:
        params = {name: trial.suggest_categorical(name, d.choices)
                  for name, d in distributions.items()}
        # A decision set scored before (the sampler repeats itself in a small space) keeps its
        # score: timed again, a measured study spent seconds on it, and the best of several
        # timings of one compile was its luckiest, not its speed.
        same = next((t for t in trial.study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.params == params and t.value is not None), None)
        if same is not None:
            trial.set_user_attr("by_device", same.user_attrs.get("by_device", {}))
            trial.set_user_attr("repeats", same.number)
            return same.value
        seconds, by_device = evaluator.score(evaluator.compile(params, space))
        trial.set_user_attr("by_device", by_device)
        return seconds
    return objective


def _add_default(study: optuna.Study, evaluator: Evaluator, space: Space) -> None:
    """Score the default compile and add it, completed, as the study's yardstick. Done under
    the setup lock: queued for a run to pick up instead, two runs started together on one
    SQLite file could both pick it up, and one then died with `Cannot tell a COMPLETE
    trial`, as op tuning's defaults once did."""
    params = space.default_params()
    seconds, by_device = evaluator.score(evaluator.compile(params, space))
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions=_distributions(space), value=seconds,
        user_attrs={"default": True, "by_device": by_device}))


def tune_subgraph(job: SubgraphJob, *, trials: int = 50, timeout: float | None = None,
                  seed: int = 0, storage: Any = None, study_name: str | None = None,
                  sampler: str = "tpe", progress: Progress | None = None, workers: int = 1,
                  confirm_rounds: int = 5,
                  recording: Callable[[], None] | None = None) -> SubgraphResult:
    """Run `trials` more trials of the job's study (created with the default compile as trial
    0) and return default vs best. Reruns on the same storage resume the study. With the
    measured objective the default and the best are re-timed alternately `confirm_rounds`
    times at the end, since timings drift over a long search. `recording` is called before a
    new study's default compile records which decisions there are."""
    if trials < 0:
        raise OptionError(f"trials must be ≥ 0, got {trials}")
    if not 1 <= workers <= THREAD_LIMIT:  # each is a process; more would swamp any machine
        raise OptionError(f"workers must be from 1 to {THREAD_LIMIT}, got {workers}")
    if workers > 1 and job.objective == "measured":
        raise OptionError("--workers > 1 with --objective measured: workers timing candidates "
                          "side by side on one machine disturb each other's timings; use one "
                          "worker per machine with a shared --storage")
    evaluator = Evaluator(job)
    key = study_name_for(job, evaluator.target.name)
    name = study_name or key
    if name not in study_names(job, evaluator.target.name) and (
            is_signature(name) or is_subgraph_study_name(name)):
        # The job that names its study so by default (op tuning of that kernel, subgraph
        # tuning of that model) would load this one and mix its trials with this job's.
        what = "a kernel's signature" if is_signature(name) else "another subgraph job's study"
        raise OptionError(f"--study {name}: that name is {what}; this job tunes {key}")
    with opened(storage) as store, optuna_quiet():
        with setup_lock(getattr(store, "url", "")):  # one process sets a new study up
            study = optuna.create_study(storage=store, study_name=name, direction="minimize",
                                        load_if_exists=True)
            recorded = {"target": evaluator.target.name, "level": job.level,
                        "objective": job.objective, "input_shapes": job.input_shapes}
            if name != key:
                _check_named_study(study, key, recorded)
            fail_silent_trials(study)
            if "space" in study.user_attrs:
                space = space_from_json(study.user_attrs["space"])
            else:
                if recording is not None:
                    recording()
                space, hint = _discover_in(study, store, evaluator)
                study.set_user_attr("space", space_json(space))
                study.set_user_attr("hint", hint)  # said by every run on the study
                study.set_user_attr("job", recorded)
                # What a study named otherwise (--study NAME) holds: the knowledge base finds
                # it by this, as it finds a study under this name.
                study.set_user_attr(STANDS_FOR, key)
            # The default is the study's yardstick: without it the best trial passed as the
            # default (1.000x) and a measured best skipped its side-by-side re-timing. A study
            # whose default failed (an earlier release queued it, and a stopped run left it
            # failed) gets it again.
            added_default = _default_trial(study, _DEFAULT_PENDING) is None
            if added_default:
                _add_default(study, evaluator, space)
        if job.objective == "estimate" and not added_default:
            _check_estimates_still_hold(study, evaluator, space)
        if space.size <= 1:  # no decision to switch: the default compile, priced once, is all
            trials = int(added_default) if _best_value(study) < math.inf else min(trials, 1)
        # The default this run added is its first trial, as op tuning counts it.
        budget = max(trials - added_default, 0)
        done_before = len(study.get_trials(deepcopy=False))
        # Progress counts this run's trials, the default it added among them.
        started_before = len(study.get_trials(deepcopy=False, states=_STARTED)) - added_default
        objective = _objective(evaluator, space)
        best = [_best_value(study)]
        ran = [int(added_default)]  # this run's trials: another run numbers trials too
        if progress is not None and added_default:
            progress(ran[0], trials, best[0])

        def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            ran[0] += 1
            if trial.state == optuna.trial.TrialState.COMPLETE and trial.value is not None:
                best[0] = min(best[0], trial.value)
            if progress is not None:
                progress(ran[0], trials, best[0])

        if workers == 1:
            study.sampler = RunSampler(sampler, seed + done_before, first_trial_number(study))
            optimize_failing_on_interrupt(study, objective, n_trials=budget, timeout=timeout,
                                          callbacks=[callback], gc_after_trial=False)
        else:
            _run_workers(study, objective, job, store, storage, name, budget, trials, timeout,
                         sampler, seed + done_before, workers, progress, started_before)
        result = _result(study, space)
        if job.objective == "estimate":
            result.best = simplify(evaluator, space, result.best)
        if job.objective == "measured" and confirm_rounds \
                and result.best.params != result.default.params:
            result.confirmed = confirm(evaluator, space, result.default.params, result.best.params,
                                       confirm_rounds)
        study.set_user_attr("chosen", result.chosen)
        # What the default and the chosen decisions cost, as tune prints them: simplify can end
        # below every trial, and a measured run's figures are the side-by-side re-timing's.
        default_seconds = result.confirmed[0] if result.confirmed else result.default.seconds
        study.set_user_attr("default_seconds", default_seconds)
        study.set_user_attr("chosen_seconds", default_seconds / result.speedup)
        return result


def _check_named_study(study: optuna.Study, key: str, job: dict) -> None:
    """OptionError unless the study of a --study NAME is new or a subgraph study of this job
    (model, pins, target, level, objective): another job's decisions, an op study's tilings
    or another program's trials would be mixed with these."""
    name, attrs = study.study_name, study.user_attrs
    if "shape" in attrs:
        raise OptionError(f"--study {name}: that is an op tuning study (a kernel's tilings); "
                          "name a new study")
    if "space" not in attrs:
        if study.get_trials(deepcopy=False):
            raise OptionError(f"--study {name}: that study holds trials graphopt's subgraph "
                              "tuning did not make (another program's?); name a new study")
        return
    held = attrs.get(STANDS_FOR)
    if held is None and _same_job(attrs.get("job"), job):  # an earlier graphopt's study
        study.set_user_attr(STANDS_FOR, key)
    elif held != key:
        raise OptionError(f"--study {name}: that study tunes "
                          f"{held or 'another model, target or level'}, not {key}; name a "
                          "new study")


def _same_job(recorded, job: dict) -> bool:
    return isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in job.items())


def _check_estimates_still_hold(study: optuna.Study, evaluator: Evaluator, space: Space) -> None:
    """Refuse to resume an estimated study whose default compile the cost model now prices
    otherwise: op tuning since has changed the knowledge base's tilings, and trials scored
    with the old ones would be compared with trials scored with the new."""
    default = _default_trial(study, (optuna.trial.TrialState.COMPLETE,))
    if default is None or default.value is None:
        return
    now, _ = evaluator.score(evaluator.compile(space.default_params(), space))
    if not math.isclose(now, default.value, rel_tol=1e-9):
        if evaluator.target.device(evaluator.target.primary).kind == "cpu":
            # The cpu target has no tilings: its figures are graphopt calibrate's.
            why = ("the CPU cost model now at {now} (graphopt calibrate --target cpu "
                   "since?): its trials would compare with new ones unfairly; name a new study "
                   "with --study")
        else:
            why = ("the knowledge base's tilings now at {now} (op tuning since?): its trials "
                   "would compare with new ones unfairly; name a new study with --study (op "
                   "tuning first, then subgraph tuning, prices every trial with the tuned "
                   "tilings)")
        raise OptionError(f"study {study.study_name} priced the default compile at "
                          f"{default.value * 1e6:.2f} µs, "
                          + why.format(now=f"{now * 1e6:.2f} µs"))


def _run_workers(study, objective, job, store, storage, name, trials, shown, timeout, sampler,
                 seed, workers, progress, started_before) -> None:
    """Run `trials` more trials on `workers` processes; progress counts this run's trials out
    of `shown`."""
    # A default an earlier release queued runs here first, so two workers cannot both pop it.
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    first = min(len(waiting), trials)
    if first:
        study.optimize(objective, n_trials=first, gc_after_trial=False)
    left = trials - first
    url = store.url if isinstance(store, optuna.storages.RDBStorage) else storage_url(storage)
    shares = [left // workers + (i < left % workers) for i in range(workers)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(job, url, name, share, timeout, sampler,
                                               seed + 1000 * (i + 1)))
             for i, share in enumerate(shares) if share]

    def tick() -> None:
        done = len(study.get_trials(deepcopy=False)) - started_before
        progress(min(done, shown), shown, _best_value(study))

    supervise(procs, tick if progress is not None else None, "subgraph tuning worker")


def _worker(job: SubgraphJob, url: str, name: str, trials: int, timeout: float | None,
            sampler: str, seed: int) -> None:
    with worker_process():
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        study = optuna.load_study(study_name=name, storage=open_storage(url),
                                  sampler=_make_sampler(sampler, seed))
        space = space_from_json(study.user_attrs["space"])
        optimize_failing_on_interrupt(study, _objective(Evaluator(job), space), n_trials=trials,
                                      timeout=timeout, gc_after_trial=False)


def _best_value(study: optuna.Study) -> float:
    values = [t.value for t in study.get_trials(deepcopy=False,
                                                states=(optuna.trial.TrialState.COMPLETE,))]
    return min((v for v in values if v is not None), default=float("inf"))


# A default trial in these states has run or will: one failed (interrupted) is queued again.
_DEFAULT_PENDING = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING,
                    optuna.trial.TrialState.RUNNING)


def _default_trial(study: optuna.Study, states) -> optuna.trial.FrozenTrial | None:
    return next((t for t in study.get_trials(deepcopy=False, states=states)
                 if t.user_attrs.get("default")), None)


def _scored(trial: optuna.trial.FrozenTrial) -> Scored:
    return Scored(dict(trial.params), float(trial.value),
                  dict(trial.user_attrs.get("by_device", {})))


def _result(study: optuna.Study, space: Space) -> SubgraphResult:
    completed = [t for t in study.get_trials(deepcopy=False,
                                             states=(optuna.trial.TrialState.COMPLETE,))
                 if t.value is not None]
    if not completed:
        raise OptionError(f"study {study.study_name}: no trial completed (see the pruned "
                          "trials' reasons in the storage)")
    default = next((t for t in completed if t.user_attrs.get("default")), None) or next(
        (t for t in completed if t.params == space.default_params()), None)  # the same compile
    if default is None:
        # Another run on the storage took the queued default and has not finished it: the
        # best trial is no yardstick for itself.
        # A killed run's trial stays RUNNING, as a live run's does, until its heartbeat's
        # grace has passed: only then can a run tell the two apart and queue it again.
        from graphopt.tuner.storage import GRACE_S

        raise OptionError(f"study {study.study_name}: its default compile has not completed "
                          "(another run on the storage is scoring it, or a run killed less "
                          f"than {GRACE_S} s before this one started left it running); run "
                          "again when it has, or after that time")
    top = min(completed, key=lambda t: (t.value, t.number))
    if top.params == default.params:
        top = default  # the sampler came back to the default: a faster timing of it is noise
    # Trials evaluated, as kb list counts them: not those failed or left running by a Ctrl-C.
    evaluated = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                         optuna.trial.TrialState.PRUNED))
    hint = study.user_attrs.get("hint")
    return SubgraphResult(study.study_name, space, _scored(default), _scored(top),
                          len(evaluated), history(study),
                          hint=hint if isinstance(hint, str) else "")


def simplify(evaluator: Evaluator, space: Space, best: Scored) -> Scored:
    """`best` with every change from the default that does not pay put back (the estimate is
    deterministic, so an equal score means the change does nothing): what remains changed is
    what made the difference. One compile per changed decision."""
    defaults = space.default_params()
    params = dict(best.params)
    for name, value in defaults.items():
        if params.get(name, value) == value:
            continue
        trial = {**params, name: value}
        seconds, by_device = evaluator.score(evaluator.compile(trial, space))
        if seconds <= best.seconds * (1 + 1e-9):
            params, best = trial, Scored(trial, seconds, by_device)
    return best


def confirm(evaluator: Evaluator, space: Space, default: dict, best: dict,
            rounds: int) -> tuple[float, float]:
    """Median seconds of the default and the best compile, timed alternately `rounds` times
    (each a median of `repeat` runs) so that drift hits both alike."""
    sessions = [evaluator._session(evaluator.compile(p, space)) for p in (default, best)]
    medians: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, session in enumerate(sessions):
            medians[i].append(_median_run(session, evaluator.feeds, evaluator.job.repeat))
    return statistics.median(medians[0]), statistics.median(medians[1])
