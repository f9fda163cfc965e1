"""The tuning knowledge base: the Optuna storage itself, one study per kernel signature.

best_tilings reads it, export_kb/import_kb move it as JSON, list_kb summarizes it, and
tuned_tilings maps a compiled model's cube nodes to the tilings it holds for their signatures.
An imported entry becomes a completed trial of its signature's study, timed by this cost model,
so later tuning of that signature continues from it.

    {"format": "graphopt-kb/1",
     "kernels": {"ascend310/gemm/b1_m256_k256_n256/float16":
                   {"tiling": {"base_m": 256, …}, "seconds": 2.37e-05, "cycles": 6704.8,
                    "default_seconds": 2.90e-05, "trials": 50}}}
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from graphopt.atomic import atomic_write_bytes
from graphopt.errors import InputError, OptionError
from graphopt.input_files import refuse_device
from graphopt.table import natural_key
from graphopt.tuner.npu_model import estimate
from graphopt.tuner.optuna_import import optuna, optuna_quiet
from graphopt.tuner.search import (
    PARAMS,
    best_priced,
    open_study,
    outside_space,
    search_choices,
    step_distributions,
    tiling_params,
    trial_tiling,
    tuned_on_another_profile,
    written_trials,
)
from graphopt.tuner.signature import (is_signature, legacy_signature, model_kernels,
                                      parse_signature, signature)
from graphopt.tuner.storage import opened, setup_lock
from graphopt.tuner.tiling import Tiling, cube_dtype, default_tiling, tiling_from

if TYPE_CHECKING:
    from graphopt.ir import Model
    from graphopt.partition.partitioner import Partitioning

FORMAT = "graphopt-kb/1"
_COMPLETE = (optuna.trial.TrialState.COMPLETE,)
# Trials that ran to an answer (a cost, or a tiling outside the space): what a study's trial
# count shows. One a worker was killed in (FAIL), or still running, did no work to count.
_EVALUATED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


# The study attribute naming the kernel of a study `tune --study NAME` named otherwise.
SIGNATURE_ATTR = "signature"
MAX_DIM = 2 ** 31 - 1  # the largest kernel dim an import takes: CANN's tilings index in int32


def _kernel_studies(storage, target: str | None = None) -> list[tuple[str, str]]:
    """(study name, kernel signature) of every operator-tuning study (of `target`'s kernels),
    by signature: a study named by its signature, or one `--study NAME` named, which records
    its signature as an attribute."""
    found = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        name = summary.study_name
        # The recorded signature first: a name only spells one (or an older --study NAME).
        sig = summary.user_attrs.get(SIGNATURE_ATTR) or (name if is_signature(name) else None)
        if isinstance(sig, str) and is_signature(sig, target):
            found.append((name, sig))
    return sorted(found, key=lambda pair: (natural_key(pair[1]), pair[0] != pair[1], pair[0]))


def _completed(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=_COMPLETE) if t.value is not None]


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    done = _completed(study)
    return min(done, key=lambda t: (t.value, t.number)) if done else None


def _default(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    return next((t for t in _completed(study) if t.user_attrs.get("default")), None)


def _best_written(study: optuna.Study, name: str, skipped: list[str] | None
                  ) -> tuple[optuna.trial.FrozenTrial | None, Tiling | None]:
    """(trial, tiling) of the best completed trial graphopt wrote, (None, None) when there is
    none; `skipped` as for written_trials."""
    written = written_trials(_completed(study), name, skipped)
    return written[0] if written else (None, None)


def best_tilings(storage: Any, target: str, *,
                 skipped: list[str] | None = None) -> dict[str, tuple[Tiling, float]]:
    """signature -> (best tiling, its estimated seconds) for every study of `target`'s
    kernels that has a completed trial. A trial graphopt did not write is an OptionError, or,
    given a `skipped` list, left out and named there ("study #number")."""
    out = {}
    with opened(storage, read_only=True) as store:
        for name, sig in _kernel_studies(store, target):
            study = optuna.load_study(study_name=name, storage=store)
            written = written_trials(_completed(study), name, skipped)
            if written and (sig not in out or written[0][0].value < out[sig][1]):
                best, tiling = written[0]
                out[sig] = (tiling, float(best.value))
    return out


def stored_tilings(storage: Any, target: str, *,
                   skipped: list[str] | None = None) -> dict[str, list[Tiling]]:
    """signature -> every tiling the completed trials of `target`'s studies of that kernel
    hold, stored best first. `skipped` as for best_tilings."""
    out: dict[str, list[Tiling]] = {}
    with opened(storage, read_only=True) as store:
        for name, sig in _kernel_studies(store, target):
            study = optuna.load_study(study_name=name, storage=store)
            written = written_trials(_completed(study), name, skipped)
            out.setdefault(sig, []).extend(tiling for _, tiling in written)
    return {sig: tilings for sig, tilings in out.items() if tilings}


def tuned_tilings(storage: Any, model: Model, partitioning: Partitioning, *,
                  skipped: list[str] | None = None,
                  no_gain: list[str] | None = None,
                  other_dtype: dict[str, str] | None = None,
                  legacy: list[str] | None = None) -> dict[str, Tiling]:
    """node name -> tuned tiling for the NPU cube nodes of a compiled model whose signature
    the knowledge base holds: of its stored tilings, the one this cost model prices lowest
    (search.best_priced, as tune's table). Nodes it has not seen keep the default (absent
    here), and so do nodes none of whose stored tilings fits this profile's buffers (studies
    are keyed by the target's name, which an edited copy of a profile keeps) and beats the
    default under this cost model; those nodes go into `no_gain`. A node whose shape the
    knowledge base holds in another dtype only (an int8 compile's tuning, applied to the float
    one) goes into `other_dtype`, with that dtype. A conv node whose kernel the knowledge base
    holds only under the signature an earlier graphopt wrote, without the conv's geometry
    (signature.legacy_signature), keeps the default and goes into `legacy`: that tuning was
    priced as if the conv read its im2col matrix from GM, and one such key stood for convs
    now priced apart. `skipped` as for best_tilings."""
    target = partitioning.target
    stored = stored_tilings(storage, target.name, skipped=skipped)
    dtypes: dict[str, list[str]] = {}  # a signature without its dtype -> the dtypes stored
    for sig in stored:
        shape, _, dtype = sig.rpartition("/")
        dtypes.setdefault(shape, []).append(dtype)
    tilings = {}
    for group in model_kernels(model, partitioning):
        if group.signature not in stored:
            held = dtypes.get(group.signature.rpartition("/")[0])
            if held and other_dtype is not None:
                other_dtype.update({node: held[0] for node in group.nodes})
            elif legacy is not None and legacy_signature(group.signature) in stored:
                legacy.extend(group.nodes)
            continue
        device = target.device(group.device)
        tiling, _ = best_priced(stored[group.signature], group.shape, device)
        if tiling != default_tiling(group.shape, device):
            tilings.update({node: tiling for node in group.nodes})
        elif no_gain is not None:
            no_gain.extend(group.nodes)
    return tilings


def _evaluated(study) -> int:
    return len(study.get_trials(deepcopy=False, states=_EVALUATED))


def list_kb(storage: Any, *, skipped: list[str] | None = None, reprice: bool = True) -> list[dict]:
    """One row per operator-tuning study: signature, study (its name, which is the signature
    unless `tune --study` named it), trials, default_seconds, best_seconds, tiling and speedup
    (default / best). For a built-in target's kernel these are this cost model's prices of the
    default and of the stored tiling a compile applies (search.best_priced), "repriced" True,
    "stored" the figures the study holds and "stale" whether they differ (another graphopt's
    cost model filled it). For another target's, the stored figures: default_seconds None
    when the default was never evaluated there, speedup None without a default. A trial
    graphopt did not write is an OptionError, or, given a `skipped` list, left out and named
    there ("study #number"), as a compile leaves it out. `reprice=False` keeps the stored
    figures of every row (an .om compiled with a profile file named like a built-in: its
    tilings were priced, and chosen, on that file's figures, not the built-in's)."""
    rows = []
    devices: dict[str, Any] = {}
    with opened(storage, read_only=True) as store:
        for name, sig in _kernel_studies(store):
            study = optuna.load_study(study_name=name, storage=store)
            named_before = len(skipped) if skipped is not None else 0
            best, tiling = _best_written(study, name, skipped)
            # The trials graphopt wrote: those left out are not this study's tuning.
            left_out = len(skipped) - named_before if skipped is not None else 0
            default = _default(study)
            row = {
                "signature": sig, "study": name, "trials": _evaluated(study) - left_out,
                "default_seconds": default.value if default else None,
                "best_seconds": best.value if best else None,
                "tiling": str(tiling) if best else None,
                "speedup": default.value / best.value if best and default else None,
                "repriced": False}
            device = _builtin_device(sig, devices) if reprice else None
            if device is not None and best is not None:
                _reprice(row, study, device)
            rows.append(row)
    return rows


def kernel_history(study: optuna.Study, row: dict, devices: dict) -> list[float]:
    """The best seconds after each trial of a list_kb row's study, priced as the row is: by
    this cost model for a built-in target's kernel (search.priced_history, as tune's --plot
    draws it), the stored figures otherwise."""
    from graphopt.tuner.search import history, priced_history

    if not row.get("repriced"):
        return history(study)
    sig = row["signature"]
    return priced_history(study, parse_signature(sig)[2], _builtin_device(sig, devices))


def _builtin_device(sig: str, cache: dict) -> Any:
    """The cube device of a built-in target's kernel signature, None for another target's."""
    from graphopt.partition.target import builtin_targets, load_target

    target_name = parse_signature(sig)[0]
    if target_name not in cache:
        target = load_target(target_name) if target_name in builtin_targets() else None
        cache[target_name] = target.device(target.primary) if target else None
    return cache[target_name]


def _applied(study: optuna.Study, name: str, sig: str, device) -> tuple[Tiling, Any, float]:
    """(tiling, its estimate, the default's seconds) of the stored tiling a compile applies
    for a study's kernel, all priced by this cost model."""
    shape = parse_signature(sig)[2]
    written = written_trials(_completed(study), name, skipped=[])
    tiling, _ = best_priced((t for _, t in written), shape, device)
    return tiling, estimate(shape, tiling, device), estimate(shape, None, device).seconds


def _reprice(row: dict, study: optuna.Study, device) -> None:
    """Row figures priced by this cost model, as a compile applies them."""
    tiling, priced, default_seconds = _applied(study, row["study"], row["signature"], device)
    seconds = priced.seconds
    stored = {key: row[key] for key in ("default_seconds", "best_seconds", "tiling")}
    row.update(default_seconds=default_seconds, best_seconds=seconds, tiling=str(tiling),
               speedup=default_seconds / seconds, repriced=True, stored=stored)
    row["stale"] = stored["tiling"] != row["tiling"] or not _close(stored["best_seconds"],
                                                                   seconds) \
        or (stored["default_seconds"] is not None
            and not _close(stored["default_seconds"], default_seconds))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def list_subgraph_studies(storage: Any) -> list[dict]:
    """One row per subgraph-tuning study (`graphopt tune --job subgraph`): study, trials,
    default_seconds and best_seconds, the chosen decisions' (None where absent)."""
    rows = []
    with opened(storage, read_only=True) as store:
        # By the space they hold: a study named otherwise (--study NAME) is one too.
        for name in sorted(s.study_name for s in optuna.get_all_study_summaries(
                store, include_best_trial=False) if "space" in s.user_attrs):
            rows.append(subgraph_row(optuna.load_study(study_name=name, storage=store)))
    return rows


def subgraph_row(study: optuna.Study) -> dict:
    """list_subgraph_studies' row of one subgraph study: default_seconds and best_seconds are
    those of the default and of the decisions its last run chose (after simplification, or
    the default's when re-timing kept it), as tune prints them (a measured run's, re-timed side
    by side) and a compile applies them; the trials' when none is recorded. `confirmed` is
    False for a measured study whose run stopped before its re-timing, which a compile does
    not apply."""
    best, default = _best(study), _default(study)
    attrs = study.user_attrs
    job = attrs.get("job")
    measured = isinstance(job, dict) and job.get("objective") == "measured"
    return {"study": study.study_name, "trials": _evaluated(study),
            "default_seconds": attrs.get("default_seconds", default.value if default else None),
            "best_seconds": attrs.get("chosen_seconds", best.value if best else None),
            "confirmed": attrs.get("chosen") is not None or not measured}


def check_export_path(path: str | os.PathLike) -> None:
    """Refuse an export destination that cannot be written: a directory, or a file in a
    directory that does not exist."""
    text = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise OptionError(f"{text}: is a directory, expected the export's file path")
    if not os.path.isdir(directory):
        raise OptionError(f"{text}: directory {directory} does not exist")
    refusal = replacement_refusal(text)
    if refusal:
        raise OptionError(f"{text}: {refusal}")


def replacement_refusal(path: str) -> str | None:
    """Why an export must not replace the file at `path` (an SQLite database, another
    knowledge base, was replaced with exit 0; so was a model), None when there is none, it is
    empty or it is an earlier export."""
    why = _not_an_export(path)
    return f"{why}; kb export would replace it with JSON: remove it first or export to " \
        "another path" if why else None


def _is_sqlite(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _not_an_export(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except FileNotFoundError:
        return None
    except OSError:
        return None  # the write reports what is wrong with it
    if not head:
        return None
    if head.startswith(b"SQLite format 3\x00"):
        return "is an SQLite database (a knowledge base, or other data)"
    if head.lstrip().startswith(b"{") and FORMAT.encode() in head:
        return None
    return "exists and is not a knowledge-base export"


def export_kb(storage: Any, path: str | os.PathLike, *,
              skipped: list[str] | None = None) -> int:
    """Write every signature's best trial as JSON, atomically (an existing export stays whole
    until the new one is complete); returns how many kernels it wrote. `skipped` as for
    list_kb."""
    check_export_path(path)
    text, count = export_text(storage, skipped=skipped)
    try:
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError as e:
        raise OptionError(f"{os.fspath(path)}: cannot write it ({e.strerror or e})") from None
    return count


def export_text(storage: Any, *, skipped: list[str] | None = None) -> tuple[str, int]:
    """The JSON export of every signature's best trial, and how many kernels it holds; a
    built-in target's kernel exports the tiling a compile applies (list_kb's prices).
    `skipped` as for list_kb."""
    kernels = {}
    devices: dict[str, Any] = {}
    with opened(storage, read_only=True) as store:
        for name, sig in _kernel_studies(store):
            study = optuna.load_study(study_name=name, storage=store)
            best, tiling = _best_written(study, name, skipped)
            default = _default(study)
            if best is None:
                continue
            entry = {"tiling": tiling_params(tiling), "seconds": best.value,
                     "cycles": best.user_attrs.get("cycles"),
                     "default_seconds": default.value if default else None,
                     "trials": _evaluated(study)}
            device = _builtin_device(sig, devices)
            if device is not None:  # what a compile here applies, at this cost model's prices
                tiling, priced, default_seconds = _applied(study, name, sig, device)
                entry.update(tiling=tiling_params(tiling), seconds=priced.seconds,
                             cycles=priced.cycles, default_seconds=default_seconds)
            if sig in kernels and kernels[sig]["seconds"] <= entry["seconds"]:
                continue  # a kernel tuned in two studies exports the better one
            kernels[sig] = entry
    text = json.dumps({"format": FORMAT, "kernels": kernels}, indent=1, sort_keys=True) + "\n"
    return text, len(kernels)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """A JSON object's dict, refusing a key given twice: json keeps the last silently, so a
    kernel listed twice (two exports merged by hand) lost one of its tilings unsaid."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _read_export(path: str | os.PathLike) -> dict:
    """The parsed JSON of a knowledge-base export, or an InputError naming the file."""
    text = os.fspath(path)
    try:
        if text == "-":  # standard input: `kb export - | kb import -` across machines
            text = "standard input"
            doc = json.load(sys.stdin, object_pairs_hook=_unique_keys)
        else:
            refuse_device(text)
            with open(text, encoding="utf-8-sig") as f:
                doc = json.load(f, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise InputError(f"{text}: '{e.args[0]}' is given twice in one object (JSON would keep "
                         "the last alone); keep one of them") from None
    except FileNotFoundError:
        raise InputError(f"{text}: no such file") from None
    except OSError as e:
        raise InputError(f"{text}: cannot read it ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, [[[…]]]
        if text != "standard input" and _is_sqlite(text):  # a knowledge base to merge, say
            raise InputError(
                f"{text}: an SQLite database (a knowledge base itself), not a `kb export` "
                f"file; to merge it: graphopt kb export - --tuning-db {shlex.quote(text)} | "
                "graphopt kb import - --tuning-db …") from None
        why = (f"not UTF-8 text: byte {e.start}" if isinstance(e, UnicodeDecodeError)
               else str(e))
        raise InputError(f"{text}: not a graphopt knowledge-base export ({why})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise OptionError(f"{text}: not a graphopt knowledge-base export (format {FORMAT}"
                          + (f", this file says {found!r})" if found is not None else ")"))
    return doc


def _import_entry(path, name: str, entry: Any, profiles: dict) -> tuple:
    """(name, entry, tiling, shape, NPU device, search choices) of one exported kernel;
    OptionError naming the entry when it is not one kb export writes or not feasible here.
    `profiles`: custom targets by name (their signatures name the target, not its file)."""
    from graphopt.partition import builtin_targets, load_target

    try:
        target_name, op_class, shape = parse_signature(name)
    except Exception as e:  # noqa: BLE001 - any failure names the entry
        raise OptionError(f"{path}: kernel '{name}': {e}") from None
    target = profiles.get(target_name)
    if target is None and target_name not in builtin_targets():
        raise OptionError(f"{path}: kernel '{name}': target '{target_name}' is not built in: "
                          f"pass its profile (--target {target_name}.json)")
    try:
        devices = (target or load_target(target_name)).devices
    except Exception as e:  # noqa: BLE001 - any failure names the entry
        raise OptionError(f"{path}: kernel '{name}': {e}") from None
    device = next((d for d in devices if d.kind == "npu" and d.cube), None)
    if device is None:
        raise OptionError(f"{path}: kernel '{name}': target {target_name} has no NPU cube, "
                          "whose kernels are what tilings are for")
    from graphopt.partition.target_schema import DTYPES

    if shape.dtype not in DTYPES:
        raise OptionError(f"{path}: kernel '{name}': unknown dtype '{shape.dtype}'")
    if cube_dtype(shape.dtype) != shape.dtype:  # no compile would ever look it up
        raise OptionError(f"{path}: kernel '{name}': {shape.dtype} kernels compute in "
                          f"{cube_dtype(shape.dtype)}, which a signature names")
    if shape.dtype not in device.cube:
        raise OptionError(f"{path}: kernel '{name}': the {target_name} cube computes "
                          f"{', '.join(device.cube)}, not {shape.dtype}")
    if op_class == "conv" and shape.conv is None:  # import_kb leaves these out before
        raise OptionError(f"{path}: kernel '{name}': a conv signature without the conv's "
                          "geometry (_i…_o…_f…_s…_d…), which no compile looks up")
    canonical = signature(target_name, op_class, shape)
    if canonical != name:  # `b01_m0256`: the same kernel, under a name no compile looks up
        raise OptionError(f"{path}: kernel '{name}': not the signature graphopt writes for "
                          f"that kernel ({canonical})")
    if not shape.has_work:
        raise OptionError(f"{path}: kernel '{name}': a zero-size dim has no work to tile")
    if max(shape.batch, shape.m, shape.k, shape.n) > MAX_DIM:
        raise OptionError(f"{path}: kernel '{name}': a dim above {MAX_DIM} (2**31 - 1), which "
                          "no cube kernel's tiling indexes")
    if not isinstance(entry, dict):  # "x": entry.get failed as an internal error
        raise OptionError(f"{path}: kernel '{name}': expected an object with its \"tiling\", "
                          f"got {type(entry).__name__}")
    given = entry.get("tiling")
    if not isinstance(given, dict):
        raise OptionError(f"{path}: kernel '{name}': no \"tiling\" object (an export gives "
                          f"each kernel {{\"tiling\": {{{', '.join(PARAMS)}}}}})")
    missing = [key for key in PARAMS if key not in given]
    if missing:
        raise OptionError(f"{path}: kernel '{name}': its tiling lacks {', '.join(missing)}")
    unknown = sorted(set(given) - set(PARAMS))
    if unknown:  # a misspelt field would otherwise be dropped, and its intent with it
        raise OptionError(f"{path}: kernel '{name}': its tiling has no field "
                          f"{', '.join(map(repr, unknown))} (fields: {', '.join(PARAMS)})")
    try:
        tiling = tiling_from({key: given[key] for key in PARAMS})
    except (TypeError, ValueError) as e:  # a value of the wrong kind: the message names it
        raise OptionError(f"{path}: kernel '{name}': not an exported tiling ({e})") from None
    choices = search_choices(shape, device)
    reason = outside_space(tiling, shape, device)
    if reason is not None:
        raise OptionError(f"{path}: kernel '{name}': {tiling} is not feasible here ({reason})")
    return name, entry, tiling, shape, device, choices


def _check_studies(path, store, existing: set[str], entries: list) -> None:
    """Refuse, before anything is added, an import into studies that cannot take it: one
    tuned on another profile of the target's name, or one holding a trial graphopt did not
    write."""
    for name, _, _, _, device, _ in entries:
        if name not in existing:
            continue
        study = optuna.load_study(study_name=name, storage=store)
        if tuned_on_another_profile(study, device):
            raise OptionError(f"{path}: kernel {name}: the knowledge base's study of it was "
                              "tuned on another profile of that name (its cube, buffers, cores "
                              "or rates differ); nothing was imported: import into another "
                              "knowledge base, or give the edited profile a new name")
        for trial in _completed(study):
            trial_tiling(trial, name)  # OptionError naming the trial


def import_kb(path: str | os.PathLike, storage: Any, targets: Iterable[str] = (),
              counts: dict | None = None, option: str = "--tuning-db") -> int:
    """Add each kernel of a JSON export as a completed trial of its signature's study; a new
    study gets the default tiling as trial 0, completed. Both times are the cost model's
    estimates of the tilings, not the export's numbers (which the export keeps for reading).
    A tiling the study already completed is skipped. A conv kernel keyed without its
    geometry (an export of before 2026-12-07, tuned when a conv was priced as reading its
    im2col matrix from GM) is left out: no compile looks it up (signature.legacy_signature).
    `targets`: profile files of the custom targets the export's kernels name. Returns how
    many tuned trials it added; `counts`, when given, receives the file's number of kernels
    it takes ("kernels") and the names of those it left out ("legacy"). `option` names the
    storage in errors."""
    from graphopt.partition import load_target

    profiles = {}
    for profile in targets:
        target = load_target(profile)
        profiles[target.name] = target
    doc = _read_export(path)
    kernels = doc.get("kernels") if isinstance(doc, dict) else None
    if not isinstance(kernels, dict):
        raise OptionError(f"{path}: no 'kernels' object (write one with graphopt kb export)")
    legacy = sorted(name for name in kernels if _legacy_conv(name))
    kernels = {name: entry for name, entry in kernels.items() if name not in legacy}
    if counts is not None:
        counts["kernels"], counts["legacy"] = len(kernels), legacy
    if not kernels:  # nothing to add: no empty knowledge base is made of it
        return 0
    # Every entry is checked before any is added: a bad one must not leave half an import.
    entries = [_import_entry(path, name, entry, profiles)
               for name, entry in sorted(kernels.items())]
    added = 0
    # What is missing is found and added under the setup lock: two imports of one file at
    # once had both found every tiling missing and added each twice.
    with opened(storage, option=option) as store, optuna_quiet(), \
            setup_lock(getattr(store, "url", "")):
        existing = set(optuna.get_all_study_names(store))
        _check_studies(path, store, existing, entries)
        named = {}  # a signature's studies that `tune --study NAME` named
        for study_name, kernel in _kernel_studies(store):
            if study_name != kernel:
                named.setdefault(kernel, []).append(study_name)
        try:
            for name, _, tiling, shape, device, choices in entries:
                if _held_by(store, named.get(name, ()), name, tiling):
                    continue  # an import of its own export made a second, 2-trial study
                added += _add_entry(path, store, existing, name, tiling, shape, device, choices)
        except KeyboardInterrupt:
            raise ImportInterrupted(added, len(entries)) from None
    return added


def _legacy_conv(name: str) -> bool:
    """Whether an export's kernel name is a conv signature without the conv's geometry."""
    try:
        _, op_class, shape = parse_signature(name)
    except ValueError:
        return False  # _import_entry names what is wrong with it
    return op_class == "conv" and shape.conv is None


class ImportInterrupted(KeyboardInterrupt):
    """Ctrl-C during an import, after `added` of `total` kernels: what was added stays (an
    Optuna storage commits trial by trial), and running the import again adds the rest."""

    def __init__(self, added: int, total: int):
        super().__init__(added, total)
        self.added, self.total = added, total


def _held_by(store, studies: Iterable[str], signature: str, tiling: Tiling) -> bool:
    """Whether one of `studies` (of kernel `signature`) completed `tiling` already."""
    return any(trial_tiling(t, signature) == tiling
               for name in studies
               for t in _completed(optuna.load_study(study_name=name, storage=store)))


def _add_entry(path, store, existing: set[str], name: str, tiling: Tiling, shape, device,
               choices) -> int:
    """1 when the kernel's tiling was added (or its study made), 0 when the study held it."""
    # Times are the cost model's, estimated here: a file's own (another graphopt's model,
    # or an edited 1e-12) must not outrank the tilings tuned against this one.
    default = estimate(shape, None, device)
    study = open_study(store, name, shape, device, default_seconds=default.seconds,
                       default_cycles=default.cycles)
    if any(trial_tiling(t, name) == tiling for t in _completed(study)):
        # Already there, unless it came just now as the new study's default: the
        # export's best was the untuned default.
        return int(name not in existing)
    # The trial records the tiling itself; its ladder steps are the nearest ones below,
    # so the sampler learns from it even when a value lies between two rungs.
    steps = {f"{key}_step": max(i for i, v in enumerate(choices[key])
                                if v <= getattr(tiling, key) or i == 0) for key in PARAMS}
    result = estimate(shape, tiling, device)
    trial = optuna.trial.create_trial(
        params=steps, value=result.seconds, distributions=step_distributions(choices),
        user_attrs={"imported": os.path.basename(os.fspath(path)),
                    "tiling": tiling_params(tiling), "cycles": result.cycles})
    study.add_trial(trial)
    return 1
