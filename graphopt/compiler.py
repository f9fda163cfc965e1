"""graphopt.optimize: import and check a model, pin shapes, run a pipeline, verify, partition."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from onnx import ModelProto

from graphopt import api_args, numerics
from graphopt.compile_checks import (PIN_OPTIONS, check_compiled_loads, check_input, check_loads,
                                     check_pinned_shapes, check_runs_at_its_shapes,
                                     foreign_block_note, overridable_note, weightless_bytes)
from graphopt.compile_memory import plan_partition_memory
from graphopt.compile_result import OptimizeResult, file_identity, memory_model_sha256, op_counts
from graphopt.compile_tuning import record_tuning, tuned_decisions
from graphopt.compile_verify import verify_outputs
from graphopt.errors import InputError, OptionError, UsageError, VerificationError
from graphopt.input_shapes import (fixed_dims_note, input_shapes_argument, pin_input_shapes,
                                   validate_input_shapes)
from graphopt.io_types import parse_fp16_inputs, parse_output_type
from graphopt.ir import Model, load_onnx
from graphopt.lent_weights import lean_onnx, lending
from graphopt.option_names import option, setting
from graphopt.out_nodes import parse_out_nodes
from graphopt.passes import PIPELINES, Options, PassContext, PassLog, PassManager, for_target
from graphopt.passes.infer_shapes import infer_shapes
from graphopt.passes.instruments import DUMP_FORMATS, DumpIR, VerifyAfterEachPass
from graphopt.passes.output_declarations import correct_output_declarations
from graphopt.passes.pipelines import with_precision
from graphopt.passes.precision.ort_half_crash import move_batch_swaps_after_half_matmuls
from graphopt.passes.precision.policy import check_options as check_precision_options
from graphopt.passes.rules import RULES, Tracer, idle_switches
from graphopt.quant.opset_upgrade import int8_ready
from graphopt.source_edits import apply_source_edits
from graphopt.source_marks import inserted_preprocessing
from graphopt.switches import read_switch_file

if TYPE_CHECKING:
    from graphopt.partition import Target


def _options(level: int, disable_passes, switch_file, input_shapes, fold_size_limit,
             verify_structure: bool, dump_dir, allow_custom_ops: bool, trace_rules,
             dump_format: str = "text") -> Options:
    level = api_args.integer(level, "level")
    disabled = set(api_args.names(disable_passes, "disable_passes"))
    switch_file = api_args.path(switch_file, "switch_file")
    if switch_file:
        disabled |= read_switch_file(switch_file, option("switch_file"))
    input_shapes = input_shapes_argument(input_shapes)
    fold_size_limit = api_args.size(fold_size_limit, option("fold_size_limit"))
    if not isinstance(dump_format, str):
        raise OptionError(f"dump_format: expected a string, got {dump_format!r}")
    options = Options(level=level, disabled_passes=disabled, input_shapes=input_shapes,
                      dump_dir=api_args.path(dump_dir, "dump_dir"),
                      allow_custom_ops=api_args.flag(allow_custom_ops, "allow_custom_ops"),
                      trace_rules=set(api_args.names(trace_rules, "trace_rules")))
    options.dump_format = dump_format
    options.verify_structure |= api_args.flag(verify_structure, "verify_structure")
    if fold_size_limit is not None:
        options.fold_size_limit = fold_size_limit
    return options


def _check_values(options: Options) -> None:
    """The values of the settings, checked once the keywords and `pass_options` (which may set
    them too, their types checked by Options.coerce) are both in."""
    if options.level not in PIPELINES:
        raise OptionError(f"optimization level {options.level} does not exist (use 0 to "
                          f"{max(PIPELINES)})")
    for name, least, unit in (("fold_size_limit", 0, " bytes"), ("max_iterations", 1, ""),
                              ("elementwise_max_group", 1, "")):
        if getattr(options, name) < least:
            # As the keyword's own check says it (api_args.size): one message either way.
            raise OptionError(f"{option(name)} must be ≥ {least}{unit}, got "
                              f"{getattr(options, name)}")
    input_shapes = validate_input_shapes(options.input_shapes)
    options.input_shapes = input_shapes
    dump_dir, dump_format = options.dump_dir, options.dump_format
    if dump_dir and os.path.exists(dump_dir) and not os.path.isdir(dump_dir):
        raise OptionError(f"{setting('dump_dir', dump_dir)}: exists and is not a directory")
    if dump_format not in DUMP_FORMATS:
        raise UsageError(f"{setting('dump_format', dump_format)}: unknown format "
                          f"(use {', '.join(DUMP_FORMATS)})")
    if dump_format != "text" and not dump_dir:
        raise OptionError(f"{setting('dump_format', dump_format)} needs "
                          f"{option('dump_dir')}, the directory to dump into")
    unknown = sorted(options.trace_rules - set(RULES))
    if unknown:
        from graphopt.passes import PASSES
        from graphopt.passes.manager import did_you_mean

        passes = [name for name in unknown if name in PASSES]
        what = (f"; {', '.join(passes)} is a pass, which runs rules: trace one of them"
                if passes else "")
        shown = ", ".join(name or "''" for name in unknown)  # an empty one would show nothing
        raise OptionError(f"{option('trace_rules')}: unknown rule {shown} "
                          f"({did_you_mean(unknown, RULES)}`graphopt passes` lists the "
                          f"rules{what})")


def optimize(model: str | os.PathLike | ModelProto | bytes, *, level: int = 2,
             disable_passes=(), switch_file: str | None = None,
             input_shapes: dict[str, list[int]] | str | None = None,
             fold_size_limit: int | str | None = None, verify: bool = False,
             inputs: dict[str, np.ndarray] | str | None = None, rtol: float | None = None,
             atol: float | None = None, dump_dir: str | None = None, verify_structure: bool = False,
             allow_custom_ops: bool = False, trace_rules=(),
             target: str | Target | None = None, memory_reorder: bool = False,
             rewrite_gate=None, pass_options: dict | None = None,
             dump_format: str = "text", instruments=(), precision: str = "keep",
             quantize: str = "none", calibration: str | os.PathLike | None = None,
             dynamic_dims=None, shared_stats=None,
             tuning_db: str | os.PathLike | None = None, out_nodes=None,
             insert_op_conf: str | os.PathLike | None = None, input_fp16_nodes=None,
             output_type=None) -> OptimizeResult:
    """Optimize an ONNX model (path, bytes or ModelProto) and return the result with its log.

    Each keyword is the command line's flag of the same name (`graphopt optimize --help`);
    a value of the wrong type or out of range raises OptionError naming it.

    Passes: `level` 0-3 (the -O levels); `disable_passes` (names of passes or rules) and
    `switch_file` (a file of `Name: off` lines) switch some off; `trace_rules` reports why the
    named rules did not match; `fold_size_limit` caps the bytes FoldConstants makes per value
    (an int, or "4M"); `allow_custom_ops=True` keeps ops of domains no schema knows.
    `input_shapes` pins input dims, ATC style ({"x": [1, 3, 224, 224]} or "x:1,3,224,224";
    -1 keeps a dim open). `out_nodes` ends the model at the tensors it names, ATC's --out_nodes
    ("boxes;scores", ["Conv_12:0"], a tensor name or node:index each): they become its outputs,
    in that order, and what only the other outputs needed goes, before any pass; verification
    and the accuracy report compare them with the original's values of those tensors.
    `insert_op_conf` (an ATC AIPP configuration file) makes the inputs it names take uint8
    frames (packed NHWC, or YUV420SP's planes) and puts its crop, channel swap, colour
    conversion and normalization in front of the model.
    `input_fp16_nodes` ("x;y", or a list) makes those float32 inputs take float16, and
    `output_type` ("FP16" for every float output, "logits:FP16;node:1:FP32", or a dict) gives
    outputs in those dtypes, ATC's --input_fp16_nodes and --output_type: Casts at the edges,
    before any pass, which a precision mode's own boundary Casts then cancel.

    `target` (a built-in name such as "ascend310", a profile path, or a loaded Target) places
    every node on a device of the target and cuts the graph into device partitions, which
    `save(…, "x.om")` writes as separate models, each with its static memory plan (shapes
    permitting); `memory_reorder=True` first reorders each partition to lower its peak memory.

    `precision` (fp16, bf16, mixed-fp16, mixed-bf16) and `quantize` (int8, int4) add the
    precision passes (ConvertPrecision, QuantizeInt8, QuantizeInt4Weights); int8 takes its
    activation ranges from `calibration` (an .npz file or a directory of them), and the other
    precision settings are `pass_options` (calibration_method, quant_skip, keep_dtype, …).
    `pass_options` sets any field of graphopt.passes.options.Options by name, checked as the
    keywords are (elementwise_max_group, max_iterations, nchwc_block_size, …).

    `verify=True` runs the original and the optimized model on seeded random inputs (or
    `inputs`, a dict or an .npz path) with onnxruntime at ORT_DISABLE_ALL and raises
    VerificationError when any output differs beyond `rtol`/`atol` (default 1e-4 / 1e-5),
    except by what summation order explains: no more than twice what onnxruntime's own
    optimizer changes the original by, or in under 1% of the elements, each within rtol of the
    output's largest magnitude (`result.verify_note` then says which), when neither `rtol` nor
    `atol` is given (given, they apply as given, as in compare). A compile a lossy
    precision pass changed (fp16, int8, int4) is judged by cosine instead, as `graphopt
    compare` judges it, unless `rtol` or `atol` is given. `verify_structure=True` checks the
    graph's structure after every pass.

    `tuning_db` (a knowledge base file or Optuna storage URL that `graphopt tune` filled; needs
    a target) applies the subgraph decisions `tune --job subgraph` chose for this model, target
    and level, and `save(result, "x.om")` then gives an NPU .om's cube kernels the tilings op
    tuning found; a note says which study applied, or at which levels the model has some.

    `dump_dir` receives the IR after import and after each pass, as printed IR (`dump_format`
    "text"), ONNX sharing one weights file ("onnx") or both, plus passes.json.

    `dynamic_dims` compiles one plan per shape profile, ATC style: "batch:1,4,8;seq:128,512"
    (every combination), "batch=1,seq=128;batch=8,seq=64" (listed), {"batch": [1, 4]} or
    [{"batch": 1, "seq": 128}, …]; a key is a symbolic input dim or `input[axis]`. The result
    is the first profile's, with every profile's in `result.profiles`; `save` writes them all
    into one .om, whose runtime picks the profile matching each run's input shapes. The
    profiles share int8 calibration statistics through `shared_stats`
    (quant.shared_stats.SharedStats): one the calibration data does not fit takes those of one
    it fits.

    For tools built on the compiler: `rewrite_gate(pass, rule, node) -> bool` may hold single
    rewrites back (subgraph tuning, bisection); `instruments`
    (graphopt.passes.instruments.Instrument) run around every pass after the built-in ones.
    """
    instruments = api_args.instrument_list(instruments)
    # Every other argument, as given, for each profile's compile under --dynamic-dims.
    arguments = {k: v for k, v in locals().items()
                 if k not in ("model", "dynamic_dims", "shared_stats", "tuning_db")}
    model = _model_argument(model)
    edits = _source_edits(out_nodes, input_fp16_nodes, output_type, insert_op_conf)
    start = time.perf_counter()
    target = api_args.target(target)
    api_args.check_run_options(verify, inputs, rtol, atol, memory_reorder, target)
    calibration = api_args.path(calibration, "calibration")
    pass_options = api_args.mapping(pass_options, "pass_options")
    if "level" in pass_options:  # one level picks the pipeline and the knowledge base's entry
        raise OptionError("pass_options: 'level' is optimize's own keyword; give level=")
    if rewrite_gate is not None and not callable(rewrite_gate):
        raise OptionError(f"rewrite_gate: expected a function (pass, rule, node) -> bool, "
                          f"got {rewrite_gate!r}")
    options = _options(level, disable_passes, switch_file, input_shapes, fold_size_limit,
                       verify_structure, dump_dir, allow_custom_ops, trace_rules, dump_format)
    tuned = _priced_on_float(tuned_decisions(tuning_db, model, target, level,
                                             options.input_shapes, input_shapes),
                             pass_options, precision, quantize)
    if tuned.gate is not None:
        rewrite_gate = _both_gates(tuned.gate, rewrite_gate)
        pass_options = {**(tuned.pass_options or {}), **pass_options}
        arguments.update(rewrite_gate=rewrite_gate, pass_options=pass_options)
    _set_options(options, precision, quantize, calibration, pass_options)
    _check_verify_device(verify, options, target)
    if dynamic_dims is not None:  # the options are checked once, before any profile's compile
        from graphopt.compile_profiles import optimize_profiles

        profiled = optimize_profiles(model, dynamic_dims, arguments)
        record_tuning(profiled, tuning_db, tuned)
        return profiled
    source = _import(model, options, edits, verify, target)
    data, mismatch = _calibration_data(options, source.model, shared_stats, edits.aipp)
    ctx = PassContext(options, tracer=Tracer(options.trace_rules) if options.trace_rules else None,
                      target=target, gate=rewrite_gate, calibration=data,
                      shared_stats=shared_stats, calibration_mismatch=mismatch)
    instruments = _instruments(options, instruments, source)
    if target is not None and not options.nchwc_block_size:
        options.nchwc_block_size = target.device(target.primary).nchwc_block_size
    pipeline = with_precision(for_target(PIPELINES[options.level], target), options)
    idle = idle_switches(options.disabled_passes, pipeline.pass_names())
    if idle:
        ctx.note(f"{option('disable_passes')} {', '.join(idle)}: not in this compile's pipeline "
                 f"({pipeline.name}), so switching {'it' if len(idle) == 1 else 'them'} off "
                 "changes nothing")
    try:
        log = PassManager(pipeline, ctx, instruments).run(source.model)
    except InputError as exc:  # a fault of the model a pass found: named with its file
        if not source.is_path or str(exc).startswith(f"{source.label}:"):
            raise
        raise InputError(f"{source.label}: {exc}") from None
    _check_compiled(source, options, ctx, log, target)
    _level_3_hint(source.model, options, ctx, target)
    result = OptimizeResult(source.model, log, source.label, source.sha256, source.ops_before,
                            notes=source.notes + ctx.notes, source_identity=source.identity)
    record_tuning(result, tuning_db, tuned)
    if ctx.tracer is not None:
        from graphopt.passes.rules import quiet_rule_reasons, rule_fire_counts

        why = quiet_rule_reasons(ctx.tracer.rules, pipeline.pass_names(),
                                 set(options.disabled_passes), options.level)
        result.traces = ctx.tracer.report(why_none=why, fired=rule_fire_counts(log))
    if source.reference is not None:
        try:
            with lending(source.lent):
                _verify(result, source.reference, inputs, options, rtol, atol)
        except InputError as exc:
            raise InputError(f"{exc}{_half_inputs_hint(str(exc), edits.fp16_inputs)}") from None
    if target is not None:
        _partition(result, target, options, memory_reorder)
    result.seconds = time.perf_counter() - start
    return result


def _model_argument(model):
    """optimize's `model` as load_onnx takes it; OptionError for anything else."""
    if isinstance(model, (bytearray, memoryview)):
        model = bytes(model)
    if not isinstance(model, (str, os.PathLike, ModelProto, bytes)):
        raise OptionError(f"optimize takes a path, an onnx.ModelProto or serialized bytes, not "
                          f"{type(model).__name__}")
    if isinstance(model, (str, os.PathLike)) and not os.fspath(model):
        raise OptionError("optimize: the model path is empty")
    return model


@dataclass
class _SourceEdits:
    """ATC's edits of the source model, parsed: what apply_source_edits does before any pass."""

    out_nodes: list | None
    fp16_inputs: list | None
    output_types: dict | None
    insert_op_conf: str | None
    aipp: object | None  # the AIPP configuration read from insert_op_conf


def _source_edits(out_nodes, input_fp16_nodes, output_type, insert_op_conf) -> _SourceEdits:
    wanted_outputs = None if out_nodes is None else parse_out_nodes(out_nodes)
    fp16_inputs = None if input_fp16_nodes is None else parse_fp16_inputs(input_fp16_nodes)
    output_types = None if output_type is None else parse_output_type(output_type)
    insert_op_conf = api_args.path(insert_op_conf, "insert_op_conf")
    aipp = None
    if insert_op_conf is not None:  # read first: a bad file fails before the model is loaded
        from graphopt.aipp_config import read_aipp_config

        aipp = read_aipp_config(insert_op_conf)
    return _SourceEdits(wanted_outputs, fp16_inputs, output_types, insert_op_conf, aipp)


def _priced_on_float(tuned, pass_options: dict, precision, quantize):
    """The knowledge base's subgraph decisions, their note saying so when this compile changes
    precision: subgraph tuning prices the float compile."""
    # As keywords, or as pass options (the command line's flags arrive so).
    converting = [setting(key, value) for key, value in (
                      ("precision", pass_options.get("precision", precision)),
                      ("quantize", pass_options.get("quantize", quantize)))
                  if value not in (None, "keep", "none")]
    if tuned.gate is None or not converting:
        return tuned
    return dataclasses.replace(tuned, note=(
        f"{tuned.note}, which were tuned on the float compile: {', '.join(converting)} "
        "changes what they were priced on (write the converted model and tune it to price "
        "them for it)"))


def _both_gates(tuned_gate, user_gate):
    """A rewrite gate that lets through what the tuned decisions and the caller's both allow."""
    if user_gate is None:
        return tuned_gate
    return lambda pass_name, rule, node: (tuned_gate(pass_name, rule, node)
                                          and user_gate(pass_name, rule, node))


def _set_options(options: Options, precision, quantize, calibration, pass_options: dict) -> None:
    """The precision keywords and `pass_options` into `options`, then every value checked."""
    # pass_options may override; None means the default, as for every other keyword
    options.precision, options.quantize = precision or "keep", quantize or "none"
    if calibration is not None:
        options.calibration = calibration
    for name, value in pass_options.items():
        if name not in Options.names():
            raise OptionError(_unknown_pass_option(name))
        try:
            setattr(options, name, Options.coerce(name, value))
        except ValueError as exc:
            raise OptionError(f"compile option '{name}' {exc}") from None
    _check_values(options)
    check_precision_options(options)


def _unknown_pass_option(name: str) -> str:
    """The message for a `pass_options` key that is no compile option: optimize's own keyword
    named as such, else the options it may have meant and the ones there are."""
    import difflib
    import inspect

    if name in inspect.signature(optimize).parameters:  # disable_passes, target, verify, …
        return f"pass_options: '{name}' is optimize's own keyword; give {name}="
    names = [n for n in Options.names() if n != "level"]  # level is refused as a key
    close = difflib.get_close_matches(str(name), names, n=1)
    return (f"pass_options: no compile option '{name}'"
            + (f" (did you mean '{close[0]}'?)" if close else "")
            + f"; the options: {', '.join(names)}")


def _check_verify_device(verify: bool, options: Options, target) -> None:
    """OptionError for --verify of a bfloat16 compile for a device that runs bfloat16: the CPU
    provider that verification runs on has no such kernels for most ops. Only for such a
    device: one without (ascend310) refuses the mode in the compile, naming the ops, where this
    sent the user to a CANN machine that has none either."""
    if not (verify and "bf16" in options.precision and target is not None):
        return
    device = target.device(target.primary)
    if device.kind != "cpu" and any("bfloat16" in kernel.dtypes
                                    for kernel in device.kernels.values()):
        from graphopt.partition.target import as_given

        raise OptionError(f"{setting('verify')} with {setting('precision', options.precision)} "
                          f"{setting('target', as_given(target))}: verification runs on "
                          "onnxruntime's CPU provider, which has no bfloat16 kernel for most "
                          "ops; compare on a machine with the CANN provider (graphopt compare), "
                          "or compile with fp16")


@dataclass
class _Source:
    """The model imported, checked, edited and pinned, and what the result records of it."""

    model: Model
    label: str                  # the input path, or "<model>"
    is_path: bool
    sha256: str | None          # of a model given in memory (a file's is read when saved)
    identity: tuple | None      # of the input file, see OptimizeResult.source_identity
    notes: list[str]
    reference: ModelProto | None  # the model before any pin or pass, for --verify
    ops_before: Counter
    # The model as given, weightless, for onnxruntime to judge (None with custom ops); whether
    # onnxruntime loaded it before the pins.
    given: bytes | None
    loaded_unpinned: bool
    domains: frozenset = frozenset()  # the opset imports of the model as given
    # The weights `reference` and the compiled model lend --verify's sessions (lent_weights).
    lent: dict = dataclasses.field(default_factory=dict)


def _import(model, options: Options, edits: _SourceEdits, verify: bool,
            target=None) -> _Source:
    is_path = isinstance(model, (str, os.PathLike))
    label = api_args.without_nul(os.fspath(model), "model") if is_path else "<model>"
    # Before the model is read: the file as compiled, the bytes as given.
    identity = file_identity(label) if is_path else None
    sha256 = None if is_path else memory_model_sha256(model)
    from graphopt.partition.precision_fit import npu_runs_bfloat16

    loaded = load_onnx(model, user_model=True)
    ir_model, inlined = _inlined(loaded, options)
    ir_model, upgraded = int8_ready(ir_model, options)
    pinned_first = False
    bfloat16_device = npu_runs_bfloat16(target)
    try:
        notes = check_input(ir_model, label, options.allow_custom_ops, bfloat16_device)
    except InputError:
        if not options.input_shapes:
            raise
        # A model whose dynamic form shape inference refuses (a Resize `sizes` of unknown
        # length) may be valid once pinned: the pins come first then.
        ir_model, _ = _inlined(load_onnx(model, user_model=True), options)
        ir_model, upgraded = int8_ready(ir_model, options)
        pin_input_shapes(ir_model, options.input_shapes)
        notes = check_input(ir_model, label, options.allow_custom_ops, bfloat16_device)
        pinned_first = True
    notes += [note for note in (inlined, upgraded) if note]
    # The source's own counts: an --out-nodes cut or inserted preprocessing is part of what
    # the compile did to it ("nodes 0 -> 0" for a cut at the input, 44 before for 23 nodes).
    ops_before = op_counts(ir_model.graph.all_nodes())
    notes += apply_source_edits(ir_model, edits.out_nodes, edits.aipp, label,
                                edits.insert_op_conf, options.input_shapes, edits.fp16_inputs,
                                edits.output_types)
    # The reference for verification (ended at out_nodes), before any pin or pass, and before
    # the inlining of the model's functions, which it then checks too; exported only when
    # needed, its weights lent to onnxruntime rather than copied (lent_weights).
    reference, lent = None, {}
    if verify and inlined and loaded is not ir_model:
        apply_source_edits(loaded, edits.out_nodes, edits.aipp, label, edits.insert_op_conf,
                           options.input_shapes, edits.fp16_inputs, edits.output_types)
        with lending(lent):
            reference = lean_onnx(loaded)
    elif verify:
        with lending(lent):
            reference = lean_onnx(ir_model)
    notes += overridable_note(ir_model)
    # The model as given, weightless, for onnxruntime to judge: before any pin, a model it
    # loads must load pinned (check_compiled_loads); unpinned, only when its compile does not
    # load (check_loads: serialized now, loaded only then, a session being ~10% of a small
    # model's compile).
    given = None if options.allow_custom_ops else weightless_bytes(ir_model)
    loaded_unpinned = bool(options.input_shapes) and given is not None \
        and numerics.load_refusal(given) is None
    if options.input_shapes:
        # A profile's compile pins -1 where its profile sets nothing: optimize_profiles notes
        # the user's own -1s once.
        fixed = None if "dynamic_dims" in PIN_OPTIONS.get() else fixed_dims_note(
            ir_model, options.input_shapes,
            frozenset(inserted_preprocessing(ir_model.metadata_props)))
        if fixed:
            notes.append(fixed)
        if not pinned_first:
            pin_input_shapes(ir_model, options.input_shapes)
        infer_shapes(ir_model)
        check_pinned_shapes(ir_model, label, options.input_shapes)
    return _Source(ir_model, label, is_path, sha256, identity, notes, reference, ops_before,
                   given, loaded_unpinned, frozenset(ir_model.opset_imports), lent)


def _inlined(model: Model, options: Options) -> tuple[Model, str | None]:
    """`model` with its own local functions inlined (inline_functions), but at -O0, which
    compiles the model as it is."""
    if options.level < 1:
        return model, None
    from graphopt.inline_functions import inline_user_functions

    return inline_user_functions(model)


def _calibration_data(options: Options, model: Model, shared_stats, aipp):
    """(the calibration data read and checked against the (pinned) inputs before any pass, or
    None; the refusal of a shape profile the data does not fit, whose QuantizeInt8 borrows
    another profile's statistics through `shared_stats`)."""
    if not options.calibration:
        return None, None
    from graphopt.quant.calib_data import CalibrationShapeError, check_calibration

    try:
        data = check_calibration(options.calibration, model.graph)
    except CalibrationShapeError as exc:
        if shared_stats is None:
            raise _with_image_hint(exc, aipp) from None
        if shared_stats.misfit is None or exc.matched > shared_stats.misfit_matched:
            # the refusal of the profile the data came closest to (the most inputs fitting)
            shared_stats.misfit = f"shape profile {shared_stats.profile}: {exc}"
            shared_stats.misfit_matched = exc.matched
        return None, exc
    except OptionError as exc:  # of another dtype, say
        raise _with_image_hint(exc, aipp) from None
    if shared_stats is not None:
        shared_stats.fitted = True
    return data, None


def _instruments(options: Options, extra: list, source: _Source) -> list:
    """The instruments run around every pass: the built-in ones the options ask for, then the
    caller's."""
    instruments = []
    if options.verify_structure:
        instruments.append(VerifyAfterEachPass())
    if options.dump_dir:
        instruments.append(DumpIR(options.dump_dir, options.dump_format,
                                  source=source.label if source.is_path else None))
    return instruments + list(extra)


def _check_compiled(source: _Source, options: Options, ctx: PassContext, log: PassLog,
                    target) -> None:
    """After the passes: output declarations as computed, the lossy passes marked, and the
    compiled model loaded by onnxruntime where the given one loads (compile_checks)."""
    corrected = correct_output_declarations(source.model)
    if corrected:
        ctx.note(f"graph output(s) declared otherwise than computed, now declared as computed "
                 f"(onnxruntime warns of such a declaration and returns what it computes): "
                 f"{'; '.join(corrected)}")
    _mark_lossy(source.model, log, target, options.precision)
    _drop_unused_domains(source.model, source.domains)
    # A model given in float16 (or kept so) reaches no ConvertPrecision, which rewrites this
    # form where it makes it: onnxruntime would die loading the compiled model, --verify with it.
    moved = sum(move_batch_swaps_after_half_matmuls(graph)
                for graph in source.model.graph.all_graphs())
    if moved:
        ctx.note(f"{moved} float16 Transpose(perm=[1, 0, 2]) moved after the MatMul it fed, as "
                 "equal products: onnxruntime 1.32 crashes loading the other form at "
                 "ORT_ENABLE_ALL")
    if not options.input_shapes:  # pinned, check_pinned_shapes and check_compiled_loads do
        check_runs_at_its_shapes(source.model, source.label)
    foreign = foreign_block_note(source.model)
    if foreign:  # onnxruntime here would refuse it, or run it wrong: nothing to check here
        ctx.notes.append(foreign)
    elif source.loaded_unpinned:
        check_compiled_loads(source.model, source.label, options.input_shapes)
    elif source.given is not None and not options.input_shapes:
        npu = target is not None and target.primary != target.host
        device = target.device(target.primary).providers[0] if npu else ""
        note = check_loads(source.model, source.label, source.given, device)
        if note:
            ctx.notes.append(note)


# -O is optimize's one short flag, which FLAGS (long flags only) leaves out.
_LEVEL_FLAG = {"level": "-O"}


def _level_3_hint(model: Model, options: Options, ctx: PassContext, target) -> None:
    """A note where -O3 would lower STFTs (1.3-9x faster as the Conv -O3 makes of them), which
    -O2 keeps for their last bits."""
    if options.level >= 3 or options.precision != "keep":  # an NPU target's host runs STFT
        return
    from graphopt.passes.fusion.stft import lowerable_frames

    frames = lowerable_frames(model)
    if frames:
        ctx.note(f"{len(frames)} STFT(s) of {frames[0]}-sample frames: "
                 f"{setting('level', 3, _LEVEL_FLAG)} makes each a Conv, faster than "
                 "onnxruntime's CPU STFT (9x for frames of no power of two, 1.3-1.9x for "
                 "powers of two up to 512), whose spectrum differs from onnxruntime's by "
                 "onnxruntime's own error (up to ~1e-4 of the largest bin where it runs a "
                 "plain DFT, ~1e-6 for its FFTs; see LowerSTFT)")


def _drop_unused_domains(model: Model, given: frozenset) -> None:
    """Drop the opset imports a pass added for a domain no node uses any more: an int8 compile
    whose every com.microsoft op was rewritten declared that domain still, and `diff` showed it
    as a change. The model's own imports stay, used or not."""
    used = {node.domain for node in model.graph.all_nodes()}
    for function in model.functions:  # protos, carried through untouched
        used |= {function.domain} | {node.domain for node in function.node}
    for domain in [d for d in model.opset_imports if d not in given]:
        if domain not in used and domain not in ("", "ai.onnx"):
            del model.opset_imports[domain]


def _half_inputs_hint(message: str, fp16_inputs: list[str] | None) -> str:
    """A hint for --inputs whose arrays keep the model's own float32 where --input-fp16-nodes
    made an input take float16: --verify runs the model as compiled, which takes them so."""
    for name in fp16_inputs or ():
        if f"input {name!r} has dtype float32, expected float16" in message:
            return (f" ({option('input_fp16_nodes')} makes it take float16, and "
                    f"{option('inputs')} holds what the compiled model takes)")
    return ""


def _verify(result: OptimizeResult, reference: ModelProto, inputs, options: Options,
            rtol: float | None, atol: float | None) -> None:
    """--verify: the compiled model against `reference` (compile_verify.verify_outputs), by the
    accuracy rule the pass log calls for; VerificationError when they differ."""
    from graphopt.tools.accuracy_rule import accuracy_rule

    log = result.log
    try:
        judge, result.verify_note = accuracy_rule(
            log.to_json()["passes"], rtol, atol,
            choose=f"{option('rtol')}/{option('atol')} judge by allclose")
        rounding: list[str] = []
        # Tolerances given apply as given, as in compare and bisect.
        result.max_abs_error = verify_outputs(reference, lean_onnx(result.model), inputs,
                                              options, judge, rounding,
                                              allow_rounding=rtol is None and atol is None,
                                              empty=result.empty_outputs)
        result.verify_note = "; ".join(filter(None, [result.verify_note, *rounding]))
    except VerificationError as exc:
        # -O3's Winograd convs and lowered STFTs are exact to a layer's scale, not to each
        # element's.
        from graphopt.passes.fusion.stft import tolerance_hint as stft_hint
        from graphopt.passes.winograd import tolerance_hint as winograd_hint

        totals = log.totals()
        counts = {name: sum(totals.get(name, {}).get("rewrites", {}).values())
                  for name in ("WinogradConv", "LowerSTFT")}
        if counts["LowerSTFT"] and not counts["WinogradConv"] \
                and _verified_against_exact_stfts(result, reference, inputs, options, rtol, atol):
            return
        hints = [hint(counts[name]) for name, hint in (("WinogradConv", winograd_hint),
                                                       ("LowerSTFT", stft_hint))
                 if counts[name]]
        if not hints:
            raise
        raise VerificationError(f"{exc} ({'; '.join(hints)})") from None


def _verified_against_exact_stfts(result: OptimizeResult, reference: ModelProto, inputs,
                                  options: Options, rtol, atol) -> bool:
    """Whether the compile matches the original with its STFTs lowered alone
    (compile_verify.exact_stft_reference); the verify note then says which reference it met."""
    from graphopt.compile_verify import EXACT_STFT_NOTE, exact_stft_reference
    from graphopt.tools.accuracy_rule import accuracy_rule

    exact = exact_stft_reference(reference)
    if exact is None:
        return False
    judge, note = accuracy_rule(result.log.to_json()["passes"], rtol, atol)
    try:
        result.max_abs_error = verify_outputs(exact, lean_onnx(result.model), inputs,
                                              options, judge)
    except VerificationError:
        return False
    result.verify_note = "; ".join(filter(None, [note, EXACT_STFT_NOTE]))
    return True


def _partition(result: OptimizeResult, target, options: Options, memory_reorder: bool) -> None:
    """Place the compiled model on the target's devices, cut it into partition models and plan
    each one's memory, into `result`."""
    from graphopt.codegen.split import partition_ir
    from graphopt.partition import partition
    from graphopt.partition.precision_fit import (check_host_bfloat16, host_float16_note,
                                                  quantized_fallback_note)
    from graphopt.partition.report import dynamic_hint, returned_note
    from graphopt.partition.target import as_given

    from graphopt.passes.fusion.transpose_sinking import pads_for_every_axis

    model = result.model
    # At every level, -O0 too: onnxruntime's own optimizer, which the partitions' sessions
    # run, fails at run time on a Pad that names its axes next to a Transpose.
    for graph in list(model.graph.all_graphs()):
        pads_for_every_axis(graph)
    result.partitioning = partition(model, target)
    check_host_bfloat16(result.partitioning, options, model, result.log)
    for note in (quantized_fallback_note(result.partitioning, options),
                 host_float16_note(result.partitioning, options, model)):
        if note:
            result.notes.append(note)
    dynamic = dynamic_hint(model, result.partitioning, result.log)
    if dynamic:  # ATC takes static shapes only: say why the NPU got less than it could
        result.notes.append(f"{setting('target', as_given(target))}: {dynamic}")
    returned = returned_note(result.partitioning)
    if returned:
        result.notes.append(f"{setting('target', as_given(target))}: {returned}")
    result.partition_models = partition_ir(model, result.partitioning)
    result.memory_plans = plan_partition_memory(result.partition_models, memory_reorder,
                                                result.partitioning.layouts)


def _with_image_hint(exc: Exception, aipp) -> Exception:
    """A calibration refusal that says why images are expected, under --insert-op-conf."""
    if not aipp or "the model expects" not in str(exc):
        return exc
    return type(exc)(f"{exc} ({option('insert_op_conf')} makes the model take uint8 images, "
                     "and it calibrates on them: give frames, not preprocessed tensors)")


def _mark_lossy(model: Model, log: PassLog, target, precision: str) -> None:
    """Name the lossy precision passes that changed the model in its metadata, so that compare
    judges an optimized .onnx (which carries no pass log) as it judges an .om, the kind of
    device they were made for when it is an NPU (accuracy_rule.deployed_level), and the
    precision mode ConvertPrecision ran (fp16 and mixed-fp16 read alike otherwise)."""
    from graphopt.tools.accuracy_rule import (LOSSY_DEVICE_KEY, LOSSY_KEY, PRECISION_KEY,
                                              lossy_passes, marked_lossy)

    lossy = lossy_passes(log.to_json()["passes"])
    if lossy:
        known = marked_lossy(model.metadata_props)
        model.metadata_props[LOSSY_KEY] = ",".join(dict.fromkeys(known + lossy))
        if target is not None and target.device(target.primary).kind == "npu":
            model.metadata_props[LOSSY_DEVICE_KEY] = "npu"
        if "ConvertPrecision" in lossy:
            model.metadata_props[PRECISION_KEY] = precision


