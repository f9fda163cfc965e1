"""What a compile reads of the subgraph studies in a knowledge base: the decisions tuned for its
model, target, level and pins, or a note on why none apply."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from graphopt.compile_tuning import Decisions
from graphopt.option_names import option, setting
from graphopt.tuner.optuna_import import optuna
from graphopt.tuner.storage import opened
from graphopt.tuner.subgraph_job import STANDS_FOR, SubgraphJob, model_key, study_names
from graphopt.tuner.subgraph_space import GRANULARITIES, gate_for, pass_options_for, space_from_json


def tuned_levels(storage: Any, job: SubgraphJob, target_name: str) -> list[int]:
    """The -O levels at which the storage holds subgraph studies of the job's model and target."""
    with opened(storage, read_only=True) as store:
        names = set(studies_by_job(store))
    return [level for level in range(4) if any(
        name in names
        for objective in ("measured", "estimate") for granularity in GRANULARITIES
        for name in study_names(replace(job, level=level, objective=objective,
                                         granularity=granularity), target_name))]


def decisions_for(storage: Any, model: str | bytes, target_name: str, level: int,
                  input_shapes: str | None) -> Decisions:
    """The subgraph decisions `graphopt tune --job subgraph` chose for this model (a file's
    path, or its serialized bytes) with these --input-shape pins, on this target at this
    level; when there are none but other levels have some, the note says which."""
    job = (SubgraphJob("<model>", target_name, level, input_shapes,
                       model_digest=hashlib.sha256(model))
           if isinstance(model, bytes) else SubgraphJob(model, target_name, level, input_shapes))
    passed_over: list[str] = []
    slower: list[str] = []
    found = best_decisions(storage, job, target_name, passed_over, slower)
    if found is not None:
        gate, pass_options, study = found
        others = f" (cheaper than those of {', '.join(slower)})" if slower else ""
        return Decisions(gate, pass_options, study,
                         f"applying the subgraph decisions of {study}{others}")
    if passed_over:  # a study at this very level: saying another level holds it would mislead
        return Decisions(note=(
            f"{option('tuning_db')}: subgraph study {passed_over[0]}; no subgraph decisions "
            "apply to this compile (running its tune again completes the study)"))
    levels = [n for n in tuned_levels(storage, job, target_name) if n != level]
    if levels:
        return Decisions(note=(
            f"{option('tuning_db')} holds subgraph decisions for this model on {target_name} at "
            f"{', '.join(f'-O{n}' for n in levels)}, not at -O{level}: they apply to a compile "
            "at the level they were tuned for"))
    targets = tuned_targets(storage, job, target_name)
    if targets:
        return Decisions(note=(
            f"{option('tuning_db')} holds subgraph decisions for this model on "
            f"{', '.join(targets)}, not on {target_name}: they apply to a compile for the "
            "target they were tuned for"))
    pins = tuned_pins(storage, job, target_name)
    if pins:
        given = [setting("input_shapes", p) if p else f"no {option('input_shapes')}"
                 for p in pins]
        return Decisions(note=(
            f"{option('tuning_db')} holds subgraph decisions for this model on {target_name} at "
            f"-O{level} tuned with {' / '.join(given)}, where this compile has "
            f"{_these_pins(input_shapes)}: they apply to a compile with the pins they were "
            "tuned with"))
    elsewhere = [(other, p) for other in range(4) if other != level
                 for p in tuned_pins(storage, replace(job, level=other), target_name)]
    if elsewhere:  # another level and other pins both: it had said nothing
        given = [f"-O{other} with " + (setting("input_shapes", p) if p else
                                       f"no {option('input_shapes')}") for other, p in elsewhere]
        return Decisions(note=(
            f"{option('tuning_db')} holds subgraph decisions for this model on {target_name} "
            f"tuned at {' / '.join(given)}, where this compile is at -O{level} with "
            f"{_these_pins(input_shapes)}: they apply to a compile at the level and with the "
            "pins they were tuned with"))
    return Decisions()


def _these_pins(input_shapes: str | None) -> str:
    """This compile's pins as the caller gave them ("these pins" had read as though pins that
    restate a static model's shape changed it)."""
    return setting("input_shapes", input_shapes) if input_shapes else \
        f"no {option('input_shapes')}"


def tuned_targets(storage: Any, job: SubgraphJob, target_name: str) -> list[str]:
    """The other targets the storage holds subgraph studies of the job's model and pins for,
    each with its levels (`ascend310 (-O3)`)."""
    own = {model_key(job, legacy) for legacy in (False, True)}
    found: dict[str, set[str]] = {}
    with opened(storage, read_only=True) as store:
        for name in studies_by_job(store):
            parts = name.split("/")
            if len(parts) >= 5 and parts[0] == "subgraph" and parts[-3] in own:
                target = "/".join(parts[1:-3])
                if target != target_name:
                    found.setdefault(target, set()).add(parts[-2].replace("O", "-O", 1))
    return [f"{target} ({', '.join(sorted(levels))})" for target, levels in sorted(found.items())]


def tuned_pins(storage: Any, job: SubgraphJob, target_name: str) -> list[str]:
    """The --input-shape pins ("" for none) of the storage's subgraph studies of the job's model,
    target and level under other pins than the job's: a study's key hashes the model with its
    pins, so each recorded pin set is tried with this model."""
    own = {model_key(job, legacy) for legacy in (False, True)}
    found: dict[str, None] = {}
    with opened(storage, read_only=True) as store:
        for summary in optuna.get_all_study_summaries(store, include_best_trial=False):
            recorded = summary.user_attrs.get("job")
            name = summary.user_attrs.get(STANDS_FOR, summary.study_name)
            parts = name.split("/") if isinstance(name, str) else []
            if not isinstance(recorded, dict) or len(parts) < 5 or parts[0] != "subgraph" \
                    or "/".join(parts[1:-3]) != target_name or parts[-2] != f"O{job.level}":
                continue
            pins = recorded.get("input_shapes")
            if pins is not None and not isinstance(pins, str):
                continue  # not a study graphopt wrote
            theirs = replace(job, input_shapes=pins)
            if parts[-3] not in own and parts[-3] in {model_key(theirs, legacy)
                                                      for legacy in (False, True)}:
                found[pins or ""] = None
    return sorted(found)


def best_decisions(storage: Any, job: SubgraphJob, target_name: str,
                   passed_over: list[str] | None = None, slower: list[str] | None = None):
    """(rewrite gate, pass options, study name) of the job's tuned decisions (its model, target
    and level), preferring a measured study to an estimated one (their figures do not compare)
    and, between studies of one objective (the rule and shape granularities, the newest study
    of each), the one whose choice costs least; None when the storage has no such study. The
    gate and options go to optimize(rewrite_gate=…, pass_options=…). `passed_over` gets
    "<study> <why>" for each study of the job that was not applied (no completed trial, or a
    measured run stopped before its re-timing), `slower` "<study> (<its cost>)" for each one
    that a cheaper choice beat."""
    with opened(storage, read_only=True) as store:
        return _best_decisions(store, job, target_name,
                               passed_over if passed_over is not None else [],
                               slower if slower is not None else [])


def _best_decisions(store, job: SubgraphJob, target_name: str, passed_over: list[str],
                    slower: list[str]):
    standing = studies_by_job(store)
    for objective in ("measured", "estimate"):
        found = []  # (cost of the choice, study name, gate, pass options)
        for granularity in GRANULARITIES:
            for key in study_names(replace(job, objective=objective, granularity=granularity),
                                   target_name):
                applied = next((choice for choice in (
                    _choice(store, name, objective, passed_over)
                    for name in reversed(standing.get(key, [])))  # the newest first
                    if choice is not None), None)
                if applied is not None:
                    found.append(applied)
        if found:
            cost, name, gate, options = min(found, key=lambda entry: entry[0])
            slower += [f"{other} ({_cost(seconds, objective)})"
                       for seconds, other, _, _ in found if other != name]
            return gate, options, name
    return None


def _choice(store, name: str, objective: str, passed_over: list[str]):
    """(cost, name, gate, pass options) of study `name`'s choice; None, and why in
    `passed_over`, when it has none to apply."""
    study = optuna.load_study(study_name=name, storage=store)
    if "space" not in study.user_attrs:
        return None
    completed = [t for t in study.get_trials(deepcopy=False,
                                             states=(optuna.trial.TrialState.COMPLETE,))
                 if t.value is not None]
    if not completed:
        passed_over.append(f"{name} has no completed trial (its run stopped before the default "
                           "compile was scored)")
        return None
    # The last run's choice: its best, unless re-timing showed the default was as fast.
    chosen = study.user_attrs.get("chosen")
    if chosen is None and objective == "measured":
        # A run stopped before its re-timing: a best by noise, unconfirmed.
        passed_over.append(f"{name} is not confirmed: its measured run stopped before the "
                           "side-by-side re-timing, and a best that may have won by noise "
                           "alone is not applied")
        return None
    best = min(completed, key=lambda t: (t.value, t.number))
    seconds = study.user_attrs.get("chosen_seconds", best.value if chosen is None else None)
    chosen = chosen or best.params
    space = space_from_json(study.user_attrs["space"])
    cost = seconds if isinstance(seconds, (int, float)) else float("inf")
    return cost, name, gate_for(chosen, space), pass_options_for(chosen, space)


def _cost(seconds: float, objective: str) -> str:
    if seconds == float("inf"):
        return "no recorded cost"
    return f"{seconds * 1e3:.2f} ms measured" if objective == "measured" \
        else f"{seconds * 1e6:.2f} µs estimated"


def studies_by_job(store) -> dict[str, list[str]]:
    """Per default study name (study_name_for), the studies tuning that job: the one of that
    name and those named otherwise (--study NAME), in the order they were created."""
    by_job: dict[str, list[tuple[int, str]]] = {}
    for summary in optuna.get_all_study_summaries(store, include_best_trial=False):
        key = summary.user_attrs.get(STANDS_FOR, summary.study_name)
        by_job.setdefault(key, []).append((summary._study_id, summary.study_name))
    return {key: [name for _, name in sorted(studies)] for key, studies in by_job.items()}
