"""graphopt.save: write a compile as optimized ONNX or as an .om artifact, atomically."""

from __future__ import annotations

import os

from onnx import ModelProto

from graphopt import api_args
from graphopt.compile_checks import overridable_initializers
from graphopt.compile_result import OptimizeResult, file_identity
from graphopt.compile_tuning import applied_study, knowledge_base
from graphopt.errors import OptionError
from graphopt.ir import Model
from graphopt.ir.collector import heap_frozen
from graphopt.ir.external_data import save_onnx
from graphopt.ir.onnx_io import check_no_external_references
from graphopt.ir.tensor import external_initializers, tensor_references
from graphopt.option_names import from_command_line, option
from graphopt.output_kind import check_file_name, writes_om, writes_onnx
from graphopt.portable_sessions import session_note
from graphopt.portable_types import residual_sums, residual_types_kept
from graphopt.source_marks import (EXTRA_CUT, EXTRA_FIXED_INPUTS, EXTRA_IO_TYPES,
                                   EXTRA_PREPROCESS, EXTRA_RESCALED, cut_outputs,
                                   inserted_preprocessing, io_types, rescaled_values)

# The manifest's target for an .om compiled without one: no device layout, the CPU runs it.
PORTABLE_TARGET = "none"


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
            return api_args.without_nul(text, "save")
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
    if not isinstance(model, Model):
        save_onnx(model, path, external=external_data)
        return
    with residual_sums(model):
        save_onnx(model, path, external=external_data, value_infos=residual_types_kept(model))
        note = session_note(model, path) if result is not None else None
    if note and note not in result.notes:
        result.notes.append(note)


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


def _source_external_sha256(result: OptimizeResult) -> str | None:
    """The sha256 of the source model's external data files (ir/data_files.py), under the
    conditions _source_sha256 reads the file itself; None when it has none."""
    if result.source_sha256 is not None or result.source_identity is None \
            or file_identity(result.source_label) != result.source_identity:
        return None
    from graphopt.ir.data_files import external_data_sha256

    return external_data_sha256(result.source_label)


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
    from graphopt.tools.accuracy_rule import PRECISION_KEY, marked_lossy

    extra = {}
    lossy = marked_lossy(model.metadata_props)
    if lossy:  # for compare: a model made lossy by an earlier compile, the pass log cannot say
        extra["lossy_passes"] = lossy
    mode = dict(model.metadata_props).get(PRECISION_KEY) if isinstance(model, Model) else None
    if mode:  # for inspect and the report: fp16 and mixed-fp16 read alike in the pass log
        extra["precision_mode"] = mode
    cut = cut_outputs(model.metadata_props)
    if cut:  # for compare: outputs of the source that --out-nodes cut off, not lost ones
        extra[EXTRA_CUT] = cut
    rescaled = rescaled_values(model.metadata_props)
    if rescaled:  # for compare: values that hold their channels scaled, under their names
        extra[EXTRA_RESCALED] = rescaled
    preprocess = inserted_preprocessing(model.metadata_props)
    if preprocess:  # for inspect and compare: inputs that take images, not the source's
        extra[EXTRA_PREPROCESS] = preprocess
    io = io_types(model.metadata_props)
    if io["inputs"] or io["outputs"]:  # for inspect and compare: dtypes not the source's
        extra[EXTRA_IO_TYPES] = io
    fixed = overridable_initializers(model) if isinstance(model, Model) else []
    if fixed:  # for the runtime: a feed for one of them is explained, not merely unknown
        extra[EXTRA_FIXED_INPUTS] = fixed
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
            extra = {**extra, **_profile_file(result.partitioning.target),
                     **applied_study(result)}
        inputs, outputs = _signature_names(model)
        extra = {**extra, **_recorded_extra(model)}
        write_om(path, parts, source_path=result.source_label if result else None,
                 source_bytes_sha256=_source_sha256(result) if result else None,
                 source_external_sha256=_source_external_sha256(result) if result else None,
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
    tilings, no_gain, other_dtype, legacy = None, [], {}, []
    if tuning_db:
        from graphopt.tuner.kb import tuned_tilings

        foreign: list[str] = []
        tilings = tuned_tilings(tuning_db, result.model, partitioning, skipped=foreign,
                                no_gain=no_gain, other_dtype=other_dtype, legacy=legacy)
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
        if other_dtype:  # an int8 compile's tuning applied to the float compile, say
            held = ", ".join(sorted(set(other_dtype.values())))
            kept += (f"; {len(other_dtype)} other(s) have tilings stored for their shapes in "
                     f"{held} only, another cube dtype (graphopt tune with this compile's "
                     "precision options fills theirs)")
        if legacy:  # tuned before conv signatures named the geometry the cost model prices
            kept += (f"; {len(legacy)} conv(s) have tilings stored only under the GEMM-only "
                     "signature graphopt wrote before 2026-12-07, tuned when a conv was priced "
                     "as reading its im2col matrix from GM, which no compile applies "
                     "(graphopt tune fills theirs)")
        result.notes.append(f"{option('tuning_db')}: tuned tilings for {tuned} of {len(cube)} "
                            f"NPU cube kernel(s) on {partitioning.target.shown}{where}{kept}"
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
        extra.update(applied_study(result))
        # A shape profile's .om was once written without them: compare failed the outputs
        # --out-nodes cut off and refused the uint8 inputs --insert-op-conf made.
        extra.update(_recorded_extra(result.profiles[0].result.model))
        inputs, outputs = _signature_names(result.profiles[0].result.model)
        write_om(path, [], profiles=profiles, dynamic_signature=result.dynamic_signature,
                 source_path=result.source_label, source_bytes_sha256=_source_sha256(result),
                 source_external_sha256=_source_external_sha256(result), hash_source=False,
                 target=target, pass_log=_reproducible_log(result), extra=extra,
                 inputs=inputs, outputs=outputs, weight_sources=sources)
