"""--verify: run the original and the compiled model on the same inputs and judge the outputs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar

import numpy as np
from onnx import ModelProto

from graphopt import numerics
from graphopt.branch_switches import branch_switches
from graphopt.errors import InputError, OptionError, VerificationError
from graphopt.option_names import option, setting
from graphopt.passes import Options
from graphopt.random_seeds import seeding_note
from graphopt.rounding import (lossy_selection_hint, unreproduced_hint,
                               unstable_selection_hint, within_half_precision, within_rounding)
from graphopt.source_marks import frames_hint, inserted_preprocessing


# Set while a shape profile whose shapes the given --inputs do not fit is compiled: it verifies
# on seeded inputs, and its failure must not ask for the --inputs the user gave.
INPUTS_FIT_OTHER_PROFILES: ContextVar[bool] = ContextVar("INPUTS_FIT_OTHER_PROFILES",
                                                         default=False)


def load_inputs(inputs, name: str | None = None) -> dict[str, np.ndarray] | None:
    """--inputs as feeds: a dict as given (another mapping as a dict), an .npz path read
    (OptionError if it cannot be, naming the option `name`, by default optimize's)."""
    if inputs is None or isinstance(inputs, Mapping):  # the API takes any mapping
        return None if inputs is None else dict(inputs)
    from graphopt.codegen.feeds import load_npz

    try:
        return load_npz(inputs)
    except InputError as e:
        raise OptionError(f"{name or option('inputs')} {e}") from None


def not_runnable_here(model: ModelProto, what: str) -> str | None:
    """Why `what` (--verify, bisect) cannot run a compile on this machine: convs blocked for
    another CPU's NCHWc block (a target profile's nchwc_block_size), which onnxruntime here
    would run wrong, so the outputs would differ by that alone."""
    from graphopt.nchwc_block import foreign_block

    blocks = foreign_block({p.key: p.value for p in model.metadata_props})
    if blocks is None:
        return None
    return (f"{what}: the compile blocks its convs by {blocks[0]} channels (the target's "
            f"nchwc_block_size) and onnxruntime here by {blocks[1] or 'none'}: the result runs "
            "wrong on this machine, so it cannot be compared here; check it where it will run "
            "(graphopt compare)")


def _original_fails_too(original, feeds: dict, level: str) -> str:
    """The hint for an optimized model onnxruntime cannot run at `level` (a lossy compile's,
    run as it deploys, at its optimizer's full level) where the original fails there too: an
    -O1 fp16 compile of an affine grid had been blamed for onnxruntime's constant folding of
    the original's Range bound into a [1] tensor."""
    if level == "disable":
        return ""
    try:
        numerics.run(original, feeds, level)
    except Exception:  # noqa: BLE001 - any failure of the original at that level is the point
        return (f" (onnxruntime fails the original too at that level, ORT_ENABLE_"
                f"{level.upper()}: its own optimizer breaks the model, not graphopt's passes; "
                "-O2's shape folding repairs some such models)")
    return ""


def verify_outputs(original: ModelProto, optimized: ModelProto, inputs, options: Options,
                   judge: dict, notes: list[str] | None = None,
                   allow_rounding: bool = True,
                   empty: list[str] | None = None) -> dict[str, float]:
    """Run both models with onnxruntime at ORT_DISABLE_ALL (the optimized one where a lossy pass
    changed it at the level accuracy_rule.deployed_level says); raise VerificationError on any
    output `judge` fails (accuracy_rule's rtol/atol, or min_cosine when set), unless under
    rtol/atol and `allow_rounding` rounding explains it (rounding.within_rounding), which
    `notes` then says. Returns the max absolute error per output; `empty` gets the outputs
    that hold no element on these inputs, over which nothing was compared."""
    not_here = not_runnable_here(optimized, option("verify"))
    if not_here:
        raise OptionError(not_here)
    feeds = load_inputs(inputs)
    if feeds is None:
        try:
            feeds = numerics.random_feeds(original, seed=0, shapes=options.input_shapes)
        except ValueError as e:
            hint = "" if isinstance(e, numerics.NoTensorFeed) else f" (give {option('inputs')})"
            raise VerificationError(f"{option('verify')}: {e}{hint}") from None
        except InputError as e:  # an input past numpy's rank, which no --inputs holds either
            raise InputError(f"{option('verify')}: {e}") from None
    else:  # a file that does not fit is the file's fault, not the model's
        from graphopt.codegen.feeds import check_feeds, overridable_inputs, typed_inputs

        given = option("inputs") if isinstance(inputs, Mapping) else setting("inputs", inputs)
        label = f"{option('verify')}: {given}"
        overridden = sorted(set(feeds) & overridable_inputs(original))
        if overridden:
            raise InputError(f"{label}: '{overridden[0]}' is an initializer the model lets a "
                             f"caller override; {option('verify')} checks the compiled model at "
                             "its value (an .om fixes it and takes no such feed): drop it from "
                             "the inputs")
        try:
            check_feeds(typed_inputs(original), feeds)
        except InputError as e:
            images = inserted_preprocessing(original.metadata_props)
            raise InputError(f"{label}: {e}{frames_hint(e, images)}") from None
        if options.input_shapes:  # and the pinned sizes, or the compile would take the blame
            from graphopt.input_shapes import check_pins_fit_feeds

            check_pins_fit_feeds(options.input_shapes, feeds, given)
            try:
                check_feeds(typed_inputs(optimized), feeds)
            except InputError as e:
                raise InputError(f"{label}: {e} (as {option('input_shapes')} pinned it)") from None
    try:
        expected = numerics.run(original, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors are the message
        from graphopt.codegen.feeds import typed_inputs

        from graphopt.compile_checks import PIN_OPTIONS

        hint = "" if inputs is not None else numerics.random_inputs_hint(
            "seeded random", bool(options.input_shapes), reason=str(e),
            signature=typed_inputs(original), made=feeds,
            sizes=option("dynamic_dims") if "dynamic_dims" in PIN_OPTIONS.get() else None)
        raise VerificationError(f"{option('verify')}: onnxruntime cannot run the original model: "
                                f"{numerics.ort_reason(e)}{hint}") from None
    from graphopt.tools.accuracy_rule import deployed_level

    level = deployed_level(optimized.metadata_props)
    try:
        actual = numerics.run(optimized, feeds, level)
    except Exception as e:  # noqa: BLE001
        raise VerificationError(f"{option('verify')}: onnxruntime cannot run the optimized model: "
                                f"{numerics.ort_reason(e)}"
                                + _original_fails_too(original, feeds, level)) from None
    lossy: list[str] = []  # the outputs a cosine rule fails
    if judge["min_cosine"] is None:
        problems = numerics.compare(expected, actual, judge["rtol"], judge["atol"])
        if problems and allow_rounding:
            problems = _beyond_rounding(original, feeds, expected, actual, judge,
                                        notes if notes is not None else [])
    else:
        from graphopt.tools.accuracy_rule import below_cosine

        problems = below_cosine(expected, actual, judge)
        if problems:
            lossy = [name for name in expected if name in actual
                     and below_cosine({name: expected[name]}, {name: actual[name]}, judge)]
    if problems:
        failing = [p.output for p in problems] if judge["min_cosine"] is None else []
        raise VerificationError(f"{option('verify')}: optimized model differs from the original: "
                                + "; ".join(str(p) for p in problems[:3])
                                + unstable_selection_hint(original, feeds, expected, failing,
                                                          judge)
                                + unreproduced_hint(original, feeds, expected, failing)
                                + _seeded_inputs_hint(inputs, options,
                                                      bool(inserted_preprocessing(
                                                          original.metadata_props)))
                                + _half_overflow(original, optimized, feeds, options)
                                + _half_underflow(expected, options)
                                + lossy_selection_hint(original, lossy)
                                + _quantized_hint(options, judge))
    _check_loads_at_all(original, optimized)
    seeded = seeding_note(original)
    if seeded and notes is not None:
        notes.append(seeded)
    if inputs is None and notes is not None:
        notes.extend(_open_dims_note(original, feeds, options.input_shapes or {}))
    hollow = [name for name, value in expected.items()
              if isinstance(value, np.ndarray) and value.size == 0]
    if empty is not None:
        empty.extend(hollow)
    if hollow and notes is not None:  # verified over no element: say so rather than "match"
        notes.append(f"output(s) {', '.join(hollow)} hold no element at these input shapes: "
                     "nothing of them was compared")
    unmeasured = _nonfinite(expected)
    if unmeasured and notes is not None:  # "max abs error 0" over NaNs alone proves little
        notes.append(f"NaN or Inf in both models alike, where no error is measured: "
                     f"{unmeasured}")
    # Over every tensor a sequence or map holds too; 0 for outputs without floats.
    errors = {name: numerics.max_abs_error(exp, actual[name]) for name, exp in expected.items()}
    if inputs is None:  # a seeded switch ran one branch of its If: the other runs too
        for switch in branch_switches(original):
            errors = _other_branch(original, optimized, feeds, switch, options, judge, notes,
                                   allow_rounding, errors)
    return errors


def _other_branch(original: ModelProto, optimized: ModelProto, feeds: dict, switch: str,
                  options: Options, judge: dict, notes: list[str] | None, allow_rounding: bool,
                  errors: dict[str, float]) -> dict[str, float]:
    """Verify again with the boolean input `switch` flipped, so that the If branch its seeded
    value left unrun is checked too (an optimum-style decoder's first step, without the
    cache); `errors` then holds the larger error of the two runs per output."""
    seeded = bool(np.asarray(feeds[switch]).reshape(-1)[0])
    flipped = {**feeds, switch: np.asarray(np.logical_not(feeds[switch]))}
    try:
        numerics.run(original, flipped)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors are the message
        if notes is not None:
            notes.append(f"only {switch} = {seeded} verified: the original does not run on the "
                         f"seeded inputs with {switch} = {not seeded} ({numerics.ort_reason(e)})")
        return errors
    more: list[str] = []
    try:
        other = verify_outputs(original, optimized, flipped, options, judge, more, allow_rounding)
    except VerificationError as e:
        raise VerificationError(f"{e} (on the seeded inputs with {switch} = {not seeded}, the "
                                "If branch it selects)") from None
    if notes is not None:
        notes.extend(note for note in more if note not in notes)
        notes.append(f"both branches verified: the seeded inputs ran with {switch} = {seeded} "
                     f"and again with {not seeded}")
    return {name: max(error, other.get(name, 0.0)) for name, error in errors.items()}


def _nonfinite(outputs: dict) -> str:
    """The float outputs' NaN and Inf counts (`y: 31 of 64 elements`), "" when all are
    finite. verify's check took them as equal where both models have them alike."""
    counts = []
    for name, value in outputs.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc" and value.size:
            bad = value.size - int(np.count_nonzero(np.isfinite(value)))
            if bad:
                counts.append(f"{name}: {bad} of {value.size} element(s)")
    return ", ".join(counts)


def _open_dims_note(original: ModelProto, feeds: dict, pins: dict) -> list[str]:
    """A note when the seeded inputs held open dims that nothing pinned at 1: a sequence of one
    token checks little of an attention, a mask or positions (a Llama compiled at open shapes
    was "verified" at batch 1, sequence 1)."""
    from graphopt.codegen.feeds import typed_inputs

    left = numerics.left_at_one(typed_inputs(original), feeds, pins)
    if not left:
        return []
    more = f", and {len(left) - 3} more" if len(left) > 3 else ""
    return [f"on seeded random inputs with their open dims at 1: {', '.join(left[:3])}{more}; "
            "that checks little of what depends on those sizes (attention over a sequence, its "
            "mask, positions; convolutions and pools over an image's height and width): give "
            f"real inputs ({option('inputs')}) or sizes "
            f"({option('input_shapes')})"]


def _half_overflow(original: ModelProto, optimized: ModelProto, feeds, options: Options) -> str:
    """After a float16 precision pass, the accuracy report's float16 overflow warning, which
    names the tensors past 65504 and the nodes making them: without it the failure said only
    "candidate has 3360 NaN" of a mel spectrogram reaching 1.9e10 (openwakeword's)."""
    if options.precision not in ("fp16", "mixed-fp16"):
        return ""
    from graphopt.tools.accuracy import accuracy_report

    try:
        report = accuracy_report(original, optimized, feeds)
    except Exception:  # noqa: BLE001 - a diagnosis only: the failure stands without it
        return ""
    found = [w for w in report.warnings if w.startswith("float16 overflow")]
    return f". {found[0]}" if found else ""


# float16's smallest normal number: below it a value keeps fewer digits, below 6e-8 none.
_HALF_TINY = 2.0 ** -14


def _half_underflow(expected: dict, options: Options) -> str:
    """After a float16 precision pass, the outputs whose every value is below float16's
    smallest normal number: a random-weight depth model's output of 5e-9 rounds to zero in
    float16, and the failure had said only "cosine 0.000000"."""
    if options.precision not in ("fp16", "mixed-fp16"):
        return ""
    tiny = []
    for name, value in expected.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
            largest = float(np.nanmax(np.abs(value)))
            if 0 < largest < _HALF_TINY:
                tiny.append(f"'{name}' (at most {largest:.2g})")
    if not tiny:
        return ""
    return (f". The original's output(s) {', '.join(tiny[:3])} lie below float16's smallest "
            f"normal number ({_HALF_TINY:.2g}), where it keeps few digits or none: keep the "
            f"ops that compute them float32 ({option('keep_dtype')}, {option('precision_deny')})")


def _quantized_hint(options: Options, judge: dict) -> str:
    """Where to look next when a quantized compile misses its cosine: which layer the error
    starts at, and the options that trade speed for it back."""
    if judge["min_cosine"] is None or options.quantize not in ("int8", "int4"):
        return ""
    flags = f"{option('quantize')} {options.quantize}"
    return (f". To find where the error starts: `graphopt bisect MODEL {flags} …` names the "
            f"first layer that breaks it, `graphopt compare MODEL OUTPUT --per-tensor` each "
            f"layer's cosine; {option('quant_skip')} keeps layers float"
            + (f", {option('calibration_method')} fits other ranges"
               if options.quantize == "int8" else ""))


def _seeded_inputs_hint(inputs, options: Options, frames: bool = False) -> str:
    """What a failed verification ran on when no inputs were given: standard normal values,
    which int8 ranges fitted to real data (images in [0, 1]) clip, so a compile whose report
    on its calibration data read 0.999 failed at 0.91 with nothing saying why. `frames`: the
    model takes AIPP's uint8 frames, which the seeded inputs fill with pixel values instead."""
    if inputs is not None:
        return ""
    drawn = (f"uniform pixel values, 0 to 255, for the frames {option('insert_op_conf')} made "
             "the inputs" if frames else "standard normal values")
    fitted = (f", which the int8 ranges fitted to {option('calibration')} may clip"
              if options.quantize == "int8" and options.calibration else "")
    ask = (f"{option('inputs')} fit another shape profile: a file of this profile's shapes "
           "checks it on real data" if INPUTS_FIT_OTHER_PROFILES.get()
           else f"give inputs like the deployment's with {option('inputs')}")
    return f" (on seeded random inputs: {drawn}{fitted}; {ask})"


def _beyond_rounding(original: ModelProto, feeds, expected: dict, actual: dict,
                     judge: dict, notes: list[str]) -> list:
    """The outputs outside rtol/atol, unless rounding explains every one of them (which
    `notes` then says: rounding.within_rounding)."""
    problems = numerics.compare(expected, actual, judge["rtol"], judge["atol"])
    failing = [name for name, reference in expected.items()
               if numerics.compare({name: reference}, {name: actual[name]}, judge["rtol"],
                                   judge["atol"])]
    note = within_half_precision(original, expected, actual, failing, feeds) \
        or within_rounding(original, feeds, expected, actual, failing, judge)
    if note is None:
        return problems
    notes.append(note)
    return []


def _check_loads_at_all(original: ModelProto, optimized: ModelProto) -> None:
    """VerificationError when onnxruntime loads the optimized model only with its optimizer
    off: a deployment (and an .om's session) runs it at ORT_ENABLE_ALL, whose rewrites, such
    as inlining an If whose condition graphopt folded, re-check what they produce."""
    try:
        numerics.session(optimized, "all")
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors are the message
        try:
            numerics.session(original, "all")
        except Exception:  # noqa: BLE001 - the original fails there too: not the compile's doing
            return
        raise VerificationError(f"{option('verify')}: onnxruntime cannot load the optimized "
                                "model at ORT_ENABLE_ALL, where it loads the original: "
                                f"{numerics.ort_reason(e)}") from None


def exact_stft_reference(model) -> ModelProto | None:
    """`model` (a ModelProto or an .onnx path) with its STFTs lowered alone, as -O3's LowerSTFT
    lowers them, or None when it has none that lowers. The conv's sums are the exact DFT's to
    float32 rounding, and onnxruntime's own STFT, which the plain reference runs, misses by up
    to 1e-4 of the largest bin: a compile that lowered them is judged against this, the other
    rewrites as usual (onnx-asr's Whisper front end, log-compressed, differed from onnxruntime
    by 2.6e-4, and was 60 times closer to a float64 run than onnxruntime was)."""
    import onnx

    from graphopt.ir import load_onnx, to_onnx
    from graphopt.ir.tensor import inline_tensors
    from graphopt.passes import PassContext
    from graphopt.passes.fusion.stft import LowerSTFT
    from graphopt.passes.infer_shapes import infer_shapes

    from graphopt.lent_weights import with_data

    proto = with_data(model) if isinstance(model, ModelProto) else onnx.load(os.fspath(model))
    exact = load_onnx(proto)
    infer_shapes(exact)
    if not LowerSTFT().run(exact, PassContext(Options())).changed:
        return None
    with inline_tensors():  # run by onnxruntime, also from inside the .om writer's block
        return to_onnx(exact)


EXACT_STFT_NOTE = ("against the original with its STFTs computed exactly (as the lowered Conv "
                   "does): onnxruntime's own STFT differs from the exact transform by more than "
                   "the tolerance here")
