"""The compile driver behind `graphopt optimize` and `graphopt.optimize`: import, check, pin
shapes, run a pipeline, optionally verify numerically, save ONNX or `.om`."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import stat
import time
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from onnx import ModelProto

from graphopt import api_args, numerics
from graphopt.codegen.profile_match import profiles_count
from graphopt.compile_tuning import knowledge_base, record_tuning, tuned_decisions
from graphopt.errors import InputError, OptionError, VerificationError
from graphopt.input_shapes import input_shapes_argument, pin_input_shapes, validate_input_shapes
from graphopt.ir import Model, load_onnx, to_onnx
from graphopt.ir.onnx_io import check_no_external_references, is_repeated_field
from graphopt.ir.external_data import save_onnx
from graphopt.ir.collector import collection_paused, heap_frozen
from graphopt.ir.tensor import external_initializers, stat_identity, tensor_references
from graphopt.portable_types import residual_types_kept
from graphopt.source_edits import apply_source_edits
from graphopt.source_marks import (EXTRA_CUT, EXTRA_IO_TYPES, EXTRA_PREPROCESS, cut_outputs,
                                   frames_hint, inserted_preprocessing, io_types)
from graphopt.deprecated_ops import EARLY_LAYER_NORM_HINT, replace_deprecated_ops
from graphopt.opcheck import check_kernel_dtypes, check_ops
from graphopt.option_names import from_command_line, option, setting
from graphopt.io_types import parse_fp16_inputs, parse_output_type
from graphopt.out_nodes import parse_out_nodes
from graphopt.output_kind import check_file_name, writes_om, writes_onnx
from graphopt.passes import PIPELINES, Options, PassContext, PassLog, PassManager, for_target
from graphopt.passes.pipelines import with_precision
from graphopt.passes.precision.policy import check_options as check_precision_options
from graphopt.passes.infer_shapes import (drop_unfounded_declarations, infer_shapes,
                                          record_type_bytes)
from graphopt.passes.disputed_shapes import forget_disputed_sizes
from graphopt.passes.instruments import DUMP_FORMATS, DumpIR, VerifyAfterEachPass
from graphopt.passes.output_declarations import correct_output_declarations
from graphopt.passes.rules import RULES, Tracer, idle_switches
from graphopt.quant.opset_upgrade import int8_ready
from graphopt.rounding import within_rounding
from graphopt.switches import read_switch_file

if TYPE_CHECKING:
    from graphopt.partition import Partitioning, Target

# The manifest's target for an .om compiled without one: no device layout, the CPU runs it.
PORTABLE_TARGET = "none"


@dataclass
class OptimizeResult:
    """The optimized model, its pass log, and what the compile noticed."""

    model: Model
    log: PassLog
    source_label: str                 # the input path, or "<model>" for protos and bytes
    source_sha256: str | None         # of the input's serialized bytes; None: hash the path
    ops_before: Counter               # op types of the input, nested graphs included
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    max_abs_error: dict[str, float] | None = None  # per output, when verified
    verify_note: str = ""             # why verification judged by cosine, when it did
    traces: list[str] = field(default_factory=list)  # --trace-rule reports
    partitioning: "Partitioning | None" = None  # when compiled for a target
    partition_models: dict = field(default_factory=dict)  # partition name -> Model
    memory_plans: dict = field(default_factory=dict)  # partition name -> Plan, or why none
    # With --dynamic-dims: every shape profile's compile (compile_profiles.CompiledProfile),
    # this result being the first's, and the model's signature before any pin.
    profiles: list = field(default_factory=list)
    dynamic_signature: dict | None = None
    # The knowledge base optimize(tuning_db=…) read, which save() takes its tilings from, and
    # the subgraph study whose decisions the compile applied (None: none applied).
    tuning_db: str | None = None
    tuned_study: str | None = None
    # The input file as compiled (device, inode, size, mtime; None: not a regular file): an
    # .om records its sha256 only while the path still holds those bytes.
    source_identity: tuple | None = None

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    def to_onnx(self) -> ModelProto:
        return to_onnx(self.model, value_infos=residual_types_kept(self.model))

    def __repr__(self) -> str:
        """One line (the dataclass's own would print the model and every pass record)."""
        nodes = self.model.graph.count_nodes()
        parts = [self.source_label, f"{self.log.pipeline}",
                 f"nodes {self.nodes_before} -> {nodes}", f"{self.seconds:.2f} s"]
        if self.partitioning is not None:
            parts.append(f"partitions {', '.join(self.partition_models)}")
        if self.profiles:
            parts.append(profiles_count(len(self.profiles)))
        if self.notes:
            parts.append(f"{len(self.notes)} note{'s' * (len(self.notes) != 1)}")
        return f"<OptimizeResult {', '.join(parts)}>"


def op_counts(nodes) -> Counter:
    """Nodes per op type, as the summary names them (`domain::Op` outside the default domain)."""
    return Counter(node.qualified_op for node in nodes)


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
    for name, least in (("fold_size_limit", 0), ("max_iterations", 1),
                        ("elementwise_max_group", 1)):
        if getattr(options, name) < least:
            raise OptionError(f"{option(name)} must be ≥ {least}, got {getattr(options, name)}")
    input_shapes = validate_input_shapes(options.input_shapes)
    options.input_shapes = input_shapes
    dump_dir, dump_format = options.dump_dir, options.dump_format
    if dump_dir and os.path.exists(dump_dir) and not os.path.isdir(dump_dir):
        raise OptionError(f"{setting('dump_dir', dump_dir)}: exists and is not a directory")
    if dump_format not in DUMP_FORMATS:
        raise OptionError(f"{setting('dump_format', dump_format)}: unknown format "
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


def check_input(model: Model, label: str, allow_custom_ops: bool = False) -> list[str]:
    """check_ops on the imported model (InputError naming the node at fault), keeping the
    static types its shape inference found: a static model is then typed in full, and the
    pipeline's InferShapes passes have nothing left to do. Deprecated ops onnxruntime still
    runs are rewritten first; returns the notes saying so."""
    notes = replace_deprecated_ops(model, label)
    with heap_frozen():  # the IR is long-lived: no full collection should walk it again
        try:
            types = check_ops(model, label, allow_custom_ops)
        except InputError as exc:
            if "LayerNormalization" in str(exc) and any(
                    n.startswith("LayerNormalization at opset") for n in notes):
                raise InputError(f"{exc}; {EARLY_LAYER_NORM_HINT}") from None
            raise
        if types is not None:
            drop_unfounded_declarations(model, types)
            record_type_bytes(model, types, static_only=True)
            forget_disputed_sizes(model)  # onnxruntime's sizes: see disputed_shapes
        check_kernel_dtypes(model, label)
    return notes


def overridable_initializers(model: Model) -> list[str]:
    """The graph inputs that carry an initializer a caller may override (ONNX IR ≥ 4)."""
    return [v.name for v in model.graph.inputs if v.const is not None and v.overridable]


def _overridable_note(model: Model) -> list[str]:
    """The note a model with overridable initializers gets: what each output does with them."""
    names = overridable_initializers(model)
    if not names:
        return []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return [f"{shown}: initializer(s) the model also lists as inputs, which ONNX lets a caller "
            "override: no pass folds them, optimized ONNX keeps them overridable, and an .om "
            "fixes them at their values (it takes no such feed), as ATC fixes weights"]


def _memory_model_sha256(model: ModelProto | bytes) -> str:
    """The source hash the artifact records for a model given in memory: of its serialized
    bytes; past protobuf's 2 GiB (a model onnx.load read with its external data), which no
    one message serializes to, of its fields and main-graph elements serialized one by one."""
    if isinstance(model, bytes):
        return hashlib.sha256(model).hexdigest()
    data = numerics.serialized(model)
    if data is not None:
        return hashlib.sha256(data).hexdigest()
    digest = hashlib.sha256()
    for owner in (model, model.graph):
        for descriptor, value in owner.ListFields():
            if owner is model and descriptor.name == "graph":
                continue
            digest.update(descriptor.number.to_bytes(4, "little"))
            for element in (value if is_repeated_field(descriptor) else [value]):
                data = (element.SerializeToString()
                        if descriptor.type == descriptor.TYPE_MESSAGE else repr(element).encode())
                digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def check_pinned_shapes(model: Model, label: str, shapes: dict[str, list[int]]) -> None:
    """Strict shape inference again, on the pinned model: a pin the graph cannot take (a batch of
    3 added to a [2, 4] weight) would otherwise compile, infer_shapes being best effort, into
    an artifact onnxruntime refuses to load. InputError naming the node and the pins."""
    from graphopt.input_shapes import reshape_conflict
    from graphopt.opcheck import check_inference

    try:
        check_inference(model, label)
    except InputError as exc:
        raise InputError(f"{exc} (with the pinned shapes {_pins(shapes, model)})") from None
    conflict = reshape_conflict(model)
    if conflict:  # inference lets a static element count through that the kernel refuses
        raise InputError(f"{label}: {conflict} with the pinned shapes {_pins(shapes, model)}")


def check_compiled_loads(model: Model, label: str, shapes: dict[str, list[int]]) -> None:
    """InputError when onnxruntime refuses the compiled model that the pins made static (its
    caller knows it loaded the model before them). ONNX's inference does not see all that
    onnxruntime's does: silero-vad pinned to [1, 512] makes the If branch for the other
    sample rate, which those inputs never take, give its LSTM a rank-4 input once the shapes
    fold."""
    from graphopt.input_shapes import reshape_conflict

    conflict = reshape_conflict(model)  # a target folded from Concat/Shape only now
    if conflict:
        raise InputError(f"{label}: {conflict} with the pinned shapes {_pins(shapes, model)}: the "
                         "model fixes that size, so it cannot run at these shapes")
    refusal = onnxruntime_refusal(model)
    # A missing kernel is about types, which pins do not change: a bfloat16 compile for an
    # NPU the CPU provider has no kernels for (it runs where the CANN provider is).
    if refusal and _missing_kernel(refusal, model):
        return
    if refusal and onnxruntime_refusal(model, weightless=False):  # weights in place: surely
        raise InputError(f"{label}: with the pinned shapes {_pins(shapes, model)}, onnxruntime "
                         f"cannot load the compiled model: {refusal}. A pin can give a shape to a "
                         "branch the inputs never take that it cannot have: leave such an "
                         f"input's dims open ({_unpinned_advice()})")


def _unpinned_advice() -> str:
    """How to leave an input's dims open, in terms of the options that pinned them."""
    given = PIN_OPTIONS.get()
    advice = (f"no {option('dynamic_dims')} key on its dims" if "dynamic_dims" in given
              else f"no {option('input_shapes')} for it")
    return advice + (f", nor {option('input_shapes')}" if len(given) > 1 else "")


def check_loads(model: Model, label: str, given: bytes) -> str | None:
    """InputError when onnxruntime cannot load the compiled model where it loads the original
    (`given`, weightless_bytes of the model as given): a model it loads but cannot run, or a
    rewrite gone wrong. A note when it loads neither: the model as given is one onnxruntime
    refuses, and so will the output be. None when it loads. A missing kernel is about types,
    which the CPU provider may lack for a device's compile (bfloat16), and is left to the
    artifact's runtime."""
    refusal = onnxruntime_refusal(model)
    if refusal and not _missing_kernel(refusal, model):
        # Some kernels take only constant weights, which the weightless check passes as inputs.
        refusal = onnxruntime_refusal(model, weightless=False)
    if not refusal or _missing_kernel(refusal, model):
        return None
    if numerics.load_refusal(given) is None:
        # Either a model onnxruntime loads but can never run (a Reshape to a size its data
        # does not have), whose contradiction folding made static, or a rewrite gone wrong.
        basic = numerics.load_refusal(given, level="basic")
        if basic is not None and _innermost(basic) == _innermost(refusal):
            # Its own optimizer, which infers shapes into the branches, refuses the original
            # too: the model is what breaks once shapes are known, not graphopt's rewrite.
            raise InputError(f"{label}: onnxruntime loads the original only with its graph "
                             f"optimizations off (ORT_DISABLE_ALL; at ORT_ENABLE_BASIC: "
                             f"{basic}); graphopt infers and folds shapes as that optimizer "
                             f"does, and the compiled model meets the same refusal: {refusal}. "
                             "The model is at fault (a node that cannot take the shapes "
                             "inference gives it), not a rewrite")
        raise InputError(f"{label}: onnxruntime cannot load the compiled model, where it loads "
                         f"the original: {refusal}. If the original runs, this is a graphopt "
                         "bug (--disable-pass on the pass that made the node, or -O0, compiles "
                         "without it); a model onnxruntime loads but cannot run fails so once "
                         "its shapes fold")
    return (f"{UNLOADABLE_NOTE}, nor its compile: {refusal} (the output will not load where "
            "this onnxruntime runs)")


def _innermost(refusal: str) -> str:
    """What onnxruntime's refusal says last, after the nodes and error kinds that lead to it
    ("First input tensor must have rank 3"): two refusals alike there are the same fault."""
    return refusal.rsplit("] ", 1)[-1].strip()


def _missing_kernel(refusal: str, model: Model) -> bool:
    """Whether onnxruntime's CPU provider refuses the model for a kernel it lacks: none for an
    op's types (NOT_IMPLEMENTED), or, where it has none for a function op's bfloat16 (Clip),
    the bfloat16 its expansion's ops refuse: the type error then names an op the model does not
    hold (Clip's body's Where). Both are the CPU provider's gaps, which the device a compile
    targets does not share, and are left to the artifact's runtime."""
    if "NOT_IMPLEMENTED" in refusal:
        return True
    found = re.search(r"Type Error: Type 'tensor\(bfloat16\)' of input parameter \(.*?\) "
                      r"of operator \((\w+)\)", refusal)
    return found is not None and found.group(1) not in {
        node.op_type for node in model.graph.all_nodes()}


# How check_loads' note starts: `optimize -q` still prints it, as a warning.
UNLOADABLE_NOTE = "onnxruntime cannot load the model as given"


def _pins(shapes: dict[str, list[int]], model: Model) -> str:
    """The pinned input shapes as --input-shape writes them, with the sizes `model` has where a
    pin keeps a dim (-1): a shape profile's pins keep the dims the model fixes, which were
    quoted as -1 (x:3,-1 of an x[B, 4])."""
    inputs = {v.name: v.shape for v in model.graph.inputs}
    quoted = []
    for name, dims in shapes.items():
        shape = inputs.get(name) or ()
        sizes = [held if pinned == -1 and isinstance(held, int) else pinned
                 for pinned, held in zip(dims, [*shape, *[None] * (len(dims) - len(shape))])]
        quoted.append(f"{name}:{','.join(map(str, sizes))}")
    return ";".join(quoted)


# The options that pinned the input shapes of the compile under way, as the user gave them:
# a shape profile's compile (compile_profiles) sets them, since its pins come from
# --dynamic-dims, and advice to drop an --input-shape the user never gave misleads.
PIN_OPTIONS: ContextVar[tuple[str, ...]] = ContextVar("PIN_OPTIONS", default=("input_shapes",))
# Set while a shape profile whose shapes the given --inputs do not fit is compiled: it verifies
# on seeded inputs, and its failure must not ask for the --inputs the user gave.
INPUTS_FIT_OTHER_PROFILES: ContextVar[bool] = ContextVar("INPUTS_FIT_OTHER_PROFILES",
                                                         default=False)


def weightless_bytes(model: Model) -> bytes | None:
    """The model serialized with weights above 1 KiB as graph inputs of their type and shape,
    as onnxruntime_refusal has onnxruntime judge it; None past protobuf's 2 GiB."""
    return numerics.serialized(to_onnx(model, weights_as_inputs_above=1024, value_infos=False))


def onnxruntime_refusal(model: Model, weightless: bool = True) -> str | None:
    """Why onnxruntime refuses to load `model` (None when it loads it, or when it cannot be
    asked: a model past protobuf's 2 GiB with its weights), as a session without graph
    optimizations sees it. `weightless`: weights above 1 KiB are passed as graph inputs of
    their type and shape, so the check copies no weight and costs milliseconds (a kernel that
    needs a constant weight, MatMulNBits', then refuses what it would load)."""
    data = numerics.serialized(to_onnx(model, weights_as_inputs_above=1024 if weightless
                                       else None, value_infos=False))
    return numerics.load_refusal(data) if data is not None else None


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
    if isinstance(model, (bytearray, memoryview)):
        model = bytes(model)
    if not isinstance(model, (str, os.PathLike, ModelProto, bytes)):
        raise OptionError(f"optimize takes a path, an onnx.ModelProto or serialized bytes, not "
                          f"{type(model).__name__}")
    if isinstance(model, (str, os.PathLike)) and not os.fspath(model):
        raise OptionError("optimize: the model path is empty")
    wanted_outputs = None if out_nodes is None else parse_out_nodes(out_nodes)
    fp16_inputs = None if input_fp16_nodes is None else parse_fp16_inputs(input_fp16_nodes)
    output_types = None if output_type is None else parse_output_type(output_type)
    insert_op_conf = api_args.path(insert_op_conf, "insert_op_conf")
    aipp = None
    if insert_op_conf is not None:  # read first: a bad file fails before the model is loaded
        from graphopt.aipp_config import read_aipp_config

        aipp = read_aipp_config(insert_op_conf)
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
    tuned = tuned_decisions(tuning_db, model, target, level, options.input_shapes,
                             input_shapes)
    # As keywords, or as pass options (the command line's flags arrive so).
    converting = [setting(key, value) for key, value in (
                      ("precision", pass_options.get("precision", precision)),
                      ("quantize", pass_options.get("quantize", quantize)))
                  if value not in (None, "keep", "none")]
    if tuned.gate is not None and converting:  # subgraph tuning prices the float compile
        tuned = dataclasses.replace(tuned, note=(
            f"{tuned.note}, which were tuned on the float compile: {', '.join(converting)} "
            "changes what they were priced on (write the converted model and tune it to price "
            "them for it)"))
    if tuned.gate is not None:
        user_gate = rewrite_gate
        rewrite_gate = tuned.gate if user_gate is None else (
            lambda pass_name, rule, node: tuned.gate(pass_name, rule, node)
            and user_gate(pass_name, rule, node))
        pass_options = {**(tuned.pass_options or {}), **pass_options}
        arguments.update(rewrite_gate=rewrite_gate, pass_options=pass_options)
    # pass_options may override; None means the default, as for every other keyword
    options.precision, options.quantize = precision or "keep", quantize or "none"
    if calibration is not None:
        options.calibration = calibration
    for name, value in pass_options.items():
        if name not in Options.names():
            raise OptionError(f"compile option '{name}' does not exist (options: "
                              f"{', '.join(Options.names())})")
        try:
            setattr(options, name, Options.coerce(name, value))
        except ValueError as exc:
            raise OptionError(f"compile option '{name}' {exc}") from None
    _check_values(options)
    check_precision_options(options)
    # Only for a device that runs bfloat16: one without (ascend310) refuses the mode in the
    # compile, naming the ops, where this sent the user to a CANN machine that has none either.
    if verify and "bf16" in options.precision and target is not None \
            and target.device(target.primary).kind != "cpu" \
            and any("bfloat16" in kernel.dtypes
                    for kernel in target.device(target.primary).kernels.values()):
        from graphopt.partition.target import as_given

        raise OptionError(f"{setting('verify')} with {setting('precision', options.precision)} "
                          f"{setting('target', as_given(target))}: verification runs on "
                          "onnxruntime's CPU provider, which has no bfloat16 kernel for most "
                          "ops; compare on a machine with the CANN provider (graphopt compare), "
                          "or compile with fp16")
    if dynamic_dims is not None:  # the options are checked once, before any profile's compile
        from graphopt.compile_profiles import optimize_profiles

        profiled = optimize_profiles(model, dynamic_dims, arguments)
        record_tuning(profiled, tuning_db, tuned)
        return profiled
    is_path = isinstance(model, (str, os.PathLike))
    label = os.fspath(model) if is_path else "<model>"
    source_sha256 = None
    source_identity = file_identity(label) if is_path else None
    if not is_path:
        source_sha256 = _memory_model_sha256(model)
    ir_model, upgraded = int8_ready(load_onnx(model, user_model=True), options.quantize)
    pinned_first = False
    try:
        import_notes = check_input(ir_model, label, options.allow_custom_ops)
    except InputError:
        if not options.input_shapes:
            raise
        # A model whose dynamic form shape inference refuses (a Resize `sizes` of unknown
        # length) may be valid once pinned: the pins come first then.
        ir_model, upgraded = int8_ready(load_onnx(model, user_model=True), options.quantize)
        pin_input_shapes(ir_model, options.input_shapes)
        import_notes = check_input(ir_model, label, options.allow_custom_ops)
        pinned_first = True
    if upgraded:
        import_notes.append(upgraded)
    import_notes += apply_source_edits(ir_model, wanted_outputs, aipp, label, insert_op_conf,
                                       options.input_shapes, fp16_inputs, output_types)
    # The reference for verification (ended at out_nodes), before any pin or pass; exported
    # only when needed since it copies every weight.
    source = to_onnx(ir_model) if verify else None
    ops_before = op_counts(ir_model.graph.all_nodes())
    import_notes += _overridable_note(ir_model)
    # The model as given, weightless, for onnxruntime to judge: before any pin, a model it
    # loads must load pinned (check_compiled_loads); unpinned, only when its compile does not
    # load (check_loads: serialized now, loaded only then, a session being ~10% of a small
    # model's compile).
    given = None if options.allow_custom_ops else weightless_bytes(ir_model)
    loaded_unpinned = bool(options.input_shapes) and given is not None \
        and numerics.load_refusal(given) is None
    if options.input_shapes:
        if not pinned_first:
            pin_input_shapes(ir_model, options.input_shapes)
        infer_shapes(ir_model)
        check_pinned_shapes(ir_model, label, options.input_shapes)
    calibration = mismatch = None
    if options.calibration:  # read and checked against the (pinned) inputs before any pass
        from graphopt.quant.calib_data import CalibrationShapeError, check_calibration

        try:
            calibration = check_calibration(options.calibration, ir_model.graph)
        except CalibrationShapeError as exc:
            if shared_stats is None:
                raise _with_image_hint(exc, aipp) from None
            mismatch = exc  # a shape profile the data does not fit: QuantizeInt8 borrows
            shared_stats.misfit = shared_stats.misfit or \
                f"shape profile {shared_stats.profile}: {exc}"
        except OptionError as exc:  # of another dtype, say
            raise _with_image_hint(exc, aipp) from None
        else:
            if shared_stats is not None:
                shared_stats.fitted = True

    ctx = PassContext(options, tracer=Tracer(options.trace_rules) if options.trace_rules else None,
                      target=target, gate=rewrite_gate, calibration=calibration,
                      shared_stats=shared_stats, calibration_mismatch=mismatch)
    extra_instruments, instruments = list(instruments), []
    if options.verify_structure:
        instruments.append(VerifyAfterEachPass())
    if options.dump_dir:
        instruments.append(DumpIR(options.dump_dir, options.dump_format,
                                  source=label if is_path else None))
    instruments += extra_instruments
    if target is not None and not options.nchwc_block_size:
        options.nchwc_block_size = target.device(target.primary).nchwc_block_size
    pipeline = with_precision(for_target(PIPELINES[options.level], target), options)
    idle = idle_switches(options.disabled_passes, pipeline.pass_names())
    if idle:
        ctx.note(f"{option('disable_passes')} {', '.join(idle)}: not in this compile's pipeline "
                 f"({pipeline.name}), so switching {'it' if len(idle) == 1 else 'them'} off "
                 "changes nothing")
    log = PassManager(pipeline, ctx, instruments).run(ir_model)
    corrected = correct_output_declarations(ir_model)
    if corrected:
        ctx.note(f"graph output(s) declared otherwise than computed, now declared as computed "
                 f"(onnxruntime warns of such a declaration and returns what it computes): "
                 f"{'; '.join(corrected)}")
    _mark_lossy(ir_model, log, target)
    if loaded_unpinned:
        check_compiled_loads(ir_model, label, options.input_shapes)
    elif given is not None and not options.input_shapes:
        note = check_loads(ir_model, label, given)
        if note:
            ctx.notes.append(note)
    result = OptimizeResult(ir_model, log, label, source_sha256, ops_before,
                            notes=import_notes + ctx.notes, source_identity=source_identity)
    record_tuning(result, tuning_db, tuned)
    if ctx.tracer is not None:
        from graphopt.passes.rules import quiet_rule_reasons, rule_fire_counts

        why = quiet_rule_reasons(ctx.tracer.rules, pipeline.pass_names(),
                                 set(options.disabled_passes), options.level)
        result.traces = ctx.tracer.report(why_none=why, fired=rule_fire_counts(log))
    if source is not None:
        try:
            from graphopt.tools.accuracy_rule import accuracy_rule

            judge, result.verify_note = accuracy_rule(
                log.to_json()["passes"], rtol, atol,
                choose=f"{option('rtol')}/{option('atol')} judge by allclose")
            rounding: list[str] = []
            # Tolerances given apply as given, as in compare and bisect.
            result.max_abs_error = verify_outputs(source, to_onnx(ir_model), inputs, options,
                                                  judge, rounding,
                                                  allow_rounding=rtol is None and atol is None)
            result.verify_note = "; ".join(filter(None, [result.verify_note, *rounding]))
        except VerificationError as exc:
            winograd = log.totals().get("WinogradConv", {}).get("rewrites", {})
            if not sum(winograd.values()):
                raise
            # -O3's Winograd convs are exact to a layer's scale, not to each element's.
            from graphopt.passes.winograd import tolerance_hint

            raise VerificationError(f"{exc} ({tolerance_hint(sum(winograd.values()))})") from None
    if target is not None:
        from graphopt.codegen.split import partition_ir
        from graphopt.partition import partition
        from graphopt.partition.precision_fit import check_host_bfloat16, quantized_fallback_note
        from graphopt.partition.report import dynamic_hint
        from graphopt.partition.target import as_given

        result.partitioning = partition(ir_model, target)
        check_host_bfloat16(result.partitioning, options, ir_model)
        note = quantized_fallback_note(result.partitioning, options)
        if note:
            result.notes.append(note)
        dynamic = dynamic_hint(ir_model, result.partitioning, log)
        if dynamic:  # ATC takes static shapes only: say why the NPU got less than it could
            result.notes.append(f"{setting('target', as_given(target))}: {dynamic}")
        result.partition_models = partition_ir(ir_model, result.partitioning)
        result.memory_plans = plan_partition_memory(result.partition_models, memory_reorder)
    result.seconds = time.perf_counter() - start
    return result


def _with_image_hint(exc: Exception, aipp) -> Exception:
    """A calibration refusal that says why images are expected, under --insert-op-conf."""
    if not aipp or "the model expects" not in str(exc):
        return exc
    return type(exc)(f"{exc} ({option('insert_op_conf')} makes the model take uint8 images, "
                     "and it calibrates on them: give frames, not preprocessed tensors)")


def plan_partition_memory(models: dict[str, Model], reorder: bool = False) -> dict:
    """The static memory plan of each partition model (or why it has none: a dynamic shape).
    With `reorder`, each model's nodes take the memory-aware order its plan was made for."""
    # The IR is long-lived: no full collection should walk it again; nor should the plan's
    # own tables (a few objects per value, garbage only once planned), which three full
    # collections walked at 100k nodes (0.3-0.5 s of 1.5 s).
    with collection_paused(), heap_frozen():
        return {name: _plan_memory(model, reorder) for name, model in models.items()}


def _plan_memory(model: Model, reorder: bool):
    from graphopt.passes.memory import MemoryPlanError, plan_memory

    try:
        plan = plan_memory(model, reorder=reorder)
    except MemoryPlanError as e:
        return str(e)
    if plan.schedule_method != "original":
        model.graph.reorder(plan.schedule)
    return plan


def memory_plots(result: OptimizeResult, path: str) -> list[tuple[str, str, object]]:
    """(file, title, plan) of each planned partition's memory picture: `path` when there is
    one, else `stem.<partition>.ext` (a shape profile's partitions carry its name); the title
    names the partition and the profile's dims. A partition without work memory gets none.
    OptionError, before anything is written, when no partition has a picture."""
    runs = [(c.profile.name + ".", f" ({c.profile.label})", c.result)
            for c in result.profiles] or [("", "", result)]
    planned = {prefix + name: (prefix + name + dims, plan) for prefix, dims, run in runs
               for name, plan in run.memory_plans.items() if not isinstance(plan, str)}
    # A partition whose every tensor is an input, output or weight has nothing to draw.
    plans = {name: entry for name, entry in planned.items() if entry[1].tensors}
    if planned and not plans:
        raise OptionError("--memory-plot: no partition has work memory to draw (every tensor "
                          "is an input, an output or a weight)")
    if not plans:
        reasons = "; ".join(dict.fromkeys(
            f"{prefix}{name}: {plan}" for prefix, _, run in runs
            for name, plan in run.memory_plans.items())) or "no target was given"
        raise OptionError(f"--memory-plot: no partition has a memory plan ({reasons})")
    stem, ext = os.path.splitext(path)
    return [(path if len(plans) == 1 else f"{stem}.{name}{ext}", title, plan)
            for name, (title, plan) in plans.items()]


def draw_memory_plans(result: OptimizeResult, path: str) -> list[str]:
    """Draw each planned partition's memory (tensors over time × address) as memory_plots
    names the files; returns the files written."""
    from graphopt.passes.memory import draw_plan

    written = []
    for target, title, plan in memory_plots(result, path):
        draw_plan(plan, target, title=title)
        written.append(target)
    return written


def load_inputs(inputs, name: str | None = None) -> dict[str, np.ndarray] | None:
    """--inputs as feeds: a dict as given, an .npz path read (OptionError if it cannot be,
    naming the option `name`, by default optimize's)."""
    if inputs is None or isinstance(inputs, dict):
        return inputs
    from graphopt.codegen.feeds import load_npz

    try:
        return load_npz(inputs)
    except InputError as e:
        raise OptionError(f"{name or option('inputs')} {e}") from None


def _mark_lossy(model: Model, log: PassLog, target) -> None:
    """Name the lossy precision passes that changed the model in its metadata, so that compare
    judges an optimized .onnx (which carries no pass log) as it judges an .om, and the kind of
    device they were made for when it is an NPU (accuracy_rule.deployed_level)."""
    from graphopt.tools.accuracy_rule import LOSSY_DEVICE_KEY, LOSSY_KEY, lossy_passes, marked_lossy

    lossy = lossy_passes(log.to_json()["passes"])
    if lossy:
        known = marked_lossy(model.metadata_props)
        model.metadata_props[LOSSY_KEY] = ",".join(dict.fromkeys(known + lossy))
        if target is not None and target.device(target.primary).kind == "npu":
            model.metadata_props[LOSSY_DEVICE_KEY] = "npu"


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


def verify_outputs(original: ModelProto, optimized: ModelProto, inputs, options: Options,
                   judge: dict, notes: list[str] | None = None,
                   allow_rounding: bool = True) -> dict[str, float]:
    """Run both models with onnxruntime at ORT_DISABLE_ALL (the optimized one where a lossy pass
    changed it at the level accuracy_rule.deployed_level says); raise VerificationError on any
    output `judge` fails (accuracy_rule's rtol/atol, or min_cosine when set), unless under
    rtol/atol and `allow_rounding` rounding explains it (rounding.within_rounding), which
    `notes` then says. Returns the max absolute error per output."""
    not_here = not_runnable_here(optimized, option("verify"))
    if not_here:
        raise OptionError(not_here)
    feeds = load_inputs(inputs)
    if feeds is None:
        try:
            feeds = numerics.random_feeds(original, seed=0, shapes=options.input_shapes)
        except ValueError as e:
            raise VerificationError(f"{option('verify')}: {e} (give {option('inputs')})") from None
    else:  # a file that does not fit is the file's fault, not the model's
        from graphopt.codegen.feeds import check_feeds, typed_inputs

        given = option("inputs") if isinstance(inputs, dict) else setting("inputs", inputs)
        label = f"{option('verify')}: {given}"
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
        hint = "" if inputs is not None else numerics.random_inputs_hint(
            "seeded random", bool(options.input_shapes), reason=str(e))
        raise VerificationError(f"{option('verify')}: onnxruntime cannot run the original model: "
                                f"{numerics.ort_reason(e)}{hint}") from None
    from graphopt.tools.accuracy_rule import deployed_level

    try:
        actual = numerics.run(optimized, feeds, deployed_level(optimized.metadata_props))
    except Exception as e:  # noqa: BLE001
        raise VerificationError(f"{option('verify')}: onnxruntime cannot run the optimized model: "
                                f"{numerics.ort_reason(e)}") from None
    if judge["min_cosine"] is None:
        problems = numerics.compare(expected, actual, judge["rtol"], judge["atol"])
        if problems and allow_rounding:
            problems = _beyond_rounding(original, feeds, expected, actual, judge,
                                        notes if notes is not None else [])
    else:
        from graphopt.tools.accuracy_rule import below_cosine

        problems = below_cosine(expected, actual, judge)
    if problems:
        raise VerificationError(f"{option('verify')}: optimized model differs from the original: "
                                + "; ".join(str(p) for p in problems[:3])
                                + _seeded_inputs_hint(inputs, options))
    _check_loads_at_all(original, optimized)
    empty = [name for name, value in expected.items()
             if isinstance(value, np.ndarray) and value.size == 0]
    if empty and notes is not None:  # verified over no element: say so rather than "match"
        notes.append(f"output(s) {', '.join(empty)} hold no element at these input shapes: "
                     "nothing of them was compared")
    # Over every tensor a sequence or map holds too; 0 for outputs without floats.
    return {name: numerics.max_abs_error(exp, actual[name]) for name, exp in expected.items()}


def _seeded_inputs_hint(inputs, options: Options) -> str:
    """What a failed verification ran on when no inputs were given: standard normal values,
    which int8 ranges fitted to real data (images in [0, 1]) clip, so a compile whose report
    on its calibration data read 0.999 failed at 0.91 with nothing saying why."""
    if inputs is not None:
        return ""
    fitted = (f", which the int8 ranges fitted to {option('calibration')} may clip"
              if options.quantize == "int8" and options.calibration else "")
    ask = (f"{option('inputs')} fit another shape profile: a file of this profile's shapes "
           "checks it on real data" if INPUTS_FIT_OTHER_PROFILES.get()
           else f"give inputs like the deployment's with {option('inputs')}")
    return f" (on seeded random inputs: standard normal values{fitted}; {ask})"


def _beyond_rounding(original: ModelProto, feeds, expected: dict, actual: dict,
                     judge: dict, notes: list[str]) -> list:
    """The outputs outside rtol/atol, unless rounding explains every one of them (which
    `notes` then says: rounding.within_rounding)."""
    problems = numerics.compare(expected, actual, judge["rtol"], judge["atol"])
    failing = [name for name, reference in expected.items()
               if numerics.compare({name: reference}, {name: actual[name]}, judge["rtol"],
                                   judge["atol"])]
    note = within_rounding(original, feeds, expected, actual, failing, judge)
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


def _reproducible_log(result: OptimizeResult | None) -> list[dict]:
    """The pass log without timings, so the same compile always writes the same bytes."""
    if result is None:
        return []
    return [{k: v for k, v in r.items() if k != "seconds"} for r in result.log.to_json()["passes"]]


def _output_path(path) -> str:
    """`path` as a str, refusing what os.fspath would turn into something else (bytes, a
    file descriptor) or not at all."""
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if isinstance(text, str) and text:
            return text
    raise OptionError(f"save: the output path must be a non-empty str or os.PathLike, got "
                      f"{path!r}")


def save(model: Model | OptimizeResult | ModelProto, path: str | os.PathLike, *,
         tuning_db: str | None = None, external_data: bool | None = None) -> None:
    """Write `.onnx` (optimized ONNX) or `.om` (graphopt's artifact) atomically. `tuning_db`
    (a knowledge base file or Optuna storage URL that `graphopt tune` filled; by default the
    one the result was compiled with) gives an NPU `.om`'s cube kernels their tuned tilings.
    `external_data` (ONNX only; an .om keeps large weights in a blob of its own): True puts
    large weights in `<path>.data`, False never does, None does when the weights pass
    graphopt.ir.external_data's threshold (1 GiB; GRAPHOPT_EXTERNAL_DATA_THRESHOLD)."""
    path = _output_path(path)
    check_file_name("save:", path)
    if external_data is not None:
        api_args.flag(external_data, "external_data")
        if external_data and writes_om(path):
            raise OptionError(f"{path}: external_data is for ONNX files; an .om keeps large "
                              "weights in a blob of its own")
    result = model if isinstance(model, OptimizeResult) else None
    if isinstance(model, OptimizeResult):
        model = model.model
    elif isinstance(model, ModelProto):
        # External references a proto cannot locate are refused by name, as optimize refuses
        # them, rather than written out dangling.
        check_no_external_references(model)
    elif not isinstance(model, Model):
        raise OptionError(f"save: expected an OptimizeResult, a graphopt Model or an onnx "
                          f"ModelProto to write, got {type(model).__name__}")
    models = [c.result.model for c in result.profiles] if result is not None and \
        result.profiles else [model]
    _check_not_weights_file(models, path)
    if tuning_db is None and result is not None:
        tuning_db = result.tuning_db
    tuning_db = knowledge_base(tuning_db)
    if tuning_db is not None and (result is None or result.partitioning is None):
        raise OptionError("tuning_db applies what `graphopt tune` found for a target: save "
                          "the result of optimize(…, target=…)")
    if result is not None and result.profiles:
        if not writes_om(path):
            write = "write -o model.om" if from_command_line() else "save to a path ending in .om"
            raise OptionError(f"{path}: shape profiles ({option('dynamic_dims')}) are kept "
                              f"together in an .om; ONNX holds one shape per model ({write})")
        with heap_frozen():
            _save_profiles_om(result, path, tuning_db)
        return
    if writes_om(path):
        with heap_frozen():  # the IR is long-lived: no full collection should walk it again
            _save_om(model, result, path, tuning_db)
        return
    if not writes_onnx(path):
        raise OptionError(f"{path}: save writes .onnx (optimized ONNX) or .om (the artifact); "
                          "name the file so")
    save_onnx(model, path, external=external_data,
              value_infos=residual_types_kept(model) if isinstance(model, Model) else True)


def file_identity(path: str) -> tuple | None:
    """tensor.stat_identity of a regular file; None for anything else (a pipe)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return stat_identity(info) if stat.S_ISREG(info.st_mode) else None


def _source_sha256(result: OptimizeResult) -> str | None:
    """The sha256 of the model the result was compiled from: of its bytes when given in memory,
    else of the file, read now, unless the path no longer holds the file compiled (a save
    over it, say) or never was a regular file (a pipe, which would wait for a writer): then
    unknown (None) rather than another file's hash."""
    if result.source_sha256 is not None:
        return result.source_sha256
    from graphopt.codegen.om_manifest import file_sha256

    path = result.source_label
    if result.source_identity is None or file_identity(path) != result.source_identity:
        return None
    return file_sha256(path)


def _check_not_weights_file(models: list, path: str) -> None:
    """OptionError when `path` is a file the models read weights from (the input's external
    data, `-o weights.bin` say): replacing it would leave that model unloadable, or loading
    the artifact's bytes as its weights."""
    for model in models:
        if not isinstance(model, Model):
            continue
        for name, tensor in external_initializers(model):
            if tensor.reads(path):
                owner = tensor.source_model or "the model"
                raise OptionError(f"{path}: holds the weights of {owner} (initializer "
                                  f"'{name}', at least); write the output elsewhere")


def _recorded_extra(model: Model | ModelProto) -> dict:
    """What the model's metadata records for compare and inspect, as an .om's extra keeps it
    (every profile of a --dynamic-dims compile records the same)."""
    from graphopt.tools.accuracy_rule import marked_lossy

    extra = {}
    lossy = marked_lossy(model.metadata_props)
    if lossy:  # for compare: a model made lossy by an earlier compile, the pass log cannot say
        extra["lossy_passes"] = lossy
    cut = cut_outputs(model.metadata_props)
    if cut:  # for compare: outputs of the source that --out-nodes cut off, not lost ones
        extra[EXTRA_CUT] = cut
    preprocess = inserted_preprocessing(model.metadata_props)
    if preprocess:  # for inspect and compare: inputs that take images, not the source's
        extra[EXTRA_PREPROCESS] = preprocess
    io = io_types(model.metadata_props)
    if io["inputs"] or io["outputs"]:  # for inspect and compare: dtypes not the source's
        extra[EXTRA_IO_TYPES] = io
    return extra


def _save_om(model: Model | ModelProto, result: OptimizeResult | None, path: str,
             tuning_db: str | None) -> None:
    from graphopt.codegen import OmPartition, write_om

    # The partition models carry references to the IR's tensors, not their bytes: each weight
    # streams into the artifact from where it lives (array, protobuf, mapped file).
    with tensor_references() as sources:
        if result is None or result.partitioning is None:
            from graphopt.codegen.split import portable_partition

            parts = [OmPartition(name="p0", device="cpu", model=model)
                     if isinstance(model, ModelProto) else portable_partition("p0", model)]
            # Compiled for no target (no CPU layout either): a portable model the CPU runs.
            target, extra = PORTABLE_TARGET, {}
        else:
            target = result.partitioning.target.name
            parts, extra = _om_plan(result, tuning_db)
            extra = {**extra, **_profile_file(result.partitioning.target)}
        inputs, outputs = _signature_names(model)
        extra = {**extra, **_recorded_extra(model)}
        write_om(path, parts, source_path=result.source_label if result else None,
                 source_bytes_sha256=_source_sha256(result) if result else None,
                 hash_source=False,
                 target=target, pass_log=_reproducible_log(result), extra=extra,
                 inputs=inputs, outputs=outputs, weight_sources=sources)


def _profile_file(target) -> dict:
    """The extra section naming a custom target's profile file: the manifest's `target` is the
    profile's own name, which may be a built-in's (a copy of ascend910b edited under its name
    read as the built-in in inspect)."""
    from graphopt.partition.target import is_builtin

    return {} if is_builtin(target) else {"target_file": os.path.basename(target.path)}


def _signature_names(model: Model | ModelProto) -> tuple[list[str], list[str]]:
    """The model's input and output names in its own order, which the artifact keeps. Named
    outputs also keep a model output that a later partition reads as well."""
    if isinstance(model, ModelProto):
        initialized = {t.name for t in model.graph.initializer}
        return ([i.name for i in model.graph.input if i.name not in initialized],
                [o.name for o in model.graph.output])
    return [v.name for v in model.graph.inputs], [v.name for v in model.graph.outputs]


def _om_plan(result: OptimizeResult, tuning_db: str | None, prefix: str = ""):
    """(the .om partitions, the manifest's extra sections) of a compile for a target; names
    get `prefix` (a shape profile's) so that several compiles can share one artifact."""
    from graphopt.codegen.split import om_partitions
    from graphopt.partition.report import partitioning_json
    from graphopt.tuner.records import SOURCE_TUNED, kernel_records

    partitioning = result.partitioning
    tilings, no_gain = None, []
    if tuning_db:
        from graphopt.tuner.kb import tuned_tilings

        foreign: list[str] = []
        tilings = tuned_tilings(tuning_db, result.model, partitioning, skipped=foreign,
                                no_gain=no_gain)
        if foreign:  # another Optuna client's or an edited trial: not worth failing a compile
            result.notes.append(
                f"{option('tuning_db')}: left out {len(foreign)} trial(s) that record no tiling "
                f"graphopt wrote ({', '.join(foreign[:3])}{', …' if len(foreign) > 3 else ''})")
    kernels = kernel_records(result.model, partitioning, tilings, source=SOURCE_TUNED)
    cube = [r for rows in (kernels or {}).get("partitions", {}).values() for r in rows
            if "tiling" in r]
    if tuning_db and cube:  # say what the knowledge base gave, also when it gave nothing
        tuned = sum(r.get("tiling_source") == SOURCE_TUNED for r in cube)
        where = f" in shape profile {prefix[:-1]}" if prefix else ""
        kept = (f"; {len(no_gain)} keep the default tiling, which this cost model prices no "
                "slower than the best it holds for their shapes" if no_gain else "")
        result.notes.append(f"{option('tuning_db')}: tuned tilings for {tuned} of {len(cube)} "
                            f"NPU cube kernel(s) on {partitioning.target.name}{where}{kept}"
                            + ("" if tuned or no_gain else
                               " (graphopt tune … --target with the same profile and shapes "
                               "fills it)"))
    elif tuning_db and partitioning.target.device(partitioning.target.primary).kind == "npu":
        where = f" in shape profile {prefix[:-1]}" if prefix else ""
        result.notes.append(f"{option('tuning_db')}: no NPU cube kernel in this compile{where} "
                            "to apply tilings to (none of its MatMul/Gemm/Conv runs on the "
                            f"{partitioning.target.primary} with static shapes)")
    layout = partitioning_json(partitioning)
    for entry in layout["partitions"]:
        entry["name"] = prefix + entry["name"]
    if kernels:
        kernels["partitions"] = {prefix + k: v for k, v in kernels["partitions"].items()}
    extra = {"partitioning": layout, **({"kernels": kernels} if kernels else {}),
             "memory_plan": {prefix + name: {"unplanned": plan} if isinstance(plan, str)
                             else plan.to_dict() for name, plan in result.memory_plans.items()}}
    # After -O2/-O3 (fusions done, conv nets blocked for the CPU) onnxruntime's extended
    # level finds nothing more than its own fusions to do, and starts sooner.
    fused = result.log.pipeline.startswith(("O2", "O3"))
    parts = om_partitions(partitioning, result.partition_models,
                          cpu_level="extended" if fused else None)
    for part in parts:
        part.name = prefix + part.name
    return parts, extra


def _save_profiles_om(result: OptimizeResult, path: str, tuning_db: str | None) -> None:
    """One .om holding every shape profile's partitions, weights the profiles share once."""
    from graphopt.codegen import write_om
    from graphopt.codegen.om_write import OmProfile
    from graphopt.codegen.split import portable_partition

    profiles, sections = [], {}
    with tensor_references() as sources:
        for compiled in result.profiles:
            name, run = compiled.profile.name, compiled.result
            if run.partitioning is None:
                parts = [portable_partition(f"{name}.p0", run.model)]
                extra = {}
            else:
                before = len(run.notes)
                parts, extra = _om_plan(run, tuning_db, prefix=f"{name}.")
                if run is not result:  # what each profile's plan noted, where it is printed
                    result.notes.extend(n for n in run.notes[before:] if n not in result.notes)
            profiles.append(OmProfile(name, compiled.profile.dims, parts))
            sections[name] = extra
        default = sections[result.profiles[0].profile.name]
        # The default profile's sections where tools look for them; every profile's by name.
        extra = {**default, "profiles": sections}
        target = result.partitioning.target.name if result.partitioning is not None \
            else PORTABLE_TARGET
        if result.partitioning is not None:
            extra.update(_profile_file(result.partitioning.target))
        # A shape profile's .om was once written without them: compare failed the outputs
        # --out-nodes cut off and refused the uint8 inputs --insert-op-conf made.
        extra.update(_recorded_extra(result.profiles[0].result.model))
        inputs, outputs = _signature_names(result.profiles[0].result.model)
        write_om(path, [], profiles=profiles, dynamic_signature=result.dynamic_signature,
                 source_path=result.source_label, source_bytes_sha256=_source_sha256(result),
                 hash_source=False,
                 target=target, pass_log=_reproducible_log(result), extra=extra,
                 inputs=inputs, outputs=outputs, weight_sources=sources)
