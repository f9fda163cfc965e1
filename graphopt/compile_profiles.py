"""Compiling one model per shape profile (`--dynamic-dims`): every profile pins the dynamic
input dims to its sizes and gets a whole compile of its own (static shapes, so every pass and
the memory plan see concrete sizes); the `.om` then holds each profile's plan. INT8 profiles the
calibration data does not fit take the statistics of one it fits (quant/shared_stats.py), so
they compile after it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from graphopt.codegen.om_manifest import dtype_name
from graphopt.compile_result import OptimizeResult
from graphopt.errors import GraphoptError, InputError, OptionError
from graphopt.input_shapes import fixed_dims_note, input_shapes_argument
from graphopt.ir import Model, load_onnx
from graphopt.ir.collector import collect_dropped
from graphopt.ir.shared_parse import shared_parses
from graphopt.option_names import option, setting
from graphopt.passes.instruments import start_profile_dumps
from graphopt.quant.calib_data import (CalibrationShapeError, calibration_label,
                                       profile_samples, unused_files)
from graphopt.quant.shared_stats import SharedStats
from graphopt.shape_profiles import (ShapeProfile, dynamic_dims, expand_profiles,
                                     parse_dynamic_dims)
from graphopt.source_edits import edit_source
from graphopt.source_marks import frames_hint, inserted_preprocessing


@dataclass
class CompiledProfile:
    """One shape profile and its compile."""

    profile: ShapeProfile
    result: OptimizeResult


def optimize_profiles(model, spec, options: dict):
    """Compile `model` once per profile of `spec` with graphopt.optimize's `options`; returns the
    first profile's OptimizeResult, whose `profiles` lists every profile's. A model file is
    parsed once: the profiles' imports share its weights."""
    from graphopt.compile_checks import PIN_OPTIONS

    # A refusal of a pin names the options that pinned: --dynamic-dims (and --input-shape).
    token = PIN_OPTIONS.set(("dynamic_dims", "input_shapes") if options.get("input_shapes")
                            else ("dynamic_dims",))
    try:
        with shared_parses():
            return _optimize_profiles(model, spec, options)
    finally:
        PIN_OPTIONS.reset(token)


def _optimize_profiles(model, spec, options: dict):
    from graphopt.compile_verify import load_inputs
    from graphopt.compiler import optimize

    start = time.perf_counter()
    label = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "<model>"
    source = load_onnx(model, user_model=True)
    unedited = set(dynamic_dims(source)) if options.get("insert_op_conf") else set()
    # The profiles take the model as each compile edits it: its signature is the artifact's
    # (an --insert-op-conf input takes images, an --out-nodes output is an inner tensor).
    # With the pins: an --input-shape pin of an AIPP input's image sizes the images where the
    # file leaves their size to the model, whose size is open.
    edit_source(source, options.get("out_nodes"), options.get("insert_op_conf"), label,
                options.get("input_fp16_nodes"), options.get("output_type"),
                input_shapes_argument(options.get("input_shapes")))
    fixed_by_aipp = sorted(unedited - set(dynamic_dims(source)))
    try:
        profiles = expand_profiles(source, spec, label)
    except OptionError as exc:
        named = [dim for dim in fixed_by_aipp if f"dim '{dim}'" in str(exc)]
        if not named:
            raise
        # The model has that dim; the preprocessing the AIPP file inserts fixed it.
        raise OptionError(f"{option('dynamic_dims')}: {label}'s dynamic dim '{named[0]}' is "
                          f"fixed by {option('insert_op_conf')}, whose src_image_size (or "
                          "crop) sets the size of the images it preprocesses: leave it out of "
                          f"{option('dynamic_dims')}, or compile one artifact per image size")
    signature = dynamic_signature(source)
    inputs = [signature[v.name] for v in source.graph.inputs if not v.is_constant]
    images = inserted_preprocessing(source.metadata_props)
    pinned = input_shapes_argument(options.get("input_shapes"))
    fixed = fixed_dims_note(source, pinned, frozenset(images)) if pinned else None
    del source  # each profile imports the model afresh: passes rewrite the IR in place
    collect_dropped()  # before the first profile's import: 0.4 GB less at the peak on BERT-base
    feeds = load_inputs(options.get("inputs")) if options.get("verify") else None
    if feeds is not None:
        _check_feed_names(feeds, inputs, options.get("inputs"), images)
    if feeds is not None and not any(_fits(feeds, profile) for profile in profiles):
        given = ", ".join(f"{name} {list(np.shape(feeds.get(name)))}"
                          for name in profiles[0].input_shapes)
        raise InputError(f"{option('verify')}: {option('inputs')} ({given}) fit none of the "
                         f"shape profiles ({', '.join(map(_label, profiles))}): each profile is "
                         "verified on the inputs that fit it")
    dump_dir = options.get("dump_dir")
    shapes = [_merge(pinned, profile) for profile in profiles]  # refused before any compile
    if dump_dir:
        dump_dir = os.fspath(dump_dir)
        start_profile_dumps(dump_dir, [profile.name for profile in profiles],
                            options.get("dump_format", "text"))
    shared = SharedStats()  # int8 statistics, measured by a profile the calibration data fits
    results: dict[str, OptimizeResult] = {}
    waiting: list[tuple[ShapeProfile, dict, CalibrationShapeError, bool]] = []
    for profile, input_shapes in zip(profiles, shapes):
        fits = feeds is not None and _fits(feeds, profile)
        run = dict(options, input_shapes=input_shapes, inputs=feeds if fits else None,
                   dump_dir=os.path.join(dump_dir, profile.name) if dump_dir else None)
        elsewhere = feeds is not None and not fits  # verified on seeded inputs instead
        try:
            results[profile.name] = _compile(optimize, model, run, profile, shared, elsewhere)
        except CalibrationShapeError as exc:
            if shared.ready:
                raise _in_profile(exc, profile) from None
            # until a profile the data fits has measured
            waiting.append((profile, run, exc, elsewhere))
        except GraphoptError as exc:
            hint = _agreeing_dims_hint(spec, exc)
            if not hint:
                raise
            raise type(exc)(f"{exc}{hint}") from None
    if waiting and not shared.ready:
        # Named by the profile the data came closest to fitting: a folder of prefill and
        # decode samples misses the prefill profile at its first input, whatever the fault
        profile, _, exc, _ = max(waiting, key=lambda wait: wait[2].matched)
        labels = ", ".join(map(_label, profiles))
        raise CalibrationShapeError(
            f"the calibration data fits none of the {len(profiles)} shape profiles "
            f"({labels}); {_in_profile(exc, profile)}") from None
    for profile, run, exc, elsewhere in waiting:
        results[profile.name] = _compile(optimize, model, run, profile, shared, elsewhere)
    calibration = options.get("calibration") or (options.get("pass_options") or {}).get(
        "calibration")
    unused = unused_files(calibration, shared.samples_used) if calibration and \
        shared.samples_used else []
    if unused:  # left out by every profile: of no shape any profile has
        raise CalibrationShapeError(
            f"{calibration_label(unused[0])}: fits none of the {len(profiles)} shape profiles "
            f"({', '.join(map(_label, profiles))}); a directory's files may have the shapes "
            "of different profiles, each calibrating on those that fit it")
    if not shared.fitted and shared.misfit is not None:
        # No pass needed its statistics (a transformer's dynamic int8 MatMuls, fp16's report)
        # and each profile let the data go: refused as when a pass needs them.
        raise CalibrationShapeError(
            f"the calibration data fits none of the {len(profiles)} shape profiles "
            f"({', '.join(map(_label, profiles))}); {shared.misfit}")
    compiled = [CompiledProfile(profile, results[profile.name]) for profile in profiles]
    head = compiled[0].result
    borrowed = shared.note([_label(profile) for profile in profiles])
    # Each note once: as it is where every profile's compile made it, else naming the
    # profiles that did. The first profile's went unnamed, read as the whole model's ("the npu
    # runs none of the model" where another profile's partitions were on the NPU).
    holders: dict[str, list[str]] = {}
    for each in compiled:
        for note in dict.fromkeys(each.result.notes):
            holders.setdefault(note, []).append(each.profile.name)
    head.notes = [note if len(names) == len(compiled) else f"{', '.join(names)}: {note}"
                  for note, names in holders.items()]
    head.notes += [note for note in (fixed, borrowed) if note]
    head.profiles = compiled
    head.dynamic_signature = signature
    head.seconds = time.perf_counter() - start
    return head


def _compile(optimize, model, run: dict, profile: ShapeProfile, shared: SharedStats,
             inputs_elsewhere: bool = False):
    """One profile's compile; its errors name the profile (a calibration shape mismatch is
    raised as it is, for optimize_profiles to retry once another profile has measured).
    `inputs_elsewhere`: --inputs were given and fit another profile, not this one."""
    from graphopt.compile_verify import INPUTS_FIT_OTHER_PROFILES

    shared.profile = _label(profile)
    token = INPUTS_FIT_OTHER_PROFILES.set(inputs_elsewhere)
    try:
        with profile_samples(shared.samples_used):  # a calibration directory's files that
            return optimize(model, **run, shared_stats=shared)  # fit this profile
    except CalibrationShapeError:
        raise
    except GraphoptError as exc:
        raise _in_profile(exc, profile) from None
    finally:
        INPUTS_FIT_OTHER_PROFILES.reset(token)


def _agreeing_dims_hint(spec, exc: GraphoptError) -> str:
    """For every combination of several dims (`DIM:V1,V2;…`) where the model refuses one: the
    listed form, which pairs the values instead. A scikit-learn pipeline's column inputs each
    have a batch dim of their own, unnamed, and every pairing of unequal sizes is refused."""
    if isinstance(spec, str):
        spec = parse_dynamic_dims(spec)
    refused = any(text in str(exc) for text in ("shape inference refuses", "ShapeInferenceError"))
    if not isinstance(spec, dict) or not refused:
        return ""
    values = [list(v) if isinstance(v, (list, tuple)) else [v] for v in spec.values()]
    # The sizes every dim lists, in the first dim's order: the profiles that pair them.
    common = [v for v in dict.fromkeys(values[0]) if all(v in other for other in values[1:])]
    if sum(len(set(v)) > 1 for v in values) < 2 or not common:
        return ""  # no two dims cross several sizes, or no size is theirs alike
    listed = ";".join(",".join(f"{key}={size}" for key in spec) for size in common)
    return (f" (every combination of the dims' values is a profile: where those dims must "
            f"agree, list the profiles whole, pairing the sizes every dim lists, as "
            f"{option('dynamic_dims')} \"{listed}\")")


def _label(profile: ShapeProfile) -> str:
    return f"{profile.name} ({profile.label})"


def _in_profile(exc: GraphoptError, profile: ShapeProfile) -> GraphoptError:
    return type(exc)(f"shape profile {_label(profile)}: {exc}")


def _merge(pinned: dict[str, list[int]], profile: ShapeProfile) -> dict[str, list[int]]:
    """--input-shape's pins with the profile's on top; a dim pinned by both to different sizes
    is refused (the profile could never be fed)."""
    merged = {name: list(dims) for name, dims in pinned.items()}
    for name, dims in profile.input_shapes.items():
        base = merged.get(name)
        if base is None:
            merged[name] = list(dims)
            continue
        if len(base) != len(dims):
            raise OptionError(f"{option('input_shapes')} gives input '{name}' {len(base)} dims, "
                              f"the model has {len(dims)}")
        for axis, (fixed, size) in enumerate(zip(base, dims)):
            if size == -1:
                continue
            if fixed not in (-1, size):
                raise OptionError(f"{option('input_shapes')} pins input '{name}' dim {axis} to "
                                  f"{fixed}, and {option('dynamic_dims')}'s profile "
                                  f"{profile.label} makes it {size}: size it with one of them")
            base[axis] = size
    return merged


def _check_feed_names(feeds: dict, inputs: list[dict], given, images: dict) -> None:
    """A feed file that lacks an input or names one the model does not have is refused as
    without profiles: its shapes would otherwise read as fitting no profile."""
    from graphopt.codegen.feeds import check_feeds

    try:
        check_feeds(inputs, feeds)
    except InputError as e:
        named = option("inputs") if isinstance(given, dict) else setting("inputs", given)
        raise InputError(f"{option('verify')}: {named}: {e}{frames_hint(e, images)}") from None


def _fits(feeds: dict[str, np.ndarray], profile: ShapeProfile) -> bool:
    for name, dims in profile.input_shapes.items():
        shape = np.shape(feeds.get(name))
        if len(shape) != len(dims) or any(d not in (-1, s) for d, s in zip(dims, shape)):
            return False
    return True


def dynamic_signature(model: Model) -> dict[str, dict]:
    """The model's inputs and outputs as .om signature entries, symbolic dims by name: the
    signature of an artifact that holds several profiles."""
    values = [v for v in model.graph.inputs if not v.is_constant] + list(model.graph.outputs)
    return {v.name: {"name": v.name,
                     "dtype": dtype_name(int(v.dtype)) if v.dtype is not None else None,
                     "shape": None if v.shape is None else list(v.shape)}
            for v in values}
